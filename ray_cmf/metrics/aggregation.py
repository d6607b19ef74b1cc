"""Aggregations: Sum, Mean (optionally weighted), Max, Min."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from ray_cmf.metrics.base import Metric, nonfinite
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


class _OneValue(Metric):
    """Metrics updated by one value: a tensor of any shape or a Python number."""

    def update(self, value: Any) -> None:
        self._stage(value)

    def _apply(self, values: torch.Tensor) -> None:
        self._accumulate(values.to(STATE_DTYPE).reshape(-1))

    @abstractmethod
    def _accumulate(self, value: torch.Tensor) -> None:
        """Update from a flat float64 tensor of values on the metric's device."""


class Sum(_OneValue):
    """Sum of every element seen.

    Example:
        >>> m = Sum()
        >>> m.update(torch.tensor([1.0, 2.0, float("nan")]))
        >>> {k: v.item() for k, v in m.compute().items()}
        {'value': 3.0, 'nonfinite': 1.0}
    """

    total: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", 0.0, "sum")

    def _accumulate(self, value: torch.Tensor) -> None:
        filtered, _ = self._filter(value, 0.0)
        self.total.add_(filtered.sum())

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["total"], states)


class Mean(Metric):
    """Mean of every element seen, weighted elementwise when ``weight`` is given. No weight at all gives NaN.

    Example:
        >>> m = Mean()
        >>> m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([3.0, 1.0]))
        >>> m.compute()["value"].item()
        1.5
    """

    weighted_sum: torch.Tensor
    weight: torch.Tensor

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
                f"Mean: weight of shape {tuple(weight_shape)} does not broadcast to the value's {tuple(value_shape)}"
            )

    def _apply(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        values = values.to(STATE_DTYPE)
        if weights is None:
            values, excluded = self._filter(values.reshape(-1), 0.0)
            self.weighted_sum.add_(values.sum())
            self.weight.add_(values.numel())
            if excluded is not None:
                self.weight.sub_(excluded)
            return
        # each update's weight broadcasts against its value: align the trailing dimensions
        missing = values.dim() - weights.dim()
        weights = weights.to(STATE_DTYPE).reshape(weights.shape[:1] + (1,) * missing + weights.shape[1:])
        values, weights = values.reshape(-1), torch.broadcast_to(weights, values.shape).reshape(-1)
        if self._needs_mask(values, weights):
            bad = nonfinite(values) | nonfinite(weights)
            self.nonfinite.add_(bad.sum())
            values, weights = values.masked_fill(bad, 0.0), weights.masked_fill(bad, 0.0)
        self.weighted_sum.add_(torch.dot(values, weights))
        self.weight.add_(weights.sum())

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["weighted_sum"] / states["weight"], states)


class _Extremum(_OneValue):
    """Shared body of Max and Min: one state reduced by ``max``/``min``; the identity when empty."""

    _reduce = "max"
    extremum: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._identity = -math.inf if self._reduce == "max" else math.inf
        self.add_state("extremum", self._identity, self._reduce)

    def _accumulate(self, value: torch.Tensor) -> None:
        value, _ = self._filter(value, self._identity)
        if value.numel() == 0:  # a shape check, not a value check: no host sync
            return
        if self._reduce == "max":
            torch.maximum(self.extremum, value.max(), out=self.extremum)
        else:
            torch.minimum(self.extremum, value.min(), out=self.extremum)

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["extremum"], states)


class Max(_Extremum):
    """Largest element seen (``-inf`` before any update)."""

    _reduce = "max"


class Min(_Extremum):
    """Smallest element seen (``+inf`` before any update)."""

    _reduce = "min"
