"""The on-disk format of a metric series: what the writer, ``recover`` and ``Sweep`` read and write.

A series in progress is a spill directory: Arrow IPC stream segments (``seg-*.arrows``), whose complete
record batches survive a SIGKILL (:func:`read_segments` stops quietly at a torn one), and a manifest that
says what the series belongs to. A committed version is one Parquet file, written atomically and hashed
(md5, DVC's hash) as it is written, one row group per spilled piece, with a summary of every numeric
column in its footer so that a trial table needs no data scan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ray_cmf._atomic import atomic_write, write_text
from ray_cmf._json import dumps, float_of
from ray_cmf.constants import ARTIFACTS_DIR, SEGMENT_GLOB, SEQUENCE_COLUMN, SPILL_LOCK, SPILL_MANIFEST, SUMMARY_KEY
from ray_cmf.versioning import file_md5

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class FinishedFile:
    """A finished Parquet file: where it is, its md5 (hex), its size in bytes and its row count."""

    path: Path
    md5: str
    size: int
    rows: int


HOLD_WAIT_S = 30.0  # how long a writer waits for another process (a recover) to let go of a spill
_HELD_HERE: set[Path] = set()  # the spill directories this process holds


@dataclass(frozen=True)
class SpillManifest:
    """What a spill directory belongs to, written beside its segments so :func:`ray_cmf.recover` can
    commit it after a crash: the series, its execution, its destination and the process that wrote it.

    A spill directory is ``<store>/spill/<series>``. The files it names (``dest``, ``base``) are written
    relative to that store, and read as paths in the store where the directory is now: a store that was
    moved or copied commits its spills into itself.
    """

    metrics_name: str
    execution_id: int
    dest: str
    instance: str = ""  # which of the execution's series of this name (see ray_cmf.binding.SeriesKey)
    pid: int = dataclasses.field(default_factory=os.getpid)
    host: str = dataclasses.field(default_factory=socket.gethostname)
    base: str | None = None  # the previous committed version, which the next one extends
    base_unknown: bool = False  # the lineage was unreachable when the spill began: find ``base`` before committing
    also_output_of: int | None = None  # the Tune trial of a Train run's series: its versions are the trial's too

    def write(self, directory: Path) -> None:
        root = _store_of(directory)
        stored = replace(self, dest=_relative(self.dest, root), base=self.base and _relative(self.base, root))
        write_text(directory / SPILL_MANIFEST, json.dumps(asdict(stored)))

    @classmethod
    def read(cls, directory: Path) -> SpillManifest:
        """The manifest of a spill directory; a ValueError where a newer ray_cmf wrote fields this version does
        not know (their meaning may change how the spill commits: it is left to that version)."""
        fields = json.loads((directory / SPILL_MANIFEST).read_text())
        if unknown := sorted(set(fields) - {f.name for f in dataclasses.fields(cls)}):
            raise ValueError(f"written by a newer ray_cmf: it holds {unknown}, which this version does not know")
        stored = cls(**fields)
        root = _store_of(directory)
        return replace(stored, dest=_in_store(stored.dest, root), base=stored.base and _in_store(stored.base, root))


def _store_of(spill_directory: Path) -> Path:
    return spill_directory.absolute().parent.parent


def _relative(path: str, root: Path) -> str:
    """``path`` relative to the store ``root`` (as it is, outside it)."""
    return str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path


def _in_store(path: str, root: Path) -> str:
    """A manifest's file as a path in the store at ``root``. An absolute path outside it was written by an
    earlier version where the store was then: its ``artifacts/<pipeline>/<stage>/<execution>/<file>`` tail
    names the file here."""
    written = Path(path)
    if not written.is_absolute():
        return str(root / written)
    tail = written.parts[-5:]
    if written.is_relative_to(root) or len(tail) < 5 or tail[0] != ARTIFACTS_DIR:
        return path
    return str(root.joinpath(*tail))


class Spill:
    """A series' crash-safe segments on disk: record batches appended as Arrow IPC streams (a new segment
    per schema change), finished into one Parquet file. Adopts the segments already in ``directory``.

    Not thread-safe: one thread writes (a buffer's spill thread, or the writer under its series lock).
    """

    def __init__(self, directory: str | os.PathLike[str], manifest: SpillManifest | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self._file: io.BufferedWriter | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self._manifest_written = False
        self._held: io.TextIOWrapper | None = None  # the lock file, while this process writes the spill
        self._count = len(list(self.directory.glob(SEGMENT_GLOB))) if self.directory.exists() else 0
        self.pending = sum(batch.num_rows for batch in read_segments(self.directory)) if self._count else 0
        adopted = SpillManifest.read(self.directory) if (self.directory / SPILL_MANIFEST).exists() else manifest
        self.base: Path | None = Path(adopted.base) if adopted is not None and adopted.base else None
        self.base_unknown = adopted is not None and adopted.base_unknown
        self.rows = self._base_rows() + self.pending  # the series so far: pending segments after the base version

    def _base_rows(self) -> int:
        return pq.ParquetFile(self.base).metadata.num_rows if self.base is not None and self.base.exists() else 0

    def settle_base(self, base: Path | None) -> None:
        """Name the version that a spill begun with an unknown base extends (see ``SpillManifest.base_unknown``),
        found once the lineage answers again."""
        self.base, self.base_unknown, self._manifest_written = base, False, False
        self.rows = self._base_rows() + self.pending

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one batch; it is in the OS page cache (and survives a process kill) on return."""
        if self.manifest is not None and not self._manifest_written:
            base = str(self.base) if self.base else None
            replace(self.manifest, base=base, base_unknown=self.base_unknown).write(self.directory)
            self._manifest_written = True
            self._hold()
        if self._stream is None or not batch.schema.equals(self._schema):
            self._close_segment()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.directory / f"seg-{self._count:05d}.arrows", "wb")  # noqa: SIM115
            self._count += 1
            self._stream = pa.ipc.new_stream(self._file, batch.schema)
            self._schema = batch.schema
        try:
            self._stream.write_batch(batch)
            assert self._file is not None
            self._file.flush()
        except BaseException:
            self._abandon_segment()  # a torn tail ends this segment; the next write starts a new one
            raise
        self.rows += batch.num_rows
        self.pending += batch.num_rows

    def flush(self) -> None:
        """Nothing to wait for: each batch is flushed to the OS as it is written."""

    def finish(self, dest: str | os.PathLike[str], accept: Callable[[FinishedFile], T]) -> T:
        """Write every row (the previous version's included) to ``dest`` atomically, hand the file to
        ``accept`` (which registers it), and only then empty the spill; returns what ``accept`` returns.

        If ``accept`` raises, the new file is removed and the spill stays whole, for a retry or for
        :func:`ray_cmf.recover`: a file is never left behind that no one has recorded.
        """
        self._close_segment()
        if self.base_unknown:
            raise RuntimeError(f"the spill {self.directory} extends a version not known yet: settle_base() first")
        finished = self._unchanged() or self._rewritten(Path(dest))
        try:
            accepted = accept(finished)
        except BaseException:
            if finished.path != self.base:  # unchanged since the last version: that file is the base
                finished.path.unlink(missing_ok=True)
            raise
        discard_spill(self.directory)
        self._release()
        self.base, self._count, self._manifest_written, self.pending = finished.path, 0, False, 0
        return accepted

    def _unchanged(self) -> FinishedFile | None:
        """The last version as it is, where nothing was spilled since: rewriting it would change its row groups,
        and so its bytes and its md5, not its rows."""
        if self._count or self.base is None or not self.base.is_file():
            return None
        return FinishedFile(self.base, file_md5(self.base), self.base.stat().st_size, self._base_rows())

    def _rewritten(self, dest: Path) -> FinishedFile:
        """The last version's rows, then the spilled ones, written to ``dest``."""
        base = pq.ParquetFile(self.base) if self.base is not None else None
        schemas = [base.schema_arrow] if base is not None and base.metadata.num_rows else []
        schemas += [batch.schema for batch in read_segments(self.directory)]  # a pass that keeps no rows

        def batches() -> Iterator[pa.RecordBatch]:
            if base is not None:
                yield from base.iter_batches(batch_size=1 << 20)
            yield from read_segments(self.directory)

        return write_parquet(batches(), dest, schemas)

    def close(self) -> None:
        """Close the open segment; what was written stays on disk for recovery."""
        self._close_segment()
        self._release()

    def _hold(self) -> None:
        """Hold the spill while this process writes it (see :func:`held_by_a_writer`); the OS drops the lock
        with the process, however it ends. A recover that commits it meanwhile is waited out, for a while."""
        if self._held is not None or self.directory in _HELD_HERE:  # a writer here that adopts another's spill
            return
        lock = open(self.directory / SPILL_LOCK, "a")  # noqa: SIM115 (held until released)
        if not _locked(lock, HOLD_WAIT_S):
            lock.close()
            log.warning("ray_cmf: another process holds the spill %s; writing it all the same", self.directory)
            return
        self._held = lock
        _HELD_HERE.add(self.directory)

    def _release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
            _HELD_HERE.discard(self.directory)

    def __repr__(self) -> str:
        return f"Spill({str(self.directory)!r})"

    def _abandon_segment(self) -> None:
        """Drop the open segment after a failed write without writing anything more to it."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._stream = self._file = None
        self._schema = None

    def _close_segment(self) -> None:
        if self._stream is not None:
            self._stream.close()
            assert self._file is not None
            self._file.close()
        self._stream = self._file = None
        self._schema = None


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
                yield from reader
            except (pa.ArrowInvalid, OSError, EOFError):
                log.info("ray_cmf: %s ends in a torn batch; keeping the complete ones", segment)


def segment_columns(directory: Path) -> set[str]:
    """The columns a spill directory's segments hold, read from their schemas alone (no rows)."""
    columns: set[str] = set()
    for segment in directory.glob(SEGMENT_GLOB):
        with open(segment, "rb") as source, contextlib.suppress(pa.ArrowInvalid, OSError, EOFError):
            columns.update(pa.ipc.open_stream(source).schema.names)
    return columns


def write_parquet(batches: Iterable[pa.RecordBatch], dest: Path, schemas: list[pa.Schema]) -> FinishedFile:
    """Write batches (``schemas``: theirs) as one row group each to ``dest`` atomically, hashing while
    writing; one batch at a time is in memory, however long the series.

    A ``{md5}`` in the file name is replaced by the content hash, so every version gets its own name.
    """
    schema = unify(schemas or [pa.schema([(SEQUENCE_COLUMN, pa.int64())])])
    summary = SeriesSummary()
    with atomic_write(dest) as pending:
        with open(pending.tmp, "wb") as raw:
            hashing = _HashingFile(raw)
            with pq.ParquetWriter(hashing, schema) as writer:
                for batch in batches:
                    table = conform(batch, schema)
                    summary.add(table)
                    writer.write_table(table, row_group_size=max(batch.num_rows, 1))
                writer.add_key_value_metadata({SUMMARY_KEY: summary.to_json()})
        md5 = hashing.md5.hexdigest()
        pending.dest = dest.with_name(dest.name.replace("{md5}", md5[:12]))
    return FinishedFile(pending.dest, md5, hashing.size, summary.rows)


class SeriesSummary:
    """Per numeric column: the minimum and maximum of its finite values and its last non-null value (NaN and
    inf included: a diverged run's final value is information), and the row count. Gathered while writing
    and stored in the file's footer (strict JSON, see :mod:`ray_cmf._json`), so a trial table needs no data
    scan. A non-finite value is never a minimum or a maximum: it never ranks best."""

    VERSION = 2  # footers of earlier versions counted inf as a minimum or maximum: readers scan those files

    def __init__(self) -> None:
        self.rows = 0
        self.columns: dict[str, dict[str, Any]] = {}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for field in table.schema:
            floating = pa.types.is_floating(field.type)
            if not (floating or pa.types.is_integer(field.type)):
                continue
            valid = pc.drop_null(table.column(field.name))
            if len(valid) == 0:
                continue
            stats = self.columns.setdefault(field.name, {})
            stats["last"] = valid[-1].as_py()
            finite = pc.filter(valid, pc.is_finite(valid)) if floating else valid
            if len(finite):
                low, high = (v.as_py() for v in pc.min_max(finite).values())
                stats["min"] = min(stats.get("min", low), low)
                stats["max"] = max(stats.get("max", high), high)

    def to_json(self) -> str:
        return dumps({"version": self.VERSION, "rows": self.rows, "columns": self.columns})

    @classmethod
    def parse(cls, raw: bytes | None) -> dict[str, Any] | None:
        """A footer's summary, or None when the file has none of this version (then its data is scanned)."""
        summary = json.loads(raw) if raw else None
        if not isinstance(summary, dict) or summary.get("version") != cls.VERSION:
            return None
        for stats in summary["columns"].values():
            stats["last"] = float_of(stats["last"])
        return summary


def unify(schemas: list[pa.Schema], big_ints: Collection[str] = ()) -> pa.Schema:
    """One schema for the tables of one series or of many: types merged as Arrow merges them (int with float
    is float), and a column whose types cannot merge (a number in one trial, text in another) as text.

    ``big_ints`` names the columns that hold an int beyond 2**53 somewhere: beside floats they are text too,
    since float64 would round them (the buffer refuses that mix within one series; trials can differ)."""
    fields: dict[str, pa.DataType] = {}
    for schema in schemas:
        for field in schema:
            known = fields.get(field.name)
            if known is None or known == field.type:
                fields[field.name] = field.type
                continue
            try:
                merged = pa.unify_schemas(
                    [pa.schema([(field.name, known)]), pa.schema([field])], promote_options="permissive"
                )
                fields[field.name] = merged.field(field.name).type
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                fields[field.name] = pa.string()
            if field.name in big_ints and pa.types.is_floating(fields[field.name]):
                fields[field.name] = pa.string()
    return pa.schema(list(fields.items()))


def int_magnitude(column: pa.ChunkedArray | pa.Array) -> int:
    """The largest magnitude in an int column (0 when it holds none), to tell whether float64 holds it."""
    low, high = (v.as_py() for v in pc.min_max(column).values())
    return max(abs(low), abs(high)) if low is not None else 0


def conform(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """Cast a table to a unified schema (see :func:`unify`), adding all-null columns it lacks."""
    columns = [
        _cast(table.column(f.name), f.type) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _cast(column: pa.ChunkedArray | pa.Array, to: pa.DataType) -> pa.ChunkedArray | pa.Array:
    cast = column.cast(to)
    return float_texts(cast) if pa.types.is_floating(column.type) and pa.types.is_string(to) else cast


def float_texts(texts: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Floats that Arrow cast to text, with a point where it wrote none: "0" would read as an int, and "-0"
    would lose its sign (``-0.0`` and ``3.0`` read back as floats)."""
    whole = pc.match_substring_regex(texts, r"^-?[0-9]+$")
    return pc.if_else(whole, pc.binary_join_element_wise(texts, ".0", ""), texts)


@contextlib.contextmanager
def held_by_a_writer(directory: Path, wait: float = 0.0) -> Iterator[bool]:
    """Whether a live process writes the spill in ``directory`` (it holds the spill's lock, still after
    ``wait`` seconds); while the context lasts, one that does not cannot start to."""
    if directory in _HELD_HERE:  # this process writes it
        yield True
        return
    with open(directory / SPILL_LOCK, "a") as lock:
        yield not _locked(lock, wait)


def _locked(lock: io.TextIOWrapper, wait: float) -> bool:
    """Take ``lock`` (exclusive), trying for up to ``wait`` seconds; whether it was taken."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def discard_spill(directory: Path) -> None:
    """Delete a spill directory's segments and manifest once their rows are safely in Parquet."""
    if not directory.exists():
        return
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
