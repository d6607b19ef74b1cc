"""ray_cmf: fine-grained, crash-safe, versioned training metrics for Ray Tune and Ray Train.

Importing ``ray_cmf`` imports neither ray nor torch; the integrations load them on use.
"""

from __future__ import annotations

from ray_cmf.buffer import FinishedFile, MetricBuffer
from ray_cmf.cmf import Cmf
from ray_cmf.errors import (
    InvalidNameError,
    InvalidValueError,
    MetricsNotFoundError,
    RayCmfError,
    SchemaError,
    StoreError,
)
from ray_cmf.recovery import recover
from ray_cmf.store import Store

__all__ = [
    "Cmf",
    "FinishedFile",
    "InvalidNameError",
    "InvalidValueError",
    "MetricBuffer",
    "MetricsNotFoundError",
    "RayCmfError",
    "SchemaError",
    "Store",
    "StoreError",
    "recover",
]
__version__ = "0.1.0"
