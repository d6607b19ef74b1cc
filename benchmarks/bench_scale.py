"""Scale (issue 24): a 2 000-trial sweep, reads of 5 000 trials x 1 000 steps, and one series of 10M rows.

Three parts, each on its own (``--part``), all by default:

* ``sweep``: 2 000 short trials (10 results each, ``get_cmf()`` logging 10 rows and committing them),
  2 at a time, with ``CmfRayLogger``; then the same sweep with no callback. Every hook call is timed
  with the number of trials finished when it ran, so the latency can be read against the sweep's size;
  the driver's and the writer's RSS are sampled every 2 s. Both sweeps run with ``reuse_actors=True``:
  Tune's default starts a process per trial, which costs 0.5 s a trial here, whatever the logger.
* ``read``: 5 000 trials x 1 000 steps generated through the real writer; ``Sweep.trials()``,
  ``ray-cmf compare`` (a fresh process) and ``Sweep.report()`` on them.
* ``rows``: one series of 1M, 3M and 10M rows of one float logged with ``Cmf.log_metric``, committed with
  ``commit_metrics`` and read back with ``read_metrics``, each size in a fresh process (its peak RSS).

Run: ``.venv/bin/python benchmarks/bench_scale.py [--part sweep|read|rows] [--trials 2000]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _common import print_table, save_results, timed_hooks

ROW_SIZES = (1_000_000, 3_000_000, 10_000_000)


class RssSampler(threading.Thread):
    """The RSS of some processes every ``interval`` seconds, with a label (e.g. trials finished) per row."""

    def __init__(self, pids: dict[str, int], label: Any, interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.label, self.interval = label, interval
        self.rows: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.rows.append(
                {"label": self.label(), **{n: p.memory_info().rss / 2**20 for n, p in self.processes.items()}}
            )


# -- sweep -------------------------------------------------------------------------------------------
def trainable(config: dict[str, Any]) -> None:
    from ray import tune

    import ray_cmf.tune

    if config["cmf"]:
        cmf = ray_cmf.tune.get_cmf()
        for i in range(10):
            cmf.log_metric("steps", {"i": i, "loss": config["lr"] / (i + 1)})
        cmf.commit_metrics("steps")
    for i in range(10):
        tune.report({"loss": config["lr"] / (i + 1)})


def run_sweep(trials: int, tmp: Path, logger: Any) -> float:
    from ray import tune

    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([1e-4 * (i + 1) for i in range(trials)]), "cmf": logger is not None},
        tune_config=tune.TuneConfig(max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(
            name="scale", storage_path=str(tmp / "results"), callbacks=[logger] if logger else [], verbose=0
        ),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def part_sweep(trials: int) -> dict[str, Any]:
    import ray

    from ray_cmf import CmfRayLogger, Sweep
    from ray_cmf.actor import WRITER_NAME
    from ray_cmf.node_sampler import actor_process

    tmp = Path(tempfile.mkdtemp())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    logger = CmfRayLogger("scale", metric="loss", store=str(tmp / "store"))
    finished, calls = [0], []

    def record(hook: str, seconds: float) -> None:
        calls.append((finished[0], seconds))
        finished[0] += hook in ("on_trial_complete", "on_trial_error")

    timed_hooks(logger, record)
    logger.setup()  # the writer, so that its RSS can be sampled from the start
    writer = actor_process(ray.get_actor(WRITER_NAME))
    assert writer is not None
    rss = RssSampler({"driver_mb": psutil.Process().pid, "writer_mb": writer[0]}, lambda: finished[0])
    rss.start()
    with_logger = run_sweep(trials, tmp, logger)
    rss.stopped.set()
    without = run_sweep(trials, tmp / "none", None)
    table = Sweep(tmp / "store", pipeline="scale").trials(["loss"])
    buckets = []
    size = max(trials // 8, 1)
    for first in range(0, trials, size):
        latencies = sorted(s for done, s in calls if first <= done < first + size)
        if latencies:
            buckets.append(
                {
                    "finished": f"{first}-{first + size - 1}",
                    "hook_p50_us": latencies[len(latencies) // 2] * 1e6,
                    "hook_p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
                    "hook_max_ms": latencies[-1] * 1e3,
                }
            )
    return {
        "sweep_s": with_logger,
        "no_callback_s": without,
        "overhead": with_logger / without - 1,
        "committed": int((table["status"] == "COMPLETE").sum()),
        "with_steps": int((table["steps"] == 10).sum()),
        "buckets": buckets,
        "rss": rss.rows,
    }


# -- read --------------------------------------------------------------------------------------------
def part_read(trials: int, steps: int) -> dict[str, Any]:
    from bench_sweep_scale import generate

    from ray_cmf import Sweep

    tmp = Path(tempfile.mkdtemp())
    root = tmp / "store"
    generated = generate(root, None, trials, steps)
    times: dict[str, Any] = {"generated_s": generated}
    start = time.perf_counter()
    table = Sweep(root, pipeline="scale").trials(["loss"])
    times["Sweep.trials()"] = time.perf_counter() - start
    assert len(table) == trials and (table["steps"] == steps).all()
    cli = [str(Path(sys.executable).with_name("ray-cmf")), "compare", "--store", str(root), "--metric", "loss"]
    start = time.perf_counter()
    subprocess.run([*cli, "--top", "10"], check=True, capture_output=True)
    times["ray-cmf compare (a new process)"] = time.perf_counter() - start
    start = time.perf_counter()
    Sweep(root, pipeline="scale").report(tmp / "report.html")
    times["Sweep.report()"] = time.perf_counter() - start
    times["report_mb"] = (tmp / "report.html").stat().st_size / 2**20
    return times


# -- rows --------------------------------------------------------------------------------------------
def one_series(rows: int) -> dict[str, float]:
    """In this process: log, commit and read back ``rows`` rows of one float; the peak RSS on the way."""
    from ray_cmf import Cmf

    cmf = Cmf(pipeline_name="rows", store=Path(tempfile.mkdtemp()) / "store")
    cmf.create_execution("Big")
    process, peak = psutil.Process(), [0.0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], process.memory_info().rss / 2**20)

    threading.Thread(target=watch, daemon=True).start()
    base = process.memory_info().rss / 2**20
    start = time.perf_counter()
    for i in range(rows):
        cmf.log_metric("big", {"loss": 1.0 / (i + 1)})
    logged = time.perf_counter()
    cmf.commit_metrics("big")
    committed = time.perf_counter()
    frame = cmf.read_metrics("big")
    read = time.perf_counter()
    stop.set()
    assert len(frame) == rows and frame["loss"].iloc[-1] == 1.0 / rows
    return {
        "log_s": logged - start,
        "commit_s": committed - logged,
        "read_s": read - committed,
        "peak_rss_over_start_mb": peak[0] - base,
    }


def part_rows() -> dict[str, Any]:
    out = {}
    for rows in ROW_SIZES:
        done = subprocess.run(
            [sys.executable, __file__, "--one-series", str(rows)], check=True, capture_output=True, text=True
        )
        out[f"{rows:,} rows"] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("sweep", "read", "rows"), action="append")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--read-trials", type=int, default=5000)
    parser.add_argument("--read-steps", type=int, default=1000)
    parser.add_argument("--one-series", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_series:
        print(json.dumps(one_series(args.one_series)))
        return
    parts = args.part or ["rows", "read", "sweep"]
    command = "benchmarks/bench_scale.py " + " ".join(sys.argv[1:])
    if "rows" in parts:
        figures: dict[str, dict[str, Any]] = {}
        verdicts: dict[str, bool] = {}
        rows = part_rows()
        print("## One series: log_metric, commit_metrics, read_metrics (one float column)\n")
        print_table(
            ["rows", "log", "commit", "read", "peak RSS over the start"],
            [
                [
                    n,
                    f"{r['log_s']:.1f} s",
                    f"{r['commit_s']:.1f} s",
                    f"{r['read_s']:.2f} s",
                    f"{r['peak_rss_over_start_mb']:.0f} MB",
                ]
                for n, r in rows.items()
            ],
        )
        small, big = rows[f"{ROW_SIZES[0]:,} rows"], rows[f"{ROW_SIZES[-1]:,} rows"]
        ratio = ROW_SIZES[-1] / ROW_SIZES[0]
        total = lambda r: r["log_s"] + r["commit_s"] + r["read_s"]  # noqa: E731
        print(f"\n10M / 1M: time {total(big) / total(small):.1f}x for {ratio:.0f}x the rows")
        verdicts["10M rows: time within 1.2x of linear from 1M"] = total(big) / total(small) <= 1.2 * ratio
        report("scale_rows", command, rows, verdicts)
    if "read" in parts:
        read = part_read(args.read_trials, args.read_steps)
        print(f"\n## Reading {args.read_trials} trials x {args.read_steps} steps\n")
        print_table(["what", "time"], [[k, f"{v:.2f}"] for k, v in read.items()])
        report("scale_read", command, {f"{args.read_trials} trials x {args.read_steps} steps": read}, {})
    if "sweep" in parts:
        figures, verdicts = {}, {}
        sweep = part_sweep(args.trials)
        print(f"\n## {args.trials} trials, 10 results each, 2 at a time (reuse_actors=True)\n")
        print_table(
            ["finished trials", "hook p50", "hook p99", "hook max"],
            [
                [
                    b["finished"],
                    f"{b['hook_p50_us']:.0f} µs",
                    f"{b['hook_p99_us']:.0f} µs",
                    f"{b['hook_max_ms']:.1f} ms",
                ]
                for b in sweep["buckets"]
            ],
        )
        print()
        print_table(
            ["finished trials", "driver RSS", "writer RSS"],
            [
                [str(r["label"]), f"{r['driver_mb']:.0f} MB", f"{r['writer_mb']:.0f} MB"]
                for r in sweep["rss"][:: max(len(sweep["rss"]) // 10, 1)]
            ],
        )
        print(
            f"\nwith CmfRayLogger {sweep['sweep_s']:.0f} s, no callback {sweep['no_callback_s']:.0f} s: "
            f"{sweep['overhead']:+.1%}; committed {sweep['committed']} of {args.trials}, "
            f"{sweep['with_steps']} with all their steps"
        )
        p99s = [b["hook_p99_us"] for b in sweep["buckets"]]
        verdicts["hook p99 flat (last eighth within 2x of the first)"] = p99s[-1] <= 2 * p99s[0]
        verdicts["every trial committed"] = sweep["committed"] == sweep["with_steps"] == args.trials
        figures[f"sweep of {args.trials}"] = {k: v for k, v in sweep.items() if k not in ("buckets", "rss")}
        figures.update({f"hooks, {b['finished']} finished": b for b in sweep["buckets"]})
        rss = sweep["rss"]
        figures["RSS"] = {
            "driver_mb_first": rss[0]["driver_mb"],
            "driver_mb_last": rss[-1]["driver_mb"],
            "writer_mb_first": rss[0]["writer_mb"],
            "writer_mb_last": rss[-1]["writer_mb"],
        }
        growth = {n: (rss[-1][n] - rss[0][n]) * 1024 / args.trials for n in ("driver_mb", "writer_mb")}
        figures["RSS"] |= {"driver_kb_per_trial": growth["driver_mb"], "writer_kb_per_trial": growth["writer_mb"]}
        verdicts["driver and writer RSS grow by under 100 KB a trial"] = max(growth.values()) < 100
        report("scale_sweep", command, figures, verdicts)


def report(name: str, command: str, figures: dict[str, Any], verdicts: dict[str, bool]) -> None:
    """Print the verdicts and save the part's results."""
    for verdict, met in verdicts.items():
        print(f"target {verdict}: {'met' if met else 'NOT met'}")
    print(f"results: {save_results(name, command, figures, verdicts)}")


if __name__ == "__main__":
    main()
