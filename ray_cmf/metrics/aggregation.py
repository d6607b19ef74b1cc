"""Aggregations: Sum, Mean (optionally weighted), Max, Min."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ray_cmf.metrics.base import Metric, nonfinite, per_member, rows_mask
from ray_cmf.metrics.packing import STATE_DTYPE


def _shape(value: Any) -> torch.Size:
    return value.shape if isinstance(value, torch.Tensor) else torch.Size()


def _broadcasts(shape: torch.Size, to: torch.Size) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``to`` without changing it."""
    try:
        return torch.broadcast_shapes(shape, to) == to
    except RuntimeError:
        return False


def outputs(value: torch.Tensor, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``value`` plus the ``nonfinite`` count when the metric tracks one."""
    out = {"value": value}
    if "nonfinite" in states:
        out["nonfinite"] = states["nonfinite"]
    return out


def float_values(block: torch.Tensor, valid: torch.Tensor | None, fill: float) -> torch.Tensor:
    """A block ``(members, rows, ...)`` in float64, the rows without an update set to ``fill``."""
    values = block if block.dtype == STATE_DTYPE else block.to(STATE_DTYPE)
    return values if valid is None else values.masked_fill(~rows_mask(valid, values), fill)


class Sum(Metric):
    """Sum of every element seen.

    Example:
        >>> m = Sum()
        >>> m.update(torch.tensor([1.0, 2.0, float("nan")]))
        >>> {k: v.item() for k, v in m.compute().items()}
        {'value': 3.0, 'nonfinite': 1.0}
    """

    total: torch.Tensor
    _stage_dtype = STATE_DTYPE
    _stages_arguments = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", 0.0, "sum")

    def update(self, value: Any) -> None:
        self._stage(value)

    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        values, _ = self._filter(states, float_values(inputs[0], valid, 0.0), 0.0)
        states["total"].add_(values.sum(per_member(values)))

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["total"], states)


class Mean(Metric):
    """Mean of every element seen, weighted elementwise when ``weight`` is given. Weights that sum to zero (none
    at all, or negative ones that cancel the others) give NaN: such a mean is undefined.

    Example:
        >>> m = Mean()
        >>> m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([3.0, 1.0]))
        >>> m.compute()["value"].item()
        1.5
    """

    weighted_sum: torch.Tensor
    weight: torch.Tensor
    _stage_dtype = STATE_DTYPE
    _stages_arguments = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("weighted_sum", 0.0, "sum")
        self.add_state("weight", 0.0, "sum")

    def update(self, value: Any, weight: Any = None) -> None:
        if weight is None:
            self._stage(value)
        else:
            self._stage(value, weight)

    def _check(self, value: Any, weight: Any = None) -> None:
        value_shape, weight_shape = _shape(value), _shape(weight)
        if weight is not None and not _broadcasts(weight_shape, value_shape):
            raise ValueError(
                f"weight of shape {tuple(weight_shape)} does not broadcast to the value's {tuple(value_shape)}"
            )

    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        block = inputs[0]
        if len(inputs) == 1:
            values, excluded = self._filter(states, float_values(block, valid, 0.0), 0.0)
            states["weighted_sum"].add_(values.sum(per_member(values)))
            per_row = math.prod(values.shape[2:])
            states["weight"].add_(values.shape[1] * per_row if valid is None else valid.sum(1) * per_row)
            if excluded is not None:
                states["weight"].sub_(excluded)
            return
        # each update's weight broadcasts against its value: align the trailing dimensions
        weights = inputs[1]
        missing = block.dim() - weights.dim()
        weights = weights.reshape(weights.shape[:2] + (1,) * missing + weights.shape[2:]).expand(block.shape)
        values, weights = float_values(block, valid, 0.0), float_values(weights, valid, 0.0)
        if self._needs_mask(values, weights):
            bad = nonfinite(values) | nonfinite(weights)
            states["nonfinite"].add_(bad.sum(per_member(bad)))
            values, weights = values.masked_fill(bad, 0.0), weights.masked_fill(bad, 0.0)
        states["weighted_sum"].add_((values * weights).sum(per_member(values)))
        states["weight"].add_(weights.sum(per_member(weights)))

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weight = states["weight"]
        return outputs(torch.where(weight == 0, math.nan, states["weighted_sum"] / weight), states)


class _Extremum(Metric):
    """Shared body of Max and Min: one state reduced by ``max``/``min``, whose identity (``∓inf``) means that
    no value was seen. Under ``nan_policy="exclude"`` no value seen can be infinite, so the output is NaN
    there, as a Mean's is; under ``"propagate"`` it is the identity."""

    _reduce = "max"
    extremum: torch.Tensor
    _stage_dtype = STATE_DTYPE
    _stages_arguments = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._identity = -math.inf if self._reduce == "max" else math.inf
        self.add_state("extremum", self._identity, self._reduce)

    def update(self, value: Any) -> None:
        self._stage(value)

    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        values, _ = self._filter(states, float_values(inputs[0], valid, 0.0), self._identity)
        if valid is not None:  # rows without an update hold a finite placeholder, so the NaN policy counts none
            values = values.masked_fill(~rows_mask(valid, values), self._identity)
        if values.numel() == 0:  # a shape check, not a value check: no host sync
            return
        extremum, dims = states["extremum"], per_member(values)
        if self._reduce == "max":
            torch.maximum(extremum, values.amax(dims), out=extremum)
        else:
            torch.minimum(extremum, values.amin(dims), out=extremum)

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        extremum = states["extremum"]
        if self.nan_policy == "exclude":  # a device op: no host sync
            extremum = extremum.masked_fill(extremum == self._identity, math.nan)
        return outputs(extremum, states)


class Max(_Extremum):
    """Largest finite element seen (NaN before any; ``-inf`` under ``nan_policy="propagate"``)."""

    _reduce = "max"


class Min(_Extremum):
    """Smallest finite element seen (NaN before any; ``+inf`` under ``nan_policy="propagate"``)."""

    _reduce = "min"
