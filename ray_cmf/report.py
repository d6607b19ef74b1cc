"""The sweep report: one self-contained interactive HTML page, and a live server for it.

The page embeds plotly.js (from the ``plotly`` package) and its data, so it opens offline and loads
nothing from the network. It shows the sortable trial table, learning curves, parallel coordinates,
each hyperparameter against the best metric with an importance measure, every trial's lineage, and
the per-step device metrics of Train runs. Each curve is downsampled (see :func:`downsample`); the page
says so.
"""

from __future__ import annotations

import html
import logging
import math
import string
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ray_cmf._atomic import write_text
from ray_cmf._cells import cell_texts, number_text, quoted
from ray_cmf._json import dumps, jsonable
from ray_cmf._names import check_mode
from ray_cmf.constants import REPLACED
from ray_cmf.curation import NOTE_COLUMN, TAG_COLUMN
from ray_cmf.errors import InvalidArgumentError, RayCmfError
from ray_cmf.frames import (
    DRAWABLE_MAX,
    ERROR_COLUMN,
    RANK_COLUMN,
    SERIES_COLUMN,
    TRIAL_COLUMN,
    Span,
    alone,
    category,
    category_labels,
    config_columns,
    drawable,
    floats,
    group_keys,
    group_label,
    group_summaries,
    is_metric,
    log_spread,
    mode_of,
    numbers_as_text,
    numeric,
    sort_trials,
    summarize,
    summary_columns,
)
from ray_cmf.results import COUNTERS, TUNE_BOOKKEEPING, summary_kinds

if TYPE_CHECKING:
    import pandas as pd

    from ray_cmf.compare import Sweep

log = logging.getLogger(__name__)
_TEMPLATE = string.Template((resources.files("ray_cmf") / "report_template.html").read_text(encoding="utf-8"))

DEFAULT_MAX_POINTS = 200  # per curve
AXES = frozenset({"timestamp"})  # a clock: an x-axis, not a metric (row numbers and wall_time are never metrics)


# -- downsampling --------------------------------------------------------------------------------------
def downsample(x: np.ndarray, y: np.ndarray, max_points: int, mode: str = "min") -> np.ndarray:
    """Indices of at most ``max_points`` points that keep a curve's shape: the minimum and maximum of each
    of ``(max_points - 3) // 2`` equal buckets, plus the first, the last and the best point (``mode``).

    Values a plot cannot draw (non-finite, or beyond :data:`DRAWABLE_MAX`) are left out: the page marks them
    apart (see :meth:`Span.marks`). Returns sorted indices into ``x`` / ``y``.
    """
    finite = np.flatnonzero(drawable(y))
    n = len(finite)
    if n <= max_points:
        return finite
    values = y[finite]
    buckets = max(1, (max_points - 3) // 2)
    size = -(-n // buckets)
    starts = np.arange(buckets) * size
    padded = np.full(buckets * size, np.inf)
    padded[:n] = values
    lows = padded.reshape(buckets, size).argmin(axis=1) + starts
    padded[n:] = -np.inf
    highs = padded.reshape(buckets, size).argmax(axis=1) + starts
    best = np.argmin(values) if mode == "min" else np.argmax(values)
    keep = np.unique(np.r_[lows, highs, 0, n - 1, best])
    return finite[keep[keep < n]]


# -- the data on the page ------------------------------------------------------------------------------
@dataclass
class _Section:
    """One plot: a metric of one of the trials' series, a curve per trial (or per rank)."""

    key: str
    series: str
    metric: str
    traces: list[dict[str, Any]]

    @property
    def title(self) -> str:
        return f"{self.metric} · {self.series}"

    def as_data(self) -> dict[str, Any]:
        """What the page draws it from."""
        return {**self.__dict__, "title": self.title}


def _hover_config(trials: pd.DataFrame, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each trial's config as its curves' hover names it: its own keys only (``configs``, by trial), each
    value read as the table reads it."""
    keys = [c[len("config/") :] for c in config_columns(trials.columns)]
    own = [configs.get(str(t), {}) for t in trials["trial_id"]]
    texts = _shorts([[config.get(k) for k in keys] for config in own])  # None: blank, for the table
    return {
        str(trial_id): ", ".join(
            _templated(f"{k}={'None' if config[k] is None else _clip(text)}")
            for k, text in zip(keys, line, strict=True)
            if k in config
        )
        for trial_id, config, line in zip(trials["trial_id"], own, texts, strict=True)
    }


def _sort_key(value: float) -> str:
    """A number's sort key in the page: an int exactly (the page compares ints as BigInts), else the float."""
    return str(value) if isinstance(value, int | np.integer) else str(jsonable(float(value)))


_DIGITS = 4  # a report table's floats, unless a value needs more to be told apart (see cell_digits)


def _short(value: Any, digits: int = _DIGITS) -> str:
    if isinstance(value, float):
        return str(jsonable(value)) if not math.isfinite(value) else number_text(value, digits)  # NaN, Infinity
    return str(value)


def _shorts(values: list[list[Any]]) -> list[list[str]]:
    """The plain texts of a table's cells (None blank), each float with the digits that tell it apart from the
    other numbers of its row and column, and a text that reads as one of those numbers quoted (see
    :mod:`ray_cmf._cells`)."""
    return cell_texts(values, _DIGITS, lambda v, d: "" if v is None else _short(v, d), quoted)


_CELL_CHARS = 40  # a cell's text shows at most this many characters (its whole text on hover)


def _clip(text: str) -> str:
    """``text`` in at most :data:`_CELL_CHARS` characters: a longer one keeps its start and its end (where
    paths and names tend to differ) around an ellipsis."""
    if len(text) <= _CELL_CHARS:
        return text
    half = (_CELL_CHARS - 1) // 2
    return f"{text[:half]}…{text[-(_CELL_CHARS - 1 - half) :]}"


def _cell(text: str, attributes: str = "") -> str:
    """A table cell of a plain ``text``: clipped (see :func:`_clip`), with its whole text as its title then."""
    shown = _clip(text)
    whole = f' title="{html.escape(text, quote=True)}"' if shown != text else ""
    return f"<td{attributes}{whole}>{html.escape(shown)}</td>"


def _plain(text: str) -> str:
    """A text as plotly shows it as written: it reads tags (``<b>``) and entities in what it draws."""
    return html.escape(text, quote=False)


def _templated(text: str) -> str:
    """A text inside a plotly ``hovertemplate``, as written: plain (see :func:`_plain`), and a ``%{`` of its
    own kept from reading as a placeholder (a zero-width space after the ``%``)."""
    return _plain(text).replace("%{", "%\u200b{")


@dataclass
class _Trials:
    """The rows of each curve in a steps frame (one per trial, or per series and rank of a trial that holds
    several): one stable sort, instead of a groupby per metric. Each span: label, trial id, rows."""

    order: np.ndarray
    spans: list[tuple[str, str, slice]]

    @classmethod
    def of(cls, steps: pd.DataFrame) -> _Trials:
        import pandas as pd

        keys = [c for c in (TRIAL_COLUMN, SERIES_COLUMN, RANK_COLUMN) if c in steps.columns]
        codes, names = (
            pd.MultiIndex.from_frame(steps[keys].astype(str)).factorize()
            if len(keys) > 1
            else (pd.factorize(steps[TRIAL_COLUMN].astype(str)))
        )
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
        starts, ends = np.r_[0, bounds], np.r_[bounds, len(codes)]
        spans = [(*_label(names[sorted_codes[a]]), slice(a, b)) for a, b in zip(starts, ends, strict=True) if b > a]
        return cls(order, spans)


def _label(key: Any) -> tuple[str, str]:
    """A curve's label and its trial id: ``trial (rank1)`` for one of a trial's several series."""
    if isinstance(key, str):
        return key, key
    trial, *rest = key
    part = next((p for p in rest if isinstance(p, str) and p not in ("", "nan", "<NA>")), "")  # NaN: missing
    if len(rest) == 1 and part and part.isdigit():  # only a rank column tells the rows apart
        part = f"rank{part}"
    return (f"{trial} ({part})" if part else trial), trial


DOT_SIZE = 5  # a curve's point that no line reaches
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff")
_DIVERGED = {"Infinity": "triangle-up", "NaN": "x", "-Infinity": "triangle-down"}


def _curves(
    steps: pd.DataFrame, trials: _Trials, metric: str, hover: dict[str, str], mode: str, max_points: int
) -> list[dict[str, Any]]:
    """One plotly trace per curve: the downsampled curve, the trial id and config on hover. Where a curve
    holds values outside the plot's :class:`~ray_cmf.frames.Span` (it diverged: NaN, inf, a climb far above
    the other values), a second trace of its colour marks them at the plot's edge, each with its value on
    hover."""
    x_all = floats(steps["step"])[trials.order]
    column = steps[metric]
    y_all = floats(column)[trials.order]
    logged = ~column.isna().to_numpy()[trials.order]  # a null is a row without this metric, not a divergence
    span = Span.of(y_all, curves=[y_all[rows][logged[rows]] for _, _, rows in trials.spans])
    traces = []
    for number, (label, trial_id, rows) in enumerate(trials.spans):
        x, y = x_all[rows][logged[rows]], y_all[rows][logged[rows]]
        shown = np.where(span.holds(y), y, np.nan)
        drawn = drawable(shown)
        keep = np.union1d(downsample(x, shown, max_points, mode), _beside_breaks(drawn)[:max_points])
        colour = PALETTE[number % len(PALETTE)]
        name = _templated(label)
        if len(keep):
            xs, ys = _broken(x, y, keep, drawn)
            dots = _dots(xs)
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers" if any(dots) else "lines",
                    "name": label,
                    "legendgroup": label,
                    "meta": trial_id,
                    "x": xs,
                    "y": ys,
                    "line": {"width": 1.2, "color": colour},
                    "marker": {"size": dots, "color": colour},
                    "hovertemplate": f"<b>{name}</b><br>{hover.get(trial_id, '')}"
                    f"<br>step %{{x}}<br>{_templated(metric)} %{{y:.5g}}<extra></extra>",
                }
            )
        traces += _off_the_plot(span, x, y, max_points, label, trial_id, colour, f"{_templated(metric)} %{{text}}")
    return traces


def _beside_breaks(drawn: np.ndarray) -> np.ndarray:
    """The points drawn next to one that is not (the last before a curve breaks, the first after): kept beside
    a thinned curve's buckets, so that it is drawn up to each break, not up to its buckets' extremes."""
    before = np.r_[~drawn[1:], False]
    after = np.r_[False, ~drawn[:-1]]
    return np.flatnonzero(drawn & (before | after))


def _dots(xs: list[Any]) -> list[int]:
    """Marker sizes along a curve's points: a dot for each point that no line reaches (the only point, or one
    alone between two breaks), none elsewhere; plotly draws no line of one point."""
    return [DOT_SIZE if one else 0 for one in alone(np.array([x is not None for x in xs])).tolist()]


def _broken(x: np.ndarray, y: np.ndarray, keep: np.ndarray, drawn: np.ndarray) -> tuple[list[Any], list[Any]]:
    """The kept points of a curve, with a gap (None, where plotly breaks a line) between two of them that points
    off the plot separate (NaN, inf, a climb beyond the span; they are marked apart): a line across them would
    draw values that were never logged."""
    xs, ys = x[keep].tolist(), y[keep].tolist()
    off_before = np.cumsum(~drawn)[keep]  # points off the plot up to each kept one
    for at in reversed((np.flatnonzero(np.diff(off_before)) + 1).tolist()):
        xs.insert(at, None)
        ys.insert(at, None)
    return xs, ys


def _unbroken(xs: list[Any]) -> list[slice]:
    """The stretches of a broken curve's points (see :func:`_broken`) between its gaps."""
    gaps = [i for i, x in enumerate(xs) if x is None]
    return [slice(a + 1, b) for a, b in zip([-1, *gaps], [*gaps, len(xs)], strict=True) if b > a + 1]


def _off_the_plot(
    span: Span, x: np.ndarray, y: np.ndarray, max_points: int, label: str, meta: str, colour: str, hover: str
) -> list[dict[str, Any]]:
    """The trace that marks a curve's values outside ``span`` (NaN, inf, a climb far beyond the others) at the
    plot's edge, each with its value on hover (``hover``: what follows the step there); none if it has none."""
    odd = span.marks(y, max_points)
    if not len(odd):
        return []
    kinds = [span.side(float(v)) for v in y[odd]]
    edges = span.edges()
    return [
        {
            "type": "scatter",
            "mode": "markers",
            "name": f"{label} (off the plot)",  # NaN, inf, or outside the span
            "legendgroup": label,
            "meta": meta,
            "x": x[odd].tolist(),
            "y": [edges[k] for k in kinds],
            "text": [jsonable(float(v)) for v in y[odd]],
            "marker": {"color": colour, "size": 9, "symbol": [_DIVERGED[k] for k in kinds]},
            "hovertemplate": f"<b>{_templated(label)}</b><br>step %{{x}}<br>{hover}<extra></extra>",
        }
    ]


@dataclass
class _Plotter:
    """How every section's traces are drawn: a curve per trial, or, with ``groups`` (trial id -> group
    label), each group's mean with its bands."""

    hover: dict[str, str]
    mode: str | Mapping[str, str]  # for every metric, or per metric
    max_points: int
    groups: dict[str, str] | None = None

    def traces(self, steps: pd.DataFrame, spans: _Trials, metric: str) -> list[dict[str, Any]]:
        mode = mode_of(self.mode, metric)
        if self.groups is None:
            return _curves(steps, spans, metric, self.hover, mode, self.max_points)
        return _group_curves(steps, metric, self.groups, mode, self.max_points)


def _group_curves(
    steps: pd.DataFrame, metric: str, groups: dict[str, str], mode: str, max_points: int
) -> list[dict[str, Any]]:
    """Per group: the mean over its trials' finite values at each step, and two bands the page chooses
    between (min to max, and ±1 standard deviation; legend groups ``band-minmax`` and ``band-std``). The
    means take the :class:`~ray_cmf.frames.Span` trial curves take: a mean far beyond the other groups' (a
    group that diverged) is marked at the plot's edge, and the bands stop at it."""
    import pandas as pd

    values = floats(steps[metric])
    frame = pd.DataFrame(
        {
            "group": steps[TRIAL_COLUMN].astype(str).map(groups),
            "step": floats(steps["step"]),
            "y": np.where(drawable(values), values, np.nan),
        }
    ).dropna()
    stats_of = [
        (label, rows.groupby("step")["y"].agg(["mean", "std", "min", "max", "count"]))
        for label, rows in frame.groupby("group", sort=False)
    ]
    means = [stats["mean"].to_numpy() for _, stats in stats_of]
    span = Span.of(np.concatenate(means), curves=means) if means else Span(0.0, 1.0)
    traces: list[dict[str, Any]] = []
    for number, (label, stats) in enumerate(stats_of):
        x, mean = stats.index.to_numpy(), stats["mean"].to_numpy()
        shown = np.where(span.holds(mean), mean, np.nan)
        drawn = drawable(shown)
        keep = np.union1d(downsample(x, shown, max_points, mode), _beside_breaks(drawn)[:max_points])
        spread = stats["std"].fillna(0.0).to_numpy()
        colour = PALETTE[number % len(PALETTE)]
        xs, means = _broken(x, mean, keep, drawn)
        for band, (low, high) in (
            ("band-minmax", (stats["min"].to_numpy(), stats["max"].to_numpy())),
            ("band-std", (mean - spread, mean + spread)),
        ):
            lows, highs = (_broken(x, np.clip(edge, span.low, span.high), keep, drawn)[1] for edge in (low, high))
            for part in _unbroken(xs):  # plotly fills "tonexty" across a gap: one pair of traces per stretch
                for edge, fill in ((lows, "none"), (highs, "tonexty")):
                    traces.append(
                        {
                            "type": "scatter",
                            "mode": "lines",
                            "legendgroup": band,
                            "meta": label,
                            "x": xs[part],
                            "y": edge[part],
                            "line": {"width": 0, "color": colour},
                            "fill": fill,
                            "fillcolor": _translucent(colour),
                            "hoverinfo": "skip",
                            "visible": band == "band-minmax",
                        }
                    )
        counts = _broken(x, stats["count"].to_numpy(), keep, drawn)[1]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if any(dots := _dots(xs)) else "lines",
                "name": label,
                "meta": label,
                "x": xs,
                "y": means,
                "customdata": counts,
                "line": {"width": 1.8, "color": colour},
                "marker": {"size": dots, "color": colour},
                "hovertemplate": f"<b>{_templated(label)}</b><br>step %{{x}}<br>mean {_templated(metric)} "
                "%{y:.5g} over %{customdata} trials<extra></extra>",
            }
        )
        traces += _off_the_plot(span, x, mean, max_points, label, label, colour, f"mean {_templated(metric)} %{{text}}")
    return traces


def _translucent(colour: str, alpha: float = 0.18) -> str:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _parcoords(trials: pd.DataFrame, metric: str) -> dict[str, Any] | None:
    """Parallel coordinates from every varying config key to the best ``metric`` (categories as ticks; a
    log-spread key on a log10 axis). Trials without a best the axis can draw (finite, within ±DRAWABLE_MAX)
    are left out (counted by :func:`_config_notes`), never drawn at an end of the axis as if they ranked."""
    best = trials[f"{metric}_best"].astype(float)
    trials = trials[drawable(best.to_numpy())]
    if trials.empty:
        return None
    dims = []
    for column in config_columns(trials.columns):
        values, key = trials[column], column[len("config/") :]
        if not _varies(values):
            continue
        if numeric(values):
            numbers = floats(values)
            if log_spread(numbers):
                with np.errstate(invalid="ignore"):  # a non-finite value is left out (None) either way
                    dims.append(_numeric_axis(f"log10({key})", _floats(np.log10(numbers))))
            else:
                dims.append(_numeric_axis(key, _floats(values)))
        else:
            labels = category_labels(values)
            codes = {category: i for i, category in enumerate(labels)}
            ticks = {i: _plain(label) for i, label in enumerate(labels.values())}
            dims.append(_with_none(key, [codes.get(category(v)) for v in values], ticks, NONE_AT_CATEGORY))
    if not dims:
        return None
    shown = _floats(trials[f"{metric}_best"])
    dims.append({"label": _plain(f"best {metric}"), "values": shown})
    return {
        "type": "parcoords",
        "dimensions": dims,
        "line": {"color": shown, "colorscale": "Viridis", "showscale": True},
    }


NONE_AT_CATEGORY = -1  # where a categorical axis draws the trials without a value: below its categories
NUMERIC_TICKS = 5  # ticks a numeric axis with a "(none)" tick names: plotly's own go with giving it one


def _numeric_axis(label: str, values: list[float | None]) -> dict[str, Any]:
    """A numeric axis; trials without a drawable value at a ``(none)`` tick a fifth of its span below the values."""
    drawn = [v for v in values if v is not None]
    if len(drawn) == len(values):
        return {"label": _plain(label), "values": values}
    low, high = min(drawn), max(drawn)
    ticks = {float(v): number_text(float(v), 3) for v in np.linspace(low, high, NUMERIC_TICKS)}
    return _with_none(label, values, ticks, low - (high - low) / 5)


def _with_none(label: str, values: list[Any], ticks: dict[Any, str], none_at: float) -> dict[str, Any]:
    """An axis with ``ticks`` (value -> text): a trial without a value (None; plotly would draw it at 0, as if it
    held one) at a ``(none)`` tick at ``none_at``, where some trial lacks one."""
    if None in values:
        values, ticks = [none_at if v is None else v for v in values], {**ticks, none_at: "(none)"}
    return {"label": _plain(label), "values": values, "tickvals": list(ticks), "ticktext": list(ticks.values())}


def _varies(values: pd.Series) -> bool:
    """Whether a config column holds two recorded values or more (see :func:`~ray_cmf.frames.category`)."""
    return len({category(v) for v in values.dropna()}) > 1


def _config_notes(trials: pd.DataFrame, metric: str | None) -> dict[str, str]:
    """What the parallel coordinates and the importance plots say of the trials they leave out, or, where they
    draw nothing, why: no config key varies, or too few trials have a finite best ``metric`` to draw."""
    varying = [c for c in config_columns(trials.columns) if _varies(trials[c])]
    kept = int(drawable(trials[f"{metric}_best"].astype(float).to_numpy()).sum()) if metric else 0
    left_out = len(trials) - kept
    if not varying:
        parcoords = "No config key varies across trials."
    elif kept < 2:
        parcoords = f"{left_out} of {len(trials)} trials have no finite best {metric}: fewer than two are left to draw."
    else:
        parcoords = f"{left_out} trial(s) without a finite best {metric} are left out." if left_out else ""
    if not any(numeric(trials[c]) for c in varying):
        params = "No numeric hyperparameter varies."
    elif kept < 2:
        params = f"Fewer than two trials have a finite best {metric}: no importance to measure."
    else:
        params = ""
    return {"parcoords": parcoords, "params": params}


def _floats(values: Iterable[Any]) -> list[float | None]:
    """Plottable numbers: anything that is not a finite number within ±DRAWABLE_MAX is left out (None)."""
    out: list[float | None] = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = math.nan
        out.append(f if abs(f) <= DRAWABLE_MAX else None)  # False for NaN
    return out


def importance(trials: pd.DataFrame, metric: str) -> dict[str, float]:
    """Per numeric config key: |Spearman rank correlation| between the key and the trials' best ``metric``, over
    the trials that have both (0: no monotonic relation; 1: the ranking follows the key exactly). Keys that do not
    vary among them are left out."""
    import pandas as pd

    best = trials[f"{metric}_best"].astype(float)
    out = {}
    for column in config_columns(trials.columns):
        if not numeric(trials[column]):
            continue
        # ranked among the trials that have both: a trial without one would hold a rank of the other
        pairs = pd.DataFrame({"value": trials[column].astype(float), "best": best}).dropna()
        if pairs["value"].nunique() < 2 or pairs["best"].nunique() < 2:
            continue
        rho = pairs["value"].rank().corr(pairs["best"].rank())  # Spearman: Pearson on ranks (no scipy needed)
        if rho == rho:
            out[column[len("config/") :]] = abs(float(rho))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _params(trials: pd.DataFrame, metric: str) -> list[dict[str, Any]]:
    """One scatter per numeric config key: its value against the best ``metric``, one point per trial."""
    best = _floats(trials[f"{metric}_best"])
    figures = []
    for key, score in importance(trials, metric).items():
        numbers = floats(trials[f"config/{key}"])
        figures.append(
            {
                "key": key,
                "importance": score,
                "log": log_spread(numbers),
                "scale_note": _linear_note(numbers),
                "trace": {
                    "type": "scatter",
                    "mode": "markers",
                    "x": _floats(trials[f"config/{key}"]),
                    "y": best,
                    "text": [_plain(str(trial)) for trial in trials["trial_id"]],
                    "hovertemplate": f"%{{text}}<br>{_templated(key)}=%{{x}}<br>best {_templated(metric)}"
                    "=%{y:.5g}<extra></extra>",
                },
            }
        )
    return figures


def _linear_note(values: np.ndarray) -> str | None:
    """Why a hyperparameter spread over decades is drawn on a linear axis all the same: a value of 0 or less
    has no logarithm. None where nothing needs saying."""
    finite = values[np.isfinite(values)]
    positive = finite[finite > 0]
    return "linear: it holds values <= 0" if positive.size < finite.size and log_spread(positive) else None


def _lineage(sweep: Sweep) -> dict[str, list[dict[str, Any]]]:
    """Per trial: every artifact of its execution (inputs and outputs, every version) with its md5."""
    executions = {e.id: e for e, _ in sweep.executions()}
    files = sweep.lineage.files_of(list(executions))
    return {sweep.key(executions[e]): rows for e, rows in files.items()}


def _metrics(table: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    """The metrics to plot (from a trial table's ``_best`` columns, or a steps frame's columns of numbers):
    those asked for, else every one but Tune's own timing, step counters and clocks (axes, not metrics)."""
    if "step" in table.columns:
        found = [c for c in _logged(table) if _drawable(table[c])]
    else:
        found = [c[: -len("_best")] for c in summary_columns(table.columns) if c.endswith("_best")]
    if metrics is None:
        return _shown(found)
    unknown = [m for m in metrics if m not in found]
    if unknown:
        raise RayCmfError(f"Unknown metric(s) {unknown}; the series has {found}")
    return list(metrics)


def _ranked_first(sweep: Sweep, metrics: list[str]) -> list[str]:
    """``metrics`` with the one the sweep ranks its trials by first (see ``Sweep.ranked_metric``), as
    ``trials`` and ``compare`` rank them: the report's table follows it, and its plots' best."""
    try:
        ranked = sweep.ranked_metric()
    except InvalidArgumentError:  # no logger said which: the first metric reported
        return metrics
    return [ranked, *[m for m in metrics if m != ranked]] if ranked in metrics else metrics


def _logged(steps: pd.DataFrame) -> list[str]:
    return [c for c in steps.columns if is_metric(c)]


def _shown(metrics: Iterable[str]) -> list[str]:
    """The metrics a report shows unless asked: all but Tune's timing, step counters and clocks."""
    return [m for m in metrics if m not in TUNE_BOOKKEEPING and m not in COUNTERS and m not in AXES]


def _drawable(values: pd.Series) -> bool:
    """Whether a curve can be drawn of a column: numbers, or numbers held as exact text."""
    return numeric(values) or numbers_as_text(values)


def _not_drawn(name: str, steps: pd.DataFrame) -> list[str]:
    """The metrics of a series that hold something other than numbers (words, bools): no curve, but named."""
    return [f"{name}/{c}" for c in _shown(_logged(steps)) if not _drawable(steps[c]) and steps[c].notna().any()]


def _unsummarised(sweep: Sweep, trials: pd.DataFrame) -> list[str]:
    """The metrics of the sweep's own series that hold no numbers (so no ``_best`` in ``trials``): no curve,
    but named."""
    metrics = _shown(c for c in sweep.columns() if is_metric(c))
    return [f"{sweep.metrics_name}/{m}" for m in metrics if f"{m}_best" not in trials.columns]


def _with_summary(
    trials: pd.DataFrame, steps: pd.DataFrame, metrics: list[str], mode: str | Mapping[str, str]
) -> pd.DataFrame:
    """The trial table with best / final / steps computed from ``steps`` (committed and spilled rows)."""
    trials = trials.drop(columns=[*summary_columns(trials.columns), "steps"])
    if not len(steps):
        return trials.assign(steps=0)
    table = trials.join(summarize(steps.sort_values("step", kind="stable"), metrics, mode), on="trial_id")
    table["steps"] = table["steps"].fillna(0).astype(int)
    return table


@dataclass
class _Drawn:
    """The curves of the other series, whether any was downsampled, and the metrics that had none."""

    sections: list[_Section] = field(default_factory=list)
    downsampled: bool = False
    not_drawn: list[str] = field(default_factory=list)


def _series_sections(sweep: Sweep, names: Sequence[str], plotter: _Plotter, live: bool) -> _Drawn:
    """Curves of every metric of the other series the trials logged (``names``): their Train runs' device
    metrics, ``get_cmf()`` series, system metrics."""
    drawn = _Drawn()
    for name in names:
        other = sweep.of_series(name)
        if not other.files() and not live:
            continue
        steps = other.steps(live=live, exact=True)
        spans = _Trials.of(steps)
        drawn.downsampled |= _longest(spans) > plotter.max_points
        for metric in _metrics(steps, None):
            drawn.sections.append(_Section("", name, metric, plotter.traces(steps, spans, metric)))
        drawn.not_drawn += _not_drawn(name, steps)
    return drawn


def _longest(trials: _Trials) -> int:
    return max((rows.stop - rows.start for _, _, rows in trials.spans), default=0)


def _chosen_series(sweep: Sweep, series: Sequence[str] | None) -> list[str]:
    """The series to plot besides the sweep's own: those named, else every one its trials hold."""
    held = sweep.series_names()
    if series is None:
        return [name for name in held if name != sweep.metrics_name]
    unknown = [name for name in series if name not in held]
    if unknown:
        raise RayCmfError(f"Unknown series {unknown}; the trials hold {held}")
    return [name for name in series if name != sweep.metrics_name]


# -- rendering -----------------------------------------------------------------------------------------
def build(sweep: Sweep, *, refresh_seconds: int | None = None, **options: Any) -> str:
    """The report of ``sweep`` as one HTML page (the ``options`` of :func:`content`). A page with
    ``refresh_seconds`` fetches its content again that often from the server that sent it, in place."""
    return _page(sweep, content(sweep, **options), refresh_seconds)


def content(
    sweep: Sweep,
    *,
    metrics: Sequence[str] | None = None,
    series: Sequence[str] | None = None,
    mode: str | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    live: bool = False,
    group_by: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """What the page shows, as JSON-ready parts: ``data`` (the plots), ``table`` (the trial table's HTML),
    ``title``, ``note``, ``importance_note`` and ``lineage`` (HTML).

    ``metrics``: those of the sweep's own series to plot (default: all); ``series``: which of the trials'
    series to plot (default: every one, each metric under its series' name); ``mode``: whether lower or
    higher is better (default: the sweep's, see ``Sweep.modes``, else lower); ``max_points`` per curve;
    ``live``: include spilled, uncommitted rows; ``group_by``: fold the trials into groups (see
    ``Sweep.trials``): the table shows each group's mean and standard deviation, the curves each group's
    mean with a band.
    """
    if max_points < 5:
        raise InvalidArgumentError(f"max_points must be >= 5, got {max_points!r}")
    modes = sweep.modes() if mode is None else check_mode(mode)
    others = _chosen_series(sweep, series)
    trials = sweep.trials(metrics, mode=modes)
    if live:  # the table follows the running trials: best / final / steps from every row so far
        steps = sweep.steps(metrics, live=True, exact=True)
        chosen = _metrics(steps, metrics)
        trials = _with_summary(trials, steps, chosen, modes)
    else:
        chosen = _metrics(trials, metrics)
        steps = sweep.steps(chosen, exact=True)
    if metrics is None:
        chosen = _ranked_first(sweep, chosen)
    primary = chosen[0] if chosen else None
    mode = mode_of(modes, primary) if primary else "min"  # the order of the table and the "best" of the plots
    trials = _best_first(trials, f"{primary}_best", mode) if primary else trials
    keys = group_keys(trials, group_by) if group_by is not None else None
    groups = _group_of(trials, keys) if keys is not None else None
    plotter = _Plotter(_hover_config(trials, sweep.configs()), modes, max_points, groups)
    spans = _Trials.of(steps)
    own = series is None or sweep.metrics_name in series
    sections = [_Section("", sweep.metrics_name, m, plotter.traces(steps, spans, m)) for m in (chosen if own else [])]
    drawn = _series_sections(sweep, others, plotter, live)
    sections += drawn.sections
    not_drawn = []
    if own and metrics is None:  # the file's curves are of the summarised metrics: name the others
        not_drawn = _not_drawn(sweep.metrics_name, steps) if live else _unsummarised(sweep, trials)
    for number, section in enumerate(sections):
        section.key = f"curve-{number}"
    kept = trials[trials["status"] != REPLACED]  # a replaced trial's results were discarded: no config's outcome
    data: dict[str, Any] = {
        "sections": [section.as_data() for section in sections],
        "parcoords": _parcoords(kept, primary) if primary else None,
        "params": _params(kept, primary) if primary else [],
        "notes": _config_notes(kept, primary),
        "primary": primary,
        "mode": mode,
        "status": dict(zip(trials["trial_id"].astype(str), trials["status"].astype(str), strict=True)),
        "grouped": keys is not None,
    }
    table = _table(trials, chosen, mode)
    if keys is not None:
        grouped = group_summaries(trials, keys)
        grouped = _best_first(grouped, f"{primary}_best_mean", mode) if primary else grouped
        data["status"] = dict(zip(grouped["group"], grouped["status"].astype(str), strict=True))
        table = _group_table(grouped, keys, chosen, mode)
    downsampled = drawn.downsampled or (own and _longest(spans) > max_points)
    return {
        "data": data,
        "table": table,
        "title": f"{sweep.pipeline}: {len(trials)} trial{'' if len(trials) == 1 else 's'}",
        "note": _curves_note(max_points, downsampled, [*not_drawn, *drawn.not_drawn]),
        "importance_note": (
            f"Importance: |Spearman rank correlation| between the hyperparameter and each trial's best {primary}."
            if primary and len(data["params"]) > 1
            else ""
        ),
        "lineage": _lineage_html(_lineage(sweep), _texts(trials, NOTE_COLUMN), _texts(trials, ERROR_COLUMN)),
    }


def _curves_note(max_points: int, downsampled: bool, not_drawn: Sequence[str] = ()) -> str:
    """The caption of the curves: what they show of the data (a caption that matches it), and the metrics
    left without a curve."""
    buckets = (max_points - 3) // 2
    each = f"each of {buckets} equal step buckets" if buckets > 1 else "one bucket of all the steps"
    note = (
        f"Curves longer than {max_points} points show the minimum and maximum of {each}, plus the first, the "
        "last and the best point."
        if downsampled
        else "Every logged point is drawn."
    )
    if not_drawn:
        note += f" No curve for {', '.join(not_drawn)}: text or bools, not numbers."
    return note + " Click a trial in the table to pick out its curves everywhere; click it again to let go."


def _best_first(table: pd.DataFrame, column: str, mode: str) -> pd.DataFrame:
    """The trial (or group) table best first by ``column`` (a metric's best, or its group mean), as
    ``ray-cmf trials`` sorts it; unsorted when the table has no such column (no metric chosen)."""
    return sort_trials(table, column, mode) if column in table.columns else table


def _group_of(trials: pd.DataFrame, keys: Sequence[str]) -> dict[str, str]:
    """Each trial's group label."""
    labels = [group_label(row, keys) for row in trials[list(keys)].itertuples(index=False, name=None)]
    return dict(zip(trials["trial_id"].astype(str), labels, strict=True))


def _summaries(metrics: Sequence[str], present: set[str]) -> list[str]:
    """Each metric's ``_best`` and ``_final`` columns among ``present`` (a count's final only: see
    :func:`~ray_cmf.results.summary_kinds`)."""
    return [f"{m}_{k}" for m in metrics for k in summary_kinds(m) if f"{m}_{k}" in present]


def _group_table(groups: pd.DataFrame, keys: Sequence[str], metrics: list[str], mode: str) -> str:
    """One row per group: its key values, how many trials, their statuses, and each summary as mean ± std."""
    summaries = _summaries(metrics, {c.removesuffix("_mean") for c in groups.columns})
    summaries.append("steps")
    sorted_by = f"{metrics[0]}_best" if metrics else None
    order = ' class="asc"' if mode == "min" else ' class="desc"'
    columns = [*keys, "trials", "status", *summaries]
    head = "".join(f"<th{order if c == sorted_by else ''}>{html.escape(c)}</th>" for c in columns)
    body, rows = [], groups.to_dict(orient="records")
    for row, texts in zip(rows, _shorts([[row[k] for k in keys] for row in rows]), strict=True):
        cells = [_cell(text) for text in texts]
        cells += [f'<td data-v="{row["trials"]}">{row["trials"]}</td>', f"<td>{html.escape(str(row['status']))}</td>"]
        for column in summaries:
            mean, std = row[f"{column}_mean"], row[f"{column}_std"]
            sort = f' data-v="{jsonable(float(mean))}"' if mean == mean else ""
            text = "" if mean != mean else _short(mean) + (f" ± {_short(std)}" if std == std else "")
            cells.append(_cell(text, sort))
        group, status = html.escape(str(row["group"]), quote=True), html.escape(str(row["status"]), quote=True)
        members = html.escape(", ".join(row["trial_ids"]), quote=True)
        body.append(f'<tr data-trial="{group}" data-status="{status}" title="{members}">{"".join(cells)}</tr>')
    return f'<table id="trials"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _table(trials: pd.DataFrame, metrics: list[str], mode: str) -> str:
    """The trial table, in the order it comes (best first), the first metric's best marked as its sort."""
    stopped = ["stopped"] if "stopped" in trials.columns and trials["stopped"].any() else []  # by Tune
    summaries = set(summary_columns(trials.columns))  # a metric named config/x is a result
    recorded = [c for c in trials.columns if c not in summaries]
    columns = ["trial_id", "status", *stopped, *[c for c in recorded if c.startswith(("config/", TAG_COLUMN))]]
    columns += _summaries(metrics, set(trials.columns))
    columns += [c for c in recorded if c.startswith("metrics/")]  # log_execution_metrics
    columns += [c for c in ("steps", "md5") if c in trials.columns]  # a sweep of no trial yet has neither
    sorted_by = f"{metrics[0]}_best" if metrics else None
    order = ' class="asc"' if mode == "min" else ' class="desc"'
    head = "".join(f"<th{order if c == sorted_by else ''}>{html.escape(c)}</th>" for c in columns)
    body, notes = [], _texts(trials, NOTE_COLUMN)
    rows = trials[columns].to_dict(orient="records")
    for row, texts in zip(rows, _shorts([list(row.values()) for row in rows]), strict=True):
        cells = []
        for c, text in zip(columns, texts, strict=True):  # a NaN is a value: only what was never recorded is blank
            value = row[c]
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            sort = "" if not numeric or value != value else f' data-v="{_sort_key(value)}"'
            cells.append(_cell(text, sort))
        trial, status = html.escape(str(row["trial_id"]), quote=True), html.escape(str(row["status"]), quote=True)
        note = notes.get(str(row["trial_id"]))
        hint = f' title="{html.escape(note, quote=True)}"' if note else ""
        body.append(f'<tr data-trial="{trial}" data-status="{status}"{hint}>{"".join(cells)}</tr>')
    return f'<table id="trials"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _texts(trials: pd.DataFrame, column: str) -> dict[str, str]:
    """Each trial's text in ``column`` (its note, its error), where it has one."""
    if column not in trials:
        return {}
    return {str(t): n for t, n in zip(trials["trial_id"], trials[column], strict=True) if isinstance(n, str) and n}


def _lineage_html(lineage: dict[str, list[dict[str, Any]]], notes: Mapping[str, str], errors: Mapping[str, str]) -> str:
    """Each trial's detail: why it failed, its note, then every artifact it used or made."""
    parts = []
    for trial_id, rows in lineage.items():
        note = f"<pre class=error>{html.escape(errors[trial_id])}</pre>" if trial_id in errors else ""
        note += f"<p class=note>{html.escape(notes[trial_id])}</p>" if trial_id in notes else ""
        lines = "".join(
            f"<tr><td>{r['event']}</td><td>{html.escape(r['type'])}</td><td>{html.escape(str(r['name']))}</td>"
            f"<td>{r['version']}</td><td><code>{html.escape(r['md5'])}</code></td><td>{r['rows'] or ''}</td>"
            f"<td>{html.escape(str(r['url']))}</td></tr>"
            for r in rows
        )
        parts.append(
            f"<details><summary>{html.escape(trial_id)} ({len(rows)} artifacts)</summary>{note}<table class=lineage>"
            "<tr><th>event</th><th>type</th><th>name</th><th>version</th><th>md5</th><th>rows</th><th>url</th></tr>"
            f"{lines}</table></details>"
        )
    return "".join(parts)


def _page(sweep: Sweep, parts: dict[str, Any], refresh_seconds: int | None) -> str:
    from plotly.offline import get_plotlyjs

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return _TEMPLATE.substitute(
        title=html.escape(parts["title"]),
        when=when,
        live=" (live: includes uncommitted rows, updated in place)" if refresh_seconds else "",
        refresh_ms=dumps(refresh_seconds * 1000 if refresh_seconds else None),
        store=html.escape(str(sweep.store.root)),
        series=html.escape(sweep.metrics_name),
        table=parts["table"],
        note=html.escape(parts["note"]),
        importance_note=html.escape(parts["importance_note"]),
        lineage=parts["lineage"],
        plotly=get_plotlyjs(),
        data=dumps(parts["data"]).replace("</", "<\\/"),
    )


def write(sweep: Sweep, path: str | Path, **options: Any) -> Path:
    """Write the report of ``sweep`` to ``path`` (see :func:`build` for the options)."""
    return write_text(path, build(sweep, **options))


# -- the live server -----------------------------------------------------------------------------------
class ReportServer(ThreadingHTTPServer):
    """Serves the report of a sweep, rebuilt at most every ``refresh_seconds`` from the store (read-only:
    committed files and the spills of running trials), so it follows a sweep while it runs.

    Binds 127.0.0.1 by default. ``port=0`` picks a free port (see ``server_address``).
    """

    daemon_threads = True

    def __init__(
        self,
        sweep_factory: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        refresh_seconds: int = 10,
        **options: Any,
    ) -> None:
        super().__init__((host, port), _Handler)
        self.sweep_factory = sweep_factory
        self.refresh_seconds = refresh_seconds
        self.options = options
        self._lock = threading.Lock()
        self._built: tuple[float, bytes, bytes] | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}/"

    def _current(self) -> tuple[bytes, bytes]:
        """The page and its content as JSON: rebuilt when older than ``refresh_seconds``; one build at a time."""
        with self._lock:
            if self._built is None or time.monotonic() - self._built[0] >= self.refresh_seconds:
                sweep = self.sweep_factory()
                parts = content(sweep, live=True, **self.options)
                page = _page(sweep, parts, self.refresh_seconds).encode()
                self._built = (time.monotonic(), page, dumps(parts).encode())
            return self._built[1], self._built[2]

    def page(self) -> bytes:
        """The whole page (plotly.js included)."""
        return self._current()[0]

    def data(self) -> bytes:
        """What the page shows, as JSON (see :func:`content`): the open page fetches it to update in place."""
        return self._current()[1]


class _Handler(BaseHTTPRequestHandler):
    server: ReportServer

    def do_HEAD(self) -> None:
        """What a GET would send, less the body (``curl -I``, link checkers)."""
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        routes = {"/": ("text/html", self.server.page), "/index.html": ("text/html", self.server.page)}
        routes["/data.json"] = ("application/json", self.server.data)
        route = routes.get(self.path)
        if route is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        kind, content_of = route
        try:
            content = content_of()
        except Exception as exc:  # a store mid-write, or a bad option: say so on the page
            log.warning("ray_cmf: building the report failed: %s", exc)
            self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, f"ray_cmf: {exc}")
            return
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(content)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(content)
        except (BrokenPipeError, ConnectionResetError):  # the client left (a reload, `curl | head`): no error
            log.debug("ray_cmf report: %s left before %s was sent", self.client_address, self.path)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.info("ray_cmf report: " + format, *args)
