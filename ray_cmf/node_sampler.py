"""Resource metrics of trials whose trainables log nothing themselves: one sampler actor per node.

The driver's callback learns each trial actor's pid and node from Ray's control store, and asks the
sampler of that node (a Ray actor of 0 CPUs, started on demand and pinned there) to sample the process
into the trial's ``system_metrics`` series at the writer. No store path is opened on the node, so it
works on nodes that cannot see the store. A process is sampled by one sampler only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psutil

from ray_cmf.actor import connect
from ray_cmf.binding import SeriesKey
from ray_cmf.frames import PID_COLUMN
from ray_cmf.system import SystemSampler, sample_into

log = logging.getLogger(__name__)
SAMPLER_NAME = "ray_cmf_sampler"
_SAMPLERS: dict[tuple[str, str], Any] = {}  # (job id, node id) -> that node's sampler, for this driver


class NodeSampler:
    """Samples the processes it is asked to watch on its node, each into its own series (the actor class)."""

    def __init__(self) -> None:
        self._writer = connect()
        self._watched: dict[int, tuple[str, SystemSampler]] = {}  # pid -> (series, its sampler)

    def watch(self, key: SeriesKey, pid: int, interval: float) -> bool:
        """Sample process ``pid`` into ``key`` every ``interval`` s (a first row now); False if it is gone.

        A process that Tune reuses for another trial moves to that trial's series.
        """
        self._stop(pid)
        if not psutil.pid_exists(pid):
            return False
        sampler = sample_into(self._writer, key, interval, {PID_COLUMN: pid}, pid)
        assert sampler is not None  # an interval was given
        self._watched[pid] = (key.spill_name, sampler)
        return True

    def unwatch(self, key: SeriesKey) -> int:
        """Take the last row of the process that ``key`` samples and hand its rows to the writer; returns the
        rows sampled (0 when none was watched)."""
        for pid, (series, _) in list(self._watched.items()):
            if series == key.spill_name:
                return self._stop(pid)
        return 0

    def _stop(self, pid: int) -> int:
        watched = self._watched.pop(pid, None)
        if watched is None:
            return 0
        watched[1].stop()
        return watched[1].samples


@dataclass(frozen=True)
class Watch:
    """A process that a node's sampler samples into a series (what :func:`unwatch` needs)."""

    sampler: Any  # the node's NodeSampler actor
    key: SeriesKey


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
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote()
        )
    return _SAMPLERS[where]


def start_samplers() -> None:
    """On the driver, as a sweep starts: start the sampler of every live node without waiting, so that even
    the first trials there, however short, are sampled from their start (nodes that join later get theirs
    on first use)."""
    import ray

    for node in ray.nodes():
        if node.get("Alive"):
            _sampler(node["NodeID"])


def watch(actor: Any, key: SeriesKey, interval: float) -> Watch | None:
    """On the driver: have the sampler of ``actor``'s node sample its process into ``key``. Returns None when
    the actor's process is unknown (it ended already)."""
    process = actor_process(actor)
    if process is None:
        return None
    pid, node = process
    sampler = _sampler(node)
    sampler.watch.remote(key, pid, interval)
    return Watch(sampler, key)


def unwatch(watched: Watch, timeout: float) -> int:
    """On the driver: the last row of a watched process, and every row of it at the writer; returns the
    rows sampled (0 when the sampler did not answer within ``timeout`` seconds: a warning)."""
    import ray

    try:
        return int(ray.get(watched.sampler.unwatch.remote(watched.key), timeout=timeout))
    except Exception as exc:
        log.warning("ray_cmf: the system metrics of %s were not handed over: %s", watched.key.spill_name, exc)
        return 0
