"""Accuracy (top-1 or top-k) from logits, probabilities or predicted labels."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ray_cmf.metrics.aggregation import outputs
from ray_cmf.metrics.base import Metric, nonfinite, per_member, rows_mask


class Accuracy(Metric):
    """Fraction of samples whose target is among the top-``k`` predictions.

    ``preds_or_logits`` is either class scores of shape ``(N, C)`` (or ``(N, C, ...)``) or predicted labels
    with the target's shape, compared with the targets as they are (binary probabilities need a threshold
    first: ``probs > 0.5``). Samples whose scores are not all finite, or whose predicted label is NaN or
    inf, are excluded and counted (under ``nan_policy="exclude"``); under ``"propagate"`` infinite scores
    rank as values and a NaN score or label makes the value NaN. Tied scores rank by class index.
    Samples whose target is ``ignore_index`` (``-100`` for padding, as ``cross_entropy`` has it) are not
    samples at all; any other target that is no class counts as a wrong prediction.

    Example:
        >>> m = Accuracy()
        >>> m.update(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        >>> m.compute()["value"].item()
        0.5
    """

    correct: torch.Tensor
    total: torch.Tensor
    higher_is_better = True
    _stages_arguments = True

    def __init__(self, top_k: int = 1, ignore_index: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not _an_int(top_k) or top_k < 1:  # a NumPy int counts: it is one
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        if ignore_index is not None and not _an_int(ignore_index):
            raise ValueError(f"ignore_index must be an int or None, got {ignore_index!r}")
        self.top_k = int(top_k)
        self.ignore_index = None if ignore_index is None else int(ignore_index)
        self.add_state("correct", 0.0, "sum")
        self.add_state("total", 0.0, "sum")

    def update(self, preds_or_logits: torch.Tensor, target: torch.Tensor) -> None:
        self._stage(preds_or_logits, target)

    def _check(self, preds_or_logits: torch.Tensor, target: torch.Tensor) -> None:
        scores = preds_or_logits.dim() == target.dim() + 1
        if scores:
            if (preds_or_logits.shape[:1] + preds_or_logits.shape[2:]) != target.shape:
                raise ValueError(
                    f"scores of shape {tuple(preds_or_logits.shape)} do not match targets of shape "
                    f"{tuple(target.shape)} (expected (N, C, ...) against (N, ...))"
                )
            if preds_or_logits.shape[1] < self.top_k:  # every sample would be right
                raise ValueError(
                    f"top_k={self.top_k} needs scores of at least {self.top_k} classes, got "
                    f"{preds_or_logits.shape[1]} (shape {tuple(preds_or_logits.shape)})"
                )
        elif preds_or_logits.shape != target.shape:
            raise ValueError(
                f"predictions of shape {tuple(preds_or_logits.shape)} fit targets of shape {tuple(target.shape)} "
                "neither as labels (the targets' shape) nor as scores ((N, C, ...) against (N, ...))"
            )
        elif self.top_k != 1:
            raise ValueError(f"top_k={self.top_k} needs class scores, got labels of shape {tuple(target.shape)}")

    def _config(self) -> tuple[Any, ...]:
        return (self.top_k, self.ignore_index)

    def _apply(
        self, states: Mapping[str, torch.Tensor], inputs: list[torch.Tensor], valid: torch.Tensor | None
    ) -> None:
        preds, target = inputs
        keep = None if valid is None else rows_mask(valid, target).expand(target.shape)
        if target.dim() > 2:  # the staged updates' dimension joins the samples' dimension
            preds, target = preds.flatten(1, 2), target.flatten(1, 2)
            keep = None if keep is None else keep.flatten(1, 2)
        if self.ignore_index is not None:
            counted = target != self.ignore_index
            keep = counted if keep is None else keep & counted
        labels = preds.dim() == target.dim()
        if labels:  # predicted labels: a NaN or inf one is no label (left out and counted)
            hit = (preds == target) & (target >= 0) & (target == target.long())  # a target that names a class
            bad = nonfinite(preds) if self._needs_mask(preds) else None
        else:
            hit = preds.argmax(dim=2) == target if self.top_k == 1 else self._in_top_k(preds.movedim(2, -1), target)
            bad = nonfinite(preds).any(dim=2) if self._needs_mask(preds) else None
        dims = per_member(hit)
        if self.nan_policy == "propagate" and preds.is_floating_point():  # a NaN sample makes the value NaN
            nan = preds.isnan() if labels else preds.isnan().any(dim=2)
            nan = nan if keep is None else nan & keep
            states["correct"].add_(torch.where(nan.any(dims), math.nan, 0.0))
        if bad is not None:
            bad = bad if keep is None else bad & keep
            excluded = bad.sum(dims)
            states["nonfinite"].add_(excluded)
            states["total"].sub_(excluded)
            hit = hit & ~bad
        states["total"].add_(math.prod(hit.shape[1:]) if keep is None else keep.sum(dims))
        states["correct"].add_((hit if keep is None else hit & keep).sum(dims))

    def _in_top_k(self, preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Whether each target ranks among the ``top_k`` scores of ``preds`` ``(..., C)``, tied scores ranked by
        class index as ``argmax`` ranks them (``topk`` orders ties as it likes, so a target could leave the top
        2 while it is top 1); a target that is no class is never among them."""
        classes = preds.shape[-1]
        index = target.long().clamp(0, classes - 1)
        known = target == index  # a class: in range, and (a float target) a whole number
        index = index.unsqueeze(-1)
        own = preds.gather(-1, index)
        before = torch.arange(classes, device=preds.device) < index
        ahead = (preds > own).sum(-1) + ((preds == own) & before).sum(-1)
        return known & (ahead < self.top_k)

    def _compute(self, states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return outputs(states["correct"] / states["total"], states)


def _an_int(value: Any) -> bool:
    """Whether ``value`` is an int (Python's or NumPy's), not a bool."""
    return not isinstance(value, bool) and hasattr(value, "__index__")
