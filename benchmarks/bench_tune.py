"""Tune sweep overhead: trials of 500 reported results each, paced to last 1 s (short: 8 trials) or 30 s
(long: 2 trials), 2 at a time; with no callback, with CmfRayLogger, and with a driver-side logger in
cmflib's style (a Cmf-like object per trial on the driver: dict-of-dicts ``log_metric`` keyed by
``max(keys)+1``; in ``on_trial_complete``, synchronously, ``DataFrame.from_dict`` -> ``to_parquet`` -> a
``dvc add`` subprocess -> an MLMD artifact).

Each variant runs as its own sweep in one Ray session, interleaved in rounds whose order rotates (A B C,
B C A, C A B, ...), so no variant always runs first. The overhead is paired: each round's sweep time
over that round's no-callback sweep; we report the median over rounds and the range, and p50/p99/max of
the time spent inside each logger's hooks.

Run: ``.venv/bin/python benchmarks/bench_tune.py [--profile short|long] [--rounds N]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

sys.path.insert(0, str(Path(__file__).parent))

from _common import fmt_time, print_table, save_results, timed_hooks

from ray_cmf import CmfRayLogger
from ray_cmf.lineage import Lineage

RESULTS = 500
PROFILES = {"short": {"trials": 8, "seconds": 1.0, "rounds": 7}, "long": {"trials": 2, "seconds": 30.0, "rounds": 3}}


def trainable(config: dict[str, Any]) -> None:
    pause = config["seconds"] / RESULTS
    for i in range(RESULTS):
        time.sleep(pause)  # a training step that releases the GIL
        tune.report({"loss": config["lr"] / (i + 1), "acc": 1 - 1 / (i + 2), "step": i})


class CmflibStyleLogger(tune.Callback):
    """What a driver-side logger built like cmflib's CmfRayLogger does, synchronously in the hooks."""

    def __init__(self, root: str) -> None:
        self.root = root

    def setup(self, **info: Any) -> None:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q", "-f"], cwd=root, check=True)
        self.lineage = Lineage(root / "mlmd.sqlite")
        self.pipeline = self.lineage.pipeline("cmflib_style")
        self.stage = self.lineage.stage(self.pipeline, "sweep")
        self.metrics: dict[str, dict[int, dict]] = {}
        self.executions: dict[str, int] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.executions[trial.trial_id] = self.lineage.execution(self.stage, "Trial", trial.trial_id).id
        self.metrics[trial.trial_id] = {}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        series = self.metrics[trial.trial_id]
        row = {k: v for k, v in result.items() if isinstance(v, int | float)}
        series[max(series.keys()) + 1 if series else 1] = row

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        import pandas as pd

        path = Path(self.root) / "metrics" / f"{trial.trial_id}.parquet"
        path.parent.mkdir(exist_ok=True)
        pd.DataFrame.from_dict(self.metrics[trial.trial_id], orient="index").to_parquet(path)
        subprocess.run([sys.executable, "-m", "dvc", "add", "-q", str(path)], cwd=self.root, check=True)
        self.lineage.put_artifact(
            self.executions[trial.trial_id], "Step_Metrics", f"{trial.trial_id}", str(path), {"url": str(path)}
        )


def sweep(callbacks: list[tune.Callback], tmp: Path, name: str, trials: int, seconds: float) -> float:
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1 * (i + 1) for i in range(trials)]), "seconds": seconds},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp / "results"), callbacks=callbacks, verbose=0),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def run_profile(name: str, rounds: int, tmp: Path) -> None:
    trials, seconds = PROFILES[name]["trials"], PROFILES[name]["seconds"]
    walls: dict[str, list[float]] = {"no callback": [], "CmfRayLogger": [], "cmflib-style driver logger": []}
    hooks: dict[str, list[float]] = {"CmfRayLogger": [], "cmflib-style driver logger": []}
    makers = {
        "no callback": lambda r: [],
        "CmfRayLogger": lambda r: [
            timed_hooks(
                CmfRayLogger("bench", metric="loss", store=str(tmp / f"ours{r}")),
                lambda _, seconds: hooks["CmfRayLogger"].append(seconds),
            )
        ],
        "cmflib-style driver logger": lambda r: [
            timed_hooks(
                CmflibStyleLogger(str(tmp / f"theirs{r}")),
                lambda _, seconds: hooks["cmflib-style driver logger"].append(seconds),
            )
        ],
    }
    order = list(makers)
    for r in range(rounds):
        for variant in order[r % 3 :] + order[: r % 3]:
            walls[variant].append(sweep(makers[variant](r), tmp, f"{name}-{variant[:5]}-{r}", trials, seconds))
        print(f"round {r + 1}: " + ", ".join(f"{v}: {walls[v][-1]:.2f} s" for v in order), flush=True)
    base = walls["no callback"]
    rows, figures = [], {}
    for variant, values in walls.items():
        paired = [v / b - 1 for v, b in zip(values, base, strict=True)]
        samples = sorted(hooks.get(variant, []))
        p50 = samples[len(samples) // 2] if samples else None
        p99 = samples[int(len(samples) * 0.99)] if samples else None
        figures[variant] = {
            "sweep_s": values,
            "paired_overhead": paired,
            "median_overhead": statistics.median(paired),
            "hook_p50_s": p50,
            "hook_p99_s": p99,
            "hook_max_s": samples[-1] if samples else None,
        }
        rows.append(
            [
                variant,
                f"{statistics.median(values):.2f} s",
                f"{statistics.median(paired):+.1%}",
                f"{min(paired):+.1%} … {max(paired):+.1%}",
                *(fmt_time(x) if x is not None else "-" for x in (p50, p99, samples[-1] if samples else None)),
            ]
        )
    print(
        f"\n## Tune sweep, {name} trials: {trials} trials x {RESULTS} results over {seconds:g} s, "
        f"2 at a time, {rounds} rounds\n"
    )
    print_table(
        [
            "logger",
            "sweep (median)",
            "overhead (median of paired)",
            "paired, per round",
            "hook p50",
            "hook p99",
            "hook max",
        ],
        rows,
    )
    ours = figures["CmfRayLogger"]["median_overhead"]
    print(
        f"\ntarget CmfRayLogger <= 3% (median of paired rounds): {'met' if ours <= 0.03 else 'NOT met'} ({ours:+.1%})\n"
    )
    command = f"benchmarks/bench_tune.py --profile {name} --rounds {rounds}"
    save_results(f"tune_{name}", command, figures, {"CmfRayLogger <= 3% over no callback": ours <= 0.03})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", choices=sorted(PROFILES), action="append")
    parser.add_argument("--rounds", type=int, help="default: 7 short, 3 long")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    sweep([], tmp, "warmup", 2, 0.1)
    for name in args.profile or ["short", "long"]:
        run_profile(name, args.rounds or int(PROFILES[name]["rounds"]), tmp)


if __name__ == "__main__":
    main()
