"""What ray_cmf adds to each Tune trial: short trials (5 results each), 2 at a time, in interleaved rounds.

Variants, run one after another in each round (A, B, C, D, A, B, C, D, ...) in one Ray session, so that a
slow moment of the machine falls on every variant alike:

- no callback;
- ``CmfRayLogger(system_metrics=None)``: Tune's results only;
- ``CmfRayLogger()``: plus the trial's process sampled by its node's sampler (the default);
- ``CmfRayLogger()`` + ``get_cmf()`` in the trainable, 200 rows logged and committed.

The cost per trial is a round's sweep time minus that round's no-callback sweep, over the trials: paired
within the round, then the median over rounds, with the spread of those paired figures beside it.

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

from _common import print_table, save_results

from ray_cmf import CmfRayLogger

RESULTS, ROWS = 5, 200
TARGETS_MS = {"CmfRayLogger + get_cmf": 15.0, "CmfRayLogger (results only)": 10.0}


def trainable(config: dict[str, Any]) -> None:
    if config["cmf"]:
        import ray_cmf.tune

        cmf = ray_cmf.tune.get_cmf()
        for i in range(ROWS):
            cmf.log_metric("steps", {"i": i, "loss": config["lr"] / (i + 1)})
        cmf.commit_metrics("steps")
    for i in range(RESULTS):
        tune.report({"loss": config["lr"] / (i + 1)})


def sweep(trials: int, tmp: Path, name: str, logger: CmfRayLogger | None, cmf: bool) -> float:
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.01 * (i + 1) for i in range(trials)]), "cmf": cmf},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp / "results"), callbacks=[logger] if logger else [], verbose=0
        ),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


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
    sweep(4, tmp, "warmup", None, False)
    walls: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for index, (name, (logger, cmf)) in enumerate(variants(tmp, r).items()):
            walls.setdefault(name, []).append(sweep(args.trials, tmp, f"variant{index}-round{r}", logger, cmf))
            print(f"round {r + 1}: {name}: {walls[name][-1]:.2f} s", flush=True)
    base = walls["no callback"]
    rows, figures, verdicts = [], {}, {}
    for name, values in walls.items():
        paired_ms = [(v - b) / args.trials * 1e3 for v, b in zip(values, base, strict=True)]
        cost = statistics.median(paired_ms)
        figures[name] = {"sweep_s": values, "cost_per_trial_ms": paired_ms, "median_cost_ms": cost}
        if name in TARGETS_MS:
            verdicts[f"{name} <= {TARGETS_MS[name]:g} ms/trial"] = cost <= TARGETS_MS[name]
        spread = f"{min(paired_ms):+.1f} … {max(paired_ms):+.1f}" if name != "no callback" else "—"
        median = statistics.median(values)
        rows.append([name, f"{median:.2f} s", f"{median / statistics.median(base):.3f}x", f"{cost:+.1f}", spread])
    print(f"\n## Cost per trial: {args.trials} trials x {RESULTS} results, 2 at a time, {args.rounds} rounds\n")
    print_table(["variant", "sweep (median)", "vs no callback", "ms per trial (median)", "per round"], rows)
    print(f"\nno-callback spread between rounds: {max(base) - min(base):.2f} s")
    command = f"benchmarks/bench_trial_cost.py --trials {args.trials} --rounds {args.rounds}"
    for verdict, met in verdicts.items():
        print(f"target {verdict}: {'met' if met else 'NOT met'}")
    print(f"results: {save_results('trial_cost', command, figures, verdicts)}")


if __name__ == "__main__":
    main()
