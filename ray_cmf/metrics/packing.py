"""Packed metric state: one contiguous float64 buffer per reduction (sum, max, min).

Every state tensor of the packed metrics is a view into its reduction's buffer, so updates write
straight into the packed layout and a sync costs at most one all_reduce per reduction kind, whatever
the number of metrics. A sync snapshots the buffers into one of two preallocated copies (double
buffering), resets the live state, and reduces the copy: asynchronously on gloo (``async_op=True``),
on a side stream ordered by CUDA events on GPUs. The ranks compare layouts once, on the first sync.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
import torch.distributed as dist

from ray_cmf.errors import RayCmfError

if TYPE_CHECKING:
    from ray_cmf.metrics.base import Metric

REDUCTIONS = ("sum", "max", "min")
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
STATE_DTYPE = torch.float64  # exact for counts up to 2**53, so one dtype (one buffer) per reduction
T = TypeVar("T")
U = TypeVar("U")


class LayoutMismatchError(RayCmfError):
    """Ranks hold metric collections with different names, reductions or shapes."""


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
    """Where one state lives: its owner, name, reduction and range in the reduction's buffer."""

    owner: Metric
    prefix: str
    name: str
    reduce: str
    shape: tuple[int, ...]
    offset: int
    numel: int

    @property
    def key(self) -> str:
        return f"{self.prefix}{self.name}"


class SyncHandle(Generic[T]):
    """The pending result of a sync; ``wait()`` returns the reduced values (no host sync on CUDA)."""

    def __init__(
        self,
        finish: Callable[[], T],
        works: Iterable[Any] = (),
        event: Any = None,
        parent: SyncHandle[Any] | None = None,
    ) -> None:
        self._finish = finish
        self._works = list(works)
        self._event = event
        self._parent = parent
        self._children: list[SyncHandle[Any]] = []
        self._result: Any = _PENDING

    def wait(self) -> T:
        """Block (gloo) or order the current stream (CUDA) until the reduction is done; return results."""
        if self._result is _PENDING:
            if self._parent is not None:
                self._parent.wait()
            for work in self._works:
                work.wait()
            if self._event is not None:
                torch.cuda.current_stream().wait_event(self._event)
            self._result = self._finish()
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
        return parent_done and all(w.is_completed() for w in self._works)


_PENDING = object()


class StatePack:
    """Packs the states of ``members`` (prefix, metric) into per-reduction buffers on ``device``."""

    def __init__(self, members: Iterable[tuple[str, Metric]], device: torch.device) -> None:
        self.device = torch.device(device)
        self.members = list(members)
        slots: list[Slot] = []
        sizes = dict.fromkeys(REDUCTIONS, 0)
        specs = sorted(
            ((prefix, name, spec) for prefix, metric in self.members for name, spec in metric._state_specs.items()),
            key=lambda item: (item[0], item[1]),
        )
        owners = {prefix: metric for prefix, metric in self.members}
        for prefix, name, spec in specs:
            numel = spec.default.numel()
            slots.append(
                Slot(owners[prefix], prefix, name, spec.reduce, tuple(spec.default.shape), sizes[spec.reduce], numel)
            )
            sizes[spec.reduce] += numel
        self.slots = slots
        self.buffers = {r: torch.empty(n, dtype=STATE_DTYPE, device=self.device) for r, n in sizes.items() if n}
        self.defaults = {r: torch.empty_like(b) for r, b in self.buffers.items()}
        self.keep = {r: torch.zeros(b.shape, dtype=torch.bool, device=self.device) for r, b in self.buffers.items()}
        for slot in slots:
            spec = slot.owner._state_specs[slot.name]
            region = slice(slot.offset, slot.offset + slot.numel)
            current = getattr(slot.owner, slot.name)
            self.buffers[slot.reduce][region].copy_(current.reshape(-1))
            self.defaults[slot.reduce][region].copy_(spec.default.reshape(-1))
            self.keep[slot.reduce][region] = slot.owner.cumulative
            setattr(slot.owner, slot.name, self.buffers[slot.reduce][region].view(slot.shape))
        self._snapshots = [{r: torch.empty_like(b) for r, b in self.buffers.items()} for _ in range(2)]
        self._next = 0
        self._in_flight: list[SyncHandle[Any] | None] = [None, None]
        self._layout_checked = False
        self.layout = tuple((s.key, s.reduce, s.shape) for s in slots)

    # -- views ---------------------------------------------------------------------------------------
    def states(self, owner: Metric, buffers: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """``owner``'s states as views into ``buffers`` (default: the live buffers)."""
        buffers = self.buffers if buffers is None else buffers
        return {
            s.name: buffers[s.reduce][s.offset : s.offset + s.numel].view(s.shape)
            for s in self.slots
            if s.owner is owner
        }

    def reset(self, owner: Metric | None = None, *, keep_cumulative: bool = False) -> None:
        """Restore defaults: every state, or ``owner``'s; cumulative ones survive when ``keep_cumulative``."""
        if owner is None:
            for r, buf in self.buffers.items():
                buf.copy_(torch.where(self.keep[r], buf, self.defaults[r]) if keep_cumulative else self.defaults[r])
            return
        for s in self.slots:
            if s.owner is owner:
                region = slice(s.offset, s.offset + s.numel)
                self.buffers[s.reduce][region].copy_(self.defaults[s.reduce][region])

    # -- communication -------------------------------------------------------------------------------
    def check_layout(self, group: Any = None) -> None:
        """Once: make sure every rank packs the same layout, so the packed all_reduces cannot hang."""
        if self._layout_checked or world_size(group) == 1:
            return
        digest = int.from_bytes(hashlib.sha256(repr(self.layout).encode()).digest()[:7], "big")
        probe = torch.tensor([digest, -digest], dtype=torch.int64, device=self._comm_device(group))
        dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
        if int(probe[0]) != -int(probe[1]):
            layouts: list[Any] = [None] * world_size(group)
            dist.all_gather_object(layouts, self.layout, group=group)
            raise LayoutMismatchError(_describe_mismatch(layouts))
        self._layout_checked = True

    def _comm_device(self, group: Any) -> torch.device:
        return self.device if dist.get_backend(group) == "nccl" else torch.device("cpu")

    def reduce(
        self, group: Any = None, *, async_op: bool = False, reset: bool = True
    ) -> SyncHandle[dict[str, torch.Tensor]]:
        """Snapshot the live state, reset it (cumulative states stay), and all-reduce the snapshot."""
        index = self._next
        self._next ^= 1
        previous = self._in_flight[index]
        if previous is not None:
            previous.wait()  # the snapshot buffers are about to be reused
        snapshot = self._snapshots[index]
        for r, buf in self.buffers.items():
            snapshot[r].copy_(buf)
        if reset:
            self.reset(keep_cumulative=True)
        handle = self._launch(snapshot, group, async_op)
        self._in_flight[index] = handle
        return handle

    def _launch(
        self, snapshot: dict[str, torch.Tensor], group: Any, async_op: bool
    ) -> SyncHandle[dict[str, torch.Tensor]]:
        if world_size(group) == 1:
            return SyncHandle(lambda: snapshot)
        self.check_layout(group)
        if self.device.type == "cuda":
            return self._launch_cuda(snapshot, group, async_op)
        works = [
            dist.all_reduce(snapshot[r], op=_OPS[r], group=group, async_op=async_op)
            for r in REDUCTIONS
            if r in snapshot
        ]
        return SyncHandle(lambda: snapshot, [w for w in works if w is not None])

    def _launch_cuda(
        self, snapshot: dict[str, torch.Tensor], group: Any, async_op: bool
    ) -> SyncHandle[dict[str, torch.Tensor]]:
        """Reduce on a side stream, ordered against the main stream by events: updates keep running."""
        if not hasattr(self, "_side_stream"):
            self._side_stream = torch.cuda.Stream(device=self.device)
        main = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(main)
        side = self._side_stream
        with torch.cuda.stream(side):
            side.wait_event(ready)
            for r in REDUCTIONS:
                if r in snapshot:
                    dist.all_reduce(snapshot[r], op=_OPS[r], group=group)
            done = torch.cuda.Event()
            done.record(side)
        handle: SyncHandle[dict[str, torch.Tensor]] = SyncHandle(lambda: snapshot, event=done)
        if not async_op:
            handle.wait()
        return handle


def _describe_mismatch(layouts: list[Any]) -> str:
    """Name the first difference between rank 0's layout and another rank's."""
    base = {key: (reduce, shape) for key, reduce, shape in layouts[0]}
    for other_rank, layout in enumerate(layouts[1:], start=1):
        other = {key: (reduce, shape) for key, reduce, shape in layout}
        if other == base:
            continue
        missing = sorted(set(base) - set(other))
        extra = sorted(set(other) - set(base))
        changed = sorted(k for k in set(base) & set(other) if base[k] != other[k])
        parts = []
        if missing:
            parts.append(f"rank {other_rank} lacks {missing}")
        if extra:
            parts.append(f"rank {other_rank} has extra {extra}")
        for key in changed:
            parts.append(f"state {key!r} is {base[key]} on rank 0 but {other[key]} on rank {other_rank}")
        return "Metric layouts differ across ranks: " + "; ".join(parts) + ". Build the same metrics on every rank."
    return "Metric layouts differ across ranks."
