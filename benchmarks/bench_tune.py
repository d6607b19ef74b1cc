"""Tune sweep overhead: 8 trials x 500 reported results, with CmfRayLogger, with no callback, and with a
driver-side logger in cmflib's style (a Cmf-like object per trial on the driver: dict-of-dicts
``log_metric`` keyed by ``max(keys)+1``; in ``on_trial_complete``, synchronously, ``DataFrame.from_dict``
-> ``to_parquet`` -> a ``dvc add`` subprocess -> an MLMD artifact).

Each variant runs as its own sweep in one Ray session, in rounds (A, B, C, A, B, C, ...); we report the
median sweep wall time and p50/p99 of the time spent inside each logger's hooks.

Run: ``.venv/bin/python benchmarks/bench_tune.py [--rounds 3]``
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

from _common import fmt_time, print_table

from ray_cmf import CmfRayLogger
from ray_cmf.lineage import Lineage

TRIALS, RESULTS = 8, 500
HOOKS = ("on_trial_start", "on_trial_result", "on_trial_complete", "on_trial_error", "on_experiment_end")


def trainable(config: dict[str, Any]) -> None:
    for i in range(RESULTS):
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


def timed_hooks(callback: tune.Callback, samples: list[float]) -> tune.Callback:
    """Wrap the callback's hooks so every call's duration lands in ``samples``."""
    for name in HOOKS:
        hook = getattr(callback, name)

        def wrapped(*args: Any, __hook: Any = hook, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return __hook(*args, **kwargs)
            finally:
                samples.append(time.perf_counter() - start)

        setattr(callback, name, wrapped)
    return callback


def sweep(callbacks: list[tune.Callback], tmp: Path, name: str) -> float:
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1 * (i + 1) for i in range(TRIALS)])},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp / "results"), callbacks=callbacks, verbose=0),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    sweep([], tmp, "warmup")
    walls: dict[str, list[float]] = {"no callback": [], "CmfRayLogger": [], "cmflib-style driver logger": []}
    hooks: dict[str, list[float]] = {"CmfRayLogger": [], "cmflib-style driver logger": []}
    for r in range(args.rounds):
        walls["no callback"].append(sweep([], tmp, f"none{r}"))
        ours = timed_hooks(
            CmfRayLogger("bench", metric="loss", mode="min", store=str(tmp / f"ours{r}")), hooks["CmfRayLogger"]
        )
        walls["CmfRayLogger"].append(sweep([ours], tmp, f"ours{r}"))
        theirs = timed_hooks(CmflibStyleLogger(str(tmp / f"theirs{r}")), hooks["cmflib-style driver logger"])
        walls["cmflib-style driver logger"].append(sweep([theirs], tmp, f"theirs{r}"))
    base = statistics.median(walls["no callback"])
    rows = []
    for name, values in walls.items():
        wall = statistics.median(values)
        samples = sorted(hooks.get(name, []))
        p50 = fmt_time(samples[len(samples) // 2]) if samples else "-"
        p99 = fmt_time(samples[int(len(samples) * 0.99)]) if samples else "-"
        worst = fmt_time(samples[-1]) if samples else "-"
        rows.append([name, f"{wall:.2f} s", f"{(wall / base - 1) * 100:+.1f}%", p50, p99, worst])
    print(f"## Tune sweep: {TRIALS} trials x {RESULTS} results, 2 at a time, median of {args.rounds} rounds\n")
    print_table(["logger", "sweep wall time", "overhead vs no callback", "hook p50", "hook p99", "hook max"], rows)
    print(f"\nall wall times (s): { {k: [round(v, 2) for v in vs] for k, vs in walls.items()} }")


if __name__ == "__main__":
    main()
