"""The store's single writer: every spill, Parquet, DVC and MLMD write of a store happens here.

Requests are :class:`StoreWriter` methods called with keyword arguments, in-process (without Ray) or on
the job's writer actor (:mod:`ray_cmf.actor`), always through a :class:`ray_cmf.client.WriterClient`.
Sealed chunks of a series arrive as Arrow record batches; the writer appends them to the series'
crash-safe spill, and a commit turns the spill into a versioned Parquet file.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ray_cmf.binding import Binding, SeriesKey
from ray_cmf.constants import (
    ATTEMPT_COLUMN,
    ATTEMPT_PROPERTY,
    DATASET_TYPE,
    SEQUENCE_COLUMN,
    STARTS_PREFIX,
)
from ray_cmf.environment import Environment
from ray_cmf.errors import RayCmfError, StoreError
from ray_cmf.exits import error_properties
from ray_cmf.lineage import Artifact, Context, Execution, lineage_away, owner_of, properties, state_name
from ray_cmf.series_format import Spill, SpillManifest
from ray_cmf.store import Store
from ray_cmf.versioning import cache_path

log = logging.getLogger(__name__)
T = TypeVar("T")
LINEAGE_AWAY_S = 45.0  # how long a registration waits for a lineage that does not answer (get_cmf waits 60 s)


class _Session:
    """One client's rows in a series: chunks are put back in order (a threaded actor may reorder calls)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset  # rows the series held when this client started: its numbering continues them
        self.next_row = 1
        self.parked: dict[int, pa.RecordBatch] = {}
        self.holes: dict[int, int] = {}  # first row -> rows that the client dropped and will never send


def chunk_start(batch: pa.RecordBatch) -> int:
    """The series row a client's chunk starts at (the first value of its SequenceNumber column)."""
    return int(batch.column(0)[0].as_py())


@dataclass(frozen=True)
class Tail:
    """A client's last rows of a series, delivered on its commit request (see ``WriterSink.commit``): what
    :meth:`StoreWriter.append` would have taken one round trip earlier."""

    session: str
    batch: pa.RecordBatch
    skipped: tuple[tuple[int, int], ...] = ()

    @property
    def first_row(self) -> int:
        return chunk_start(self.batch)


class _Series:
    def __init__(self, spill: Spill, dest: Path) -> None:
        self.spill = spill
        self.dest = dest
        self.lock = threading.Lock()
        self.sessions: dict[str, _Session] = {}
        self.rows_lost = 0  # rows its loggers dropped, stepped over in the numbering (recorded on each version)

    def append(
        self,
        session: str,
        first_row: int,
        batch: pa.RecordBatch,
        attempt: int | None,
        skipped: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """Park the chunk, then spill the session's chunks in order; a range the client ``skipped`` (rows it
        dropped, see :class:`WriterSink`) is stepped over and counted in ``rows_lost``, so the rows after
        it are not held back for ever."""
        if attempt is not None:
            batch = _with_column(batch, ATTEMPT_COLUMN, pa.array(np.full(batch.num_rows, attempt, dtype=np.int64)))
        current = self.sessions.get(session)
        if current is None:
            current = self.sessions[session] = _Session(self.spill.rows)
        current.holes.update((start, rows) for start, rows in skipped if start >= current.next_row)
        if first_row < current.next_row:
            return  # sent again after it was taken (the client never saw the reply): it is in the spill
        current.parked[first_row] = batch
        while True:
            if current.next_row in current.parked:  # a chunk the client dropped may have arrived after all
                ready = current.parked[current.next_row]
                if current.offset:
                    shifted = pc.add(ready.column(SEQUENCE_COLUMN), current.offset)
                    ready = _with_column(ready, SEQUENCE_COLUMN, shifted)
                self.spill.write(ready)  # on failure the chunk stays parked, and the client sends it again
                current.holes.pop(current.next_row, None)
                current.next_row += current.parked.pop(current.next_row).num_rows
            elif current.next_row in current.holes:
                rows = current.holes.pop(current.next_row)
                self.rows_lost += rows
                current.next_row += rows
            else:
                break


def _with_column(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    """``batch`` with column ``name`` set to ``values`` (replaced, or appended when it has none)."""
    index = batch.schema.get_field_index(name)
    return batch.set_column(index, name, values) if index >= 0 else batch.append_column(name, values)


@dataclass(frozen=True)
class Joined:
    """What a process needs to log into a trial or run that another process bound (a trial's own process,
    into the execution that CmfRayLogger made for it): one reply instead of a request for each part."""

    binding: Binding
    pipeline: Context
    stage: Context
    execution: Execution
    node_sampled: bool  # its node's sampler samples its process: it must sample nothing itself


class StoreWriter:
    """The single writer of every store a job uses. Thread-safe: MLMD and DVC writes hold the store's lock,
    spill and Parquet work holds only its series' lock, so one trial's large commit does not stall another
    trial's small request.

    Tune trials (``kind="trial"``) and Train runs (``kind="run"``) are bound to executions by name, so a
    restored trial, a restarted worker and the Train callback all reach the same execution.

    Args:
        store: The default store: the one the driver named, used when a request names none.
    """

    def __init__(self, store: Store | None = None) -> None:
        self._default = store
        self._stores: dict[Store, Store] = {}
        self._bindings: dict[tuple[str, str], tuple[Binding, str | None]] = {}  # with the token of its start
        self._unbound: dict[tuple[str, str], str] = {}  # why the last registration of a trial or run failed
        self._binding_now: collections.Counter[tuple[str, str]] = collections.Counter()  # registrations under way
        self._series: dict[tuple[Store, str], _Series] = {}
        self._ended: set[tuple[Store, int]] = set()  # executions whose trial or run has ended
        self._node_sampled: set[tuple[str, str]] = set()  # trials whose process their node's sampler samples
        self._sweeps: set[str | None] = set()  # the sweeps whose CmfRayLogger runs (None: one saved before ids)
        self._pushing: set[Store] = set()  # stores whose committed files go to their remote as they commit
        self._uploads: list[Future[bool]] = []
        self._pushed: set[tuple[Store, str]] = set()  # (store, md5) of the files sent to its remote, or on their way
        self._uploader: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # guards the dicts above, never held during I/O
        if store is not None:
            self._stores[store] = store

    # -- stores and bindings -------------------------------------------------------------------------
    def configure(self, store: Store) -> Store:
        """Name the default store: the one the driver named last (for workers that name none)."""
        with self._lock:
            self._default = store
            return store

    def _open(self, store: Store | None) -> Store:
        """The live Store for a reference (the default when None)."""
        store = store if store is not None else self._default
        if store is None:
            raise StoreError("This ray_cmf writer has no store; name one on the driver (start_writer(store=...))")
        with self._lock:
            return self._stores.setdefault(store, store)

    def bind(
        self,
        *,
        kind: str,
        name: str,
        pipeline: str,
        stage: str,
        type_name: str,
        props: Mapping[str, Any] | None = None,
        store: Store | None = None,
        data_dir: str | None = None,
        environment: Environment | None = None,
        start: bool = False,
        node_sampled: bool = False,
        sweep: str | None = None,
        trial: Binding | None = None,
        token: str | None = None,
    ) -> Binding:
        """Get (on restore or restart) or create the execution ``name``, mark it RUNNING, log its input data
        once, and merge in what it runs on (``environment``, see :meth:`record_environment`).

        ``start``: this is a start of the trial or run (not another process joining it): its attempt is the
        one after the last the store records (the store, not the caller, knows how many there were).
        ``node_sampled``: its node's sampler samples its process (see :class:`Joined`).
        ``sweep``: the id of the sweep a trial is of (kept by a restore): a trial of the same id that another
        sweep left in the stage is not reopened. ``trial``: the Tune trial a Train run runs in: the run is that
        trial's own, and every version of its series is an output of the trial too. ``token``: what names
        this start of it (Ray Train's run id, a Tune trial's actor id): a process that asks for the binding
        with the token of another start (the same run name used again, a failed attempt) waits for its own
        (see :meth:`binding`). A registration that the lineage does not answer is tried again for up to
        :data:`LINEAGE_AWAY_S` seconds; one that fails is remembered, so that the processes waiting for it
        learn why.
        """

        def once() -> Binding:
            within = trial.execution_id if trial is not None else None
            binding, execution = self.execution(
                pipeline=pipeline,
                stage=stage,
                type_name=type_name,
                name=name,
                props=props,
                store=store,
                owner=owner_of(sweep=sweep, trial=within),
            )
            live = binding.store
            running = {**(props or {}), **(environment.props if environment is not None else {})}  # one transaction
            if start:
                attempt = live.start_attempt(execution.id, props=running, state="RUNNING")
            else:
                attempt = int(properties(execution).get(ATTEMPT_PROPERTY, 1))
                live.update_execution(execution.id, running, "RUNNING")
            binding = replace(binding, attempt=attempt, trial_execution_id=within)
            live.forget_end(execution.id)  # it starts again: how an earlier start was to end is no longer news
            with self._lock:
                first = (kind, name) not in self._bindings
                self._bindings[(kind, name)] = (binding, token)
                self._ended.discard((live, execution.id))
                if node_sampled:
                    self._node_sampled.add((kind, name))
                elif start:
                    self._node_sampled.discard((kind, name))
            if data_dir is not None and first:
                try:
                    live.log_file(execution.id, DATASET_TYPE, data_dir, "input")
                except (OSError, RayCmfError) as exc:  # the trial is bound all the same: logging never ends it
                    log.warning("ray_cmf: could not log the data of %s %r: %s", kind, name, exc)
            if environment is not None:  # the callback's and the workers' records complete each other
                self._log_environment(live, execution.id, environment, merged=True)
            return binding

        with self._registering(kind, name):
            return _while_the_lineage_is_away(f"{kind} {name!r}", once)

    def sweep_runs(self, *, sweep: str | None, running: bool) -> None:
        """A CmfRayLogger's sweep starts (before its first trial) or ends."""
        with self._lock:
            (self._sweeps.add if running else self._sweeps.discard)(sweep)

    def sweeps_running(self) -> bool:
        """Whether a CmfRayLogger's sweep runs: while none does, no trial is about to be bound, and a process
        that waits for its trial's registration waits for nothing."""
        with self._lock:
            return bool(self._sweeps)

    @contextlib.contextmanager
    def _registering(self, kind: str, name: str) -> Iterator[None]:
        """Remember why a registration failed (see :meth:`binding`); a later one that succeeds forgets it.
        While it runs, the binding of that name is not given out (see :meth:`binding`)."""
        with self._lock:
            self._binding_now[(kind, name)] += 1
        try:
            yield
        except Exception as exc:
            with self._lock:
                self._unbound[(kind, name)] = f"{type(exc).__name__}: {exc}"
            raise
        else:
            with self._lock:
                self._unbound.pop((kind, name), None)
        finally:
            with self._lock:
                self._binding_now[(kind, name)] -= 1
                if not self._binding_now[(kind, name)]:
                    del self._binding_now[(kind, name)]

    def binding(self, *, kind: str, name: str, token: str | None = None) -> Binding | None:
        """The binding of a trial or run, or None when none was made yet, or while a registration of it runs
        (a start of it: the binding it makes is the one to take); with a ``token``, None until a start of that
        token binds it (an earlier run of the name, or a trial's failed attempt, must not be taken for this
        one), or a start that named none.

        Raises:
            RayCmfError: Its registration failed (the store refused it): waiting would never end well.
        """
        with self._lock:
            if (kind, name) in self._binding_now:  # a start registers it again (a reused actor's: the same token)
                return None
            binding, bound_by = self._bindings.get((kind, name), (None, None))
            failed = self._unbound.get((kind, name))
        if failed is not None:
            raise RayCmfError(f"ray_cmf could not register {kind} {name!r} in the store: {failed}")
        return binding if token is None or bound_by is None or token == bound_by else None

    def join(
        self, *, kind: str, name: str, environment: Environment | None = None, token: str | None = None
    ) -> Joined | None:
        """All that a process joining a bound trial or run needs, in one request (see :class:`Joined`),
        after recording what it runs on (``environment``); None while it is not bound yet (``token``: see
        :meth:`binding`)."""
        binding = self.binding(kind=kind, name=name, token=token)
        if binding is None:
            return None
        live = self._open(binding.store)
        if environment is not None:
            self._log_environment(live, binding.execution_id, environment)
        with self._lock:
            node_sampled = (kind, name) in self._node_sampled
        return Joined(
            binding,
            live.pipeline(binding.pipeline),
            live.stage(binding.pipeline, binding.stage),
            live.update_execution(binding.execution_id),
            node_sampled,
        )

    # -- metadata (the Cmf facade) -------------------------------------------------------------------
    def context(
        self,
        *,
        pipeline: str,
        stage: str | None = None,
        props: Mapping[str, Any] | None = None,
        store: Store | None = None,
    ) -> Context:
        """Get or create the pipeline context, or the stage context under it."""
        live = self._open(store)
        return live.stage(pipeline, stage, props) if stage is not None else live.pipeline(pipeline, props)

    def execution(
        self,
        *,
        pipeline: str,
        stage: str,
        type_name: str,
        name: str,
        props: Mapping[str, Any] | None = None,
        store: Store | None = None,
        in_stage: bool = True,
        owner: str | None = None,
    ) -> tuple[Binding, Execution]:
        """Get or create an execution (``in_stage``, ``owner``: see :meth:`Lineage.execution`); returns its
        binding and its MLMD record."""
        live = self._open(store)
        execution = live.execution(pipeline, stage, type_name, name, props, in_stage=in_stage, owner=owner)
        return Binding(live, pipeline, stage, name, execution.id), execution

    def update_binding(self, *, binding: Binding, props: Mapping[str, Any]) -> Execution:
        """Merge properties into a bound execution (``binding`` may be the reply of its :meth:`bind`)."""
        return self._open(binding.store).update_execution(binding.execution_id, props)

    def count_start(self, *, binding: Binding, counter: str) -> Binding:
        """Count one more start of the bound execution in ``counter`` (see :meth:`Store.start_attempt`): the
        binding, with that start as its attempt, stamps the rows of a series that only those starts log
        (``binding`` may be the reply of its :meth:`bind`)."""
        return replace(binding, attempt=self._open(binding.store).start_attempt(binding.execution_id, counter))

    def record_start(self, *, binding: Binding, metrics_name: str, step: int) -> None:
        """A later start of a trial or run resumes its ``metrics_name`` series after ``step``: what earlier
        starts logged beyond it is no longer the run's, even where this start fails before it logs a row
        (``binding`` may be the reply of its :meth:`bind`)."""
        if binding.attempt > 1:
            key = f"{STARTS_PREFIX}{metrics_name}:{binding.attempt}"
            self._open(binding.store).update_execution(binding.execution_id, {key: step})

    def update_execution(
        self,
        *,
        execution_id: int,
        props: Mapping[str, Any] | None = None,
        state: str | None = None,
        store: Store | None = None,
        config: bool = False,
    ) -> Execution:
        """Merge properties into an execution (``config``: into its config too) and optionally set its state."""
        return self._open(store).update_execution(execution_id, props, state, config=config)

    def patch_execution(
        self,
        *,
        execution_id: int,
        props: Mapping[str, Any],
        remove: Sequence[str] = (),
        store: Store | None = None,
    ) -> None:
        """Set and drop some properties of an execution, touching no other field (tags, a note)."""
        self._open(store).patch_executions([execution_id], props, remove)

    def record_environment(self, *, execution_id: int, environment: Environment, store: Store | None = None) -> None:
        """Record what an execution ran on (see :mod:`ray_cmf.environment`); the package list is shared."""
        self._log_environment(self._open(store), execution_id, environment)

    def _log_environment(self, live: Store, execution_id: int, environment: Environment, merged: bool = False) -> None:
        """Record an environment (``merged``: its properties are, see :meth:`Store.log_environment`), and push
        its package list where the store's files are pushed as they go.

        What an execution runs on completes its record; a record that fails (a full disk, or another writer
        of a shared database linking the same package list at the same moment) is a warning: the execution
        keeps its registration, its rows and its attempt, which retrying a whole registration would count
        twice."""
        try:
            package_list = live.log_environment(execution_id, environment, merged=merged)
        except Exception as exc:
            log.warning(
                "ray_cmf: could not record the package list and environment of execution %d (%s: %s); its "
                "metrics are recorded all the same",
                execution_id,
                type(exc).__name__,
                exc,
            )
            return
        if package_list is not None:
            self._push(live, package_list)

    def log_file(
        self,
        *,
        binding: Binding,
        type_name: str,
        path: str,
        event: str,
        digest: tuple[str, int] | None = None,
        custom: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Record a dataset or model (DVC-tracked when in the store); ``digest`` is the (md5, size) that the
        caller computed where the file is, else the writer hashes it on its own node."""
        live = self._open(binding.store)
        return live.log_file(binding.execution_id, type_name, path, event, custom, digest=digest)

    def log_execution_metrics(self, *, binding: Binding, metrics_name: str, values: Mapping[str, Any]) -> Artifact:
        """Record execution-level metrics (no file) as a ``Metrics`` artifact."""
        return self._open(binding.store).log_execution_metrics(binding.execution_id, metrics_name, values)

    def read(
        self,
        *,
        store: Store | None,
        pipeline: str,
        metrics_name: str,
        commit: str | None = None,
        execution_id: int | None = None,
        instance: str | None = None,
    ) -> pa.Table:
        """A committed series of an execution (the latest, or the version whose md5 is ``commit``; of its series
        ``instance`` when given), read where the store is (see :meth:`Store.find_version`, :meth:`Store.content`)."""
        live = self._open(store)
        version = live.find_version(pipeline, metrics_name, commit, execution_id, instance)
        content = live.content(live.resolve(str(version["url"])), str(version["Commit"]))
        if content is None:
            raise StoreError(f"{version['url']} does not match its md5 {version['Commit']}, and no copy of it is kept")
        return pq.read_table(content)

    # -- series --------------------------------------------------------------------------------------
    def _series_of(self, key: SeriesKey) -> _Series:
        """The series' state here, made on first use: it adopts what a spill holds and continues the newest
        committed version (a Tune restore, a restarted driver: their rows extend what was committed before)."""
        live = self._open(key.binding.store)
        with self._lock:
            series = self._series.get((live, key.spill_name))
        if series is not None:
            return series
        b = key.binding
        dest = live.series_path(b.pipeline, b.stage, b.name, key.metrics_name, key.instance)
        try:
            committed = live.newest_version(b.execution_id, key.metrics_name, key.instance)  # I/O: outside the lock
        except Exception as exc:  # the lineage is down: spill the rows all the same, and find the base later
            if not lineage_away(exc):
                raise
            log.warning(
                "ray_cmf: the lineage did not answer (%s): the rows of %r of %r are spilled, for a commit or "
                "`ray-cmf recover` once it answers",
                exc,
                key.metrics_name,
                key.binding.name,
            )
            committed, unknown = None, True
        else:
            unknown = False
        base = str(committed) if committed is not None else None
        manifest = SpillManifest(
            key.metrics_name,
            b.execution_id,
            str(dest),
            key.instance,
            base=base,
            base_unknown=unknown,
            also_output_of=b.trial_execution_id,
        )
        made = _Series(Spill(live.spill_dir(key.spill_name), manifest), dest)
        with self._lock:
            return self._series.setdefault((live, key.spill_name), made)

    def append(
        self,
        *,
        key: SeriesKey,
        session: str,
        first_row: int,
        batch: pa.RecordBatch,
        skipped: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """Append one sealed chunk of a client's rows to the series' spill (in the client's order);
        ``skipped``: (first row, rows) of chunks the client dropped, which will never come.

        A chunk that arrives after its trial or run ended (a process handing over its last rows as it
        exits) is committed at once.
        """
        series = self._series_of(key)
        with series.lock:
            series.append(session, first_row, batch, key.binding.attempt if key.attempts else None, skipped)
        live = self._open(key.binding.store)
        with self._lock:
            late = (live, key.binding.execution_id) in self._ended
        if late:
            self._commit_dangling(live, key.spill_name, series)

    def commit(
        self,
        *,
        key: SeriesKey,
        custom: Mapping[str, Any] | None = None,
        props: Mapping[str, Any] | None = None,
        state: str | None = None,
        tail: Tail | None = None,
    ) -> Artifact | None:
        """Write the series' next version (every row so far, ``tail``'s last rows included) as Parquet, track
        it with DVC and register it in MLMD (also as an output of a Train run's trial); then set the
        execution's props and state.

        Each version records ``rows_lost``: the rows its loggers dropped (they could not hand them over),
        which the series therefore lacks. Returns None when the series has no rows.
        """
        if tail is not None:
            self.append(key=key, session=tail.session, first_row=tail.first_row, batch=tail.batch, skipped=tail.skipped)
        series = self._series_of(key)
        live = self._open(key.binding.store)
        artifact = self._commit_series(live, series, custom, every=True)
        if props or state:
            live.update_execution(key.binding.execution_id, props, state)
        return artifact

    def end(self, *, binding: Binding, props: Mapping[str, Any] | None = None, state: str | None = None) -> None:
        """A trial or run ended: commit what its series received but nobody committed, then set props and state.

        Rows that its processes hand over later are committed as they arrive. Pass the :meth:`bind` reply as
        ``binding``: this writer runs requests on several threads, and only that dependency orders the end
        after the start.
        """
        live = self._open(binding.store)
        with self._lock:
            self._ended.add((live, binding.execution_id))
            dangling = [
                (spill_name, s)
                for (store, spill_name), s in self._series.items()
                if store == live and s.spill.manifest and s.spill.manifest.execution_id == binding.execution_id
            ]
        if props or state:  # noted until the lineage has it: an outage must not lose it (nor make it CRASHED)
            try:
                props, state = live.note_end(binding.execution_id, props, state)
            except OSError as exc:  # the end goes on: the lineage may well answer
                log.warning("ray_cmf: could not note how %r ends, for recover: %s", binding.name, exc)
        for spill_name, series in dangling:
            self._commit_dangling(live, spill_name, series)
        if props or state:
            live.update_execution(binding.execution_id, props, state)
            live.forget_end(binding.execution_id)

    def end_runs(self, *, state: str, error: str | None = None) -> list[str]:
        """The driver is ending while Train runs it started have not: end each as ``state`` (with ``error``
        where FAILED), committing what their series received; returns their names. Ray stops their workers
        with the driver, and no callback would end them. A run that ended already (a ``StepLogger.finish``
        marks it COMPLETE) is left as it is."""
        with self._lock:
            runs = [(name, binding) for (kind, name), (binding, _) in self._bindings.items() if kind == "run"]
        ended = []
        for name, binding in runs:
            live = self._open(binding.store)
            if state_name(live.lineage.get_execution(binding.execution_id)) != "RUNNING":
                continue
            props = {"status": state, **error_properties(state, error)}
            self.end(binding=binding, props=props, state=state)
            ended.append(name)
        return ended

    def _commit_dangling(self, live: Store, spill_name: str, series: _Series) -> None:
        """Commit rows that a series' logger never committed (marked ``at_end``). Said at INFO: it is how the
        samplers' series and a trainable's uncommitted rows are meant to be committed, and nothing is lost."""
        artifact = self._commit_series(live, series, {"at_end": True}, every=False)
        if artifact is not None:
            log.info("ray_cmf: committed at its end the rows of %s that its logger did not commit", spill_name)

    def push_after_commit(self, *, store: Store | None = None) -> None:
        """From now on, upload each file the store commits to its remote, in the background (one thread; a
        failure is a warning, and ``ray-cmf push`` catches up later)."""
        live = self._open(store)
        live.require_remote()
        with self._lock:
            self._pushing.add(live)
            if self._uploader is None:
                self._uploader = ThreadPoolExecutor(1, thread_name_prefix="ray_cmf-push")

    def wait_for_pushes(self) -> int:
        """Wait for every upload started so far; returns how many failed (each was warned about)."""
        with self._lock:
            pending, self._uploads = self._uploads, []
        return sum(1 for upload in pending if not upload.result())

    def _push(self, live: Store, artifact: Artifact) -> None:
        """Upload an artifact's file in the background, where the store pushes as it goes (once a writer: a
        package list or a series that several executions share is sent once)."""
        if live not in self._pushing:
            return
        md5 = str(properties(artifact)["Commit"])
        assert self._uploader is not None
        with self._lock:
            if (live, md5) in self._pushed:
                return
            self._pushed.add((live, md5))
            self._uploads.append(self._uploader.submit(_upload, live, md5))

    def _commit_series(
        self, live: Store, series: _Series, custom: Mapping[str, Any] | None, every: bool
    ) -> Artifact | None:
        """Write the series' next version and register it; the spill is emptied only once MLMD has it.

        ``every``: commit whenever the series has rows (a caller's commit makes a version each time);
        otherwise only when rows arrived since the last version. The series' lock is held throughout, so
        no chunk lands between the file and its registration.
        """
        manifest = series.spill.manifest
        assert manifest is not None
        recorded = {**(custom or {}), "rows_lost": series.rows_lost}
        with series.lock:
            if not (series.spill.rows if every else series.spill.pending):
                return None
            live.settle(series.spill)
            artifact = series.spill.finish(
                series.dest,
                lambda finished: live.commit_metrics(
                    manifest.execution_id,
                    manifest.metrics_name,
                    finished,
                    recorded,
                    manifest.instance,
                    also_output_of=manifest.also_output_of,
                ),
            )
        if artifact is not None:
            shared = live.file_of(artifact)  # the file of the content's artifact (the copy just written went)
            if shared.is_file():
                series.spill.base = shared  # what the next version extends
            self._push(live, artifact)
        return artifact

    def pid(self) -> int:
        """The writer's process id (to watch its memory)."""
        return os.getpid()


def _while_the_lineage_is_away(what: str, attempt: Callable[[], T]) -> T:
    """Run ``attempt`` again while the lineage does not answer (a team's server restarting), for up to
    :data:`LINEAGE_AWAY_S` seconds: a trial that starts then is registered once it answers (its process
    waits for that), where it failed at once and left no trace."""
    deadline = time.monotonic() + LINEAGE_AWAY_S
    for pause in itertools.chain((0.5, 1.0, 2.0), itertools.repeat(4.0)):
        try:
            return attempt()
        except Exception as exc:
            if not lineage_away(exc) or time.monotonic() + pause > deadline:
                raise
            log.warning("ray_cmf: the lineage does not answer (%s): registering %s again in %g s", exc, what, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def _upload(live: Store, md5: str) -> bool:
    """Upload one committed file's DVC cache object to the store's remote; False (and a warning) on failure."""
    remote = live.remote
    try:
        assert remote is not None
        remote.upload(md5, cache_path(live.root, md5))
        return True
    except Exception as exc:  # the remote is down, say: the file stays in the store, `ray-cmf push` retries
        log.warning("ray_cmf: could not push %s to %s: %s; `ray-cmf push` sends it later", md5, live.remote, exc)
        return False
