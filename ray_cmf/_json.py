"""Strict JSON for values that may not be finite: NaN, inf and -inf are data, and JSON has no numbers for them.

Everything ray_cmf writes as JSON (``--json`` output, the report's data, Parquet footers) is valid under a
strict parser: a non-finite float is written as one of the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` (the spellings of JavaScript and of Python's lenient parser), and a null stays ``null``.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from typing import Any

NONFINITE_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
NONFINITE_VALUE = {text: float(key) for key, text in NONFINITE_TEXT.items()}


class JsonText(str):
    """A table cell that holds a value no cell type holds (a list, say) as its JSON text: tables show it as
    it is, and quote a text that reads alike beside it (``[1, 2]`` and ``"[1, 2]"`` never read as one)."""

    __slots__ = ()


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: non-finite floats as their strings, NumPy and pandas scalars unboxed,
    missing values (None, pandas' NA and NaT) as None, times as ISO 8601, anything else as ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):  # NumPy's float64 is one: written as a plain float
        return float(value) if math.isfinite(value) else NONFINITE_TEXT[str(float(value))]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if _missing(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return jsonable(value.item())
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return str(value)


def _missing(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def dumps(value: Any, **options: Any) -> str:
    """Strict JSON text of ``value`` (see :func:`jsonable`)."""
    return json.dumps(jsonable(value), allow_nan=False, **options)


def float_of(value: Any) -> Any:
    """The inverse of :func:`jsonable` for one number: ``"Infinity"`` and its kin back as floats."""
    return NONFINITE_VALUE.get(value, value) if isinstance(value, str) else value
