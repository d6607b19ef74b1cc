"""What a CUDA graph would save the fold: the K=64 fold's kernels launched one by one, against one replay.

The fold (applying an interval's staged updates, one vectorized apply per group of metrics of a kind) is a
few dozen small kernels whatever K. On a GPU each launch costs host time, so this measures, for 64 metrics
of 4 kinds with 4 staged updates each: the eager applies, the kernels they launch (profiled), one CUDA graph
replay of the same kernels, and, beside them, a staged interval and a whole sync. A design measurement: the
graph is captured here, in the benchmark, over ray_cmf's internal apply calls; ray_cmf itself runs them
eagerly. Needs CUDA. Saved as ``fold_graph`` (``--tag`` appended).

Run: ``.venv/bin/python benchmarks/bench_fold_graph.py [--tag NAME]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time

K, UPDATES, VALUES, REPS = 64, 4, 16, 200


def _timed(fn: Callable[[], Any], reps: int = REPS) -> float:
    """Median seconds of ``fn`` with the device idle before and after each call."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _captured(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``fn``'s kernels as a CUDA graph (warmed up once on a side stream, as CUDA graphs require)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _kernels(fn: Callable[[], None]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="", help="appended to the results' name, to keep another machine's apart")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fold_graph needs CUDA")
    from ray_cmf.metrics import Max, Mean, MetricCollection, Min, Sum

    kinds = (Mean, Sum, Max, Min)
    metrics = MetricCollection({f"m{i}": kinds[i % 4]() for i in range(K)}, device="cuda")
    members = [metrics[name] for name in metrics]
    inputs = [torch.full((VALUES,), float(i), device="cuda") for i in range(K)]

    def interval() -> None:
        for _ in range(UPDATES):
            for metric, value in zip(members, inputs, strict=True):
                metric.update(value)

    for _ in range(3):
        interval()
        metrics.sync()
    interval()  # staged, never folded: the blocks the applies below read
    applies = [
        (group, [column[:, : max(block.used)] for column in block.columns])
        for group in metrics._groups.groups
        for block in group.stager._blocks.values()
    ]

    def fold() -> None:
        for group, columns in applies:
            group._apply(columns, None)

    eager, kernels = _timed(fold), _kernels(fold)
    replay = _timed(_captured(fold).replay)
    staging, sync = _timed(interval, 50), _timed(lambda: (interval(), metrics.sync()), 50)
    results = Results("fold_graph" + (f"_{args.tag}" if args.tag else ""), command_line(__file__, args))
    results.figure(
        f"K={K}",
        {"applies": len(applies), "kernels": kernels, "eager_s": eager, "graph_s": replay, "saved": eager / replay},
    )
    results.figure("interval", {"staging_s": staging, "staging_and_sync_s": sync})
    title = f"The fold of {K} metrics ({UPDATES} staged updates each) on {torch.cuda.get_device_name(0)}"
    print(f"## {title}\n")
    rows = [[str(len(applies)), str(kernels), fmt_time(eager), fmt_time(replay), f"{eager / replay:.1f}x"]]
    results.table(title, ["group applies", "kernels", "eager", "one graph replay", "eager / replay"], rows)
    print(f"\nbeside them: {UPDATES} staged updates of {K} metrics {fmt_time(staging)}; with a sync {fmt_time(sync)}")
    results.save()


if __name__ == "__main__":
    main()
