"""The ``ray-cmf`` command line: list, compare, show, plot, export, verify, push, recover, and curate (tag,
note, delete, undelete, gc).

Every command takes ``--store`` (default: $RAY_CMF_STORE or ./cmf_store) and ``--json`` for scripting.
``--json`` output is strict JSON: a non-finite number is the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``, and a missing value is ``null``. Wrong arguments and an empty store exit with code 2;
``verify`` exits with 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_cmf._atomic import atomic_write, file_in_the_way
from ray_cmf._cells import MOST, cell_texts, number_text, quoted, shown_text
from ray_cmf._json import JsonText, dumps, jsonable
from ray_cmf._names import unstorable, what_exists
from ray_cmf._progress import status
from ray_cmf.constants import DELETED_PROPERTY, GLOG_LEVEL_ENV, MLMD_FILE, STORE_CONFIG, THROUGHPUT
from ray_cmf.curation import DELETED_COLUMN, NOTE_COLUMN, TAG_COLUMN, check_deleted
from ray_cmf.errors import MetricsNotFoundError, RayCmfError, RecoveryError, exception_of
from ray_cmf.exits import shown_status
from ray_cmf.frames import (
    ERROR_COLUMN,
    RESTART_COLUMNS,
    SERIES_COLUMN,
    config_columns,
    sort_trials,
    summary_columns,
    trial_order,
)
from ray_cmf.lineage import (
    Execution,
    Lineage,
    properties,
    property_of,
    shown_executions,
    state_name,
    trial_id_of,
    tune_id_of_key,
)
from ray_cmf.results import TUNE_BOOKKEEPING, summary_kinds
from ray_cmf.store import Store

if TYPE_CHECKING:
    from ray_cmf.recovery import RecoveredSeries

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # as a shell reports a command Ctrl-C ended (128 + SIGINT)


def _print_json(payload: Any) -> None:
    sys.stdout.write(dumps(_as_values(payload), indent=2) + "\n")


def _as_values(value: Any) -> Any:
    """What ``--json`` writes: a cell that holds a list as its JSON text (a :class:`JsonText`) as the list
    again, so that it reads apart from a text of the same characters."""
    if isinstance(value, JsonText):
        return json.loads(value)
    if isinstance(value, dict):
        return {k: _as_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_values(v) for v in value]
    return value


def _emit(
    args: argparse.Namespace, rows: list[dict[str, Any]], title: str, *, digits: int = 6, empty: str = "none"
) -> None:
    """Print rows as strict JSON (``--json``) or as a rich table, its floats to ``digits`` significant digits
    or as many more as tell them apart (see :func:`_cells`); ``empty``: what the title says of no rows."""
    if args.json:
        _print_json(rows)
        return
    from rich.table import Table
    from rich.text import Text

    console = _console()
    if not rows:
        console.print(f"{title}: {empty}", soft_wrap=True, markup=False)
        return
    table = Table(title=Text(title), title_justify="left")  # Text: a value's "[red]" is no style to rich
    columns = list(dict.fromkeys(k for row in rows for k in row))
    for column in columns:
        table.add_column(Text(str(column)), overflow="ignore", no_wrap=True)
    for cells in _cells(rows, columns, digits):
        table.add_row(*map(Text, cells))
    console.print(table)


def _console() -> Any:
    """A rich console that prints a table at its own width, never a value cut to fit a terminal (the terminal
    wraps a long line), and that ends as ``main`` does when its reader goes (piped into ``head``): quietly."""
    from rich.console import Console

    class Printer(Console):
        def on_broken_pipe(self) -> None:  # rich's own exits 1
            raise BrokenPipeError

    return Printer(width=100_000)


def _cells(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], digits: int = 6) -> list[list[str]]:
    """The texts of a table's cells: a float to ``digits`` significant digits, or as many more as tell it apart
    from the other numbers of its column and row, and a text that could read as another value quoted (see
    :mod:`ray_cmf._cells`)."""
    raw = [[row.get(c) for c in columns] for row in rows]
    values = [[jsonable(v) for v in line] for line in raw]  # NaN, inf as text; numpy's as Python's
    return cell_texts(values, digits, _cell, quoted, logged=raw)


def _cell(value: Any, digits: int) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return number_text(value, digits) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _frame_rows(frame: Any) -> list[dict[str, Any]]:
    return frame.to_dict(orient="records")


def _sweep(args: argparse.Namespace, *trials: str) -> Any:
    """The sweep a command reads: ``--pipeline``, else the store's only pipeline, else the one that holds the
    ``trials`` named (trial ids are unique); otherwise an error that lists the pipelines."""
    from ray_cmf.compare import Sweep

    store = Store(args.store)
    pipeline = args.pipeline or _pick_pipeline(store.reader(), trials)
    return Sweep(
        store,
        pipeline=pipeline,
        stage=args.stage,
        metrics_name=args.metrics_name,
        include_deleted=getattr(args, "include_deleted", False),
    )


def _curated_sweep(args: argparse.Namespace, *trials: str) -> Any:
    """The sweep whose trials ``tag``, ``note``, ``delete`` and ``undelete`` change: what they change is each
    execution's, in MLMD alone, so where no series is obvious any series the pipeline holds will do (unless
    ``--where`` may read its metrics)."""
    try:
        return _sweep(args, *trials)
    except MetricsNotFoundError as exc:
        if args.metrics_name is not None or not exc.held or getattr(args, "where", None):
            raise
        return _sweep(argparse.Namespace(**{**vars(args), "metrics_name": exc.held[0]}), *trials)


def _existing(args: argparse.Namespace) -> Store:
    """The store a command changes, which must exist: a mistyped ``--store`` would make a new, empty one (and
    ``recover`` would find nothing to recover)."""
    store = Store(args.store)
    store.reader()  # names the path where there is no database
    return store


def _store_dir(args: argparse.Namespace) -> Store:
    """The store whose files ``push`` and ``pull`` move: a directory that holds its database or the config that
    names it (whose server need not answer now: DVC moves the files), which a mistyped ``--store`` is not."""
    store = Store(args.store)
    if store.root.is_dir() and any((store.root / name).is_file() for name in (STORE_CONFIG, MLMD_FILE)):
        return store
    return _existing(args)  # which names what is wrong


def _picked(args: argparse.Namespace) -> Any:
    """The sweep a command reads, restricted to the trials ``--where`` holds for (all without it)."""
    sweep = _sweep(args)
    if deleted := sweep.emptied_by_deletion():
        raise RayCmfError(f"Nothing to read: {deleted}")
    if not args.where:
        return sweep
    picked = sweep.trials(args.metric or None, mode=args.mode, where=args.where)["trial_id"]
    if not len(picked):
        raise RayCmfError(f"--where {args.where!r} keeps no trial of {sweep.pipeline} ({sweep.metrics_name})")
    return sweep.only(picked)


def _pick_pipeline(lineage: Lineage, trials: Sequence[str]) -> str | None:
    pipelines = lineage.pipelines()
    if len(pipelines) <= 1:
        return None  # the only one (or none, which Sweep reports)
    if trials:  # by Tune id: a key that one pipeline gives as <stage>/<id> may be a bare id in another
        shown = {p.name: shown_executions(lineage, lineage.stages(p)) for p in pipelines}
        named = [name for name, executions in shown.items() if all(_names_one_of(t, executions) for t in trials)]
        if len(named) == 1:  # by stage and execution id too: second/<id> where only one pipeline has that stage
            return named[0]
        ids = {tune_id_of_key(t) for t in trials}
        held = {name: {trial_id_of(e) for e, _ in executions} for name, executions in shown.items()}
        holding = [name for name, mine in held.items() if ids <= mine]
        if len(holding) == 1:
            return holding[0]
        where = {t: [name for name, mine in held.items() if tune_id_of_key(t) in mine] for t in trials}
        if not holding and all(where.values()):
            apart = "; ".join(f"{t} in {', '.join(names)}" for t, names in where.items())
            raise RayCmfError(f"The trials are in different pipelines ({apart}): name trials of one pipeline")
        if not holding:
            unknown = [t for t, names in where.items() if not names]
            known = sorted({i for mine in held.values() for i in mine}, key=trial_order)
            raise RayCmfError(
                f"No pipeline of the store holds trial(s) {unknown}; {what_exists(unknown, known)}; its pipelines:\n"
                f"{_listing(lineage)}"
            )
        raise RayCmfError(f"Pipelines {holding} all hold trial(s) {sorted(ids)}; pass --pipeline NAME")
    raise RayCmfError(f"The store holds {len(pipelines)} pipelines; pass --pipeline NAME:\n{_listing(lineage)}")


def _names_one_of(name: str, executions: Sequence[tuple[Any, str]]) -> bool:
    """Whether a trial's name (``<id>``, ``<stage>/<id>`` or ``<stage>/<id>#<execution id>``) can name one of
    ``executions`` (with their stages), whatever the names that pipeline's tables give them."""
    stage, _, rest = name.rpartition("/")
    trial_id, _, number = rest.partition("#")
    return any(
        trial_id_of(e) == trial_id and stage in ("", where) and number in ("", str(e.id)) for e, where in executions
    )


def _pipelines(lineage: Lineage) -> list[dict[str, Any]]:
    """Every pipeline: its stages, how many trials (executions, deleted ones left out) it holds and when the
    last one started."""
    rows = []
    for pipeline in lineage.pipelines():
        shown = shown_executions(lineage, lineage.stages(pipeline))  # a Train run inside a trial is that trial
        executions = [e for e, _ in shown if property_of(e, DELETED_PROPERTY) is None]
        last = max((e.create_time_since_epoch for e in executions), default=0)  # edits (a tag) are no run
        rows.append(
            {
                "pipeline": pipeline.name,
                "stages": [properties(s).get("stage", s.name) for s in lineage.stages(pipeline)],
                "trials": len(executions),
                "last_run": datetime.fromtimestamp(last / 1000, timezone.utc).isoformat(timespec="seconds")
                if last
                else None,
            }
        )
    return rows


def _listing(lineage: Lineage) -> str:
    return "\n".join(
        f"  {row['pipeline']}: {_count(row['trials'], 'trial')}, last run {row['last_run']}"
        for row in _pipelines(lineage)
    )


def _summary_columns(table: Any, metrics: list[str] | None, every: bool = False, stable: bool = False) -> list[str]:
    """The trial table's columns to show: Tune's bookkeeping (``time_total_s``, ...), the environment and the
    seeds only when asked for (``every``), and a counter (``epoch``, ``step``, ``loss_nonfinite``) by its final
    value only. How trials ended and what users noted show where some trial has them, or always where the
    output is read by a program (``stable``: ``--json``, whose rows keep their keys whatever the filter)."""
    summaries = summary_columns(table.columns)
    apart = set(summaries)
    recorded = [c for c in table.columns if c not in apart]  # a metric named config/lr is no config
    ranked = [c for c in ("top_rank", "in_top_n") if c in table.columns]
    recovered = [c for c in ("recovered", "stopped") if c in table.columns and (stable or table[c].any())]
    curated = [c for c in recorded if c.startswith(TAG_COLUMN)]
    shown = (*RESTART_COLUMNS, NOTE_COLUMN, ERROR_COLUMN, DELETED_COLUMN)
    curated += [c for c in shown if c in table.columns and (stable or table[c].notna().any())]
    keep = ["trial_id", "status", *recovered, *ranked, *config_columns(table.columns)]
    keep += curated
    keep += [c for c in recorded if c.startswith("metrics/")]  # log_execution_metrics: few, and results
    keep += [c for c in recorded if c.startswith(("env/", "seed/")) or c in RECORD_COLUMNS] if every else []
    for column in summaries:
        metric, kind = column.rsplit("_", 1)
        if metrics:
            if metric in metrics:
                keep.append(column)
        elif kind in summary_kinds(metric) and (every or metric not in TUNE_BOOKKEEPING):
            keep.append(column)
    return [*keep, "steps"]


RECORD_COLUMNS = ("stage", "started_at", "md5", "url")  # where and when a trial ran, and its file
ALL_COLUMNS_HELP = "also Tune's bookkeeping (time_total_s, ...), env/..., seed/..., stage, started_at, md5 and url"
HEADLINE_CHARS = 80  # of an error's exception, what a table cell shows


def _headline(error: Any) -> str | None:
    """An error as a table cell: the first line of its exception (its type and message), shortened."""
    if not isinstance(error, str):
        return None
    line = exception_of(error).split("\n", 1)[0]
    return line if len(line) <= HEADLINE_CHARS else line[: HEADLINE_CHARS - 1] + "…"


# -- commands ---------------------------------------------------------------------------------------
def cmd_pipelines(args: argparse.Namespace) -> int:
    rows = _pipelines(Store(args.store).reader())
    if not rows:
        raise RayCmfError(f"The store {Store(args.store).root} holds no pipelines yet")
    _emit(args, rows, "pipelines")
    return EXIT_OK


def cmd_trials(args: argparse.Namespace) -> int:
    sweep = _sweep(args)
    deleted = sweep.emptied_by_deletion()
    if deleted and (args.where or args.group_by):  # no column to name
        raise RayCmfError(f"Nothing to read: {deleted}")
    sort = args.sort or (f"{args.metric[0]}_best" if args.metric else None)
    if args.group_by:
        return _grouped_trials(args, sweep)
    table = sweep.trials(
        args.metric or None, mode=args.mode, verify=args.verify, where=args.where, sort=sort or "trial_id"
    )
    order = f"sorted by {sort}" if sort else "by trial_id"
    if sort is None:
        table, ranked = _ranked_first(sweep, table, args.mode)
        order = f"best first by {ranked}" if ranked else order
    if args.status:
        unknown = sorted(set(args.status) - STATUSES - set(table["status"]))
        if unknown:
            raise RayCmfError(
                f"--status {', '.join(unknown)}: no such status; trials have {sorted(set(table['status']))} "
                f"(any of {sorted(STATUSES)})"
            )
        table = table[table["status"].isin(args.status)]
    if args.limit:
        table = table.head(args.limit)
    columns = _summary_columns(table, args.metric, args.all_columns, args.json) + (["verified"] if args.verify else [])
    _emit(
        args,
        _trial_rows(args, table, columns),
        f"trials of {sweep.pipeline} ({sweep.metrics_name}), {order}",
        empty=f"none ({deleted})" if deleted else "none",
    )
    return EXIT_OK


def _trial_rows(args: argparse.Namespace, table: Any, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of a trial table to print: as text, an error cell holds the exception's line (``show`` and
    ``--json`` the whole text)."""
    rows = _frame_rows(table[columns])
    if ERROR_COLUMN in columns and not args.json:  # on the records: a text column of pandas holds None as NaN
        for row in rows:
            row[ERROR_COLUMN] = _headline(row[ERROR_COLUMN])
    return rows


def _python(value: Any) -> Any:
    """A table cell as the Python value it holds (NumPy scalars unboxed), for ``repr``: nan, not 'NaN'."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _ranked_first(sweep: Any, table: Any, mode: str | None, suffix: str = "") -> tuple[Any, str | None]:
    """The trial table (or, with ``suffix="_mean"``, the group table) best first by the metric the sweep's
    CmfRayLogger ranked by, else the first that a logger declared a mode for, where trials have it (never by
    StepLogger's throughput, a speed), and the column it is sorted by (None: none of them). ``mode``: the one
    ``--mode`` read the table's summaries by (None: each metric's own)."""
    modes = sweep.modes()
    ranked = [f"{m}_best{suffix}" for m in modes if f"{m}_best{suffix}" in table.columns and m != THROUGHPUT]
    return (sort_trials(table, ranked[0], mode or modes), ranked[0]) if ranked else (table, None)


def _grouped_trials(args: argparse.Namespace, sweep: Any) -> int:
    """``trials --group-by``: a row per group, each summary as its mean and standard deviation; best first as
    the trial table is, where no ``--sort`` or ``--metric`` says otherwise."""
    sort = args.sort or (f"{args.metric[0]}_best" if args.metric else None)
    table = sweep.trials(args.metric or None, mode=args.mode, where=args.where, sort=sort, group_by=args.group_by)
    order = f"sorted by {sort}" if sort else "in the order of their first trials"
    if sort is None:
        table, ranked = _ranked_first(sweep, table, args.mode, "_mean")
        order = f"best first by {ranked}" if ranked else order
    if args.limit:
        table = table.head(args.limit)
    kept = set(_summary_columns(_as_trials(table), args.metric, every=args.all_columns))
    columns = [c for c in table.columns if not c.endswith(("_mean", "_std")) or c.rsplit("_", 1)[0] in kept]
    _emit(args, _frame_rows(table[columns]), f"groups of {sweep.pipeline} ({sweep.metrics_name}), {order}")
    return EXIT_OK


def _as_trials(groups: Any) -> Any:
    """A group table's summary columns under their trial-table names (``loss_best_mean`` as ``loss_best``)."""
    return groups.rename(columns=lambda c: c.rsplit("_", 1)[0] if c.endswith("_mean") else c)


def _metrics_or_ranked(args: argparse.Namespace, sweep: Any) -> list[str]:
    """``--metric``'s metrics, else the one the sweep ranks by (see ``Sweep.ranked_metric``)."""
    return args.metric or [sweep.ranked_metric()]


def cmd_compare(args: argparse.Namespace) -> int:
    sweep = _picked(args)
    args.metric = _metrics_or_ranked(args, sweep)
    mode = sweep.mode_for(args.metric[0], args.mode)
    best = sweep.best(args.metric[0], args.mode, n=args.top, also=args.metric[1:])  # None: each trial's own mode
    if args.mode is None and args.metric[0] not in sweep.modes():  # a metric it knows (best() checked)
        print(
            f"ray-cmf compare: no logger recorded which way {args.metric[0]!r} is best: ranked lowest first "
            "(--mode max ranks highest first)",
            file=sys.stderr,
        )
    columns = _summary_columns(best, args.metric, stable=args.json)
    _emit(args, _trial_rows(args, best, columns), f"top {args.top} by {args.metric[0]} ({mode})")
    return EXIT_OK


def _shown_sweep(args: argparse.Namespace) -> Any:
    """``show``'s sweep: a trial is shown whatever its series are called. Without ``--metrics-name``, where
    the pipeline's series is not obvious or the trial has no rows of it (a trial that logged only its own
    series), its last rows are of the first series the trial holds rows of (by name), and stderr says so."""
    try:
        sweep = _sweep(args, args.trial)
    except MetricsNotFoundError as exc:
        if args.metrics_name is not None or not exc.held:
            raise
        return _with_rows_of_trial(args, exc.held, None)
    if args.metrics_name is not None or _rows_of_trial(sweep, args.trial):
        return sweep
    others = [name for name in sweep.series_names() if name != sweep.metrics_name]
    return _with_rows_of_trial(args, others, sweep)


def _rows_of_trial(sweep: Any, trial: str) -> int:
    """How many rows ``trial`` has in ``sweep``'s series (0 for a trial the sweep does not hold)."""
    if trial not in {sweep.key(e) for e, _ in sweep.executions()}:
        return 0
    return len(sweep.steps(trials=[trial], live=True))


def _with_rows_of_trial(args: argparse.Namespace, names: list[str], default: Any) -> Any:
    """The sweep of the first series of ``names`` that ``args.trial`` has rows of, else ``default`` (None:
    the first name's); stderr names it, and the trial's other series, where it is not the pipeline's default."""

    def of(name: str) -> Any:
        return _sweep(argparse.Namespace(**{**vars(args), "metrics_name": name}), args.trial)

    held = [sweep for sweep in map(of, names) if _rows_of_trial(sweep, args.trial)]
    if not held:
        return default or of(names[0])
    others = ", ".join(repr(sweep.metrics_name) for sweep in held[1:])
    also = f"; it also has rows of {others} (--metrics-name)" if others else ""
    print(f"ray-cmf show: the last rows are of series {held[0].metrics_name!r}{also}", file=sys.stderr)
    return held[0]


def _last_rows(steps: Any, rows: int) -> Any:
    """The last ``rows`` rows of each of a trial's series (a Train run's ranks, or its several runs)."""
    if SERIES_COLUMN not in steps.columns:
        return steps.tail(rows)
    return steps.groupby(SERIES_COLUMN, sort=False, dropna=False).tail(rows)


def cmd_show(args: argparse.Namespace) -> int:
    sweep = _shown_sweep(args)
    table = sweep.trials(metrics=[])  # the trial's status, tags and note: no summary
    match = table[table["trial_id"] == args.trial] if unstorable(args.trial) is None else table.iloc[:0]
    if match.empty:
        if not args.include_deleted and args.trial in set(sweep.everyone().trials(metrics=[])["trial_id"]):
            raise RayCmfError(f"No trial {args.trial!r} in {sweep.pipeline}; it is deleted: pass --include-deleted")
        raise sweep.refusal([args.trial])
    row = match.iloc[0]
    [(execution, stage)] = [(e, s) for e, s in sweep.executions() if sweep.key(e) == args.trial]
    files = sweep.lineage.files_of([execution.id]).get(execution.id, [])
    last = _last_rows(sweep.steps(args.metric, trials=[args.trial]), args.rows)
    payload = {
        "trial_id": args.trial,
        "status": row["status"],
        **{link: row.get(link) for link in RESTART_COLUMNS},  # None where the trial table holds no such link
        "recovered": bool(row["recovered"]),
        "stage": stage,
        "execution_id": execution.id,
        "config": sweep.config(args.trial),
        "tags": {c[len(TAG_COLUMN) :]: v for c, v in _tags(row).items()},
        "note": row.get(NOTE_COLUMN),
        "error": row.get(ERROR_COLUMN),
        "deleted_at": row.get(DELETED_COLUMN),
        "environment": sweep.environment(args.trial),
        "execution_metrics": sweep.execution_metrics(args.trial),
        "runs": sweep.runs(args.trial),
        "files": files,
        "last_rows": _frame_rows(last),
    }
    if args.json:
        _print_json(payload)
        return EXIT_OK
    from rich.markup import escape

    console = _console()
    status = f"{payload['status']}{' (recovered)' if payload['recovered'] else ''}"
    status += f"  DELETED at {payload['deleted_at']}" if payload["deleted_at"] else ""
    console.print(
        f"[bold]{escape(args.trial)}[/bold]  status={status}  stage={escape(stage)}  execution={execution.id}"
    )
    for link in RESTART_COLUMNS:
        if payload[link]:
            console.print(f"{link.replace('_', ' ')} {payload[link]}", markup=False, highlight=False)
    console.print(f"config: {_config_line(payload['config'])}", markup=False, highlight=False, soft_wrap=True)
    if payload["tags"]:
        tags = "  ".join(f"{k}={shown_text(str(v))}" for k, v in payload["tags"].items())
        console.print(f"tags: {tags}", markup=False, highlight=False, soft_wrap=True)
    if payload["note"]:
        console.print(f"note: {shown_text(str(payload['note']))}", markup=False, highlight=False, soft_wrap=True)
    if payload["error"]:
        console.print(f"error: {payload['error']}", markup=False, highlight=False, soft_wrap=True)
    for run in payload["runs"]:  # a trial that caught its run's failure is COMPLETE itself
        ended = f"{run['status']}  {_headline(run['error'])}" if run["error"] else run["status"]
        line = f"train run {run['run']}: {ended}  config: {_config_line(run['config'])}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    environment = [{"field": k, "value": v} for k, v in payload["environment"].items()]
    _emit(args, environment, "environment and seeds", digits=MOST)  # one trial's whole record: exact
    if payload["execution_metrics"]:
        rows = [{"metric": k, "value": v} for k, v in payload["execution_metrics"].items()]
        _emit(args, rows, "execution metrics", digits=MOST)
    no_file = [{k: None if v == "" else v for k, v in f.items()} for f in files]  # an execution metric's
    _emit(args, no_file, "lineage: files", digits=MOST)
    several = any(SERIES_COLUMN in row for row in payload["last_rows"])
    _emit(args, payload["last_rows"], f"last {args.rows} rows" + (" of each series" * several), digits=MOST)
    return EXIT_OK


def _config_line(config: Mapping[str, Any]) -> str:
    """A config on one line, each value as Python writes it (``lr=0.1  opt='NaN'``)."""
    return "  ".join(f"{k}={_python(v)!r}" for k, v in config.items())


def cmd_diff(args: argparse.Namespace) -> int:
    sweep = _sweep(args, args.trial_a, args.trial_b)
    diff = sweep.diff(args.trial_a, args.trial_b, metrics=args.metric, mode=args.mode)
    if not args.all_columns:  # Tune's own timing differs between any two trials: shown when asked for
        diff = diff[[not _bookkeeping(str(field)) for field in diff.index]]
    if not args.json and ERROR_COLUMN in diff.index:  # its exception's line, as `trials` shows it
        diff.loc[ERROR_COLUMN] = [_headline(v) for v in diff.loc[ERROR_COLUMN]]
    pairs = zip(diff.index, diff.values, strict=True)
    shown = (lambda value: value) if args.json else _literal
    rows = [{"field": field, args.trial_a: shown(a), args.trial_b: shown(b)} for field, (a, b) in pairs]
    _emit(args, rows, f"what differs between {args.trial_a} and {args.trial_b}", digits=MOST)
    return EXIT_OK


def _literal(value: Any) -> Any:
    """A value that differs, written as what it is: text quoted, a list as a list, None as null (so that
    ``"0.3"`` and ``0.3``, or ``[64]`` and ``64``, do not print alike); numbers and bools as they are."""
    if value is None or isinstance(value, str | list | tuple | dict):
        return JsonText(dumps(value, ensure_ascii=False))
    return value


def _bookkeeping(field: str) -> bool:
    """Whether a trial-table field is one of Tune's bookkeeping numbers (``time_total_s_best``, ...)."""
    return any(field in (name, f"{name}_best", f"{name}_final") for name in TUNE_BOOKKEEPING)


def _output(path: str) -> Path:
    """Where a command writes its file: its directory is made, and a directory itself is refused."""
    link = Path(path).is_symlink()
    target = Path(path).resolve() if link else Path(path)  # written through a link, not over it
    if link and not target.parent.is_dir():  # the directories a link points into are not ours to make
        raise RayCmfError(f"cannot write {path}: it links to {target}, in a directory that does not exist")
    if target.is_dir():
        raise RayCmfError(f"-o {path!r} is a directory; name the file to write")
    if target.exists() and not target.is_file():  # a device (/dev/full), a pipe: a file is written whole, renamed
        raise RayCmfError(f"cannot write {path}: not a regular file (a command writes a file whole, then renames it)")
    if in_the_way := file_in_the_way(target.parent):
        raise RayCmfError(f"cannot write {path}: {in_the_way} is a file, not a directory")
    try:  # before the work: a file can be made there
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as exc:
        raise RayCmfError(f"cannot write {path}: {exc.strerror or exc}") from None
    return target


def _path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("needs a file name, got ''")
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cmd_plot(args: argparse.Namespace) -> int:
    if args.metric and len(args.metric) > 1:
        raise RayCmfError(f"plot draws one --metric; got {args.metric}: run it once per metric")
    sweep = _picked(args)
    [metric] = args.metric or [sweep.ranked_metric(sole=args.top is None)]  # without --top: ranks nothing
    path = sweep.plot_curves(metric, _output(args.output), color_by=args.color_by, top=args.top, mode=args.mode)
    _emit(args, [{"plot": str(Path(path).absolute())}], "plot written")
    return EXIT_OK


EXPORT_FORMATS = ("csv", "parquet")


STDOUT = "-"  # export -o -: the steps to the standard output


def _export_format(args: argparse.Namespace) -> str:
    """``--format``, or the output's extension; CSV on the standard output (text, for a pipe)."""
    fmt = args.format or ("csv" if args.output == STDOUT else Path(args.output).suffix.lstrip(".").lower())
    if fmt not in EXPORT_FORMATS:
        raise RayCmfError(f"--format is needed: the output {args.output!r} ends in neither .csv nor .parquet")
    return str(fmt)


def cmd_export(args: argparse.Namespace) -> int:
    fmt = _export_format(args)
    sweep = _picked(args)
    with status(f"reading the steps of {sweep.pipeline}"):
        frame = sweep.steps(args.metric or None, exact=True)  # a null (nothing logged) stays apart from a NaN
    write = frame.to_csv if fmt == "csv" else frame.to_parquet
    if args.output == STDOUT:  # the steps alone: a pipe reads them
        write(sys.stdout if fmt == "csv" else sys.stdout.buffer, index=False)
        print(f"exported {len(frame)} rows, {len(frame.columns)} columns", file=sys.stderr)
        return EXIT_OK
    with atomic_write(_output(args.output)) as pending:
        write(pending.tmp, index=False)
    _emit(
        args,
        [{"rows": len(frame), "columns": len(frame.columns), "path": str(Path(args.output).absolute())}],
        "exported",
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from ray_cmf.audit import audit

    store = Store(args.store)
    findings = list(audit(store, remote=args.remote))
    if not findings and not store.reader().pipelines():
        raise RayCmfError(f"The store {store.root} records nothing yet: no pipelines, no files to verify")
    rows = [{"status": f.status, "md5": f.md5, "url": f.url, "rows_lost": f.rows_lost} for f in findings]
    _emit(args, rows, "verify")
    bad = [f for f in findings if not f.ok]
    if bad and not args.json:
        print(f"{len(bad)} of {len(findings)} files failed verification", file=sys.stderr)
    missing = sum(f.status == "missing" for f in findings)
    if missing and not args.remote and store.remote is not None:  # another machine's store, say
        print(
            f"{missing} files are not in the store: `ray-cmf pull` brings them from its remote {store.remote.url}, "
            "and `ray-cmf verify --remote` checks that the remote holds them",
            file=sys.stderr,
        )
    holed = [f for f in findings if f.rows_lost]
    if holed:  # the files are intact, but their loggers said rows never reached the store
        lost = sum(f.rows_lost for f in holed)
        print(f"{len(holed)} files record {lost} rows that their loggers could not hand over", file=sys.stderr)
    return EXIT_FAILED if bad else EXIT_OK


def cmd_push(args: argparse.Namespace) -> int:
    if args.endpoint_url is not None and args.add_remote is None:
        raise RayCmfError("--endpoint-url names the server of the remote --add-remote sets; give both")
    store = _store_dir(args)
    if args.add_remote is not None:
        store.set_remote(args.add_remote, args.endpoint_url, check=True)  # a failed push changes nothing
    with status(f"pushing {store.root} to {store.remote.url if store.remote else 'the DVC remote'}"):
        report = store.push()
    _emit(args, [{"remote": store.remote.url if store.remote else "(dvc default)", "dvc": report.strip()}], "dvc push")
    return EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    from ray_cmf.audit import pull

    store = _store_dir(args)  # a mistyped --store was told it has no remote
    restored = pull(store)
    remote = store.require_remote()
    _emit(args, [{"restored": store.url(p)} for p in restored], f"pulled {len(restored)} files from {remote.url}")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    from ray_cmf.recovery import commit_spills, mark_crashed

    store = _existing(args)
    spills = commit_spills(store, force=args.force)  # then mark the crashed ones: recover()'s two halves
    crashed = mark_crashed(store)
    _emit(args, _recovered_rows(store, spills.committed, crashed), "recovered", empty="nothing to recover")
    if spills.skipped:
        alive = "".join(f"\n  {directory} (pid {pid})" for directory, pid in spills.skipped.items())
        print(
            f"ray-cmf: skipped {_count(len(spills.skipped), 'spill')} whose writer still runs "
            f"(--force commits them):{alive}",
            file=sys.stderr,
        )
    if spills.held:
        held = "".join(f"\n  {directory} (pid {pid})" for directory, pid in spills.held.items())
        print(
            f"ray-cmf: skipped {_count(len(spills.held), 'spill')} that a writer still writes and holds (it commits "
            f"them itself; --force does not take them):{held}",
            file=sys.stderr,
        )
    if spills.failed:
        print(f"ray-cmf: {RecoveryError(spills.failed, spills.committed)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _recovered_rows(store: Store, series: list[RecoveredSeries], crashed: list[Execution]) -> list[dict[str, Any]]:
    """A row per series recover committed, and per run it marked crashed with none: the run (its execution's
    name) and the state it is left in, then the series' name, rows and file (a file that runs whose rows are
    alike share)."""
    ids = list(dict.fromkeys([s.execution_id for s in series] + [e.id for e in crashed]))
    runs = {e.id: e for e in store.lineage.store.get_executions_by_id(ids)}

    def run(execution_id: int) -> dict[str, Any]:
        execution = runs[execution_id]
        return {"execution": execution.name, "status": shown_status(state_name(execution), properties(execution))}

    rows = [
        {**run(s.execution_id), "metrics_name": s.metrics_name, "rows": s.rows, "url": properties(s.artifact)["url"]}
        for s in series
    ]
    with_series = {s.execution_id for s in series}
    return rows + [run(e.id) for e in crashed if e.id not in with_series]


def cmd_report(args: argparse.Namespace) -> int:
    sweep = _picked(args)
    path = sweep.report(
        _output(args.output),
        metrics=args.metric,
        series=args.series,
        mode=args.mode,
        max_points=args.max_points,
        group_by=args.group_by,
    )
    size = path.stat().st_size / 2**20
    _emit(args, [{"report": str(path), "trials": len(sweep.executions()), "MB": round(size, 2)}], "report written")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from ray_cmf.report import ReportServer

    _picked(args)  # a bad store, pipeline, stage or --where fails here, before the server starts
    try:
        server = ReportServer(
            lambda: _picked(args),
            host=args.host,
            port=args.port,
            refresh_seconds=args.refresh,
            metrics=args.metric,
            series=args.series,
            mode=args.mode,
            max_points=args.max_points,
            group_by=args.group_by,
        )
    except (OSError, OverflowError) as exc:  # in use, not this machine's address, beyond 65535
        raise RayCmfError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    print(f"ray-cmf: serving the report of {args.store or 'the store'} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


def cmd_tag(args: argparse.Namespace) -> int:
    sweep = _curated_sweep(args, args.trial)
    tags: dict[str, str] = {}
    for key, value in map(_key_value, args.tags):
        if key in tags and tags[key] != value:
            raise RayCmfError(f"tag {key!r} is given twice, as {tags[key]!r} and {value!r}: which is it?")
        tags[key] = value
    if not tags and not args.remove:
        raise RayCmfError("name a tag to set (key=value) or one to --remove")
    sweep.tag(args.trial, remove=args.remove or (), **tags)
    row = _curated_row(sweep, args.trial)
    _emit(args, [row], f"tags of {args.trial}")
    return EXIT_OK


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise RayCmfError(f"{text!r} is not key=value")
    return key, value


def _curated_row(sweep: Any, trial: str) -> dict[str, Any]:
    """A trial's tags and note as ``trials`` shows them (deleted or not)."""
    table = sweep.everyone().trials(metrics=[])
    row = table[table["trial_id"] == trial].iloc[0]
    return {"trial_id": trial, **_tags(row), NOTE_COLUMN: row[NOTE_COLUMN]}


def _tags(row: Any) -> dict[str, Any]:
    """The tags a trial-table row holds, by column (``tag/team``); those it lacks are left out."""
    return {c: v for c, v in row.items() if str(c).startswith(TAG_COLUMN) and v is not None}


def cmd_note(args: argparse.Namespace) -> int:
    sweep = _curated_sweep(args, args.trial)
    sweep.note(args.trial, args.text)
    _emit(args, [_curated_row(sweep, args.trial)], f"note of {args.trial}")
    return EXIT_OK


def _chosen_trials(args: argparse.Namespace, sweep: Any) -> dict[str, str]:
    """The trials a delete or undelete names, by id, by ``--where`` or ``--all`` (one of the three), with their status:
    for ``delete`` those not deleted, for ``undelete`` the deleted ones; naming another is an error."""
    if [bool(args.trials), args.where is not None, args.all].count(True) != 1:
        raise RayCmfError("name the trials (ids), pick them with --where, or take --all of them: one of the three")
    everyone = sweep.everyone().trials(args.metric or None, mode=args.mode, where=args.where)
    deleted = everyone[DELETED_COLUMN].notna()
    wanted = everyone[~deleted] if args.command == "delete" else everyone[deleted]
    status = dict(zip(wanted["trial_id"], wanted["status"], strict=True))
    if not args.trials:
        return status
    unknown = [t for t in args.trials if t not in set(everyone["trial_id"])]
    if unknown:
        raise sweep.everyone().refusal(unknown)
    check_deleted([t for t in args.trials if t not in status], deleted=args.command == "undelete")
    return {t: status[t] for t in args.trials}


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _confirmed(args: argparse.Namespace, question: str) -> bool:
    """Whether to go on: ``--yes``, not a terminal, or the user says so."""
    if args.yes or not sys.stdin.isatty():
        return True
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:  # Ctrl-D: no
        print(file=sys.stderr)
        return False


def cmd_delete(args: argparse.Namespace) -> int:
    sweep = _curated_sweep(args, *args.trials)
    chosen = _chosen_trials(args, sweep)
    if chosen and not args.dry_run:
        if not _confirmed(args, f"{args.command.capitalize()} {_count(len(chosen), 'trial')} of {sweep.pipeline}?"):
            print(f"ray-cmf {args.command}: nothing changed", file=sys.stderr)
            return EXIT_FAILED
        (sweep.delete if args.command == "delete" else sweep.undelete)(list(chosen))
    rows = [{"trial_id": trial, "status": status} for trial, status in chosen.items()]
    _emit(args, rows, f"{'would ' if args.dry_run else ''}{args.command}")
    return EXIT_OK


def _duration(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d`` or ``2w`` as a timedelta."""
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    if text == "0":
        return timedelta(0)
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30m, 12h, 7d or 2w")
    return timedelta(**{units[unit]: float(number)})


def cmd_gc(args: argparse.Namespace) -> int:
    from ray_cmf.cleanup import collect

    store = _existing(args)
    freed = collect(store, older_than=args.older_than, remote=args.remote, dry_run=args.dry_run, force=args.force)
    row = {
        "trials": len(freed.trials),
        "files": len(freed.files),
        "MB": round(freed.bytes / 2**20, 3),
        "cache_objects": freed.cache_objects,
        "remote_objects": freed.remote_objects,
        "spills": freed.spills,
        "kept_shared": freed.kept_shared,
    }
    if freed.refused is not None:
        print(f"ray-cmf: a gc now would be refused: {freed.refused}", file=sys.stderr)
    if args.json:
        trials = [t._asdict() for t in freed.trials]
        listed = {"bytes": freed.bytes, "freed_trials": trials, "urls": freed.files, "refused": freed.refused}
        _print_json({**row, **listed})
        return EXIT_OK
    _emit(args, [row], "gc: would free (dry run)" if args.dry_run else "gc: freed")
    return EXIT_OK


# -- parser -----------------------------------------------------------------------------------------
STATUSES = frozenset({"RUNNING", "COMPLETE", "FAILED", "CANCELED", "CRASHED", "REPLACED"})  # a trial's statuses
SERIES_HELP = "plot this series' metrics (repeatable; default: every series the trials logged)"


GROUP_HELP = (
    'fold the trials into groups by this column (repeatable; or "config except seed"): each summary as the '
    "group's mean and standard deviation"
)
WHERE_HELP = (
    "only the trials this expression holds for, e.g. 'config/lr < 0.01 and tag/team == \"vision\"' "
    "(comparisons, in, and, or, not, parentheses; over the columns of `trials`)"
)


RANKED_DEFAULT = "the one the sweep's CmfRayLogger ranked by, else the first a logger declared a mode for"


def _add_sweep_options(
    parser: argparse.ArgumentParser,
    *,
    where: bool = True,
    metric_help: str | None = "metric column (repeatable; default: all)",
    mode: bool = True,
) -> None:
    """The options that pick a sweep and its trials; ``metric_help`` None: no ``--metric``; ``mode``: whether
    ``--mode`` means something to the command."""
    parser.add_argument("--pipeline", help="pipeline name (needed when the store holds several)")
    parser.add_argument("--include-deleted", action="store_true", help="also the trials marked deleted")
    if where:
        parser.add_argument("--where", help=WHERE_HELP)
    parser.add_argument("--stage", help="restrict to one stage (a Tune experiment)")
    parser.add_argument(
        "--metrics-name",
        help="which series (default: tune_results, the Tune results; where there are none, a Train run's "
        "train_steps, else its train_reports, else the one series a pipeline holds beside its resource samples)",
    )
    if metric_help is not None:
        parser.add_argument("--metric", action="append", help=metric_help)
    if mode:
        parser.add_argument(
            "--mode",
            choices=("min", "max"),
            help="lower or higher is better (default: what the sweep's CmfRayLogger ranked by, else min)",
        )


def _add_global_options(parser: argparse.ArgumentParser, *, in_command: bool) -> None:
    """``--store``, ``--json`` and ``-v``, which go before the command (``ray-cmf --store S trials``) or after
    it: a command's own copies default to nothing, so that they keep what was said before the command."""
    store_help = "store directory (default: $RAY_CMF_STORE or ./cmf_store)"
    parser.add_argument("--store", help=store_help, default=argparse.SUPPRESS if in_command else None)
    unset: Any = argparse.SUPPRESS if in_command else False
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON", default=unset)
    verbose_help = "also show ray_cmf's and ML-Metadata's own log lines"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help, default=unset)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, in_command=True)
    parser = argparse.ArgumentParser(
        prog="ray-cmf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_global_options(parser, in_command=False)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, parents=[common])
        p.set_defaults(handler=handler)
        return p

    command("pipelines", cmd_pipelines, "list the pipelines and their stages")
    p = command("trials", cmd_trials, "one row per trial: config, best/final per metric, steps")
    _add_sweep_options(p)
    p.add_argument(
        "--verify",
        action="store_true",
        help="re-hash what each trial's rows are read from (its DVC cache object, else its file) against the md5 "
        "MLMD records; `ray-cmf verify` checks the store's files and DVC's records too",
    )
    p.add_argument("--sort", help="sort by this column (default: the first --metric's best, best first)")
    p.add_argument("--limit", type=_positive, help="show the first N trials only")
    p.add_argument("--group-by", action="append", metavar="COLUMN", help=GROUP_HELP)
    p.add_argument("--status", action="append", help="only trials with this status (repeatable): COMPLETE, FAILED, ...")
    p.add_argument("--all-columns", action="store_true", help=ALL_COLUMNS_HELP)
    p = command("compare", cmd_compare, "the top trials by one metric")
    _add_sweep_options(p, metric_help=f"metric column (repeatable): ranked by the first (default: {RANKED_DEFAULT})")
    p.add_argument("--top", type=_positive, default=5, help="how many of the best trials (default: 5)")
    p = command("show", cmd_show, "one trial: config, tags, note, environment, seeds, lineage, files, last rows")
    _add_sweep_options(p, where=False, metric_help="a metric of the last rows (repeatable; default: all)", mode=False)
    p.add_argument("trial")
    p.add_argument("--rows", type=_positive, default=5, help="how many last rows to show (of each series)")
    p = command("diff", cmd_diff, "config, environment, seeds and results that differ between two trials")
    _add_sweep_options(p, where=False, metric_help="a metric whose summaries to compare (repeatable; default: all)")
    p.add_argument("trial_a")
    p.add_argument("trial_b")
    p.add_argument("--all-columns", action="store_true", help="also Tune's bookkeeping (time_total_s, ...)")
    p = command("report", cmd_report, "the sweep's interactive report: one self-contained HTML file")
    _add_sweep_options(p)
    p.add_argument("-o", "--output", required=True, type=_path, help="HTML path")
    p.add_argument("--max-points", type=int, default=200, help="points kept per curve (default: 200)")
    p.add_argument("--series", action="append", help=SERIES_HELP)
    p.add_argument("--group-by", action="append", metavar="COLUMN", help=GROUP_HELP)
    p = command("serve", cmd_serve, "serve the report on localhost; it follows a running sweep")
    _add_sweep_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument("--refresh", type=_positive, default=10, help="seconds between rebuilds and page updates")
    p.add_argument("--series", action="append", help=SERIES_HELP)
    p.add_argument("--max-points", type=int, default=200, help="points kept per curve (default: 200)")
    p.add_argument("--group-by", action="append", metavar="COLUMN", help=GROUP_HELP)
    p = command("plot", cmd_plot, "learning curves as a PNG, SVG or PDF")
    _add_sweep_options(p, metric_help=f"the metric to plot (one; default: {RANKED_DEFAULT}; else the only one)")
    p.add_argument("-o", "--output", required=True, type=_path, help="a .png, .svg or .pdf file")
    p.add_argument("--color-by", help="config key that colours the curves")
    p.add_argument("--top", type=_positive, help="only the best N trials")
    p = command("export", cmd_export, "every trial's steps as one CSV or Parquet file")
    _add_sweep_options(p)
    p.add_argument("--format", choices=EXPORT_FORMATS, help="default: from the output's extension (.csv, .parquet)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=_path,
        help="a .csv or .parquet file, or - for the standard output (CSV unless --format)",
    )
    p = command("verify", cmd_verify, "re-hash every file against MLMD and DVC; exit 1 on any mismatch")
    p.add_argument("--remote", action="store_true", help="also check that the store's remote holds every file")
    p = command("push", cmd_push, "dvc push the store's files to its remote")
    p.add_argument("--add-remote", metavar="URL", help="first make this URL the remote (s3://bucket/prefix, a dir)")
    p.add_argument("--endpoint-url", help="with --add-remote: an S3-compatible server's endpoint")
    command("pull", cmd_pull, "fetch the store's missing files from its remote by md5")
    p = command("recover", cmd_recover, "commit the spilled rows of runs that crashed before committing")
    p.add_argument("--force", action="store_true", help="also recover spills of processes still alive")
    p = command("tag", cmd_tag, "set or remove a trial's tags (key=value ...)")
    _add_sweep_options(p, where=False, metric_help=None, mode=False)
    p.add_argument("trial")
    p.add_argument("tags", nargs="*", metavar="key=value")
    p.add_argument("--remove", action="append", metavar="KEY", help="remove this tag (repeatable)")
    p = command("note", cmd_note, 'set a trial\'s note ("" removes it)')
    _add_sweep_options(p, where=False, metric_help=None, mode=False)
    p.add_argument("trial")
    p.add_argument("text")
    for name, help_text in (
        ("delete", "mark trials deleted (reversible with undelete; gc frees their files)"),
        ("undelete", "clear the deletion mark of trials"),
    ):
        p = command(name, cmd_delete, help_text)
        _add_sweep_options(p)
        p.add_argument("trials", nargs="*", metavar="TRIAL")
        p.add_argument("--all", action="store_true", help="every trial of the pipeline (of --stage: of that sweep)")
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")
        p.add_argument("--dry-run", action="store_true", help="list the trials it would mark, mark none")
    p = command("gc", cmd_gc, "free the files, cache objects and spills that only deleted trials hold")
    p.add_argument(
        "--older-than",
        type=_duration,
        metavar="AGE",
        help="only trials deleted at least AGE ago: 30m, 12h, 7d, 2w (default: every deleted trial, now)",
    )
    p.add_argument("--remote", action="store_true", help="also remove their objects from the store's DVC remote")
    p.add_argument("--dry-run", action="store_true", help="say what it would free, free nothing")
    p.add_argument("--force", action="store_true", help="run even while executions of the store are running")
    return parser


def _verbose(argv: list[str]) -> None:
    """Show every log line: ray_cmf's at INFO, and ML-Metadata's, whose level is read once, when its library
    loads (``import ray_cmf`` quiets it): so run the command again in a process that loads it verbose."""
    if os.environ.get(GLOG_LEVEL_ENV) != "0":
        env = {**os.environ, GLOG_LEVEL_ENV: "0"}
        os.execve(sys.executable, [sys.executable, "-m", "ray_cmf.cli", *argv], env)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


_LISTS = {"tag": "tags", "delete": "trials", "undelete": "trials"}  # a command's list positional


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's arguments. Words after an option join the command's list (``tag a --store S
    team=x``), which argparse would refuse: it ends a list positional at the first option."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    listed = _LISTS.get(args.command)
    if not extra:
        return args
    if getattr(args, "where", None) is not None:  # the shell split an unquoted expression: the rest is not a list
        parser.error(
            f"unrecognized arguments: {' '.join(extra)} (a --where expression is one argument: quote it whole, "
            f"--where '{' '.join([args.where, *extra])}')"
        )
    if listed is None or any(word.startswith("-") for word in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    getattr(args, listed).extend(extra)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ray-cmf``; returns the exit code."""
    args = parse(argv)
    if args.verbose:
        _verbose(sys.argv[1:] if argv is None else list(argv))
    # warnings as lines of their own (each says "ray_cmf: ..."), before ML-Metadata's first log line sets up
    # Python's default "WARNING:<logger>:" format
    logging.basicConfig(format="%(message)s")
    try:
        return args.handler(args)
    except RayCmfError as exc:  # what the user named does not exist or cannot be used; anything else is a bug
        print(f"ray-cmf {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # piped into `head`, which has read enough: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (an output is written whole or not at all)
        print(f"ray-cmf {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
