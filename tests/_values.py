"""Logged values and how to compare what comes back: floats bit for bit, nulls apart from NaN."""

from __future__ import annotations

import math
import struct
from typing import Any

import pandas as pd
from hypothesis import strategies as st

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308]),
)


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def same(logged: Any, read: Any) -> bool:
    """Whether a value read back is the one logged: floats bit for bit, None only as None."""
    if logged is None or read is None:
        return logged is None and read is None
    if isinstance(logged, float) or isinstance(read, float):
        return isinstance(read, float) and _bits(float(logged)) == _bits(read)
    return type(logged) is type(read) and logged == read


def column_of(frame: pd.DataFrame, name: str, rows: int) -> list[Any]:
    """A column of ``read_metrics``' frame as Python values (None for a null)."""
    if name not in frame.columns:
        return [None] * rows  # a key that only ever held None has no column
    series = frame[name]
    if isinstance(series.dtype, pd.ArrowDtype):
        return series.array.__arrow_array__().to_pylist()
    return series.tolist()


def expected_column(kept: list[dict[str, Any]], name: str) -> list[Any]:
    """What the rows logged under ``name`` read back as: ints that shared a column with floats are floats."""
    column = [row.get(name) for row in kept]
    if any(isinstance(v, float) for v in column):
        column = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in column]
    return column
