"""MetricBuffer: an O(1)-append columnar buffer that spills to crash-safe segments and finishes as Parquet.

Rows are numbered from 1 (``SequenceNumber``, as in cmflib). Each column is a typed ``array.array`` (or a
list for strings), so one float costs 8 bytes instead of a boxed object in a dict of dicts.

Every ``flush_rows`` rows or ``flush_seconds`` seconds the current chunk is sealed and handed to a
background thread that appends it, as one record batch, to an Arrow IPC stream segment. A batch that
was fully written survives a SIGKILL: :func:`read_segments` reads every complete batch and stops at a
torn one. ``finish()`` writes the final Parquet file (one row group per spilled piece) atomically,
hashing it with md5 as it is written.
"""

from __future__ import annotations

import array
import hashlib
import io
import json
import logging
import numbers
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ray_cmf.constants import (
    DEFAULT_FLUSH_ROWS,
    DEFAULT_FLUSH_SECONDS,
    SEGMENT_GLOB,
    SEQUENCE_COLUMN,
    SPILL_MANIFEST,
    SUMMARY_KEY,
)
from ray_cmf.errors import InvalidValueError, RayCmfError, SchemaError

log = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# kind -> (python type on the fast path, array typecode or None for a list, placeholder, arrow type)
_KINDS: dict[str, tuple[type, str | None, Any, pa.DataType]] = {
    "float": (float, "d", 0.0, pa.float64()),
    "int": (int, "q", 0, pa.int64()),
    "bool": (bool, "b", False, pa.bool_()),
    "str": (str, None, "", pa.string()),
}


@dataclass(frozen=True)
class FinishedFile:
    """A finished Parquet file: where it is, its md5 (hex), its size in bytes and its row count."""

    path: Path
    md5: str
    size: int
    rows: int


class _Column:
    """One column of the current chunk: typed values plus the chunk-local row numbers that are null."""

    __slots__ = ("kind", "pytype", "values", "nulls")

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

    def to_arrow(self) -> pa.Array:
        arrow_type = _KINDS[self.kind][3]
        if self.kind == "str":
            data: Any = self.values
        elif self.kind == "bool":
            data = np.frombuffer(self.values, dtype=np.int8).astype(bool)
        else:
            data = np.frombuffer(self.values, dtype=np.float64 if self.kind == "float" else np.int64)
        mask = None
        if self.nulls:
            mask = np.zeros(len(self.values), dtype=bool)
            mask[self.nulls] = True
        return pa.array(data, type=arrow_type, mask=mask)


def _classify(key: str, value: Any) -> tuple[str, Any]:
    """Map a logged value to (kind, normalized value); reject containers and objects."""
    if isinstance(value, bool | np.bool_):
        return "bool", bool(value)
    if isinstance(value, numbers.Integral):
        as_int = int(value)
        if _INT64_MIN <= as_int <= _INT64_MAX:
            return "int", as_int
        return "float", float(as_int)
    if isinstance(value, numbers.Real):
        return "float", float(value)
    if isinstance(value, str):
        return "str", value
    hint = "Call .item() on a tensor, or use ray_cmf.metrics for device tensors." if hasattr(value, "item") else ""
    raise InvalidValueError(key, value, hint)


def _chunk_to_batch(columns: dict[str, _Column], first_row: int, n: int) -> pa.RecordBatch:
    """Build the record batch of one sealed chunk (runs on the spill thread)."""
    arrays = [pa.array(np.arange(first_row, first_row + n, dtype=np.int64))]
    names = [SEQUENCE_COLUMN]
    for name, column in columns.items():
        names.append(name)
        arrays.append(column.to_arrow())
    return pa.RecordBatch.from_arrays(arrays, names=names)


class _SegmentWriter:
    """Appends record batches to Arrow IPC stream segments, opening a new segment when the schema changes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: io.BufferedWriter | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self._count = len(list(directory.glob(SEGMENT_GLOB))) if directory.exists() else 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self._stream is None or not batch.schema.equals(self._schema):
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.directory / f"seg-{self._count:05d}.arrows", "wb")  # noqa: SIM115
            self._count += 1
            self._stream = pa.ipc.new_stream(self._file, batch.schema)
            self._schema = batch.schema
        self._stream.write_batch(batch)
        assert self._file is not None
        self._file.flush()  # in the OS page cache now: survives a process kill

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            assert self._file is not None
            self._file.close()
        self._stream = self._file = None
        self._schema = None


class _SpillThread(threading.Thread):
    """Writes sealed chunks in the background so that ``append`` never does I/O."""

    _STOP = object()

    def __init__(self, directory: Path, manifest: Mapping[str, Any] | None) -> None:
        super().__init__(name=f"ray_cmf-spill-{directory.name}", daemon=True)
        self.queue: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self._writer = _SegmentWriter(directory)
        self._manifest = manifest

    def run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is self._STOP:
                    self._writer.close()
                    return
                if self.error is None:
                    self._write(*item)
            except BaseException as exc:  # reported by finish(); training must not die here
                self.error = exc
                log.warning("ray_cmf: spilling metrics to %s failed: %r", self._writer.directory, exc)
            finally:
                self.queue.task_done()

    def _write(self, columns: dict[str, _Column], first_row: int, n: int) -> None:
        if self._manifest is not None:
            self._writer.directory.mkdir(parents=True, exist_ok=True)
            (self._writer.directory / SPILL_MANIFEST).write_text(json.dumps(self._manifest))
            self._manifest = None
        self._writer.write(_chunk_to_batch(columns, first_row, n))


class _HashingFile(io.RawIOBase):
    """A write-only file that md5-hashes and counts every byte on its way to disk."""

    def __init__(self, raw: io.BufferedWriter) -> None:
        super().__init__()
        self._raw = raw
        self.md5 = hashlib.md5()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.md5.update(view)
        self._raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()


def read_segments(directory: Path) -> Iterator[pa.RecordBatch]:
    """Yield every complete record batch of a spill directory, in order; stop quietly at a torn batch."""
    for segment in sorted(directory.glob(SEGMENT_GLOB)):
        with open(segment, "rb") as source:
            try:
                reader = pa.ipc.open_stream(source)
                for batch in reader:
                    yield batch
            except (pa.ArrowInvalid, OSError, EOFError):
                log.info("ray_cmf: %s ends in a torn batch; keeping the complete ones", segment)


def write_parquet(batches: list[pa.RecordBatch], dest: Path) -> FinishedFile:
    """Write batches as one row group each to ``dest`` atomically, hashing while writing.

    A ``{md5}`` in the file name is replaced by the content hash, so every version gets its own name.
    """
    schemas = [b.schema for b in batches] or [pa.schema([(SEQUENCE_COLUMN, pa.int64())])]
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    summary = SeriesSummary()
    with open(tmp, "wb") as raw:
        hashing = _HashingFile(raw)
        with pq.ParquetWriter(hashing, schema) as writer:
            for batch in batches:
                table = _conform(batch, schema)
                summary.add(table)
                writer.write_table(table, row_group_size=max(batch.num_rows, 1))
            writer.add_key_value_metadata({SUMMARY_KEY: summary.to_json()})
        raw.flush()
        os.fsync(raw.fileno())
    md5 = hashing.md5.hexdigest()
    dest = dest.with_name(dest.name.replace("{md5}", md5[:12]))
    os.replace(tmp, dest)
    return FinishedFile(dest, md5, hashing.size, summary.rows)


class SeriesSummary:
    """Per-column min, max and last value (NaN and nulls skipped) and the row count, gathered while
    writing and stored in the file's footer, so a trial table needs no data scan."""

    def __init__(self) -> None:
        self.rows = 0
        self.columns: dict[str, dict[str, Any]] = {}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for field in table.schema:
            if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
                continue
            column = table.column(field.name)
            if pa.types.is_floating(field.type):
                column = pc.if_else(pc.is_nan(column), None, column)
            valid = pc.drop_null(column)
            if len(valid) == 0:
                continue
            low, high = pc.min_max(valid).values()
            stats = self.columns.setdefault(field.name, {"min": low.as_py(), "max": high.as_py()})
            stats["min"], stats["max"] = min(stats["min"], low.as_py()), max(stats["max"], high.as_py())
            stats["last"] = valid[-1].as_py()

    def to_json(self) -> str:
        return json.dumps({"rows": self.rows, "columns": self.columns})


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """Cast a batch to the unified schema, adding all-null columns it lacks."""
    columns = [
        batch.column(f.name).cast(f.type) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


class MetricBuffer:
    """Columnar, append-only metric series with background spill and an atomic Parquet finish.

    Args:
        spill_dir: Directory for the crash-safe segments. It is created on the first spill only.
        flush_rows: Seal and spill the current chunk after this many rows.
        flush_seconds: Also seal when this long has passed since the last spill (checked on append).
        manifest: JSON-serializable facts written beside the segments on the first spill, so that
            :func:`ray_cmf.recover` knows what a dangling spill belongs to.

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
        spill_dir: str | os.PathLike[str],
        *,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        manifest: Mapping[str, Any] | None = None,
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows!r}")
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds!r}")
        self.spill_dir = Path(spill_dir)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._manifest = dict(manifest) if manifest is not None else None
        self._kinds: dict[str, str] = {}
        self._columns: dict[str, _Column] = {}
        self._n = 0  # rows in the current chunk
        self._first_row = 1  # SequenceNumber of the chunk's first row
        self._last_spill = time.monotonic()
        self._spiller: _SpillThread | None = None
        self._base: Path | None = None  # previous finished version; the next finish extends it
        self._closed = False

    @property
    def rows(self) -> int:
        """Rows appended so far, including those already spilled or finished."""
        return self._first_row - 1 + self._n

    @property
    def pending_rows(self) -> int:
        """Rows held in memory, not yet sealed for spilling (always below ``flush_rows``)."""
        return self._n

    def append(self, row: Mapping[str, Any]) -> int:
        """Append one row of name -> scalar and return its SequenceNumber. O(1) amortized, no I/O."""
        if self._closed:
            raise RayCmfError("MetricBuffer is closed; create a new one to log more rows")
        n = self._n
        columns = self._columns
        try:
            for key, value in row.items():
                column = columns.get(key)
                if column is not None and type(value) is column.pytype:
                    column.values.append(value)
                else:
                    self._append_slow(key, value, n)
        except BaseException:
            self._rollback(n)
            raise
        if len(row) != len(columns):
            for column in columns.values():
                if len(column.values) == n:
                    column.append_null(n)
        self._n = n + 1
        if self._n >= self.flush_rows or time.monotonic() - self._last_spill >= self.flush_seconds:
            self._seal()
        return self._first_row - 1 + self._n

    def _append_slow(self, key: str, value: Any, n: int) -> None:
        """Handle a new column, a null, a numeric widening or a type error."""
        if not isinstance(key, str):
            raise InvalidValueError(repr(key), key, "Metric names must be strings.")
        column = self._columns.get(key)
        if value is None:
            if column is not None:
                column.append_null(n)
            return
        kind, value = _classify(key, value)
        known = self._kinds.setdefault(key, kind)
        if known != kind:
            if {known, kind} != {"int", "float"}:
                raise SchemaError(key, self._first_row + n, known, kind)
            self._kinds[key] = known = "float"
            value = float(value)
        if column is None:
            column = self._columns[key] = _Column(known, n)
        elif column.kind != known:
            column.widen_to_float()
        column.values.append(value)

    def _rollback(self, n: int) -> None:
        """Drop the partial row at chunk index ``n`` so a rejected row leaves no trace."""
        for column in self._columns.values():
            del column.values[n:]
            while column.nulls and column.nulls[-1] >= n:
                column.nulls.pop()

    def _seal(self) -> None:
        """Hand the current chunk to the spill thread and start a fresh one."""
        if self._n:
            if self._spiller is None:
                manifest = None
                if self._manifest is not None:
                    manifest = {**self._manifest, "base": str(self._base) if self._base else None}
                self._spiller = _SpillThread(self.spill_dir, manifest)
                self._spiller.start()
            self._spiller.queue.put((self._columns, self._first_row, self._n))
            self._columns = {}
            self._first_row += self._n
            self._n = 0
        self._last_spill = time.monotonic()

    @classmethod
    def resume(cls, spill_dir: str | os.PathLike[str], **kwargs: Any) -> MetricBuffer:
        """A buffer that continues a spill left by an earlier process (e.g. a restored Tune driver).

        Its complete rows are kept, and numbering continues after them.
        """
        buffer = cls(spill_dir, **kwargs)
        if buffer.spill_dir.exists():
            buffer._first_row += sum(batch.num_rows for batch in read_segments(buffer.spill_dir))
            buffer._spiller = _SpillThread(buffer.spill_dir, None)
            buffer._spiller.start()
        return buffer

    def seal(self) -> None:
        """Hand the current rows to the spill thread now, without waiting for the write."""
        self._seal()

    def flush(self) -> None:
        """Seal the current rows and block until every sealed chunk is on disk."""
        self._seal()
        if self._spiller is not None:
            self._spiller.queue.join()
            self._raise_spill_error()

    def _raise_spill_error(self) -> None:
        if self._spiller is not None and self._spiller.error is not None:
            raise RayCmfError(
                f"Spilling metrics to {self.spill_dir} failed: {self._spiller.error!r}. "
                "The complete segments stay on disk; ray_cmf.recover() can commit them."
            ) from self._spiller.error

    def finish(self, dest: str | os.PathLike[str]) -> FinishedFile:
        """Write every row (earlier versions included) to ``dest`` atomically; return path, md5, size, rows.

        The buffer stays usable: rows appended later extend this version in the next ``finish``.
        """
        dest = Path(dest)
        self.flush()
        batches: list[pa.RecordBatch] = []
        if self._base is not None:
            batches.extend(pq.ParquetFile(self._base).iter_batches(batch_size=1 << 20))
        if self._spiller is not None:
            self._spiller.queue.put(_SpillThread._STOP)
            self._spiller.join()
            self._spiller = None
            batches.extend(read_segments(self.spill_dir))
        finished = write_parquet(batches, dest)
        discard_spill(self.spill_dir)
        self._base = finished.path
        return finished

    def close(self) -> None:
        """Stop the spill thread, keeping what was spilled on disk for recovery. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._spiller is not None:
            self._seal()
            self._spiller.queue.put(_SpillThread._STOP)
            self._spiller.join()
            self._spiller = None

    def __enter__(self) -> MetricBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spill_owner() -> dict[str, Any]:
    """Who writes a spill (for its manifest): recovery leaves spills of live processes alone."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def discard_spill(directory: Path) -> None:
    """Delete a spill directory's segments and manifest once their rows are safely in Parquet."""
    if not directory.exists():
        return
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
