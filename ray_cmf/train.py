"""Ray Train integration: ``StepLogger`` inside ``train_loop_per_worker`` and ``CmfTrainCallback``.

Per-step series travel through our own path, not ``ray.train.report`` (a barrier that keeps only rank 0's
metrics and drops metrics reported without a checkpoint): every ``sync_every`` steps the workers reduce
their device metrics in one collective over Ray Train's process group, and rank 0 appends one row
to its buffer. At the end rank 0 commits the run's Parquet through the store's single writer.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerCallback,
    WorkerGroupCallback,
)

from ray_cmf._hooks import never_raises, submit_or_run
from ray_cmf._names import check_name, mode_properties
from ray_cmf.actor import connect, ray_driver, start_writer
from ray_cmf.binding import Binding, SeriesKey
from ray_cmf.buffer import RESERVED_IN_TRAIN, TRAIN_RANK, MetricBuffer, refuse_reserved
from ray_cmf.client import Reply, WriterClient
from ray_cmf.constants import (
    CHECKPOINTED_COLUMN,
    DEFAULT_FLUSH_ROWS,
    DEFAULT_SYSTEM_METRICS_SECONDS,
    ENV_PREFIX,
    ERROR_PROPERTY,
    HAND_OVER_WAIT_S,
    REPORT_COLUMN,
    REPORT_STARTS_PROPERTY,
    REPORTS_METRICS_NAME,
    RUN_EXECUTION_TYPE,
    STEP_FLUSH_SECONDS,
    STEPS_METRICS_NAME,
    THROUGHPUT,
    TRIAL_PROPERTY,
    WORKER_GROUP_COLUMN,
    WORKER_STARTS_PROPERTY,
)
from ray_cmf.environment import Environment, capture, seed_props, torch_seed
from ray_cmf.errors import InvalidArgumentError, InvalidNameError, RayCmfError, recorded_error
from ray_cmf.exits import error_properties, on_thread_end, outcome, track
from ray_cmf.frames import is_metric
from ray_cmf.lineage import Artifact, config_properties, observed_config_properties
from ray_cmf.metrics import Max, MetricCollection, Min, Sum, SyncHandle
from ray_cmf.metrics.packing import rank as dist_rank
from ray_cmf.metrics.packing import world_size
from ray_cmf.node_sampler import (
    Bound,
    Watch,
    hand_over_samples_at_the_end,
    handed_over,
    start_samplers,
    wait_for_samplers,
    watch_process,
)
from ray_cmf.results import append_result, result_row, without
from ray_cmf.stall import StallWatch, flush_every_watch
from ray_cmf.store import Store
from ray_cmf.system import SystemSampler, sample_into
from ray_cmf.writer import StoreWriter

log = logging.getLogger(__name__)

SAMPLES = "samples"
_OWN_COLUMNS = frozenset({"step", "wall_time", SAMPLES, THROUGHPUT})  # what a row holds beside the metrics
STEPS_MAX, STEPS_MIN = "ray_cmf_steps_max", "ray_cmf_steps_min"  # every sync carries the ranks' step counts
_LAST_SYNC_WAIT_S = 2.0  # how long a loop's end without finish() waits for the sync of its last step
_NODE_SAMPLED = False  # whether this Train worker's process is sampled by its node's sampler (CmfTrainCallback)
_BIND_TIMEOUT_S = 60.0  # how long a worker waits for rank 0 to register the run
_hook = never_raises("training")


def _train_context() -> Any:
    """Ray Train's worker context, or None outside a Train worker."""
    try:
        from ray.train import get_context

        context = get_context()
        context.get_experiment_name()
        return context
    except Exception:
        return None


def _run_id(run_context: Any) -> str | None:
    """Ray Train's id of this run (one per ``fit``, kept across worker restarts), from its TrainRunContext;
    None outside Train or where Ray has none. It tells this run's registration from an earlier run's of the
    same name."""
    return getattr(run_context, "run_id", None)


def _worker_run_id() -> str | None:
    """In a Train worker: its run's id (see :func:`_run_id`), from Ray's internal context (None where it moved)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return _run_id(get_train_context().train_run_context)
    except Exception:
        return None


def _store_name(store: str | os.PathLike[str] | None) -> Store | None:
    """The store a Train object names: resolved here on a driver or without Ray (argument, else
    ``$RAY_CMF_STORE``, else ``./cmf_store``); in a Ray worker, the argument as an absolute path on the
    driver's node (its config file is read there, by the writer), or None for the store the driver named."""
    if ray.is_initialized() and not ray_driver():
        if store is None:
            return None
        if not os.path.isabs(store):
            raise RayCmfError(
                f"store={os.fspath(store)!r} in a Ray worker: a relative path would be resolved on this worker, "
                "not on the driver's node, where the store is; pass an absolute path, or name the store on the "
                "driver (CmfTrainCallback(store=...)) and leave store out here"
            )
    return Store(store)


def registered_run(run_name: str, trial_id: str | None) -> str:
    """The writer's and MLMD's name of a Train run: inside a Tune trial, the trial's own (the trials of a sweep
    that start in one second get one default run name from Ray Train)."""
    return f"{run_name}@{trial_id}" if trial_id is not None else run_name


def _trial_binding(writer: WriterClient, trial_id: str, timeout: float) -> Binding:
    """The binding of the Tune trial that runs a Train run (see :meth:`WriterClient.wait_for_trial`)."""
    return writer.wait_for_trial(StoreWriter.binding, trial_id, timeout)


def _enclosing_trial() -> str | None:
    """The id of the Tune trial this process runs, or None outside Tune (asked quietly: Tune warns)."""
    import warnings

    from ray import tune

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trial_id = tune.get_context().get_trial_id()
    return str(trial_id) if trial_id is not None else None


def _modes(metrics: MetricCollection, declared: Mapping[str, str]) -> dict[str, str]:
    """The mode properties of a StepLogger's columns: those ``declared``, then those its metrics know, and its
    own throughput."""
    checked = mode_properties(declared)  # a mapping of names to 'min' or 'max'
    columns = [*metrics, THROUGHPUT]
    unknown = sorted(set(declared) - set(columns))
    if unknown:
        raise InvalidArgumentError(f"modes names {unknown}, which are not among the metrics {sorted(columns)}")
    better = {name: metric.higher_is_better for name, metric in metrics.items()}
    known = {name: "max" if higher else "min" for name, higher in better.items() if higher is not None}
    return {**mode_properties({THROUGHPUT: "max", **known}), **checked}


class StepLogger:
    """Per-step device metrics for ``train_loop_per_worker``: synced every ``sync_every`` steps, logged by rank 0.

    Args:
        metrics: The device metrics; updated by the training loop between ``step()`` calls.
        sync_every: Steps per logging interval (one packed sync, one collective, each).
        report_every: Also pass the synced row to ``ray.train.report`` every this many syncs (for
            schedulers). All ranks call it, as Ray Train requires.
        metrics_name: Name of the run's step series.
        pipeline_name, pipeline_stage: Where to record (ignored inside a Tune trial, whose pipeline and
            stage are used).
        store: The store, a path on the driver's node; default: the store that the driver named last
            (``CmfRayLogger`` / ``CmfTrainCallback`` / ``start_writer``), or ``$RAY_CMF_STORE`` /
            ``./cmf_store`` without Ray.
        trial_id: The Tune trial that runs this TorchTrainer (pass it through ``train_loop_config``);
            the run's file is then linked to the trial's execution and context too.
        run_name: The Train run (default: Ray Train's experiment name).
        system_metrics: Inside Ray Train, every worker samples its process and node into the run's
            ``system_metrics`` series (one per rank) every this many seconds; None switches it off. Where
            ``CmfTrainCallback`` samples the workers from their nodes, it leaves that to the callback.
        registration_timeout: How long rank 0 waits for ``trial_id``'s registration by the driver (and the
            other ranks for the run's), in seconds.
        flush_rows, flush_seconds: Rank 0 sends its rows to the writer every ``flush_rows`` rows, or once
            a row has waited ``flush_seconds`` seconds, while the loop makes progress, and at once when it
            stops stepping for 0.1 s or is about to wait for a sync that has not arrived: a rank that Ray Train
            stops while it waits in a collective, because another rank failed, neither returns nor raises, and
            would lose the rows it still held. ``flush_rows=1`` sends each row as it is logged.
        modes: ``{metric: "min" | "max"}``: whether lower or higher is better, recorded with the run so that
            reading it gives ``<metric>_best`` the right way round. A metric that knows it needs none
            (``Accuracy``: ``max``); one none declares reads as ``min``.
        config: The run's hyperparameters, recorded as its config (``config/...`` in ``trials``, ``show`` and
            ``diff``), outside Ray Train: inside it, the run's config is its ``train_loop_config``, which
            ``CmfTrainCallback`` records.

    Raises:
        InvalidArgumentError: ``config`` inside Ray Train, or holding a text the store cannot hold.

    Example (in ``train_loop_per_worker``; ``examples/torch_trainer.py`` runs one)::

        def train_loop_per_worker(config):
            metrics = MetricCollection({"loss": Mean(), "acc": Accuracy()}, device=device)
            steps = StepLogger(metrics, sync_every=50, trial_id=config.get("trial_id"))
            for x, y in loader:
                ...
                metrics.update(loss=loss, acc=(logits, y))
                steps.step(samples=len(x))
            steps.finish()
    """

    def __init__(
        self,
        metrics: MetricCollection,
        *,
        sync_every: int = 50,
        report_every: int | None = None,
        metrics_name: str = STEPS_METRICS_NAME,
        pipeline_name: str = "ray_train",
        pipeline_stage: str | None = None,
        store: str | os.PathLike[str] | None = None,
        trial_id: str | None = None,
        run_name: str | None = None,
        group: Any = None,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = STEP_FLUSH_SECONDS,
        system_metrics: float | None = DEFAULT_SYSTEM_METRICS_SECONDS,
        registration_timeout: float = _BIND_TIMEOUT_S,
        modes: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if sync_every < 1 or (report_every is not None and report_every < 1):
            raise ValueError(f"sync_every and report_every must be >= 1, got {sync_every!r}, {report_every!r}")
        self._modes = _modes(metrics, {} if modes is None else modes)
        if own := sorted(_OWN_COLUMNS & set(metrics)):
            raise ValueError(f"metric {own[0]!r} names a column StepLogger fills itself ({sorted(_OWN_COLUMNS)})")
        for name in metrics:
            refuse_reserved(name, RESERVED_IN_TRAIN)
            if not is_metric(name):  # a row would hold it, and no summary, best or plot would read it
                raise InvalidNameError("metric name", name, "ray_cmf reads that column as a step, a key or bookkeeping")
        self.metrics = metrics
        # synced with the metrics, in their collective, but not theirs; the samples are a host-side count, always
        # finite, and none of the three has a <name>_nonfinite output to leave out
        self._counts = {
            SAMPLES: metrics.hidden_metric(SAMPLES, lambda: Sum(nan_policy="propagate")),
            STEPS_MAX: metrics.hidden_metric(STEPS_MAX, lambda: Max(nan_policy="propagate")),
            STEPS_MIN: metrics.hidden_metric(STEPS_MIN, lambda: Min(nan_policy="propagate")),
        }
        self.sync_every, self.report_every = sync_every, report_every
        self.metrics_name = check_name("metrics_name", metrics_name)
        self.group = group
        self.trial_id = trial_id
        self._registration_timeout = registration_timeout
        self._context = _train_context()
        self._config = self._checked_config(config)
        self.run_name = run_name or (
            self._context.get_experiment_name() if self._context else f"local-{uuid.uuid4().hex[:8]}"
        )
        self._registered_as = registered_run(self.run_name, trial_id)
        self._token = _worker_run_id() if self._context is not None else None
        self.rank = dist_rank(group)
        self.steps_done = 0
        self._syncs = 0
        self._unreported: dict[str, float] | None = None  # the last row, where report_every's cadence skipped it
        self._samples = 0
        self._nonfinite: dict[str, float] = {}  # per interval metric: the values it left out so far in the run
        self._last_sync_time: float | None = None  # the interval's start: this start's first step, then each sync
        self._buffer: MetricBuffer | None = None
        self._watch: StallWatch | None = None  # rank 0's: its rows leave once the loop stalls
        self._run: Reply | None = None  # rank 0's registration, until its first step records where it resumes
        self._pending: tuple[SyncHandle[Any], int, float] | None = None  # a sync in flight: handle, step, time
        self._drained: dict[str, float] | None = None  # a row completed early (a checkpoint), for the next step
        self._finished = False
        self._artifact: Artifact | None = None  # what finish() committed
        self._sampler: SystemSampler | None = None
        self._ending: _RunEnd | None = None  # outside Ray Train: what ends the run with the process
        if self.rank == 0 or self._context is not None:
            named = _store_name(store)
            self._writer = connect(named)
        if self.rank == 0:
            run = self._bind(pipeline_name, pipeline_stage, named)
            self._run = run
            name = self.metrics_name  # not self: the buffer's threads hold this, and must not keep self alive
            self._key = lambda: SeriesKey(run.result(), name, attempts=True)
            self._sink = self._writer.sink(self._key)
            self._buffer = MetricBuffer(
                sink=self._sink, flush_rows=flush_rows, flush_seconds=flush_seconds, reserved=TRAIN_RANK
            )
            self._watch = StallWatch(self._buffer)
        if self._context is not None:
            if not _NODE_SAMPLED:  # never sample a process twice
                extra = {"rank": self.rank}  # the same columns as a node sampler's rows
                self._sampler = sample_into(
                    self._writer, self._system_key, system_metrics, extra, flush_seconds=flush_seconds
                )
            on_thread_end(self._hand_over)
        elif self._buffer is not None:  # no Ray Train callback ends the run: the process's end, or letting go, does
            self._ending = _RunEnd(self)
            track(self._ending)

    def _system_key(self) -> SeriesKey:
        """This worker's ``system_metrics`` series (one per rank), once rank 0 has registered the run."""
        run = self._wait_for_run()
        if run is None:
            raise RayCmfError(
                f"Train run {self.run_name!r} was not registered by rank 0 in {self._registration_timeout:g} s"
            )
        return SeriesKey.system(run, f"rank{self.rank}")

    def _hand_over(self, ending: tuple[str, str | None] | None = None) -> None:
        """As the loop's thread ends (returned or raised): this worker's rows reach the writer before Ray can
        stop it; without ``finish``, rank 0 asks the writer to commit them (``at_end``): Train tells no one else.
        ``ending``: the state the run ends in and its error, where no Ray Train callback sets them."""
        if self._sampler is not None:
            self._sampler.stop()
        if self._buffer is not None and self._pending is not None:
            self._last_row()
        if self._watch is not None:
            self._watch.stop()
        if self._buffer is not None:
            self._buffer.close()
            if not self._finished:
                state, error = ending or (None, None)
                props = error_properties(state, error)
                self._writer.call(StoreWriter.end, binding=self._key().binding, props=props, state=state)

    def _end_run(self) -> None:
        """Outside Ray Train, as the process ends or the program lets go of this StepLogger without ``finish``:
        the last sync's row is logged, the rows committed (``at_end``), and the run ends as the process does
        (``COMPLETE``, ``FAILED`` with the uncaught exception, ``CANCELED``). Runs once."""
        if getattr(self, "_ending", None) is None:
            return
        self._ending = None
        if not self._finished:
            self._hand_over(outcome())

    def __del__(self) -> None:
        self._end_run()

    def log_seeds(self, **seeds: int) -> None:
        """Rank 0: record the run's seeds (``seed_<name>`` properties; ints) and torch's initial seed."""
        if self.rank == 0:
            run = self._wait_for_run()
            assert run is not None  # rank 0 registered it
            props = torch_seed() | seed_props(seeds)
            self._writer.call(StoreWriter.update_execution, execution_id=run.execution_id, props=props, store=run.store)

    def _wait_for_run(self) -> Binding | None:
        """The run's registration by rank 0 (this fit's, not an earlier run's of the name)."""
        return self._writer.wait_binding("run", self._registered_as, self._registration_timeout, self._token)

    def _checked_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """``config`` as the run's properties; refused inside Ray Train, whose run has its own."""
        if config is None:
            return {}
        if self._context is not None:
            raise InvalidArgumentError(
                "StepLogger(config=...) records a run's config outside Ray Train; inside it, the run's config is "
                "its train_loop_config, which CmfTrainCallback records"
            )
        return config_properties(config)

    def _bind(self, pipeline: str, stage: str | None, store: Store | None) -> Reply:
        """Rank 0: register the run's execution (in the trial's pipeline and stage inside a Tune trial).

        The registration is not waited for: the series' chunks wait for it on the spill thread, and a
        failure is warned about there and at ``finish``.
        """
        trial = None
        if self.trial_id is not None:  # the driver's writer may register the trial a moment after it started
            trial = _trial_binding(self._writer, self.trial_id, self._registration_timeout)
            pipeline, stage, store = trial.pipeline, trial.stage, trial.store
        props = {
            "run_name": self.run_name,
            "world_size": world_size(self.group),
            "sync_every": self.sync_every,
            **({TRIAL_PROPERTY: self.trial_id} if self.trial_id else {}),
            **self._modes,
            **self._config,
        }
        return self._writer.send(
            StoreWriter.bind,
            kind="run",
            name=self._registered_as,
            pipeline=check_name("pipeline_name", pipeline),
            stage=check_name("pipeline_stage", stage or self.run_name),
            type_name=RUN_EXECUTION_TYPE,
            props=props,
            store=store,
            environment=capture(code=self._context is None),  # in Ray Train, the driver's callback records it
            start=True,
            trial=trial,
            token=self._token,
        )

    def step(self, samples: int | None = None) -> dict[str, float] | None:
        """Count one training step (and its samples); every ``sync_every`` steps, start a sync of the interval.

        The sync's collective runs while the next step trains; that step's call completes it and logs the
        row. Returns that row on the step after each sync step, else None: its metrics are the synced ones on
        every rank, its ``wall_time`` and ``samples_per_s`` (all ranks' samples) timed by the rank's own clock
        (rank 0's row is the one logged). No host sync otherwise. ``samples_per_s`` is timed from this
        StepLogger's first step on: the set-up before it, and that step's samples, are not counted.
        """
        if self._run is not None:  # this start's first step: it resumes after the steps done (a checkpoint's)
            resumes = {"metrics_name": self.metrics_name, "step": self.steps_done}
            self._writer.send(StoreWriter.record_start, binding=self._run, **resumes)
            self._run = None
        if self._finished:
            raise RayCmfError(
                "StepLogger.step() after finish(): the run's series is committed and closed; make a new StepLogger "
                "for another run"
            )
        self.steps_done += 1
        if self._watch is not None:
            self._watch.beat()
        if self._last_sync_time is None:  # throughput counts from here: the set-up and this step are not timed
            self._last_sync_time = time.time()
        elif samples is not None:
            self._samples += samples  # host-side count: no tensor op per step
        row = self._complete() if self._pending is not None else self._drained
        self._drained = None
        if self.steps_done % self.sync_every == 0:
            self._launch()
        return row

    def sync(self) -> dict[str, float]:
        """Sync the interval so far now and log its row (blocking); returns the row (of the sync this step
        started, if it did: its interval is the one so far)."""
        if self._pending is not None and self._pending[1] == self.steps_done:
            return self._complete()
        self._drain()
        self._drained = None  # older than the row returned here: no step returns it after this one
        self._launch()
        return self._complete()

    def _launch(self) -> None:
        """Start reducing the interval across ranks (one packed collective) without waiting for it."""
        self._counts[SAMPLES].update(float(self._samples))  # summed across ranks in the same packed sync
        self._counts[STEPS_MAX].update(float(self.steps_done))
        self._counts[STEPS_MIN].update(float(self.steps_done))
        self._samples = 0
        self._pending = (self.metrics.sync(self.group, async_op=True), self.steps_done, time.time())

    def _drain(self) -> None:
        """Complete a sync in flight, if any (before anything that needs every row logged); the next ``step()``
        returns its row, as it would have."""
        if self._pending is not None:
            self._drained = self._complete()

    def _wait(self) -> tuple[dict[str, float], int, float]:
        """Wait for the sync in flight: its row, step and launch time.

        Raises:
            RayCmfError: The ranks synced at different steps (they ran unequal numbers of steps).
        """
        assert self._pending is not None
        handle, step, launched = self._pending
        self._pending = None
        if self._watch is not None and not handle.is_completed():
            self._watch.seal()  # the other ranks are late, or dead: rank 0's rows must not wait with it
        row = self._so_far(handle.wait().row(hidden=True))
        lowest, highest = row.pop(STEPS_MIN), row.pop(STEPS_MAX)
        if lowest != highest:
            raise RayCmfError(
                f"StepLogger: the ranks are at steps {lowest:g} to {highest:g} in one sync; every rank must call "
                "step() as often (give each rank as many batches, e.g. drop_last=True), or their collectives pair "
                "up wrongly and the run hangs"
            )
        return row, step, launched

    def _last_row(self) -> None:
        """As the loop's thread ends without ``finish``: the row of the sync its last step started. Every rank
        started it too, unless one failed: then it is given up after a moment, or as soon as the collective
        fails (a rank that died closes its connections), and the run ends all the same."""
        assert self._pending is not None
        try:
            self._pending[0].wait_within(_LAST_SYNC_WAIT_S, "the sync of the loop's last step")
            self._complete(report=False)
        except Exception as exc:  # RayCmfError (it timed out), or the process group's own (gloo's RuntimeError)
            log.warning("ray_cmf: the row of step %d is not logged: %s", self.steps_done, exc)

    def _complete(self, report: bool = True) -> dict[str, float]:
        """Wait for the sync in flight; rank 0 appends its row; every ``report_every`` syncs, report it."""
        row, step, launched = self._wait()
        samples = row.pop(SAMPLES, 0.0)
        elapsed = launched - (launched if self._last_sync_time is None else self._last_sync_time)
        self._last_sync_time = launched
        row = {"step": step, **row, "wall_time": launched}
        if samples:
            row[THROUGHPUT] = samples / elapsed if elapsed > 0 else float("nan")
        if self._buffer is not None:
            self._buffer.append(row)
        self._syncs += 1
        every = self.report_every
        if every is None or self._context is None:
            return row
        self._unreported = row
        if report and self._syncs % every == 0:
            ray.train.report(row)
            self._unreported = None
        return row

    def _so_far(self, row: dict[str, float]) -> dict[str, float]:
        """The row with each interval metric's ``<name>_nonfinite`` as the run's count so far, so that the last
        row's count is the run's (a cumulative metric's count is one already)."""
        for name, metric in self.metrics.items():
            key = f"{name}_nonfinite"
            if key in row and not metric.cumulative:
                row[key] = self._nonfinite[key] = self._nonfinite.get(key, 0.0) + row[key]
        return row

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: the step, the global metric state, the counts of non-finite values so far and
        the syncs so far (``report_every``'s cadence goes on from them). Makes rows so far durable.

        A collective: call it on every rank (then save it on one); called on one rank only, it raises
        :class:`~ray_cmf.metrics.packing.CollectiveTimeoutError` after 300 s instead of hanging."""
        self._drain()
        if self._watch is not None:
            try:
                self._watch.flush()
            except RayCmfError as exc:  # logging never kills training
                log.warning("ray_cmf: rows before this checkpoint may not be durable: %s", exc)
        return {
            "step": self.steps_done,
            "metrics": self.metrics.state_dict(),
            "nonfinite": dict(self._nonfinite),
            "syncs": self._syncs,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint: the series resumes after its step; rows re-run later win on read (the
        store counts the run's starts, so each restart's rows carry a later attempt)."""
        step = int(state["step"])
        self.metrics.load_state_dict(state["metrics"])  # before anything is set: a refused state changes nothing
        self.steps_done = step
        self._nonfinite = dict(state.get("nonfinite", {}))  # a checkpoint from before counts were kept: none
        self._syncs = int(state.get("syncs", self.steps_done // self.sync_every))  # older: the scheduled syncs

    def finish(self) -> Artifact | None:
        """Rank 0 commits the run's Parquet (linked to the Train run and, inside a trial, to the trial).

        Inside Ray Train every rank stops its system-metrics sampler, then makes one last
        ``ray.train.report`` flagged as final, which tells ``CmfTrainCallback`` that the run completed (it
        then commits the samplers' series). A store failure is a warning (and None is returned). Called
        again, it returns what the first call did.
        """
        if self._finished:
            return self._artifact
        self._drain()
        if self.steps_done % self.sync_every:
            self.sync()
        elif world_size(self.group) > 1:  # the interval is empty: a last sync only checks every rank's step count
            self._launch()
            self._wait()
        if (
            self._unreported is not None
        ):  # the run's last row, off the cadence: Result.metrics and the reports end with it
            ray.train.report(self._unreported)
        self._finished = True
        if self._sampler is not None:  # its rows reach the writer before the run ends
            self._sampler.stop()
        if self._watch is not None:
            self._watch.stop()
        artifact = None
        if self._buffer is not None:
            try:
                artifact = self._sink.commit(
                    self._buffer,
                    props={"steps": self.steps_done},
                    state="COMPLETE",
                )
            except Exception as exc:  # logging never kills training
                log.warning(
                    "ray_cmf: could not commit run %r: %s; `ray-cmf recover` commits its rows", self.run_name, exc
                )
            self._buffer.close()
        self._artifact = artifact
        return artifact


class _RunEnd:
    """Ends a StepLogger's run at the process's end (see :func:`~ray_cmf.exits.track`), without keeping the
    StepLogger alive: one the program lets go of ends as it is freed."""

    def __init__(self, logger: StepLogger) -> None:
        self._logger = weakref.ref(logger)

    def close(self) -> None:
        logger = self._logger()
        if logger is not None:
            logger._end_run()


@dataclass
class _CallbackRuntime:
    """The callback's live parts in the controller: the writer, the run's registration and its report series."""

    writer: WriterClient
    run: str
    binding: Reply
    buffer: MetricBuffer
    commits: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="ray_cmf-commit")
    )
    reports: int = 0


class CmfTrainCallback(ControllerCallback, WorkerGroupCallback, ReportCallback, WorkerCallback):
    """Train callback (runs in the controller actor): every rank's reports in the run's report series, and
    every worker's process sampled from its node.

    Built on the driver, it starts the store's single writer there (:func:`ray_cmf.start_writer`), so
    every worker on any node logs into the driver's store. ``after_report`` appends one row per rank
    (with a ``rank`` column); nothing blocks the controller. A report with a checkpoint commits a version
    of the series; a worker's error marks the run FAILED; the run's end commits what exists (the workers'
    series too) and marks it COMPLETE, or FAILED when it failed.

    As each worker group starts, the sampler of each worker's node (as for :class:`CmfRayLogger`'s
    trials) samples the worker's process into the run's ``system_metrics`` series of its rank, without
    touching the training loop; :class:`StepLogger` then leaves that process to it.

    It is built on Ray Train's controller and worker-group callbacks (``ray.train.v2``), not on
    ``UserCallback``, whose hooks see neither the workers nor the run's end.

    Args:
        pipeline_name, pipeline_stage: Where to record (stage default: the run's name).
        store: The store (default ``$RAY_CMF_STORE`` or ``./cmf_store``, read on the driver).
        metrics_name: Name of the report series.
        file_path: The MLMD database: a SQLite file, or a ``postgresql://`` / ``mysql://`` URL (default:
            the store's own, or the one its config file names).
        push: Upload each committed file to the store's remote as it is committed, on the writer's
            background thread (what the job's end cuts short, ``ray-cmf push`` sends later).
        system_metrics: Sample every worker's process every this many seconds (densely in its first
            second); None switches it off (then each :class:`StepLogger` samples its own process).
        trial_id: The Tune trial that runs this TorchTrainer (default: the trial the callback is built in,
            if any): the run is then recorded in the trial's pipeline and stage, as one run with its
            ``StepLogger(trial_id=...)``. Where no CmfRayLogger runs the sweep, the run is recorded where
            ``pipeline_name`` says, with a warning.

    Raises:
        RayCmfError: Built in a Ray worker (a Tune trial) of a job whose driver runs no ray_cmf writer:
            add ``CmfRayLogger`` to the Tuner (or call :func:`ray_cmf.start_writer` on the driver).
    """

    def __init__(
        self,
        pipeline_name: str = "ray_train",
        pipeline_stage: str | None = None,
        store: str | os.PathLike[str] | None = None,
        metrics_name: str = REPORTS_METRICS_NAME,
        file_path: str | os.PathLike[str] | None = None,
        push: bool = False,
        system_metrics: float | None = DEFAULT_SYSTEM_METRICS_SECONDS,
        trial_id: str | None = None,
    ) -> None:
        self.pipeline_name = check_name("pipeline_name", pipeline_name)
        self.trial_id = trial_id if trial_id is not None else _enclosing_trial()
        self.pipeline_stage = check_name("pipeline_stage", pipeline_stage) if pipeline_stage else None
        self.metrics_name = check_name("metrics_name", metrics_name)
        self.store = Store(store, mlmd=file_path) if file_path is not None else _store_name(store)
        if self.store is not None:
            self.store.require_lineage()
        if push and self.store is not None:
            self.store.require_remote()  # before the run starts
        self.push = push
        self.system_metrics = system_metrics
        self._environment: Environment | None = None  # the driver's code and software, captured there
        self._run_context: Any = None  # Ray Train's TrainRunContext, from the controller's start
        self._watches: list[Watch] = []  # the workers their nodes' samplers sample
        self._stopping: list[Any] = []  # their hand-overs, once their worker group stops (until an end waits)
        self._worker_groups = 0  # worker groups started: a restarted group's workers get series of their own
        self._rank0: dict[str, str] = {}  # rank 0's host and node, as its worker group's start reports them
        self._runtime: _CallbackRuntime | None = None
        if ray.is_initialized() and not ray_driver():  # in a Tune trial, say: a clear error now, not a failed run
            connect()  # later (the driver's writer must run: the callback cannot start one here)

    def __getstate__(self) -> dict[str, Any]:
        """Train ships the callback to its controller: on the driver, start the writer and capture the code."""
        if ray_driver():
            writer = start_writer(self.store)
            if self.push:
                writer.call(StoreWriter.push_after_commit, store=self.store)
            if self._environment is None:
                self._environment = capture(hardware=False)
            if self.system_metrics is not None:
                hand_over_samples_at_the_end()
        return {**self.__dict__, "_runtime": None, "_watches": [], "_stopping": []}  # a copy runs in each worker

    def before_worker_shutdown(self) -> None:
        """In each worker, before Ray Train stops it (also while its loop waits for good in a collective,
        because another rank failed): rank 0's batched rows reach the writer, for the run's end to commit."""
        flush_every_watch()

    def _rt(self) -> _CallbackRuntime:
        """Bind the run on first use: fire-and-forget, so the controller never waits (but, inside a Tune
        trial, for the trial's registration, which the driver makes as the trial starts)."""
        if self._runtime is None:
            run_name = self._run_context.get_run_config().name
            writer = connect()
            pipeline, stage, store, trial = self._place(writer, run_name)
            binding = writer.send(
                StoreWriter.bind,
                kind="run",
                name=registered_run(run_name, self.trial_id),
                pipeline=pipeline,
                stage=stage,
                type_name=RUN_EXECUTION_TYPE,
                props={
                    **observed_config_properties(self._run_context.train_loop_config or {}, f"run {run_name}"),
                    **self._rank0,
                    "run_name": run_name,
                    **({TRIAL_PROPERTY: self.trial_id} if self.trial_id else {}),
                },
                store=store,
                environment=self._environment,
                trial=trial,
                token=_run_id(self._run_context),
            )
            # each start of the callback (a fit: a run name used again, a restored trial's) is an attempt of
            # the report series, whose rows supersede an earlier attempt's from its first step on
            starts = writer.send(StoreWriter.count_start, binding=binding, counter=REPORT_STARTS_PROPERTY)
            sink = writer.sink(lambda: SeriesKey(starts.result(), self.metrics_name, attempts=True))
            self._runtime = _CallbackRuntime(writer, run_name, binding, MetricBuffer(sink=sink))
        return self._runtime

    def _place(self, writer: WriterClient, run_name: str) -> tuple[str, str, Store | None, Binding | None]:
        """The pipeline, stage and store of the run, and the Tune trial it runs in: the trial's inside a
        trial, else the callback's."""
        if self.trial_id is not None:
            try:
                trial = _trial_binding(writer, self.trial_id, _BIND_TIMEOUT_S)
                return trial.pipeline, trial.stage, trial.store, trial
            except RayCmfError as exc:  # logging never kills training
                log.warning("ray_cmf: run %r is recorded in pipeline %r: %s", run_name, self.pipeline_name, exc)
        return self.pipeline_name, self.pipeline_stage or run_name, self.store, None

    @_hook
    def after_controller_start(self, train_run_context: Any) -> None:
        """Start the sampler of every live node before the workers start, as a sweep's start does: one started
        with the first worker group came up a second or more into the workers' loops, whose start (all of a
        short loop) it never sampled."""
        self._run_context = train_run_context
        if self.system_metrics is not None:
            wait_for_samplers(start_samplers())

    @_hook
    def after_worker_group_start(self, worker_group: Any) -> None:
        """Have each worker's node sample its process into its rank's ``system_metrics`` series. The run is
        bound later (by rank 0's StepLogger, in a Tune trial's stage, or by the first report): its samples
        wait for it."""
        self._worker_groups += 1
        self._record_rank0(worker_group)
        rt = self._rt()  # the run and its config are recorded now: a run its driver's end cuts short is known
        if self.system_metrics is None:
            return
        run, run_id = self._run_context.get_run_config().name, _run_id(self._run_context)
        try:
            group = self._group_suffix(rt)
            for worker in worker_group.get_workers():
                rank, meta = worker.distributed_context.world_rank, worker.metadata
                self._watches.append(
                    watch_process(
                        meta.pid,
                        meta.node_id,
                        f"{run}/rank{rank}{group} ({run_id})",  # two trials' runs may share a name
                        Bound("run", registered_run(run, self.trial_id), run_id),
                        self.system_metrics,
                        instance=f"rank{rank}{group}",
                        extra={"rank": rank},
                    )
                )
            worker_group.execute(_leave_sampling_to_the_node)
        except Exception as exc:  # logging never kills training
            log.warning("ray_cmf: the run's workers will not be sampled: %s: %s", type(exc).__name__, exc)

    @staticmethod
    def _group_suffix(rt: _CallbackRuntime) -> str:
        """What names this worker group's series: none for the run's first, ``-N`` for its N-th start over every
        fit of the run (Ray's restart of its workers, a restored Tune trial's, the run name used again), so
        that no start's samples go on in another's series."""
        starts = rt.writer.send(StoreWriter.count_start, binding=rt.binding, counter=WORKER_STARTS_PROPERTY)
        started = starts.result(timeout=_BIND_TIMEOUT_S).attempt
        return "" if started == 1 else f"-{started}"

    def _record_rank0(self, worker_group: Any) -> None:
        """Rank 0's host and node (where StepLogger records its hardware too): for a run that never uses it."""
        try:
            [meta] = [w.metadata for w in worker_group.get_workers() if w.distributed_context.world_rank == 0]
        except Exception as exc:  # logging never kills training
            log.warning("ray_cmf: the run's host is not recorded: %s: %s", type(exc).__name__, exc)
            return
        host = {"host": meta.hostname, "node_id": meta.node_id, "node_ip": meta.node_ip}
        self._rank0 = {ENV_PREFIX + key: value for key, value in host.items()}
        if self._runtime is not None:  # a restarted group: rank 0 may be on another node now
            rt, props = self._runtime, dict(self._rank0)
            submit_or_run(rt.commits, self._update_run, rt, props)

    def _update_run(self, rt: _CallbackRuntime, props: dict[str, Any]) -> None:
        """On the commit thread: merge ``props`` into the run's execution."""
        try:
            rt.writer.call(StoreWriter.update_binding, binding=rt.binding.result(), props=props)
        except Exception as exc:  # logging never kills training
            log.warning("ray_cmf: could not record %s on run %r: %s", sorted(props), rt.run, exc)

    @_hook
    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        """Start the hand-over of every worker's last sample and rows (waited for at the run's end)."""
        self._stop_watches()

    def _stop_watches(self) -> None:
        self._stopping.extend(found.stop() for found in self._watches)
        self._watches.clear()

    @_hook
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        rt = self._rt()
        checkpoint = training_report.checkpoint
        rt.reports += 1
        for rank, reported in enumerate(metrics):
            source = f"Train report {rt.reports}, rank {rank}"
            group = {WORKER_GROUP_COLUMN: self._worker_groups}  # which start of the workers (Ray restarts them)
            own = {REPORT_COLUMN: rt.reports, "rank": rank, **group, CHECKPOINTED_COLUMN: checkpoint is not None}
            append_result(rt.buffer, {**own, **without(result_row(reported, tune=False), own, source)}, source)
        if checkpoint is not None:  # a version per checkpoint, so runs without StepLogger are recorded too
            self._commit(rt, {}, None)
        else:  # at the writer at once: Ray stops this actor, and what it holds, with a driver that ends
            rt.buffer.seal()

    @_hook
    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        errors = worker_group_status.errors
        if not errors:
            return
        message = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items()))
        self._commit(self._rt(), {"status": "FAILED", ERROR_PROPERTY: recorded_error(message)}, "FAILED", end=True)

    @_hook
    def after_controller_finish(self, result: Any) -> None:
        """The run's end: commit what is left (samples handed over, rows its stopped workers handed over) and
        mark the run as it ended, also one that failed once and then completed; then wait for the commits,
        which the controller's end would cut short."""
        rt = self._rt()  # a run that never reported is bound now: its workers' samples wait for it
        status = "FAILED" if getattr(result, "error", None) is not None else "COMPLETE"
        self._commit(rt, {"status": status}, status, end=True)
        rt.commits.shutdown(wait=True)

    @_hook
    def before_controller_abort(self) -> None:
        """Ray Train aborts the run (the driver's Ctrl-C) and ends this actor, and the nodes' samplers it
        started with it: their samples are handed over, and the run ends CANCELED with what it holds."""
        rt = self._rt()
        self._stop_watches()
        self._commit(rt, {"status": "CANCELED"}, "CANCELED", end=True)
        rt.commits.shutdown(wait=True)

    def _commit(self, rt: _CallbackRuntime, props: dict[str, Any], state: str | None, end: bool = False) -> None:
        """Hand the rows to the writer (sealed here, on the controller thread that appends them), then, on the
        commit thread, commit a version and set props and state (``end``: after the workers' samples are
        handed over, also commit what the run's workers left uncommitted)."""
        handed_over_rows = rt.buffer.sealed()
        stopping: list[Any] = []
        if end:
            stopping, self._stopping = self._stopping, []  # this end waits for them

        def commit() -> None:
            try:
                for stop in stopping:
                    handed_over(stop, HAND_OVER_WAIT_S)
                handed_over_rows.result()
                binding = rt.binding.result()
                key = SeriesKey(binding, self.metrics_name)
                try:
                    rt.writer.call(
                        StoreWriter.commit,
                        key=key,
                        props=None if end else props,
                        state=None if end else state,
                    )
                finally:  # also where the commit failed: the writer notes how the run ended, for `recover`
                    if end:
                        rt.writer.call(StoreWriter.end, binding=binding, props=props, state=state)
            except Exception as exc:  # logging never kills training
                log.warning("ray_cmf: committing the reports of run %r failed: %s", rt.run, exc)

        submit_or_run(rt.commits, commit)


def _leave_sampling_to_the_node() -> None:
    """In a Train worker: its node's sampler samples this process, so StepLogger must not."""
    global _NODE_SAMPLED
    _NODE_SAMPLED = True
