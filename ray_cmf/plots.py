"""Plots for trial comparison (matplotlib, Agg backend): learning curves and config-vs-metric panels, as PNG,
SVG or PDF by the file's extension."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ray_cmf._atomic import atomic_write
from ray_cmf.errors import InvalidArgumentError
from ray_cmf.frames import (
    Span,
    alone,
    blank,
    category,
    category_labels,
    config_columns,
    drawable,
    floats,
    log_spread,
    numeric,
)

if TYPE_CHECKING:
    import pandas as pd

_LEGEND_MAX = 12
_NO_VALUE = "grey"  # the colour of a trial whose config lacks the key a plot is coloured by
_MARKERS = {"Infinity": "^", "NaN": "x", "-Infinity": "v"}  # the report's symbols for values off the plot
_MARKS_NOTE = "▲ ▼ off the plot (inf, beyond ±1e300, or far beyond the other values)   x NaN"
_MAX_MARKS = 200  # per curve, as the report's points


def _written(text: object) -> str:
    """A name or value as matplotlib draws it as written: it reads each ``$...$`` as math (and fails on
    some, such as ``$\\frac$``); an escaped ``\\$`` is a dollar sign."""
    return str(text).replace("$", r"\$")


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _overflows(finite: np.ndarray) -> bool:
    """Whether finite values are too large in magnitude for a linear axis or colour scale."""
    return not drawable(finite).all()


def _norm(values: np.ndarray) -> matplotlib.colors.Normalize:
    finite = _finite(values)
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    if log_spread(finite):  # e.g. learning rates: a log scale spreads the colours
        return matplotlib.colors.LogNorm(low, high)
    if _overflows(finite):
        return matplotlib.colors.SymLogNorm(linthresh=1.0, vmin=min(low, 0.0), vmax=max(high, 0.0))
    return matplotlib.colors.Normalize(low, high if high > low else low + 1)


def _fit(ax: matplotlib.axes.Axes, axis: str, values: np.ndarray) -> None:
    """Give the ``axis`` ("x" or "y") of ``ax`` a symmetric-log scale spanning ``values`` (and 0) where they
    would overflow a linear one; matplotlib's own limits would overflow too, so they are set here."""
    finite = _finite(values)
    if _overflows(finite):
        getattr(ax, f"set_{axis}scale")("symlog")
        getattr(ax, f"set_{axis}lim")(min(finite.min(), 0.0), max(finite.max(), 0.0))


def _mark_off_plot(ax: matplotlib.axes.Axes, span: Span, x: np.ndarray, y: np.ndarray, colour: object) -> bool:
    """Mark a curve's values outside ``span`` at the plot's edge in its colour, as the report does (each run
    of them where it starts, and the last one); whether there were any."""
    odd = span.marks(y, _MAX_MARKS)
    sides = np.array([span.side(float(v)) for v in y[odd]])
    for side, edge in span.edges().items():
        at = odd[sides == side]
        if len(at):
            ax.plot(x[at], np.full(len(at), edge), linestyle="None", marker=_MARKERS[side], color=colour, ms=7)
    return bool(len(odd))


def _limits(span: Span) -> tuple[float, float]:
    """The y limits of a curve plot: its span and the edges its marks sit on, with a margin."""
    edges = span.edges()
    pad = (edges["Infinity"] - span.high) / 2
    return edges["-Infinity"] - pad, edges["Infinity"] + pad


# Drawing values near the float limit on a symmetric-log axis overflows inside matplotlib's own numpy
# arithmetic (its ticks, margins, colour-bar boundaries): harmless there, and no warning for the user.
@np.errstate(over="ignore", invalid="ignore")
def curves(
    steps: pd.DataFrame,
    trials: pd.DataFrame,
    metric: str,
    path: Path,
    *,
    color_by: str | None,
    title: str,
    without: int = 0,
) -> Path:
    """Learning curves, one line per trial: coloured by ``color_by`` with a colour bar or legend; the title counts
    them, and the ``without`` trials that logged no ``metric``."""
    fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
    many = trials["trial_id"].nunique() > _LEGEND_MAX
    if color_by is not None:
        color_by = color_by.removeprefix("config/")  # the trial table's name of the key works too
    key = f"config/{color_by}" if color_by is not None else None
    if key is not None and key not in trials.columns:
        raise InvalidArgumentError(
            f"color_by={color_by!r} is not a config key; choose one of "
            f"{sorted(c[len('config/') :] for c in trials.columns if c.startswith('config/'))}"
        )
    colour_of: dict[str, object] = {}
    if key is not None and numeric(trials[key]):
        values = floats(trials[key])
        norm = _norm(values)
        cmap = plt.get_cmap("viridis")
        pairs = zip(trials["trial_id"], values, strict=True)
        colour_of = {t: cmap(norm(v)) if np.isfinite(v) else _NO_VALUE for t, v in pairs}  # no such key: grey
        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=_written(color_by))
    elif key is not None:
        named = category_labels(trials[key])  # 3 and "3" apart, as the report's axes keep them
        labels = ["(none)" if blank(v) else named[category(v)] for v in trials[key]]  # no key: a category too
        categories = list(dict.fromkeys(labels))
        palette = plt.get_cmap("tab10" if len(categories) <= 10 else "tab20")
        pairs = zip(trials["trial_id"], labels, strict=True)
        colour_of = {t: palette(categories.index(label) % palette.N) for t, label in pairs}
        ax.legend(
            handles=[
                matplotlib.lines.Line2D([], [], color=palette(i % palette.N), label=_written(c))
                for i, c in enumerate(categories[: _LEGEND_MAX * 2])
            ],
            title=_written(color_by),
            fontsize="small",
        )
    curves = list(steps.groupby("trial_id", sort=False))
    span = Span.of(floats(steps[metric]), curves=[floats(frame[metric]) for _, frame in curves])
    marked = False
    for trial_id, frame in curves:
        logged = ~frame[metric].isna().to_numpy()  # a step without the metric is a gap, not a divergence
        x, y = floats(frame["step"])[logged], floats(frame[metric])[logged]
        shown = np.where(span.holds(y), y, np.nan)
        dots = alone(np.isfinite(shown))  # a point no line reaches: a dot, never an invisible line
        [line] = ax.plot(
            x,
            shown,
            marker="o" if dots.any() else None,
            markevery=dots.tolist(),
            color=colour_of.get(trial_id),
            alpha=0.35 if many else 0.9,
            linewidth=0.8 if many else 1.5,
            label=None if (many or key) else _written(trial_id),
        )
        marked |= _mark_off_plot(ax, span, x, y, line.get_color())
    ax.set_ylim(*_limits(span))
    if marked:
        ax.annotate(_MARKS_NOTE, (0.995, 0.005), xycoords="axes fraction", ha="right", fontsize="x-small", color="grey")
    if not many and key is None:
        ax.legend(title="trial", fontsize="small")
    ax.set_xlabel("step")
    ax.set_ylabel(_written(metric))
    absent = f"; {without} more without {metric}" if without else ""
    ax.set_title(_written(f"{title} ({steps['trial_id'].nunique()} trials{absent})"))
    ax.grid(alpha=0.3)
    return _save(fig, path)


@np.errstate(over="ignore", invalid="ignore")  # as for curves()
def params(trials: pd.DataFrame, metric: str, path: Path, *, title: str) -> Path:
    """One scatter panel per numeric config key: config value against the trial's best ``metric``."""
    best = f"{metric}_best"
    if best not in trials.columns:
        raise InvalidArgumentError(f"No metric {metric!r} in the trial table")
    keys = [c for c in config_columns(trials.columns) if numeric(trials[c]) and trials[c].nunique() > 1]
    if not keys:
        raise InvalidArgumentError("No numeric config key varies across trials; nothing to plot")
    cols = min(3, len(keys))
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False, layout="constrained")
    scores = floats(trials[best])
    norm = _norm(scores)
    for ax, key in zip(axes.flat, keys, strict=False):  # the grid's last row may have panels to spare (hidden)
        values = floats(trials[key])
        points = ax.scatter(values, scores, c=scores, cmap="viridis_r", norm=norm, s=18, edgecolors="none")
        if log_spread(values):
            ax.set_xscale("log")
        else:
            _fit(ax, "x", values)
        _fit(ax, "y", scores)
        ax.set_xlabel(_written(key[len("config/") :]))
        ax.set_ylabel(_written(f"best {metric}"))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    fig.colorbar(points, ax=axes, label=_written(f"best {metric}"))
    drawn = int(np.isfinite(scores).sum())
    unscored = f", {len(trials) - drawn} without a finite best {metric}" if drawn < len(trials) else ""
    fig.suptitle(_written(f"{title} ({drawn} trials{unscored})"))
    return _save(fig, path)


FORMATS = ("png", "svg", "pdf")


def _save(fig: matplotlib.figure.Figure, path: Path) -> Path:
    """Write the figure in the format its extension names, atomically (see :mod:`ray_cmf._atomic`), and
    release it; another extension is refused (a ``.jpg`` held PNG bytes)."""
    fmt = path.suffix.lstrip(".").lower()
    try:
        if fmt not in FORMATS:
            raise InvalidArgumentError(f"Cannot write a plot to {str(path)!r}: name a .png, .svg or .pdf file")
        with atomic_write(path) as pending:
            fig.savefig(pending.tmp, dpi=120, format=fmt)
    finally:
        plt.close(fig)
    return path
