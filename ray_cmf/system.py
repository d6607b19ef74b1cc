"""SystemSampler: a low-cost background series of this process's and its node's resource use.

Every ``interval`` seconds one row: process and node CPU % (over at least :data:`CPU_WINDOW_S`), RSS and node
memory, disk and network rates since the previous row, and per-GPU utilization, memory and power when NVML
(``nvidia-ml-py``) sees a GPU. Rows go into an ordinary :class:`~ray_cmf.buffer.MetricBuffer`, so the series is as
durable as any other: spilled through the writer, committed at its trial's or run's end, recovered after a crash.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from ray_cmf.buffer import MetricBuffer
from ray_cmf.constants import DEFAULT_FLUSH_SECONDS
from ray_cmf.frames import PID_COLUMN

if TYPE_CHECKING:  # the store's modules load ML-Metadata: a sampler in a bare worker does without them
    from ray_cmf.binding import SeriesKey
    from ray_cmf.client import WriterClient

log = logging.getLogger(__name__)
_MB = 2**20
RAMP_FIRST_S = 0.05  # a ramped sampler's first gap (see SystemSampler)
# CPU time advances in clock ticks (10 ms on Linux): over a few ms one tick reads as several CPUs, over 0.2 s the
# rounding is within 10 points. A row's CPU % spans at least this long, or is left out.
CPU_WINDOW_S = 0.2


class _Gpus:
    """NVML handles of the node's GPUs; none when NVML or a GPU is missing."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception:  # no NVML library, no driver or no GPU: the series has no GPU columns
            self.handles = []

    def sample(self) -> dict[str, float]:
        row: dict[str, float] = {}
        for i, handle in enumerate(self.handles):
            nvml = self._nvml
            row[f"gpu{i}_util_percent"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            row[f"gpu{i}_mem_used_mb"] = nvml.nvmlDeviceGetMemoryInfo(handle).used / _MB
            row[f"gpu{i}_power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        return row


@functools.cache
def node_gpus() -> _Gpus:
    """This process's NVML handles, found once: importing NVML takes tens of milliseconds, which a node's
    sampler must not spend at each trial's first row (a short trial may be gone by then)."""
    return _Gpus()


class _CpuClock:
    """A process's and its node's CPU time readings, kept until a newer one is :data:`CPU_WINDOW_S` old, so
    each CPU % spans the time since the previous row, or the last :data:`CPU_WINDOW_S` when rows are closer."""

    def __init__(self) -> None:
        self._readings: deque[tuple[float, float, float, float]] = deque()  # (monotonic, process, node busy, total)
        self._cpus = psutil.cpu_count() or 1

    def percents(self, process: psutil.Process) -> tuple[float, float] | None:
        """The process's CPU % (100 per CPU) and the node's (0-100) since the newest reading at least
        :data:`CPU_WINDOW_S` old; None when there is none yet."""
        times, node = process.cpu_times(), psutil.cpu_times()
        total = sum(node) - getattr(node, "guest", 0.0) - getattr(node, "guest_nice", 0.0)  # guest is in user
        now = (time.monotonic(), times.user + times.system, total - node.idle - getattr(node, "iowait", 0.0), total)
        while len(self._readings) > 1 and now[0] - self._readings[1][0] >= CPU_WINDOW_S:
            self._readings.popleft()
        then = self._readings[0] if self._readings and now[0] - self._readings[0][0] >= CPU_WINDOW_S else None
        self._readings.append(now)
        if then is None:
            return None
        process_cpu = (now[1] - then[1]) / (now[0] - then[0]) * 100
        node_cpu = (now[2] - then[2]) / max(now[3] - then[3], 1e-9) * 100
        return _clamp(process_cpu, 100.0 * self._cpus), _clamp(node_cpu, 100.0)


def _clamp(percent: float, most: float) -> float:
    """A CPU % within what the hardware allows (a reading's tick rounding can pass it), to 0.1."""
    return round(min(max(percent, 0.0), most), 1)


class SystemSampler:
    """Samples a process (this one by default) and its node into ``buffer`` every ``interval`` seconds, on a
    daemon thread.

    The first row is taken at :meth:`start`, without the CPU % and the rates (they need a previous
    reading), and the last at :meth:`stop`, so even a process that lives less than an interval has two. A
    row's CPU % spans at least :data:`CPU_WINDOW_S` (reaching back past the previous row when that is closer),
    and rows before the process was watched that long have none.
    :meth:`stop` ends the thread and closes the buffer, which hands its rows to its sink. A process that
    exits ends its series quietly.

    Args:
        buffer: Where the rows go (its sink decides: a spill, or the store's writer).
        interval: Seconds between rows (> 0).
        extra: Constant columns added to every row (e.g. ``{"rank": 1}``).
        pid: The process to sample; default this one.
        ramp: Sample densely at first (after :data:`RAMP_FIRST_S`, then at doubling gaps up to ``interval``):
            for a process sampled from outside, whose end is not seen in time for a last row (Tune stops a
            trial's process as the trial ends), so that a short one still gets rows after its first.
    """

    def __init__(
        self,
        buffer: MetricBuffer,
        interval: float,
        extra: dict[str, Any] | None = None,
        pid: int | None = None,
        *,
        ramp: bool = False,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"system metrics interval must be > 0 seconds, got {interval!r}")
        self.buffer = buffer
        self.interval = interval
        self.ramp = ramp
        self.extra = dict(extra or {})
        self.samples = 0
        self._process = psutil.Process(pid)
        self._gpus = node_gpus()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray_cmf-system-metrics", daemon=True)
        self._last = self._counters()
        self._cpu = _CpuClock()

    def start(self) -> SystemSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take the last row, stop sampling and hand every row to the buffer's sink. Idempotent."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.buffer.close()

    def _run(self) -> None:
        """The first row now, one each interval (after the ramp), and the last once stopped (all appended on
        this thread)."""
        first, gap = True, min(RAMP_FIRST_S, self.interval) if self.ramp else self.interval
        while self._append(first):
            first = False
            if self._stopped.wait(gap):
                self._append(first)
                return
            gap = min(gap * 2, self.interval)

    def _append(self, first: bool) -> bool:
        """Append one row; False once the process is gone."""
        try:
            self.buffer.append(self.sample(first))
        except psutil.NoSuchProcess:
            return False
        except Exception as exc:  # a failing sensor must not end the series, nor training
            log.warning("ray_cmf: system metrics sample failed: %s", exc)
        return True

    @staticmethod
    def _counters() -> tuple[float, Any, Any]:
        return time.monotonic(), psutil.disk_io_counters(), psutil.net_io_counters()

    def sample(self, first: bool = False) -> dict[str, Any]:
        """One row: the readings now, and (unless ``first``) CPU % and the disk and network rates since the
        previous row."""
        now, disk, net = counters = self._counters()
        then, disk0, net0 = self._last
        self._last = counters
        seconds = max(now - then, 1e-9)
        memory = psutil.virtual_memory()
        with self._process.oneshot():
            rss = self._process.memory_info().rss
            # exiting (its memory is released before it turns zombie) or exited and not yet reaped: no reading
            if rss == 0 or self._process.status() == psutil.STATUS_ZOMBIE:
                raise psutil.ZombieProcess(self._process.pid)
            cpu = self._cpu.percents(self._process)
        self.samples += 1
        row: dict[str, Any] = {
            "step": self.samples,
            "wall_time": time.time(),
            **self.extra,
            "proc_rss_mb": rss / _MB,
            "node_mem_used_mb": (memory.total - memory.available) / _MB,
            "node_mem_percent": memory.percent,
        }
        if cpu is not None:
            row["proc_cpu_percent"], row["node_cpu_percent"] = cpu
        if not first:
            if disk is not None and disk0 is not None:
                row["disk_read_mb_s"] = (disk.read_bytes - disk0.read_bytes) / _MB / seconds
                row["disk_write_mb_s"] = (disk.write_bytes - disk0.write_bytes) / _MB / seconds
            if net is not None and net0 is not None:
                row["net_sent_mb_s"] = (net.bytes_sent - net0.bytes_sent) / _MB / seconds
                row["net_recv_mb_s"] = (net.bytes_recv - net0.bytes_recv) / _MB / seconds
        return row | self._gpus.sample()


def sample_into(
    writer: WriterClient,
    key: SeriesKey | Callable[[], SeriesKey],
    interval: float | None,
    extra: dict[str, Any] | None = None,
    pid: int | None = None,
    *,
    ramp: bool = False,
    flush_seconds: float = DEFAULT_FLUSH_SECONDS,
) -> SystemSampler | None:
    """Start sampling a process (this one by default) into a series at the store's writer, each row with the
    ``pid`` it sampled and the ``extra`` columns; None when ``interval`` is None (switched off). ``ramp``: see
    :class:`SystemSampler`. Rows reach the writer every ``flush_seconds`` (or every ``interval``, if longer):
    what a process or node that dies had not handed over is lost."""
    if interval is None:
        return None
    buffer = MetricBuffer(sink=writer.sink(key), flush_seconds=max(flush_seconds, interval))
    columns = {**(extra or {}), PID_COLUMN: os.getpid() if pid is None else pid}
    return SystemSampler(buffer, interval, columns, pid, ramp=ramp).start()
