"""Cmf: the cmflib-compatible facade (same method names and keyword arguments; change only the import).

    from ray_cmf import Cmf            # was: from cmflib.cmf import Cmf
    cmf = Cmf(pipeline_name="mnist")
    for step in range(1000):
        cmf.log_metric("train", {"step": step, "loss": loss})
    cmf.commit_metrics("train")

Differences that users gain: ``log_metric`` is O(1) and crash-safe (rows spill to disk in the
background), no git/DVC remote or ``cmf init`` is needed, and ``read_metrics`` works and reads any
committed version by md5.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from ray_cmf._names import check_name
from ray_cmf.buffer import MetricBuffer, spill_owner
from ray_cmf.constants import (
    DATASET_TYPE,
    DEFAULT_FLUSH_ROWS,
    DEFAULT_FLUSH_SECONDS,
    MODEL_TYPE,
    SEQUENCE_COLUMN,
    STEP_METRICS_TYPE,
)
from ray_cmf.errors import MetricsNotFoundError, RayCmfError
from ray_cmf.lineage import Artifact, Context, Execution, Lineage, properties
from ray_cmf.store import Store

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


class Cmf:
    """Per-run metadata writer with cmflib's API: contexts, executions, step metrics, datasets, models.

    Args:
        filepath: The MLMD database file (cmflib's meaning). Default: ``<store>/mlmd.sqlite``.
        pipeline_name: Name of the pipeline (parent) context.
        custom_properties: Properties of the pipeline context.
        graph: cmflib's Neo4j mirror; not supported, accepted for compatibility.
        store: Store directory or :class:`Store` (default: ``$RAY_CMF_STORE`` or ``./cmf_store``).
        flush_rows: Rows per spilled chunk of each metric series.
        flush_seconds: Longest time between spills while rows keep arriving.

    Example:
        >>> import tempfile
        >>> cmf = Cmf(pipeline_name="doc", store=tempfile.mkdtemp())
        >>> for step in range(3):
        ...     cmf.log_metric("train", {"step": step, "loss": 1.0 / (step + 1)})
        >>> artifact = cmf.commit_metrics("train")
        >>> cmf.read_metrics("train")["loss"].tolist()
        [1.0, 0.5, 0.3333333333333333]
    """

    def __init__(
        self,
        filepath: str | os.PathLike[str] | None = None,
        pipeline_name: str = "default",
        custom_properties: Mapping[str, Any] | None = None,
        graph: bool = False,
        *,
        store: str | os.PathLike[str] | Store | None = None,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
    ) -> None:
        if graph:
            log.warning("ray_cmf.Cmf: graph=True (Neo4j) is not supported; lineage stays in MLMD")
        self.store = store if isinstance(store, Store) else Store(store, mlmd=filepath)
        self.pipeline_name = check_name("pipeline_name", pipeline_name)
        self.parent_context: Context = self.store.pipeline(pipeline_name, custom_properties)
        self.child_context: Context | None = None
        self.execution: Execution | None = None
        self.metrics: dict[str, MetricBuffer] = {}
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._stage: str | None = None

    # -- contexts and executions ---------------------------------------------------------------------
    def create_context(self, pipeline_stage: str, custom_properties: Mapping[str, Any] | None = None) -> Context:
        """Get or create the stage (child) context and make it current."""
        self.child_context = self.store.stage(self.pipeline_name, pipeline_stage, custom_properties)
        self._stage = pipeline_stage
        return self.child_context

    def create_execution(
        self,
        execution_type: str,
        custom_properties: Mapping[str, Any] | None = None,
        cmd: str | None = None,
        create_new_execution: bool = True,
        execution_name: str | None = None,
    ) -> Execution:
        """Create (or, with ``create_new_execution=False``, reuse by type) an execution and make it current."""
        if self._stage is None:
            self.create_context(execution_type)
        assert self._stage is not None
        if execution_name is None:
            execution_name = f"{execution_type}-{uuid.uuid4().hex[:12]}" if create_new_execution else execution_type
        props = {
            "Execution": cmd if cmd is not None else shlex.join(sys.argv),
            "Context_Type": self._stage,
            "Pipeline_Type": self.pipeline_name,
            **(custom_properties or {}),
        }
        self.execution = self.store.execution(self.pipeline_name, self._stage, execution_type, execution_name, props)
        return self.execution

    def update_execution(self, execution_id: int, custom_properties: Mapping[str, Any] | None = None) -> Execution:
        """Merge custom properties into an execution (cmflib's signature)."""
        updated = self.store.update_execution(execution_id, custom_properties)
        if self.execution is not None and self.execution.id == execution_id:
            self.execution = updated
        return updated

    def _current_execution(self) -> Execution:
        """The current execution, created implicitly (as cmflib does) when the user has made none."""
        if self.execution is None:
            self.create_execution("Execution")
        assert self.execution is not None
        return self.execution

    # -- step metrics --------------------------------------------------------------------------------
    def log_metric(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> None:
        """Append one row to the ``metrics_name`` series: O(1), no I/O, numbered from 1."""
        buffer = self.metrics.get(metrics_name)
        if buffer is None:
            buffer = self._new_buffer(metrics_name)
        buffer.append(custom_properties or {})

    def _new_buffer(self, metrics_name: str) -> MetricBuffer:
        check_name("metrics_name", metrics_name)
        execution = self._current_execution()
        assert self._stage is not None
        manifest = {
            "metrics_name": metrics_name,
            "execution_id": execution.id,
            "dest": str(self._destination(metrics_name)),
            **spill_owner(),
        }
        key = f"{execution.id}-{metrics_name}-{uuid.uuid4().hex[:8]}"
        buffer = MetricBuffer(
            self.store.spill_dir(key), flush_rows=self.flush_rows, flush_seconds=self.flush_seconds, manifest=manifest
        )
        self.metrics[metrics_name] = buffer
        return buffer

    def _destination(self, metrics_name: str) -> Path:
        execution = self._current_execution()
        assert self._stage is not None
        return self.store.series_path(self.pipeline_name, self._stage, execution.name, metrics_name)

    def commit_metrics(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> Artifact:
        """Write the series to a versioned Parquet file, DVC-track it and record a Step_Metrics artifact.

        Committing the same name again creates a new version holding every row logged so far.
        """
        buffer = self.metrics.get(metrics_name)
        if buffer is None:
            raise MetricsNotFoundError(
                f"Nothing was logged under metrics_name={metrics_name!r}; call log_metric first "
                f"(logged names: {sorted(self.metrics)})"
            )
        finished = buffer.finish(self._destination(metrics_name))
        try:
            return self.store.commit_metrics(self._current_execution().id, metrics_name, finished, custom_properties)
        except Exception as exc:
            raise RayCmfError(
                f"Metrics {metrics_name!r} were written to {finished.path} (md5 {finished.md5}) but could not be "
                f"registered in the store: {exc}"
            ) from exc

    def read_metrics(self, metrics_name: str, commit: str | None = None) -> pd.DataFrame:
        """The latest committed version of a series (or the one with md5 ``commit``), indexed by SequenceNumber."""
        artifact = find_step_metrics(self.store, self.pipeline_name, metrics_name, commit)
        table = pq.read_table(self.store.resolve(properties(artifact)["url"]))
        return table.to_pandas().set_index(SEQUENCE_COLUMN)

    def log_execution_metrics(self, metrics_name: str, custom_properties: Mapping[str, Any] | None = None) -> Artifact:
        """Record execution-level metrics (e.g. final accuracy) as a Metrics artifact."""
        check_name("metrics_name", metrics_name)
        return self.store.log_execution_metrics(self._current_execution().id, metrics_name, custom_properties or {})

    # -- datasets and models -------------------------------------------------------------------------
    def log_dataset(
        self, url: str | os.PathLike[str], event: str, custom_properties: Mapping[str, Any] | None = None
    ) -> Artifact:
        """Hash a dataset file, track it with DVC when it lies in the store, and link it to the execution."""
        return self.store.log_file(self._current_execution().id, DATASET_TYPE, url, event.lower(), custom_properties)

    def log_model(
        self,
        path: str | os.PathLike[str],
        event: str,
        model_framework: str = "Default",
        model_type: str = "Default",
        model_name: str = "Default",
        custom_properties: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Hash a model file, track it with DVC when it lies in the store, and link it to the execution."""
        props = {
            "model_framework": model_framework,
            "model_type": model_type,
            "model_name": model_name,
            **(custom_properties or {}),
        }
        return self.store.log_file(self._current_execution().id, MODEL_TYPE, path, event.lower(), props)

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every buffer's spill thread; uncommitted rows stay on disk for :func:`ray_cmf.recover`."""
        for buffer in self.metrics.values():
            buffer.close()

    def __enter__(self) -> Cmf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_step_metrics(store: Store, pipeline: str, metrics_name: str, commit: str | None = None) -> Artifact:
    """The newest Step_Metrics artifact of ``metrics_name`` in ``pipeline`` (or the one whose md5 is ``commit``)."""
    lineage: Lineage = store.lineage
    parent = lineage.find_pipeline(pipeline)
    contexts = [parent, *lineage.stages(parent)] if parent is not None else []
    matches = [
        a for a in lineage.artifacts(contexts, STEP_METRICS_TYPE) if properties(a)["metrics_name"] == metrics_name
    ]
    if commit is not None:
        matches = [a for a in matches if properties(a)["Commit"] == commit]
    if not matches:
        which = f" with md5 {commit!r}" if commit else ""
        raise MetricsNotFoundError(f"No committed metrics {metrics_name!r}{which} in pipeline {pipeline!r} of {store}")
    return matches[-1]
