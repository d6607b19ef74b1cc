"""Metric sync over 2 gloo processes: ray_cmf packed sync vs torchmetrics vs naive per-metric all_reduce.

For K = 4, 16 and 64 metrics (a mix of mean, sum, max and min), each rank updates every metric, then
syncs; we time the sync (median of 20 after warm-up) and count the torch.distributed collectives it
issues. torchmetrics is a benchmark-only dependency: ``MetricCollection.compute()`` syncs its states.

Run: ``.venv/bin/python benchmarks/bench_metric_sync.py``
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))

from _common import fmt_time, print_table

KS = (4, 16, 64)
REPEATS = 20
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "barrier",
    "all_gather_into_tensor",
    "all_gather_single",
)


def _count(counts: dict[str, int]) -> None:
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:  # not in this torch version
            continue

        def wrapped(*args: Any, __o: Any = original, **kwargs: Any) -> Any:
            counts["n"] += 1
            return __o(*args, **kwargs)

        setattr(dist, name, wrapped)
        # torchmetrics calls through torch.distributed's module attribute, so this catches its calls too


def _ours(k: int) -> tuple[Any, Any]:
    from ray_cmf.metrics import Max, Mean, MetricCollection, Min, Sum

    kinds = (Mean, Sum, Max, Min)
    metrics = MetricCollection({f"m{i}": kinds[i % 4]() for i in range(k)})

    def update(step: int) -> None:
        for i, name in enumerate(metrics):
            metrics[name].update(torch.full((16,), float(step + i)))

    return update, lambda: metrics.sync().wait()


def _torchmetrics(k: int) -> tuple[Any, Any]:
    import torchmetrics

    kinds = (torchmetrics.MeanMetric, torchmetrics.SumMetric, torchmetrics.MaxMetric, torchmetrics.MinMetric)
    metrics = torchmetrics.MetricCollection({f"m{i}": kinds[i % 4]() for i in range(k)}, compute_groups=False)

    def update(step: int) -> None:
        for i, (_, metric) in enumerate(metrics.items()):
            metric.update(torch.full((16,), float(step + i)))

    def sync() -> Any:
        out = metrics.compute()
        metrics.reset()
        return out

    return update, sync


def _naive(k: int) -> tuple[Any, Any]:
    states = [torch.zeros(2, dtype=torch.float64) for _ in range(k)]

    def update(step: int) -> None:
        for i, s in enumerate(states):
            s.add_(torch.tensor([float(step + i) * 16, 16.0], dtype=torch.float64))

    def sync() -> Any:
        for s in states:
            dist.all_reduce(s)
        return [s[0] / s[1] for s in states]

    return update, sync


PEERS = {"ray_cmf": _ours, "torchmetrics": _torchmetrics, "naive per-metric all_reduce": _naive}


def _worker(rank: int, world: int, init: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    counts = {"n": 0}
    _count(counts)
    results = {}
    for k in KS:
        for peer, build in PEERS.items():
            update, sync = build(k)
            update(0)
            sync()  # warm-up (and ray_cmf's one-time layout check)
            times, calls = [], []
            for step in range(REPEATS):
                update(step)
                dist.barrier()
                counts["n"] = 0
                start = time.perf_counter()
                sync()
                times.append(time.perf_counter() - start)
                calls.append(counts["n"])
            results[(peer, k)] = (statistics.median(times), max(calls))
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.pt")
        mp.spawn(_worker, args=(2, str(Path(tmp) / "init"), out), nprocs=2, join=True)
        results = torch.load(out, weights_only=False)
    rows = []
    for k in KS:
        ours_time, _ours_calls = results[("ray_cmf", k)]
        for peer in PEERS:
            t, calls = results[(peer, k)]
            rows.append([str(k), peer, fmt_time(t), str(calls), f"{t / ours_time:.1f}x"])
    print("## Metric sync, 2 gloo ranks (median of 20)\n")
    print_table(["K metrics", "peer", "sync time", "collectives", "time vs ray_cmf"], rows)
    tm64 = results[("torchmetrics", 64)][0] / results[("ray_cmf", 64)][0]
    print(
        f"\nray_cmf vs torchmetrics at K=64: {tm64:.1f}x faster (target >= 5x); "
        f"ray_cmf collectives per sync: {max(results[('ray_cmf', k)][1] for k in KS)} (target <= 3)"
    )


if __name__ == "__main__":
    main()
