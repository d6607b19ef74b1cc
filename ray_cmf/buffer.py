"""MetricBuffer: an O(1)-append columnar buffer of one series, owned by the thread that logs into it.

Rows are numbered from 1 (``SequenceNumber``, as in cmflib). Each column is a typed ``array.array`` (or a
list for strings), so one float costs 8 bytes instead of a boxed object in a dict of dicts.

Every ``flush_rows`` rows the current chunk is sealed and handed, as one record batch, to a background
thread that gives it to the buffer's sink: the store's writer, or a local spill (see
:mod:`ray_cmf.series_format` for what is on disk). ``append`` never does I/O and takes no lock. Rows that
wait longer than ``flush_seconds`` are handed over by one clock thread per process, as a copy that leaves
the chunk to the thread that appends: a pause in the logging (a long evaluation) never holds rows back.
"""

from __future__ import annotations

import array
import logging
import numbers
import os
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from ray_cmf._names import check_metric_key, unstorable
from ray_cmf.constants import (
    ATTEMPT_COLUMN,
    DEFAULT_FLUSH_ROWS,
    DEFAULT_FLUSH_SECONDS,
    EXACT_FLOAT_INT,
    SEQUENCE_COLUMN,
)
from ray_cmf.errors import (
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    PrecisionError,
    RayCmfError,
    SchemaError,
)
from ray_cmf.exits import signals_held, track
from ray_cmf.frames import RANK_COLUMN, SERIES_COLUMN, TRIAL_COLUMN
from ray_cmf.series_format import FinishedFile, Spill, SpillManifest

log = logging.getLogger(__name__)

T = TypeVar("T")
_FILLED_BY_RAY_CMF = {  # columns that ray_cmf gives the rows itself: a metric of that name would be lost
    SEQUENCE_COLUMN: "numbers the rows in that column itself",
    ATTEMPT_COLUMN: "marks in that column which start of a restored trial or restarted run logged a row",
    TRIAL_COLUMN: "names each row's trial in that column when a sweep is read",
    SERIES_COLUMN: "names each row's series in that column where a trial holds several",
}
# What a user's own series (a Cmf's, a trial's Tune results) may not hold either: ray_cmf's Train rows fill it
TRAIN_RANK = {RANK_COLUMN: "reads that column as a Train rank's (a trial is summarised by its lowest rank's rows)"}
RESERVED_IN_TRAIN = {**_FILLED_BY_RAY_CMF, **TRAIN_RANK}  # every name a Train run's own rows may not hold


def refuse_reserved(key: str, reserved: Mapping[str, str]) -> None:
    """Raise :class:`InvalidNameError` where ``key`` is among ``reserved`` (name -> what ray_cmf does with it)."""
    if key in reserved:
        raise InvalidNameError("metric name", key, f"ray_cmf {reserved[key]}; log it under another name")


_MAX_QUEUED_CHUNKS = 64  # sealed chunks waiting for the sink before sealing blocks (back-pressure)
_SPILL_IDLE_S = 1.0  # how long a spill thread sleeps without a hand-over before it looks at its queue anyway
_CLOCK_TICKS = 4  # the flush clock looks at each buffer this many times per flush_seconds
_CLOCK_MAX_WAIT_S = 1.0  # and at every buffer at least this often
_TYPECODE_KINDS = {"d": "float", "q": "int", "b": "bool"}

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _Checked:
    """The fast-path type of a text column: no value is one, so each text is checked (see ``_classify``)."""


# kind -> (python type on the fast path, array typecode or None for a list, placeholder, arrow type)
_KINDS: dict[str, tuple[type, str | None, Any, pa.DataType]] = {
    "float": (float, "d", 0.0, pa.float64()),
    "int": (int, "q", 0, pa.int64()),
    "bool": (bool, "b", False, pa.bool_()),
    "str": (_Checked, None, "", pa.string()),
}


class Sink(Protocol):
    """Where a buffer's sealed chunks go (called from its spill thread only)."""

    def write(self, batch: pa.RecordBatch) -> None: ...

    def flush(self) -> None:
        """Block until every written batch is durable (or acknowledged by the writer)."""

    def close(self) -> None: ...


class _Column:
    """One column of the current chunk: typed values plus the chunk-local row numbers that are null."""

    __slots__ = ("kind", "nulls", "pytype", "values")

    def __init__(self, kind: str, leading_nulls: int) -> None:
        self.kind = kind
        pytype, code, placeholder, _ = _KINDS[kind]
        self.pytype = pytype
        self.values: Any = array.array(code, [placeholder]) * leading_nulls if code else [placeholder] * leading_nulls
        self.nulls: list[int] = list(range(leading_nulls))

    def append_null(self, row: int) -> None:
        self.values.append(_KINDS[self.kind][2])
        self.nulls.append(row)

    def widen_to_float(self) -> None:
        self.kind, self.pytype = "float", float
        self.values = array.array("d", self.values)

    def part(self, start: int, stop: int) -> _Column | None:
        """Chunk rows ``start`` to ``stop`` as a column of their own (None if all are null). Safe while the
        owner appends: each read is one atomic step, and the kind comes from the values read, which a
        widening replaces whole."""
        values = self.values[start:stop]
        nulls = [row - start for row in self.nulls.copy() if start <= row < stop]
        if len(nulls) == stop - start:
            return None
        part = _Column.__new__(_Column)
        part.kind = _TYPECODE_KINDS[values.typecode] if isinstance(values, array.array) else "str"
        part.pytype, part.values, part.nulls = _KINDS[part.kind][0], values, nulls
        return part

    def to_arrow(self) -> pa.Array:
        """The column as an Arrow array, built from its buffers (``pa.array`` would import pandas, which
        must not happen on a spill thread: it holds the GIL for a long import, and fails at exit)."""
        n = len(self.values)
        validity = None
        if self.nulls:
            valid = np.ones(n, dtype=bool)
            valid[self.nulls] = False
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        if self.kind == "str":
            encoded = [value.encode() for value in self.values]
            offsets = np.zeros(n + 1, dtype=np.int32)
            np.cumsum([len(e) for e in encoded], out=offsets[1:])
            buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        elif self.kind == "bool":
            bits = np.packbits(np.frombuffer(self.values, dtype=np.int8).astype(bool), bitorder="little")
            buffers = [validity, pa.py_buffer(bits)]
        else:
            buffers = [validity, pa.py_buffer(self.values)]
        return pa.Array.from_buffers(_KINDS[self.kind][3], n, buffers, null_count=len(self.nulls))


def _classify(key: str, value: Any, row: int) -> tuple[str, Any]:
    """Map a logged value to (kind, normalized value); reject containers and objects (naming the ``row``)."""
    if isinstance(value, bool | np.bool_):
        return "bool", bool(value)
    if isinstance(value, numbers.Integral):
        return "int", int(value)
    if isinstance(value, numbers.Real):
        return "float", float(value)
    if isinstance(value, str):
        if (wrong := unstorable(value)) is not None:
            raise InvalidValueError(key, value, row=row, why=f"is a text that {wrong}")
        return "str", value
    hint = "Call .item() on a tensor, or use ray_cmf.metrics for device tensors." if hasattr(value, "item") else ""
    raise InvalidValueError(key, value, hint, row)


def _magnitude(values: np.ndarray) -> int:
    """The largest absolute value of an int64 array, as a Python int (no overflow at -2**63)."""
    return max(abs(int(values.min())), abs(int(values.max()))) if len(values) else 0


def _rows_of(columns: Mapping[str, _Column], start: int, stop: int) -> dict[str, _Column]:
    """Chunk rows ``start`` to ``stop`` of ``columns``, leaving out those null throughout."""
    parts = ((name, column.part(start, stop)) for name, column in list(columns.items()))
    return {name: part for name, part in parts if part is not None}


def _chunk_to_batch(columns: dict[str, _Column], first_row: int, n: int) -> pa.RecordBatch:
    """Build the record batch of one sealed chunk (on the spill thread, or for :meth:`MetricBuffer.take`)."""
    arrays = [pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.arange(first_row, first_row + n))])]
    names = [SEQUENCE_COLUMN]
    for name, column in columns.items():
        names.append(name)
        arrays.append(column.to_arrow())
    return pa.RecordBatch.from_arrays(arrays, names=names)


class _SpillThread(threading.Thread):
    """Hands sealed chunks to the sink in the background so that ``append`` never does I/O.

    The queue is bounded: when the sink falls behind, sealing waits instead of growing memory. A chunk
    the sink refuses is lost, counted and warned about; the next chunks are still handed over.
    """

    _STOP = object()

    def __init__(self, sink: Sink, name: str) -> None:
        super().__init__(name=f"ray_cmf-spill-{name}", daemon=True)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=_MAX_QUEUED_CHUNKS)
        self.error: BaseException | None = None  # the last refusal not yet reported by flush()
        self.rows_lost = 0
        self._sink = sink

    def run(self) -> None:
        while True:
            try:  # woken by each hand-over, and by the clock: a Ctrl-C in the middle of a hand-over's wake-up
                item = self.queue.get(timeout=_SPILL_IDLE_S)  # leaves it asleep (CPython's gh-92530)
            except queue.Empty:
                continue
            try:
                if item is self._STOP:
                    return
                if isinstance(item, Future):  # every chunk before it is written: make them durable, then say so
                    self._settle(item)
                    continue
                self._sink.write(_chunk_to_batch(*item))
            except BaseException as exc:  # reported by flush() and close(); training must not die here
                self.error = exc
                self.rows_lost += item[2]
                log.warning(
                    "ray_cmf: spilling metrics to %s failed (%d rows lost so far): %r", self._sink, self.rows_lost, exc
                )
            finally:
                self.queue.task_done()

    def _settle(self, done: Future[None]) -> None:
        try:
            self._sink.flush()
        except BaseException as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)


class MetricBuffer:
    """Columnar, append-only metric series with background spill and an atomic Parquet finish.

    Sealed chunks go to a sink on a background thread: by default a :class:`Spill` in ``spill_dir``
    (whose existing segments are adopted, and numbering continues after them); inside a Ray job, the
    store's writer.

    Args:
        spill_dir: Directory for the crash-safe segments. It is created on the first spill only.
        sink: Where sealed chunks go instead of ``spill_dir`` (e.g. the store's writer).
        flush_rows: Seal and spill the current chunk after this many rows.
        flush_seconds: Hand rows over once they have waited about this long, whether or not more rows come.
        manifest: Written beside the segments on the first spill, so that :func:`ray_cmf.recover`
            knows what a dangling spill belongs to.
        reserved: More column names to refuse, each with why, beside those ray_cmf fills itself.

    Example:
        >>> import tempfile, pathlib
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> buf = MetricBuffer(tmp / "spill", flush_rows=2)
        >>> for step in range(3):
        ...     seq = buf.append({"step": step, "loss": 1.0 / (step + 1)})
        >>> done = buf.finish(tmp / "loss.parquet")
        >>> done.rows
        3
    """

    def __init__(
        self,
        spill_dir: str | os.PathLike[str] | None = None,
        *,
        sink: Sink | None = None,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        manifest: SpillManifest | None = None,
        reserved: Mapping[str, str] | None = None,
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows!r}")
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds!r}")
        if (spill_dir is None) == (sink is None):
            raise ValueError("MetricBuffer needs exactly one of spill_dir and sink")
        self._sink: Sink = sink if sink is not None else Spill(spill_dir, manifest)  # type: ignore[arg-type]
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._reserved = {**_FILLED_BY_RAY_CMF, **(reserved or {})}
        self._kinds: dict[str, str] = {}
        self._sealed_ints: dict[str, int] = {}  # per int column: the largest magnitude in sealed chunks
        self._row_keys: list[tuple[int, str, str | None]] = []  # (row, key, kind before) of the columns that
        # recent rows added (kind None) or widened from int to float: what a rejected row takes back
        self._skipped = 0  # keys of the current row that stored nothing
        self._columns: dict[str, _Column] = {}
        self._n = 0  # rows in the current chunk
        self._handed = 0  # rows at the chunk's head that another thread handed over as a copy
        self._first_row = 1 + (self._sink.rows if isinstance(self._sink, Spill) else 0)
        self._last_spill = time.monotonic()
        self._lock = threading.Lock()  # one hand-over at a time; appends never take it
        self._spiller: _SpillThread | None = None
        self._spill_losses = 0  # rows of chunks that the sink refused, from spill threads already stopped
        self._owner: int | None = None  # the thread that appends: the only one that may cut the chunk
        self._closed = False
        track(self)
        _CLOCK.watch(self)

    @property
    def rows(self) -> int:
        """Rows appended so far, including those already spilled or finished."""
        return self._first_row - 1 + self._n

    @property
    def rows_lost(self) -> int:
        """Rows that may not have reached the sink: chunks it refused, or dropped while it could not deliver
        them (an upper bound: a writer may hold a chunk that its sender gave up on; what a committed series
        lacks is recorded on its artifact, ``rows_lost``)."""
        spilling = self._spiller.rows_lost if self._spiller is not None else 0
        return self._spill_losses + spilling + int(getattr(self._sink, "dropped_rows", 0))

    @property
    def pending_rows(self) -> int:
        """Rows held in memory, not yet handed to the spill thread (always below ``flush_rows``)."""
        return self._n - self._handed

    def append(self, row: Mapping[str, Any]) -> int:
        """Append one row of name -> scalar and return its SequenceNumber. O(1) amortized, no I/O."""
        if self._closed:
            raise RayCmfError(
                "This series is closed (its Cmf or logger was closed, or its execution ended): to log more rows, "
                "start another execution (Cmf.create_execution) or a new Cmf"
            )
        n = self._n
        columns = self._columns
        try:  # all or nothing, whatever ends it (a refused value, or Ctrl-C's KeyboardInterrupt at any line)
            for key, value in row.items():
                column = columns.get(key)
                if column is not None and type(value) is column.pytype:
                    column.values.append(value)
                else:
                    self._append_slow(key, value, n)
            skipped = self._skipped  # None under a key with no column yet: stored nowhere
            if skipped:
                self._skipped = 0
            if len(row) - skipped != len(columns):
                for column in columns.values():
                    if len(column.values) == n:
                        column.append_null(n)
            self._n = n + 1
        except BaseException as exc:
            self._n, self._skipped = n, 0
            self._rollback(n)
            if isinstance(exc, OverflowError):  # an int beyond int64 into an int column, on the fast path
                key = next(k for k, v in row.items() if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX)
                raise PrecisionError(key, self._first_row + n, row[key], "does not fit in int64") from exc
            if isinstance(exc, AttributeError) and not isinstance(row, Mapping):  # checked only here: no cost
                raise InvalidArgumentError(
                    f"Row {self._first_row + n} is a {type(row).__name__} ({row!r:.60}), not a mapping of metric "
                    "name to value (a dict, {'loss': 0.5})"
                ) from None
            raise
        if n + 1 >= self.flush_rows:
            self._owner = threading.get_ident()
            self._seal()
        return self._first_row - 1 + self._n

    def _append_slow(self, key: str, value: Any, n: int) -> None:
        """Handle a new column, a null, a numeric widening or a type error."""
        if self._owner is None:
            self._owner = threading.get_ident()
        check_metric_key(key, "metric names (the keys of a row)")
        column = self._columns.get(key)
        if value is None:
            if column is not None:
                column.append_null(n)
            else:
                self._skipped += 1
            return
        row = self._first_row + n
        kind, value = _classify(key, value, row)
        if kind == "int" and not _INT64_MIN <= value <= _INT64_MAX:
            raise PrecisionError(key, row, value, "does not fit in int64")
        known = self._kinds.get(key)
        if known is None:
            refuse_reserved(key, self._reserved)
            self._row_keys.append((row, key, None))  # a column this row adds: a rejected row takes it back
            known = kind
        if known != kind:
            if {known, kind} != {"int", "float"}:
                raise SchemaError(key, row, known, kind)
            if kind == "int" and abs(value) > EXACT_FLOAT_INT:
                raise PrecisionError(key, row, value, "is an int beyond 2**53 in a column that also holds floats")
            if kind == "float" and (extent := self._int_extent(key)) > EXACT_FLOAT_INT:
                why = f"is a float, and the column holds an earlier int of magnitude {extent} beyond 2**53"
                raise PrecisionError(key, row, value, why)
            if known == "int":
                self._row_keys.append((row, key, known))  # a widening this row makes: a rejected row undoes it
            known, value = "float", float(value)
        self._kinds[key] = known
        if column is None:
            column = self._columns[key] = _Column(known, n)
        elif column.kind != known:
            column.widen_to_float()
        column.values.append(value)

    def _int_extent(self, key: str) -> int:
        """The largest magnitude of the ints logged under ``key`` so far (sealed chunks and this one)."""
        column = self._columns.get(key)
        current = _magnitude(np.frombuffer(column.values, dtype=np.int64)) if column is not None else 0
        return max(self._sealed_ints.get(key, 0), current)

    def _rollback(self, n: int) -> None:
        """Drop the partial row at chunk index ``n`` so a rejected row leaves no trace."""
        row = self._first_row + n
        for changed, key, before in self._row_keys:
            if changed != row:
                continue
            if before is None:
                self._kinds.pop(key, None)
                self._columns.pop(key, None)
            else:  # narrowed back: the ints it held were exact as floats (at most 2**53)
                self._kinds[key] = before
                column = self._columns.get(key)
                if column is not None and column.kind != before:
                    column.kind, column.pytype = before, int
                    column.values = array.array("q", (int(v) for v in column.values[:n]))
        self._row_keys.clear()
        for column in self._columns.values():
            del column.values[n:]
            while column.nulls and column.nulls[-1] >= n:
                column.nulls.pop()

    def _cut(self) -> tuple[dict[str, _Column], int, int] | None:
        """End the current chunk and start a fresh one; return its rows not handed over yet (None if none).
        Only the appending thread cuts, under the lock."""
        self._last_spill = time.monotonic()
        n, handed = self._n, self._handed
        if any(len(column.values) > n for column in self._columns.values()):
            self._rollback(n)  # a row this thread was appending when a signal's handler came to close the buffer
        if not n:
            return None
        for key, column in self._columns.items():
            if column.kind == "int":  # what a later int -> float widening must check
                extent = _magnitude(np.frombuffer(column.values, dtype=np.int64))
                self._sealed_ints[key] = max(self._sealed_ints.get(key, 0), extent)
        columns = _rows_of(self._columns, handed, n) if handed else self._columns
        chunk = (columns, self._first_row + handed, n - handed) if n > handed else None
        self._columns = {}
        self._row_keys.clear()
        self._first_row += n
        self._n = self._handed = 0
        return chunk

    def _copy(self) -> tuple[dict[str, _Column], int, int] | None:
        """The complete rows not handed over yet, as a copy that leaves the chunk to the appending thread
        (any thread, under the lock): a row the owner is appending counts only once ``_n`` says so."""
        self._last_spill = time.monotonic()
        n, handed = self._n, self._handed
        if n <= handed:
            return None
        self._handed = n
        return _rows_of(self._columns, handed, n), self._first_row + handed, n - handed

    def _seal(self, then: Future[None] | None = None) -> None:
        """Hand the rows not handed over yet to the spill thread, and after them ``then``, which it settles
        once the sink holds them: the appending thread cuts the chunk, any other copies its complete rows (a
        copy is always safe; a cut frees the chunk's memory)."""
        with signals_held(), self._lock:
            if self._n > self._handed or then is not None:  # before the cut: a thread Python refuses
                self._spilling()  # leaves the rows here for the next hand-over
            chunk = self._cut() if self._owner == threading.get_ident() else self._copy()
            for item in (chunk, then):
                if item is not None:
                    self._spilling().queue.put(item)

    def _spilling(self) -> _SpillThread:
        """The spill thread, started on first use."""
        if self._spiller is None:
            spiller = _SpillThread(self._sink, str(id(self)))
            spiller.start()
            self._spiller = spiller
        return self._spiller

    def _due(self, now: float) -> bool:
        """Rows have waited ``flush_seconds`` since the last hand-over (the flush clock asks)."""
        return self._n > self._handed and now - self._last_spill >= self.flush_seconds and not self._closed

    def seal(self) -> None:
        """Hand the rows logged so far to the spill thread now, without waiting for the write (from any
        thread)."""
        self._seal()

    def sealed(self) -> Future[None]:
        """Seal the rows logged so far and return a future that completes once the sink holds every row sealed
        so far (or fails with the sink's error); from any thread, and another thread may wait on it."""
        done: Future[None] = Future()
        self._seal(then=done)
        return done

    def flush(self) -> None:
        """Seal the rows logged so far and block until the sink holds every sealed row (from any thread)."""
        with signals_held():
            self.sealed().result()
        self._report_refusals()

    def take(self) -> pa.RecordBatch | None:
        """The rows not handed over yet, as one batch that the caller delivers itself (e.g. on its commit
        request: one trip to the writer, not two), once the sink has been handed every chunk before them;
        from any thread (a script's exit commits rows that a thread logged)."""
        with signals_held(), self._lock:
            chunk = self._cut() if self._owner in (None, threading.get_ident()) else self._copy()
        if self._spiller is not None:
            self._spiller.queue.join()
        self._report_refusals()
        return _chunk_to_batch(*chunk) if chunk is not None else None

    def _report_refusals(self) -> None:
        """Raise what the sink refused since the last report."""
        if self._spiller is not None:
            error, self._spiller.error = self._spiller.error, None
            if error is not None:
                raise RayCmfError(
                    f"Spilling metrics to {self._sink} failed: {error!r}; {self.rows_lost} rows are lost so far. "
                    "What was spilled stays there (ray_cmf.recover() commits it), and later rows are spilled again."
                ) from error

    def finish(self, dest: str | os.PathLike[str]) -> FinishedFile:
        """Write every row (earlier versions included) to ``dest`` atomically; return path, md5, size, rows.

        The buffer stays usable: rows appended later extend this version in the next ``finish``.
        """
        if not isinstance(self._sink, Spill):
            raise RayCmfError(f"This buffer sends its rows to {self._sink}; commit them there, not with finish()")
        self.flush()
        return self._sink.finish(dest, lambda finished: finished)

    def close(self) -> None:
        """Hand every row to the sink and stop the spill thread; spilled rows stay for recovery. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _CLOCK.forget(self)
        self._seal()
        if self._spiller is not None:
            self._spiller.queue.put(_SpillThread._STOP)
            self._spiller.join()
            self._spill_losses += self._spiller.rows_lost
            self._spiller = None
        self._sink.close()
        if self.rows_lost:
            log.warning("ray_cmf: %d rows logged to %s may not have reached it", self.rows_lost, self._sink)

    def __enter__(self) -> MetricBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FlushClock:
    """One daemon thread per process that hands over the rows of every buffer whose rows have waited
    ``flush_seconds``, so that no row depends on a later one to leave; the hot path keeps no clock."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Watch nothing, with no thread yet (also in a forked child, whose copy of the thread is gone)."""
        self._buffers: weakref.WeakSet[MetricBuffer] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, buffer: MetricBuffer) -> None:
        """Look at ``buffer`` from now on (it may be due sooner than the buffers so far)."""
        with signals_held(), self._lock:
            self._buffers.add(buffer)
            if self._thread is None or not self._thread.is_alive():  # not yet, or a forked child's
                self._thread = threading.Thread(target=self._run, name="ray_cmf-flush-clock", daemon=True)
                self._thread.start()
        self._changed.set()

    def flush_all(self) -> None:
        """Hand over the rows of every buffer now, and wait until their sinks hold them."""
        with self._lock:
            buffers = list(self._buffers)
        for buffer in buffers:
            try:
                buffer.flush()
            except Exception as exc:  # the others' rows still leave
                log.warning("ray_cmf: rows of a series may be missing: %r", exc)

    def forget(self, buffer: MetricBuffer) -> None:
        """Stop looking at ``buffer`` (closed)."""
        with signals_held(), self._lock:
            self._buffers.discard(buffer)

    def _run(self) -> None:
        while True:
            try:
                wait = self._tick()
            except Exception as exc:  # a spill thread that cannot start (the interpreter is ending), say
                log.warning("ray_cmf: the flush clock could not hand rows over: %r", exc)
                wait = _CLOCK_MAX_WAIT_S
            self._changed.wait(wait)
            self._changed.clear()

    def _tick(self) -> float:
        """Hand over the rows of every buffer that is due; return how long to wait for the next look."""
        with self._lock:
            buffers = list(self._buffers)
        now = time.monotonic()
        for buffer in buffers:
            if buffer._due(now):
                buffer.seal()
        return min([_CLOCK_MAX_WAIT_S, *(buffer.flush_seconds / _CLOCK_TICKS for buffer in buffers)])


_CLOCK = _FlushClock()
os.register_at_fork(after_in_child=_CLOCK.reset)  # a forked child (a DataLoader worker) starts afresh


def flush_every_buffer() -> None:
    """Hand the rows of every open buffer of this process to its sink and wait until it holds them: for a
    process that Ray is about to stop with no warning of its own (a trial whose driver ends)."""
    _CLOCK.flush_all()
