"""The same workloads on two versions of ray_cmf, side by side in one session: a reshape must not cost speed.

Each round runs every workload once on the base revision (a git worktree of it) and once on this checkout,
alternating which goes first, each in a fresh process started in its version's directory, which is also its
``PYTHONPATH`` (``python -c`` puts the current directory ahead of ``PYTHONPATH``). Workloads, through the
public API only:

- ``log_metric``: 1M rows of 4 metrics into one series, per row;
- ``commit``: 40 series of 10 000 rows, each logged and committed (Parquet, DVC, MLMD), per file;
- ``compare``: ``Sweep.trials`` and ``Sweep.steps`` over 200 committed series of 1 000 rows;
- ``first_log``: in a plain script, from ``Cmf(...)`` to its first ``log_metric`` returning, on a store that
  an earlier process made (the new execution, its environment record and the first row).

Target: this checkout within 10% of the base on every workload (this / base <= 1.1, medians).

Run: ``.venv/bin/python benchmarks/bench_versions.py [--base REV] [--rounds N]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = r"""
import json, sys, tempfile, time
from ray_cmf import Cmf, Sweep
what, store = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
if what == "first_log":
    start = time.perf_counter()
    cmf = Cmf(pipeline_name="b", store=store)
    cmf.log_metric("s", {"step": 0, "loss": 1.0})
    print(json.dumps(time.perf_counter() - start))
elif what == "make_store":
    Cmf(pipeline_name="b", store=store).log_metric("s", {"step": 0})
elif what == "log_metric":
    cmf = Cmf(pipeline_name="b", store=store)
    cmf.log_metric("s", {"warm": 1.0})
    start = time.perf_counter()
    for i in range(1_000_000):
        cmf.log_metric("s", {"step": i, "loss": 1.0 / (i + 1), "acc": 0.5, "lr": 0.1})
    print(json.dumps((time.perf_counter() - start) / 1_000_000))
else:
    files = 40 if what == "commit" else 200
    rows = 10_000 if what == "commit" else 1_000
    spent = 0.0
    for f in range(files):
        cmf = Cmf(pipeline_name="b", store=store)
        cmf.create_execution("Train", {"lr": f / files}, execution_name=f"run-{f}")
        for i in range(rows):
            cmf.log_metric("s", {"step": i, "loss": (f + 1) / (i + 1)})
        start = time.perf_counter()
        cmf.commit_metrics("s")
        spent += time.perf_counter() - start
        cmf.close()
    if what == "commit":
        print(json.dumps(spent / files))
    else:
        start = time.perf_counter()
        sweep = Sweep(store, metrics_name="s")
        sweep.trials(["loss"])
        sweep.steps(["loss"])
        print(json.dumps(time.perf_counter() - start))
"""
WORKLOADS = ("log_metric", "commit", "compare", "first_log")
UNITS = {
    "log_metric": "per row",
    "commit": "per file",
    "compare": "trials + steps, 200 series",
    "first_log": "Cmf() to the first row, store made",
}


def run(workload: str, path: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(path)}

    def python(*argv: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", WORKLOAD, *argv], env=env, cwd=path, capture_output=True, text=True, check=True
        ).stdout

    if workload != "first_log":
        return float(json.loads(python(workload).strip().splitlines()[-1]))
    with tempfile.TemporaryDirectory() as store:
        python("make_store", store)
        return float(json.loads(python(workload, store).strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="49a0f2a", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            times: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                versions = [("base", base), ("this", ROOT)]
                for name, path in versions if round_ % 2 == 0 else versions[::-1]:
                    for workload in WORKLOADS:
                        times.setdefault((workload, name), []).append(run(workload, path))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    results = Results("versions", command_line(__file__, args))
    rows = []
    for workload in WORKLOADS:
        old, new = (statistics.median(times[(workload, v)]) for v in ("base", "this"))
        results.figure(
            workload,
            {
                "measured": UNITS[workload],
                "base_s": old,
                "this_s": new,
                "this_over_base": new / old,
                "base_rounds_s": times[(workload, "base")],
                "this_rounds_s": times[(workload, "this")],
            },
        )
        results.verdict(f"{workload}: this <= 1.1x base", new <= 1.1 * old)
        rows.append([workload, UNITS[workload], fmt_time(old), fmt_time(new), f"{new / old:.2f}x"])
    title = f"{args.rounds} rounds, alternating order, medians; base {args.base} against this checkout"
    print(title)
    results.table(title, ["workload", "measured", "base", "this", "this / base"], rows)
    results.save()


if __name__ == "__main__":
    main()
