"""After the sweep, on 5 000 trials: ``--where`` against reading the whole trial table and filtering it in pandas,
and ``gc`` of 2 500 deleted trials.

The store is generated through the real writer (see ``bench_sweep_scale.generate``). Each query runs both ways
on a fresh ``Sweep`` (nothing cached), best of 3; the footer and data-page reads are counted by wrapping
pyarrow's ``read_metadata`` and ``dataset`` as ``Sweep`` calls them. No target is stated: the verdicts say
whether ``--where`` beats its peer, reading the whole table and filtering it in pandas.

Run: ``.venv/bin/python benchmarks/bench_lifecycle.py [--trials 5000 --steps 10]``
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time, sweep_size, timed
from bench_sweep_scale import generate

import ray_cmf.compare
from ray_cmf import Store, Sweep
from ray_cmf.cleanup import collect

QUERIES = [  # (what it reads, --where, the same filter in pandas)
    (
        "MLMD only (config)",
        'config/optimizer == "adam" and config/batch_size >= 64',
        lambda t: t[(t["config/optimizer"] == "adam") & (t["config/batch_size"] >= 64)],
    ),
    ("MLMD + footers (a summary)", "loss_best < 0.99", lambda t: t[t["loss_best"] < 0.99]),
]


class Reads:
    """Counts the Parquet footers and datasets (data pages) that ``Sweep`` opens."""

    def __init__(self) -> None:
        self.footers = 0
        self.scans = 0

    def __enter__(self) -> Reads:
        self._meta, self._dataset = pq.read_metadata, ray_cmf.compare.pads.dataset

        def read_metadata(*args: Any, **kwargs: Any) -> Any:
            self.footers += 1
            return self._meta(*args, **kwargs)

        def dataset(*args: Any, **kwargs: Any) -> Any:
            self.scans += 1
            return self._dataset(*args, **kwargs)

        pq.read_metadata = read_metadata
        ray_cmf.compare.pads = type("pads", (), {"dataset": staticmethod(dataset)})
        return self

    def __exit__(self, *exc: object) -> None:
        pq.read_metadata = self._meta
        ray_cmf.compare.pads = pads


def counted(fn: Callable[[], Any]) -> tuple[Any, Reads]:
    with Reads() as reads:
        value = fn()
    return value, reads


def where_queries(results: Results, root: Path, trials: int) -> None:
    """Each query both ways, best of 3 on a fresh Sweep, with the footers and scans each reads."""
    rows = []
    for what, where, in_pandas in QUERIES:
        t_ours, ours = timed(lambda w=where: Sweep(root).trials(where=w))
        t_full, full = timed(lambda f=in_pandas: f(Sweep(root).trials()))
        assert list(ours["trial_id"]) == list(full["trial_id"]), what
        _, ours_reads = counted(lambda w=where: Sweep(root).trials(where=w))
        _, full_reads = counted(lambda: Sweep(root).trials())
        results.figure(
            what,
            {
                "kept": len(ours),
                "where_s": t_ours,
                "where_footers": ours_reads.footers,
                "where_scans": ours_reads.scans,
                "whole_table_s": t_full,
                "whole_table_footers": full_reads.footers,
                "whole_table_scans": full_reads.scans,
                "speedup": t_full / t_ours,
            },
        )
        results.verdict(f"trials(where=...) faster than the whole table, then pandas: {what}", t_ours < t_full)
        rows.append(
            [
                what,
                f"`{where}`",
                str(len(ours)),
                f"{fmt_time(t_ours)} ({ours_reads.footers} footers, {ours_reads.scans} scans)",
                f"{fmt_time(t_full)} ({full_reads.footers} footers, {full_reads.scans} scans)",
                f"{t_full / t_ours:.2f}x",
            ]
        )
    title = f"`trials --where` on {trials} trials (best of 3, a fresh Sweep each time)"
    print(f"## {title}\n")
    results.table(
        title,
        ["reads", "--where", "trials kept", "ray_cmf trials(where=...)", "whole table, then pandas", "speedup"],
        rows,
    )


def delete_and_collect(results: Results, root: Path, trials: int) -> None:
    """Delete every other trial in one ``Sweep.delete``, then ``gc`` them."""
    sweep = Sweep(root)
    doomed = list(sweep.trials()["trial_id"])[::2]
    start = time.perf_counter()
    sweep.delete(doomed)
    t_delete = time.perf_counter() - start
    start = time.perf_counter()
    freed = collect(Store(root))
    t_gc = time.perf_counter() - start
    assert len(freed.trials) == len(doomed) and len(freed.files) == len(doomed)
    assert len(Sweep(root).trials()) == trials - len(doomed)
    results.figure("Sweep.delete", {"trials": len(doomed), "seconds": t_delete, "per_trial_s": t_delete / len(doomed)})
    results.figure(
        "gc",
        {
            "trials": len(doomed),
            "seconds": t_gc,
            "per_trial_s": t_gc / len(doomed),
            "files": len(freed.files),
            "cache_objects": freed.cache_objects,
            "mb": freed.bytes / 2**20,
        },
    )
    title = f"Deleting and collecting {len(doomed)} of {trials} trials"
    print(f"\n## {title}\n")
    results.table(
        title,
        ["step", "time", "per trial"],
        [
            ["`Sweep.delete` (one masked MLMD transaction)", fmt_time(t_delete), fmt_time(t_delete / len(doomed))],
            [
                f"`gc`: {len(freed.files)} files, {freed.cache_objects} cache objects, {freed.bytes / 2**20:.1f} MB",
                fmt_time(t_gc),
                fmt_time(t_gc / len(doomed)),
            ],
        ],
    )


def main() -> None:
    args = sweep_size(steps=10, trials=5000)
    results = Results("lifecycle", command_line(__file__, args))
    root = Path(tempfile.mkdtemp()) / "store"
    seconds = generate(root, None, args.trials, args.steps)
    results.figure("generated", {"seconds": seconds})
    print(f"generated {args.trials} trials x {args.steps} steps in {seconds:.0f} s\n")
    where_queries(results, root, args.trials)
    delete_and_collect(results, root, args.trials)
    results.save()


if __name__ == "__main__":
    main()
