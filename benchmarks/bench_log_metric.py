"""log_metric per-call cost as the series grows, and peak memory of 1M rows x 4 floats.

Peers, side by side in one process:
* ray_cmf ``Cmf.log_metric`` (columnar buffer, background spill every 10 000 rows);
* a faithful re-creation of cmflib's ``Cmf.log_metric``: a dict of dicts keyed by ``max(keys) + 1``
  (labelled "cmflib algorithm": cmflib itself needs a git+DVC remote and ``cmf init``);
* the floor: ``list.append(dict)``.

Per-call cost "at N rows" is measured on a window of calls made after the series already holds N rows.
Run: ``.venv/bin/python benchmarks/bench_log_metric.py``
"""

from __future__ import annotations

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import fmt_time, per_call, print_table

from ray_cmf import Cmf, MetricBuffer

SIZES = [1_000, 10_000, 100_000, 1_000_000]


def row(i: int) -> dict[str, float]:
    return {"step": i, "loss": 1.0 / (i + 1), "acc": 0.5, "lr": 0.1}


class CmflibAlgorithm:
    """cmflib's log_metric data structure: ``metrics[name][max(keys)+1] = props``."""

    def __init__(self) -> None:
        self.metrics: dict[str, dict[int, dict]] = {}

    def log_metric(self, metrics_name: str, custom_properties: dict) -> None:
        if metrics_name in self.metrics:
            key = max((self.metrics[metrics_name]).keys()) + 1
            self.metrics[metrics_name][key] = custom_properties
        else:
            self.metrics[metrics_name] = {1: custom_properties}


def bench_ray_cmf(n: int, window: int, store: Path) -> float:
    cmf = Cmf(pipeline_name="bench", store=store)
    for i in range(n):
        cmf.log_metric("train", row(i))
    cost = per_call(lambda i: cmf.log_metric("train", row(i)), window)
    cmf.close()
    return cost


def bench_cmflib(n: int, window: int) -> float:
    cmf = CmflibAlgorithm()
    cmf.metrics["train"] = {k: row(k) for k in range(1, n + 1)}  # prefill without the O(n^2) cost
    return per_call(lambda i: cmf.log_metric("train", row(i)), window)


def bench_floor(n: int, window: int) -> float:
    rows = [row(i) for i in range(n)]
    return per_call(lambda i: rows.append(row(i)), window)


def peak_bytes(fill) -> int:
    gc.collect()
    tracemalloc.start()
    keep = fill()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del keep
    return peak


def main() -> None:
    store = Path(tempfile.mkdtemp()) / "store"
    Cmf(pipeline_name="bench", store=store)  # pay store creation outside the timings
    results = []
    for n in SIZES:
        window = 100_000 if n >= 100_000 else 20_000
        ours = bench_ray_cmf(n, window, store)
        theirs = bench_cmflib(n, max(50, min(n // 10, 2_000_000 // n)))
        floor = bench_floor(n, window)
        results.append((n, ours, theirs, floor))
    print("## log_metric per-call cost (4 floats per row)\n")
    print_table(
        ["rows already logged", "ray_cmf", "cmflib algorithm", "list.append floor", "cmflib / ray_cmf"],
        [[f"{n:,}", fmt_time(o), fmt_time(t), fmt_time(f), f"{t / o:,.0f}x"] for n, o, t, f in results],
    )
    flat = results[-1][1] / results[0][1]
    print(f"\nray_cmf per-call at 1M / at 1k: {flat:.2f}x (target <= 1.5x)")
    at_100k = next(t / o for n, o, t, _ in results if n == 100_000)
    print(f"ray_cmf vs cmflib algorithm at 100k rows: {at_100k:,.0f}x faster (target >= 100x)\n")

    tmp = Path(tempfile.mkdtemp())

    def fill_buffer(rows: int, flush_rows: int):
        buf = MetricBuffer(tmp / f"spill-{rows}-{flush_rows}", flush_rows=flush_rows)
        for i in range(rows):
            buf.append(row(i))
        buf.flush()
        return buf

    def fill_dicts(rows: int):
        metrics = {"train": {}}
        for i in range(1, rows + 1):
            metrics["train"][i] = row(i)
        return metrics

    ours = peak_bytes(lambda: fill_buffer(1_000_000, 10_000_000))
    theirs = peak_bytes(lambda: fill_dicts(1_000_000))
    spill_1m = peak_bytes(lambda: fill_buffer(1_000_000, 10_000))
    spill_3m = peak_bytes(lambda: fill_buffer(3_000_000, 10_000))
    print("## Peak Python memory, 1M rows x 4 float columns (tracemalloc)\n")
    print_table(
        ["holder", "peak", "vs dict of dicts"],
        [
            ["cmflib dict of dicts", f"{theirs / 2**20:.0f} MiB", "1"],
            ["ray_cmf buffer, no spill", f"{ours / 2**20:.0f} MiB", f"1/{theirs / ours:.1f}"],
            [
                "ray_cmf buffer, spill every 10k rows, 1M rows",
                f"{spill_1m / 2**20:.1f} MiB",
                f"1/{theirs / spill_1m:.0f}",
            ],
            ["ray_cmf buffer, spill every 10k rows, 3M rows", f"{spill_3m / 2**20:.1f} MiB", "(bounded: same as 1M)"],
        ],
    )
    print(f"\nray_cmf / dict of dicts: 1/{theirs / ours:.1f} (target <= 1/5)")


if __name__ == "__main__":
    main()
