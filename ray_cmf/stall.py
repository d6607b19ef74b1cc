"""Rows that leave a training loop in batches, yet never stay behind when the loop stops making progress.

A loop whose every row is sent to the writer as it is logged wakes the sending thread, the writer and
Ray's raylet once per row; where the training workers fill the cores, those wakes cost the run wall time
(benchmarks/RESULTS.md §5). Batching the rows risks the last ones: a rank that blocks in a collective
whose peer has died neither returns nor raises until Ray stops it, and its unsent rows die with it.
:class:`StallWatch` batches, and seals the waiting rows as soon as the loop stalls.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from ray_cmf.buffer import MetricBuffer

log = logging.getLogger(__name__)

STALL_SECONDS = 0.1  # a loop that has not stepped for this long may be blocked for good
_POLL_SECONDS = 0.05
_WATCHED: weakref.WeakSet[StallWatch] = weakref.WeakSet()  # this process's watches not stopped yet


class StallWatch:
    """Hands ``buffer``'s rows to its sink once the loop has not called :meth:`beat` for ``STALL_SECONDS``.

    The loop thread appends to the buffer, calls :meth:`beat` once per step, and :meth:`seal` before anything
    that may block for good. The buffer's own ``flush_rows`` / ``flush_seconds`` batch the rows while the loop
    makes progress.
    """

    def __init__(self, buffer: MetricBuffer) -> None:
        self.buffer = buffer
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ray_cmf-stall-watch", daemon=True)
        self._thread.start()
        _WATCHED.add(self)

    def beat(self) -> None:
        """The loop made progress."""
        self._last_beat = time.monotonic()

    def seal(self) -> None:
        """Hand the waiting rows to the sink now (the loop is about to wait for something that may never come)."""
        if self.buffer.pending_rows:
            self.buffer.seal()

    def flush(self) -> None:
        """Hand every row to the sink and wait until it holds them (see :meth:`MetricBuffer.flush`), from any
        thread: Ray stops a process whose loop thread waits in a collective for good."""
        self.buffer.flush()

    def stop(self) -> None:
        """Stop watching; the loop thread owns the buffer alone again."""
        _WATCHED.discard(self)
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopped.wait(_POLL_SECONDS):
            if self.buffer.pending_rows and time.monotonic() - self._last_beat >= STALL_SECONDS:
                self.seal()


def flush_every_watch() -> None:
    """Hand the rows of every watch of this process to its sink, from any thread (the process is about to be
    stopped); a failure is a warning: logging never kills training."""
    for watch in list(_WATCHED):
        try:
            watch.flush()
        except Exception as exc:
            log.warning("ray_cmf: rows of a stopped worker may not have reached the writer: %s", exc)
