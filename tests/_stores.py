"""Stores made without Tune: trials registered and series committed through the store's real writer, exactly
the requests CmfRayLogger and StepLogger send, so read-side tests can build any sweep in milliseconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_cmf import MetricBuffer, Store
from ray_cmf.binding import SeriesKey
from ray_cmf.client import WriterClient
from ray_cmf.constants import TRIAL_EXECUTION_TYPE
from ray_cmf.lineage import config_properties
from ray_cmf.writer import StoreWriter


@dataclass
class Trial:
    """One trial: its config, its series' rows (by series instance; "" for the trial's one series), and how
    it ended (``RUNNING``: it has not, and its rows are spilled, not committed)."""

    trial_id: str
    config: Mapping[str, Any] = field(default_factory=dict)
    series: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    status: str = "COMPLETE"
    error: str | None = None  # what a FAILED trial raised, as it is recorded
    props: Mapping[str, Any] = field(default_factory=dict)  # more execution properties (modes, say)
    final: Mapping[str, Any] = field(default_factory=dict)  # what it logs with log_execution_metrics("final", ...)


def write_trials(
    store_dir: Path,
    trials: Sequence[Trial],
    *,
    pipeline: str = "sweep",
    stage: str = "exp",
    metrics_name: str = "tune_results",
    sweep: str | None = None,
    start: bool = False,
) -> Store:
    """Register each trial and commit (or, for a running one, only spill) its series; returns the store.
    ``sweep``: the id of the sweep they are of (a trial id that another sweep left in the stage is a new trial);
    ``start``: register each as Tune starts a trial: every start of one id is its next attempt (a retry), and
    its rows say which."""
    store = Store(store_dir)
    client = WriterClient(StoreWriter(store))
    for trial in trials:
        props = {**config_properties(trial.config), "trial_id": trial.trial_id, "status": "RUNNING", **trial.props}
        binding = client.call(
            StoreWriter.bind,
            kind="trial",
            name=trial.trial_id,
            pipeline=pipeline,
            stage=stage,
            type_name=TRIAL_EXECUTION_TYPE,
            props=props,
            sweep=sweep,
            start=start,
        )
        for instance, rows in trial.series.items():
            key = SeriesKey(binding, metrics_name, instance, attempts=start)  # rows stamped with their attempt
            buffer = MetricBuffer(sink=client.sink(key), flush_rows=7)
            for row in rows:
                buffer.append(row)
            buffer.close()
            if trial.status != "RUNNING" and rows:
                client.call(StoreWriter.commit, key=key)
        if trial.final:
            client.call(StoreWriter.log_execution_metrics, binding=binding, metrics_name="final", values=trial.final)
        if trial.status != "RUNNING":
            props = {"status": trial.status, **({"error": trial.error} if trial.error else {})}
            client.call(StoreWriter.end, binding=binding, props=props, state=trial.status)
    return store
