"""The writer of a Ray job: one actor that the driver starts, pinned to the driver's node (where the store
lives) and living as long as the driver. Trials, Train workers and the Train controller find it by name
and never open a path of the store, so a cluster needs no shared filesystem.

ray is imported on use only, so ``import ray_cmf`` stays light.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ray_cmf.client import WriterClient
from ray_cmf.errors import RayCmfError
from ray_cmf.exits import outcome, track
from ray_cmf.store import Store
from ray_cmf.writer import StoreWriter

WRITER_NAME = "ray_cmf_writer"
_WRITER_THREADS = 8
# (job id, driver node id) -> the actor handle; the actor lives as long as this driver. The node id tells a
# Ray started again in the same process (a notebook's ray.shutdown() then ray.init()) from the one before:
# the job id is the same, the old actor is gone.
_DRIVER_WRITER: dict[tuple[str, str], Any] = {}
# job id -> the writer that a trial or worker process found by name (looked up once: Tune may run many
# trials in one process, and a lookup costs a round trip to Ray's control store)
_FOUND_WRITER: dict[str, WriterClient] = {}

log = logging.getLogger(__name__)


class WriterActor:
    """The writer as a Ray actor, with one method: a request names a :class:`StoreWriter` method.

    Every process that finds an actor builds its handle from the methods of the actor's class (their
    signatures, Ray's tracing wrappers); StoreWriter's thirty-odd made that about 4 ms more in every trial
    and Train worker than one method does.
    """

    def __init__(self) -> None:
        self._writer = StoreWriter()

    def request(self, method: str, /, **kwargs: Any) -> Any:
        """Run ``StoreWriter.<method>(**kwargs)`` (positional-only: many requests take a ``name``)."""
        if method.startswith("_"):
            raise RayCmfError(f"{method!r} is not a request of the ray_cmf writer")
        return getattr(self._writer, method)(**kwargs)


def ray_driver() -> bool:
    """Whether this process is a Ray driver (not a trial, a Train worker or the Train controller)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.SCRIPT_MODE


def start_writer(store: str | os.PathLike[str] | Store | None = None, *, mlmd: str | None = None) -> WriterClient:
    """On the driver: start this job's writer (or find it) on this node, and name its default store.

    ``CmfRayLogger`` and ``CmfTrainCallback`` call it; call it yourself before starting trials that log
    with ``ray_cmf`` when you use neither. The store is resolved here, on the driver (argument, else
    ``$RAY_CMF_STORE``, else ``./cmf_store``); trials and workers learn it from the writer. Train runs
    recorded through it that have not ended as the driver ends (SIGTERM, Ctrl-C) end with it, ``CANCELED``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init()
    if not ray_driver():
        raise RayCmfError("start_writer() runs on the Ray driver only; trials and workers find the driver's writer")
    store = store if isinstance(store, Store) else Store(store, mlmd=mlmd)
    node = ray.get_runtime_context().get_node_id()
    job = (ray.get_runtime_context().get_job_id(), node)
    if job not in _DRIVER_WRITER:
        _DRIVER_WRITER.clear()
        _DRIVER_WRITER[job] = (
            ray.remote(WriterActor)
            .options(
                name=WRITER_NAME,
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=_WRITER_THREADS,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote()
        )
    client = WriterClient(_DRIVER_WRITER[job])
    client.call(StoreWriter.configure, store=store)
    if _DRIVER_END.writer is None:
        track(_DRIVER_END)
    _DRIVER_END.writer = client
    return client


class _DriverEnd:
    """On a driver, as it ends (see :func:`ray_cmf.exits.track`): the trials and Train runs bound through its
    writer that have not ended were cut short (SIGTERM, which Tune answers by exiting at once; Ctrl-C, which
    Ray Train answers by aborting the run and returning). They end ``CANCELED``, or ``FAILED`` with the
    driver's uncaught exception, with what their series hold committed: Ray stops their processes with the
    driver, and no callback would."""

    def __init__(self) -> None:
        self.writer: WriterClient | None = None  # the writer the driver runs now (Ray may have been restarted)
        self.first: list[Callable[[], None]] = []  # what hands rows over first (the node samplers')
        self.enders: list[Callable[[str, str | None], None]] = []  # what ends the sweeps' trials (see below)

    def close(self) -> None:
        import ray

        if self.writer is None or not ray.is_initialized():  # ray.shutdown() ended the writer and the runs
            return
        for hand_over in self.first:
            try:
                hand_over()
            except Exception as exc:  # the runs end all the same
                log.warning("ray_cmf: rows of the ending driver's runs may be missing: %r", exc)
        state, error = outcome()
        state = "CANCELED" if state == "COMPLETE" else state  # a run that has not ended did not complete
        for end in self.enders:
            try:
                end(state, error)
            except Exception as exc:  # the others end all the same
                log.warning("ray_cmf: the ending driver's trials may be left RUNNING: %r", exc)
        ended = self.writer.call(StoreWriter.end_runs, state=state, error=error)
        if ended:
            log.warning("ray_cmf: the driver is ending (%s): Train runs %s end with it", state, ended)


_DRIVER_END = _DriverEnd()


def before_the_driver_ends(hand_over: Callable[[], None]) -> None:
    """Have ``hand_over`` run as the driver ends, before the runs that end with it are committed (once)."""
    if hand_over not in _DRIVER_END.first:
        _DRIVER_END.first.append(hand_over)


def as_the_driver_ends(end: Callable[[str, str | None], None]) -> None:
    """Have ``end(state, error)`` run as the driver ends, after the hand-overs and before the Train runs end
    (once): it ends what it owns that has not ended, as ``state`` (``CANCELED`` or ``FAILED``)."""
    if end not in _DRIVER_END.enders:
        _DRIVER_END.enders.append(end)


def connect(store: str | os.PathLike[str] | Store | None = None) -> WriterClient:
    """The writer for this process: the job's actor inside Ray (started here on the driver), else in-process.

    Raises:
        RayCmfError: In a trial or worker of a job whose driver started no writer.
    """
    import ray

    if not ray.is_initialized():
        return WriterClient(StoreWriter(store if isinstance(store, Store) else Store(store)))
    if ray_driver():
        return start_writer(store)
    job = ray.get_runtime_context().get_job_id()
    try:
        if job not in _FOUND_WRITER:
            _FOUND_WRITER[job] = WriterClient(ray.get_actor(WRITER_NAME))
        return _FOUND_WRITER[job]
    except ValueError:
        raise RayCmfError(
            "No ray_cmf writer runs in this Ray job. Start it on the driver: add ray_cmf.CmfRayLogger(...) to "
            "tune.RunConfig(callbacks=[...]), ray_cmf.CmfTrainCallback(...) to ray.train.RunConfig(callbacks=[...]), "
            "or call ray_cmf.start_writer(store) before starting trials."
        ) from None
