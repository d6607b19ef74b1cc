"""Cmf: the cmflib-compatible facade (same method names and keyword arguments; change only the import).

    from ray_cmf import Cmf            # was: from cmflib.cmf import Cmf
    cmf = Cmf(pipeline_name="mnist")
    for step in range(1000):
        cmf.log_metric("train", {"step": step, "loss": loss})
    cmf.commit_metrics("train")

Differences that users gain: ``log_metric`` is O(1) and crash-safe (rows spill to disk in the
background), no git/DVC remote or ``cmf init`` is needed, and ``read_metrics`` works and reads any
committed version by md5. Every write goes through the store's single writer (:mod:`ray_cmf.writer`):
in-process without Ray, the driver's writer actor inside a Ray trial.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ray_cmf._names import check_metric_key, check_name, check_texts
from ray_cmf.attempts import latest_attempt
from ray_cmf.binding import Binding, SeriesKey
from ray_cmf.buffer import TRAIN_RANK, MetricBuffer
from ray_cmf.client import WriterClient, WriterSink
from ray_cmf.constants import (
    CONFIG_JSON,
    DATASET_TYPE,
    DEFAULT_FLUSH_ROWS,
    DEFAULT_FLUSH_SECONDS,
    ENV_PREFIX,
    FLUSH_TIMEOUT_S,
    MODEL_TYPE,
    RESULTS_METRICS_NAME,
    SEQUENCE_COLUMN,
    SYSTEM_METRICS_NAME,
)
from ray_cmf.curation import tag_properties, untag_properties
from ray_cmf.environment import capture, redact_command, seed_props, torch_seed
from ray_cmf.errors import InvalidArgumentError, InvalidNameError, MetricsNotFoundError, StoreError
from ray_cmf.exits import ENDED_STATES, ended_by, error_properties, outcome, track
from ray_cmf.frames import exact_frame
from ray_cmf.lineage import RUNNING, Artifact, Context, Execution, config_properties, not_recorded, properties
from ray_cmf.store import Store
from ray_cmf.versioning import tree_md5
from ray_cmf.writer import Joined, StoreWriter

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
_TRIAL_SERIES = {RESULTS_METRICS_NAME: "Tune results", SYSTEM_METRICS_NAME: "system metrics"}  # a trial's own


class Cmf:
    """Per-run metadata writer with cmflib's API: contexts, executions, step metrics, datasets, models.

    Args:
        filepath: The MLMD database (cmflib's meaning): a SQLite file, or a ``postgresql://`` / ``mysql://``
            URL (see :mod:`ray_cmf.connection`). Default: ``<store>/mlmd.sqlite``.
        pipeline_name: Name of the pipeline (parent) context.
        custom_properties: Properties of the pipeline context.
        graph: cmflib's Neo4j mirror; not supported, accepted for compatibility.
        store: Store directory or :class:`Store` (default: ``$RAY_CMF_STORE`` or ``./cmf_store``).
        flush_rows: Rows per spilled chunk of each metric series.
        flush_seconds: Longest a row waits in memory before it is handed to the store, whether or not more
            rows come.

    Example:
        >>> import tempfile
        >>> cmf = Cmf(pipeline_name="doc", store=tempfile.mkdtemp())
        >>> for step in range(3):
        ...     cmf.log_metric("train", {"step": step, "loss": 1.0 / (step + 1)})
        >>> artifact = cmf.commit_metrics("train")
        >>> cmf.read_metrics("train")["loss"].tolist()
        [1.0, 0.5, 0.3333333333333333]
    """

    def __init__(
        self,
        filepath: str | os.PathLike[str] | None = None,
        pipeline_name: str = "default",
        custom_properties: Mapping[str, Any] | None = None,
        graph: bool = False,
        *,
        store: str | os.PathLike[str] | Store | None = None,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
    ) -> None:
        if graph:
            log.warning("ray_cmf.Cmf: graph=True (Neo4j) is not supported; lineage stays in MLMD")
        store = store if isinstance(store, Store) else Store(store, mlmd=filepath)
        writer = WriterClient(StoreWriter(store))
        check_name("pipeline_name", pipeline_name)
        pipeline = writer.call(StoreWriter.context, pipeline=pipeline_name, props=custom_properties, store=store)
        self._attach(writer, store, pipeline, flush_rows, flush_seconds)

    @classmethod
    def joined(
        cls,
        writer: WriterClient,
        joined: Joined,
        *,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
    ) -> Cmf:
        """A Cmf that logs into an existing execution (a Tune trial's) through ``writer``, from any node
        (``joined``: the writer's :meth:`~StoreWriter.join` reply)."""
        cmf = cls.__new__(cls)
        cmf._attach(writer, joined.binding.store, joined.pipeline, flush_rows, flush_seconds)
        cmf.child_context, cmf._stage = joined.stage, joined.binding.stage
        cmf._binding, cmf.execution = joined.binding, joined.execution
        cmf._continued = True
        return cmf

    def _attach(
        self, writer: WriterClient, store: Store, pipeline: Context, flush_rows: int, flush_seconds: float
    ) -> None:
        """Set up a Cmf on ``writer`` in its pipeline context, with no stage, execution or series yet."""
        self.store, self._writer = store, writer
        self.pipeline_name = pipeline.name
        self.parent_context: Context = pipeline
        self.child_context: Context | None = None
        self.execution: Execution | None = None
        self.metrics: dict[str, MetricBuffer] = {}
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._stage: str | None = None
        self._binding: Binding | None = None
        self._running: Binding | None = None  # the execution this Cmf started and ends (see close())
        self._sinks: dict[str, WriterSink] = {}  # by metrics_name: where its buffer's rows go
        self._committed: dict[str, int] = {}  # by metrics_name: the rows its last commit held
        self._continued = False  # whether a series continues across the execution's attempts (a trial's)

    # -- contexts and executions ---------------------------------------------------------------------
    def create_context(self, pipeline_stage: str, custom_properties: Mapping[str, Any] | None = None) -> Context:
        """Get or create the stage (child) context and make it current."""
        check_name("pipeline_stage", pipeline_stage)
        self.child_context = self._writer.call(
            StoreWriter.context,
            pipeline=self.pipeline_name,
            stage=pipeline_stage,
            props=custom_properties,
            store=self.store,
        )
        self._stage = pipeline_stage
        return self.child_context

    def create_execution(
        self,
        execution_type: str,
        custom_properties: Mapping[str, Any] | None = None,
        cmd: str | None = None,
        create_new_execution: bool = True,
        execution_name: str | None = None,
    ) -> Execution:
        """Create an execution and make it current; with ``create_new_execution=False``, reuse the one named
        ``execution_name`` (default: ``execution_type``, as cmflib names it), or create it under that name.

        Series logged before belong to the previous execution: their rows are handed to the store (commit
        them first to make a version; what was never committed is kept for :func:`ray_cmf.recover`), and
        names logged from now on start new series of this execution.
        """
        check_name("execution_type", execution_type)  # each refusal before the stage is made
        check_texts("config", custom_properties)
        if self._stage is None:
            self.create_context(execution_type)
        assert self._stage is not None
        if execution_name is None:
            execution_name = f"{execution_type}-{uuid.uuid4().hex[:12]}" if create_new_execution else execution_type
        check_name("execution_name", execution_name)  # before the current execution ends
        props = {
            "Execution": cmd if cmd is not None else redact_command(sys.argv),
            "Context_Type": self._stage,
            "Pipeline_Type": self.pipeline_name,
            **not_recorded(custom_properties or {}),  # a "status" or "seed_x" of its own is config only
        }
        if custom_properties:  # what Sweep shows as config/<key> (warns of keys it cannot show)
            props[CONFIG_JSON] = config_properties(custom_properties)[CONFIG_JSON]
        self.close()  # the previous execution ended: its series' rows go to it
        self.metrics, self._sinks, self._committed = {}, {}, {}
        self._binding, self.execution = self._writer.call(
            StoreWriter.execution,
            pipeline=self.pipeline_name,
            stage=self._stage,
            type_name=execution_type,
            name=execution_name,
            props=props,
            store=self.store,
            in_stage=False,  # cmflib's: an execution name is the database's
        )
        if self.execution.last_known_state == RUNNING:  # one this Cmf runs (not a finished one reopened)
            self._running = self._binding
        track(self)  # however the process ends, what it logs is committed then (and a run it runs ends)
        recorded = properties(self.execution)
        if any(key.startswith(ENV_PREFIX) for key in recorded):  # made before, by the run whose code it records
            _warn_of_other_config(execution_name, recorded.get(CONFIG_JSON), props.get(CONFIG_JSON))
            _warn_of_other_place(execution_name, recorded, props)
        else:
            self._writer.call(
                StoreWriter.record_environment,
                execution_id=self.execution.id,
                environment=capture(),
                store=self.store,
            )
        return self.execution

    def log_seeds(self, **seeds: int) -> None:
        """Record the seeds the current execution uses (``seed_<name>`` properties; ints), and torch's
        initial seed when torch is imported. ``Sweep.trials()`` shows them as ``seed/<name>`` columns."""
        binding = self._current()
        self._writer.call(
            StoreWriter.update_execution,
            execution_id=binding.execution_id,
            props=torch_seed() | seed_props(seeds),
            store=binding.store,
        )

    def update_execution(self, execution_id: int, custom_properties: Mapping[str, Any] | None = None) -> Execution:
        """Merge custom properties into an execution (cmflib's signature), and into the config that
        ``Sweep.trials()`` shows as ``config/<key>`` columns.

        Raises:
            InvalidArgumentError: ``execution_id`` is not an int.
            StoreError: No execution has that id.
        """
        if not isinstance(execution_id, int) or isinstance(execution_id, bool):
            raise InvalidArgumentError(f"execution_id {execution_id!r} is not an int: pass an execution's .id")
        check_texts("custom_properties", custom_properties)
        updated = self._writer.call(
            StoreWriter.update_execution,
            execution_id=execution_id,
            props=custom_properties,
            store=self.store,
            config=True,
        )
        if self.execution is not None and self.execution.id == execution_id:
            self.execution = updated
        return updated

    def set_tags(self, remove: Iterable[str] = (), **tags: str | int | float | bool) -> None:
        """Tag the current execution (``team="vision"``; values are kept as text) and drop the tags
        ``remove``. ``Sweep.trials()`` shows them as ``tag/<key>`` columns; ``ray-cmf tag`` edits them later."""
        binding = self._current()
        self._writer.call(
            StoreWriter.patch_execution,
            execution_id=binding.execution_id,
            props=tag_properties(tags),
            remove=untag_properties(remove),
            store=binding.store,
        )

    def _current(self) -> Binding:
        """The current execution's binding, created implicitly (as cmflib does) when the user has made none."""
        if self._binding is None:
            self.create_execution("Execution")
        assert self._binding is not None
        return self._binding

    # -- step metrics --------------------------------------------------------------------------------
    def log_metric(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> None:
        """Append one row to the ``metrics_name`` series: O(1), no I/O, numbered from 1."""
        buffer = self.metrics.get(metrics_name)
        if buffer is None:
            buffer = self._new_buffer(metrics_name)
        buffer.append(custom_properties or {})

    def _new_buffer(self, metrics_name: str) -> MetricBuffer:
        check_name("metrics_name", metrics_name)
        if self._continued:  # a restored or restarted trial continues its series; re-logged steps: latest attempt
            if metrics_name in _TRIAL_SERIES:
                raise InvalidNameError("metrics_name", metrics_name, f"a trial's {_TRIAL_SERIES[metrics_name]} use it")
            key = SeriesKey(self._current(), metrics_name, attempts=True)
        else:  # each Cmf object its own series
            key = SeriesKey(self._current(), metrics_name, uuid.uuid4().hex[:8])
        sink = self._sinks[metrics_name] = self._writer.sink(key)
        buffer = MetricBuffer(
            sink=sink, flush_rows=self.flush_rows, flush_seconds=self.flush_seconds, reserved=TRAIN_RANK
        )
        self.metrics[metrics_name] = buffer
        return buffer

    def commit_metrics(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> Artifact | None:
        """Write the series to a versioned Parquet file, DVC-track it and record a Step_Metrics artifact.

        Committing the same name again creates a new version holding every row logged so far. A store
        failure is a warning, not an error (the rows are kept for a later commit or
        :func:`ray_cmf.recover`), and then None is returned. Rows that could not be handed over are
        counted on the artifact (``rows_lost``).

        A restored or retried trial's Cmf commits the rows its earlier attempts logged under the name too,
        also when this attempt logged none (it resumed at its last checkpoint, say).

        Raises:
            MetricsNotFoundError: Nothing was logged under ``metrics_name`` (by any attempt of the trial), or
                ``log_metric`` refused every row given to it.
        """
        buffer = self.metrics.get(metrics_name)
        earlier = buffer is None and self._continued  # what the trial's earlier attempts logged, if any
        if buffer is None and not earlier:
            raise self._nothing_logged(metrics_name)
        buffer = buffer or self._new_buffer(metrics_name)
        try:
            rows = buffer.rows
            artifact = self._sinks[metrics_name].commit(buffer, custom=custom_properties)
        except Exception as exc:  # logging never kills training
            log.warning(
                "ray_cmf: could not commit %r (%s). Its rows are kept, spilled or in memory: commit again once "
                "the store is fixed, or run `ray-cmf recover` after this process ends",
                metrics_name,
                exc,
            )
            return None
        if artifact is None and earlier:  # no attempt logged it
            self.metrics.pop(metrics_name).close()
            del self._sinks[metrics_name]
            raise self._nothing_logged(metrics_name)
        if artifact is None:  # the series holds no row: log_metric refused each one it was given
            raise self._nothing_logged(metrics_name)
        self._committed[metrics_name] = rows
        return artifact

    def _nothing_logged(self, metrics_name: str) -> MetricsNotFoundError:
        if metrics_name in self.metrics:
            return MetricsNotFoundError(
                f"Nothing was logged under metrics_name={metrics_name!r}: log_metric refused every row given to "
                "it (each with the error it raised)"
            )
        return MetricsNotFoundError(
            f"Nothing was logged under metrics_name={metrics_name!r}; call log_metric first "
            f"(logged names: {sorted(self.metrics)})"
        )

    def read_metrics(self, metrics_name: str, commit: str | None = None) -> pd.DataFrame:
        """This execution's latest committed version of a series (or its version with md5 ``commit``),
        indexed by SequenceNumber.

        It reads only what the current execution committed, never another execution's series of the same
        name, and of a name this Cmf logged, its own series (another Cmf of the execution logs its own).
        Rows logged but not committed yet are not returned (commit them first), and asking for them
        raises :class:`MetricsNotFoundError` saying so. A Cmf without a current execution reads the
        pipeline's series when one execution alone committed that name (or the version ``commit``). A
        retried or restored trial's series reads as its latest attempt left it, as ``Sweep.steps`` reads it
        (see :func:`ray_cmf.attempts.latest_attempt`).

        Values come back exactly as logged: a column without nulls has its NumPy dtype; one with nulls
        (a key missing from some rows, or None) is Arrow-backed (``pd.ArrowDtype``), so its ints stay
        ints and a null stays distinct from a NaN.
        """
        binding = self._binding
        sink = self._sinks.get(metrics_name)
        try:
            table = self._writer.call(
                StoreWriter.read,
                store=self.store,
                pipeline=self.pipeline_name,
                metrics_name=metrics_name,
                commit=commit,
                execution_id=binding.execution_id if binding is not None else None,
                instance=sink.key.instance if sink is not None and commit is None else None,
            )
        except MetricsNotFoundError:
            buffer = self.metrics.get(metrics_name)
            if buffer is None or commit is not None:
                raise
            if not buffer.rows:
                raise self._nothing_logged(metrics_name) from None
            raise MetricsNotFoundError(
                f"{metrics_name!r} has {buffer.rows} rows logged by this execution ({binding.name if binding else ''}) "
                f"but none committed; call commit_metrics({metrics_name!r}) first"
            ) from None
        return exact_frame(latest_attempt(table, metrics_name), SEQUENCE_COLUMN)

    def log_execution_metrics(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> Artifact:
        """Record execution-level metrics (e.g. final accuracy) as a Metrics artifact."""
        check_name("metrics_name", metrics_name)
        for key in custom_properties or {}:
            check_metric_key(key, f"the keys of {metrics_name!r}")
        check_texts(f"execution metrics {metrics_name!r}", custom_properties)
        return self._writer.call(
            StoreWriter.log_execution_metrics,
            binding=self._current(),
            metrics_name=metrics_name,
            values=custom_properties or {},
        )

    # -- datasets and models -------------------------------------------------------------------------
    def _log_file(
        self, type_name: str, path: str | os.PathLike[str], event: str, custom: Mapping[str, Any] | None
    ) -> Artifact:
        """Hash the file here, where it is, and record it through the writer."""
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise StoreError(f"Cannot log {type_name} {path!r}: no such file or directory")
        return self._writer.call(
            StoreWriter.log_file,
            binding=self._current(),
            type_name=type_name,
            path=path,
            event=event.lower(),
            digest=tree_md5(path),
            custom=custom,
        )

    def log_dataset(
        self, url: str | os.PathLike[str], event: str, custom_properties: Mapping[str, Any] | None = None
    ) -> Artifact:
        """Hash a dataset file, track it with DVC when it lies in the store, and link it to the execution."""
        return self._log_file(DATASET_TYPE, url, event, custom_properties)

    def log_model(
        self,
        path: str | os.PathLike[str],
        event: str,
        model_framework: str = "Default",
        model_type: str = "Default",
        model_name: str = "Default",
        custom_properties: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Hash a model file, track it with DVC when it lies in the store, and link it to the execution."""
        props = {
            "model_framework": model_framework,
            "model_type": model_type,
            "model_name": model_name,
            **(custom_properties or {}),
        }
        return self._log_file(MODEL_TYPE, path, event, props)

    # -- lifecycle -----------------------------------------------------------------------------------
    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Hand every series' rows logged so far to the store, and wait up to ``timeout`` seconds until it
        holds them: from here on they survive this process's crash (uncommitted: :func:`ray_cmf.recover`
        commits them). A store that does not take them in time is a warning; the rows are sent again later.
        A Tune trial's Cmf flushes at each ``tune.report(..., checkpoint=...)``, so that a restore from that
        checkpoint finds every row logged before it."""
        deadline = time.monotonic() + timeout
        try:
            for handed in [buffer.sealed() for buffer in self.metrics.values()]:
                handed.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # logging never kills training
            log.warning("ray_cmf: the store did not take every row within %g s (%r); they are kept", timeout, exc)

    def close(self, state: str | None = None) -> None:
        """Commit every series with rows logged since its last commit (marked ``at_end``; one that cannot be
        committed stays spilled for :func:`ray_cmf.recover`) and end the execution this Cmf started:
        ``state`` (default: how the process is ending: ``COMPLETE``, or ``FAILED`` after an uncaught exception,
        whose text becomes the execution's ``error``, ``CANCELED`` on SIGTERM or Ctrl-C). Called at exit too;
        a Tune trial's Cmf leaves its rows and state to CmfRayLogger, which commits them at the trial's end.

        Raises:
            InvalidArgumentError: ``state`` is not one of :data:`ENDED_STATES`.
        """
        if state is not None and state not in ENDED_STATES:
            raise InvalidArgumentError(f"close(state={state!r}): an execution ends as one of {ENDED_STATES}")
        ending, error = outcome()
        self._end(state or ending, error if state is None else None)

    def _end(self, state: str, error: str | None) -> None:
        """Commit what was logged since the last commits, close the buffers and mark the execution ``state``,
        with ``error`` when it FAILED."""
        for name, buffer in self.metrics.items():  # at exit, a buffer may have been closed first: its rows are spilled
            if not self._continued and buffer.rows > self._committed.get(name, 0):
                self.commit_metrics(name, {"at_end": True})
                self._committed[name] = buffer.rows  # tried once: what failed is left to recover
            buffer.close()
        binding, self._running = self._running, None
        if binding is not None:
            try:  # noted first: a lineage that does not answer now learns it from `recover` (not CRASHED)
                self._writer.call(StoreWriter.end, binding=binding, props=error_properties(state, error), state=state)
            except Exception as exc:  # the store is gone at exit, say
                log.warning(
                    "ray_cmf: could not mark execution %s ended %s: %s; `ray-cmf recover` does once the store answers",
                    binding.name,
                    state,
                    exc,
                )

    def __del__(self) -> None:
        """A Cmf the program lets go of (a function's local, a name rebound for the next run) ends its
        execution as :meth:`close` does: otherwise it would stay RUNNING, and read as CRASHED once the
        process is gone."""
        if getattr(self, "_running", None) is not None:
            self.close()

    def __enter__(self) -> Cmf:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        self._end(*ended_by(error))


def _warn_of_other_config(name: str, recorded: str | None, given: str | None) -> None:
    """An execution reopened by name keeps what it recorded (its config and code version): say which of the
    properties given now differ, which it does not take."""
    if given is None:
        return
    then, now = json.loads(recorded or "{}"), json.loads(given)
    differ = {k: (then.get(k), v) for k, v in now.items() if then.get(k, _ABSENT) != v}
    if differ:
        said = ", ".join(
            f"{k} ({then_value!r} recorded, {now_value!r} given)" for k, (then_value, now_value) in differ.items()
        )
        log.warning(
            "ray_cmf: execution %r exists and was reopened (a name names one execution of its type in a store): "
            "it keeps the properties and code version it recorded, and these given ones differ: %s. Give another "
            "execution_name for a new execution.",
            name,
            said,
        )


def _warn_of_other_place(name: str, recorded: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """An execution reopened by name from another pipeline or stage than the one it was made in: say that its
    rows go to that one (cmflib's rule, one name an execution of its type in the database)."""
    then, now = [(props.get("Pipeline_Type"), props.get("Context_Type")) for props in (recorded, given)]
    if then[0] is not None and then != now:  # a Tune trial's records no Pipeline_Type
        log.warning(
            "ray_cmf: execution %r belongs to pipeline %r, stage %r, not to pipeline %r, stage %r: it was reopened "
            "there, and what this Cmf logs goes to it. Give another execution_name for a new execution.",
            name,
            *then,
            *now,
        )


_ABSENT = object()
