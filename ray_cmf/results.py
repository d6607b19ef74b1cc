"""Results as Ray reports them (``tune.report``, ``ray.train.report``) made into rows of a metric series."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray_cmf.errors import InvalidNameError, InvalidValueError, PrecisionError, SchemaError

if TYPE_CHECKING:
    from ray_cmf.buffer import MetricBuffer

log = logging.getLogger(__name__)

MODEL_PATH = "model_path"  # a result's path of the trial's model file
# Tune bookkeeping that is not a training metric, dropped without a word (``done`` is Tune's stop signal).
TUNE_OWN = frozenset(
    {
        "config",
        "pid",
        "timestamp",
        "done",
        "should_checkpoint",
        "trial_id",
        "date",
        "hostname",
        "node_ip",
        "experiment_tag",
        "checkpoint_dir_name",
        MODEL_PATH,  # CmfRayLogger records the file as the trial's output model
    }
)

TUNE_BOOKKEEPING = frozenset(  # numbers Tune adds to every result: kept, but not what a user compares trials by
    {
        "time_this_iter_s",
        "time_total_s",
        "time_since_restore",
        "iterations_since_restore",
        "timesteps_total",
        "timesteps_since_restore",
        "episodes_total",
        "training_iteration",
    }
)
COUNTERS = frozenset({"epoch", "step", "iteration", "it", "samples", "report"})  # they count: only a final


def counts(metric: str) -> bool:
    """Whether a column counts something (an epoch, the values a device metric left out as non-finite): its
    final value says it all, its "best" means nothing."""
    return metric in COUNTERS or metric.endswith("_nonfinite")


def summary_kinds(metric: str) -> tuple[str, ...]:
    """The summaries of a metric that tables show: its best and final values, a count's final only."""
    return ("final",) if counts(metric) else ("best", "final")


def result_row(result: Mapping[str, Any], *, tune: bool = True) -> dict[str, Any]:
    """The loggable part of a Tune result (``tune``) or a Train report: numbers, bools and None (nested dicts
    flattened with ``/``).

    A Tune result's config and Tune's bookkeeping are dropped (a Train report holds neither: its ``pid`` is
    the loop's); any other value that is not a number (text, a list, an array) is dropped and named once.
    NaN and inf are kept as data.
    """
    row: dict[str, Any] = {}
    dropped = TUNE_OWN if tune else frozenset()

    def visit(prefix: str, mapping: Mapping[str, Any]) -> None:
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            if not prefix and key in dropped:
                continue
            if isinstance(value, Mapping):
                visit(name + "/", value)
                continue
            if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
                value = value.item()  # numpy / torch scalars
            if not isinstance(value, bool | int | float) and value is not None:
                kind = type(value).__name__
                why = "results keep numbers, bools and None (report a list as one number per element)"
                _warn_once("not a number", name, f"ray_cmf does not record {name!r} of a result, a {kind}: {why}")
                continue
            if name in row:  # {"val/acc": ..., "val": {"acc": ...}}: one name for two values
                _warn_once("collided", name, f"a result holds two values that flatten to {name!r}; the first is kept")
                continue
            row[name] = value

    visit("", result)
    return row


def without(row: dict[str, Any], own: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``row`` less the columns that ray_cmf fills itself in ``own`` (a Train report's ``rank``), each named
    once as dropped: the reported value would replace ray_cmf's."""
    for name in own.keys() & row.keys():
        _drop_reserved(row, name, source, "ray_cmf fills it")
    return row


def _drop_reserved(row: dict[str, Any], name: str, source: str, why: object) -> None:
    """Drop ``name``, a column ray_cmf fills itself, from a result's row, saying so once per name."""
    _warn_once("reserved", name, f"results drop their metric {name!r} (first at {source}): {why}")
    del row[name]


class KindsAcrossTrials:
    """What each result key was (a bool or a number) in the first trial of a sweep that reported it: a key
    another trial reports as the other kind reads as text across the sweep, with no best, final or ranking
    for any trial (see the README), which is said once per key as it happens, not first when it is read."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, str]] = {}  # key -> (its kind, the trial that first reported it)
        self._said: set[str] = set()

    def note(self, row: Mapping[str, Any], trial_id: str) -> None:
        """Note a trial's result row (as appended: values its own series refused are out of it already)."""
        for key, value in row.items():
            if value is None:
                continue
            kind = "a bool" if isinstance(value, bool) else "a number"
            first, by = self._first.setdefault(key, (kind, trial_id))
            if first != kind and key not in self._said:
                self._said.add(key)
                log.warning(
                    "ray_cmf: %r is %s in trial %s and %s in trial %s: across the sweep it reads as text, with no "
                    "best, final or ranking for any trial (report it as one kind in every trial)",
                    key,
                    first,
                    by,
                    kind,
                    trial_id,
                )


_WARNED: set[tuple[str, str]] = set()


def _warn_once(kind: str, name: str, message: str) -> None:
    """Log ``message`` once per process, ``kind`` of trouble and name: every result repeats it."""
    if (kind, name) not in _WARNED:
        _WARNED.add((kind, name))
        log.warning("ray_cmf: %s", message)


_REFUSED: weakref.WeakKeyDictionary[MetricBuffer, set[tuple[type, str]]] = weakref.WeakKeyDictionary()  # said


def append_result(buffer: MetricBuffer, row: dict[str, Any], source: str) -> None:
    """Append a result's row, dropping with a warning each value that its column cannot hold (a type change,
    an int beyond 2**53 among floats, a text UTF-8 cannot hold): the rest of the result is kept. ``source``
    says whose result it is, and at which step: the buffer's row number means nothing to the user."""
    while True:
        try:
            buffer.append(row)
            return
        except (SchemaError, PrecisionError, InvalidValueError) as exc:
            refused = _REFUSED.setdefault(buffer, set())
            if (type(exc), exc.key) not in refused:  # a value reported at every result: said once per series
                refused.add((type(exc), exc.key))
                log.warning(
                    "ray_cmf: %s: dropping metric %r: %s (said once: later ones are dropped alike)",
                    source,
                    exc.key,
                    exc.reason,
                )
            row.pop(exc.key)
        except InvalidNameError as exc:  # a name ray_cmf fills itself: every result holds it
            _drop_reserved(row, exc.name, source, exc)
