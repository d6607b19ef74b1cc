"""Comparing trials after a sweep: the trial table, tidy step frames, best/top-N, diffs and plots.

Read side only: MLMD is opened read-only and every trial's Parquet is read in one pyarrow dataset scan
that loads only the columns asked for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from ray_cmf._json import JsonText, float_of
from ray_cmf._names import check_limit, check_mode, recorded_modes, what_exists
from ray_cmf.attempts import RESTART_KEYS, dedup_attempts, restarted
from ray_cmf.constants import (
    ATTEMPT_COLUMN,
    CONFIG_JSON,
    DELETED_PROPERTY,
    ERROR_PROPERTY,
    EXACT_FLOAT_INT,
    OWNER_PROPERTY,
    RANKED_BY_PROPERTY,
    RANKED_MODE_PROPERTY,
    RECOVERED,
    REPLACED,
    REPORTS_METRICS_NAME,
    RESTARTED_FROM_PROPERTY,
    RESULTS_METRICS_NAME,
    SEQUENCE_COLUMN,
    SPILL_DIR,
    STARTS_PREFIX,
    STEP_METRICS_TYPE,
    STEPS_METRICS_NAME,
    STOPPED_PROPERTY,
    SUMMARY_KEY,
    SYSTEM_METRICS_NAME,
    THROUGHPUT,
    TRIAL_EXECUTION_TYPE,
    WORKER_GROUP_COLUMN,
)
from ray_cmf.curation import (
    DELETED_COLUMN,
    NOTE_COLUMN,
    TAG_COLUMN,
    check_deleted,
    curated_columns,
    deleted_properties,
    note_properties,
    tag_properties,
    untag_properties,
)
from ray_cmf.environment import ENV_COLUMNS, recorded_environment
from ray_cmf.errors import InvalidArgumentError, MetricsNotFoundError, RayCmfError, StoreError
from ray_cmf.exits import shown_status
from ray_cmf.frames import (
    ERROR_COLUMN,
    KEY_COLUMNS,
    RANK_COLUMN,
    RESTART_COLUMNS,
    SERIES_COLUMN,
    TRIAL_COLUMN,
    blank,
    exact_frame,
    exact_summary,
    group_keys,
    group_summaries,
    is_metric,
    is_number,
    mode_of,
    numbers_as_text,
    numeric,
    row_steps,
    settle_ints,
    sort_trials,
    step_candidates,
    step_columns,
    summarize,
    trial_order,
)
from ray_cmf.lineage import (
    Artifact,
    Context,
    Execution,
    collected,
    properties,
    property_of,
    state_name,
    trial_keys,
    trials_and_runs,
    tune_id_of_key,
)
from ray_cmf.query import Query, parse
from ray_cmf.results import TUNE_BOOKKEEPING, counts
from ray_cmf.series_format import (
    SeriesSummary,
    SpillManifest,
    conform,
    float_texts,
    int_magnitude,
    read_segments,
    segment_columns,
    unify,
)
from ray_cmf.store import Store
from ray_cmf.versioning import file_md5

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


_WITH_DELETED = "Sweep(..., include_deleted=True) (--include-deleted)"


def unknown_trials(
    asked: Iterable[str], keys: Iterable[str], pipeline: str | None, deleted: Collection[str] = ()
) -> RayCmfError:
    """The error for trials a sweep does not hold by those keys: a bare Tune id that several of its trials
    share (ids recur across sweeps) is answered with their keys, and a trial it leaves out as ``deleted``
    says so."""
    keys = sorted(keys, key=trial_order)
    lines, unknown = [], []
    for trial in asked:
        sharing = [k for k in keys if tune_id_of_key(k) == trial]
        hidden = [k for k in deleted if tune_id_of_key(k) == trial]
        held = f"{trial!r} is the Tune id of {len(sharing) + len(hidden)} trials in {pipeline}"
        gone = f" ({len(hidden)} of them deleted)" if hidden else ""
        if trial in deleted:
            lines.append(f"{trial!r} is deleted: read it with {_WITH_DELETED}")
        elif len(sharing) == 1:
            lines.append(f"{held}{gone}: name the one this sweep shows, {sharing[0]!r}")
        elif sharing:
            lines.append(f"{held}{gone}; name one: {sharing}")
        elif hidden:
            lines.append(f"{held}, all deleted: read them with {_WITH_DELETED}")
        else:
            unknown.append(trial)
    if unknown:
        lines.insert(0, f"Unknown trial(s) {unknown} in {pipeline}; {what_exists(unknown, keys)}")
    return RayCmfError("; ".join(lines))


def _queried_metrics(query: Query | None, metrics: list[str] | None) -> list[str]:
    """The metrics whose ``_best``/``_final`` a query reads beyond ``metrics`` (None: every metric is read)."""
    if query is None or metrics is None:
        return []
    named = [n.rsplit("_", 1)[0] for n in query.names() if n.endswith(("_best", "_final"))]
    return [m for m in dict.fromkeys(named) if m not in metrics]


@dataclass(frozen=True)
class TrialFile:
    """The latest committed version of one of a trial's series: ``url`` as MLMD records it, ``path`` where
    its bytes are read (the file itself, or the same content from the DVC cache or the remote, by ``md5``);
    ``instance`` tells a trial's series of one name apart (a Train rank's: ``rank1``); ``uri``: the absolute
    path it was committed at (MLMD's ``uri``)."""

    trial_id: str
    execution: Execution
    stage: str
    path: Path
    md5: str
    url: str
    instance: str = ""
    uri: str = ""


@dataclass(frozen=True)
class _Spilled:
    """The uncommitted rows of one of a trial's series (its ``instance``), as its spill holds them."""

    trial: str
    instance: str
    table: pa.Table
    steps: list[str]  # its step columns (see ``_step_columns``)

    def keyed(self, several: Collection[str], asked: Collection[str] | None) -> pa.Table:
        """The rows with their trial and, where some trials hold ``several`` series of the name, their series
        (null for a trial that holds one)."""
        table = self.table.append_column(TRIAL_COLUMN, _constant(self.trial, self.table.num_rows))
        if several:
            instance = self.instance if self.trial in several else None
            table = table.append_column(SERIES_COLUMN, _constant(instance, table.num_rows))
        return _keyed(table, self.steps, asked)


class Sweep:
    """The trials of one pipeline (optionally one stage) and their committed metric series.

    Args:
        store: Store directory or :class:`Store` (default ``$RAY_CMF_STORE`` or ``./cmf_store``).
        pipeline: Pipeline name; may be omitted when the store holds exactly one.
        stage: Restrict to one stage (a Tune experiment).
        metrics_name: Which series to compare. By default the Tune results (``tune_results``); without
            them a Train run's steps (``train_steps``), then its reports (``train_reports``), then the one
            series other than ``system_metrics``. A name the pipeline does not hold, or a default that is
            not obvious (several other series), is an error that lists the series.
        include_deleted: Also the trials marked deleted (:meth:`delete`); they are left out by default.

    Example:
        >>> import tempfile
        >>> from ray_cmf import Cmf
        >>> store = tempfile.mkdtemp()
        >>> for lr in (0.1, 0.2):
        ...     cmf = Cmf(pipeline_name="demo", store=store)
        ...     execution = cmf.create_execution("Train", {"lr": lr}, execution_name=f"lr-{lr}")
        ...     for step in range(3):
        ...         cmf.log_metric("train", {"step": step, "loss": lr / (step + 1)})
        ...     artifact = cmf.commit_metrics("train")
        >>> Sweep(store, metrics_name="train").best("loss", mode="min")[["trial_id", "loss_best"]].values.tolist()
        [['lr-0.1', 0.03333333333333333]]
    """

    metrics_name: str  # the series compared

    def __init__(
        self,
        store: str | os.PathLike[str] | Store | None = None,
        pipeline: str | None = None,
        stage: str | None = None,
        metrics_name: str | None = None,
        *,
        include_deleted: bool = False,
    ) -> None:
        self._open(store, pipeline, stage, metrics_name or RESULTS_METRICS_NAME, include_deleted)
        held = self.series_names()
        if held and self.metrics_name not in held and not (metrics_name is None and self._tune_trials_running()):
            obvious = _obvious_series(held)
            if metrics_name is None and obvious is not None:
                self.metrics_name = obvious
            else:
                which = repr(metrics_name) if metrics_name is not None else "of Tune results (tune_results)"
                exists = what_exists([metrics_name] if metrics_name is not None else [], held)
                raise MetricsNotFoundError(
                    f"No series {which} in pipeline {self.pipeline!r}; {exists}: name one of them "
                    "(metrics_name=..., or --metrics-name)",
                    held,
                )

    def _open(
        self,
        store: str | os.PathLike[str] | Store | None,
        pipeline: str | None,
        stage: str | None,
        metrics_name: str,
        include_deleted: bool,
    ) -> None:
        """Open the sweep of ``metrics_name``, which is not checked against the series the store holds."""
        self.store = store if isinstance(store, Store) else Store(store)
        self.include_deleted = include_deleted
        self.lineage = self.store.reader()
        self.pipeline = pipeline or self._only_pipeline()
        self.stage = stage
        self.stages = self._read_stages()
        self.metrics_name = metrics_name
        self._files: list[TrialFile] | None = None
        self._footer_cache: dict[Path, tuple[pa.Schema, dict[str, Any] | None] | None] | None = None
        self._executions: list[tuple[Execution, str]] | None = None
        self._keys: dict[int, str] = {}  # execution id -> trial id in the tables (see ``key``)
        self._runs: dict[int, list[Execution]] = {}  # a trial's execution id -> the Train runs inside it
        self._artifacts: list[Artifact] | None = None
        self._execution_metrics: dict[int, dict[str, Any]] | None = None  # see ``_logged_metrics``
        self._resumed: dict[str, dict[int, int]] | None = None  # see ``_starts``
        self._restarts: tuple[dict[str, str], dict[str, str]] | None = None  # see ``_replacements``
        self._whole: Sweep = self  # the sweep this one is a view of (see ``only``): whose metrics it knows
        self._kept: frozenset[str] | None = None  # the trials of a view (see ``only``); None: every trial
        self._modes: dict[str, str] | None = None  # see ``modes``
        self._declared: dict[str, tuple[dict[str, str], dict[str, str]]] | None = None  # see ``_declarations``

    def _tune_trials_running(self) -> bool:
        """Whether a Tune trial of the sweep runs: its results are the series to compare by default, also before
        the first one is recorded (a trial's own series, committed first, would stand in for a moment)."""
        trial_type = self.lineage.find_type_id("execution", TRIAL_EXECUTION_TYPE)
        return any(e.type_id == trial_type and state_name(e) == "RUNNING" for e, _ in self.executions())

    def _view(self, include_deleted: bool) -> Sweep:
        """Another view of the same trials and series, whose series is not checked again: a live sweep's series
        come and go (a tag or a note, which need only MLMD, must not fail for that)."""
        view = Sweep.__new__(Sweep)
        view._open(self.store, self.pipeline, self.stage, self.metrics_name, include_deleted)
        return view

    def _read_stages(self) -> list[Context]:
        """The stages this sweep reads: the pipeline's, or the one named (as the store holds them now)."""
        parent = self.lineage.find_pipeline(self.pipeline)
        if parent is None:
            known = [p.name for p in self.lineage.pipelines()]
            raise StoreError(f"No pipeline {self.pipeline!r} in {self.store}; {what_exists([self.pipeline], known)}")
        stages = self.lineage.stages(parent)
        if self.stage is None:
            return stages
        named = [s for s in stages if properties(s).get("stage") == self.stage]
        if not named:
            known = [str(properties(s).get("stage")) for s in stages]
            exists = what_exists([self.stage], known)
            raise StoreError(f"No stage {self.stage!r} in pipeline {self.pipeline!r}; {exists}")
        return named

    def of_series(self, metrics_name: str) -> Sweep:
        """The same trials' series of another name (their Train runs' ``train_steps``, say)."""
        other = Sweep(self.store, self.pipeline, self.stage, metrics_name, include_deleted=self.include_deleted)
        other._executions, other._keys, other._runs = self._executions, self._keys, self._runs
        return other

    def everyone(self) -> Sweep:
        """The same sweep with its deleted trials too."""
        return self._view(include_deleted=True)

    def only(self, trial_ids: str | Iterable[str]) -> Sweep:
        """The same sweep restricted to some trials (one id, or several: the ones a ``where`` expression picked,
        say): its table, steps, plots and report hold those trials only. A name this sweep does not hold is an
        error, as everywhere (a bare id that several trials share, a deleted trial, a typo): dropped without
        a word, it would leave a report short of a trial."""
        keep = frozenset([trial_ids] if isinstance(trial_ids, str) else trial_ids)
        if unknown := keep - {self.key(e) for e, _ in self.executions()}:
            raise self.refusal(sorted(unknown, key=trial_order))
        view = self._view(self.include_deleted)
        view._kept = keep if self._kept is None else keep & self._kept
        view._executions = [(e, s) for e, s in self.executions() if self.key(e) in keep]
        view._keys = self._keys
        view._whole = self._whole
        return view

    def columns(self) -> list[str]:
        """Every column the trials logged to this series, as :meth:`steps` gives them (read from the committed
        files' schemas, no row)."""
        return _logged_columns(self._schema())

    def series_names(self) -> list[str]:
        """The names of the series the compared executions hold, committed or still spilled, sorted.

        The spill is read first: a commit records the new version in MLMD before it empties the spill, so a
        series committed meanwhile is in one or the other (read the other way round, in neither)."""
        ids = {e.id for e, _ in self.executions()}
        spilled = {m.metrics_name for _, m in self._manifests() if m.execution_id in ids}
        committed = {str(property_of(a, "metrics_name")) for a in self._step_artifacts()}
        return sorted(committed | spilled)

    @property
    def _candidates(self) -> tuple[str, ...]:
        """The columns this series' rows are stepped by (see :func:`~ray_cmf.frames.step_candidates`)."""
        return step_candidates(self.metrics_name)

    def _step_artifacts(self) -> list[Artifact]:
        """Every committed series version of the compared stages (read from MLMD once)."""
        if self._artifacts is None:
            self._artifacts = self.lineage.artifacts(self.stages, STEP_METRICS_TYPE)
        return self._artifacts

    def _manifests(self) -> list[tuple[Path, SpillManifest]]:
        """The store's spill directories and their manifests (those being created are left out)."""
        spill_root = self.store.root / SPILL_DIR
        manifests = []
        for directory in sorted(spill_root.iterdir()) if spill_root.is_dir() else []:
            try:
                manifests.append((directory, SpillManifest.read(directory)))
            except OSError:
                continue  # being created, or not a spill
            except (ValueError, TypeError) as exc:  # a newer version's, or damaged: its rows are not read
                log.warning("ray_cmf: live reads leave out the rows of the spill %s: its manifest %s", directory, exc)
        return manifests

    def _only_pipeline(self) -> str:
        names = [p.name for p in self.lineage.pipelines()]
        if len(names) != 1:
            raise StoreError(f"Pass pipeline=...: the store {self.store} holds {len(names)} pipelines {names}")
        return names[0]

    # -- what exists ---------------------------------------------------------------------------------
    def executions(self) -> list[tuple[Execution, str]]:
        """The executions compared, with their stage: Tune trials where the stages hold any, else all."""
        if self._executions is None:
            self._executions = self._find_executions()
        return self._executions

    def _find_executions(self) -> list[tuple[Execution, str]]:
        found, self._runs = trials_and_runs(self.lineage, self.stages)
        self._keys = trial_keys(found)  # over the deleted too: a trial keeps its key in every view
        if not self.include_deleted:
            found = [(e, s) for e, s in found if property_of(e, DELETED_PROPERTY) is None]
        if self._kept is not None:
            found = [(e, s) for e, s in found if self._keys[e.id] in self._kept]
        return found

    def refresh(self) -> Sweep:
        """Read the store again from the next call on: a Sweep reads its trials, their versions and what
        they declared once, when first asked, so a Sweep kept while a sweep runs shows it as it was then.
        ``steps(live=True)`` refreshes by itself; stages that sweeps added since are read too. Returns the
        Sweep."""
        self.stages = self._read_stages()
        self._files = self._executions = self._artifacts = None
        self._execution_metrics = self._resumed = self._modes = self._declared = self._restarts = None
        if self._whole is not self:
            self._whole.refresh()
        return self

    def key(self, execution: Execution) -> str:
        """An execution's trial id in this sweep's tables: its Tune trial id, or ``<stage>/<trial id>`` where
        several of the sweep's trials hold that id, and ``<stage>/<trial id>#<execution id>`` where one stage
        holds it twice (see :func:`~ray_cmf.lineage.trial_keys`)."""
        self.executions()
        return self._keys[execution.id]

    def files(self) -> list[TrialFile]:
        """The latest committed version of every ``metrics_name`` series of every execution (a trial may hold
        several: one per Train rank, say), in execution order, then in the order a trial's series were first
        committed (a read orders them by the step each starts at, see :func:`_series_in_step_order`)."""
        if self._files is None:
            artifacts = {  # freed versions too: a series whose newest version gc freed reads as freed
                a.id: a for a in self._step_artifacts() if property_of(a, "metrics_name") == self.metrics_name
            }
            executions = self.executions()  # and the Train runs inside trials
            runs = {run.id: run for inside in self._runs.values() for run in inside}
            outputs = self.lineage.producers(list(artifacts))
            made_by = {o.artifact_id: o.execution_id for o in outputs if o.execution_id in runs}
            latest: dict[int, dict[tuple[int | None, str], Any]] = {}
            for output in outputs:  # oldest first: the newest version wins
                series = (made_by.get(output.artifact_id), output.instance)  # a trial's runs' series stay apart
                latest.setdefault(output.execution_id, {})[series] = artifacts[output.artifact_id]
            self._files = []
            for execution, stage in executions:
                held = latest.get(execution.id, {})
                several_runs = len({run for run, _ in held}) > 1
                for (run, instance), artifact in held.items():
                    if collected(artifact):
                        continue
                    label = _run_series(runs[run], instance) if several_runs and run is not None else instance
                    file = self._file(execution, stage, label, artifact)
                    if file is not None:
                        self._files.append(file)
        return self._files

    def _file(self, execution: Execution, stage: str, instance: str, artifact: Artifact) -> TrialFile | None:
        props = properties(artifact)
        path = self.store.resolve(props["url"])
        if self.store.escapes(path):
            log.warning("ray_cmf: skipping %s: it is a symlink out of the store", path)
            return None
        content = self.store.content(path, props["Commit"])
        if content is None:
            return None
        key = self.key(execution)
        return TrialFile(key, execution, stage, content, props["Commit"], props["url"], instance, artifact.uri)

    def _several(self, spilled: Iterable[tuple[str, str]] = ()) -> set[str]:
        """The trials that hold more than one series of this name (where there are any, rows carry a
        ``series`` key), committed or among the ``spilled`` ones (trial, series instance): a running script's
        one series reads with the same columns before its commit and after."""
        held = {(f.trial_id, f.instance) for f in self.files()} | set(spilled)
        seen = Counter(trial for trial, _ in held)
        return {trial for trial, n in seen.items() if n > 1}

    # -- frames --------------------------------------------------------------------------------------
    def steps(
        self,
        metrics: Iterable[str] | None = None,
        trials: Iterable[str] | None = None,
        *,
        live: bool = False,
        exact: bool = False,
    ) -> pd.DataFrame:
        """Tidy frame (trial_id, step, columns) from ONE dataset scan that reads only those columns: ``metrics``,
        or every column logged (the rows' own bookkeeping, such as a ``pid``, included).

        Keys come first: ``series`` where a trial holds several series of this name (a Train run's ranks:
        ``rank0``, ``rank1``), and ``rank`` where the rows carry one. A metric some trials lack is null in
        theirs. ``live=True`` reads the store as it is now (see :meth:`refresh`) and adds the rows that
        running trials have spilled but not committed yet (read-only: the complete batches of their spill
        segments; nothing waits for the writer).
        Values come back as logged, as :meth:`Cmf.read_metrics` gives them: a column with nulls (a metric some
        rows or trials lack) is Arrow-backed, so its ints stay ints and a null (nothing logged) is not a NaN
        (a NaN logged); the others keep their NumPy dtype. ``exact=True`` makes every number column
        Arrow-backed. A trial named in ``trials`` that this sweep does not hold is an error, as in :meth:`only`.
        """
        metrics = list(metrics) if metrics is not None else None
        if live:
            self.refresh()
        asked = set(trials) if trials is not None else None
        if asked and (unknown := asked - {self.key(e) for e, _ in self.executions()}):
            raise self.refusal(sorted(unknown, key=trial_order))
        table = self._step_table(metrics, asked, live=live)
        if not table.num_rows:
            return _no_steps(metrics)
        return _tidy(exact_frame(table, arrow_numbers=exact), metrics, overlap=live, starts=self._starts())

    def _step_table(
        self, metrics: list[str] | None, trials: set[str] | None, *, live: bool, spilled: list[_Spilled] | None = None
    ) -> pa.Table:
        """The rows of the series asked for, as Arrow (nulls apart from NaN), keyed and with the step as ``step``
        (``spilled``: the live rows, where the caller read them already)."""
        if spilled is None:
            spilled = self._spilled(metrics) if live else []  # read once: for the check and for the rows
        if metrics is not None:
            self._check_metrics(metrics, [s.table for s in spilled] if live else None)
        several = self._several((s.trial, s.instance) for s in spilled)
        mine = [s.keyed(several, metrics) for s in spilled if trials is None or s.trial in trials]
        tables = [t for t in [self._committed(metrics, trials, several, numbered=live), *mine] if t.num_rows]
        if not tables:
            return pa.table({})
        table = _concat(tables)
        known = self._known_schema()
        for metric in [m for m in metrics or [] if m not in table.column_names]:  # only trials left out have it
            kind = known.field(metric).type if metric in known.names else pa.null()
            table = table.append_column(metric, pa.nulls(table.num_rows, kind))
        return table

    def _footers(self, files: Sequence[TrialFile] | None = None) -> dict[Path, tuple[pa.Schema, dict[str, Any] | None]]:
        """The schema and summary of each readable file of ``files`` (default: the sweep's), each footer read
        once: a query that picked some trials reads only theirs."""
        wanted = self.files() if files is None else files
        if self._footer_cache is None:
            self._footer_cache = {}
        unread = [f for f in wanted if f.path not in self._footer_cache]
        self._footer_cache.update(_read_footers(unread))
        return {f.path: footer for f in wanted if (footer := self._footer_cache[f.path]) is not None}

    def _schema(self, files: Sequence[TrialFile] | None = None) -> pa.Schema:
        """The unified schema of the committed files (default: every file of the sweep)."""
        return unify([schema for schema, _ in self._footers(files).values()])

    def _known_schema(self) -> pa.Schema:
        """The schema of every trial this sweep is a view of: a metric that only trials left out hold is
        still a metric of it (blank for the trials kept), not an unknown one."""
        return self._whole._schema()

    def _check_metrics(self, metrics: list[str], spilled: list[pa.Table] | None) -> None:
        """An unknown metric is an error that lists the sweep's metrics (the ``spilled`` tables' count too,
        when the rows read include them)."""
        known = set(self._known_schema().names)
        known |= {name for table in spilled or [] for name in table.column_names}
        missing = [m for m in metrics if m not in known]
        awaited = self._awaited(missing)
        unknown = [m for m in missing if m not in awaited]
        if unknown and (known or spilled is None):
            raise self._unknown(unknown)

    def _committed(
        self, metrics: list[str] | None, trials: set[str] | None, several: set[str], *, numbered: bool = False
    ) -> pa.Table:
        """The committed rows asked for, keyed (``numbered``: with their row numbers, see :func:`_columns`)."""
        mine = [f for f in self.files() if trials is None or f.trial_id in trials]
        footers = self._footers(mine)
        files = [f for f in mine if f.path in footers]
        if not files:
            return pa.table({})
        schema = unify([schema for schema, _ in footers.values()], _big_ints(footers))
        dataset = pads.dataset(list(dict.fromkeys(str(f.path) for f in files)), format="parquet", schema=schema)
        steps = step_columns(self._candidates, schema, [schema for schema, _ in footers.values()])
        table = _scan_with_trials(dataset, _columns(schema, metrics, steps, numbered), files, several=several)
        return _keyed(table, steps, metrics)

    def _own_spills(self) -> list[tuple[Path, SpillManifest, str]]:
        """This sweep's series' spill directories (running trials' uncommitted rows), each with its manifest
        and its trial's key."""
        ids = {e.id: self.key(e) for e, _ in self.executions()}
        return [
            (directory, manifest, ids[manifest.execution_id])
            for directory, manifest in self._manifests()
            if manifest.metrics_name == self.metrics_name and manifest.execution_id in ids
        ]

    def _spilled_columns(self) -> set[str]:
        """The columns this sweep's series holds in its spills, read from their schemas alone."""
        return {column for directory, _, _ in self._own_spills() for column in segment_columns(directory)}

    def _spilled(self, metrics: list[str] | None) -> list[_Spilled]:
        """The uncommitted rows of this sweep's series, one table per spill directory."""
        tables = []
        for directory, manifest, trial in self._own_spills():
            batches = list(read_segments(directory))
            if not batches:
                continue
            table = _concat([pa.Table.from_batches([b]) for b in batches])
            present = [m for m in metrics if m in table.column_names] if metrics is not None else None
            steps = step_columns(self._candidates, table.schema)
            tables.append(
                _Spilled(trial, manifest.instance, table.select(_columns(table.schema, present, steps, True)), steps)
            )
        return tables

    def trials(
        self,
        metrics: Iterable[str] | None = None,
        *,
        mode: str | Mapping[str, str] | None = None,
        verify: bool = False,
        where: str | None = None,
        sort: str | None = None,
        limit: int | None = None,
        group_by: str | Sequence[str] | None = None,
        live: bool = False,
    ) -> pd.DataFrame:
        """One row per trial, in the order the trials were recorded (``sort`` orders them; ``ray-cmf trials``
        lists them best first): id, status, config, tags, note, start time, error (a FAILED trial's, as its
        last failure raised it), best/final/steps per metric, md5, url.

        ``metrics`` limits the summarised (and read) columns; ``mode`` says whether lower (``min``) or
        higher (``max``) is best, for all metrics or per metric (default: the sweep's, see :meth:`modes`;
        ``min`` for the others); ``verify=True`` re-hashes what reads take of every file (its DVC cache
        object, else the file) against its recorded md5. ``<metric>_best`` is the best finite value (a
        diverged value, NaN or ±inf, never ranks best) and ``<metric>_final`` the last value logged
        (non-finite included); over every series of a trial that holds several. ``steps`` counts the
        trial's rows. What a trial logged with ``log_execution_metrics(name, values)`` shows as
        ``metrics/<name>/<key>`` columns (of a name logged twice, each key's later value: keys only the
        earlier call had stay).

        ``where`` keeps the trials an expression holds for (``'config/lr < 0.01 and status == "COMPLETE"'``;
        see :mod:`ray_cmf.query`); one that reads only recorded columns (config, status, tags, times) is
        answered before any file is opened. ``sort`` orders by a column (a ``_best``/``_final`` one best
        first, any other ascending) and ``limit`` keeps the first rows.

        ``group_by`` (columns such as ``"config/opt"``, or ``"config except seed"``) folds the trials into
        one row per group: the mean and standard deviation of every summary (``val_loss_best_mean``,
        ``val_loss_best_std``, ...), the number of trials and their ids (see :func:`group_summaries`);
        ``sort`` may then name a group column (``val_loss_best`` means its mean).

        ``live=True`` reads the store as it is now and summarises the rows running trials have spilled too,
        as :meth:`steps` with ``live=True`` reads them.
        """
        if live:
            self.refresh()
        query = parse(where) if where is not None else None
        check_limit(limit)
        own = mode is None  # each trial by its own sweep's modes, where the sweeps viewed disagree
        mode = self.modes() if mode is None else mode
        table = self._trial_table(metrics, mode, query, own, live)
        import pandas as pd

        verified = pd.Series(
            [self._verified(trial) if verify else None for trial in table["trial_id"]], index=table.index
        )
        table = pd.concat(
            [table, verified.rename("verified")], axis=1
        )  # a frame of many tag columns, not one more block
        tail = ["steps", "md5", "url", "verified"]
        table = table[[c for c in table.columns if c not in tail] + [c for c in tail if c in table.columns]]
        if group_by is not None:  # a trial restart_errored replaced is no run of its group: its results were discarded
            table = table[table["status"] != REPLACED]
            table = group_summaries(table, group_keys(table, group_by))
            sort = f"{sort}_mean" if sort is not None and sort not in table.columns else sort
        if sort is not None:
            table = sort_trials(table, sort, mode)
        return (table.head(limit) if limit is not None else table).reset_index(drop=True)

    def _trial_table(
        self,
        metrics: Iterable[str] | None,
        mode: str | Mapping[str, str],
        query: Query | None,
        own: bool,
        live: bool = False,
    ) -> pd.DataFrame:
        """The recorded columns joined with the summaries, the rows ``query`` keeps. A query over recorded
        columns only is answered first, so that only the kept trials' footers are read."""
        import pandas as pd

        held = Counter(f.trial_id for f in self.files())
        only = {f.trial_id: f for f in self.files() if held[f.trial_id] == 1}  # of several, none is the trial's
        recorded = _recorded_columns(
            [self._recorded(e, stage, only.get(self.key(e))) for e, stage in self.executions()]
        )
        if "trial_id" not in recorded.columns:  # no trial at all: the columns every trial's row has
            base = ["trial_id", "status", "recovered", "stage", "note", "started_at", ERROR_COLUMN]
            recorded = pd.DataFrame(columns=[*base, *([DELETED_COLUMN] if self.include_deleted else [])])
        if query is not None:
            recorded = _with_tags(recorded, query)
            if set(query.names()) <= set(recorded.columns):
                recorded, query = recorded[query.mask(recorded)], None
        metrics = list(metrics) if metrics is not None else None
        queried = _queried_metrics(query, metrics)  # read for the query, not shown
        read = [*metrics, *queried] if metrics is not None else None
        trials = set(recorded["trial_id"])
        groups = self._mode_groups(trials, read) if own else [(mode, trials)]
        summary = pd.concat([self._summary(read, group_mode, trials, live) for group_mode, trials in groups])
        table = settle_ints(recorded.join(_without_recorded(summary, recorded.columns), on="trial_id"))
        table["steps"] = table["steps"].fillna(0).astype(int) if "steps" in table else 0
        if query is None:
            return table
        hidden = [f"{m}_{kind}" for m in queried for kind in ("best", "final") if f"{m}_{kind}" in table.columns]
        return table[query.mask(table, nan_is_null=summary.columns)].drop(columns=hidden)

    def _summary(
        self, metrics: list[str] | None, mode: str | Mapping[str, str], trials: set[str], live: bool = False
    ) -> pd.DataFrame:
        """best/final/steps of ``trials`` under ``mode``: from the files' footers where they can tell (not
        ``live``: spilled rows have none), else from a scan."""
        summary = None if live else self._summary_from_footers(metrics, mode, trials)
        return summary if summary is not None else self._summary_from_scan(metrics, mode, trials, live)

    def _mode_groups(self, trials: set[str], read: list[str] | None) -> list[tuple[dict[str, str], set[str]]]:
        """``trials`` by the modes their own sweeps declared (see :meth:`modes`): one group where the sweeps
        viewed agree; where they do not (two sweeps of a pipeline ranking a metric both ways), each trial is
        read by its own sweep's, so that its ``_best`` agrees with its ``top_rank``, and a warning says so
        where one of the metrics ``read`` (None: all) is such a metric."""
        sweep = self.modes()
        groups: dict[tuple[tuple[str, str], ...], set[str]] = {}
        for trial, (ranked, declared) in self._declarations().items():
            if trial in trials:
                mine = {**sweep, **declared, **ranked}
                groups.setdefault(tuple(sorted(mine.items())), set()).add(trial)
        if len(groups) <= 1:
            return [(sweep, trials)]
        each = [dict(key) for key in groups]
        both = sorted({m for one in each for m, v in one.items() if any(o.get(m, v) != v for o in each)})
        both = [m for m in both if read is None or m in read]
        if both:
            log.warning(
                "ray_cmf: the sweeps of %s rank %s both ways (min and max): each trial's best is by its own sweep's "
                "mode, and an order by it mixes them; pass mode=... (--mode) to read all one way",
                self.pipeline,
                ", ".join(map(repr, both)),
            )
        return [(dict(key), mine) for key, mine in groups.items()]

    def _recorded(self, execution: Execution, stage: str, file: TrialFile | None) -> dict[str, Any]:
        """A trial's row of the table as MLMD records it (no file read); ``file`` is its one series' file (a
        trial of several series, a Train run's ranks or several runs, has no one file: ``show`` lists them)."""
        trial_id = self.key(execution)
        texts = properties(execution, text=True)  # tags and notes are text, "NaN" too
        props = {k: float_of(v) for k, v in texts.items()}
        deleted = {DELETED_COLUMN: props.get(DELETED_PROPERTY)} if self.include_deleted else {}
        config = _config(props)
        environment = self._environment_of(execution, props)
        replaced_by, restarted_from = self._replacements()
        restarts = dict(zip(RESTART_COLUMNS, (replaced_by.get(trial_id), restarted_from.get(trial_id)), strict=True))
        return {
            "trial_id": trial_id,
            "status": REPLACED if trial_id in replaced_by else shown_status(state_name(execution), props),
            "recovered": bool(props.get(RECOVERED, False)),
            "stopped": bool(props.get(STOPPED_PROPERTY, False)),
            "stage": stage,
            **_ranking(props, replaced=trial_id in replaced_by),
            **(restarts if replaced_by else {}),
            **{f"config/{k}": v for k, v in config.items()},
            **curated_columns(texts),
            "started_at": _utc_text(execution.create_time_since_epoch),
            ERROR_COLUMN: props.get(ERROR_PROPERTY),
            **deleted,
            **{f"env/{k}": environment.get(f"env/{k}") for k in ENV_COLUMNS},
            **{k: v for k, v in environment.items() if k.startswith("seed/")},
            **{f"metrics/{k}": v for k, v in self._logged_metrics(execution).items()},
            "md5": file.md5 if file else None,
            "url": file.url if file else None,
        }

    def _replacements(self) -> tuple[dict[str, str], dict[str, str]]:
        """The trials that ``Tuner.restore(restart_errored=True)`` replaced, each with its new trial, and the
        reverse (``{replaced: new}``, ``{new: replaced}``), where both are of this view."""
        if self._restarts is None:
            by_id = {(property_of(e, OWNER_PROPERTY), property_of(e, "trial_id")): e for e, _ in self.executions()}
            replaced_by: dict[str, str] = {}
            for execution, _ in self.executions():
                replaced = property_of(execution, RESTARTED_FROM_PROPERTY)
                old = by_id.get((property_of(execution, OWNER_PROPERTY), replaced)) if replaced is not None else None
                if old is not None and old.id != execution.id:
                    replaced_by[self.key(old)] = self.key(execution)
            self._restarts = (replaced_by, {new: old for old, new in replaced_by.items()})
        return self._restarts

    def _logged_metrics(self, execution: Execution) -> dict[str, Any]:
        """What a trial logged with ``log_execution_metrics`` (``{"<metrics_name>/<key>": value}``), read for
        every trial of the sweep at once."""
        if self._execution_metrics is None:
            self._execution_metrics = self.lineage.execution_metrics({e.id for e, _ in self.executions()})
        return self._execution_metrics.get(execution.id, {})

    def _starts(self) -> dict[str, dict[int, int]]:
        """Per trial, the later starts of this series that recorded the step they resumed after (see
        :meth:`StoreWriter.record_start`): ``{trial_id: {attempt: step}}``."""
        if self._resumed is None:
            prefix = f"{STARTS_PREFIX}{self.metrics_name}:"
            self._resumed = {}
            for execution, _ in self.executions():
                for key in execution.custom_properties:  # the keys alone: a sweep may hold thousands of trials
                    if key.startswith(prefix):
                        step = property_of(execution, key)
                        self._resumed.setdefault(self.key(execution), {})[int(key[len(prefix) :])] = int(step)
        return self._resumed

    def _verified(self, trial_id: str) -> bool | None:
        """Whether every committed file of a trial matches its md5 (None: it has none)."""
        mine = [f for f in self.files() if f.trial_id == trial_id]
        return all(f.path.exists() and file_md5(f.path) == f.md5 for f in mine) if mine else None

    def _summary_from_footers(
        self, metrics: Iterable[str] | None, mode: str | Mapping[str, str], trials: set[str]
    ) -> pd.DataFrame | None:
        """best/final/steps per trial from the summaries in the files' footers: no data scan.

        None when a file lacks a current summary, holds re-reported steps (a restored trial) or several
        ranks' rows, or is one of several series of a trial: those need the scan.
        """

        mine = [f for f in self.files() if f.trial_id in trials]
        footers = self._footers(mine)
        summaries = {f.trial_id: footers[f.path][1] for f in mine if f.path in footers}
        resumed = set(self._starts())
        if self._several() or any(
            s is None
            or restarted({c: s["columns"].get(c, {}).get("max") for c in RESTART_KEYS})
            or s["columns"].get(RANK_COLUMN, {}).get("max", 0) > 0  # a Train run's ranks: rank 0's rows are read
            or t in resumed
            for t, s in summaries.items()
        ):
            return None
        chosen = self._summarised(self._schema(), metrics)  # the view's metrics, as a scan reads them
        rows = {}
        for trial_id, summary in summaries.items():
            assert summary is not None
            row: dict[str, Any] = {}
            for metric in chosen:
                stats = summary["columns"].get(metric, {})
                row[f"{metric}_best"] = stats.get("max" if mode_of(mode, metric) == "max" else "min", math.nan)
                row[f"{metric}_final"] = stats.get("last", math.nan)
            row["steps"] = summary["rows"]
            rows[trial_id] = row
        return exact_summary(rows) if rows else _no_summary(chosen)

    def _summarised(
        self, schema: pa.Schema, metrics: Iterable[str] | None, spilled: Sequence[pa.Schema] = ()
    ) -> list[str]:
        """The numeric metrics that get ``_best`` and ``_final`` columns (those asked for, else all; of the
        committed files, and of the ``spilled`` rows read too); one asked for that holds no numbers (bools,
        text) has neither, and is refused by name."""
        schema = unify([schema, *spilled])
        numeric = _numeric(schema)
        chosen = list(metrics) if metrics is not None else numeric
        unknown = [m for m in chosen if m not in schema.names]
        if unknown:  # only trials left out have them, or none yet: their columns stay, blank for the trials kept
            whole = unify([self._known_schema(), *spilled])
            awaited = self._awaited([m for m in unknown if m not in whole.names])
            if any(m not in whole.names and m not in awaited for m in unknown):
                raise self._unknown(unknown)
            numeric += _numeric(whole) + awaited
        keys = [m for m in chosen if not is_metric(m)]
        if keys:
            raise InvalidArgumentError(
                f"{keys} are steps, keys or bookkeeping, not metrics: they have no best or final; "
                f"the numeric metrics are {_offered(numeric)}"
            )
        other = [m for m in chosen if m not in numeric]
        if other:
            raise InvalidArgumentError(
                f"Metric(s) {other} hold values that are not numbers (bools or text, in some trials or all), so they "
                f"have no best or final; the numeric metrics are {_offered(numeric)}"
            )
        return chosen

    def _unknown(self, unknown: list[str]) -> RayCmfError:
        """The error for metrics the series lacks; where none of its trials committed rows yet, it says where
        their rows are."""
        known, deleted = _metric_columns(self._known_schema()), self.emptied_by_deletion()
        hint = (
            ""
            if known
            else f" ({deleted})"
            if deleted
            else " (no trial has committed rows of it yet: a running sweep's are read with live=True once its "
            "trials have handed them over, every flush_seconds (30 s by default); a crashed one's are committed by "
            "`ray-cmf recover`)"
        )
        elsewhere = self._series_with(unknown)
        if elsewhere:
            hint += (
                f"; {elsewhere} hold{'s' if len(elsewhere) == 1 else ''} them: name it (metrics_name=, --metrics-name)"
            )
        return RayCmfError(
            f"Unknown metric(s) {unknown} in series {self.metrics_name!r}; it has {_offered(known)}{hint}"
        )

    def emptied_by_deletion(self) -> str:
        """What says so where this sweep holds no trial because every one is deleted; "" otherwise."""
        if self.executions() or self.include_deleted or self._kept is not None or not self.everyone().executions():
            return ""
        return f"every trial of {self.pipeline!r} is deleted (--include-deleted, include_deleted=True, reads them)"

    def _awaited(self, missing: list[str]) -> list[str]:
        """Those of the ``missing`` metrics a logger declares (its ranked metric, its ``modes``) and no series of
        the pipeline holds yet, while a trial runs: read as not logged yet. One another series holds is that
        series' metric; one a finished sweep never logged is unknown."""
        declared = [m for m in missing if m in self.modes()]
        if not declared or not any(state_name(e) == "RUNNING" for e, _ in self.executions()):
            return []
        return [m for m in declared if not self._series_with([m])]

    def _series_with(self, metrics: list[str]) -> list[str]:
        """The pipeline's other series that hold every one of ``metrics`` (committed, or spilled by a running
        trial), by name."""
        holding = []
        for name in self.series_names():
            if name == self.metrics_name:
                continue
            other = Sweep(self.store, self.pipeline, self.stage, name, include_deleted=self.include_deleted)
            with contextlib.suppress(RayCmfError):
                if set(metrics) <= set(other._known_schema().names) | other._spilled_columns():
                    holding.append(name)
        return holding

    def _summary_from_scan(
        self, metrics: Iterable[str] | None, mode: str | Mapping[str, str], trials: set[str], live: bool = False
    ) -> pd.DataFrame:
        """best/final/steps per trial from one scan of the series (latest attempt per step), nulls kept
        apart from NaN so that ``_final`` is the last value logged."""

        asked = list(metrics) if metrics is not None else None
        spilled = self._spilled(asked) if live else []  # read once: for the metrics they hold and for the rows
        chosen = self._summarised(self._schema(), asked, [s.table.schema for s in spilled])
        parts = []
        for group in self._by_number_kinds(chosen, trials, spilled):
            table = self._step_table(chosen if asked is not None else None, group, live=live, spilled=spilled)
            if table.num_rows:
                frame = _tidy(exact_frame(table, arrow_numbers=True), chosen, overlap=live, starts=self._starts())
                parts.append(summarize(frame, chosen, mode))
        if len(parts) > 1:
            return exact_summary({trial: row for part in parts for trial, row in part.to_dict("index").items()})
        return parts[0] if parts else _no_summary(chosen)

    def _by_number_kinds(self, metrics: list[str], trials: set[str], spilled: list[_Spilled]) -> list[set[str]]:
        """``trials`` in groups whose rows hold each of ``metrics`` alike, as ints or not: one scan unifies a
        column's types, and a trial's ints read beside another trial's floats would read as floats (each
        trial's ``_best`` and ``_final`` keep its own ints, as its file's footer does)."""
        mine = [f for f in self.files() if f.trial_id in trials]
        footers = self._footers(mine)  # read once, and for the scan too
        schemas: dict[str, list[pa.Schema]] = {}
        for file in mine:
            if file.path in footers:
                schemas.setdefault(file.trial_id, []).append(footers[file.path][0])
        for rows in spilled:
            if rows.trial in trials:
                schemas.setdefault(rows.trial, []).append(rows.table.schema)
        groups: dict[tuple[bool, ...], set[str]] = {}
        for trial in trials:
            schema = unify(schemas.get(trial, []))
            kinds = tuple(m in schema.names and pa.types.is_integer(schema.field(m).type) for m in metrics)
            groups.setdefault(kinds, set()).add(trial)
        return list(groups.values())

    def modes(self) -> dict[str, str]:
        """Whether lower (``min``) or higher (``max``) is better, by metric (``{metric: mode}``), as the
        loggers declared it: the metric the sweep's CmfRayLogger ranked its trials by, so that ``_best`` and
        ``top_rank`` agree, then those named in ``CmfRayLogger(modes=...)`` or ``StepLogger(modes=...)``,
        and a StepLogger's metrics that know it themselves (``Accuracy``: ``max``). What reading defaults
        to; a metric none declares is read as ``min``."""
        if self._modes is None:
            declarations = self._declarations().values()
            ranked = _first_of(*(its_ranked for its_ranked, _ in declarations))  # the first execution's wins
            declared = _first_of(*(its_declared for _, its_declared in declarations))
            self._modes = _first_of(ranked, declared)
        return dict(self._modes)

    def _declarations(self) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
        """Per trial, in execution order: the modes it declares (see :func:`_declared_modes`), with those the
        StepLoggers of the Train runs inside it declare where it declares none, read once."""
        if self._declared is None:
            self._declared = {}
            for execution, _ in self.executions():
                ranked, declared = _declared_modes(properties(execution))
                for run in self._runs.get(execution.id, []):
                    declared = {**recorded_modes(properties(run)), **declared}
                self._declared[self.key(execution)] = (ranked, declared)
        return self._declared

    def ranked_metric(self, *, sole: bool = False) -> str:
        """The metric to rank by when none is named: the one the sweep's CmfRayLogger ranked by, else the first
        a logger declared a mode for (never StepLogger's throughput, a speed), among this series' columns;
        ``sole``: else the series' only numeric metric (what a plot of every trial draws: it ranks nothing).
        What ``ray-cmf trials``, ``compare`` and ``plot`` rank by without ``--metric``."""
        logged = [column for column in self.columns() if is_metric(column)]
        declared = [m for m in self.modes() if m != THROUGHPUT and (m in logged or not logged)]  # none yet: any
        ranked = next(iter(declared), None)
        if ranked is None and sole and len(numeric := _numeric(self._schema())) == 1:
            [ranked] = numeric
        ask = "Name a metric (metric=..., --metric on the command line)"
        if ranked is None and (deleted := self.emptied_by_deletion()):
            raise InvalidArgumentError(f"{ask}: {deleted}")
        if ranked is None:
            unlogged = [m for m in self.modes() if m != THROUGHPUT and m not in logged]
            why = (
                f"{self.pipeline!r} ranks by {unlogged[0]!r}, which no trial has logged in {self.metrics_name}"
                if unlogged
                else f"no logger of {self.pipeline!r} said which of its {self.metrics_name} metrics to rank by"
            )
            numeric = sorted(_numeric(self._schema()))
            rankable = [m for m in numeric if not counts(m) and m != THROUGHPUT] or numeric  # counts rank nothing
            raise InvalidArgumentError(f"{ask}: {why}; they are {_offered(rankable)}")
        return ranked

    def mode_for(self, metric: str, mode: str | None = None) -> str:
        """``mode`` if given, else the sweep's mode for ``metric`` (see :meth:`modes`), else ``min``."""
        return check_mode(mode) if mode is not None else self.modes().get(metric, "min")

    def best(
        self, metric: str, mode: str | None = None, n: int = 1, *, also: Iterable[str] = (), live: bool = False
    ) -> pd.DataFrame:
        """The ``n`` trials with the best ``metric`` (under ``mode``; default: each trial's own sweep's, as
        :meth:`trials` reads them, in the order of the sweep's, see :meth:`modes`), best first (of tied trials,
        the earlier first, as ``top_rank`` and :meth:`trials` order them); trials without a finite value of it
        come last, and a trial ``restart_errored`` replaced (status ``REPLACED``) is none. ``also``: other
        metrics whose summaries the rows carry (each under the sweep's mode). ``live``: running trials'
        uncommitted rows count (see :meth:`trials`)."""
        order = self.mode_for(metric, mode)
        if n < 1:
            raise InvalidArgumentError(f"n must be >= 1, got {n!r}")
        metrics = list(dict.fromkeys([metric, *also]))
        asked = None if mode is None else {**self.modes(), metric: order}  # None: each trial by its sweep's mode
        table = self.trials(metrics, mode=asked, live=live)
        table = table[table["status"] != REPLACED]  # its results were discarded: another trial took its place
        return sort_trials(table, f"{metric}_best", {metric: order}).head(n).reset_index(drop=True)  # as trials sorts

    def environment(self, trial_id: str) -> dict[str, Any]:
        """What a trial ran on: its ``env/...`` (code version, software, hardware) and ``seed/...`` values."""
        execution = self._execution(trial_id)
        return dict(sorted(self._environment_of(execution, properties(execution)).items()))

    def _environment_of(self, execution: Execution, props: Mapping[str, Any]) -> dict[str, Any]:
        """An execution's ``env/...`` and ``seed/...`` values (``props``: its properties), completed by those
        of the Train runs inside it: a trial that runs a TorchTrainer records neither its workers' hardware
        nor the seeds its loop logs; its runs do."""
        self.executions()  # the runs are found with the trials
        recorded: dict[str, Any] = {}
        for run in self._runs.get(execution.id, []):
            recorded |= recorded_environment(properties(run))
        return recorded | recorded_environment(props)

    def config(self, trial_id: str) -> dict[str, Any]:
        """The config a trial recorded, its nested keys flattened with ``.``: only its own keys, where the
        trial table gives every trial each key of the sweep (None where it has none), and each value as
        recorded, where the table holds a list (or any value other than a number, bool or text) as its JSON
        text."""
        return _own_config(self._properties(trial_id))

    def runs(self, trial_id: str) -> list[dict[str, Any]]:
        """The Train runs inside a trial (a TorchTrainer its trainable ran), oldest first: each one's name, how
        it ended (its ``status``, and ``error`` where it failed) and its own config (its ``train_loop_config``):
        a trial that caught its run's failure reads COMPLETE itself."""
        self.executions()  # the runs are found with the trials
        runs = []
        for run in self._runs.get(self._execution(trial_id).id, []):
            props = properties(run)
            runs.append(
                {
                    "run": props.get("run_name", run.name),
                    "status": shown_status(state_name(run), props),
                    "error": props.get(ERROR_PROPERTY),
                    "config": _own_config(props),
                }
            )
        return runs

    def configs(self) -> dict[str, dict[str, Any]]:
        """Every trial's own config, by trial id, as :meth:`config` gives each, read in one pass."""
        return {self.key(e): _own_config(properties(e)) for e, _ in self.executions()}

    def execution_metrics(self, trial_id: str) -> dict[str, Any]:
        """What a trial logged with ``log_execution_metrics``: ``{"<metrics_name>/<key>": value}`` (of a name
        logged twice, each key's later value: keys only the earlier call had stay), each as logged; its
        ``metrics/...`` columns in :meth:`trials`, where a list is its JSON text."""
        execution = self._execution(trial_id)
        return self.lineage.execution_metrics({execution.id}, as_json=False).get(execution.id, {})

    def _properties(self, trial_id: str) -> dict[str, Any]:
        return properties(self._execution(trial_id))

    def _execution(self, trial_id: str) -> Execution:
        for execution, _ in self.executions():
            if self.key(execution) == trial_id:
                return execution
        raise self.refusal([trial_id])

    def refusal(self, asked: Iterable[str]) -> RayCmfError:
        """The error for trials this sweep does not hold by those names: it lists the names it has, says which
        are deleted, and names the trials a bare Tune id stands for (see :func:`unknown_trials`)."""
        return unknown_trials(asked, [self.key(e) for e, _ in self.executions()], self.pipeline, self._deleted())

    def _deleted(self) -> set[str]:
        """The trials this sweep leaves out as deleted (none where it includes them)."""
        if self.include_deleted:
            return set()
        everyone = self.everyone()
        return {everyone.key(e) for e, _ in everyone.executions() if property_of(e, DELETED_PROPERTY) is not None}

    def diff(
        self, trial_a: str, trial_b: str, metrics: Iterable[str] | None = None, mode: str | None = None
    ) -> pd.DataFrame:
        """Status, error, tags, note, place in the sweep's top N, config, environment, seed and metric values
        (summaries and execution metrics) that differ between two trials (rows: field; columns: the trials);
        ``metrics`` and ``mode``: which summaries, read how (as :meth:`trials` takes them)."""
        import pandas as pd

        table = self.trials(metrics, mode=mode).set_index("trial_id")
        for trial in (trial_a, trial_b):
            if trial not in table.index:
                raise self.refusal([trial])
        pair = table.loc[[trial_a, trial_b]].T
        pair.columns = [trial_a, trial_b]
        how = ("status", *RESTART_COLUMNS, "stopped", "recovered", ERROR_COLUMN, NOTE_COLUMN, "in_top_n", "top_rank")
        ended = [f for f in pair.index if f in how or f.startswith(TAG_COLUMN)]
        fields = [f for f in pair.index if f.endswith(("_best", "_final")) or f.startswith("metrics/") or f == "steps"]
        configs = [{f"config/{k}": v for k, v in self.config(t).items()} for t in pair.columns]  # a list is no cell
        environments = [self.environment(t) for t in pair.columns]
        config, environment = _side_by_side(configs, pair.columns), _side_by_side(environments, pair.columns)
        pair = pd.concat([pair.loc[ended], config, pair.loc[fields], environment])
        # a config or an execution metric of NaN is a value, not a blank; a summary's NaN reads as none logged
        exact = pair.index.isin([*config.index, *environment.index]) | pair.index.str.startswith("metrics/")
        differs = [not _same(a, b, nan_is_none=not e) for (a, b), e in zip(pair.values, exact, strict=True)]
        return pair[differs]

    # -- curation: tags, notes, deletion ------------------------------------------------------------
    def tag(self, trial_id: str, remove: Iterable[str] = (), **tags: str | int | float | bool) -> None:
        """Set tags on a trial (``sweep.tag("t1", team="vision")``; values kept as text) and drop the tags
        ``remove``. They show as ``tag/<key>`` columns and can be queried (``where='tag/team == "vision"'``).
        A trial this sweep does not hold now (one deleted since it was read, too), a tag both set and removed,
        or a tag to remove that the trial does not have, is an error that names it (nothing is changed)."""
        remove = list(remove)
        if not tags and not remove:
            raise InvalidArgumentError("Sweep.tag: name a tag to set or one to remove")
        if both := sorted(set(tags) & set(remove)):
            raise InvalidArgumentError(
                f"tag {both[0]!r} is both set ({both[0]}={tags[both[0]]}) and removed: which is it?"
            )
        trial = self._current(trial_id)
        columns = curated_columns(properties(trial[trial_id]))
        held = sorted(column[len(TAG_COLUMN) :] for column in columns if column.startswith(TAG_COLUMN))
        missing = [key for key in remove if key not in held]
        if missing:
            raise InvalidArgumentError(f"Trial {trial_id!r} has no tag {missing[0]!r} to remove; its tags: {held}")
        self._patch(trial, tag_properties(tags), untag_properties(remove))

    def note(self, trial_id: str, text: str) -> None:
        """Set a trial's note (free text; an empty text removes it); a trial this sweep does not hold now is an
        error that says why."""
        self._patch(self._current(trial_id), *note_properties(text))

    def delete(self, trial_ids: str | Iterable[str]) -> list[str]:
        """Mark trials deleted: they leave this sweep's tables, steps, plots and the report (``include_deleted``
        shows them); nothing is removed until ``ray-cmf gc``, and :meth:`undelete` brings them back. A trial
        deleted already is an error (deleting it again would move the time ``gc --older-than`` reads)."""
        return self._patch(self._current(trial_ids, deleted=False), *deleted_properties(True))

    def undelete(self, trial_ids: str | Iterable[str]) -> list[str]:
        """Bring deleted trials back (see :meth:`delete`); a trial that is not deleted is an error."""
        return self._patch(self._current(trial_ids, deleted=True), *deleted_properties(False))

    def _current(self, trial_ids: str | Iterable[str], deleted: bool | None = None) -> dict[str, Execution]:
        """The named trials (one id, or several) as the store holds them now: a Sweep read earlier may be stale,
        and a change goes by what is. Each must be one this view holds (of its ``only`` trials, and not deleted
        unless it includes them); ``deleted``: what each must be instead (a delete: False, an undelete: True).
        Else nothing is changed, and the error names those that are not."""
        everyone = self.everyone()
        mine = {everyone.key(e): e for e, _ in everyone.executions()}
        mine = {key: e for key, e in mine.items() if self._kept is None or key in self._kept}
        hidden = self.include_deleted or deleted is not None
        gone = set() if hidden else {key for key, e in mine.items() if property_of(e, DELETED_PROPERTY) is not None}
        asked = list(dict.fromkeys([trial_ids] if isinstance(trial_ids, str) else trial_ids))
        if unknown := [t for t in asked if t not in mine or t in gone]:
            raise unknown_trials(unknown, [key for key in mine if key not in gone], self.pipeline, gone)
        if deleted is not None:
            check_deleted(
                [t for t in asked if (property_of(mine[t], DELETED_PROPERTY) is not None) != deleted], deleted
            )
        return {t: mine[t] for t in asked}

    def _patch(self, trials: Mapping[str, Execution], props: Mapping[str, Any], remove: Sequence[str]) -> list[str]:
        """Set and drop properties of these trials (see :meth:`_current`); returns their ids."""
        self.store.patch_executions([execution.id for execution in trials.values()], props, remove)
        self.refresh()  # read again: they changed
        return list(trials)

    def report(
        self,
        path: str | os.PathLike[str],
        *,
        metrics: Sequence[str] | None = None,
        series: Sequence[str] | None = None,
        mode: str | None = None,
        max_points: int = 200,
        group_by: str | Sequence[str] | None = None,
    ) -> Path:
        """Write the sweep's interactive report: one self-contained HTML file that opens offline (trial
        table, best first; learning curves of every series the trials logged, each under its name;
        parallel coordinates, hyperparameter importance, lineage). ``series`` limits the curves to those
        series; ``mode`` says whether lower or higher ``metrics`` are better (default: the sweep's, see
        :meth:`modes`); each curve keeps at most
        ``max_points`` points; ``group_by`` folds the trials into groups (as :meth:`trials` does): the
        table shows each group's mean ± std, the curves each group's mean with a band."""
        from ray_cmf.report import write

        return write(
            self, Path(path), metrics=metrics, series=series, mode=mode, max_points=max_points, group_by=group_by
        )

    # -- plots ---------------------------------------------------------------------------------------
    def plot_curves(
        self,
        metric: str,
        path: str | os.PathLike[str],
        *,
        color_by: str | None = None,
        top: int | None = None,
        mode: str | None = None,
    ) -> Path:
        """Write ``metric`` against step for every trial (or the ``top`` best), coloured by a config key, as the
        PNG, SVG or PDF that ``path``'s extension names."""
        import pandas as pd

        from ray_cmf.plots import curves

        mode = self.mode_for(metric, mode)
        trials = self.best(metric, mode, n=top) if top else self.trials([])  # a curve of bools needs no best
        steps = self.steps([metric], trials=list(trials["trial_id"]), exact=True)  # a null apart from a NaN
        column = steps[metric]
        logged = set(steps.loc[column.notna(), "trial_id"])
        if not logged:
            raise InvalidArgumentError(f"No trial of these {len(trials)} logged {metric!r}: there is no curve to plot")
        steps = steps[steps["trial_id"].isin(logged)]  # a trial without the metric has no curve: counted apart
        without = len(trials) - len(logged)
        trials = trials[trials["trial_id"].isin(logged)]
        if not (numeric(column) or numbers_as_text(column) or pd.api.types.is_bool_dtype(column)):
            raise InvalidArgumentError(
                f"{metric!r} holds values that are not numbers (text, or numbers in some trials and bools or text "
                "in others), so it has no curve"
            )
        return curves(
            steps, trials, metric, Path(path), color_by=color_by, title=f"{self.pipeline}: {metric}", without=without
        )

    def plot_params(self, metric: str, path: str | os.PathLike[str], *, mode: str | None = None) -> Path:
        """Write every numeric config value against the trials' best ``metric`` (PNG, SVG or PDF, by ``path``)."""
        from ray_cmf.plots import params

        return params(
            self.trials([metric], mode={metric: self.mode_for(metric, mode)}),
            metric,
            Path(path),
            title=f"{self.pipeline}: best {metric}",
        )


def _first_of(*modes: Mapping[str, str]) -> dict[str, str]:
    """Modes by metric, each metric's first one kept, in the order they first appear."""
    merged: dict[str, str] = {}
    for one in modes:
        for metric, mode in one.items():
            merged.setdefault(metric, mode)
    return merged


def _obvious_series(held: Sequence[str]) -> str | None:
    """The series to compare when none was named and there are no Tune results: a Train run's steps, then its
    reports, then the one series other than the resource samples; None when that is not obvious."""
    for name in (STEPS_METRICS_NAME, REPORTS_METRICS_NAME):
        if name in held:
            return name
    others = [name for name in held if name != SYSTEM_METRICS_NAME]
    return others[0] if len(others) == 1 else (held[0] if len(held) == 1 else None)


def _with_tags(table: pd.DataFrame, query: Query) -> pd.DataFrame:
    """The table with a blank column for every tag the query reads that no trial has (yet)."""
    absent = [n for n in query.names() if n.startswith(TAG_COLUMN) and n not in table.columns]
    return table.assign(**{name: None for name in absent}) if absent else table


def _utc_text(ms: int) -> str | None:
    """A time MLMD records (ms since the epoch) as UTC ISO 8601 text, which sorts and compares as time."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else None


def _ranking(props: Mapping[str, Any], *, replaced: bool = False) -> dict[str, Any]:
    """A trial's place in its sweep's top N (``in_top_n``, ``top_rank``), where CmfRayLogger ranked it; one that
    another trial ``replaced`` (``restart_errored``) is in none, whatever it was ranked before."""
    ranking = {key: props[key] for key in ("in_top_n", "top_rank") if key in props}
    if ranking and replaced:
        return {"in_top_n": False, "top_rank": None}
    if "top_rank" in ranking:
        ranking["top_rank"] = ranking["top_rank"] or None  # 0: not in the top N, so no rank
    return ranking


def _recorded_columns(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The trial table's recorded part: a column that some trials lack keeps each value as it was recorded
    (an int stays an int) and None where it is missing, instead of pandas' NaN, which is a value (and would
    be written to JSON as "NaN"); so does a column of ints and floats, which pandas makes all floats (2**53 + 1
    would read as 2**53), and one of JSON texts, which pandas makes plain texts (see :class:`JsonText`)."""
    import pandas as pd

    table = pd.DataFrame(rows)
    for column in table.columns:
        kinds = {type(row.get(column)) for row in rows}
        if type(None) in kinds or {int, float} <= kinds or JsonText in kinds:
            table[column] = pd.Series([row.get(column) for row in rows], index=table.index, dtype=object)
    return table


def _config(props: Mapping[str, Any], *, as_json: bool = True) -> dict[str, Any]:
    """An execution's recorded config, flattened (see :func:`~ray_cmf.lineage.flatten_config`)."""
    raw = props.get(CONFIG_JSON)
    if not isinstance(raw, str):
        return {}
    from ray_cmf.lineage import flatten_config

    return flatten_config(json.loads(raw), as_json=as_json)


def _run_series(run: Execution, instance: str) -> str:
    """A series of a Train run, as a trial that ran several names it: the run's name, then the series' own
    (``second/rank1``)."""
    name = str(property_of(run, "run_name") or run.name)
    return f"{name}/{instance}" if instance else name


def _own_config(props: Mapping[str, Any]) -> dict[str, Any]:
    """An execution's config as :meth:`Sweep.config` gives it: its own keys, sorted, each value as recorded."""
    return dict(sorted(_config(props, as_json=False).items()))


def _side_by_side(values: Sequence[Mapping[str, Any]], columns: pd.Index) -> pd.DataFrame:
    """Each trial's recorded values as a column (rows: every key either has; None where one lacks it)."""
    import pandas as pd

    keys = sorted(set().union(*values))
    return pd.DataFrame([[one.get(k) for one in values] for k in keys], index=keys, columns=columns, dtype=object)


def _same(a: Any, b: Any, *, nan_is_none: bool = True) -> bool:
    """Whether two recorded values are the same: None and NaN are where ``nan_is_none`` (a summary: a NaN
    logged last and a metric never logged read alike), two NaNs always; an empty text only as an empty text,
    and a bool only ever as a bool (``True == 1`` in Python)."""
    if blank(a) and blank(b):
        nan = [isinstance(v, float) and v != v for v in (a, b)]
        return isinstance(a, str) == isinstance(b, str) and (nan_is_none or nan[0] == nan[1])
    return isinstance(a, bool) == isinstance(b, bool) and bool(a == b)


def _declared_modes(props: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The modes an execution declares: of the metric its sweep ranked it by, and those named per metric."""
    metric, mode = props.get(RANKED_BY_PROPERTY), props.get(RANKED_MODE_PROPERTY)
    ranked = {metric: str(mode)} if isinstance(metric, str) and mode in ("min", "max") else {}
    return ranked, recorded_modes(props)


def _metric_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if is_metric(f.name)]


_NOT_LOGGED = frozenset({*KEY_COLUMNS, SEQUENCE_COLUMN, ATTEMPT_COLUMN})  # ray_cmf's keys and row numbers


def _logged_columns(schema: pa.Schema) -> list[str]:
    """Every column of ``schema`` but the keys, the row numbers, the attempt and private (``__``) columns."""
    return [n for n in schema.names if n not in _NOT_LOGGED and not n.startswith("__")]


def _no_summary(metrics: Sequence[str]) -> pd.DataFrame:
    """The summary of no trial: no rows, indexed by trial id like any other (so that it joins), with the
    columns of ``metrics``."""
    import pandas as pd

    columns = [f"{m}_{part}" for m in metrics for part in ("best", "final")]
    return pd.DataFrame(columns=[*columns, "steps"], index=pd.Index([], dtype=object, name=TRIAL_COLUMN), dtype=float)


def _without_recorded(summary: pd.DataFrame, recorded: Iterable[str]) -> pd.DataFrame:
    """``summary`` without the columns a recorded one of the same name takes the place of (a config key
    ``x_best`` beside a metric ``config/x``), with a warning that names each."""
    present = set(recorded)
    hidden = [c for c in summary.columns if c in present]
    for column in hidden:
        metric = column.rsplit("_", 1)[0]
        log.warning(
            "ray_cmf: the trial table's %r is the recorded column of that name, not metric %r's summary: read "
            "the metric with steps([%r])",
            column,
            metric,
            metric,
        )
    return summary.drop(columns=hidden)


def _offered(metrics: list[str]) -> str:
    """The metrics an error names, once each: Tune's bookkeeping (``time_total_s``, ...), which the trial table
    hides too, only said to be there, unless the series holds nothing else."""
    named = list(dict.fromkeys(metrics))
    own = [m for m in named if m not in TUNE_BOOKKEEPING]
    return (
        f"{own} and Tune's bookkeeping ({', '.join(m for m in named if m not in own)})"
        if own != named and own
        else str(named)
    )


def _numeric(schema: pa.Schema) -> list[str]:
    """The metric columns of ``schema`` that hold numbers."""
    return [f.name for f in schema if f.name in _metric_columns(schema) and is_number(f.type)]


def _no_steps(metrics: list[str] | None) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(columns=[TRIAL_COLUMN, "step", *(metrics or [])])


def _columns(schema: pa.Schema, metrics: list[str] | None, steps: Sequence[str], numbered: bool = False) -> list[str]:
    """The ``steps`` columns, the columns asked for (by default every column logged, bookkeeping such as a
    row's ``pid`` or ``wall_time`` included: only what ray_cmf keys rows by is not), and the rank, attempt and
    worker group columns (what a restart's rows supersede others by), to read; ``numbered``: the row numbers
    too, which tell a live read's rows apart (a spill holds rows its series' committed version holds too)."""
    names = schema.names
    chosen = [m for m in metrics if m in names] if metrics is not None else _logged_columns(schema)
    keys = [c for c in (RANK_COLUMN, *RESTART_KEYS) if c in names]
    if numbered and SEQUENCE_COLUMN in names:
        keys.append(SEQUENCE_COLUMN)
    return list(dict.fromkeys([*[s for s in steps if s in names], *chosen, *keys]))


def _keyed(table: pa.Table, steps: Sequence[str], asked: Collection[str] | None) -> pa.Table:
    """A scanned table with its step column named ``step`` (Tune results, Train steps and plain series alike):
    each row's first of the ``steps`` columns that holds a value. A Tune trainable's own ``step`` is the step
    the user counts in, and a row without one keeps its iteration; a trial that logged no ``step`` beside
    trials that did is read at its row numbers, as it is alone. A step column ``asked`` for (None: every
    column logged) is also kept as it was logged (a ``training_iteration`` beside the ``step``). The row
    numbers stay, for :func:`_tidy` to tell rows apart by."""
    present = [c for c in steps if c in table.column_names]
    step = row_steps(table, present)
    index = table.column_names.index(present[0])
    kept = (lambda c: c != present[0] and c not in _NOT_LOGGED) if asked is None else asked.__contains__
    table = table.drop_columns([c for c in present if c == "step" or not (kept(c) or c == SEQUENCE_COLUMN)])
    return table.add_column(min(index, table.num_columns), "step", step)


def _tidy(
    frame: pd.DataFrame,
    metrics: list[str] | None,
    *,
    overlap: bool = False,
    starts: Mapping[str, Mapping[int, int]] | None = None,
) -> pd.DataFrame:
    """(trial_id, [series], [rank], step, metrics…) with re-run steps resolved to their latest attempt
    (``overlap``: also where a committed version and its spill hold the same row; ``starts``: the steps
    later attempts resumed after, see :func:`dedup_attempts`)."""
    keys = [c for c in (TRIAL_COLUMN, SERIES_COLUMN, RANK_COLUMN) if c in frame.columns]
    present = set(frame[TRIAL_COLUMN]) if starts and TRIAL_COLUMN in keys else set()
    starts = {t: s for t, s in (starts or {}).items() if t in present}
    highest = {c: frame[c].max() for c in RESTART_KEYS if c in frame.columns}
    if ATTEMPT_COLUMN in frame.columns and len(frame) and (restarted(highest) or starts):
        frame = dedup_attempts(frame, "step", by=keys, resumed=starts)
    if overlap:  # the same row, by its number in its series: a step logged twice keeps both rows
        frame = frame.drop_duplicates([*keys, SEQUENCE_COLUMN if SEQUENCE_COLUMN in frame else "step"], keep="last")
    unasked = [c for c in (ATTEMPT_COLUMN, SEQUENCE_COLUMN) if c in frame.columns and c not in (metrics or [])]
    if metrics is not None and WORKER_GROUP_COLUMN in frame.columns and WORKER_GROUP_COLUMN not in metrics:
        unasked.append(WORKER_GROUP_COLUMN)  # read to resolve restarts; logged, so kept where all columns are
    frame = frame.drop(columns=unasked)
    if SERIES_COLUMN in frame.columns:
        frame = _series_in_step_order(frame)
    rest = [c for c in frame.columns if c not in keys and c != "step"]
    return frame[[*keys, "step", *rest]].reset_index(drop=True)


def _series_in_step_order(frame: pd.DataFrame) -> pd.DataFrame:
    """A trial's several series ordered by the furthest step each reached, then by the step each starts at
    (ties: as committed), its trials as they were: the rows a trial logged furthest on come last, which is
    what its ``_final`` is, whichever series was committed last (a crashed run's spill that ``recover``
    committed after the run that resumed it; two ``Cmf`` objects of one execution, both from step 0)."""
    import pandas as pd

    if not pd.api.types.is_numeric_dtype(frame["step"]):
        return frame
    steps = frame.groupby([TRIAL_COLUMN, SERIES_COLUMN], dropna=False, observed=True, sort=False)["step"]
    trials = frame.groupby(TRIAL_COLUMN, dropna=False, observed=True, sort=False).ngroup()
    order = pd.DataFrame(
        {"trial": trials, "end": steps.transform("max").astype("float64"), "start": steps.transform("min")},
        index=frame.index,
    )
    return frame.loc[order.sort_values(["trial", "end", "start"], kind="stable").index]


def _scan_with_trials(
    dataset: pads.Dataset, columns: list[str], files: Sequence[TrialFile], *, several: Collection[str]
) -> pa.Table:
    """One projected scan of every distinct file, with dictionary-encoded trial_id and, where some trials hold
    ``several`` series, series columns (null for a trial that holds one).

    Trials whose series have the same content share one file (one artifact, linked to each): its rows
    are read once and given to each of them.
    """
    paths = list(dict.fromkeys(str(f.path) for f in files))
    index_of = {path: i for i, path in enumerate(paths)}
    batches, codes = [], []
    for tagged in dataset.scanner(columns=columns).scan_batches():
        batches.append(_as_logged(tagged.record_batch, tagged.fragment.physical_schema))
        codes.append(np.full(tagged.record_batch.num_rows, index_of[tagged.fragment.path], dtype=np.int32))
    table = pa.Table.from_batches(batches, schema=pa.schema([dataset.schema.field(c) for c in columns]))
    path_codes = np.concatenate(codes) if codes else np.empty(0, np.int32)
    if len(paths) == len(files):  # one file per series: label each row by its file
        file_of_path = np.empty(len(paths), dtype=np.int32)
        for code, file in enumerate(files):
            file_of_path[index_of[str(file.path)]] = code
        file_codes = file_of_path[path_codes]
    else:  # a shared file's rows are given to each series that has it
        rows = [np.flatnonzero(path_codes == index_of[str(file.path)]) for file in files]
        table = table.take(pa.array(np.concatenate(rows)))
        file_codes = np.concatenate([np.full(len(mine), code, dtype=np.int32) for code, mine in enumerate(rows)])
    table = table.append_column(TRIAL_COLUMN, _labels(file_codes, [f.trial_id for f in files]))
    if not several:
        return table
    return table.append_column(
        SERIES_COLUMN, _labels(file_codes, [f.instance if f.trial_id in several else None for f in files])
    )


def _as_logged(batch: pa.RecordBatch, logged: pa.Schema) -> pa.RecordBatch:
    """A scanned batch whose columns of floats the sweep reads as text (another trial logged text there)
    written as floats are (see :func:`float_texts`)."""
    floats = [
        i
        for i, field in enumerate(batch.schema)
        if pa.types.is_string(field.type)
        and field.name in logged.names
        and pa.types.is_floating(logged.field(field.name).type)
    ]
    for i in floats:
        batch = batch.set_column(i, batch.schema.field(i), float_texts(batch.column(i)))
    return batch


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one sweep as one, whatever types their columns have (see :func:`unify`)."""
    if len(tables) == 1:
        return tables[0]
    big = {
        f.name
        for t in tables
        for f in t.schema
        if pa.types.is_integer(f.type) and int_magnitude(t.column(f.name)) > EXACT_FLOAT_INT
    }
    schema = unify([t.schema for t in tables], big)
    return pa.concat_tables([conform(t, schema) for t in tables])


def _constant(label: str | None, rows: int) -> pa.DictionaryArray:
    """One label for every row (None: null), dictionary-encoded like the scanned tables' (so that they
    concatenate)."""
    return _labels(np.zeros(rows, dtype=np.int32), [label])


def _labels(file_codes: np.ndarray, label_of_file: Sequence[str | None]) -> pa.DictionaryArray:
    """Each row's label (its file's; None: null), dictionary-encoded over the distinct labels."""
    names = list(dict.fromkeys(label for label in label_of_file if label is not None))
    code_of_name: dict[str | None, int] = {name: i for i, name in enumerate(names)}
    label_codes = np.asarray([code_of_name.get(label, -1) for label in label_of_file], dtype=np.int32)[file_codes]
    indices = pa.array(label_codes, mask=label_codes < 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names, pa.string()))


def _big_ints(footers: Mapping[Path, tuple[pa.Schema, dict[str, Any] | None]]) -> set[str]:
    """The int columns of these files that hold a value beyond 2**53 somewhere (see :func:`unify`): known from
    their summaries, or from the Parquet statistics of a file without one (no statistics: counted as beyond)."""
    import pyarrow.parquet as pq

    big: set[str] = set()
    for path, (schema, summary) in footers.items():
        ints = [f.name for f in schema if pa.types.is_integer(f.type) and f.name not in big]
        if not ints:
            continue
        if summary is not None:
            extents = {name: summary["columns"].get(name, {}) for name in ints}
            big |= {n for n, s in extents.items() if max(abs(s.get("min", 0)), abs(s.get("max", 0))) > EXACT_FLOAT_INT}
            continue
        meta = pq.read_metadata(path)
        for group in (meta.row_group(i) for i in range(meta.num_row_groups)):
            for j in range(group.num_columns):
                column = group.column(j)
                stats = column.statistics
                if column.path_in_schema in ints and (
                    stats is None or not stats.has_min_max or max(abs(stats.min), abs(stats.max)) > EXACT_FLOAT_INT
                ):
                    big.add(column.path_in_schema)
    return big


def _read_footers(files: Sequence[TrialFile]) -> dict[Path, tuple[pa.Schema, dict[str, Any] | None] | None]:
    """Each file's schema and ray_cmf summary; a missing or unreadable file is None, with a warning that
    names every trial whose series it holds (trials that logged the same rows share one file)."""
    import pyarrow.parquet as pq

    holders: dict[Path, list[TrialFile]] = {}
    for file in files:
        holders.setdefault(file.path, []).append(file)
    footers: dict[Path, tuple[pa.Schema, dict[str, Any] | None] | None] = {}
    for path, held in holders.items():
        trials = ", ".join(dict.fromkeys(file.trial_id for file in held))
        try:
            meta = pq.read_metadata(path)
        except FileNotFoundError:
            log.warning("ray_cmf: skipping trial %s: %s", trials, _absent(path, held[0]))
            footers[path] = None
            continue
        except (OSError, pa.ArrowInvalid) as exc:
            log.warning("ray_cmf: skipping trial %s: cannot read %s (%s)", trials, path, exc)
            footers[path] = None
            continue
        raw = (meta.metadata or {}).get(SUMMARY_KEY.encode())
        footers[path] = (meta.schema.to_arrow_schema(), SeriesSummary.parse(raw))
    return footers


def _absent(path: Path, file: TrialFile) -> str:
    """Why a committed file cannot be read, and what brings it: the store it was committed into, where that
    is another directory of this machine (``Cmf(filepath=...)`` keeps MLMD apart from its files); else a push
    from the machine that committed it."""
    written = Path(file.uri)
    if file.uri.endswith(file.url) and written != path and written.is_file():
        root = file.uri[: -len(file.url)].rstrip("/\\") or "/"
        return (
            f"its file {path} is not in this store: it was committed into the store {root}: read that store (or "
            "run `ray-cmf push` there and `ray-cmf pull` here)"
        )
    return (
        f"its file {path} is neither in this store nor on a remote it knows (a file another machine committed "
        "reaches it once that machine runs `ray-cmf push`; `ray-cmf pull` then fetches it)"
    )
