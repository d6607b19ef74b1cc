"""The frames a sweep reads back as: their key columns, what counts as a number, and per-trial summaries.

Shared by :mod:`ray_cmf.compare` (``Sweep``), the report and the plots, so that each reads a steps frame
the same way.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ray_cmf._cells import shown_text
from ray_cmf._json import JsonText
from ray_cmf.constants import (
    ATTEMPT_COLUMN,
    CHECKPOINTED_COLUMN,
    EXACT_FLOAT_INT,
    REPLACED,
    REPORT_COLUMN,
    REPORTS_METRICS_NAME,
    SEQUENCE_COLUMN,
    WORKER_GROUP_COLUMN,
)
from ray_cmf.errors import InvalidArgumentError, RayCmfError

if TYPE_CHECKING:
    import pandas as pd

TRIAL_COLUMN = "trial_id"
SERIES_COLUMN = "series"  # which of a trial's series of one name a row is from, where a trial has several
RANK_COLUMN = "rank"  # a Train rank's rows: a key of the row, not a metric
PID_COLUMN = "pid"  # the process a system_metrics row sampled: an identifier, not a metric
ERROR_COLUMN = "error"  # the trial table's: what a FAILED trial or run raised, as it recorded it
RESTART_COLUMNS = ("replaced_by", "restarted_from")  # the trials that Tune's restart_errored links, where it did
KEY_COLUMNS = (TRIAL_COLUMN, SERIES_COLUMN, RANK_COLUMN)
STEP_COLUMN = "training_iteration"
# A row's step, the first of these it holds: the step it logged (a Tune trainable's reported one too), else
# Tune's iteration, a Train report's index (each rank's copy of a report is one step), its row number
STEP_CANDIDATES = ("step", STEP_COLUMN, REPORT_COLUMN, SEQUENCE_COLUMN)
# A Train run's reports: the step the loop reported, else the report's index (a loop's own training_iteration
# is its data, as a Tune trainable's own report is)
REPORT_STEP_CANDIDATES = ("step", REPORT_COLUMN, STEP_COLUMN, SEQUENCE_COLUMN)
_BOOKKEEPING = (ATTEMPT_COLUMN, PID_COLUMN, WORKER_GROUP_COLUMN, CHECKPOINTED_COLUMN, "wall_time")
_NOT_METRICS = frozenset({*KEY_COLUMNS, *STEP_CANDIDATES, *_BOOKKEEPING})


def step_candidates(metrics_name: str) -> tuple[str, ...]:
    """The columns a series' rows are stepped by, first that holds one first (see :data:`STEP_CANDIDATES`)."""
    return REPORT_STEP_CANDIDATES if metrics_name == REPORTS_METRICS_NAME else STEP_CANDIDATES


def step_columns(candidates: Sequence[str], schema: pa.Schema, files: Sequence[pa.Schema] = ()) -> list[str]:
    """The columns that step the series (see :func:`row_steps`), in ``candidates``' order: each of its
    ``files``' first candidate, and beside a ``step`` the one a row without it falls back to (Tune's
    iteration, a Train report's index)."""
    steps = []
    for of in (schema, *files):
        first = next((c for c in candidates if c in of.names), None)
        if first is None:
            raise RayCmfError(f"The series has no step column (one of {list(candidates)}); it has {of.names}")
        fallback = candidates[1]
        steps += [first, fallback] if first == "step" and fallback in of.names else [first]
    return [c for c in candidates if c in steps]


def row_steps(table: pa.Table, steps: Sequence[str]) -> pa.ChunkedArray:
    """Each row's step: its first of the ``steps`` columns (those of :func:`step_columns` that ``table``
    has) that holds a value; a column of numbers falls back only to numbers."""
    step = table.column(steps[0])
    for other in steps[1:] if is_number(step.type) else ():
        if step.null_count:
            step = pc.coalesce(step, table.column(other).cast(step.type))
    return step


def is_metric(column: str) -> bool:
    """Whether a column of a series (as stored or as read) is a metric: not a key, a step, bookkeeping or a
    private (``__``) column. The one rule for the trial table, the plots and the report alike."""
    return column not in _NOT_METRICS and not column.startswith("__")


def is_number(arrow_type: pa.DataType) -> bool:
    """Whether an Arrow column holds numbers (ints or floats; not bools)."""
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type))


def exact_frame(table: pa.Table, index: str | None = None, *, arrow_numbers: bool = False) -> pd.DataFrame:
    """A table as pandas without losing a value: a column with nulls becomes Arrow-backed, so its ints stay
    ints and a null (nothing logged) stays apart from a NaN (logged); others keep their NumPy dtype
    (``arrow_numbers``: every number column is Arrow-backed). A dictionary column (trial ids, series names)
    is a pandas category, nulls and all: pandas cannot read back an Arrow-backed one that it wrote to Parquet.
    Indexed by the column ``index`` when given. No column is copied more than once, so a long series is read
    as it is."""
    import pandas as pd

    def series(column: pa.ChunkedArray) -> pd.Series:
        nulls = column.null_count and not pa.types.is_dictionary(column.type)
        arrow = nulls or (arrow_numbers and is_number(column.type))
        return column.to_pandas(types_mapper=pd.ArrowDtype) if arrow else column.to_pandas()

    columns = {name: series(table.column(name)).array for name in table.column_names if name != index}
    rows = pd.Index(series(table.column(index)), name=index) if index is not None else None
    return pd.DataFrame(columns, index=rows, copy=False)


# Beyond this magnitude a plot's axis arithmetic (its span, margins and ticks) overflows, in matplotlib and
# in plotly alike: a diverged trial's 1e308 is then shown apart, as inf is, or on a symmetric-log axis.
DRAWABLE_MAX = 1e300


def drawable(values: np.ndarray) -> np.ndarray:
    """Which values a plot's linear axis can hold: finite ones within ±:data:`DRAWABLE_MAX`."""
    with np.errstate(invalid="ignore"):
        return np.abs(values) <= DRAWABLE_MAX


def alone(drawn: np.ndarray) -> np.ndarray:
    """Which points of a curve no line reaches: drawn, with neither neighbour drawn (the only point, or one
    between two breaks). A plot draws no line of one point, so these need a marker to be seen at all."""
    shown = np.r_[False, drawn, False]
    return drawn & ~shown[:-2] & ~shown[2:]


_BULK = (0.05, 0.95)  # the quantiles of a plot's values that count as its bulk
_REACH = 20.0  # how many widths of the bulk beyond it a value may lie and still set the axis
_TINY = 1e-290  # values this close to zero are zero to a plot (below it, 5% of their spread rounds away)


def _width(low: float, high: float) -> float:
    """The width of a bulk of values, or their scale where they are all one value."""
    return float(high - low) or max(abs(low), abs(high), 1.0)


def _bulk_of_most(bulks: np.ndarray) -> tuple[float, float]:
    """The bulk of a plot of several curves, given each curve's bulk (rows of low, high): from the lowest low
    to the highest high of the curves whose bulks lie within :data:`_REACH` widths (the median low to the
    median high, the median curve's bulk, or how far from the median curve most curves lie: the widest) of
    the median, so that curves far from most of the others, as diverging ones are, are marked beyond and
    stretch no axis, while flat curves at different levels are all drawn. For an even count the median is
    the inner of the two middle values. Where no curve is near (two curves, each wide on one side), the
    bulk of them all."""
    lows, highs = np.sort(bulks[:, 0]), np.sort(bulks[:, 1])
    middle = (len(bulks) - 1) / 2
    low, high = sorted((lows[math.ceil(middle)], highs[math.floor(middle)]))
    centres = bulks.mean(axis=1)
    apart = float(np.median(np.abs(centres - np.median(centres))))  # how far apart most curves lie
    reach = _REACH * max(_width(low, high), float(np.median(bulks[:, 1] - bulks[:, 0])), apart)
    near = (bulks[:, 0] >= low - reach) & (bulks[:, 1] <= high + reach)
    kept = bulks[near] if near.any() else bulks
    return float(kept[:, 0].min()), float(kept[:, 1].max())


@dataclass(frozen=True)
class Span:
    """The values a curve plot's axis shows. Values outside it (NaN, inf, beyond :data:`DRAWABLE_MAX`, or
    far outside the bulk of the values, as a diverged trial's climb is) are marked at its edge instead, so
    that one trial cannot flatten every other curve."""

    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray, curves: Sequence[np.ndarray] = ()) -> Span:
        """The span of a plot's values: the drawable ones within :data:`_REACH` widths of their bulk, so a
        spike or a divergence is marked and the learning curves stay readable. The bulk is the values' 5% to
        95% quantiles, or, given the plot's ``curves`` (each one's values), that of most curves (see
        :func:`_bulk_of_most`): a trial that diverges slowly holds more than 5% of the values."""
        shown = values[drawable(values)]
        if not shown.size:
            return cls(0.0, 1.0)
        bulks = [np.quantile(c[drawable(c)], _BULK) for c in curves if drawable(c).any()]
        low, high = _bulk_of_most(np.array(bulks)) if len(bulks) > 1 else np.quantile(shown, _BULK)
        width = _width(low, high)
        within = shown[(shown >= low - _REACH * width) & (shown <= high + _REACH * width)]
        return cls(float(within.min()), float(within.max()))

    def holds(self, values: np.ndarray) -> np.ndarray:
        """Which values the axis shows (NaN never)."""
        with np.errstate(invalid="ignore"):
            return (values >= self.low) & (values <= self.high)

    def side(self, value: float) -> str:
        """Where a value outside the span is marked: ``"NaN"``, above it (``"Infinity"``) or below it
        (``"-Infinity"``), named as JSON's non-finite values are."""
        return "NaN" if math.isnan(value) else "Infinity" if value > self.high else "-Infinity"

    def edges(self) -> dict[str, float]:
        """Where each side's marks go: just outside the span (NaN with the values above it). A span a plot
        cannot show as narrow as it is (one value, or values of about zero) is padded as the plot widens it."""
        magnitude = max(abs(self.low), abs(self.high))
        width = self.high - self.low
        if width <= magnitude * 1e-9 or magnitude < _TINY:  # drawn around the value, as wide as its magnitude
            width = magnitude if magnitude >= _TINY else 1.0
        pad = max(width * 0.05, magnitude * 1e-6)
        return {"Infinity": self.high + pad, "NaN": self.high + pad, "-Infinity": self.low - pad}

    def marks(self, y: np.ndarray, most: int) -> np.ndarray:
        """Indices of a curve's values outside the span worth marking: all of them, up to ``most``; beyond,
        where each run of them of one kind (NaN, inf, -inf, finite values above or below) starts (at most
        ``most`` runs), and the last one."""
        odd = np.flatnonzero(~self.holds(y))
        if len(odd) <= most:
            return odd
        v = y[odd]
        kind = np.where(np.isnan(v), 0, np.where(v > self.high, 1, -1) * np.where(np.isinf(v), 2, 1))
        starts = odd[np.r_[True, (np.diff(odd) > 1) | (np.diff(kind) != 0)]]
        return np.unique(np.r_[starts[:most], odd[-1]])


def floats(series: pd.Series) -> np.ndarray:
    """A column as float64 for plotting and scoring, a null (nothing logged) as NaN."""
    return series.to_numpy(dtype=float, na_value=np.nan)


def log_spread(values: np.ndarray) -> bool:
    """Whether finite values are positive and span two decades or more: a hyperparameter likely sampled
    log-uniformly (a config records values, not Tune's search space), so shown on a log scale."""
    finite = values[np.isfinite(values)]
    return bool(finite.size > 1 and finite.min() > 0 and finite.max() >= 100 * finite.min())


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


def numbers_as_text(series: pd.Series) -> bool:
    """Whether a text column holds only numbers written out (exact text is how an int beyond 2**53 in one trial
    and a float in another read): it draws as floats."""
    import pandas as pd

    present = series.dropna()
    if not len(present) or not all(isinstance(v, str) for v in present):
        return False
    try:
        pd.Series(present, dtype=object).to_numpy(dtype=float)
    except ValueError:
        return False
    return True


def mode_of(mode: str | Mapping[str, str], metric: str) -> str:
    """Whether lower (``min``) or higher (``max``) is better for ``metric``: one mode, or one per metric."""
    return mode.get(metric, "min") if isinstance(mode, Mapping) else mode


def blank(value: Any) -> bool:
    """Whether a recorded value is a blank: None, empty text or NaN."""
    return value is None or value == "" or (isinstance(value, float) and value != value)


def sort_trials(table: pd.DataFrame, column: str, mode: str | Mapping[str, str] = "min") -> pd.DataFrame:
    """The trial table ordered by ``column``: a ``_best``/``_final`` one best first under ``mode`` (its finite
    values: ±inf never ranks best, and comes after them; a trial ``restart_errored`` replaced is never
    ranked, and comes after every other), any other ascending (numbers before text, whatever mix a config
    key holds); tied trials by trial id; blanks last, by trial id."""
    if column not in table.columns:
        if not len(table):  # nothing was picked: a summary column of no trial is nothing to sort by, not an error
            return table
        raise InvalidArgumentError(f"sort {column!r} is not a column; the table has {list(table.columns)}")
    summary = column.removesuffix("_mean")  # a group's mean of a summary sorts as the summary
    metric = summary.rsplit("_", 1)[0]
    ranked = summary.endswith(("_best", "_final"))
    descending = ranked and mode_of(mode, metric) == "max"
    values = table[column].tolist()
    rows = list(range(len(values)))
    if TRIAL_COLUMN in table.columns:  # of tied trials (and of blanks), the earlier first (as top_rank has it)
        ids = [trial_order(trial) for trial in table[TRIAL_COLUMN].astype(str)]
        rows.sort(key=lambda i: ids[i])
    present = sorted((i for i in rows if not blank(values[i])), key=lambda i: _order(values[i]), reverse=descending)
    absent = [i for i in rows if blank(values[i])]
    if ranked:  # a diverged trial's -inf (or +inf) is no best: after the finite values, before the blanks
        present.sort(key=lambda i: _order(values[i])[0] == 0 and math.isinf(values[i]))
        replaced = table["status"].eq(REPLACED).tolist() if "status" in table.columns else [False] * len(values)
        return table.iloc[sorted(present + absent, key=lambda i: replaced[i])]  # stable: each part in its order
    return table.iloc[present + absent]


def trial_order(trial: str) -> tuple[str, int]:
    """Where a trial id goes among tied trials: as text (Tune's ids, ``110f9_00002``, sort so by sweep and
    then by trial), but the MLMD execution id of a ``<stage>/<id>#<n>`` name as a number, so that ``exp/x#4``
    comes before ``exp/x#14``."""
    name, mark, number = trial.rpartition("#")
    return (name, int(number)) if mark and number.isdecimal() else (trial, -1)


def _order(value: Any) -> tuple[int, Any]:
    return (0, float(value)) if isinstance(value, int | float | np.number) else (1, str(value))


def summarize(frame: pd.DataFrame, metrics: Sequence[str], mode: str | Mapping[str, str]) -> pd.DataFrame:
    """Per trial of a steps frame: ``<metric>_best`` (the best finite value: NaN and ±inf never rank
    best), ``<metric>_final`` (the last value logged, non-finite included; nulls skipped when the column
    keeps them apart, as an Arrow-backed one does) and ``steps`` (its rows). A Train run's rows are read
    as Ray Train reads its result, from its rank 0 (see :func:`lead_rank`). A metric none of the frame's
    trials logged is NaN for each."""
    import pandas as pd

    frame = lead_rank(frame)
    trial = frame[TRIAL_COLUMN].astype(str)
    columns: dict[str, Any] = {}  # made whole at the end: a frame grown a column at a time warns past 100
    for metric in metrics:
        if metric not in frame.columns:
            columns[f"{metric}_best"] = columns[f"{metric}_final"] = math.nan
        elif pd.api.types.is_integer_dtype(frame[metric].dtype):  # ints are all finite: kept as ints
            grouped = frame[metric].groupby(trial)
            columns[f"{metric}_best"] = exact_ints(grouped.max() if mode_of(mode, metric) == "max" else grouped.min())
            columns[f"{metric}_final"] = exact_ints(grouped.last())
        else:
            values = floats(frame[metric])
            finite = pd.Series(np.where(np.isfinite(values), values, np.nan), index=frame.index).groupby(trial)
            columns[f"{metric}_best"] = finite.max() if mode_of(mode, metric) == "max" else finite.min()
            last = frame[metric].groupby(trial).last()
            columns[f"{metric}_final"] = pd.Series(floats(last), index=last.index)
    columns["steps"] = trial.groupby(trial).size()
    return pd.DataFrame(columns, index=pd.Index(trial.unique(), name=TRIAL_COLUMN))


def lead_rank(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows a trial's summary reads: where rows carry a Train rank, those of the trial's lowest rank
    (rank 0: Ray Train's result is what rank 0 reported) and those of no rank (the trial's own process)."""
    if RANK_COLUMN not in frame.columns or not len(frame):
        return frame
    rank = frame[RANK_COLUMN]
    lowest = rank.groupby(frame[TRIAL_COLUMN].astype(str)).transform("min")
    return frame[(rank.isna() | (rank == lowest)).to_numpy(dtype=bool)]


def exact_ints(values: pd.Series) -> pd.Series:
    """A summary column that holds ints, as Python ints (a float another trial logged as a float), NaN where
    a trial has none: a column that a trial without the metric joins keeps them (int64 would become
    float64, which rounds ints beyond 2**53)."""
    import pandas as pd

    def exact(value: Any) -> int | float:
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            return int(value)
        return math.nan if pd.isna(value) else float(value)

    return pd.Series([exact(v) for v in values], index=values.index, dtype=object, name=values.name)


def exact_summary(rows: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per-trial summaries (trial id -> column -> value) as a frame: a column that holds an int keeps its ints
    (see :func:`exact_ints`), any other is float64."""
    import pandas as pd

    index = pd.Index(list(rows), dtype=object)
    columns = {}
    for column in dict.fromkeys(c for row in rows.values() for c in row):
        values = pd.Series([row.get(column, math.nan) for row in rows.values()], index=index, dtype=object)
        ints = any(isinstance(v, int) and not isinstance(v, bool) for v in values)
        columns[column] = exact_ints(values) if ints else values.astype(float)
    return pd.DataFrame(columns, index=index)


def settle_ints(table: pd.DataFrame) -> pd.DataFrame:
    """The summary columns of :func:`exact_ints` as int64 again where no blank joined (every value an int), and a
    metric's ``_best`` and ``_final`` as float64 where a trial logged it as floats: ints and floats read as
    floats, as in ``steps()``, unless one of its ints is beyond 2**53, which a float would round (both columns
    then stay exact)."""
    summaries = [c for c in table.columns if c.endswith(("_best", "_final")) and table[c].dtype == object]
    for column in summaries:
        values = table[column]
        if len(values) and all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
            table[column] = values.astype("int64")
    for metric in dict.fromkeys(c.rsplit("_", 1)[0] for c in summaries):
        pair = [c for c in (f"{metric}_best", f"{metric}_final") if c in summaries and table[c].dtype == object]
        values = [v for column in pair for v in table[column]]
        if any(type(v) is float and not math.isnan(v) for v in values) and all(
            type(v) is float or (type(v) is int and abs(v) <= 2**53) for v in values
        ):
            for column in pair:
                table[column] = table[column].astype("float64")
    return table


CONFIG_EXCEPT = "config except "  # group_by="config except seed": every config key but those named


def summary_columns(columns: Iterable[str]) -> list[str]:
    """A trial table's ``<metric>_best`` and ``<metric>_final`` columns: those that come in such a pair, whatever
    the metric's name (``config/lr``); a config key that ends in ``_best`` has no ``_final`` beside it."""
    names = list(columns)
    present = set(names)
    return [
        c
        for c in names
        if c.endswith(("_best", "_final"))
        and {f"{c.rsplit('_', 1)[0]}_{kind}" for kind in ("best", "final")} <= present
    ]


def config_columns(columns: Iterable[str]) -> list[str]:
    """A trial table's config columns (``config/<key>``), less the summaries of a metric whose name starts so
    (``config/x_best`` and ``config/x_final`` of a metric ``config/x`` are results, see :func:`summary_columns`)."""
    names = list(columns)
    summaries = set(summary_columns(names))
    return [c for c in names if c.startswith("config/") and c not in summaries]


def group_keys(table: pd.DataFrame, group_by: str | Sequence[str]) -> list[str]:
    """The trial-table columns that ``group_by`` names: columns (``config/opt``, ``tag/team``), or
    ``"config except seed, lr"`` for every config column but those. An unknown name raises, listing them."""
    names = [group_by] if isinstance(group_by, str) else list(group_by)
    keys: list[str] = []
    for name in names:
        if name.startswith(CONFIG_EXCEPT):
            left_out = {f"config/{k.strip().removeprefix('config/')}" for k in name[len(CONFIG_EXCEPT) :].split(",")}
            config = config_columns(table.columns)
            unknown = sorted(left_out - set(config))
            if unknown:
                raise InvalidArgumentError(
                    f"group_by {name!r}: {unknown} are not config keys; the config keys are {config}"
                )
            keys += [c for c in config if c not in left_out]
        elif name in table.columns:
            keys.append(name)
        else:
            raise InvalidArgumentError(f"group_by {name!r} is not a column; the trials have {list(table.columns)}")
    if not keys:
        raise InvalidArgumentError(f"group_by {group_by!r} leaves no column to group by")
    return list(dict.fromkeys(keys))


def group_label(values: Sequence[object], keys: Sequence[str]) -> str:
    """A group's name: ``opt=adam, lr=0.1`` (config/ and tag/ prefixes dropped; a missing value is blank, and
    a text quoted where it could read as none or as a number or bool: ``team=""``, ``seed="1"``)."""
    return ", ".join(f"{k.split('/', 1)[-1]}={_label_text(v)}" for k, v in zip(keys, values, strict=True))


def _label_text(value: object) -> str:
    """A key's value in a group's name: no two values of a key share one (the text "1" and the number 1, ""
    and a missing value), so the name alone tells the groups apart; two equal numbers share it."""
    value = _present(value)
    if value is None:
        return ""
    if type(value) is float and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return str(int(value))  # the number an int of that value names: 1.0 and 1 are one group
    return shown_text(value, beside_values=True) if isinstance(value, str) else str(value)


def _present(value: object) -> object:
    """A recorded value, or None where there is none (pandas' NA). A NaN is a value: the trial table keeps its
    recorded columns as objects with None where a trial lacks one (see ``Sweep.trials``)."""
    import pandas as pd

    return None if value is None or value is pd.NA else value


def group_summaries(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """One row per group of trials that share the values of ``keys``: the key values, ``group`` (its label),
    ``trials`` (how many), ``trial_ids``, ``status`` (each status and its count), and the mean and standard
    deviation (``_mean``, ``_std``; sample std, NaN for one trial) of every summary column (``_best``,
    ``_final``, ``steps``) over the group's finite values."""
    import pandas as pd

    summaries = [*summary_columns(table.columns), *(["steps"] if "steps" in table.columns else [])]
    labels = [group_label(row, keys) for row in table[list(keys)].itertuples(index=False, name=None)]
    rows = []
    for label, members in table.groupby(pd.Series(labels, index=table.index), sort=False):
        first = members.iloc[0]
        statuses = members["status"].value_counts()
        row = {**{k: _present(first[k]) for k in keys}, "group": label, "trials": len(members)}
        row["trial_ids"] = list(members[TRIAL_COLUMN])
        row["status"] = ", ".join(f"{n} {s}" for s, n in statuses.items())
        for column in summaries:
            values = pd.to_numeric(members[column], errors="coerce").astype(float)
            finite = values[np.isfinite(values)]
            row[f"{column}_mean"] = float(finite.mean()) if len(finite) else np.nan
            row[f"{column}_std"] = float(finite.std()) if len(finite) > 1 else np.nan
        rows.append(row)
    groups = pd.DataFrame(rows)
    for key in keys:  # as recorded: None where a group lacks the value (pandas would make it NaN)
        groups[key] = pd.Series([row[key] for row in rows], index=groups.index, dtype=object)
    return groups


def category(value: Any) -> tuple[str, str]:
    """A config value as a category: its type and its text, so that ``True``, ``1`` and ``"1"`` are three
    (pandas counts ``True`` and ``1`` as one value); ``2`` and ``2.0`` are one number, as the tables, groups
    and diffs read them."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        return "number", _number_text(value)
    return type(value).__name__, str(value)


def _number_text(value: Any) -> str:
    """A number's text, one for equal ints and floats (``2`` for ``2.0``) where a float holds the int exactly."""
    number = float(value)
    if isinstance(value, numbers.Integral) or (number.is_integer() and abs(number) <= EXACT_FLOAT_INT):
        return str(int(value))
    return repr(number)


def category_labels(values: pd.Series) -> dict[tuple[str, str], str]:
    """Each category of a config column (see :func:`category`) and its tick label, in text order: its text,
    and its type where another category reads the same."""
    categories = sorted({category(v) for v in values.dropna()}, key=lambda c: (c[1], c[0]))
    texts = Counter(text for _, text in categories)
    named = {JsonText.__name__: "JSON"}  # a list's JSON text beside a text that reads the same
    return {
        (kind, text): text if texts[text] == 1 else f"{text} ({named.get(kind, kind)})" for kind, text in categories
    }
