"""Histogram with fixed bins: reduces by sum, gives approximate quantiles."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ray_cmf.metrics.base import Metric, nonfinite, rows_mask
from ray_cmf.metrics.packing import STATE_DTYPE


class Histogram(Metric):
    """Counts in ``bins`` equal-width bins over ``[low, high)`` plus an underflow and an overflow bin.

    ``compute()`` returns ``counts`` (``bins + 2`` entries: underflow, bins, overflow), ``count`` and
    one ``p<q>`` output per quantile, interpolated linearly inside its bin (under/overflow clamp to
    ``low``/``high``). The ``value`` output is the median, whichever quantiles are reported.

    Example:
        >>> h = Histogram(bins=10, low=0.0, high=1.0)
        >>> h.update(torch.linspace(0, 0.999, 1000))
        >>> round(h.compute()["p50"].item(), 2)
        0.5
    """

    counts: torch.Tensor
    _stage_dtype = STATE_DTYPE
    _stages_arguments = True

    def __init__(
        self, bins: int, low: float, high: float, quantiles: Sequence[float] = (0.5, 0.9, 0.99), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if bins < 1 or not high > low:
            raise ValueError(f"Histogram needs bins >= 1 and high > low, got bins={bins!r}, low={low!r}, high={high!r}")
        if not all(0.0 <= q <= 1.0 for q in quantiles):
            raise ValueError(f"quantiles must lie in [0, 1], got {list(quantiles)!r}")
        self.bins, self.low, self.high = bins, float(low), float(high)
        self.quantiles = tuple(quantiles)
        self._estimated = tuple(dict.fromkeys((*self.quantiles, 0.5)))  # the median is the value, asked for or not
        self.add_state("counts", torch.zeros(bins + 2), "sum")

    def _config(self) -> tuple[Any, ...]:
        return (self.bins, self.low, self.high, self.quantiles)

    def update(self, value: Any) -> None:
        self._stage(value)

    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        block = inputs[0]
        value = block.to(STATE_DTYPE).reshape(block.shape[0], -1)
        keep = None if valid is None else rows_mask(valid, block).expand(block.shape).reshape(value.shape)
        if self._needs_mask(value if keep is None else value.masked_fill(~keep, 0.0)):
            bad = nonfinite(value) if keep is None else nonfinite(value) & keep
            states["nonfinite"].add_(bad.sum(1))
            keep = ~bad if keep is None else keep & ~bad
        weight = torch.ones_like(value) if keep is None else keep.to(STATE_DTYPE)
        scaled = ((value - self.low) / (self.high - self.low) * self.bins).floor()
        # +inf and NaN land in the overflow bin, -inf in the underflow bin (they count only under "propagate")
        index = torch.nan_to_num(scaled, nan=self.bins, posinf=self.bins, neginf=-1).clamp(-1, self.bins) + 1
        states["counts"].scatter_add_(1, index.long(), weight)

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        counts = states["counts"]  # (members, bins + 2)
        total = counts.sum(1)
        cumulative = counts.cumsum(1)
        # each bin's [lower, upper) edges, with under/overflow pinned to low/high; device ops only (no host sync)
        edges = self.low + (self.high - self.low) / self.bins * torch.arange(
            self.bins + 1, device=counts.device, dtype=counts.dtype
        )
        lower = torch.cat([edges[:1], edges[:-1], edges[-1:]]).expand_as(counts)
        upper = torch.cat([edges[:1], edges[1:], edges[-1:]]).expand_as(counts)
        targets = torch.stack([total * q for q in self._estimated], dim=1)
        # the bin where the cumulative count reaches each target; for 0 (p0), the first bin that holds any
        i = torch.where(
            targets > 0, torch.searchsorted(cumulative, targets), torch.searchsorted(cumulative, targets, right=True)
        ).clamp(max=self.bins + 1)
        before = torch.where(i > 0, cumulative.gather(1, (i - 1).clamp(min=0)), 0.0)
        inside = counts.gather(1, i)
        frac = torch.where(inside > 0, (targets - before) / inside, 0.0).clamp(0, 1)
        start = lower.gather(1, i)
        estimates = torch.where(total[:, None] > 0, start + frac * (upper.gather(1, i) - start), math.nan)
        out = {"value": estimates[:, self._estimated.index(0.5)]}
        out.update({f"p{q * 100:g}": estimates[:, j] for j, q in enumerate(self.quantiles)})
        out.update(count=total, counts=counts)
        if "nonfinite" in states:
            out["nonfinite"] = states["nonfinite"]
        return out
