"""Aggregations: Sum, Mean (optionally weighted), Max, Min."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from ray_cmf.metrics.base import Metric


def outputs(value: torch.Tensor, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``value`` plus the ``nonfinite`` count when the metric tracks one."""
    out = {"value": value}
    if "nonfinite" in states:
        out["nonfinite"] = states["nonfinite"]
    return out


class _OneValue(Metric):
    """Metrics updated by one value (tensor of any shape or scalar); scalars are staged and folded in blocks."""

    stage_width = 1

    def update(self, value: Any) -> None:
        self._touch()
        if self._is_scalar(value):
            self._stage(value)
        else:
            self._accumulate(self._as_state(value))

    def _fold_block(self, block: torch.Tensor) -> None:
        self._accumulate(block[:, 0])

    @abstractmethod
    def _accumulate(self, value: torch.Tensor) -> None:
        """Vectorized update from a tensor of values (already float64 on the metric's device)."""


class Sum(_OneValue):
    """Sum of every element seen.

    Example:
        >>> m = Sum()
        >>> m.update(torch.tensor([1.0, 2.0, float("nan")]))
        >>> {k: v.item() for k, v in m.compute().items()}
        {'value': 3.0, 'nonfinite': 1.0}
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", 0.0, "sum")

    def _accumulate(self, value: torch.Tensor) -> None:
        self.total.add_(self._filter(value, 0.0).sum())

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

    stage_width = 2  # value, weight

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("weighted_sum", 0.0, "sum")
        self.add_state("weight", 0.0, "sum")

    def update(self, value: Any, weight: Any = None) -> None:
        self._touch()
        if self._is_scalar(value) and (weight is None or self._is_scalar(weight)):
            self._stage(value) if weight is None else self._stage(value, weight)
            return
        value = self._as_state(value)
        weight = torch.ones_like(value) if weight is None else torch.broadcast_to(self._as_state(weight), value.shape)
        self._accumulate(value, weight)

    def _fold_block(self, block: torch.Tensor) -> None:
        self._accumulate(block[:, 0], block[:, 1])

    def _accumulate(self, value: torch.Tensor, weight: torch.Tensor) -> None:
        if self.nan_policy == "exclude":
            finite = torch.isfinite(value) & torch.isfinite(weight)
            self.nonfinite.add_((~finite).sum())
            value = torch.where(finite, value, 0.0)
            weight = torch.where(finite, weight, 0.0)
        self.weighted_sum.add_((value * weight).sum())
        self.weight.add_(weight.sum())

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["weighted_sum"] / states["weight"], states)


class _Extremum(_OneValue):
    """Shared body of Max and Min: one state reduced by ``max``/``min``; the identity when empty."""

    _reduce = "max"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._identity = -math.inf if self._reduce == "max" else math.inf
        self.add_state("extremum", self._identity, self._reduce)

    def _accumulate(self, value: torch.Tensor) -> None:
        value = self._filter(value, self._identity).reshape(-1)
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
