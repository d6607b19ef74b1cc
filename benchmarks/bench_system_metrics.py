"""The cost of the system-metrics sampler (target: <= 0.5% of one core at the default 10 s interval).

Side by side in one process:
* CPU time per sample of what the sampler's thread does each interval: ``SystemSampler.sample()``
  (process and node CPU, memory, disk and network rates, GPUs through NVML when present) and the
  append of that row to its buffer, timed together and the append alone; against the floor: the same
  psutil readings with nothing else (what MLflow's system-metrics monitor and W&B's sampler read too);
* a CPU-bound Python training loop timed with no sampler and with a sampler 200x faster than the
  default (0.05 s), alternating, so the slowdown is measurable; the cost at 10 s is that share / 200.

Run: ``.venv/bin/python benchmarks/bench_system_metrics.py``
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _common import print_table, save_results

from ray_cmf.buffer import MetricBuffer
from ray_cmf.constants import DEFAULT_SYSTEM_METRICS_SECONDS
from ray_cmf.series_format import SpillManifest
from ray_cmf.system import SystemSampler

SAMPLES = 2_000
FAST = 0.05
LOOP_ITERATIONS = 6_000_000
ROUNDS = 5


def _buffer(tmp: Path, name: str) -> MetricBuffer:
    return MetricBuffer(tmp / name, manifest=SpillManifest("system_metrics", 1, str(tmp / f"{name}.parquet")))


def cpu_per_call(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


PROCESS = psutil.Process()  # made once, as the sampler makes its own once


def floor_reading() -> None:
    process = PROCESS
    with process.oneshot():
        process.cpu_times(), process.memory_info()
    psutil.cpu_times(), psutil.virtual_memory(), psutil.disk_io_counters(), psutil.net_io_counters()


def training_loop() -> float:
    start = time.perf_counter()
    total = 0.0
    for i in range(LOOP_ITERATIONS):
        total += i * 0.5
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sampler = SystemSampler(_buffer(tmp, "unit"), DEFAULT_SYSTEM_METRICS_SECONDS)
        ours = cpu_per_call(lambda: sampler.buffer.append(sampler.sample()), SAMPLES)
        row = sampler.sample()
        append = cpu_per_call(lambda: sampler.buffer.append(row), SAMPLES)
        floor = cpu_per_call(floor_reading, SAMPLES)
        sampler.buffer.close()

        off, on = [], []
        for round_ in range(ROUNDS):
            off.append(training_loop())
            fast = SystemSampler(_buffer(tmp, f"fast{round_}"), FAST).start()
            on.append(training_loop())
            fast.stop()
        slowdown = statistics.median(on) / statistics.median(off) - 1
    at_default = ours / DEFAULT_SYSTEM_METRICS_SECONDS
    print(f"CPU per sample, {SAMPLES} samples; a training loop of {LOOP_ITERATIONS:,} iterations, {ROUNDS} rounds\n")
    print_table(
        ["measure", "ray_cmf SystemSampler", "floor: the bare psutil readings", "ratio"],
        [
            [
                "CPU time per sample (readings + append)",
                f"{ours * 1e3:.3f} ms",
                f"{floor * 1e3:.3f} ms",
                f"{ours / floor:.2f}x",
            ],
            ["of which the buffer append", f"{append * 1e6:.1f} µs", "", ""],
            ["share of one core at 10 s", f"{at_default:.5%}", f"{floor / DEFAULT_SYSTEM_METRICS_SECONDS:.5%}", ""],
        ],
    )
    print()
    print_table(
        ["training loop", "median seconds"],
        [
            ["no sampler", f"{statistics.median(off):.3f}"],
            [f"sampler every {FAST} s (200x the default rate)", f"{statistics.median(on):.3f}"],
            ["slowdown at 0.05 s", f"{slowdown:+.2%}"],
            ["implied slowdown at the default 10 s", f"{slowdown / 200:+.4%}"],
        ],
    )
    met = at_default <= 0.005 and slowdown / 200 <= 0.005
    print(f"\ntarget <= 0.5% of one core at the default interval: {'met' if met else 'NOT met'}")
    figures = {
        "SystemSampler": {"cpu_per_sample_ms": ours * 1e3, "append_us": append * 1e6, "core_share_at_10s": at_default},
        "floor (bare psutil readings)": {"cpu_per_sample_ms": floor * 1e3},
        "training loop": {"slowdown_at_0.05s": slowdown, "implied_slowdown_at_10s": slowdown / 200},
    }
    save_results("system_metrics", "benchmarks/bench_system_metrics.py", figures, {"<= 0.5% of one core at 10 s": met})


if __name__ == "__main__":
    main()
