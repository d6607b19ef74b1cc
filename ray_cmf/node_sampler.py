"""Resource metrics of trials whose trainables log nothing themselves: one sampler actor per node.

The driver's callback learns each trial actor's pid and node from Ray's control store, and asks the
sampler of that node (a Ray actor of 0 CPUs, started on demand and pinned there) to sample the process
into the trial's ``system_metrics`` series at the writer. No store path is opened on the node, so it
works on nodes that cannot see the store. A process is sampled by one sampler only.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

import psutil

from ray_cmf.actor import before_the_driver_ends, connect
from ray_cmf.binding import Binding, SeriesKey
from ray_cmf.constants import DEFAULT_FLUSH_SECONDS, SYSTEM_METRICS_NAME
from ray_cmf.errors import RayCmfError
from ray_cmf.system import SystemSampler, node_gpus, sample_into

log = logging.getLogger(__name__)
SAMPLER_NAME = "ray_cmf_sampler"
SAMPLER_THREADS = 8  # requests a node's sampler runs at once (see NodeSampler)
_SAMPLERS: dict[tuple[str, str], Any] = {}  # (job id, node id) -> that node's sampler, for this driver


class NodeSampler:
    """Samples the processes it is asked to watch on its node, each into its own series (the actor class).

    Requests run on several threads: the hand-over of a trial's rows waits for the writer (busy with that
    trial's end), and a trial that starts meanwhile must be watched at once, before its process may be
    gone. A trial's ``unwatch`` takes its ``watch``'s reply as an argument, so it runs after it.
    """

    def __init__(self) -> None:
        self._watched: dict[str, tuple[int, SystemSampler]] = {}  # trial -> (its pid, its sampler)
        self._stopping = 0  # unwatched samplers that are handing their rows over
        self._lock = threading.Lock()  # guards both
        self._stopped = threading.Condition(self._lock)  # an unwatched sampler has handed its rows over

    def ready(self) -> bool:
        """Answers once the actor is up and has found the writer and its node's GPUs (see
        :func:`start_samplers`): a trial's first row then waits for neither, and a short trial is not gone by
        the time it is taken."""
        connect()
        node_gpus()
        return True

    def watch(
        self,
        trial: str,
        binding: list[Any],
        pid: int,
        interval: float,
        instance: str = "",
        extra: dict[str, Any] | None = None,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
    ) -> bool:
        """Sample process ``pid`` (a first row now, then densely at first, then every ``interval`` s) into the
        ``system_metrics`` series of ``binding[0]`` (of ``instance`` when given, with the ``extra`` columns): a
        Binding, or the ObjectRef of the reply that makes it, resolved only when the first rows are handed over
        (so that sampling starts now). False if the process is gone. A process that Tune reuses for another
        trial moves to that trial's series. ``trial`` names the watch for :meth:`unwatch`; ``flush_seconds``:
        how often its rows are handed to the writer (see :func:`~ray_cmf.system.sample_into`)."""
        with self._lock:
            moved = [self._watched.pop(t)[1] for t, (watched, _) in list(self._watched.items()) if watched == pid]
        for sampler in moved:  # its process lives on: the new trial's first row can wait for the hand-over
            sampler.stop()
        if not psutil.pid_exists(pid):
            return False
        key = functools.partial(_system_key, binding[0], instance)  # connect(): the writer, looked up once per job
        started = sample_into(connect(), key, interval, extra, pid, ramp=True, flush_seconds=flush_seconds)
        assert started is not None  # an interval was given
        with self._lock:
            self._watched[trial] = (pid, started)
        return True

    def unwatch(self, trial: str, watched: bool) -> int:
        """Take the last row of the process sampled for ``trial`` and hand its rows to the writer; returns
        the rows sampled (0 when none was watched). ``watched``: the reply of the trial's :meth:`watch`."""
        with self._lock:
            found = self._watched.pop(trial, None)
            if found is None:
                return 0
            self._stopping += 1
        try:
            found[1].stop()
        finally:
            with self._lock:
                self._stopping -= 1
                self._stopped.notify_all()
        return found[1].samples

    def hand_over(self) -> None:
        """The driver is ending, and this actor with it: stop sampling every watched process, and wait until
        the writer holds all their rows (those that an ``unwatch`` is handing over too)."""
        with self._lock:
            samplers = [sampler for _, sampler in self._watched.values()]
            self._watched.clear()
        for sampler in samplers:
            sampler.stop()
        with self._stopped:
            self._stopped.wait_for(lambda: not self._stopping)


@dataclass(frozen=True)
class Bound:
    """A trial or run named, not yet bound: its samples wait for whoever binds it (see :func:`watch_process`),
    with ``token`` if given (see :meth:`StoreWriter.binding`)."""

    kind: str
    name: str
    token: str | None = None


BOUND_WAIT_S = (
    24 * 3600.0
)  # how long the samples of a named run wait for its binding (its first report, at worst its end)


def _system_key(binding: Any, instance: str) -> SeriesKey:
    import ray

    if isinstance(binding, Bound):
        found = connect().wait_binding(binding.kind, binding.name, BOUND_WAIT_S, binding.token)
        if found is None:
            raise RayCmfError(f"The {binding.kind} {binding.name!r} was never bound: its system metrics are lost")
        binding = found
    bound = binding if isinstance(binding, Binding) else ray.get(binding)
    return SeriesKey(bound, SYSTEM_METRICS_NAME, instance) if instance else SeriesKey.system(bound)


@dataclass(frozen=True)
class Watch:
    """A process that a node's sampler samples for a trial (what :meth:`stop` needs)."""

    sampler: Any  # the node's NodeSampler actor
    trial: str
    started: Any  # the ObjectRef of the sampler's watch reply

    def stop(self) -> Any:
        """Start the hand-over of its last row and all its rows (see :func:`handed_over`); never waits."""
        return self.sampler.unwatch.remote(self.trial, self.started)


def actor_process(actor: Any) -> tuple[int, str] | None:
    """The pid and node id of a live Ray actor, from Ray's control store (GCS); None when unknown.

    Ray's public state API needs the dashboard, which sweeps often run without; this reads the same
    actor table through ``ray._private.state``.
    """
    from ray._private.state import actors

    info = actors(actor_id=actor._actor_id.hex())
    pid, node = info.get("Pid"), info.get("Address", {}).get("NodeID")
    return (int(pid), str(node)) if pid and node and info.get("State") == "ALIVE" else None


def _sampler(node: str) -> Any:
    """This job's sampler on ``node``, started there on first use (it lives as long as the driver)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = (ray.get_runtime_context().get_job_id(), node)
    if where not in _SAMPLERS:
        _SAMPLERS[where] = (
            ray.remote(NodeSampler)
            .options(
                name=f"{SAMPLER_NAME}_{node}",
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=SAMPLER_THREADS,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote()
        )
    return _SAMPLERS[where]


HAND_OVER_AT_END_S = 10.0  # how long the driver's end waits for its nodes' samplers


def hand_over_samples_at_the_end() -> None:
    """On the driver: as it ends, every node's sampler of this job (whoever started it: the Train controller
    does) hands the samples it holds to the writer, for the runs and trials that end with the driver."""
    before_the_driver_ends(_hand_over_samples)


def _hand_over_samples() -> None:
    import ray

    names = [f"{SAMPLER_NAME}_{node['NodeID']}" for node in ray.nodes() if node.get("Alive")]
    found = []
    for name in names:
        try:
            found.append(ray.get_actor(name))
        except ValueError:  # no sampler on that node
            continue
    ray.get([sampler.hand_over.remote() for sampler in found], timeout=HAND_OVER_AT_END_S)


def start_samplers() -> list[Any]:
    """On the driver, as a sweep starts: start the sampler of every live node (nodes that join later get
    theirs on first use). Returns what :func:`wait_for_samplers` waits for."""
    import ray

    return [_sampler(node["NodeID"]).ready.remote() for node in ray.nodes() if node.get("Alive")]


SAMPLERS_START_S = 60.0  # how long a sweep's or a Train run's start waits for its nodes' samplers


def wait_for_samplers(starting: list[Any], timeout: float = SAMPLERS_START_S) -> None:
    """Wait until the samplers are up, so that even the first trials, however short, are sampled from their
    start; a warning after ``timeout`` seconds (their trials are then sampled once they are up)."""
    import ray

    if not starting:
        return
    _, pending = ray.wait(starting, num_returns=len(starting), timeout=timeout)
    if pending:
        log.warning("ray_cmf: %d of %d node samplers did not start in %g s", len(pending), len(starting), timeout)


def watch(
    actor: Any, trial: str, binding: Any, interval: float, flush_seconds: float = DEFAULT_FLUSH_SECONDS
) -> Watch | None:
    """On the driver: have the sampler of ``actor``'s node sample its process for ``trial`` into the
    ``system_metrics`` series of ``binding`` (a Binding, or the ObjectRef of the reply that makes it;
    neither the driver nor the sampler waits for it), handing its rows over every ``flush_seconds``. None
    when the actor's process has ended already."""
    process = actor_process(actor)
    if process is None:
        return None
    name = f"{trial}@{actor._actor_id.hex()}"  # one per start
    return watch_process(*process, name, binding, interval, flush_seconds=flush_seconds)


def watch_process(
    pid: int,
    node: str,
    name: str,
    binding: Any,
    interval: float,
    instance: str = "",
    extra: dict[str, Any] | None = None,
    flush_seconds: float = DEFAULT_FLUSH_SECONDS,
) -> Watch:
    """Have the sampler of ``node`` sample process ``pid`` into the ``system_metrics`` series of ``binding``
    (a Binding, the ObjectRef of the reply that makes it, or a :class:`Bound` name; of ``instance``, with
    the ``extra`` columns), handing its rows over every ``flush_seconds``; ``name`` names the watch. Never
    waits."""
    sampler = _sampler(node)
    binding_ref = [binding]  # in a list: Ray passes the ref
    started = sampler.watch.remote(name, binding_ref, pid, interval, instance, extra, flush_seconds)
    return Watch(sampler, name, started)


def handed_over(stopping: Any, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for a :meth:`Watch.stop`; returns the rows sampled (0, and a warning,
    when the sampler did not answer)."""
    import ray

    try:
        return int(ray.get(stopping, timeout=timeout))
    except Exception as exc:
        log.warning("ray_cmf: a trial's system metrics were not all handed over: %s: %s", type(exc).__name__, exc)
        return 0
