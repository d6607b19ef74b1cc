"""ray_cmf: fine-grained, crash-safe, versioned training metrics for Ray Tune and Ray Train.

Importing ``ray_cmf`` imports neither ray nor torch; the integrations load them on use.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# ML-Metadata's C++ library logs to stderr ("I1201 ... Connecting to database") as soon as it loads; its
# errors reach Python as exceptions that ray_cmf words itself. Only fatal lines pass, unless the user sets
# GLOG_minloglevel (0 shows everything; ``ray-cmf -v`` does that).
from ray_cmf.constants import GLOG_LEVEL_ENV

os.environ.setdefault(GLOG_LEVEL_ENV, "3")

from ray_cmf.buffer import MetricBuffer
from ray_cmf.errors import (
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    MetricsNotFoundError,
    PrecisionError,
    RayCmfError,
    RecoveryError,
    SchemaError,
    StoreError,
)
from ray_cmf.series_format import FinishedFile

if TYPE_CHECKING:
    from ray_cmf.actor import start_writer
    from ray_cmf.cmf import Cmf
    from ray_cmf.compare import Sweep
    from ray_cmf.recovery import recover
    from ray_cmf.store import Store
    from ray_cmf.system import SystemSampler
    from ray_cmf.train import CmfTrainCallback, StepLogger
    from ray_cmf.tune import CmfRayLogger

# Integrations load ray, and the store ML-Metadata, on first use only: ``import ray_cmf`` stays light, and
# ``ray_cmf.metrics`` loads in a training worker without either.
_LAZY = {
    "Cmf": "ray_cmf.cmf",
    "CmfRayLogger": "ray_cmf.tune",
    "CmfTrainCallback": "ray_cmf.train",
    "StepLogger": "ray_cmf.train",
    "Store": "ray_cmf.store",
    "Sweep": "ray_cmf.compare",
    "SystemSampler": "ray_cmf.system",
    "recover": "ray_cmf.recovery",
    "start_writer": "ray_cmf.actor",
}


# The modules a user reaches as attributes (``import ray_cmf`` then ``ray_cmf.tune.get_cmf()``), loaded on
# first use as well.
_SUBMODULES = {"metrics", "train", "tune"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"ray_cmf.{name}")
    raise AttributeError(f"module 'ray_cmf' has no attribute {name!r}")


__all__ = [
    "Cmf",
    "CmfRayLogger",
    "CmfTrainCallback",
    "FinishedFile",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidValueError",
    "MetricBuffer",
    "MetricsNotFoundError",
    "PrecisionError",
    "RayCmfError",
    "RecoveryError",
    "SchemaError",
    "StepLogger",
    "Store",
    "StoreError",
    "Sweep",
    "SystemSampler",
    "recover",
    "start_writer",
]
__version__ = "0.1.0"
