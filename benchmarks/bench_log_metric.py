"""log_metric per-call cost as the series grows, and peak memory of 1M rows x 4 floats.

Peers, side by side in one process:
* ray_cmf ``Cmf.log_metric`` (columnar buffer, background spill every 10 000 rows);
* a faithful re-creation of cmflib's ``Cmf.log_metric``: a dict of dicts keyed by ``max(keys) + 1``
  (labelled "cmflib algorithm": cmflib itself needs a git+DVC remote and ``cmf init``);
* the floor: ``list.append(dict)``.

Per-call cost "at N rows" is measured on a window of calls made after the series already holds N rows: the
least of 3 such windows, one after another, for every peer alike.
Run: ``.venv/bin/python benchmarks/bench_log_metric.py``
"""

from __future__ import annotations

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line, fmt_time, per_call

from ray_cmf import Cmf, MetricBuffer

SIZES = [1_000, 10_000, 100_000, 1_000_000]
REPEATS = 3  # windows per figure, one after another; the least is reported, for every peer alike


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
    cost = per_call(lambda i: cmf.log_metric("train", row(n + i)), window, REPEATS)
    cmf.close()
    return cost


def bench_cmflib(n: int, window: int) -> float:
    cmf = CmflibAlgorithm()
    cmf.metrics["train"] = {k: row(k) for k in range(1, n + 1)}  # prefill without the O(n^2) cost
    return per_call(lambda i: cmf.log_metric("train", row(n + i)), window, REPEATS)


def bench_floor(n: int, window: int) -> float:
    rows = [row(i) for i in range(n)]
    return per_call(lambda i: rows.append(row(n + i)), window, REPEATS)


def peak_bytes(fill) -> int:
    gc.collect()
    tracemalloc.start()
    keep = fill()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del keep
    return peak


def per_call_costs(results: Results) -> None:
    """log_metric per call at each size, against cmflib's algorithm and the floor; its table, figures, verdicts."""
    store = Path(tempfile.mkdtemp()) / "store"
    Cmf(pipeline_name="bench", store=store)  # pay store creation outside the timings
    measured = []
    for n in SIZES:
        window = 100_000 if n >= 100_000 else 20_000
        ours = bench_ray_cmf(n, window, store)
        theirs = bench_cmflib(n, max(50, min(n // 10, 2_000_000 // n)))
        floor = bench_floor(n, window)
        measured.append((n, ours, theirs, floor))
        results.figure(
            f"{n:,} rows already logged",
            {
                "ray_cmf_s": ours,
                "cmflib_algorithm_s": theirs,
                "list_append_floor_s": floor,
                "cmflib_over_ray_cmf": theirs / ours,
            },
        )
    title = "log_metric per-call cost (4 floats per row)"
    print(f"## {title}\n")
    results.table(
        title,
        ["rows already logged", "ray_cmf", "cmflib algorithm", "list.append floor", "cmflib / ray_cmf"],
        [[f"{n:,}", fmt_time(o), fmt_time(t), fmt_time(f), f"{t / o:,.0f}x"] for n, o, t, f in measured],
    )
    flat = measured[-1][1] / measured[0][1]
    print(f"\nray_cmf per-call at 1M / at 1k: {flat:.2f}x (target <= 1.5x)")
    at_100k = next(t / o for n, o, t, _ in measured if n == 100_000)
    print(f"ray_cmf vs cmflib algorithm at 100k rows: {at_100k:,.0f}x faster (target >= 100x)\n")
    results.verdict("log_metric <= 1.0 µs a row at every size measured", all(o <= 1e-6 for _, o, _, _ in measured))
    results.verdict("per-call at 1M rows <= 1.5x at 1k rows", flat <= 1.5)
    results.verdict("cmflib algorithm / ray_cmf >= 100x at 100k rows", at_100k >= 100)


def peak_memory(results: Results) -> None:
    """Peak Python memory of 1M rows in cmflib's dict of dicts and in ray_cmf's buffer, spilling or not."""
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
    holders = {
        "cmflib dict of dicts": theirs,
        "ray_cmf buffer, no spill": ours,
        "ray_cmf buffer, spill every 10k rows, 1M rows": spill_1m,
        "ray_cmf buffer, spill every 10k rows, 3M rows": spill_3m,
    }
    for holder, peak in holders.items():
        results.figure(holder, {"peak_mib": peak / 2**20})
    title = "Peak Python memory, 1M rows x 4 float columns (tracemalloc)"
    print(f"## {title}\n")
    results.table(
        title,
        ["holder", "peak", "vs dict of dicts"],
        [
            ["cmflib dict of dicts", f"{theirs / 2**20:.0f} MiB", "1"],
            ["ray_cmf buffer, no spill", f"{ours / 2**20:.0f} MiB", f"1/{theirs / ours:.1f}"],
            [
                "ray_cmf buffer, spill every 10k rows, 1M rows",
                f"{spill_1m / 2**20:.1f} MiB",
                f"1/{theirs / spill_1m:.0f}",
            ],
            [
                "ray_cmf buffer, spill every 10k rows, 3M rows",
                f"{spill_3m / 2**20:.1f} MiB",
                f"{spill_3m / spill_1m:.2f}x the 1M-row peak",
            ],
        ],
    )
    print(f"\nray_cmf / dict of dicts: 1/{theirs / ours:.1f} (target <= 1/5)")
    results.verdict("ray_cmf buffer <= 1/5 of cmflib's dict of dicts (1M rows)", ours * 5 <= theirs)
    results.verdict("spilling buffer's peak bounded (3M rows <= 1.5x 1M rows)", spill_3m <= 1.5 * spill_1m)


def main() -> None:
    results = Results("log_metric", command_line(__file__))
    per_call_costs(results)
    peak_memory(results)
    results.save()


if __name__ == "__main__":
    main()
