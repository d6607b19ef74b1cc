"""Re-logged steps: a restored, retried or restarted run as its latest attempt left it.

A restore resumes at a checkpoint and a retry at the start, so an attempt supersedes what earlier attempts
logged from its first step on. Every read resolves a series this one way: ``Sweep`` (its frames, tables,
report and CLI) through :func:`dedup_attempts`, a Cmf's ``read_metrics`` through :func:`latest_attempt`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ray_cmf.constants import ATTEMPT_COLUMN, WORKER_GROUP_COLUMN
from ray_cmf.frames import RANK_COLUMN, STEP_COLUMN, TRIAL_COLUMN, row_steps, step_candidates, step_columns

if TYPE_CHECKING:
    import pandas as pd

_ROW = "_row"  # a row's place in the table, kept through the resolution
RESTART_KEYS = (ATTEMPT_COLUMN, WORKER_GROUP_COLUMN)  # what a row's place among its run's restarts is read from


def latest_attempt(table: pa.Table, metrics_name: str) -> pa.Table:
    """One stored version of a series as its latest attempt left it, in logged order and without the
    ``attempt`` column: the rows that a later attempt superseded are dropped, as ``Sweep.steps`` drops
    them (rows are stepped as it steps them, see :func:`ray_cmf.frames.row_steps`). A series that only the
    first attempt logged keeps every row, a step logged twice included."""
    names = table.column_names
    if ATTEMPT_COLUMN not in names:
        return table
    highest = {c: pc.max(table.column(c)).as_py() for c in RESTART_KEYS if c in names}
    if not restarted(highest):  # as Sweep: no later attempt or worker group logged a row
        return table.drop_columns([ATTEMPT_COLUMN])
    import pandas as pd

    steps = step_columns(step_candidates(metrics_name), table.schema)
    by = [RANK_COLUMN] if RANK_COLUMN in names else []  # a Train report's ranks each hold the step
    frame = pd.DataFrame(
        {
            _ROW: np.arange(table.num_rows),
            "step": row_steps(table, steps).to_pandas(),
            **{c: table.column(c).to_pandas() for c in (*by, *RESTART_KEYS) if c in names},
        }
    )
    stepped = frame["step"].notna()  # a row without a step supersedes nothing and is never superseded
    kept = pd.concat([dedup_attempts(frame[stepped], "step", by=by)[_ROW], frame.loc[~stepped, _ROW]])
    return table.take(pa.array(np.sort(kept.to_numpy()))).drop_columns([ATTEMPT_COLUMN])


def restarted(highest: Mapping[str, float | None]) -> bool:
    """Whether a later attempt, or a later start of a run's workers within one, logged a row (``highest``: the
    highest ``attempt`` and ``worker_group`` the rows hold, where they hold those columns): only then can a
    row supersede another."""
    return any(value is not None and value > 1 for value in highest.values())


def dedup_attempts(
    frame: pd.DataFrame,
    step: str = STEP_COLUMN,
    by: Sequence[str] = (),
    resumed: Mapping[str, Mapping[int, int]] | None = None,
) -> pd.DataFrame:
    """The rows of the run as its last attempt left it, as logged (see :func:`_as_logged`): each attempt of a
    restored or retried trial supersedes what earlier attempts logged from its first step on (a restore
    resumes at its checkpoint, a retry at the start: what came after that point is no longer the run's),
    and a step one attempt logged twice keeps both rows, as in a run never restarted (of steps that are not
    numbers, only the latest row of each).
    ``resumed`` (``{trial_id: {attempt: step}}``, with ``by`` holding the trial column) says where attempts
    resumed, logged rows or not: each then supersedes every step after that one (steps count in whole
    numbers)."""
    import pandas as pd

    if step not in frame.columns or ATTEMPT_COLUMN not in frame.columns:
        return frame
    frame = frame.reset_index(drop=True)
    frame = frame.assign(**{_RESTART: _restarts(frame), _AT: np.arange(len(frame))})
    kept = frame
    numbers = pd.api.types.is_numeric_dtype(frame[step])
    if numbers:
        attempts = [*by, _RESTART]
        starts = frame.groupby(attempts, dropna=False, observed=True)[step].min().reset_index(name="_start")
        recorded = [(t, a * _GROUPS, s + 1) for t, of in (resumed or {}).items() for a, s in of.items()]
        if recorded:
            known = pd.DataFrame(recorded, columns=[TRIAL_COLUMN, _RESTART, "_start"])
            groups = frame[list(by)].drop_duplicates()  # each group of the trial (its series, its ranks)
            known = groups.merge(known, on=TRIAL_COLUMN)[[*attempts, "_start"]]
            both = pd.concat([starts, known], ignore_index=True)
            starts = both.groupby(attempts, dropna=False, observed=True)["_start"].min().reset_index()
        latest_first = starts[::-1].groupby(list(by) or (lambda _: 0), dropna=False, observed=True)["_start"]
        starts["_until"] = latest_first.transform(lambda later: later.cummin().shift(1))  # a later one's first step
        cut = frame.merge(starts[[*attempts, "_until"]], on=attempts, how="left")
        kept = cut[~(cut[step] >= cut["_until"]).fillna(False).astype(bool)].drop(columns="_until")
    else:  # steps that are not numbers: a later attempt's row of a step replaces the earlier ones'
        kept = kept.sort_values([_RESTART, _AT], kind="stable").drop_duplicates(subset=[*by, step], keep="last")
    return _as_logged(kept, [c for c in by if c != RANK_COLUMN]).drop(columns=[_RESTART, _AT])


def _as_logged(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Each ``by`` group's rows (in the order the groups come) by restart, then as logged: an earlier attempt's
    rows that stayed come before a later one's, wherever the store put them (a report's ranks stay side by
    side, as logged)."""
    import pandas as pd

    group = frame.groupby(list(by), dropna=False, observed=True, sort=False).ngroup() if by else 0
    order = pd.DataFrame({"group": group, "restart": frame[_RESTART], "at": frame[_AT]}, index=frame.index)
    return frame.loc[order.sort_values(["group", "restart", "at"], kind="stable").index].reset_index(drop=True)


_RESTART, _GROUPS = "_restart", 1 << 20  # a row's place among the restarts; worker groups per attempt at most
_AT = "_at"  # a row's place in the frame


def _restarts(frame: pd.DataFrame) -> pd.Series:
    """Each row's place among the run's restarts: its attempt, then the start of the Train workers that logged
    it (``worker_group``: Ray restarts a run's failed workers from its last checkpoint, as a restore does)."""
    import pandas as pd

    attempt = pd.to_numeric(frame[ATTEMPT_COLUMN], errors="coerce").fillna(1).astype("int64")
    if WORKER_GROUP_COLUMN not in frame.columns:
        return attempt * _GROUPS
    group = pd.to_numeric(frame[WORKER_GROUP_COLUMN], errors="coerce").fillna(1).astype("int64")
    return attempt * _GROUPS + group - 1
