"""Staged updates: a metric update costs a copy per input; the math runs once per block, for a whole group.

Training loops call ``update`` with inputs of the same shapes every step. Running a metric's handful of
small kernels on every step costs more host time than the math itself, so each update copies its inputs
into a preallocated block on the device, and the block is applied as one vectorized update. A block holds
the updates of every member of a group (metrics of one kind, see ``groups``) for one input signature
(shapes and dtypes): ``(members, rows, *shape)`` per input, so one apply covers the group, whatever its
size. Rows a member did not fill are masked out. Blocks are bounded in rows and bytes; inputs too large
to stage are applied directly. Input checks depend on shapes only, so they run once per new signature.
On a CPU device, scalars are read on the host instead of copied: reading host memory waits for nothing.
"""

from __future__ import annotations

import numbers
from array import array
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

STAGE_ROWS = 64  # updates per member and block at most
STAGE_BYTES = 1 << 20  # device memory per block at most; a member's update larger than half of it is applied directly
MAX_SIGNATURES = 4  # blocks kept per group (e.g. the full batch and the last, smaller one; with and without weights)
NUMBER_DTYPE = torch.float64  # Python numbers, and scalars read on the host, are staged as float64

Signature = tuple[tuple[torch.Size, torch.dtype], ...]
_NUMBER = (torch.Size(), NUMBER_DTYPE)
Apply = Callable[[list[torch.Tensor], "torch.Tensor | None"], None]  # (inputs, valid rows or None when all)
ApplyOne = Callable[[int, list[torch.Tensor]], None]  # (member, its inputs as one row)
Put = Callable[[int, Sequence[Any]], "bool | None"]  # (member, inputs) -> its rows are full; None: not this signature


def signature(inputs: Sequence[Any]) -> Signature:
    """Shapes and dtypes of one update's inputs (Python numbers count as float64 scalars)."""
    return tuple([(v.shape, v.dtype) if isinstance(v, torch.Tensor) else _NUMBER for v in inputs])


def _bad_input(inputs: Sequence[Any]) -> tuple[int, Any] | None:
    """The first input (its position and value) that is neither a real tensor nor a real number; None if all are."""
    return next(((i, v) for i, v in enumerate(inputs) if not _real(v)), None)


def _real(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not value.is_complex()
    return isinstance(value, numbers.Real)


def raise_naming_input(exc: TypeError, inputs: Sequence[Any], label: Callable[[int], tuple[str, int]]) -> NoReturn:
    """Raise, from ``exc``, the TypeError that names the metric and the input that is neither a real tensor nor
    a number (``label``: that input's index -> its metric's name and its position among that metric's inputs);
    ``exc`` itself when every input is one."""
    bad = _bad_input(inputs)
    if bad is None:
        raise exc
    (what, position), value = label(bad[0]), bad[1]
    if isinstance(value, torch.Tensor):  # complex: its imaginary part would be dropped
        said = f"is a {str(value.dtype).removeprefix('torch.')} tensor ({value!r:.40}): metrics take real values"
    else:
        said = f"is a {type(value).__name__} ({value!r:.40}), not a tensor or a number"
    raise TypeError(f"{what}: input {position} {said}") from exc


def one_row(value: Any, device: torch.device) -> torch.Tensor:
    """One update's input as a ``(1, 1, *shape)`` block on ``device`` (for inputs applied directly)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device).reshape(1, 1, *value.shape)
    return torch.tensor([[value]], dtype=NUMBER_DTYPE, device=device)


class Block:
    """Preallocated rows for one signature's updates of every member of a group.

    A device input is copied into its (member, row) cell: one copy, converting to ``dtype`` when given (metrics
    whose math is in float64 convert as they copy). On a CPU device, scalars (0-d tensors and Python numbers)
    are written to a host array instead, seen as a float64 tensor when the block is applied.
    """

    def __init__(
        self, sig: Signature, members: int, rows: int, device: torch.device, dtype: torch.dtype | None = None
    ) -> None:
        self.rows, self.device, self.signature = rows, device, sig
        self.fits = _matcher(sig, device)
        self.used = [0] * members  # rows filled, per member
        self.columns: list[torch.Tensor] = []
        self.device_inputs: list[tuple[int, torch.Tensor, list[torch.Tensor | None]]] = []
        self.host_inputs: list[tuple[int, array[float]]] = []
        for i, (shape, input_dtype) in enumerate(sig):
            if device.type == "cpu" and not shape:
                host = array("d", bytes(8 * members * rows))
                self.host_inputs.append((i, host))
                column = torch.frombuffer(host, dtype=NUMBER_DTYPE).view(members, rows)
            else:
                column = torch.empty((members, rows, *shape), dtype=dtype or input_dtype, device=device)
                self.device_inputs.append((i, column.view(members * rows, *shape), [None] * (members * rows)))
            self.columns.append(column)
        self.put = self._putter()

    def _putter(self) -> Put:
        """``put(member, inputs)``: record one update of ``member`` in its next row and say whether that member's
        rows are full; None, recording nothing, when the inputs lack this block's signature. Every update runs
        it, so one device tensor (the common case) gets a body of its own, without loops or a second call."""
        used, rows, fits = self.used, self.rows, self.fits
        device_inputs, host_inputs = self.device_inputs, self.host_inputs
        if len(device_inputs) == 1 and not host_inputs:
            [(_, cells, views)] = device_inputs
            [(shape, dtype)] = self.signature

            def put_tensor(member: int, inputs: Sequence[Any]) -> bool | None:
                if len(inputs) != 1:
                    return None
                value = inputs[0]
                if not isinstance(value, torch.Tensor) or value.shape != shape or value.dtype is not dtype:
                    return None
                row = used[member]
                index = member * rows + row
                cell = views[index]
                if cell is None:
                    cell = views[index] = cells[index]
                cell.copy_(value.detach() if value.requires_grad else value)
                used[member] = row = row + 1
                return row == rows

            return put_tensor

        def put(member: int, inputs: Sequence[Any]) -> bool | None:
            if not fits(inputs):
                return None
            row = used[member]
            index = member * rows + row
            for i, cells, views in device_inputs:
                cell = views[index]
                if cell is None:
                    cell = views[index] = cells[index]
                value = inputs[i]
                if isinstance(value, torch.Tensor):
                    cell.copy_(value.detach() if value.requires_grad else value)
                else:
                    cell.fill_(value)
            for i, host in host_inputs:
                value = inputs[i]
                host[index] = value.item() if isinstance(value, torch.Tensor) else value
            used[member] = row = row + 1
            return row == rows

        return put

    def flush(self, apply: Apply) -> None:
        """Apply the staged rows of every member as one update and empty the block."""
        used = self.used.copy()
        top = max(used)
        if not top:
            return
        self.used[:] = [0] * len(used)  # in place: ``put`` holds the list
        valid = None if min(used) == top else _valid_rows(used, top, self.device)
        apply([column[:, :top] for column in self.columns], valid)


def _matcher(sig: Signature, device: torch.device) -> Callable[[Sequence[Any]], bool]:
    """Whether one update's inputs have this signature: the check every update pays, so one input (the common
    case) gets a check without a loop. A scalar read on the host takes any dtype."""
    expected = [(shape, dtype if shape or device.type != "cpu" else None) for shape, dtype in sig]
    if len(expected) == 1:
        [(shape, dtype)] = expected
        if dtype is None:  # a scalar read on the host: a number or any 0-d tensor

            def fits_scalar(inputs: Sequence[Any]) -> bool:
                if len(inputs) != 1:
                    return False
                value = inputs[0]
                return not isinstance(value, torch.Tensor) or value.dim() == 0

            return fits_scalar

        def fits_one(inputs: Sequence[Any]) -> bool:
            if len(inputs) != 1:
                return False
            value = inputs[0]
            return isinstance(value, torch.Tensor) and value.shape == shape and value.dtype is dtype

        return fits_one

    def fits(inputs: Sequence[Any]) -> bool:
        if len(inputs) != len(expected):
            return False
        for value, (shape, dtype) in zip(inputs, expected, strict=True):
            if isinstance(value, torch.Tensor):
                if value.shape != shape or (dtype is not None and value.dtype is not dtype):
                    return False
            elif shape or (dtype is not None and dtype is not NUMBER_DTYPE):
                return False
        return True

    return fits


def _valid_rows(used: list[int], top: int, device: torch.device) -> torch.Tensor:
    """``(members, top)`` mask of the rows each member filled, sent to ``device`` without waiting on it."""
    return from_host(torch.arange(top) < torch.tensor(used)[:, None], device)


def from_host(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``, sent without the host waiting for the device (no host sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class Stager:
    """The staged updates of one group on ``device``: a block per signature, ``apply`` called once per full block.

    ``dtype``, when given, is the dtype every staged input is converted to (see ``Block``).

    ``check`` validates one update's inputs (raising on bad shapes); it runs once per new signature and for
    every update applied directly (through ``apply_one``).
    """

    def __init__(
        self,
        members: int,
        device: torch.device,
        apply: Apply,
        apply_one: ApplyOne,
        check: Callable[..., None],
        dtype: torch.dtype | None = None,
    ) -> None:
        self._members, self._device, self._dtype = members, device, dtype
        self._apply, self._apply_one, self._check = apply, apply_one, check
        self._blocks: dict[Signature, Block] = {}
        self._last: Block | None = None  # the block of the latest update (most updates repeat its signature)

    def push(self, member: int, inputs: Sequence[Any]) -> None:
        """Stage one update of ``member`` (applied when its block fills or on ``flush``)."""
        block = self._last
        if block is None or (full := block.put(member, inputs)) is None:  # not the latest update's signature
            block = self._block_for(inputs)
            if block is None:
                self._apply_one(member, [one_row(v, self._device) for v in inputs])
                return
            full = block.put(member, inputs)
        if full:
            block.flush(self._apply)

    def _block_for(self, inputs: Sequence[Any]) -> Block | None:
        """The block of these inputs' signature (checked and made when new); None when they are too large."""
        sig = signature(inputs)
        block = self._blocks.get(sig)
        if block is None:
            self.check(inputs)
            rows = min(STAGE_ROWS, STAGE_BYTES // max(1, self._members * _nbytes(sig)))
            if rows < 2:
                return None
            if len(self._blocks) == MAX_SIGNATURES:
                self.flush()
                self.discard()
            block = self._blocks[sig] = Block(sig, self._members, rows, self._device, self._dtype)
        self._last = block
        return block

    def seen(self, inputs: Sequence[Any]) -> bool:
        """Whether these inputs have the signature of the latest staged update (so they passed the check)."""
        return self._last is not None and self._last.fits(inputs)

    def check(self, inputs: Sequence[Any]) -> None:
        """Raise as ``push`` would on these inputs, staging nothing (a joint update checks all inputs first): a
        TypeError for one that is neither a tensor nor a number, the metric's own error for bad shapes."""
        if signature(inputs) in self._blocks:
            return
        if (bad := _bad_input(inputs)) is not None:
            raise TypeError(f"input {bad[0]} is a {type(bad[1]).__name__}")
        self._check(*inputs)

    def flush(self) -> None:
        """Apply every staged update (before the states are read, reduced or saved)."""
        for block in self._blocks.values():
            block.flush(self._apply)

    def discard(self) -> None:
        """Drop staged updates and their blocks (on reset, load or a device move)."""
        self._blocks.clear()
        self._last = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy gets blocks of its own as it stages (a block's ``put`` writes to the block it was made for)."""
        self.flush()
        return {**vars(self), "_blocks": {}, "_last": None}


def _nbytes(sig: Signature) -> int:
    return sum(shape.numel() * dtype.itemsize for shape, dtype in sig)
