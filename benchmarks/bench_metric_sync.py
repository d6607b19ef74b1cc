"""Metric sync over 2 processes, its cost split into update, math and communication, each beside its floor.

For K = 4, 16, 64 and 256 metrics (a mix of mean, sum, max and min, each updated with 16 values per step),
on 2 ranks (gloo on CPU; NCCL with ``--backend nccl``, one rank per GPU, at most 2), this measures:

- **update**: host time of one ``update`` call, against one ``copy_`` of the same input into a
  preallocated buffer (the floor: an update must at least copy its input);
- **math**: applying an interval's staged updates (``UPDATES`` per metric), against one fused op per
  reduction kind over the same values (a sum, an amax and an amin over preallocated blocks);
- **sync**: a whole ``sync().wait()`` (math included), against a bare ``all_gather_into_tensor`` of the
  same bytes on the same process group, the one collective the sync issues;

and beside them the peers: torchmetrics' ``MetricCollection.compute()`` and a naive all_reduce per metric
(gloo only). Every figure is the least over ``--rounds`` interleaved rounds: on a 2-core VM each part and
each floor is now and then slowed by 2x or more (a rank descheduled while the other waits), noise only adds,
and a median of such rounds moves the floor more than the effect. The collectives each sync issues are
counted. torchmetrics is a benchmark-only dependency. Saved as ``metric_sync`` (gloo) or ``metric_sync_nccl``.

Run: ``.venv/bin/python benchmarks/bench_metric_sync.py [--backend nccl] [--rounds 30] [--tag NAME]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time

KS = (4, 16, 64, 256)
UPDATES = 4  # updates per metric per sync interval
VALUES = 16  # elements per update
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
    """Count every torch.distributed collective (torchmetrics calls them through the module too)."""
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:  # not in this torch version
            continue

        def wrapped(*args: Any, __o: Any = original, **kwargs: Any) -> Any:
            counts["n"] += 1
            return __o(*args, **kwargs)

        setattr(dist, name, wrapped)


class Ours:
    """ray_cmf: a MetricCollection of K metrics."""

    def __init__(self, k: int, device: torch.device) -> None:
        from ray_cmf.metrics import Max, Mean, MetricCollection, Min, Sum

        kinds = (Mean, Sum, Max, Min)
        self.metrics = MetricCollection({f"m{i}": kinds[i % 4]() for i in range(k)}, device=device)
        self.members = [self.metrics[name] for name in self.metrics]
        self.inputs = [torch.full((VALUES,), float(i), device=device) for i in range(k)]

    def update(self) -> None:
        for metric, value in zip(self.members, self.inputs, strict=True):
            metric.update(value)

    def fold(self) -> None:
        self.metrics._groups.fold()

    def sync(self) -> Any:
        return self.metrics.sync().wait()

    def state_elements(self) -> int:
        return self.metrics._groups.pack.flat.numel()


class Floors:
    """What the three parts cannot go below, on the same data."""

    def __init__(self, k: int, device: torch.device, elements: int, world: int) -> None:
        self.inputs = [torch.full((VALUES,), float(i), device=device) for i in range(k)]
        self.cells = [torch.empty(VALUES, device=device) for _ in range(k)]
        kinds = {"sum": (k + 1) // 2, "max": (k + 2) // 4, "min": k // 4}  # Mean and Sum reduce by sum
        self.blocks = {
            r: torch.rand(n, UPDATES, VALUES, dtype=torch.float64, device=device) for r, n in kinds.items() if n
        }
        self.local = torch.zeros(elements, dtype=torch.float64, device=device)
        self.gathered = torch.empty(world * elements, dtype=torch.float64, device=device)

    def copy(self) -> None:
        for cell, value in zip(self.cells, self.inputs, strict=True):
            cell.copy_(value)

    def math(self) -> None:
        for reduce, block in self.blocks.items():
            {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[reduce](block, dim=(1, 2))

    def collective(self) -> None:
        dist.all_gather_into_tensor(self.gathered, self.local)


def _torchmetrics(k: int) -> tuple[Callable[[], None], Callable[[], Any]]:
    import torchmetrics

    kinds = (torchmetrics.MeanMetric, torchmetrics.SumMetric, torchmetrics.MaxMetric, torchmetrics.MinMetric)
    metrics = torchmetrics.MetricCollection({f"m{i}": kinds[i % 4]() for i in range(k)}, compute_groups=False)
    inputs = [torch.full((VALUES,), float(i)) for i in range(k)]

    def update() -> None:
        for (_, metric), value in zip(metrics.items(), inputs, strict=True):
            metric.update(value)

    def sync() -> Any:
        out = metrics.compute()
        metrics.reset()
        return out

    return update, sync


def _naive(k: int) -> tuple[Callable[[], None], Callable[[], Any]]:
    states = [torch.zeros(2, dtype=torch.float64) for _ in range(k)]

    def update() -> None:
        for i, s in enumerate(states):
            s.add_(torch.tensor([float(i) * VALUES, float(VALUES)], dtype=torch.float64))

    def sync() -> Any:
        for s in states:
            dist.all_reduce(s)
        return [s[0] / s[1] for s in states]

    return update, sync


def _clock(device: torch.device) -> Callable[[], float]:
    """Seconds, after the device has finished what was queued (host time alone on a CPU)."""
    if device.type == "cuda":
        return lambda: (torch.cuda.synchronize(device), time.perf_counter())[1]
    return time.perf_counter


def _per_call(fn: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / calls


def _measure(k: int, device: torch.device, counts: dict[str, int], peers: bool, rounds: int) -> dict[str, Any]:
    """One K: every part, ours and its floor, interleaved over ``rounds`` rounds (the least of each)."""
    ours = Ours(k, device)
    world = dist.get_world_size()
    floors = Floors(k, device, ours.state_elements(), world)
    clock = _clock(device)
    peer_fns = {"torchmetrics": _torchmetrics(k), "naive per-metric all_reduce": _naive(k)} if peers else {}
    for update, sync in [(ours.update, ours.sync), *peer_fns.values()]:
        update()
        sync()  # warm-up (and ray_cmf's one-time layout check)
    floors.collective()
    times: dict[str, list[float]] = {}
    calls: dict[str, int] = {}

    def timed(name: str, fn: Callable[[], Any]) -> None:
        dist.barrier()
        counts["n"] = 0
        start = clock()
        fn()
        times.setdefault(name, []).append(clock() - start)
        calls[name] = max(calls.get(name, 0), counts["n"])

    reps = max(1, 256 // k)  # at least 256 updates per timing (flushes of full blocks included)
    for _ in range(rounds):
        times.setdefault("update", []).append(_per_call(lambda: [ours.update() for _ in range(reps)], k * reps))
        times.setdefault("copy floor", []).append(_per_call(lambda: [floors.copy() for _ in range(reps)], k * reps))
        ours.sync()  # untimed: a fresh interval
        for _ in range(UPDATES):
            ours.update()
        start = clock()
        ours.fold()
        times.setdefault("math", []).append(clock() - start)
        timed("math floor", floors.math)
        ours.sync()
        for _ in range(UPDATES):
            ours.update()
        timed("sync", ours.sync)
        timed("collective floor", floors.collective)
        for peer, (update, sync) in peer_fns.items():
            for _ in range(UPDATES):
                update()
            timed(peer, sync)
    return {"least": {name: min(ts) for name, ts in times.items()}, "collectives": calls}


def _worker(rank: int, world: int, backend: str, rounds: int, init: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=world)
    counts = {"n": 0}
    _count(counts)
    results = {k: _measure(k, device, counts, peers=backend == "gloo", rounds=rounds) for k in KS}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def split_table(results: Results, measured: dict[int, dict[str, Any]], backend: str, world: int, rounds: int) -> None:
    """The cost split per K, each part beside its floor: its table and figures."""
    rows = []
    for k in KS:
        m = measured[k]["least"]
        results.figure(
            f"K={k}",
            {
                "update_s": m["update"],
                "copy_floor_s": m["copy floor"],
                "update_ratio": m["update"] / m["copy floor"],
                "math_s": m["math"],
                "math_floor_s": m["math floor"],
                "math_ratio": m["math"] / m["math floor"],
                "sync_s": m["sync"],
                "collective_s": m["collective floor"],
                "sync_ratio": m["sync"] / m["collective floor"],
                "collectives": measured[k]["collectives"]["sync"],
            },
        )
        rows.append(
            [
                str(k),
                fmt_time(m["update"]),
                fmt_time(m["copy floor"]),
                _ratio(m["update"], m["copy floor"]),
                fmt_time(m["math"]),
                fmt_time(m["math floor"]),
                _ratio(m["math"], m["math floor"]),
                fmt_time(m["sync"]),
                fmt_time(m["collective floor"]),
                _ratio(m["sync"], m["collective floor"]),
                str(measured[k]["collectives"]["sync"]),
            ]
        )
    ranks = f"{world} {backend} rank{'s' if world > 1 else ''}"
    title = f"Metric sync, {ranks}: the cost split, least of {rounds} interleaved rounds"
    print(f"## {title}\n")
    results.table(
        title,
        [
            "K",
            "update / call",
            "copy floor",
            "ratio",
            f"math / sync ({UPDATES} updates each)",
            "fused-op floor",
            "ratio",
            "sync",
            "bare collective",
            "ratio",
            "collectives",
        ],
        rows,
    )


def peer_table(results: Results, measured: dict[int, dict[str, Any]]) -> None:
    """Sync time per K against torchmetrics and a naive all_reduce per metric: its table and figures."""
    rows = []
    for k in KS:
        m, calls = measured[k]["least"], measured[k]["collectives"]
        for peer in ("sync", "torchmetrics", "naive per-metric all_reduce"):
            label = "ray_cmf" if peer == "sync" else peer
            ratio = m[peer] / m["sync"]
            results.figure(f"K={k} {label}", {"sync_s": m[peer], "collectives": calls[peer], "vs_ray_cmf": ratio})
            rows.append([str(k), label, fmt_time(m[peer]), str(calls[peer]), f"{ratio:.2f}x"])
    title = "Against the peers (sync time, math included)"
    print(f"\n### {title}\n")
    results.table(title, ["K metrics", "peer", "sync time", "collectives", "time vs ray_cmf"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds; each figure is their least")
    parser.add_argument("--tag", default="", help="appended to the results' name, to keep another machine's apart")
    args = parser.parse_args()
    world = 2 if args.backend == "gloo" else min(2, torch.cuda.device_count())
    if world < 2:
        print("One GPU: NCCL runs 1 rank (it refuses 2 on one device), so the sync issues no collective; its ratio is")
        print("not the target's. update and math are measured as on any number of GPUs.\n")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.pt")
        spawn_args = (world, args.backend, args.rounds, str(Path(tmp) / "init"), out)
        mp.spawn(_worker, args=spawn_args, nprocs=world, join=True)
        measured = torch.load(out, weights_only=False)
    name = "metric_sync" if args.backend == "gloo" else f"metric_sync_{args.backend}"
    results = Results(name + (f"_{args.tag}" if args.tag else ""), command_line(__file__, args))
    split_table(results, measured, args.backend, world, args.rounds)
    if args.backend == "gloo":
        peer_table(results, measured)
    at64 = measured[64]["least"]
    target = 1.5 if args.backend == "gloo" else 1.1
    print(
        f"\nsync at K=64: {_ratio(at64['sync'], at64['collective floor'])} the bare collective "
        f"(target <= {target}x); update at K=64: {_ratio(at64['update'], at64['copy floor'])} "
        "its copy floor (target <= 1.5x)"
    )
    if world == 2:
        met = at64["sync"] <= target * at64["collective floor"]
        results.verdict(f"sync <= {target}x the bare collective at K=64", met)
    results.verdict("update <= 1.5x its copy floor at K=64", at64["update"] <= 1.5 * at64["copy floor"])
    results.save()


if __name__ == "__main__":
    main()
