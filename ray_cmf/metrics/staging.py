"""Staged updates: a metric update costs a copy per input; the metric math runs once per block.

Training loops call ``update`` with inputs of the same shapes every step. Running a metric's handful of
small kernels (argmax, compare, isfinite, sums, in-place adds) on every step costs more host time than
the math itself, so each update copies its inputs into a preallocated block on the metric's device, and
the metric applies a whole block as one vectorized update. Blocks are keyed by the inputs' signature
(shapes and dtypes) and bounded in rows and bytes; inputs too large to stage are applied directly.
A metric's input checks depend on shapes only, so they run once per new signature, not per update.
On a CPU device, scalars are read on the host instead of copied: reading host memory waits for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

STAGE_ROWS = 64  # updates per block at most
STAGE_BYTES = 1 << 20  # device memory per block at most; an update larger than half of it is applied directly
MAX_SIGNATURES = 2  # blocks kept per metric (e.g. the full batch and the last, smaller one)
NUMBER_DTYPE = torch.float64  # Python numbers are staged as float64

Signature = tuple[tuple[torch.Size, torch.dtype], ...]
_NUMBER = (torch.Size(), NUMBER_DTYPE)
Apply = Callable[..., None]


def signature(inputs: Sequence[Any]) -> Signature:
    """Shapes and dtypes of one update's inputs (Python numbers count as float64 scalars)."""
    return tuple([(v.shape, v.dtype) if isinstance(v, torch.Tensor) else _NUMBER for v in inputs])


def batched(value: Any, device: torch.device) -> torch.Tensor:
    """One update's input as a block of one row on ``device`` (for inputs applied directly)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device).unsqueeze(0)
    return torch.tensor([value], dtype=NUMBER_DTYPE, device=device)


class Block:
    """Preallocated rows for updates of one signature.

    A device input is copied into a view per (row, input): one copy each. On a CPU device, scalars (0-d
    tensors and Python numbers) are read into a Python list instead, made a tensor when the block is applied:
    reading host memory costs less than launching a copy.
    """

    def __init__(self, sig: Signature, rows: int, device: torch.device) -> None:
        on_host = [device.type == "cpu" and not shape for shape, _ in sig]
        self.columns: list[torch.Tensor | list[Any]] = [
            [None] * rows if host else torch.empty((rows, *shape), dtype=dtype, device=device)
            for host, (shape, dtype) in zip(on_host, sig, strict=True)
        ]
        self.dtypes = [dtype for _, dtype in sig]
        self.host = [(i, column) for i, column in enumerate(self.columns) if on_host[i]]
        self.cells = [
            [(i, column[row]) for i, column in enumerate(self.columns) if not on_host[i]] for row in range(rows)
        ]
        self.used = 0

    def put(self, inputs: Sequence[Any]) -> bool:
        """Record one update's inputs in the next row; True when the block is full."""
        row = self.used
        for i, cell in self.cells[row]:
            value = inputs[i]
            if isinstance(value, torch.Tensor):
                cell.copy_(value.detach() if value.requires_grad else value)
            else:
                cell.fill_(value)
        for i, column in self.host:
            value = inputs[i]
            column[row] = value.item() if isinstance(value, torch.Tensor) else value
        self.used = row + 1
        return self.used == len(self.cells)

    def flush(self, apply: Apply) -> None:
        """Apply the staged rows as one update and empty the block."""
        if self.used:
            used, self.used = self.used, 0
            apply(
                *(
                    column[:used] if isinstance(column, torch.Tensor) else torch.tensor(column[:used], dtype=dtype)
                    for column, dtype in zip(self.columns, self.dtypes, strict=True)
                )
            )


class Stager:
    """The staged updates of one metric (or of one call pattern of ``MetricCollection.update``).

    ``apply`` receives each input with a leading dimension of updates. ``check`` validates one update's
    inputs (raising on bad shapes); it runs once per new signature and for every update applied directly.
    """

    def __init__(self, apply: Apply, check: Apply) -> None:
        self._apply, self._check = apply, check
        self._blocks: dict[Signature, Block] = {}

    def push(self, inputs: Sequence[Any], device: torch.device) -> None:
        """Stage one update (applied when its block fills or on ``flush``)."""
        sig = signature(inputs)
        block = self._blocks.get(sig) or self._new_block(sig, inputs, device)
        if block is not None and block.put(inputs):
            block.flush(self._apply)

    def _new_block(self, sig: Signature, inputs: Sequence[Any], device: torch.device) -> Block | None:
        """Check a new signature's inputs and make its block; None when they are too large and were applied."""
        self._check(*inputs)
        rows = min(STAGE_ROWS, STAGE_BYTES // max(1, _nbytes(sig)))
        if rows < 2:
            self._apply(*(batched(v, device) for v in inputs))
            return None
        if len(self._blocks) == MAX_SIGNATURES:
            self.flush()
            self.discard()
        block = self._blocks[sig] = Block(sig, rows, device)
        return block

    def flush(self) -> None:
        """Apply every staged update (before the metric's states are read, reduced or saved)."""
        for block in self._blocks.values():
            block.flush(self._apply)

    def discard(self) -> None:
        """Drop staged updates and their blocks (on reset, load or a device move)."""
        self._blocks.clear()


def _nbytes(sig: Signature) -> int:
    return sum(shape.numel() * dtype.itemsize for shape, dtype in sig)
