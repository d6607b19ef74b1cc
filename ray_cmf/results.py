"""Results as Ray reports them (``tune.report``, ``ray.train.report``) made into rows of a metric series."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Tune bookkeeping that is not a training metric (strings are dropped anyway).
_DROPPED = frozenset(
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


def result_row(result: Mapping[str, Any]) -> dict[str, Any]:
    """The loggable part of a Tune result: numbers, bools and None (nested dicts flattened with ``/``).

    Config keys, Tune's bookkeeping and strings are dropped; NaN and inf are kept as data.
    """
    row: dict[str, Any] = {}

    def visit(prefix: str, mapping: Mapping[str, Any]) -> None:
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            if not prefix and key in _DROPPED:
                continue
            if isinstance(value, Mapping):
                visit(name + "/", value)
                continue
            if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
                value = value.item()  # numpy / torch scalars
            if value is None or isinstance(value, bool | int | float):
                row[name] = value

    visit("", result)
    return row
