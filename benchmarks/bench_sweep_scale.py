"""Comparing 500 trials x 10 000 steps: ray_cmf's Sweep and CLI against Ray's own trial logs.

The store is generated through the real Store and its single writer (StoreWriter, in process): one MLMD
execution per trial with its config, one Parquet file per trial, DVC-tracked. The same rows are written
as Ray Tune's trial logs (``result.json`` lines and ``progress.csv``), read back with Ray's own
``Result.from_path(...).metrics_dataframe``; the last row per trial is what ``ResultGrid.get_dataframe()``
gives. Targets (issue 6): ``Sweep.trials()`` and ``ray-cmf compare`` each <= 2 s.

Run: ``.venv/bin/python benchmarks/bench_sweep_scale.py [--trials 500 --steps 10000]``
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time, sweep_size, timed

from ray_cmf import MetricBuffer, Store, Sweep
from ray_cmf.binding import SeriesKey
from ray_cmf.client import WriterClient
from ray_cmf.constants import TRIAL_EXECUTION_TYPE
from ray_cmf.lineage import config_properties
from ray_cmf.writer import StoreWriter


def series(trial: int, steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(trial)
    it = np.arange(1, steps + 1)
    lr = 10 ** rng.uniform(-4, -1)
    loss = 1.0 / (1 + lr * it) + rng.normal(0, 0.01, steps)
    return {
        "training_iteration": it,
        "loss": loss,
        "accuracy": 1 - loss / 2,
        "grad_norm": rng.gamma(2.0, 1.0, steps),
        "lr": np.full(steps, lr),
    }


def generate(root: Path, logs: Path | None, trials: int, steps: int, mlmd: str | None = None) -> float:
    """Write the sweep through the store's writer (MLMD at ``mlmd``, default the store's SQLite file) and,
    with ``logs``, as Ray Tune's trial logs too; returns the seconds taken."""
    writer = WriterClient(StoreWriter(Store(root, mlmd=mlmd)))
    start = time.perf_counter()
    for t in range(trials):
        data = series(t, steps)
        trial_id = f"t{t:05d}"
        config = {"lr": float(data["lr"][0]), "batch_size": int(2 ** (4 + t % 4)), "optimizer": ["sgd", "adam"][t % 2]}
        binding = writer.call(
            StoreWriter.bind,
            kind="trial",
            name=trial_id,
            pipeline="scale",
            stage="exp",
            type_name=TRIAL_EXECUTION_TYPE,
            props={**config_properties(config), "trial_id": trial_id, "status": "COMPLETE"},
        )
        key = SeriesKey(binding, "tune_results", attempts=True)  # as CmfRayLogger's: the writer stamps the attempt
        buffer = MetricBuffer(sink=writer.sink(key))
        for i in range(steps):
            buffer.append(
                {
                    "training_iteration": int(data["training_iteration"][i]),
                    "loss": float(data["loss"][i]),
                    "accuracy": float(data["accuracy"][i]),
                    "grad_norm": float(data["grad_norm"][i]),
                }
            )
        buffer.close()
        writer.call(StoreWriter.commit, key=key, props={"status": "COMPLETE"}, state="COMPLETE")
        if logs is not None:
            write_ray_logs(logs / trial_id, data, config)
    return time.perf_counter() - start


def write_ray_logs(trial_dir: Path, data: dict[str, np.ndarray], config: dict) -> None:
    """The files Tune's JSON and CSV logger callbacks write for a trial."""
    trial_dir.mkdir(parents=True)
    keys = ["training_iteration", "loss", "accuracy", "grad_norm"]
    rows = [{k: data[k][i].item() for k in keys} for i in range(len(data["loss"]))]
    with open(trial_dir / "result.json", "w") as out:
        for row in rows:
            out.write(json.dumps({**row, "config": config}) + "\n")
    csv_dir = trial_dir.with_name(trial_dir.name + "_csv")
    csv_dir.mkdir()
    with open(csv_dir / "progress.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def compare_cli(root: Path) -> None:
    """``ray-cmf compare --metric loss --top 5`` on the store, as a user runs it (a new process)."""
    cli = str(Path(sys.executable).with_name("ray-cmf"))
    subprocess.run(
        [cli, "compare", "--store", str(root), "--metric", "loss", "--top", "5"], check=True, capture_output=True
    )


def loss_bytes_read(root: Path) -> tuple[float, float]:
    """MiB of the column chunks ``steps(['loss'])`` reads (training_iteration, attempt, loss), and MiB on disk."""
    files = [f.path for f in Sweep(root, pipeline="scale").files()]
    dataset = pads.dataset([str(p) for p in files], format="parquet")
    read = sum(
        rg.column(i).total_compressed_size
        for f in dataset.get_fragments()
        for rg in [f.metadata.row_group(j) for j in range(f.metadata.num_row_groups)]
        for i in range(rg.num_columns)
        if rg.column(i).path_in_schema in ("loss", "training_iteration", "attempt")
    )
    return read / 2**20, sum(p.stat().st_size for p in files) / 2**20


def main() -> None:
    args = sweep_size(steps=10_000)
    results = Results("sweep_scale", command_line(__file__, args))
    tmp = Path(tempfile.mkdtemp())
    root, logs = tmp / "store", tmp / "ray_logs"
    gen = generate(root, logs, args.trials, args.steps)
    results.figure("generated", {"seconds": gen})
    print(f"generated {args.trials} trials x {args.steps} steps through the store in {gen:.1f} s\n")

    from ray.air.result import Result  # what Tune's ResultGrid builds its Results with

    def ray_json() -> object:
        import pandas as pd

        frames = [Result.from_path(str(d)).metrics_dataframe for d in sorted(logs.glob("t?????"))]
        return pd.concat(frames)

    def ray_csv() -> object:
        import pandas as pd

        frames = [Result.from_path(str(d)).metrics_dataframe for d in sorted(logs.glob("t?????_csv"))]
        return pd.concat(frames)

    def ray_grid_table() -> object:
        import pandas as pd

        return pd.DataFrame([Result.from_path(str(d)).metrics for d in sorted(logs.glob("t?????"))])

    t_trials, table = timed(lambda: Sweep(root, pipeline="scale").trials(["loss", "accuracy", "grad_norm"]), repeat=1)
    assert len(table) == args.trials
    t_grid, _ = timed(ray_grid_table, repeat=1)
    t_steps, steps = timed(lambda: Sweep(root, pipeline="scale").steps(["loss"]), repeat=1)
    assert len(steps) == args.trials * args.steps
    t_json, _ = timed(ray_json, repeat=1)
    t_csv, _ = timed(ray_csv, repeat=1)
    t_cli, _ = timed(lambda: compare_cli(root), repeat=1)
    results.figure("trial table", {"ray_cmf_s": t_trials, "ray_s": t_grid})
    results.figure(
        "all steps of one metric", {"ray_cmf_s": t_steps, "ray_result_json_s": t_json, "ray_progress_csv_s": t_csv}
    )
    results.figure("ray-cmf compare --metric loss --top 5", {"ray_cmf_s": t_cli})
    results.table(
        f"Comparing {args.trials} trials x {args.steps} steps: ray_cmf against Ray's trial logs",
        ["task", "how", "time (one run each, the first)"],
        [
            ["trial table (best/final/steps per metric)", "ray_cmf Sweep.trials()", fmt_time(t_trials)],
            ["", "Ray: Result.from_path(...).metrics per trial (ResultGrid.get_dataframe)", fmt_time(t_grid)],
            ["all steps of one metric", "ray_cmf Sweep.steps(['loss'])", fmt_time(t_steps)],
            ["", "Ray: Result.metrics_dataframe from result.json", fmt_time(t_json)],
            ["", "Ray: Result.metrics_dataframe from progress.csv", fmt_time(t_csv)],
            ["`ray-cmf compare --metric loss --top 5`", "whole command (process start included)", fmt_time(t_cli)],
        ],
    )

    read, on_disk = loss_bytes_read(root)
    results.figure("steps(['loss']) reads", {"read_mib": read, "on_disk_mib": on_disk})
    print(
        f"\nsteps(['loss']) reads the column chunks of training_iteration, attempt and loss: "
        f"{read:.1f} MiB of {on_disk:.1f} MiB on disk"
    )
    print(f"Sweep.trials(): {t_trials:.2f} s (target <= 2 s); ray-cmf compare: {t_cli:.2f} s (target <= 2 s)")
    print(
        f"steps(): {t_json / t_steps:.0f}x faster than Ray's result.json path, {t_csv / t_steps:.0f}x than progress.csv"
    )
    results.verdict("Sweep.trials() <= 2 s", t_trials <= 2)
    results.verdict("ray-cmf compare <= 2 s", t_cli <= 2)
    results.save()


if __name__ == "__main__":
    main()
