"""The frames a sweep reads back as: their key columns, what counts as a number, and per-trial summaries.

Shared by :mod:`ray_cmf.compare` (``Sweep``), the report and the plots, so that each reads a steps frame
the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

TRIAL_COLUMN = "trial_id"
SERIES_COLUMN = "series"  # which of a trial's series of one name a row is from, where a trial has several
RANK_COLUMN = "rank"  # a Train rank's rows: a key of the row, not a metric
KEY_COLUMNS = (TRIAL_COLUMN, SERIES_COLUMN, RANK_COLUMN)


def is_number(arrow_type: pa.DataType) -> bool:
    """Whether an Arrow column holds numbers (ints or floats; not bools)."""
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type))


def numeric(series: pd.Series) -> bool:
    """Whether a pandas column holds numbers (not bools): one recorded as Python values counts when every
    value present is an int or a float."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(series):
        return False
    if pd.api.types.is_numeric_dtype(series):
        return True
    present = series.dropna()
    return bool(len(present)) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)


def mode_of(mode: str | Mapping[str, str], metric: str) -> str:
    """Whether lower (``min``) or higher (``max``) is better for ``metric``: one mode, or one per metric."""
    return mode.get(metric, "min") if isinstance(mode, Mapping) else mode


def summarize(frame: pd.DataFrame, metrics: Sequence[str], mode: str | Mapping[str, str]) -> pd.DataFrame:
    """Per trial of a steps frame: ``<metric>_best`` (the best finite value: NaN and ±inf never rank
    best), ``<metric>_final`` (the last value logged, non-finite included; nulls skipped when the column
    keeps them apart, as an Arrow-backed one does) and ``steps`` (its rows)."""
    import pandas as pd

    trial = frame[TRIAL_COLUMN].astype(str)
    summary = pd.DataFrame(index=pd.Index(trial.unique(), name=TRIAL_COLUMN))
    for metric in metrics:
        values = frame[metric].to_numpy(dtype=float, na_value=np.nan)
        finite = pd.Series(np.where(np.isfinite(values), values, np.nan), index=frame.index).groupby(trial)
        summary[f"{metric}_best"] = finite.max() if mode_of(mode, metric) == "max" else finite.min()
        last = frame[metric].groupby(trial).last()
        summary[f"{metric}_final"] = pd.Series(last.to_numpy(dtype=float, na_value=np.nan), index=last.index)
    summary["steps"] = trial.groupby(trial).size()
    return summary
