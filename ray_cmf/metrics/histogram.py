"""Histogram with fixed bins: reduces by sum, gives approximate quantiles."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ray_cmf.metrics.base import Metric, nonfinite, rows_mask
from ray_cmf.metrics.packing import STATE_DTYPE

_NONFINITE = ("below", "above", "nans")  # under "propagate": how many -inf, inf and NaN values were seen


class Histogram(Metric):
    """Counts in ``bins`` equal-width bins over ``[low, high)`` plus an underflow and an overflow bin.

    ``compute()`` returns ``counts`` (``bins + 2`` entries: underflow, bins, overflow), ``count`` and
    one ``p<q>`` output per quantile, interpolated linearly inside its bin. The smallest and the largest
    finite value seen are kept too: the underflow bin spans ``[smallest, low)`` and the overflow bin
    ``[high, largest]``, and no quantile lies outside ``[smallest, largest]`` (``p0`` and ``p100`` are
    those values exactly). The ``value`` output is the median, whichever quantiles are reported. Under
    ``nan_policy="propagate"`` infinities are values too (counted in the end bins; a quantile among them is
    -inf or inf) and any NaN makes every quantile NaN, as NumPy's are; a NaN lies in no bin under either
    policy, as in ``numpy.histogram``, so ``count`` is the bins' total.

    Example:
        >>> h = Histogram(bins=10, low=0.0, high=1.0)
        >>> h.update(torch.linspace(0, 0.999, 1000))
        >>> round(h.compute()["p50"].item(), 2)
        0.5
    """

    counts: torch.Tensor
    smallest: torch.Tensor
    largest: torch.Tensor
    _stage_dtype = STATE_DTYPE
    _stages_arguments = True

    def __init__(
        self, bins: int, low: float, high: float, quantiles: Sequence[float] = (0.5, 0.9, 0.99), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(bins, bool) or not hasattr(bins, "__index__"):  # an int or a NumPy integer, not 2.5 or "8"
            raise TypeError(f"Histogram needs an int number of bins, got bins={bins!r}")
        if bins < 1 or not high > low:
            raise ValueError(f"Histogram needs bins >= 1 and high > low, got bins={bins!r}, low={low!r}, high={high!r}")
        if not math.isfinite(float(high) - float(low)):
            raise ValueError(f"Histogram needs a finite low and high a finite width apart, got {low!r} and {high!r}")
        if not all(0.0 <= q <= 1.0 for q in quantiles):
            raise ValueError(f"quantiles must lie in [0, 1], got {list(quantiles)!r}")
        if len(set(quantiles)) < len(quantiles):
            raise ValueError(f"quantiles must differ, got {list(quantiles)!r}")
        self.bins, self.low, self.high = int(bins), float(low), float(high)
        self._edges: torch.Tensor | None = None  # see _bounds
        self.quantiles = tuple(quantiles)
        self._estimated = tuple(dict.fromkeys((*self.quantiles, 0.5)))  # the median is the value, asked for or not
        self.add_state("counts", torch.zeros(bins + 2), "sum")
        # the range of the finite values seen; a checkpoint from before it was kept loads it as unknown
        self.add_state("smallest", math.inf, "min", missing=-math.inf)
        self.add_state("largest", -math.inf, "max", missing=math.inf)
        if self.nan_policy == "propagate":  # the non-finite values, which the end bins count too
            for name in _NONFINITE:
                self.add_state(name, 0.0, "sum", missing=0.0)

    def _config(self) -> tuple[Any, ...]:
        return (self.bins, self.low, self.high, self.quantiles)

    def _state_settings(self) -> tuple[Any, ...]:
        return (self.bins, self.low, self.high)  # the quantiles are read from the counts: free to change

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
        self._extend_range(states, value, keep)
        if self.nan_policy == "propagate":
            nan = value.isnan()
            for name, which in zip(_NONFINITE, (value == -math.inf, value == math.inf, nan), strict=True):
                states[name].add_((which if keep is None else which & keep).sum(1))
            keep = ~nan if keep is None else keep & ~nan  # in no bin, as numpy.histogram drops it
        weight = torch.ones_like(value) if keep is None else keep.to(STATE_DTYPE)
        states["counts"].scatter_add_(1, self._bin_of(value), weight)

    def _bin_of(self, value: torch.Tensor) -> torch.Tensor:
        """Each value's index in ``counts``: the bin whose edges hold it. The arithmetic guess can round
        past an edge (0.3 in 10 bins over [0, 1) to bin 3), so one step towards the edges corrects it: the
        counts are ``numpy.histogram``'s. +inf lands in the overflow bin, -inf in the underflow one (and NaN in
        the overflow one, where the caller gives it no weight)."""
        scaled = ((value - self.low) / (self.high - self.low) * self.bins).floor()
        index = (torch.nan_to_num(scaled, nan=self.bins, posinf=self.bins, neginf=-1).clamp(-1, self.bins) + 1).long()
        bounds = self._bounds(value.device)
        index -= (value < bounds[index]).long()
        index += (value >= bounds[index + 1]).long()
        return index.clamp_(max=self.bins + 1)

    def _bounds(self, device: torch.device) -> torch.Tensor:
        """Where each index of ``counts`` starts, and ends the last: -inf, numpy's ``linspace(low, high,
        bins + 1)`` edges (computed its way, so the same doubles), +inf. Made on ``device`` (no host copy), once."""
        if self._edges is None or self._edges.device != device:
            step = (self.high - self.low) / self.bins
            edges = torch.arange(self.bins + 3, dtype=STATE_DTYPE, device=device).sub_(1).mul_(step).add_(self.low)
            edges[0], edges[-2], edges[-1] = -math.inf, self.high, math.inf
            self._edges = edges
        return self._edges

    def _extend_range(self, states: Mapping[str, torch.Tensor], value: torch.Tensor, keep: torch.Tensor | None) -> None:
        """Widen each member's range seen to the finite values of ``value`` ``(members, n)`` that ``keep``
        keeps (None: all)."""
        if not value.shape[1]:
            return
        drop = None if keep is None else ~keep
        if self.nan_policy == "propagate":  # kept NaN and inf count in the bins, not in the range
            bad = nonfinite(value)
            drop = bad if drop is None else drop | bad
        for_min = value if drop is None else value.masked_fill(drop, math.inf)
        for_max = value if drop is None else value.masked_fill(drop, -math.inf)
        torch.minimum(states["smallest"], for_min.amin(1), out=states["smallest"])
        torch.maximum(states["largest"], for_max.amax(1), out=states["largest"])

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        counts = states["counts"]  # (members, bins + 2)
        total = counts.sum(1)
        targets = torch.stack([total * q for q in self._estimated], dim=1)  # the inverted CDF's positions
        if self.nan_policy != "propagate":
            estimates = self._interpolate(states, counts, targets)
        else:  # estimated among the finite values; a position among the infinities is infinite, NaN is NaN
            below, above, nans = (states[name][:, None] for name in _NONFINITE)
            finite = counts - torch.cat([below, torch.zeros_like(counts[:, 1:-1]), above], 1)
            estimates = self._interpolate(states, finite, (targets - below).clamp(min=0))
            estimates = torch.where((below > 0) & (targets <= below), -math.inf, estimates)
            lesser = total[:, None] - above  # the values below inf
            estimates = torch.where((above > 0) & ((targets > lesser) | (lesser == 0)), math.inf, estimates)
            estimates = torch.where(nans > 0, math.nan, estimates)
        out = {"value": estimates[:, self._estimated.index(0.5)]}
        out.update({f"p{q * 100:g}": estimates[:, j] for j, q in enumerate(self.quantiles)})
        out.update(count=total, counts=counts)
        if "nonfinite" in states:
            out["nonfinite"] = states["nonfinite"]
        return out

    def _interpolate(
        self, states: Mapping[str, torch.Tensor], counts: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Each member's value at each cumulative count of ``targets`` ``(members, quantiles)``, interpolated
        inside the bin of ``counts`` (finite values only) that reaches it; NaN for a member with none."""
        smallest, largest = states["smallest"], states["largest"]  # (members,); unknown: -inf, +inf
        total = counts.sum(1)
        cumulative = counts.cumsum(1)
        # each bin's [lower, upper) edges, the underflow bin down to the smallest value seen and the overflow
        # bin up to the largest (pinned to low/high where none is known); device ops only (no host sync)
        edges = self.low + (self.high - self.low) / self.bins * torch.arange(
            self.bins + 1, device=counts.device, dtype=counts.dtype
        )
        floor = torch.where(smallest.isfinite(), smallest.clamp(max=self.low), self.low)[:, None]
        ceiling = torch.where(largest.isfinite(), largest.clamp(min=self.high), self.high)[:, None]
        inner = (counts.shape[0], self.bins)
        lower = torch.cat([floor, edges[:-1].expand(inner), edges[-1:].expand_as(floor)], 1)
        upper = torch.cat([edges[:1].expand_as(ceiling), edges[1:].expand(inner), ceiling], 1)
        # the bin where the cumulative count reaches each target; for 0 (p0), the first bin that holds any
        i = torch.where(
            targets > 0, torch.searchsorted(cumulative, targets), torch.searchsorted(cumulative, targets, right=True)
        ).clamp(max=self.bins + 1)
        before = torch.where(i > 0, cumulative.gather(1, (i - 1).clamp(min=0)), 0.0)
        inside = counts.gather(1, i)
        frac = torch.where(inside > 0, (targets - before) / inside, 0.0).clamp(0, 1)
        start = lower.gather(1, i)
        estimates = start + frac * (upper.gather(1, i) - start)
        seen = (smallest <= largest)[:, None]  # some finite value was seen (or the range is unknown)
        estimates = torch.where(seen, estimates.clamp(smallest[:, None], largest[:, None]), estimates)
        columns = list(estimates.unbind(1))
        for j, q in enumerate(self._estimated):  # p0 and p100 are the ends seen, exactly
            if q in (0.0, 1.0):
                end = smallest if q == 0.0 else largest
                columns[j] = torch.where(end.isfinite(), end, columns[j])
        return torch.where(total[:, None] > 0, torch.stack(columns, 1), math.nan)
