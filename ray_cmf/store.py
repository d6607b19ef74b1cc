"""Store: one directory holding the MLMD database, the DVC repo and the artifacts, and its single writer.

Every write to MLMD and DVC goes through one :class:`Store` object. Its methods take and return plain,
picklable values (names, ids, protos, :class:`FinishedFile`), so the same object can run in-process,
in a driver thread or inside a Ray actor without change. :class:`StoreWriter` is that single writer for
a whole Ray job: the integrations host it in a Ray actor, and call it in-process without Ray.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_cmf._names import check_name
from ray_cmf.buffer import FinishedFile, MetricBuffer, spill_owner
from ray_cmf.constants import (
    ARTIFACTS_DIR,
    DATASET_TYPE,
    DEFAULT_STORE,
    ENV_STORE,
    EXECUTION_METRICS_TYPE,
    MLMD_FILE,
    RUN_EXECUTION_TYPE,
    SPILL_DIR,
    STEP_METRICS_TYPE,
    TRIAL_EXECUTION_TYPE,
)
from ray_cmf.errors import StoreError
from ray_cmf.lineage import Artifact, Context, Execution, Lineage
from ray_cmf.versioning import DvcRepo, tree_md5


def resolve_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The store directory: the argument, else ``$RAY_CMF_STORE``, else ``./cmf_store``."""
    return Path(root if root is not None else os.environ.get(ENV_STORE, DEFAULT_STORE)).absolute()


class Store:
    """The embedded store and its single writer. Created on first use; needs no init and no remote.

    Args:
        root: Store directory (default: ``$RAY_CMF_STORE`` or ``./cmf_store``).
        mlmd: MLMD database: a SQLite path or a ``mysql://`` URL (default: ``<root>/mlmd.sqlite``).
        scm: Initialise the DVC repo with git instead of ``--no-scm``.

    Example:
        >>> import tempfile
        >>> store = Store(tempfile.mkdtemp())
        >>> store.pipeline("demo").name
        'demo'
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        mlmd: str | os.PathLike[str] | None = None,
        scm: bool = False,
    ) -> None:
        self.root = resolve_root(root)
        self.mlmd = os.fspath(mlmd) if mlmd is not None else str(self.root / MLMD_FILE)
        self.scm = scm
        self._lineage: Lineage | None = None
        self._dvc: DvcRepo | None = None
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle only the location; connections reopen lazily where the object lands."""
        return {"root": self.root, "mlmd": self.mlmd, "scm": self.scm}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], mlmd=state["mlmd"], scm=state["scm"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- lazily opened parts -------------------------------------------------------------------------
    def _ensure_root(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"Store path {self.root} exists and is not a directory; pass another store path")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{uuid.uuid4().hex}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"Store directory {self.root} is not writable: {exc}") from exc

    @property
    def lineage(self) -> Lineage:
        """The MLMD database, opened for writing on first use."""
        with self._lock:
            if self._lineage is None:
                self._ensure_root()
                self._lineage = Lineage(self.mlmd)
            return self._lineage

    @property
    def dvc(self) -> DvcRepo:
        """The DVC repo at the store root, initialised on first use."""
        with self._lock:
            if self._dvc is None:
                self._ensure_root()
                self._dvc = DvcRepo(self.root, scm=self.scm)
            return self._dvc

    # -- paths ---------------------------------------------------------------------------------------
    def artifact_dir(self, pipeline: str, stage: str, run: str) -> Path:
        """``artifacts/<pipeline>/<stage>/<run>``: where one execution's files live."""
        return self.root / ARTIFACTS_DIR / check_name("pipeline", pipeline) / check_name("stage", stage) / run

    def series_path(self, pipeline: str, stage: str, run: str, metrics_name: str) -> Path:
        """Where a series' next version goes; ``{md5}`` becomes the content hash when it is written."""
        return self.artifact_dir(pipeline, stage, run) / f"{check_name('metrics_name', metrics_name)}-{{md5}}.parquet"

    def spill_dir(self, key: str) -> Path:
        """A fresh-per-key directory for a buffer's crash-safe segments."""
        return self.root / SPILL_DIR / key

    def url(self, path: str | os.PathLike[str]) -> str:
        """A path as stored in MLMD: relative to the store root when inside it, else absolute."""
        path = Path(path).absolute()
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)

    def resolve(self, url: str) -> Path:
        """Inverse of :meth:`url`."""
        path = Path(url)
        return path if path.is_absolute() else self.root / path

    # -- writes (the single writer) ------------------------------------------------------------------
    def pipeline(self, name: str, props: Mapping[str, Any] | None = None) -> Context:
        """Get or create the pipeline context ``name``."""
        with self._lock:
            return self.lineage.pipeline(check_name("pipeline", name), props)

    def stage(self, pipeline: str, stage: str, props: Mapping[str, Any] | None = None) -> Context:
        """Get or create the stage context ``stage`` under ``pipeline``."""
        with self._lock:
            parent = self.pipeline(pipeline)
            return self.lineage.stage(parent, check_name("stage", stage), props)

    def execution(
        self, pipeline: str, stage: str, type_name: str, name: str, props: Mapping[str, Any] | None = None
    ) -> Execution:
        """Get (on restore) or create the execution ``name`` in the stage context."""
        with self._lock:
            ctx = self.stage(pipeline, stage)
            return self.lineage.execution(ctx, check_name("execution type", type_name), name, props)

    def update_execution(
        self, execution_id: int, props: Mapping[str, Any] | None = None, state: str | None = None
    ) -> Execution:
        """Merge properties into an execution and optionally set RUNNING/COMPLETE/FAILED/CANCELED."""
        with self._lock:
            return self.lineage.update_execution(execution_id, props, state)

    def commit_metrics(
        self,
        execution_id: int,
        metrics_name: str,
        finished: FinishedFile,
        custom: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Track a finished Parquet file with DVC and record its Step_Metrics artifact (one MLMD transaction)."""
        with self._lock:
            self.dvc.track(finished.path, finished.md5, finished.size)
            url = self.url(finished.path)
            typed = {
                "Commit": finished.md5,
                "url": url,
                "metrics_name": metrics_name,
                "rows": finished.rows,
                "size": finished.size,
            }
            name = f"{metrics_name}:{finished.md5}"
            return self.lineage.put_artifact(execution_id, STEP_METRICS_TYPE, name, str(finished.path), typed, custom)

    def link_output(self, execution_id: int, artifact_id: int) -> None:
        """Also record an existing artifact as an output of another execution (e.g. a Train run's trial)."""
        with self._lock:
            self.lineage.link(execution_id, artifact_id, "output")

    def log_file(
        self,
        execution_id: int,
        type_name: str,
        path: str | os.PathLike[str],
        event: str,
        custom: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Hash a dataset or model (file or directory) and record it in MLMD; DVC-track files inside the store."""
        path = Path(path).absolute()
        if not path.exists():
            raise StoreError(f"Cannot log {type_name} {str(path)!r}: no such file or directory")
        if event not in ("input", "output"):
            raise ValueError(f"event must be 'input' or 'output', got {event!r}")
        with self._lock:
            md5, size = tree_md5(path)
            tracked = path.is_file() and path.is_relative_to(self.root)
            if tracked:
                self.dvc.track(path, md5, size)
            typed = {"Commit": md5, "url": self.url(path), "size": size}
            return self.lineage.put_artifact(
                execution_id,
                type_name,
                f"{path.name}:{md5}",
                str(path),
                typed,
                {"dvc_tracked": tracked, **(custom or {})},
                event,
            )

    def log_execution_metrics(self, execution_id: int, metrics_name: str, values: Mapping[str, Any]) -> Artifact:
        """Record execution-level metrics (no file) as a ``Metrics`` artifact, as cmflib does."""
        with self._lock:
            name = f"{metrics_name}:{uuid.uuid4().hex}"
            return self.lineage.put_artifact(
                execution_id, EXECUTION_METRICS_TYPE, name, "", {"metrics_name": metrics_name}, values
            )


EXECUTION_TYPES = {"trial": TRIAL_EXECUTION_TYPE, "run": RUN_EXECUTION_TYPE}


@dataclass(frozen=True)
class Binding:
    """Where a trial's or run's metadata lives: enough for any process to build its Cmf."""

    root: str
    mlmd: str
    pipeline: str
    stage: str
    name: str
    execution_id: int


class StoreWriter:
    """The single writer (hosted in a Ray actor): every MLMD and DVC write of every store goes here.

    Tune trials (``kind="trial"``) and Train runs (``kind="run"``) are bound to executions by name, so
    a restored trial, a restarted worker and the Train callback all reach the same execution.
    """

    def __init__(self) -> None:
        self._stores: dict[tuple[str, str], Store] = {}
        self._bindings: dict[tuple[str, str], Binding] = {}
        self._series: dict[tuple[str, str, str], MetricBuffer] = {}

    def _store(self, root: str, mlmd: str) -> Store:
        key = (root, mlmd)
        if key not in self._stores:
            self._stores[key] = Store(root, mlmd=mlmd)
        return self._stores[key]

    def call(self, root: str, mlmd: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run one Store write method (``RemoteStore`` forwards here)."""
        return getattr(self._store(root, mlmd), method)(*args, **kwargs)

    def start(
        self,
        kind: str,
        root: str,
        mlmd: str,
        pipeline: str,
        stage: str,
        name: str,
        props: Mapping[str, Any],
        data_dir: str | None = None,
    ) -> Binding:
        """Get (on restore/restart) or create the execution, mark it RUNNING and log its input data once."""
        store = self._store(root, mlmd)
        execution = store.execution(pipeline, stage, EXECUTION_TYPES[kind], name, props)
        store.update_execution(execution.id, props, "RUNNING")
        binding = Binding(root, mlmd, pipeline, stage, name, execution.id)
        first_start = (kind, name) not in self._bindings
        self._bindings[(kind, name)] = binding
        if data_dir is not None and first_start:
            store.log_file(execution.id, DATASET_TYPE, data_dir, "input")
        return binding

    def binding(self, kind: str, name: str) -> Binding | None:
        return self._bindings.get((kind, name))

    def log_file(self, kind: str, name: str, type_name: str, path: str, event: str) -> Artifact:
        b = self._bindings[(kind, name)]
        return self._store(b.root, b.mlmd).log_file(b.execution_id, type_name, path, event)

    def end(
        self,
        kind: str,
        name: str,
        props: Mapping[str, Any],
        state: str | None,
        commit: tuple[str, FinishedFile] | None = None,
        link_trial: str | None = None,
    ) -> Artifact | None:
        """Record a Parquet file (if any; also as an output of ``link_trial``) and final properties and state."""
        b = self._bindings[(kind, name)]
        store = self._store(b.root, b.mlmd)
        artifact = store.commit_metrics(b.execution_id, commit[0], commit[1]) if commit else None
        if artifact is not None and link_trial is not None:
            trial = self._bindings[("trial", link_trial)]
            store.link_output(trial.execution_id, artifact.id)
        store.update_execution(b.execution_id, props, state)
        return artifact

    def append_rows(self, kind: str, name: str, metrics_name: str, rows: list[dict[str, Any]]) -> None:
        """Append rows to a series this writer holds for a caller that must not do I/O (the Train controller)."""
        key = (kind, name, metrics_name)
        if key not in self._series:
            b = self._bindings[(kind, name)]
            spill = self._store(b.root, b.mlmd).spill_dir(f"{kind}-{name}-{metrics_name}")
            manifest = {
                "metrics_name": metrics_name,
                "execution_id": b.execution_id,
                "dest": str(self._dest(key)),
                **spill_owner(),
            }
            self._series[key] = MetricBuffer.resume(spill, manifest=manifest)
        for row in rows:
            self._series[key].append(row)

    def _dest(self, key: tuple[str, str, str]) -> Path:
        kind, name, metrics_name = key
        b = self._bindings[(kind, name)]
        return self._store(b.root, b.mlmd).series_path(b.pipeline, b.stage, name, metrics_name)

    def commit_rows(
        self, kind: str, name: str, metrics_name: str, props: Mapping[str, Any], state: str | None
    ) -> Artifact | None:
        """Commit a held series (a new version each time) and set the execution's properties and state."""
        key = (kind, name, metrics_name)
        buffer = self._series.get(key)
        commit = (metrics_name, buffer.finish(self._dest(key))) if buffer is not None and buffer.rows else None
        return self.end(kind, name, props, state, commit)

    def ping(self) -> bool:
        return True
