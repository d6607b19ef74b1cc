"""Packed metric state: one contiguous float64 buffer, a region per reduction (sum, max, min).

Every state tensor of the packed metrics is a view into its reduction's region, so updates write
straight into the packed layout. Metrics of one kind form a group whose states are adjacent: each state
of a whole group is one ``(members, *shape)`` view, updated and computed by one op for all of them.
A sync snapshots the buffer into one of two preallocated copies (double buffering), resets the live
state, and reduces the copy: asynchronously on gloo (``async_op=True``), on a side stream ordered by CUDA
events on GPUs. Whatever the number of metrics, a sync is ONE collective when the gathered state is small
(an all_gather, then each region reduced locally: small collectives cost latency, not bandwidth), else at
most two all_reduces (sum, and max with the min region negated).
The ranks compare layouts once, on the first sync.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist

from ray_cmf.errors import RayCmfError

REDUCTIONS = ("sum", "max", "min")  # also the order of the regions in the packed buffer
_LOCAL: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}
STATE_DTYPE = torch.float64  # exact for counts up to 2**53, so one dtype (one buffer) for every state
GATHER_MAX_ELEMENTS = 1 << 16  # all_gather when world_size * state elements stays within this
T = TypeVar("T")
U = TypeVar("U")


class StateOwner(Protocol):
    """What a pack needs of a metric (``ray_cmf.metrics.base.Metric`` is one): its declared states, each a
    tensor attribute it owns, and whether they survive a sync."""

    _state_specs: dict[str, Any]
    cumulative: bool


class LayoutMismatchError(RayCmfError):
    """Ranks hold metric collections with different names, reductions or shapes."""


class CollectiveTimeoutError(RayCmfError):
    """A collective that every rank must join was not joined by the others in time (one rank called it)."""


COLLECTIVE_TIMEOUT_S = 300.0  # how long a blocking call that every rank must make waits for the others


def world_size(group: Any = None) -> int:
    """Ranks in ``group``, or 1 when torch.distributed is unavailable or not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def rank(group: Any = None) -> int:
    """This process's rank in ``group`` (0 without torch.distributed)."""
    return dist.get_rank(group) if world_size(group) > 1 else 0


@dataclass(frozen=True)
class Slot:
    """Where one state lives: its owner, name, reduction and range in the flat buffer."""

    owner: StateOwner
    prefix: str
    name: str
    reduce: str
    shape: tuple[int, ...]
    begin: int
    numel: int

    @property
    def key(self) -> str:
        return f"{self.prefix}{self.name}"

    @property
    def span(self) -> slice:
        return slice(self.begin, self.begin + self.numel)


GroupStates = list[dict[str, torch.Tensor]]  # per group: each state of all its members, shaped (members, *shape)


class SyncHandle(Generic[T]):
    """The pending result of a sync; ``wait()`` returns the reduced values (no host sync on CUDA)."""

    def __init__(
        self,
        finish: Callable[[], T],
        works: Iterable[Any] = (),
        event: Any = None,
        parent: SyncHandle[Any] | None = None,
        group: Any = None,
    ) -> None:
        self._finish = finish
        self._works = list(works)
        self._event = event
        # The process group, held while its collectives are in flight, as a synchronous collective holds it:
        # were the pending work its last user, destroying the group (Ray Train does, stopping a run whose
        # other rank failed) would wait for that work, which never completes.
        self._group = group
        self._parent = parent
        self._children: list[SyncHandle[Any]] = []
        self._result: Any = _PENDING

    def wait(self) -> T:
        """Block (gloo) or order the current stream (CUDA) until the reduction is done; return results."""
        if self._result is _PENDING and self._parent is not None:
            self._parent.wait()  # which also completes this handle: children are evaluated with their parent
        if self._result is _PENDING:
            for work in self._works:
                work.wait()
            if self._event is not None:
                torch.cuda.current_stream().wait_event(self._event)
            self._result = self._finish()
            self._group = None
            for child in self._children:  # derived results are taken before the buffers can be reused
                child.wait()
        return self._result

    def then(self, fn: Callable[[T], U]) -> SyncHandle[U]:
        """A handle for ``fn(result)``, evaluated as soon as this one completes."""
        child: SyncHandle[U] = SyncHandle(lambda: fn(self.wait()), parent=self)
        self._children.append(child)
        return child

    def is_completed(self) -> bool:
        """Whether ``wait()`` would return without waiting on communication."""
        if self._result is not _PENDING:
            return True
        parent_done = self._parent is None or self._parent.is_completed()
        event_done = self._event is None or bool(self._event.query())
        return parent_done and event_done and all(w.is_completed() for w in self._works)

    def wait_within(self, timeout: float, what: str) -> T:
        """:meth:`wait`, but a :class:`CollectiveTimeoutError` that names ``what`` when the other ranks have
        not joined the collective after ``timeout`` seconds (instead of waiting for ever)."""
        _await(self.is_completed, timeout, what)
        return self.wait()


_PENDING = object()


class StatePack:
    """Packs the states of metric groups into one flat buffer on ``device``, a region per reduction.

    ``groups`` holds (prefix, metric) pairs; the metrics of a group declare the same states (names, shapes,
    reductions). Inside each reduction's region, one state of every member of a group is one contiguous
    slice, so a group's state is a ``(members, *shape)`` view and one op updates or reduces all members.
    """

    def __init__(self, groups: Sequence[Sequence[tuple[str, StateOwner]]], device: torch.device) -> None:
        self.device = torch.device(device)
        self.members = [member for group in groups for member in group]
        slots: list[Slot] = []
        spans: list[dict[str, tuple[slice, tuple[int, ...]]]] = [{} for _ in groups]
        regions: dict[str, tuple[int, int]] = {}
        end = 0
        for reduce in REDUCTIONS:
            region_begin = end
            for g, group in enumerate(groups):
                specs = group[0][1]._state_specs
                for name in sorted(n for n, spec in specs.items() if spec.reduce == reduce):
                    shape, numel, begin = tuple(specs[name].default.shape), specs[name].default.numel(), end
                    for prefix, owner in group:
                        slots.append(Slot(owner, prefix, name, reduce, shape, end, numel))
                        end += numel
                    spans[g][name] = (slice(begin, end), (len(group), *shape))
            if end > region_begin:
                regions[reduce] = (region_begin, end)
        self.slots = slots
        self.regions = regions  # reduction -> (begin, end) in the flat buffer
        self.flat = torch.empty(end, dtype=STATE_DTYPE, device=self.device)
        self.defaults = torch.empty_like(self.flat)
        self.keep = torch.zeros(self.flat.shape, dtype=torch.bool, device=self.device)
        for slot in slots:
            spec = slot.owner._state_specs[slot.name]
            self.flat[slot.span].copy_(getattr(slot.owner, slot.name).reshape(-1))
            self.defaults[slot.span].copy_(spec.default.reshape(-1))
            self.keep[slot.span] = slot.owner.cumulative
            setattr(slot.owner, slot.name, self.flat[slot.span].view(slot.shape))
        self._spans = spans
        self._any_cumulative = any(owner.cumulative for _, owner in self.members)
        self._snapshots = [torch.empty_like(self.flat) for _ in range(2)]
        self.live = self.group_states(self.flat)
        self._snapshot_states = [self.group_states(snapshot) for snapshot in self._snapshots]
        self._gathered: list[torch.Tensor | None] = [None, None]
        self._next = 0
        self._in_flight: list[SyncHandle[Any] | None] = [None, None]
        self._layout_checked = False
        self.layout = tuple((s.key, s.reduce, s.shape, s.prefix, _settings(s.owner)) for s in slots)

    def group_states(self, flat: torch.Tensor) -> GroupStates:
        """Every group's states as ``(members, *shape)`` views into ``flat`` (a buffer laid out like this pack)."""
        return [{name: flat[span].view(shape) for name, (span, shape) in group.items()} for group in self._spans]

    def named_states(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every state as ``{prefix + name: view}`` into ``flat`` (a checkpoint's layout)."""
        return {slot.key: flat[slot.span].view(slot.shape) for slot in self.slots}

    def reset(self, *, keep_cumulative: bool = False) -> None:
        """Restore every state's default; cumulative ones survive when ``keep_cumulative``."""
        keep = keep_cumulative and self._any_cumulative
        self.flat.copy_(torch.where(self.keep, self.flat, self.defaults) if keep else self.defaults)

    # -- communication -------------------------------------------------------------------------------
    def check_layout(self, group: Any = None, timeout: float = COLLECTIVE_TIMEOUT_S) -> None:
        """Once: make sure every rank packs the same layout, so the packed all_reduces cannot hang."""
        if self._layout_checked or world_size(group) == 1:
            return
        digest = int.from_bytes(hashlib.sha256(repr(self.layout).encode()).digest()[:7], "big")
        probe = torch.tensor([digest, -digest], dtype=torch.int64, device=self._comm_device(group))
        work = dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group, async_op=True)
        _await(work.is_completed, timeout, "the first sync of the metrics (every rank compares its layout)")
        work.wait()
        if int(probe[0]) != -int(probe[1]):
            layouts: list[Any] = [None] * world_size(group)
            dist.all_gather_object(layouts, self.layout, group=group)
            raise LayoutMismatchError(_describe_mismatch(layouts))
        self._layout_checked = True

    def _comm_device(self, group: Any) -> torch.device:
        return self.device if dist.get_backend(group) == "nccl" else torch.device("cpu")

    def global_states(self, timeout: float = COLLECTIVE_TIMEOUT_S) -> torch.Tensor:
        """The live states reduced across every rank, which keep theirs (a checkpoint's content). A collective:
        every rank must call it; one that waits ``timeout`` seconds for the others raises
        :class:`CollectiveTimeoutError`."""
        what = "state_dict() (a collective: every rank must call it, not only rank 0)"
        self.check_layout(None, timeout)
        index = self._next
        self.reduce(None, async_op=True, reset=False).wait_within(timeout, what)
        return self._snapshots[index]

    def reduce(self, group: Any = None, *, async_op: bool = False, reset: bool = True) -> SyncHandle[GroupStates]:
        """Snapshot the live state, reset it (cumulative states stay), and reduce the snapshot across ranks."""
        index = self._next
        self._next ^= 1
        previous = self._in_flight[index]
        if previous is not None:
            previous.wait()  # the snapshot buffers are about to be reused
        snapshot = self._snapshots[index]
        snapshot.copy_(self.flat)
        if reset:
            self.reset(keep_cumulative=True)
        handle = self._launch(index, group, async_op)
        self._in_flight[index] = handle
        return handle

    def _launch(self, index: int, group: Any, async_op: bool) -> SyncHandle[GroupStates]:
        if world_size(group) == 1:
            return SyncHandle(lambda: self._snapshot_states[index])
        self.check_layout(group)
        if self.device.type != "cuda":
            works, finish = self._exchange(index, group, async_op)
            pending = [w for w in works if w is not None]  # None: the call already completed
            return SyncHandle(finish, pending, group=_group_object(group) if pending else None)
        return self._launch_cuda(index, group, async_op)

    def _exchange(self, index: int, group: Any, async_op: bool) -> tuple[list[Any], Callable[[], GroupStates]]:
        """Start the collectives on a snapshot; ``finish`` (after they complete) returns the reduced states."""
        if world_size(group) * self._snapshots[index].numel() <= GATHER_MAX_ELEMENTS:
            return self._gather(index, group, async_op)
        return self._all_reduce(index, group, async_op)

    def _gather(self, index: int, group: Any, async_op: bool) -> tuple[list[Any], Callable[[], GroupStates]]:
        """One all_gather of every rank's snapshot; each region is then reduced locally."""
        snapshot, world = self._snapshots[index], world_size(group)
        gathered = self._gathered[index]
        if gathered is None or gathered.numel() != world * snapshot.numel():
            gathered = self._gathered[index] = snapshot.new_empty(world * snapshot.numel())
        work = _all_gather(gathered, snapshot, group, async_op)

        def reduce_locally() -> GroupStates:
            rows = gathered.view(world, -1)
            for r, (begin, end) in self.regions.items():
                _LOCAL[r](rows[:, begin:end], dim=0, out=snapshot[begin:end])
            return self._snapshot_states[index]

        return [work], reduce_locally

    def _all_reduce(self, index: int, group: Any, async_op: bool) -> tuple[list[Any], Callable[[], GroupStates]]:
        """At most two all_reduces: SUM, and one MAX over the max and min regions (min(x) == -max(-x))."""
        snapshot = self._snapshots[index]
        works = []
        if "sum" in self.regions:
            begin, end = self.regions["sum"]
            works.append(dist.all_reduce(snapshot[begin:end], op=dist.ReduceOp.SUM, group=group, async_op=async_op))
        extremes = [self.regions[r] for r in ("max", "min") if r in self.regions]
        minimum = self.regions.get("min")
        if minimum is not None:
            snapshot[minimum[0] : minimum[1]].neg_()
        if extremes:
            region = snapshot[extremes[0][0] : extremes[-1][1]]
            works.append(dist.all_reduce(region, op=dist.ReduceOp.MAX, group=group, async_op=async_op))

        def restore_min() -> GroupStates:
            if minimum is not None:
                snapshot[minimum[0] : minimum[1]].neg_()
            return self._snapshot_states[index]

        return works, restore_min

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle takes: the buffers, not their views (a pickle copies each view apart from
        its buffer), nor a sync in flight (the metrics settle first), scratch buffers or a CUDA stream."""
        state = {**vars(self), "_in_flight": [None, None], "_gathered": [None, None]}
        for dropped in ("live", "_snapshots", "_snapshot_states", "_side_stream"):
            state.pop(dropped, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Views into the restored buffer again: the groups' states, and each member's own (see ``Metric``)."""
        self.__dict__.update(state)
        self._snapshots = [torch.empty_like(self.flat) for _ in range(2)]
        self.live = self.group_states(self.flat)
        self._snapshot_states = [self.group_states(snapshot) for snapshot in self._snapshots]
        for slot in self.slots:
            setattr(slot.owner, slot.name, self.flat[slot.span].view(slot.shape))

    def _launch_cuda(self, index: int, group: Any, async_op: bool) -> SyncHandle[GroupStates]:
        """Reduce on a side stream, ordered against the main stream by events: updates keep running."""
        if not hasattr(self, "_side_stream"):
            self._side_stream = torch.cuda.Stream(device=self.device)
        main = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(main)
        side = self._side_stream
        with torch.cuda.stream(side):
            side.wait_event(ready)
            _, finish = self._exchange(index, group, async_op=False)
            done = torch.cuda.Event()
            done.record(side)
        handle: SyncHandle[GroupStates] = SyncHandle(finish, event=done, group=_group_object(group))
        if not async_op:
            handle.wait()
        return handle


def _settings(owner: StateOwner) -> str:
    """A metric's class and settings as every rank writes them: its repr, less memory addresses."""
    return without_addresses(repr(owner))


def without_addresses(text: str) -> str:
    """A repr less the memory addresses that the repr of an object such as a function holds (``<function f at
    0x7f...>``), which differ between processes."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _group_object(group: Any) -> Any:
    """The process group a collective on ``group`` runs on (None: the default one)."""
    return group if group is not None else dist.group.WORLD


def _await(done: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``done`` until it is true; after ``timeout`` seconds, raise :class:`CollectiveTimeoutError`."""
    deadline = time.monotonic() + timeout
    pause = 1e-4
    while not done():
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(
                f"{what} waited {timeout:g} s for the other ranks, which did not join; the process group is now "
                "in an unknown state: end this run"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _all_gather(output: torch.Tensor, tensor: torch.Tensor, group: Any, async_op: bool) -> Any:
    """Every rank's ``tensor``, concatenated into ``output`` (torch >= 2.13 names it all_gather_single)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


def _describe_mismatch(layouts: list[Any]) -> str:
    """Name the first difference between rank 0's layout and another rank's: states, settings or order."""
    for other_rank, layout in enumerate(layouts[1:], start=1):
        if layout != layouts[0]:
            parts = "; ".join(_differences(layouts[0], layout, other_rank))
            return f"Metric layouts differ across ranks: {parts}. Build the same metrics, in one order, on every rank."
    return "Metric layouts differ across ranks."


def _differences(base: Any, layout: Any, other_rank: int) -> list[str]:
    """How ``layout`` (rank ``other_rank``'s) differs from rank 0's ``base``; entries are (state key, reduction,
    shape, metric prefix, metric settings)."""
    states, other = ({key: (reduce, shape) for key, reduce, shape, _, _ in lay} for lay in (base, layout))
    settings, other_settings = ({prefix: owner for *_, prefix, owner in lay} for lay in (base, layout))
    parts = []
    if missing := sorted(set(states) - set(other)):
        parts.append(f"rank {other_rank} lacks {missing}")
    if extra := sorted(set(other) - set(states)):
        parts.append(f"rank {other_rank} has extra {extra}")
    for key in sorted(k for k in set(states) & set(other) if states[k] != other[k]):
        parts.append(f"state {key!r} is {states[key]} on rank 0 but {other[key]} on rank {other_rank}")
    for prefix in sorted(p for p in set(settings) & set(other_settings) if settings[p] != other_settings[p]):
        what = f"metric {prefix.removesuffix('.')!r}" if prefix else "the metric"
        parts.append(f"{what} is {settings[prefix]} on rank 0 but {other_settings[prefix]} on rank {other_rank}")
    if not parts:  # the same metrics and states, packed in another order
        first, then = ([p.removesuffix(".") for p in dict.fromkeys(e[3] for e in lay)] for lay in (base, layout))
        parts.append(f"rank {other_rank} builds the metrics in another order: {then} against rank 0's {first}")
    return parts
