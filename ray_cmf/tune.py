"""Ray Tune integration: ``CmfRayLogger`` (the callback) and the in-trial Cmf.

Concurrency: ``CmfRayLogger.setup`` starts the store's single writer on the driver's node
(:mod:`ray_cmf.writer`); it is the only process that touches the store. Tune's hooks only append to
in-memory buffers or send the writer fire-and-forget requests; commits wait for the writer on a driver
thread, off Tune's event loop. Trials, on any node, reach the same writer through Ray.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import ray
from ray import tune

from ray_cmf._hooks import never_raises, submit_or_run
from ray_cmf._names import check_mode, check_name, mode_properties
from ray_cmf.actor import as_the_driver_ends, connect, ray_driver, start_writer
from ray_cmf.binding import SeriesKey
from ray_cmf.buffer import TRAIN_RANK, MetricBuffer, flush_every_buffer
from ray_cmf.client import Reply, WriterClient
from ray_cmf.cmf import Cmf
from ray_cmf.connection import without_password
from ray_cmf.constants import (
    DEFAULT_FLUSH_ROWS,
    DEFAULT_FLUSH_SECONDS,
    DEFAULT_SYSTEM_METRICS_SECONDS,
    ERROR_PROPERTY,
    HAND_OVER_WAIT_S,
    MODEL_TYPE,
    RANKED_BY_PROPERTY,
    RANKED_MODE_PROPERTY,
    RESTARTED_FROM_PROPERTY,
    RESULTS_METRICS_NAME,
    STOPPED_PROPERTY,
    TRIAL_EXECUTION_TYPE,
)
from ray_cmf.environment import Environment, capture
from ray_cmf.errors import RayCmfError, exception_of, recorded_error
from ray_cmf.exits import error_properties, on_thread_end
from ray_cmf.lineage import observed_config_properties, owner_of
from ray_cmf.node_sampler import (
    HAND_OVER_AT_END_S,
    Watch,
    handed_over,
    start_samplers,
    wait_for_samplers,
    watch,
)
from ray_cmf.results import MODEL_PATH, TUNE_OWN, KindsAcrossTrials, append_result, result_row
from ray_cmf.store import Store
from ray_cmf.system import SystemSampler, sample_into
from ray_cmf.writer import StoreWriter

log = logging.getLogger(__name__)

_TRIAL_CMFS: dict[str, Cmf] = {}
_HAND_OVER = "_ray_cmf_hand_over"  # on a Tune session object: the hand-over of the trial it runs now


def trial_cmf(
    trial_id: str,
    *,
    timeout: float = 60.0,
    system_metrics: float | None = DEFAULT_SYSTEM_METRICS_SECONDS,
    **buffer_options: Any,
) -> Cmf:
    """The Cmf of a trial (cached per process), bound to the execution that CmfRayLogger created for it.

    Works in the trial's own process, on any node, and on the driver (which holds every trial's at once:
    cmflib's ``logger.cmf_obj[trial_id]``). Waits up to ``timeout`` seconds for
    the callback to register the trial (it may start before Tune calls ``on_trial_start``), and not at all
    while no CmfRayLogger's sweep runs.
    ``buffer_options`` (``flush_rows``, ``flush_seconds``) apply to the series it logs.

    Asked for on a thread other than the main one (Tune runs a trainable on a thread of its own), it also
    records the host's hardware, samples the ``system_metrics`` series every ``system_metrics`` seconds
    (None: off; and never when ``CmfRayLogger(system_metrics=...)`` samples the trial's process already),
    and closes when that thread ends: rows the trainable never committed reach the writer, which commits
    them at the trial's end.
    """
    if trial_id in _TRIAL_CMFS:
        return _TRIAL_CMFS[trial_id]
    if not ray_driver():  # a trial's process now runs another trial (Tune reuses actors): hand over
        for ended in list(_TRIAL_CMFS):
            _TRIAL_CMFS.pop(ended).close()
    if _running(tune.Trainable.__init__) is not None:  # its setup(): before Tune starts the trial
        raise RayCmfError(
            f"The Cmf of trial {trial_id!r} was asked for in a tune.Trainable's setup(), which runs before Tune "
            "starts the trial and CmfRayLogger registers it: ask for it in step() (or later) instead"
        )
    writer = connect()
    in_trial = threading.current_thread() is not threading.main_thread()  # Tune's thread for the trainable
    trainable = _running(tune.Trainable.train)  # a tune.Trainable's step() asks (on its actor's main thread)
    here = capture(code=False, software=False) if in_trial else None
    own = None if ray_driver() else trainable.trial_id if trainable is not None else tune.get_context().get_trial_id()
    foreign = own is not None and own != trial_id  # cmflib's examples name trials themselves: no wait for those
    started = (in_trial or trainable is not None) and not foreign  # by the trial's own start, which joins this
    token = ray.get_runtime_context().get_actor_id() if started else None  # start's registration, not a failed one's
    try:
        joined = writer.wait_for_trial(
            StoreWriter.join, trial_id, 0.0 if foreign else timeout, environment=here, token=token
        )
    except RayCmfError:
        if not foreign:
            raise
        raise RayCmfError(
            f"{trial_id!r} is no trial of this sweep; Tune names this trial {own!r}: ask for "
            "ray_cmf.tune.get_cmf(), or logger.cmf_obj[ray.tune.get_context().get_trial_id()]"
        ) from None
    cmf = _TRIAL_CMFS[trial_id] = Cmf.joined(writer, joined, **buffer_options)
    if trainable is not None:
        _flush_at_saves(trainable)
        _hand_over_at_stop(trainable)
        _hand_over_at_restarts(trainable)
    if in_trial:
        interval = None if joined.node_sampled else system_metrics
        flush_seconds = buffer_options.get("flush_seconds", DEFAULT_FLUSH_SECONDS)
        sampler = sample_into(writer, SeriesKey.system(joined.binding), interval, flush_seconds=flush_seconds)
        hand_over = _HandOver(trial_id, cmf, sampler)
        _before_tune_stops(hand_over)
        on_thread_end(hand_over)
    return cmf


@dataclass
class _HandOver:
    """The trainable ended (returned or raised): its rows go to the writer before Tune learns it, and the
    writer commits them when the driver reports the trial's end. Runs once."""

    trial_id: str
    cmf: Cmf
    sampler: SystemSampler | None
    done: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    def flush(self) -> None:
        """The trainable reports a checkpoint: every row it logged before must reach the store first, since a
        restore from that checkpoint never logs them again (not even after the driver is killed)."""
        if not self.done:
            self.cmf.flush()

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        if _TRIAL_CMFS.get(self.trial_id) is self.cmf:
            del _TRIAL_CMFS[self.trial_id]
        steps = [("stop sampling its process", self.sampler.stop)] if self.sampler is not None else []
        steps += [("record its seeds", self.cmf.log_seeds), ("hand over its rows", self.cmf.close)]
        try:
            for what, step in steps:  # torch's seed as the trainable left it, then its rows
                try:
                    step()
                except Exception as exc:  # logging never fails the trial: what is not handed over stays spilled
                    log.warning(
                        "ray_cmf: trial %s could not %s (%s); rows it did not hand over stay spilled, for the "
                        "trial's end or `ray-cmf recover`",
                        self.trial_id,
                        what,
                        exception_of(str(exc)),
                    )
        finally:
            self.finished.set()


def _before_tune_stops(hand_over: _HandOver) -> None:
    """Make the trial's hand-over finish before Tune can stop its process, however the trainable ends, and
    its rows reach the store at each checkpoint it reports.

    Tune learns of a return from a last report that its wrapper makes on the trainable's thread: the
    hand-over runs at that report. A trial that Tune stops (a stop criterion, a scheduler) ends its thread
    only when ``finish`` lets it go, and Tune does not wait for that thread: ``finish`` then waits, up to
    :data:`HAND_OVER_WAIT_S`, for the hand-over that the thread's end runs. An error reaches Tune only
    after the thread is gone. (This wraps two methods of Ray's private session object, once: a process
    that Tune reuses keeps its session, and the wrappers run the hand-over of the trial it runs now;
    without a session, the thread's end is the only hook.)
    """
    try:
        from ray.train._internal.session import get_session
        from ray.tune.result import RESULT_DUPLICATE
    except ImportError:
        return
    session = get_session()
    report, finish = getattr(session, "report", None), getattr(session, "finish", None)
    if session is None or report is None or finish is None:
        return
    wrapped = hasattr(session, _HAND_OVER)  # Tune reuses this process, and its session, for another trial
    setattr(session, _HAND_OVER, hand_over)
    if wrapped:
        return

    @functools.wraps(report)
    def report_after_hand_over(metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if RESULT_DUPLICATE in metrics:
            getattr(session, _HAND_OVER)()
        elif (args[0] if args else kwargs.get("checkpoint")) is not None:  # a restore resumes from here
            getattr(session, _HAND_OVER).flush()
        return report(metrics, *args, **kwargs)

    @functools.wraps(finish)
    def finish_after_hand_over(*args: Any, **kwargs: Any) -> Any:
        try:
            return finish(*args, **kwargs)  # lets a stopped trainable's thread go: it hands over as it ends
        finally:
            getattr(session, _HAND_OVER).finished.wait(HAND_OVER_WAIT_S)

    session.report = report_after_hand_over  # type: ignore[method-assign]  # this session object only
    session.finish = finish_after_hand_over  # type: ignore[method-assign]


def get_cmf(
    *,
    timeout: float = 60.0,
    flush_rows: int = DEFAULT_FLUSH_ROWS,
    flush_seconds: float = DEFAULT_FLUSH_SECONDS,
    system_metrics: float | None = DEFAULT_SYSTEM_METRICS_SECONDS,
) -> Cmf:
    """Inside a Tune trainable: this trial's Cmf, for per-step ``log_metric`` and ``commit_metrics``.

    It works on any node of the cluster: rows travel to the driver's writer through Ray, every
    ``flush_rows`` rows or ``flush_seconds`` seconds. The trial's process is sampled into the
    ``system_metrics`` series every ``system_metrics`` seconds (None: off); see :func:`trial_cmf`.

    Example (inside a Tune trial; ``examples/tune_sweep.py`` runs one)::

        def trainable(config):
            cmf = ray_cmf.tune.get_cmf()
            cmf.log_seeds(numpy=config["seed"])
            for step in range(10_000):
                cmf.log_metric("steps", {"step": step, "loss": loss})
            cmf.commit_metrics("steps")
    """
    trial_id = tune.get_context().get_trial_id()
    if trial_id is None:
        raise RayCmfError(
            "get_cmf() runs inside a Tune function trainable; in a tune.Trainable subclass, call "
            "ray_cmf.tune.trial_cmf(self.trial_id) in step(); outside Tune, use ray_cmf.Cmf(...)"
        )
    return trial_cmf(
        trial_id,
        timeout=timeout,
        system_metrics=system_metrics,
        flush_rows=flush_rows,
        flush_seconds=flush_seconds,
    )


def _flush_at_saves(trainable: tune.Trainable) -> None:
    """Make a ``tune.Trainable``'s rows reach the store as Tune saves its checkpoint, since a retry or a
    restore resumes from it and never logs them again (a function trainable's do as it reports one; see
    :func:`_before_tune_stops`). Wraps, on the instance, the method through which ``Trainable.save`` reports
    the checkpoint it wrote: Ray binds an actor's methods, ``save`` among them, as it starts it, and the one
    that ``save`` calls on ``self`` is Ray's private API (without it, rows reach the store every
    ``flush_seconds``)."""
    name = "_report_class_trainable_checkpoint"
    report = getattr(trainable, name, None)
    if report is None or name in vars(trainable):  # wrapped already (Tune reuses it for another trial)
        return

    @functools.wraps(report)
    def report_after_flush(*args: Any, **kwargs: Any) -> Any:
        cmf = _TRIAL_CMFS.get(report.__self__.trial_id)  # the trial it runs now
        if cmf is not None:
            cmf.flush()
        return report(*args, **kwargs)

    setattr(trainable, name, report_after_flush)


def _hand_over_at_stop(trainable: tune.Trainable) -> None:
    """Make a ``tune.Trainable``'s rows reach the writer as Tune stops it (it completed, raised or was cut),
    before its own ``cleanup``: Tune does not wait for the process's exit, where they would go otherwise.
    Wraps ``cleanup`` on the instance, which ``Trainable.stop`` calls on ``self`` (Ray binds ``stop`` itself as
    it starts the actor); the wrapper hands over the trial the instance runs then (Tune may reuse it)."""
    if "cleanup" in vars(trainable):  # wrapped already
        return
    cleanup = trainable.cleanup

    @functools.wraps(cleanup)
    def cleanup_after_hand_over() -> None:
        cmf = _TRIAL_CMFS.get(trainable.trial_id)
        if cmf is not None:
            _HandOver(trainable.trial_id, cmf, None)()
        cleanup()

    trainable.cleanup = cleanup_after_hand_over  # type: ignore[method-assign]


def _hand_over_at_restarts(trainable: tune.Trainable) -> None:
    """Make a trial that Tune starts again in this instance (``reuse_actors``: PBT pauses a trial and resumes
    it in the actor it had, from another trial's checkpoint) hand over the Cmf it holds, which is bound to the
    attempt before: the next ``trial_cmf()`` joins the new attempt, whose rows replace the steps it logs again.
    Wraps, on the instance, ``reset_config`` and ``load_checkpoint``, which ``Trainable.reset`` and ``restore``
    (bound by Ray as it starts the actor) call on ``self``."""
    for name in ("reset_config", "load_checkpoint"):
        if name in vars(trainable):  # wrapped already
            continue
        method = getattr(trainable, name)

        @functools.wraps(method)
        def after_hand_over(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            for trial_id, cmf in list(_TRIAL_CMFS.items()):  # a trial's process holds the Cmf of the trial it ran
                _HandOver(trial_id, cmf, None)()
            return __method(*args, **kwargs)

        setattr(trainable, name, after_hand_over)


def _running(method: Any) -> Any:
    """The ``self`` of ``method`` (of ``tune.Trainable``) where it runs on this thread's stack, else None."""
    code = method.__code__
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame.f_locals.get("self") if frame is not None else None


def _actor_id(trial: Any) -> str | None:
    """What names a start of a trial: the id of the actor Tune started it in (a retry gets another)."""
    actor = trial.temporary_state.ray_actor
    return actor._actor_id.hex() if actor is not None else None


class TrialCmfs(Mapping[str, Cmf]):
    """cmflib's ``logger.cmf_obj``: trial id -> that trial's Cmf (built on first access, in any process)."""

    def __init__(self, logger: CmfRayLogger) -> None:
        self._logger = logger

    def __getitem__(self, trial_id: str) -> Cmf:
        return trial_cmf(trial_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._logger._trials)

    def __len__(self) -> int:
        return len(self._logger._trials)


_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def last_failure(error_file: str) -> str | None:
    """The last failure in a trial's error file, where Tune appends each failure under a ``Failure # N
    (occurred at ...)`` line, as the trial records it (see ``recorded_error``). Ray colours its first line
    for terminals; the colour codes are dropped."""
    try:
        text = Path(error_file).read_text(errors="replace")
    except OSError:
        return None
    _, header, last = text.rpartition("Failure # ")
    body = _COLOURS.sub("", last.partition("\n")[2] if header else last)
    return recorded_error(body) or None


@dataclass
class _TrialState:
    """What the driver keeps per trial; ``persisted()`` is what survives a Tune restore (the attempt is not:
    the store counts a trial's starts, see :meth:`StoreWriter.bind`)."""

    ranked: list[tuple[float, float | None]] = field(default_factory=list)  # (step, value) of the ranked metric
    started: bool = False  # a start (or a retry, a restore) whose first result is still to come
    committed: bool = False
    binding: Reply | None = None  # the trial's registration with the writer
    buffer: MetricBuffer | None = None
    key: Callable[[], SeriesKey] | None = None  # the results series, once the registration is done
    models: dict[str, tuple[int, int]] = field(default_factory=dict)  # logged model files: (mtime_ns, size) then
    host: str | None = None  # where the trial runs, from its results
    keys: set[str] = field(default_factory=set)  # what its results held
    watch: Watch | None = None  # its process, as its node's sampler samples it
    tag: str | None = None  # Tune's experiment tag: a trial restart_errored makes keeps the one it replaces
    stopped: bool = False  # Tune decided to stop it at its latest result (a scheduler, a stop criterion)

    def persisted(self) -> dict[str, Any]:
        return {"ranked": list(self.ranked), "committed": self.committed, "tag": self.tag}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled from a Tune experiment that an earlier version saved: the fields added since take their
        defaults."""
        self.__dict__.update({**_TrialState().__dict__, **state})

    def rank(self, step: Any, value: Any) -> None:
        """Note a result's value of the ranked metric at ``step``, as the series reads (see
        :func:`ray_cmf.attempts.dedup_attempts`): the first result of a retry or a restore supersedes what
        earlier attempts reported from its step on."""
        at = float(step) if isinstance(step, int | float) and not isinstance(step, bool) else math.nan
        if not math.isfinite(at):
            at = self.ranked[-1][0] + 1 if self.ranked else 1.0
        if self.started:
            self.started = False
            self.ranked = [(s, v) for s, v in self.ranked if s < at]
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        self.ranked.append((at, float(value) if number else None))

    def best(self, mode: str) -> float | None:
        """The best finite value of the ranked metric in the results as they stand."""
        values = [v for _, v in self.ranked if v is not None]
        return (min(values) if mode == "min" else max(values)) if values else None


def _unwatch(state: _TrialState) -> Any:
    """Stop sampling the trial's process: start the hand-over of its last sample and rows (a Ray object to
    wait for, see :func:`~ray_cmf.node_sampler.handed_over`), or None when it was not sampled."""
    found, state.watch = state.watch, None
    if found is None:
        return None
    try:
        return found.stop()
    except Exception as exc:  # the node's sampler is gone with its node
        log.warning("ray_cmf: the trial's last system sample was not taken: %s: %s", type(exc).__name__, exc)
        return None


def _index_of(name: str, digits: str) -> int | None:
    """The trial index that ``digits`` (a part of a trial's ``name``) holds, if they are digits."""
    return int(digits) if digits.isdecimal() and digits != name else None


def _ranked_of(saved: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """A trial's ranked results from a saved experiment state (one of an earlier version kept only the best,
    which then stands before every step)."""
    if "ranked" in saved:
        return [(float(step), value) for step, value in saved["ranked"]]
    return [(-math.inf, saved["best"])] if saved.get("best") is not None else []


@dataclass
class _Runtime:
    """The logger's live parts, made in ``setup`` on the driver and never pickled."""

    writer: WriterClient
    environment: Environment = field(default_factory=lambda: capture(hardware=False))  # the driver's code and software
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="ray_cmf-commit")
    )
    futures: list[Future[None]] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    trials: list[Any] = field(default_factory=list)  # the sweep's trials (Tune's own list, which it keeps current)
    warned_metric: bool = False
    kinds: KindsAcrossTrials = field(default_factory=KindsAcrossTrials)  # what each result key is, across trials


def _existing(argument: str, path: str | os.PathLike[str]) -> str:
    """``path`` made absolute, if it exists (here, on the driver, before any trial starts)."""
    found = os.path.abspath(path)
    if not os.path.exists(found):
        raise ValueError(
            f"{argument}={os.fspath(path)!r} does not exist (looked for {found}); CmfRayLogger logs it as every "
            f"trial's input dataset: create it, or leave {argument} out"
        )
    return found


_hook = never_raises("the sweep")


def _hand_over_rows_of(trials: list[Any]) -> None:
    """Have each running trial's process hand the rows it logged to the writer (Ray stops it with the driver
    that ends, and a trial hands them over only as it ends itself); a trial busy past a moment keeps those
    rows in its spill, for ``recover``."""
    import ray

    actors = [t.temporary_state.ray_actor for t in trials if t.status == "RUNNING"]
    calls = [actor.__ray_call__.remote(_flush_every_buffer) for actor in actors if actor is not None]
    ray.wait(calls, num_returns=len(calls), timeout=HAND_OVER_AT_END_S)


def _flush_every_buffer(_: Any) -> None:
    """In a trial's process (its actor, the argument): every open buffer's rows to the writer."""
    flush_every_buffer()


# What CmfRayLogger.__init__ sets that a logger pickled by an earlier version may lack (see its __setstate__):
# the defaults, of its arguments or of its own state.
_RESTORED_DEFAULTS: dict[str, Any] = {
    "pipeline_stage": None,
    "metrics_name": RESULTS_METRICS_NAME,
    "data_dir": None,
    "flush_rows": DEFAULT_FLUSH_ROWS,
    "flush_seconds": DEFAULT_FLUSH_SECONDS,
    "push": False,
    "system_metrics": DEFAULT_SYSTEM_METRICS_SECONDS,
    "_sweep": None,
    "_restored": False,
}


class CmfRayLogger(tune.Callback):
    """Tune callback: a buffer and an MLMD execution per trial, a versioned Parquet per trial on completion.

    Accepts cmflib's ``CmfRayLogger`` arguments. Hooks return in microseconds: rows go to in-memory
    buffers, writes go to the single writer actor, Parquet files are finished on a driver thread.

    Args:
        pipeline_name: Pipeline (parent) context.
        file_path: The MLMD database (cmflib's meaning): a SQLite file, or a ``postgresql://`` / ``mysql://`` URL;
            default ``<store>/mlmd.sqlite`` (or what the store's config file names).
        pipeline_stage: Stage (child) context; default: the Tune experiment's name.
        data_dir: Dataset file or directory logged as every trial's input.
        metric: Result key whose best value is recorded per trial and ranks the top-N.
        order: ``"min"`` or ``"max"`` for ``metric`` (``mode`` is an alias).
        top_n: Mark the best N trials with ``in_top_n=True`` at experiment end.
        store: Store directory (default ``$RAY_CMF_STORE`` or ``./cmf_store``).
        mode: Alias of ``order``.
        metrics_name: Name of the per-trial result series.
        push: Upload each committed file to the store's remote (``ray-cmf push --add-remote``) as it is
            committed, on the writer's background thread; the sweep's end waits for the uploads.
        system_metrics: Sample every trial's process and node into its ``system_metrics`` series every
            this many seconds (and once as it starts and ends), from a sampler actor on the trial's node:
            the trainable needs no code for it. None switches that sampler off: a trainable that calls
            ``get_cmf()`` then samples its own process (every ``get_cmf(system_metrics=...)`` seconds, 10 by
            default; ``get_cmf(system_metrics=None)`` as well turns sampling off).
        modes: ``{result key: "min" | "max"}``: whether lower or higher is better for other results than
            ``metric`` (``{"val_acc": "max"}``), recorded with every trial, so that reading the sweep gives
            ``val_acc_best`` as the highest; a key none declares reads as ``min``.

    Example (``examples/tune_sweep.py`` runs one)::

        tuner = tune.Tuner(
            trainable,
            param_space={"lr": tune.loguniform(1e-4, 1e-1)},
            run_config=tune.RunConfig(callbacks=[CmfRayLogger("sweep", metric="loss", mode="min", top_n=3)]),
        )
    """

    def __init__(
        self,
        pipeline_name: str = "ray_tune",
        file_path: str | os.PathLike[str] | None = None,
        pipeline_stage: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        metric: str | None = None,
        order: str | None = None,
        top_n: int | None = None,
        *,
        store: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        metrics_name: str = RESULTS_METRICS_NAME,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        push: bool = False,
        system_metrics: float | None = DEFAULT_SYSTEM_METRICS_SECONDS,
        modes: Mapping[str, str] | None = None,
    ) -> None:
        if system_metrics is not None and not system_metrics > 0:
            raise ValueError(f"system_metrics must be > 0 seconds or None, got {system_metrics!r}")
        if order is not None and mode is not None and order != mode:
            raise ValueError(f"order={order!r} and mode={mode!r} disagree; pass one of them")
        mode = order if order is not None else mode
        declared = {} if modes is None else modes
        self._modes = mode_properties(declared)  # checked: a mapping of result keys to 'min' or 'max'
        if metric in TUNE_OWN:
            raise ValueError(f"metric={metric!r} is Tune's own bookkeeping, not the trainable's result: not recorded")
        if own := sorted(TUNE_OWN & declared.keys()):
            raise ValueError(f"modes[{own[0]!r}]: Tune's own bookkeeping is not recorded, so it has no best")
        if metric is not None and mode is not None and declared.get(metric, mode) != mode:
            raise ValueError(f"modes[{metric!r}]={declared[metric]!r} and mode={mode!r} disagree; pass one of them")
        mode = declared.get(metric, mode) if metric is not None else mode
        if mode is not None:
            check_mode(mode, "order/mode")
        if top_n is not None and (metric is None or top_n < 1):
            raise ValueError(f"top_n={top_n!r} needs a metric and must be >= 1")
        self.pipeline_name = check_name("pipeline_name", pipeline_name)
        self.pipeline_stage = check_name("pipeline_stage", pipeline_stage) if pipeline_stage is not None else None
        self.metrics_name = check_name("metrics_name", metrics_name)
        self.metric, self.mode, self.top_n = metric, mode or "min", top_n
        self.store = Store(store, mlmd=file_path)  # resolved here, on the driver
        self.store.require_lineage()
        self.root, self.mlmd = str(self.store.root), self.store.mlmd
        self.data_dir = _existing("data_dir", data_dir) if data_dir is not None else None
        self.flush_rows, self.flush_seconds = flush_rows, flush_seconds
        if push:
            self.store.require_remote()  # before any trial starts: a sweep never fails half-way for it
        self.push = push
        self.system_metrics = system_metrics
        self.cmf_obj = TrialCmfs(self)
        self._trials: dict[str, _TrialState] = {}
        self._runtime: _Runtime | None = None
        self._sweep: str | None = None  # this sweep's id: new for each fit, kept by a restore (see setup)
        self._restored = False
        self._replaceable: dict[str, str] = {}  # a restored experiment's trials by Tune experiment tag

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles callbacks with the Tuner, into the experiment directory: keep configuration and
        persisted trial state only, and no database password (a restored sweep takes it from PGPASSWORD,
        ~/.pgpass or MYSQL_PWD)."""
        state = self.__dict__.copy()
        state["mlmd"] = without_password(self.mlmd)
        state["store"] = Store(self.root, mlmd=state["mlmd"])
        state["_runtime"] = None
        state["_trials"] = {tid: _TrialState(**t.persisted()) for tid, t in self._trials.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled by ``Tuner.restore`` as the version that started the sweep pickled it: what an earlier version
        lacked takes the default that ``__init__`` gives now."""
        self.__dict__.update({**_RESTORED_DEFAULTS, "_modes": {}, "_replaceable": {}, **state})
        if "cmf_obj" not in state:
            self.cmf_obj = TrialCmfs(self)

    # -- runtime pieces (lazy: the object stays picklable until the sweep starts) --------------------
    @property
    def _rt(self) -> _Runtime:
        if self._runtime is None:
            writer = start_writer(self.store)
            if self.push:
                writer.call(StoreWriter.push_after_commit, store=self.store)
            self._runtime = _Runtime(writer)
        return self._runtime

    def _send(self, request: Any, **kwargs: Any) -> None:
        """A fire-and-forget request; failures are reported later as warnings."""
        replies = self._rt.replies
        replies.append(self._rt.writer.send(request, **kwargs))
        if len(replies) > 256:  # drop finished requests without blocking
            self._check([r for r in replies if r.done()])
            self._rt.replies = [r for r in replies if not r.done()]

    @staticmethod
    def _check(replies: list[Reply]) -> None:
        for reply in replies:
            try:
                reply.result()
            except Exception as exc:  # logging never kills training
                log.warning("ray_cmf: a store write failed: %s", exc)

    def _stage(self, trial: Any) -> str:
        return self.pipeline_stage or getattr(trial, "experiment_dir_name", None) or "tune"

    def _state(self, trial: Any, *, start: bool = False) -> _TrialState:
        """The trial's state, registered with the writer (once per driver, and again at each ``start``) and
        with an open buffer."""
        state = self._trials.setdefault(trial.trial_id, _TrialState())
        state.tag = trial.experiment_tag
        if state.binding is None or start:
            state.binding = self._rt.writer.send(
                StoreWriter.bind,
                kind="trial",
                name=trial.trial_id,
                pipeline=self.pipeline_name,
                stage=self._stage(trial),
                type_name=TRIAL_EXECUTION_TYPE,
                props=self._props(trial),
                store=self.store,
                data_dir=self.data_dir,
                environment=self._rt.environment,
                start=start,
                node_sampled=self.system_metrics is not None,
                sweep=self._sweep,
                token=_actor_id(trial) if start else None,
            )
        if state.buffer is None:
            binding = state.binding
            state.key = lambda: SeriesKey(binding.result(), self.metrics_name, attempts=True)
            sink = self._rt.writer.sink(state.key)
            state.buffer = MetricBuffer(
                sink=sink, flush_rows=self.flush_rows, flush_seconds=self.flush_seconds, reserved=TRAIN_RANK
            )
        return state

    def _props(self, trial: Any) -> dict[str, Any]:
        ranked = {RANKED_BY_PROPERTY: self.metric, RANKED_MODE_PROPERTY: self.mode} if self.metric else {}
        return {
            **observed_config_properties(trial.config, f"trial {trial.trial_id}"),
            "trial_id": trial.trial_id,
            "status": "RUNNING",
            "experiment": self._stage(trial),
            **self._modes,
            **ranked,  # so that reading the sweep ranks by the same mode
            **self._replaced(trial),
        }

    def _replaced(self, trial: Any) -> dict[str, str]:
        """``{restarted_from: id}`` for a trial that ``Tuner.restore(restart_errored=True)`` made anew in place
        of a failed one: Tune gives it a new id and the replaced trial's experiment tag. An earlier version saved
        no tags: the restored trial whose id ends in the index that the tag starts with (``<exp>_00001`` and
        ``1_lr=0.1``, as Tune numbers a sweep's trials) is then the one it replaces."""
        replaced = self._replaceable.get(trial.experiment_tag)
        index = _index_of(trial.experiment_tag, trial.experiment_tag.partition("_")[0])
        if replaced is None and index is not None:
            untagged = [tid for tid, state in self._trials.items() if state.tag is None]
            replaced = next((tid for tid in untagged if _index_of(tid, tid.rpartition("_")[2]) == index), None)
        return {RESTARTED_FROM_PROPERTY: replaced} if replaced not in (None, trial.trial_id) else {}

    # -- Tune hooks ----------------------------------------------------------------------------------
    @_hook
    def setup(self, **info: Any) -> None:
        """A sweep starts (after ``set_state``, on a restore): it gets an id of its own, so that trials whose
        Tune ids coincide with an earlier sweep's in the stage are new executions, not restores."""
        if not self._restored:
            self._sweep = uuid.uuid4().hex
        self._restored = False
        writer = self._rt.writer  # started before the samplers, which look it up as they start
        starting = start_samplers() if self.system_metrics is not None else []
        writer.call(StoreWriter.sweep_runs, sweep=self._sweep, running=True)  # before the first trial
        as_the_driver_ends(self._at_driver_end)
        wait_for_samplers(starting)

    @_hook
    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._rt.trials = trials
        state = self._trials.setdefault(trial.trial_id, _TrialState())
        state.committed, state.started = False, True
        if state.buffer is not None:  # Tune retries it (FailureConfig): the rows so far are the last attempt's
            earlier, state.buffer = state.buffer, None
            self._rt.futures.append(submit_or_run(self._rt.executor, earlier.close))  # handed over off the event loop
        self._state(trial, start=True)  # (re)register: marks the execution RUNNING, with its next attempt
        _unwatch(state)  # a retry Tune did not announce (on_trial_recover stops it otherwise)
        actor = trial.temporary_state.ray_actor
        if self.system_metrics is not None and actor is not None:
            state.watch = self._watch(actor, trial.trial_id, state.binding)

    def _watch(self, actor: Any, trial_id: str, binding: Reply | None) -> Watch | None:
        """Have the trial's node sample its process from the trial's registration on (a warning if it cannot).

        Here, before Tune runs the trial: a look-up in Ray's actor table (under a millisecond) and a request
        that waits for no reply. Done later, on a thread that may lag Tune, it found a short trial's process
        gone."""
        assert binding is not None and self.system_metrics is not None  # on_trial_start made both
        try:
            reply = binding.ref if binding.ref is not None else binding.result()  # in-process: done already
            return watch(actor, trial_id, reply, self.system_metrics, self.flush_seconds)
        except Exception as exc:
            log.warning("ray_cmf: the trial's process will not be sampled: %s: %s", type(exc).__name__, exc)
            return None

    @_hook
    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        state = self._state(trial)
        state.stopped = result.get("done") is True  # Tune's stop decision; a trainable's own end is not reported
        row = result_row(result)
        step = row.get("step", row.get("training_iteration"))  # what the results are keyed by when read
        append_result(state.buffer, row, f"trial {trial.trial_id}, result at step {step}")  # type: ignore[arg-type]
        self._rt.kinds.note(row, trial.trial_id)
        state.keys.update(row)
        if self.metric:
            state.rank(step, row.get(self.metric))
        self._record_host(state, result)
        model_path = result.get(MODEL_PATH)
        if isinstance(model_path, str) and model_path not in state.models:
            self._log_model(state, model_path)

    def _log_model(self, state: _TrialState, path: str) -> None:
        """Record a trial's model file (a result's ``model_path``) as an output, where the driver sees it; the
        writer hashes it. Once per version: see :meth:`_log_changed_models`."""
        try:
            stat = os.stat(path)
        except OSError:  # not (or no longer) there, or on another node
            return
        state.models[path] = (stat.st_mtime_ns, stat.st_size)
        self._send(StoreWriter.log_file, binding=state.binding, type_name=MODEL_TYPE, path=path, event="output")

    def _log_changed_models(self, state: _TrialState) -> None:
        """At a trial's end, record again each model file it wrote over since it was recorded: the version it
        left is the one ``ray-cmf verify`` finds there (the first one reads ``superseded``)."""
        for path, then in list(state.models.items()):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if (stat.st_mtime_ns, stat.st_size) != then:
                self._log_model(state, path)

    def _record_host(self, state: _TrialState, result: Mapping[str, Any]) -> None:
        """Record the host and node IP that Tune reports with each result, once per trial start (a trial that
        never asks for its Cmf records no hardware of its own)."""
        host = result.get("hostname")
        if isinstance(host, str) and host != state.host:
            state.host = host
            props = {"env_host": host, **({"env_node_ip": result["node_ip"]} if "node_ip" in result else {})}
            self._send(StoreWriter.update_binding, binding=state.binding, props=props)

    @_hook
    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        self._state(trial).buffer.seal()  # type: ignore[union-attr]  # rows up to a checkpoint survive a crash

    @_hook
    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """A trial ended without an error: by itself, or stopped by Tune. A trainable that returns ends with a
        last result Tune marks ``done`` (never shown to callbacks); a scheduler that cuts a trial by itself
        (HyperBand's ``stop_trial``) leaves its last result not ``done``: that trial was stopped."""
        if not (getattr(trial, "last_result", None) or {}).get("done"):
            self._state(trial).stopped = True
        self._end(trial, "COMPLETE")

    @_hook
    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """A trial failed and Tune will retry it: its failed start's process gets its last sample now, while it
        may still live (the retry's start hands over that start's rows)."""
        state = self._trials.get(trial.trial_id)
        if state is not None:
            _unwatch(state)

    @_hook
    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED", getattr(trial, "error_file", None))

    def _end(self, trial: Any, status: str, error_file: str | None = None, error: str | None = None) -> None:
        """Commit the trial's results, and what its in-trial series left uncommitted, on the commit thread
        (``error``: why it FAILED, where Tune wrote no ``error_file``)."""
        state = self._state(trial)
        if state.committed:
            return
        state.committed = True
        self._log_changed_models(state)
        stopped = state.stopped and status == "COMPLETE"
        props: dict[str, Any] = {"status": status, **({STOPPED_PROPERTY: True} if stopped else {})}
        props.update(error_properties(status, error))
        if self.metric is not None:
            best = state.best(self.mode)
            props[f"best_{self.metric}"] = best if best is not None else math.nan
            if state.keys and self.metric not in state.keys and not self._rt.warned_metric:
                self._rt.warned_metric = True  # a typo in metric= (once a sweep)
                log.warning(
                    "ray_cmf: CmfRayLogger(metric=%r) is not in the results of trial %s (they hold %s): no best "
                    "and no top-N can be recorded",
                    self.metric,
                    trial.trial_id,
                    sorted(state.keys),
                )
        buffer, key, state.buffer = state.buffer, state.key, None
        assert buffer is not None and key is not None  # _state() opened them
        sampled = _unwatch(state)
        commit = functools.partial(self._commit, buffer, key, props, status, sampled, error_file)
        self._rt.futures.append(submit_or_run(self._rt.executor, commit))

    def _commit(
        self,
        buffer: MetricBuffer,
        key: Callable[[], SeriesKey],
        props: dict[str, Any],
        status: str,
        sampled: Any,
        error_file: str | None,
    ) -> None:
        """Runs on the commit thread: never on Tune's event loop (``error_file``: what Tune wrote of the trial's
        failures, read here)."""
        error = last_failure(error_file) if error_file else None
        if error:
            props = {**props, ERROR_PROPERTY: error}
        if sampled is not None:
            handed_over(sampled, HAND_OVER_WAIT_S)  # the system metrics reach the writer before the end
        buffer.close()  # every row is with the writer now
        series = key()
        try:
            if buffer.rows:
                self._rt.writer.call(StoreWriter.commit, key=series)
        finally:  # also where the commit failed: the writer notes how the trial ended, for `recover`
            self._rt.writer.call(StoreWriter.end, binding=series.binding, props=props, state=status)

    @_hook
    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Commit every trial not yet committed, mark the top-N, and wait for the writer to drain.

        A trial that Tune did not report complete or failed was still running when the experiment ended
        (Ctrl-C, ``time_budget_s``, a stopper's ``stop_all``): Tune stops it as TERMINATED, and it is
        recorded CANCELED, since it never finished.
        """
        self._finish(trials, "CANCELED")

    def _at_driver_end(self, state: str, error: str | None) -> None:
        """The driver ends before the experiment did (SIGTERM, which Tune answers by exiting without ending
        it; Ctrl-C twice; an error on Tune's event loop): its trials end as ``state``, with what they logged
        committed. A sweep that a later start in this process took over (a ``Tuner.restore`` after Ctrl-C
        twice, in a notebook) is that start's to end and rank."""
        if self._runtime is None:
            return
        trials = self._runtime.trials
        if any(self._started_again(trial) for trial in trials):
            self._leave()
            return
        log.warning("ray_cmf: the driver is ending (%s) before the sweep: its running trials end with it", state)
        _hand_over_rows_of(trials)
        self._finish(trials, state, error)

    def _started_again(self, trial: Any) -> bool:
        """Whether a later start of ``trial`` bound it with the writer since this logger did."""
        state = self._trials.get(trial.trial_id)
        if state is None or state.binding is None:
            return False
        try:
            ours = state.binding.result()
        except Exception:  # never bound: its end says why
            return False
        now = self._rt.writer.call(StoreWriter.binding, kind="trial", name=trial.trial_id)
        return now is not None and (now.execution_id, now.attempt) != (ours.execution_id, ours.attempt)

    def _finish(self, trials: list[Any], state: str, error: str | None = None) -> None:
        """End the sweep: every trial not yet committed ends as ``state`` (FAILED where Tune says it erred)."""
        if self._runtime is None:  # it ended already: the driver's end came after the experiment's
            return
        for trial in trials:
            if trial.trial_id in self._trials and not self._trials[trial.trial_id].committed:
                self._end(trial, "FAILED" if trial.status == "ERROR" else state, error=error)
        for future in self._rt.futures:
            try:
                future.result()
            except Exception as exc:  # its rows stay spilled, its end noted (see StoreWriter.end)
                log.warning(
                    "ray_cmf: committing a trial failed (%s); `ray-cmf recover` commits it once the store answers",
                    exception_of(str(exc)),
                )
        if self.top_n is not None:
            self._mark_top_n(trials)
        if self.push and (failed := self._rt.writer.call(StoreWriter.wait_for_pushes)):
            log.warning("ray_cmf: %d files were not pushed to the store's remote; run `ray-cmf push`", failed)
        self._send(StoreWriter.sweep_runs, sweep=self._sweep, running=False)
        self._check(self._rt.replies)
        self._leave()

    def _leave(self) -> None:
        """Stop this sweep's threads (after their work) and forget its run."""
        self._rt.executor.shutdown(wait=True)
        self._runtime = None

    def _mark_top_n(self, trials: list[Any]) -> None:
        bests = {t.trial_id: self._trials[t.trial_id].best(self.mode) for t in trials if t.trial_id in self._trials}
        sign = -1 if self.mode == "max" else 1  # ties go to the earlier trial, as in Sweep.best and trials
        ranked = sorted((sign * best, trial_id) for trial_id, best in bests.items() if best is not None)
        top = {trial_id: rank for rank, (_, trial_id) in enumerate(ranked[: self.top_n], start=1)}
        for trial in trials:
            if trial.trial_id not in self._trials:
                continue
            props = {"in_top_n": trial.trial_id in top, "top_rank": top.get(trial.trial_id, 0)}
            if (reply := self._trials[trial.trial_id].binding) is not None:
                self._send(StoreWriter.end, binding=reply, props=props)
            else:  # it ended before a restore, so this driver's writer never bound it: find it by name
                binding, _ = self._rt.writer.call(
                    StoreWriter.execution,
                    pipeline=self.pipeline_name,
                    stage=self._stage(trial),
                    type_name=TRIAL_EXECUTION_TYPE,
                    name=trial.trial_id,
                    store=self.store,
                    owner=owner_of(sweep=self._sweep),
                )
                self._send(
                    StoreWriter.update_execution, execution_id=binding.execution_id, props=props, store=binding.store
                )

    # -- Tune experiment checkpoints -----------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Persisted per-trial state; seals open buffers so a restore finds their rows in the store."""
        for state in self._trials.values():
            if state.buffer is not None:
                state.buffer.seal()
        return {"sweep": self._sweep, "trials": {tid: t.persisted() for tid, t in self._trials.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue a restored experiment: same executions, spilled rows adopted, attempts counted on (by the
        store: this state may be older than what the store holds). A state saved before sweeps had ids
        reopens the stage's trials of its ids, whoever's."""
        self._sweep, self._restored = state.get("sweep"), True
        self._trials = {
            tid: _TrialState(ranked=_ranked_of(saved), committed=saved.get("committed", False), tag=saved.get("tag"))
            for tid, saved in state.get("trials", {}).items()
        }
        self._replaceable = {t.tag: tid for tid, t in self._trials.items() if t.tag}
