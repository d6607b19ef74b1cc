"""A small real Tune sweep for the tests: a grid over the config, one CmfRayLogger as its callback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_grid(
    trainable: Callable[[dict[str, Any]], None], grid: dict[str, list[Any]], results: Path, logger: Any
) -> None:
    """Run every combination of ``grid`` through Tune (on the session's Ray), with ``logger`` recording it;
    the experiment is named after the logger's pipeline."""
    from ray import tune

    tune.Tuner(
        trainable,
        param_space={key: tune.grid_search(values) for key, values in grid.items()},
        run_config=tune.RunConfig(name=logger.pipeline_name, storage_path=str(results), callbacks=[logger], verbose=0),
    ).fit()
