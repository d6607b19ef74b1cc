"""What ray_cmf adds to each Tune trial: short trials (5 results each), 2 at a time, in interleaved rounds.

Variants, run one after another in each round, in an order that rotates from round to round, in one Ray
session:

- no callback;
- ``CmfRayLogger(system_metrics=None)``: Tune's results only;
- ``CmfRayLogger()``: plus the trial's process sampled by its node's sampler (the default);
- ``CmfRayLogger()`` + ``get_cmf()`` in the trainable, 200 rows logged and committed.

Two measures of the cost per trial:

- **direct**: the time spent inside the callback's Tune hooks, per trial (what Tune's event loop waits
  for), and inside the trainable, the time of ``get_cmf()``, of logging the rows and of committing them
  (what the trial waits for); medians over every trial of every round;
- **end to end**: each round's sweep time minus that round's no-callback sweep, over the trials (paired
  within the round), with the spread over rounds. On a shared 2-core VM a sweep's time varies by seconds
  from run to run, more than these costs add up to: the direct figures are the ones that resolve them.

Run: ``.venv/bin/python benchmarks/bench_trial_cost.py [--trials 40] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

sys.path.insert(0, str(Path(__file__).parent))

from _common import TUNE_HOOKS, print_table, save_results, timed_hooks

from ray_cmf import CmfRayLogger

RESULTS, ROWS = 5, 200
TARGETS_MS = {"hooks per trial": 10.0, "get_cmf() + 200 rows + commit": 15.0}


def trainable(config: dict[str, Any]) -> None:
    spent: dict[str, float] = {}
    if config["cmf"]:
        import ray_cmf.tune

        start = time.perf_counter()
        cmf = ray_cmf.tune.get_cmf()
        joined = time.perf_counter()
        for i in range(ROWS):
            cmf.log_metric("steps", {"i": i, "loss": config["lr"] / (i + 1)})
        logged = time.perf_counter()
        cmf.commit_metrics("steps")
        spent = {"get_cmf_ms": (joined - start) * 1e3, "log_ms": (logged - joined) * 1e3}
        spent["commit_ms"] = (time.perf_counter() - logged) * 1e3
    for i in range(RESULTS):
        tune.report({"loss": config["lr"] / (i + 1), **spent})


def sweep(trials: int, tmp: Path, name: str, logger: CmfRayLogger | None, cmf: bool) -> tuple[float, Any]:
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.01 * (i + 1) for i in range(trials)]), "cmf": cmf},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp / "results"), callbacks=[logger] if logger else [], verbose=0
        ),
    )
    start = time.perf_counter()
    grid = tuner.fit()
    return time.perf_counter() - start, grid


def variants(tmp: Path, r: int) -> dict[str, tuple[CmfRayLogger | None, bool]]:
    def logger(name: str, **options: Any) -> CmfRayLogger:
        return CmfRayLogger("cost", pipeline_stage=f"{name}{r}", store=str(tmp / f"{name}{r}"), **options)

    return {
        "no callback": (None, False),
        "CmfRayLogger (results only)": (logger("results", system_metrics=None), False),
        "CmfRayLogger (+ node sampler)": (logger("sampled"), False),
        "CmfRayLogger + get_cmf": (logger("cmf"), True),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    sweep(4, tmp, "warmup", CmfRayLogger("warmup", store=str(tmp / "warmup")), True)  # samplers, writer, imports
    walls: dict[str, list[float]] = {}
    hooks: dict[str, list[float]] = {}
    in_trial: dict[str, list[float]] = {"get_cmf_ms": [], "log_ms": [], "commit_ms": []}
    for r in range(args.rounds):
        made = list(variants(tmp, r).items())
        for name, (logger, cmf) in made[r % len(made) :] + made[: r % len(made)]:  # no variant always first
            spent: list[float] = []

            def record(_: str, seconds: float, into: list[float] = spent) -> None:
                into.append(seconds)

            timed = timed_hooks(logger, record, ("setup", *TUNE_HOOKS)) if logger else None
            wall, grid = sweep(args.trials, tmp, f"variant{[n for n, _ in made].index(name)}-r{r}", timed, cmf)
            walls.setdefault(name, []).append(wall)
            if logger is not None:
                hooks.setdefault(name, []).append(sum(spent) / args.trials * 1e3)
            for part, values in in_trial.items():
                values.extend(result.metrics[part] for result in grid if cmf)
            print(f"round {r + 1}: {name}: {wall:.2f} s", flush=True)
    base = walls["no callback"]
    rows, figures, verdicts = [], {}, {}
    for name, values in walls.items():
        paired_ms = [(v - b) / args.trials * 1e3 for v, b in zip(values, base, strict=True)]
        hook_ms = statistics.median(hooks[name]) if name in hooks else None
        figures[name] = {"sweep_s": values, "paired_ms_per_trial": paired_ms, "hooks_ms_per_trial": hook_ms}
        rows.append(
            [
                name,
                f"{statistics.median(values):.2f} s",
                f"{statistics.median(paired_ms):+.0f} ({min(paired_ms):+.0f} … {max(paired_ms):+.0f})",
                f"{hook_ms:.2f}" if hook_ms is not None else "—",
            ]
        )
    trial_ms = {part: statistics.median(values) for part, values in in_trial.items()}
    figures["inside the trainable (median ms)"] = trial_ms
    worst_hooks = max(statistics.median(v) for v in hooks.values())
    in_trial_total = sum(trial_ms.values())
    verdicts[f"hooks per trial <= {TARGETS_MS['hooks per trial']:g} ms"] = worst_hooks <= TARGETS_MS["hooks per trial"]
    verdicts[f"get_cmf() + 200 rows + commit <= {TARGETS_MS['get_cmf() + 200 rows + commit']:g} ms"] = (
        in_trial_total <= TARGETS_MS["get_cmf() + 200 rows + commit"]
    )
    print(f"\n## Cost per trial: {args.trials} trials x {RESULTS} results, 2 at a time, {args.rounds} rounds\n")
    print_table(
        ["variant", "sweep (median)", "end to end, ms per trial: median (range)", "inside the hooks, ms per trial"],
        rows,
    )
    print("\ninside the trainable (median over trials): " + ", ".join(f"{k} {v:.1f}" for k, v in trial_ms.items()))
    for verdict, met in verdicts.items():
        print(f"target {verdict}: {'met' if met else 'NOT met'}")
    command = f"benchmarks/bench_trial_cost.py --trials {args.trials} --rounds {args.rounds}"
    print(f"results: {save_results('trial_cost', command, figures, verdicts)}")


if __name__ == "__main__":
    main()
