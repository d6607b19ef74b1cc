"""Device-side metrics: updates touch device tensors only; a sync packs every state into one collective.

from ray_cmf.metrics import MetricCollection, Mean, Max, Accuracy
metrics = MetricCollection({"loss": Mean(), "acc": Accuracy(), "grad_max": Max()}, device="cuda")
for step, (x, y) in enumerate(loader):
    ...
    metrics.update(loss=loss, acc=(logits, y))   # or metrics["loss"].update(loss), ...
    if step % 50 == 49:
        row = metrics.to_row(metrics.sync().wait())   # one packed sync, one host transfer
"""

from __future__ import annotations

from ray_cmf.metrics.aggregation import Max, Mean, Min, Sum
from ray_cmf.metrics.base import Metric
from ray_cmf.metrics.classification import Accuracy
from ray_cmf.metrics.collection import MetricCollection
from ray_cmf.metrics.histogram import Histogram
from ray_cmf.metrics.packing import CollectiveTimeoutError, LayoutMismatchError, SyncHandle

__all__ = [
    "Accuracy",
    "CollectiveTimeoutError",
    "Histogram",
    "LayoutMismatchError",
    "Max",
    "Mean",
    "Metric",
    "MetricCollection",
    "Min",
    "Sum",
    "SyncHandle",
]
