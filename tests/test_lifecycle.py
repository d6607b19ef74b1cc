"""After the sweep: tags and notes, ``--where`` queries, soft deletion and gc, on stores built through the real
writer and edited from other processes through the command line."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_cmf import Cmf, InvalidArgumentError, MetricBuffer, RayCmfError, Store, StoreError, Sweep
from ray_cmf.audit import audit
from ray_cmf.cleanup import collect
from ray_cmf.cli import main
from ray_cmf.curation import DELETED_COLUMN
from ray_cmf.query import QueryError, parse
from tests._stores import Trial, write_trials


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def _other_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``ray-cmf ARGV`` in a process of its own (as a user at another terminal runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "ray_cmf.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )


def _rows(scale: float, steps: int = 5) -> list[dict[str, Any]]:
    return [{"training_iteration": i + 1, "loss": scale / (i + 1)} for i in range(steps)]


def _sweep(store_dir: Path) -> Store:
    """Four trials of mixed configs: a FAILED one, a string among numbers, one without ``opt``."""
    return write_trials(
        store_dir,
        [
            Trial("a", {"lr": 0.1, "opt": "adam", "layers": 2}, {"": _rows(1.0)}),
            Trial("b", {"lr": 0.01, "opt": "sgd", "layers": 4}, {"": _rows(2.0)}),
            Trial("c", {"lr": "auto", "layers": 4}, {"": _rows(3.0)}, status="FAILED"),
            Trial("d", {"lr": 0.001, "opt": "adam", "layers": 8}, {"": _rows(math.inf)}),
        ],
    )


# -- tags and notes --------------------------------------------------------------------------------------
def test_a_view_changes_only_the_trials_it_holds_as_they_are_now(tmp_path: Path) -> None:
    """Found by a new user: ``Sweep.only(["a"]).delete(["b"])`` deleted b, which the view does not hold (its
    ``tag`` and ``note`` refused b); a Sweep read before another process deleted a trial still tagged it (a fresh
    one refuses); ``Sweep.delete(["a", "a"])`` returned a twice; ``tag`` set a tag it was also told to remove,
    and took a call that named no tag."""
    root = _sweep(tmp_path / "store").root
    view = Sweep(root).only(["a"])
    for change in (view.delete, view.undelete, lambda ids: view.tag(ids[0], x="1"), lambda ids: view.note(ids[0], "n")):
        with pytest.raises(RayCmfError, match=r"Unknown trial\(s\) \['b'\]"):
            change(["b"])
    assert Sweep(root).trials()["trial_id"].tolist() == ["a", "b", "c", "d"]  # b is not deleted
    assert view.delete(["a", "a"]) == ["a"]
    with pytest.raises(RayCmfError, match="already deleted"):
        view.delete("a")
    assert Sweep(root, include_deleted=True).only("a").undelete("a") == ["a"]

    stale = Sweep(root)
    stale.trials()
    Sweep(root).delete("c")  # another process, say
    with pytest.raises(RayCmfError, match="'c' is deleted"):
        stale.tag("c", team="x")
    with pytest.raises(RayCmfError, match="'c' is deleted"):
        stale.note("c", "why")
    assert "tag/team" not in Sweep(root, include_deleted=True).trials().columns
    Sweep(root, include_deleted=True).tag("c", team="x")  # a view of the deleted ones may curate them

    with pytest.raises(RayCmfError, match=r"tag 'zz' is both set \(zz=2\) and removed"):
        Sweep(root).tag("a", zz="2", remove=["zz"])
    with pytest.raises(RayCmfError, match="name a tag to set or one to remove"):
        Sweep(root).tag("a")
    assert "tag/zz" not in Sweep(root).trials().columns


def test_tags_and_notes_set_from_another_process_show_in_every_view(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _sweep(tmp_path / "store")
    root = str(store.root)
    done = _other_process("tag", "a", "team=vision", "prio=1", "équipe=ü", "--store", root)
    assert done.returncode == 0, done.stderr
    assert _other_process("note", "b", "lr too low? ✓", "--store", root).returncode == 0

    table = Sweep(root).trials().set_index("trial_id")
    assert table.loc["a", "tag/team"] == "vision" and table.loc["a", "tag/prio"] == "1"
    assert table.loc["a", "tag/équipe"] == "ü" and table.loc["b", "tag/team"] is None
    assert table.loc["b", "note"] == "lr too low? ✓" and table.loc["a", "note"] is None

    code, rows = _cli(capsys, "trials", "--store", root)
    assert code == 0 and {r["trial_id"]: r.get("tag/team") for r in rows} == {
        "a": "vision",
        "b": None,
        "c": None,
        "d": None,
    }
    code, shown = _cli(capsys, "show", "b", "--store", root)
    assert code == 0 and shown["note"] == "lr too low? ✓" and shown["tags"] == {}
    code, best = _cli(capsys, "compare", "--metric", "loss", "--store", root)
    assert code == 0 and best[0]["trial_id"] == "a" and best[0]["tag/team"] == "vision"
    page = Sweep(root).report(tmp_path / "r.html").read_text()
    assert "<th>tag/team</th>" in page and "lr too low? ✓" in page

    assert _other_process("tag", "a", "--remove", "team", "--store", root).returncode == 0
    assert _other_process("note", "b", "", "--store", root).returncode == 0
    table = Sweep(root).trials().set_index("trial_id")
    assert "tag/team" not in table.columns and table.loc["a", "tag/prio"] == "1" and table["note"].isna().all()


def test_a_tag_key_or_value_that_cannot_be_kept_is_refused_by_name(tmp_path: Path) -> None:
    sweep = Sweep(_sweep(tmp_path / "store"))
    with pytest.raises(InvalidArgumentError, match=r"'bad\.key'"):
        sweep.tag("a", **{"bad.key": "x"})
    with pytest.raises(InvalidArgumentError, match="'team' has value"):
        sweep.tag("a", team=["a", "list"])  # type: ignore[arg-type]
    with pytest.raises(RayCmfError, match="Unknown trial"):
        sweep.tag("nobody", team="x")
    done = _other_process("tag", "a", "no-equals-sign", "--store", str(tmp_path / "store"))
    assert done.returncode == 2 and "is not key=value" in done.stderr


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(max_size=8) | st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "1e999", "0"]))
def test_tags_and_notes_read_back_as_the_text_they_were(tmp_path_factory: pytest.TempPathFactory, value: str) -> None:
    """A tag ``verdict=NaN`` or a note "Infinity" read back as a float (blank in the table, never matched by
    ``where='`tag/verdict` == "NaN"'``): a property's text that spells a non-finite float was read as one."""
    sweep = Sweep(_sweep(tmp_path_factory.mktemp("tags") / "store"))
    sweep.tag("a", verdict=value)
    sweep.note("a", value)
    row = sweep.trials().set_index("trial_id").loc["a"]
    assert row["tag/verdict"] == value and (row["note"] == value if value else pd.isna(row["note"]))
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'  # the query's text literal
    assert sweep.trials(where=f"`tag/verdict` == {quoted}")["trial_id"].tolist() == ["a"]


@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_where_matches_text_with_backslashes_as_the_table_shows_it(tmp_path: Path, quote: str) -> None:
    """A query for a tag holding a Windows path, written as ``trials`` and ``show`` print it, found no trial
    (exit 0): a backslash in quoted text escaped any character after it, and was dropped, so ``delete
    --where`` could also pick other trials than the ones shown (a new user's). A backslash now escapes only
    a quote or a backslash; any other stands for itself."""
    sweep = Sweep(_sweep(tmp_path / "store"))
    sweep.tag("a", dir=r"C:\tmp\a")
    sweep.tag("b", dir="C:tmpa")
    for literal in (r"C:\tmp\a", r"C:\\tmp\\a"):
        assert sweep.trials(where=f"`tag/dir` == {quote}{literal}{quote}")["trial_id"].tolist() == ["a"], literal
    escaped = r"""`tag/dir` in ["C:tmpa", "x\"y", 'it\'s', 'C:\\']"""  # quotes and a backslash, escaped
    assert sweep.trials(where=escaped)["trial_id"].tolist() == ["b"]
    sweep.tag("c", dir='x"y')
    sweep.tag("d", dir="C:\\")
    assert sweep.trials(where=escaped)["trial_id"].tolist() == ["b", "c", "d"]


@pytest.mark.parametrize("value", [math.nan, None])
def test_a_tag_of_nan_or_none_is_refused_saying_what_a_tag_holds(tmp_path: Path, value: Any) -> None:
    """A tag of NaN was refused with "a tag's value is text or a number", while a bool was taken (a new
    user's): the error now says which values a tag holds, and how a tag is removed."""
    sweep = Sweep(_sweep(tmp_path / "store"))
    with pytest.raises(InvalidArgumentError, match=r"text, a number other than NaN, or a bool .*remove=\['x'\]"):
        sweep.tag("a", x=value)
    sweep.tag("a", x=True)
    assert sweep.trials().set_index("trial_id").loc["a", "tag/x"] == "True"


def test_a_tag_set_while_the_writer_ends_the_trial_keeps_both(tmp_path: Path) -> None:
    """The trial is RUNNING when another process tags it; the writer then ends it: both changes stay."""
    store = write_trials(tmp_path / "store", [Trial("live", {"lr": 0.1}, {"": _rows(1.0)}, status="RUNNING")])
    assert _other_process("tag", "live", "team=vision", "--store", str(store.root)).returncode == 0
    [execution] = store.lineage.store.get_executions()
    store.update_execution(execution.id, {"status": "COMPLETE"}, "COMPLETE")  # what the writer's end() does
    [row] = Sweep(store.root).trials().to_dict(orient="records")
    assert row["status"] == "COMPLETE" and row["tag/team"] == "vision"


def test_a_running_sweep_keeps_its_series_and_tags_as_its_trials_series_come(tmp_path: Path) -> None:
    """While a sweep runs, a trial's own series (``get_cmf``'s steps) can be recorded before its first Tune
    result: ``Sweep(store)`` then compared that series for a moment, and a tag or a note through a Sweep opened
    before it failed ("No series 'tune_results' ...; it holds ['steps']"), though they need only MLMD."""
    store = write_trials(tmp_path / "store", [Trial("live", {"lr": 0.1}, status="RUNNING")])
    early = Sweep(store.root)
    running = Trial("live", {"lr": 0.1}, {"": _rows(1.0)}, status="RUNNING")
    write_trials(tmp_path / "store", [running], metrics_name="steps")
    assert Sweep(store.root).metrics_name == "tune_results"
    early.tag("live", team="vision")
    early.note("live", "first")
    [row] = Sweep(store.root, metrics_name="steps").trials().to_dict(orient="records")
    assert row["tag/team"] == "vision" and row["note"] == "first"
    [execution] = store.lineage.store.get_executions()
    store.update_execution(execution.id, {"status": "COMPLETE"}, "COMPLETE")  # it ended with no result
    assert Sweep(store.root).metrics_name == "steps"  # then its own series is the obvious one, as before


def test_a_sweep_of_many_tags_reads_without_a_warning(tmp_path: Path) -> None:
    """Trials with many tags of their own printed pandas' "DataFrame is highly fragmented" PerformanceWarning
    from ray_cmf's own table, at every ``trials``."""
    store = write_trials(tmp_path / "store", [Trial(f"t{i}", {"lr": i}, {"": _rows(1.0)}) for i in range(3)])
    sweep = Sweep(store.root)
    for i in range(3):
        sweep.tag(f"t{i}", **{f"k{i}_{j}": j for j in range(60)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = Sweep(store.root).trials()
    assert sum(column.startswith("tag/") for column in table.columns) == 180


def test_a_run_tags_itself_with_set_tags(tmp_path: Path) -> None:
    cmf = Cmf(pipeline_name="runs", store=tmp_path / "store")
    cmf.create_execution("train", {"lr": 0.1}, execution_name="run-1")
    cmf.set_tags(team="nlp", kind="baseline")
    cmf.set_tags(remove=["kind"], stage=2)
    cmf.log_metric("steps", {"step": 0, "loss": 1.0})
    cmf.commit_metrics("steps")
    cmf.close()
    [row] = Sweep(tmp_path / "store", metrics_name="steps").trials().to_dict(orient="records")
    assert row["tag/team"] == "nlp" and row["tag/stage"] == "2" and "tag/kind" not in row
    assert row["config/lr"] == 0.1


def test_a_config_key_under_the_reserved_prefix_cannot_pose_as_a_tag_or_a_deletion(tmp_path: Path) -> None:
    store = write_trials(
        tmp_path / "store", [Trial("t", {"ray_cmf:tag:team": "x", "ray_cmf:deleted_at": "2020-01-01"}, {"": _rows(1)})]
    )
    [row] = Sweep(store).trials().to_dict(orient="records")  # not deleted, not tagged; the config keeps both
    assert not any(k.startswith("tag/") for k in row) and row["config/ray_cmf:tag:team"] == "x"


# -- queries ---------------------------------------------------------------------------------------------
@given(
    st.lists(
        st.one_of(st.none(), st.just(math.nan), st.floats(allow_nan=False), st.integers(-3, 3), st.text(max_size=3)),
        min_size=1,
        max_size=8,
    )
)
def test_a_missing_value_equals_nothing_not_even_itself_and_only_null_finds_it(values: list[Any]) -> None:
    """As NaN does in pandas: a missing value (None) is unequal to everything, itself included, under ``==``
    and ``!=`` between columns or against a number (``nan`` too); ``== null`` is what finds it. (Two missing
    values compared equal, so ``x != x`` found nothing and ``x == nan`` found the missing.) A NaN is a value
    that only ``nan`` and another NaN equal; where a NaN may stand for a missing value, null equals it too, and
    two such compare as missing values do (``aux_best == aux_final`` found the trials that never logged aux)."""
    table = pd.DataFrame({"x": pd.Series(values, dtype=object), "y": pd.Series(values, dtype=object)})
    nan = [isinstance(v, float) and math.isnan(v) for v in values]

    def holds(expression: str, nan_is_null: bool = False) -> list[bool]:
        return parse(expression).mask(table, nan_is_null=["x", "y"] if nan_is_null else []).tolist()

    for nan_is_null in (False, True):
        missing = [v is None or (nan_is_null and n) for v, n in zip(values, nan, strict=True)]
        present = [not m for m in missing]
        assert holds("x == null", nan_is_null) == missing and holds("x != null", nan_is_null) == present
        assert holds("x in [null]", nan_is_null) == missing and holds("x not in [null]", nan_is_null) == present
        unlike = missing  # two NaNs that may each stand for a missing value are unlike, as missing values are
        assert holds("x != y", nan_is_null) == unlike and holds("x == y", nan_is_null) == [not u for u in unlike]
        assert holds("x == nan", nan_is_null) == nan and holds("x != nan", nan_is_null) == [not n for n in nan]
        assert holds("x < nan", nan_is_null) == [False] * len(values)


summary_values = st.one_of(st.floats(), st.integers(-(2**62), 2**62), st.none())


@given(st.lists(summary_values, max_size=12), st.sampled_from(["min", "max"]), st.sampled_from(["_best", "_final"]))
@example([0.1, -math.inf, math.nan, None, math.inf], "min", "_final")
def test_sorting_by_a_summary_puts_the_best_finite_values_first_then_the_non_finite_then_blanks(
    values: list[Any], mode: str, part: str
) -> None:
    """``--sort loss_final`` put a trial that diverged to -inf first, as the best: non-finite values never
    rank best, in a sort as in ``_best``. Tied trials, and the trials without a value, come by trial id,
    whatever order the table had (``best`` listed the blanks in the order the store recorded them)."""
    from ray_cmf.frames import sort_trials

    column = f"loss{part}"
    ids = [f"t{len(values) - i:02d}" for i in range(len(values))]  # recorded in the reverse of the id order
    table = pd.DataFrame({"trial_id": ids, column: pd.Series(values, dtype=object)})
    result = sort_trials(table, column, mode)
    ordered = result[column].tolist()
    for _, same in result.groupby(result[column].map(lambda v: "blank" if v is None or v != v else repr(v))):
        assert same["trial_id"].tolist() == sorted(same["trial_id"])
    finite = [v for v in ordered if v is not None and math.isfinite(v)]
    assert finite == sorted(finite, reverse=mode == "max") and ordered[: len(finite)] == finite
    rest = ordered[len(finite) :]
    infinite = [v for v in rest if v is not None and math.isinf(v)]
    assert rest[: len(infinite)] == infinite and all(v is None or math.isnan(v) for v in rest[len(infinite) :])
    assert sorted(map(repr, ordered)) == sorted(map(repr, values))


def test_where_sort_and_limit_over_configs_of_mixed_types_tags_and_summaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _sweep(tmp_path / "store")
    sweep = Sweep(store)
    sweep.tag("b", team="vision")

    def picked(where: str, **options: Any) -> list[str]:
        return list(sweep.trials(where=where, **options)["trial_id"])

    assert picked("config/lr < 0.05") == ["b", "d"]  # "auto" is not a number: not < 0.05
    assert picked('config/lr == "auto" or tag/team == "vision"') == ["b", "c"]
    assert picked('not (status in ["FAILED"]) and config/opt != "sgd"') == ["a", "d"]
    assert picked("config/opt == null") == ["c"]
    assert picked("loss_final > 1e308") == ["d"]  # inf is data; ±inf and NaN never rank best
    assert picked("loss_best < 0.5 and steps == 5", sort="loss_best") == ["a", "b"]
    assert picked("config/layers in [4, 8]", sort="config/layers", limit=2) == ["b", "c"]
    assert picked(f'started_at > "{(datetime.now(timezone.utc) - timedelta(days=1)).date()}"') == list("abcd")
    assert picked('started_at < "2020-01-01"') == []
    assert picked("tag/nobody_has_this == null") == list("abcd")
    assert list(sweep.trials(sort="config/lr")["trial_id"]) == ["d", "b", "a", "c"]  # numbers first, then text

    code, rows = _cli(capsys, "trials", "--store", str(store.root), "--where", "config/layers >= 4", "--limit", "2")
    assert code == 0 and [r["trial_id"] for r in rows] == ["b", "c"]
    out = tmp_path / "picked.csv"
    assert main(["export", "--store", str(store.root), "--where", 'config/opt == "adam"', "-o", str(out)]) == 0
    assert sorted(set(pd.read_csv(out)["trial_id"])) == ["a", "d"]
    capsys.readouterr()


def test_where_reads_a_metric_that_the_table_does_not_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trials --metric loss --where 'acc_best > 0.5'`` said "no column 'acc_best'": the metrics asked for
    limited what the query could read. A metric the query names is now read for it, and the table still shows
    the metrics asked for."""
    store = write_trials(
        tmp_path / "store",
        [
            Trial("a", {}, {"": [{"training_iteration": 1, "loss": 0.1, "acc": 0.9}]}),
            Trial("b", {}, {"": [{"training_iteration": 1, "loss": 0.2, "acc": 0.3}]}),
        ],
    )
    assert Sweep(store).trials(["loss"], where="acc_best > 0.5")["trial_id"].tolist() == ["a"]
    code, found = _cli(capsys, "trials", "--store", str(store.root), "--metric", "loss", "--where", "acc_best > 0.5")
    assert code == 0 and [r["trial_id"] for r in found] == ["a"] and "acc_best" not in found[0], found


@pytest.mark.parametrize("restored", [False, True])
def test_a_where_query_gives_the_full_tables_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restored: bool
) -> None:
    """A metric only some trials logged (``extra``), and a query that keeps only trials without it: after a
    ``Tuner.restore`` (the kept trial's rows read by a scan, not from its file's summary) the query raised
    ``KeyError: 'extra'``, in ``trials``, ``export`` and ``report``. A query's rows are the full table's,
    whichever way the summaries are read."""
    second = {"s1": _rows(2.0), "s2": [{"training_iteration": 2, "loss": 0.5}]} if restored else {"": _rows(2.0)}
    store = write_trials(
        tmp_path / "store",
        [
            Trial("has", {"case": 0}, {"": [{"training_iteration": 1, "loss": 0.3, "extra": 4}]}),
            Trial("lacks", {"case": 1}, second),
        ],
    )
    sweep = Sweep(store)
    full = sweep.trials().set_index("trial_id")
    kept = sweep.trials(where="config/case == 1").set_index("trial_id")
    pd.testing.assert_frame_equal(kept, full.loc[["lacks"]], check_dtype=False)
    code, found = _cli(capsys, "trials", "--store", str(store.root), "--where", "config/case == 1")
    assert code == 0 and [r["trial_id"] for r in found] == ["lacks"] and found[0]["extra_best"] == "NaN"


def test_a_nan_config_is_a_value_that_nan_finds_and_null_does_not(tmp_path: Path) -> None:
    """A config of NaN is recorded (``trials`` shows it, ``group_by`` keeps it apart): ``== nan`` finds it and
    ``== null`` does not, which finds the trials without a value. (Both used to treat NaN as missing, so
    ``== null`` found it beside the missing ones and nothing found it alone.) A summary column cannot tell a
    NaN logged last from a metric never logged, so there NaN holds for both."""
    store = write_trials(
        tmp_path / "store",
        [
            Trial("nan", {"eps": math.nan}, {"": [{"training_iteration": 1, "loss": math.nan}]}),
            Trial("none", {"eps": None}, {"": _rows(1.0)}),
            Trial("lacks", {}, {"": [{"training_iteration": 1, "acc": 0.5}]}),
            Trial("small", {"eps": 0.1}, {"": _rows(2.0)}),
        ],
    )
    sweep = Sweep(store)

    def picked(where: str) -> list[str]:
        return sorted(sweep.trials(where=where)["trial_id"])

    assert picked("config/eps == nan") == ["nan"] and picked("config/eps in [nan, 0.1]") == ["nan", "small"]
    assert picked("config/eps == null") == ["lacks", "none"]
    assert picked("config/eps != null") == ["nan", "small"]
    assert picked("config/eps != nan") == ["lacks", "none", "small"]
    assert picked("config/eps < 1") == ["small"] and picked("config/eps >= 1") == []
    assert picked("loss_final == nan") == ["lacks", "nan"] and picked("loss_final == null") == ["lacks", "nan"]
    assert picked("loss_final != null") == ["none", "small"]


@pytest.mark.parametrize(
    ("where", "column", "says"),
    [
        ("config/lr <", 12, "expected a column name, a number"),
        ("config/lr = 1", 11, "compare with '=='"),
        ("(status == 'FAILED'", 20, "expected ')'"),
        ("status == 'x' and", 18, "found the end"),
        ("lr < 1", 1, "no column 'lr' at column 1; the trials have"),
        ("status == COMPLETE", 11, "no column 'COMPLETE' at column 11; text goes in quotes: \"COMPLETE\"; the"),
        ("status in 'x'", 11, "expected '[' to open a list"),
        ("status in [config/lr]", 12, "found 'config/lr' at"),
        ("config/lr < 0.2and steps > 1", 13, "unexpected '0.2and'"),
        ('status == "COMPLETE', 11, 'unclosed "'),
        ('started_at > "yesterday"', 14, "'yesterday' is not a UTC date or time"),  # at the text, not the name
        ('"soon" <= started_at', 1, "'soon' is not a UTC date or time"),
        ('started_at in ["2026-11-01", "later"]', 30, "'later' is not a UTC date or time"),
        ("", 1, "empty"),
        ("config/lr == [1, 2]", 14, "a list is compared as its JSON text in quotes: '[1, 2]'"),  # a new user's
        ("config/lr in [[1, 2], [3]] and steps > 1", 15, "its JSON text in quotes: '[1, 2]')"),
    ],
)
def test_a_bad_where_exits_2_and_points_at_the_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, column: int, says: str
) -> None:
    store = _sweep(tmp_path / "store")
    assert main(["trials", "--store", str(store.root), "--where", where]) == 2
    err = capsys.readouterr().err
    assert f"at column {column}" in err and says in err, err
    caret = err.rstrip("\n").splitlines()[-1]
    assert caret.index("^") - 2 == column - 1  # the caret sits under the column named


@pytest.mark.parametrize("command", [["trials"], ["compare", "--metric", "loss"]])
def test_a_where_the_shell_split_says_to_quote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """``--where config/lr < 1`` unquoted: the shell splits it, and argparse said only "unrecognized arguments"
    (found by a new user). ``delete`` takes the rest for trial ids, and refuses ids beside ``--where``."""
    store = _sweep(tmp_path / "store")
    with pytest.raises(SystemExit) as usage:
        main([*command, "--store", str(store.root), "--where", "config/lr", "<", "1"])
    assert usage.value.code == 2
    assert "quote it whole, --where 'config/lr < 1'" in capsys.readouterr().err


def test_eval_never_runs() -> None:
    with pytest.raises(QueryError):
        parse("__import__('os').system('true') == 1")


_NUMBERS = st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False).map(lambda v: round(v, 2)))
_WORDS = st.sampled_from(["adam", "sgd", "é", ""])
_COLUMNS = {"config/x": "number", "loss_best": "number", "config/opt": "text", "tag/team": "text"}


def _frames() -> st.SearchStrategy[pd.DataFrame]:
    def frame(n: int) -> st.SearchStrategy[pd.DataFrame]:
        return st.fixed_dictionaries(
            {
                "config/x": st.lists(st.one_of(_NUMBERS, st.just(math.nan)), min_size=n, max_size=n),
                "loss_best": st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=n, max_size=n),
                "config/opt": st.lists(_WORDS, min_size=n, max_size=n),
                "tag/team": st.lists(st.one_of(st.none(), _WORDS), min_size=n, max_size=n),
            }
        ).map(pd.DataFrame)

    return st.integers(1, 12).flatmap(frame)


def _tests() -> st.SearchStrategy[tuple[str, str]]:
    """(ours, pandas') renderings of one comparison or membership test."""

    def render(column: str, op: str, literal: Any) -> tuple[str, str]:
        text = json.dumps(literal, ensure_ascii=False) if isinstance(literal, str) else repr(literal)
        return f"{column} {op} {text}", f"`{column}` {op} {text}"

    numeric = st.tuples(
        st.sampled_from(["config/x", "loss_best"]), st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]), _NUMBERS
    ).map(lambda t: render(*t))
    textual = st.tuples(st.sampled_from(["config/opt", "tag/team"]), st.sampled_from(["==", "!="]), _WORDS).map(
        lambda t: render(*t)
    )
    member = st.tuples(
        st.sampled_from(["config/opt", "tag/team"]), st.booleans(), st.lists(_WORDS, min_size=1, max_size=3)
    ).map(
        lambda t: (
            f"{t[0]} {'not in' if t[1] else 'in'} {json.dumps(t[2], ensure_ascii=False)}",
            f"`{t[0]}` {'not in' if t[1] else 'in'} {json.dumps(t[2], ensure_ascii=False)}",
        )
    )
    return st.one_of(numeric, textual, member)


def _expressions() -> st.SearchStrategy[tuple[str, str]]:
    def combine(children: st.SearchStrategy[tuple[str, str]]) -> st.SearchStrategy[tuple[str, str]]:
        pair = st.tuples(children, st.sampled_from(["and", "or"]), children)
        return st.one_of(
            pair.map(lambda t: (f"({t[0][0]}) {t[1]} ({t[2][0]})", f"({t[0][1]}) {t[1]} ({t[2][1]})")),
            children.map(lambda c: (f"not ({c[0]})", f"not ({c[1]})")),
        )

    return st.recursive(_tests(), combine, max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=_frames(), expression=_expressions())
def test_where_agrees_with_pandas_on_the_same_expression(frame: pd.DataFrame, expression: tuple[str, str]) -> None:
    ours, theirs = expression
    expected = frame.query(theirs, engine="python")
    got = frame[parse(ours).mask(frame)]
    assert list(got.index) == list(expected.index), (ours, theirs)


# -- deletion and gc -------------------------------------------------------------------------------------
def _files(store: Store) -> set[Path]:
    root = store.root
    return {p for p in (root / "artifacts").rglob("*") if p.is_file()} | {
        p for p in (root / ".dvc" / "cache").rglob("*") if p.is_file()
    }


def test_deleted_trials_leave_every_view_until_undeleted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _sweep(tmp_path / "store")
    root = str(store.root)
    code, would = _cli(capsys, "delete", "--store", root, "--where", 'status == "FAILED"', "--dry-run")
    assert code == 0 and [r["trial_id"] for r in would] == ["c"] and len(Sweep(root).trials()) == 4
    done = _other_process("delete", "c", "a", "--store", root)  # not a terminal: no question asked
    assert done.returncode == 0, done.stderr

    sweep = Sweep(root)
    assert list(sweep.trials()["trial_id"]) == ["b", "d"] and set(sweep.steps()["trial_id"]) == {"b", "d"}
    assert list(sweep.best("loss")["trial_id"]) == ["b"]
    code, rows = _cli(capsys, "trials", "--store", root)
    assert [r["trial_id"] for r in rows] == ["b", "d"]
    code, rows = _cli(capsys, "trials", "--store", root, "--include-deleted")
    assert {r["trial_id"]: bool(r.get("deleted_at")) for r in rows} == {"a": True, "b": False, "c": True, "d": False}
    assert main(["report", "--store", root, "-o", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()
    page = (tmp_path / "r.html").read_text()
    assert 'data-trial="b"' in page and 'data-trial="a"' not in page and 'data-trial="c"' not in page

    for read in (sweep.config, sweep.environment, sweep.execution_metrics):  # it said "Unknown trial(s)"
        with pytest.raises(RayCmfError, match=r"'a' is deleted: read it with Sweep\(\.\.\., include_deleted=True\)"):
            read("a")
    with pytest.raises(RayCmfError, match="'c' is deleted"):
        sweep.diff("b", "c")
    assert Sweep(root, include_deleted=True).config("a") == {"layers": 2, "lr": 0.1, "opt": "adam"}

    code, _ = _cli(capsys, "undelete", "a", "--store", root)
    assert code == 0 and list(Sweep(root).trials()["trial_id"]) == ["a", "b", "d"]
    assert main(["delete", "--store", root]) == 2
    assert "name the trials (ids), pick them with --where, or take --all" in capsys.readouterr().err
    assert main(["delete", "b", "--all", "--store", root]) == 2  # one of the three
    capsys.readouterr()
    code, rows = _cli(capsys, "delete", "--all", "--yes", "--store", root)  # a whole sweep (a new user)
    assert code == 0 and sorted(row["trial_id"] for row in rows) == ["a", "b", "d"]
    assert Sweep(root).trials().empty
    out = tmp_path / "out"
    for argv in (
        ["compare"],
        ["trials", "--metric", "loss"],
        ["trials", "--where", "config/lr > 0"],  # "no column 'config/lr'"
        ["trials", "--group-by", "config/opt"],
        ["report", "-o", f"{out}.html"],
        ["export", "-o", f"{out}.csv"],
    ):
        assert main([*argv, "--store", root]) == 2  # compare and trials blamed the loggers, report and export wrote
        assert "every trial of 'sweep' is deleted (--include-deleted" in capsys.readouterr().err  # an empty file
    assert not list(tmp_path.glob("out.*"))
    assert main(["trials", "--store", root]) == 0
    assert "none (every trial of 'sweep' is deleted (--include-deleted" in capsys.readouterr().out
    code, rows = _cli(capsys, "undelete", "--all", "--store", root)
    assert code == 0 and list(Sweep(root).trials()["trial_id"]) == ["a", "b", "c", "d"]


def test_show_quotes_a_tag_or_note_that_would_read_as_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` printed ``tags: te=  tg=a `` for an empty tag and one ending in a space, and a note of "a "
    as ``note: a``: they read as no value and as "a"."""
    store = _sweep(tmp_path / "store")
    sweep = Sweep(store)
    sweep.tag("a", te="", tg="a ", ok="plain")
    sweep.note("a", "two\nlines ")
    assert main(["show", "a", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert 'te=""' in out and 'tg="a "' in out and "ok=plain" in out, out
    assert 'note: "two\\nlines "' in out, out


def test_delete_asks_on_a_terminal(tmp_path: Path) -> None:
    store = _sweep(tmp_path / "store")
    code, _ = _on_a_terminal(["delete", "a", "--store", str(store.root)], answer=(b"[y/N]", b"n\n"))
    assert code == 1 and len(Sweep(store.root).trials()) == 4


def test_gc_frees_only_what_deleted_trials_alone_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``twin`` logged exactly ``a``'s rows: one content-addressed object for both. Deleting ``a`` and ``b``
    frees ``b``'s bytes; the object ``twin`` shares with ``a`` stays."""
    store = write_trials(
        tmp_path / "store",
        [
            Trial("a", {"lr": 0.1}, {"": _rows(1.0)}),
            Trial("twin", {"lr": 0.1}, {"": _rows(1.0)}),
            Trial("b", {"lr": 0.2}, {"": _rows(2.0)}),
        ],
    )
    root = str(store.root)
    twin_rows = Sweep(root).steps(trials=["twin"])
    before = _files(store)
    sizes = {p: p.stat().st_size for p in before}
    Sweep(root).delete(["a", "b"])
    code, dry = _cli(capsys, "gc", "--store", root, "--dry-run")
    assert code == 0 and dry["files"] == 1 and dry["kept_shared"] == 1 and _files(store) == before
    code, dry = _cli(capsys, "gc", "--store", root, "--older-than", "7d")  # deleted just now: too young
    assert code == 0 and dry["files"] == 0 and _files(store) == before

    code, freed = _cli(capsys, "gc", "--store", root)
    gone = before - _files(store)
    assert code == 0 and freed["freed_trials"] == [{"pipeline": "sweep", "trial_id": "b"}]  # twin holds a's content
    assert freed["files"] == 1 and freed["cache_objects"] == 1
    assert freed["bytes"] == sum(sizes[p] for p in gone) > 0
    assert len(gone) == 3 and {p.suffix for p in gone} == {".parquet", ".dvc", ""}  # file, .dvc, cache object
    assert Sweep(root).steps(trials=["twin"]).equals(twin_rows)
    code, audit = _cli(capsys, "verify", "--store", root)
    assert code == 0 and {r["status"] for r in audit} == {"ok"}
    code, again = _cli(capsys, "gc", "--store", root)
    assert code == 0 and again["files"] == 0
    lineage = Sweep(root, include_deleted=True).trials()
    assert set(lineage["trial_id"]) == {"a", "twin", "b"}  # the metadata stays: lineage is explainable


def _identical_series(store_dir: Path, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Executions ``names`` of one pipeline, each committing the same rows as series ``s``; those rows."""
    rows = _rows(1.0)
    for name in names:
        _identical_series_of(store_dir, name, rows)
    return rows


def _identical_series_of(store_dir: Path, name: str, rows: list[dict[str, Any]]) -> None:
    with Cmf(pipeline_name="same", store=store_dir) as cmf:  # ended: gc refuses while one runs
        cmf.create_execution("trial", execution_name=name)
        for row in rows:
            cmf.log_metric("s", row)
        cmf.commit_metrics("s")


def test_trials_that_commit_identical_series_leave_one_file_that_gc_frees_with_the_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Identical content is one artifact: each later trial left its own copy of the file, which no artifact
    named, so gc never freed it and ``dvc status`` listed it as not in cache once the object was freed."""
    store = Store(tmp_path / "store")
    _identical_series(store.root, ("a", "b", "c"))
    assert len(list((store.root / "artifacts").rglob("*.parquet"))) == 1
    assert len(list((store.root / "artifacts").rglob("*.dvc"))) == 1
    assert Sweep(store.root).trials()["steps"].tolist() == [5, 5, 5]
    [md5] = {file.md5 for file in Sweep(store.root).files()}
    Sweep(store.root).delete(["a", "b"])
    code, freed = _cli(capsys, "gc", "--store", str(store.root))
    assert code == 0 and freed["files"] == 0 and freed["kept_shared"] == 1  # c holds it
    assert Sweep(store.root).steps(trials=["c"])["loss"].tolist() == [r["loss"] for r in _rows(1.0)]
    Sweep(store.root).delete(["c"])
    code, freed = _cli(capsys, "gc", "--store", str(store.root))
    assert code == 0 and freed["files"] == 1 and freed["cache_objects"] == 1
    assert not [p for p in (store.root / "artifacts").rglob("*") if p.is_file()]
    assert not store.dvc.cache_path(md5).exists()
    assert "not in cache" not in store.dvc.status()


def test_a_trial_whose_files_gc_freed_keeps_no_other_trials_file_of_that_content(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``a``'s file was freed, and ``a`` undeleted (it reads 0 steps): the md5 of its freed artifact still
    counted as live content, so gc kept ``b``'s file of that content after ``b`` was deleted too."""
    store_dir = tmp_path / "store"
    _identical_series(store_dir, ("a",))
    Sweep(store_dir).delete(["a"])
    assert _cli(capsys, "gc", "--store", str(store_dir))[1]["files"] == 1
    Sweep(store_dir).undelete(["a"])
    _identical_series(store_dir, ("b",))
    Sweep(store_dir).delete(["b"])
    code, freed = _cli(capsys, "gc", "--store", str(store_dir))
    assert code == 0 and freed["files"] == 1 and freed["kept_shared"] == 0
    assert not [p for p in (store_dir / "artifacts").rglob("*") if p.is_file()]


def test_gc_frees_a_deleted_trials_file_whose_content_a_live_trial_holds_in_a_file_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Content that gc had freed comes back as a file per trial (``b``, ``c``). Deleting ``c`` kept its file for
    ever (``kept_shared``), since ``b`` holds the same md5: only the DVC cache object is shared."""
    store_dir = tmp_path / "store"
    rows = _identical_series(store_dir, ("a",))
    Sweep(store_dir).delete(["a"])
    assert _cli(capsys, "gc", "--store", str(store_dir))[1]["files"] == 1
    _identical_series(store_dir, ("b", "c"))
    assert len(list((store_dir / "artifacts").rglob("*.parquet"))) == 2
    Sweep(store_dir).delete(["c"])
    code, freed = _cli(capsys, "gc", "--store", str(store_dir))
    assert code == 0 and freed["files"] == 1 and freed["cache_objects"] == 0 and freed["kept_shared"] == 0
    assert len(list((store_dir / "artifacts").rglob("*.parquet"))) == 1
    assert Sweep(store_dir).steps(trials=["b"])["loss"].tolist() == [r["loss"] for r in rows]
    code, audit = _cli(capsys, "verify", "--store", str(store_dir))
    assert code == 0 and {r["status"] for r in audit} == {"ok"}
    assert "not in cache" not in Store(store_dir).dvc.status()


def test_a_file_edited_by_hand_in_the_store_still_reads_back_what_was_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another trial's bytes copied over a trial's Parquet file made every read give that trial the other's
    values, with the md5 of its own (found by a new user; verify did flag the file). Reads take the content
    the md5 names, from the DVC cache."""
    store_dir = tmp_path / "store"
    store = write_trials(store_dir, [Trial("k1", {}, {"": _rows(100.0)}), Trial("k2", {}, {"": _rows(200.0)})])
    urls = {f.trial_id: f.url for f in Sweep(store_dir).files()}
    store.resolve(urls["k1"]).write_bytes(store.resolve(urls["k2"]).read_bytes())
    sweep = Sweep(store_dir)
    assert sweep.steps(trials=["k1"])["loss"].tolist() == [r["loss"] for r in _rows(100.0)]
    assert sweep.trials(verify=True)["verified"].tolist() == [True, True]  # what is read is what was logged
    assert {f.url: f.status for f in audit(store)}[urls["k1"]] == "modified"  # which verify says
    md5s = {f.trial_id: f.md5 for f in sweep.files()}
    cached = store.dvc.cache_path(md5s["k1"])
    cached.chmod(0o644)  # DVC keeps its objects read-only
    cached.unlink()  # and the edited file is all that is left of k1's content
    with caplog.at_level("WARNING", logger="ray_cmf"):
        assert Sweep(store_dir).trials().set_index("trial_id")["steps"].to_dict() == {"k1": 0, "k2": 5}
    assert "does not match its md5" in caplog.text  # never read as k1's
    cached = store.dvc.cache_path(md5s["k2"])
    cached.chmod(0o644)
    cached.write_bytes(b"other bytes")  # k2's object, what reads take, no longer holds what was logged
    assert {f.url: f.status for f in audit(store)}[urls["k2"]] == "cache-modified"  # what reads take is checked


def test_an_undeleted_trial_whose_newest_version_gc_freed_reads_no_older_version_as_current(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``e1`` committed 3 rows, then 5; ``e2`` the same 3 rows (so it holds ``e1``'s first version). gc freed
    ``e1``'s newest version only, and the undeleted ``e1`` read its first version's 3 rows as its series
    (found by a new user): its series reads as freed, as the README says, 0 steps."""
    store_dir = tmp_path / "store"
    rows = _rows(1.0)
    with Cmf(pipeline_name="same", store=store_dir) as cmf:
        cmf.create_execution("trial", execution_name="e1")
        for row in rows[:3]:
            cmf.log_metric("s", row)
        cmf.commit_metrics("s")
        for row in rows[3:]:
            cmf.log_metric("s", row)
        cmf.commit_metrics("s")
    _identical_series_of(store_dir, "e2", rows[:3])
    Sweep(store_dir).delete(["e1"])
    assert _cli(capsys, "gc", "--store", str(store_dir))[1]["files"] == 1
    Sweep(store_dir).undelete(["e1"])
    assert Sweep(store_dir).trials().set_index("trial_id")["steps"].to_dict() == {"e1": 0, "e2": 3}


def test_a_series_that_matched_another_trials_content_extends_it_at_its_next_commit(tmp_path: Path) -> None:
    """Its own copy of the shared content went at the commit: the next version extends the shared file."""
    store_dir = tmp_path / "store"
    rows = _identical_series(store_dir, ("a",))
    cmf = Cmf(pipeline_name="same", store=store_dir)
    cmf.create_execution("trial", execution_name="b")
    for row in rows:
        cmf.log_metric("s", row)
    cmf.commit_metrics("s")
    more = _rows(3.0, steps=8)[5:]
    for row in more:
        cmf.log_metric("s", row)
    cmf.commit_metrics("s")
    sweep = Sweep(store_dir)
    assert sweep.steps(trials=["b"])["loss"].tolist() == [r["loss"] for r in rows + more]
    assert sweep.steps(trials=["a"])["loss"].tolist() == [r["loss"] for r in rows]


def test_a_series_identical_to_one_that_gc_freed_is_committed_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its content named the artifact gc had freed: the new trial was linked to that artifact, whose bytes
    were gone, so it read 0 steps."""
    store_dir = tmp_path / "store"
    rows = _identical_series(store_dir, ("a",))
    Sweep(store_dir).delete(["a"])
    code, freed = _cli(capsys, "gc", "--store", str(store_dir))
    assert code == 0 and freed["files"] == 1
    _identical_series(store_dir, ("b",))
    steps = Sweep(store_dir).steps(trials=["b"])
    assert steps["loss"].tolist() == [r["loss"] for r in rows]
    assert Sweep(store_dir).trials()["steps"].tolist() == [5]
    code, audit = _cli(capsys, "verify", "--store", str(store_dir))
    assert code == 0 and {r["status"] for r in audit} == {"ok"}


def test_a_commit_waits_for_a_gc_that_frees_its_content(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gc --force`` during a sweep freed the cache object of a live trial's file (``verify``: cache-missing):
    the trial committed content that gc had freed from a deleted trial, and gc, which saw no live artifact of it
    yet, took the new cache copy between the commit's DVC tracking and its MLMD record. A commit that tracks a
    file now waits while gc frees files, and gc waits for such a commit."""
    import threading

    store_dir = tmp_path / "store"
    _identical_series(store_dir, ("a",))
    Sweep(store_dir).delete(["a"])
    with Store(store_dir).collecting():  # as gc holds the store while it frees
        committing = threading.Thread(target=_identical_series_of, args=(store_dir, "b", _rows(1.0)))
        committing.start()
        committing.join(timeout=2.0)
        assert committing.is_alive()  # the commit waits for gc
    committing.join()
    code, audit = _cli(capsys, "verify", "--store", str(store_dir))
    assert code == 0 and {r["status"] for r in audit} == {"ok"}
    assert Sweep(store_dir).steps(trials=["b"])["loss"].tolist() == [r["loss"] for r in _rows(1.0)]


def test_a_second_gc_reports_only_what_it_frees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial whose content a gc had freed with another trial: freeing it reported the earlier trial and its
    file again (gone since the first gc), since the cache object they share was still there, the new trial's."""
    store_dir = tmp_path / "store"
    _identical_series(store_dir, ("a",))
    Sweep(store_dir).delete(["a"])
    code, first = _cli(capsys, "gc", "--store", str(store_dir))
    assert code == 0 and [t["trial_id"] for t in first["freed_trials"]] == ["a"]
    _identical_series(store_dir, ("b",))
    Sweep(store_dir).delete(["b"])
    code, second = _cli(capsys, "gc", "--store", str(store_dir))
    assert code == 0 and [t["trial_id"] for t in second["freed_trials"]] == ["b"] and second["trials"] == 1
    assert [Path(url).parts[-2] for url in second["urls"]] == ["b"] and second["cache_objects"] == 1


def test_gc_counts_and_names_each_trial_it_freed_where_ids_recur(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tune's trial ids recur across sweeps: gc named the trials it freed by bare id, so two trials ``t``
    counted as one and could not be told apart. Each is named by its key in its pipeline's table."""
    for pipeline, stage, scale in (("p", "first", 1.0), ("p", "second", 2.0), ("q", "first", 3.0)):
        write_trials(
            tmp_path / "store", [Trial("t", {"lr": scale}, {"": _rows(scale)})], pipeline=pipeline, stage=stage
        )
    write_trials(tmp_path / "store", [Trial("alone", {}, {"": _rows(4.0)})], pipeline="q", stage="first")
    root = str(tmp_path / "store")
    for pipeline in ("p", "q"):
        sweep = Sweep(root, pipeline=pipeline)
        sweep.delete([key for key in sweep.trials()["trial_id"] if "t" in key.split("/")[-1]])
    code, freed = _cli(capsys, "gc", "--store", root)
    named = [(r["pipeline"], r["trial_id"]) for r in freed["freed_trials"]]
    assert code == 0 and freed["trials"] == 3 == len(named) and freed["files"] == 3
    assert sorted(named) == [("p", "first/t"), ("p", "second/t"), ("q", "t")]
    assert Sweep(root, pipeline="q").steps()["trial_id"].unique().tolist() == ["alone"]


def test_gc_of_a_deleted_trial_leaves_the_train_run_of_its_namesake_in_another_stage(tmp_path: Path) -> None:
    """Two stages hold a trial ``t`` (Tune's ids recur across sweeps), each running a Train run; deleting
    the first's and collecting frees its run's file only: gc matched runs to their trial by id alone."""
    from ray_cmf.binding import SeriesKey
    from ray_cmf.client import WriterClient
    from ray_cmf.constants import RUN_EXECUTION_TYPE, TRIAL_PROPERTY
    from ray_cmf.lineage import properties
    from ray_cmf.writer import StoreWriter

    runs = {}
    for stage, scale in (("first", 1.0), ("second", 2.0)):
        store = write_trials(tmp_path / "store", [Trial("t", {"lr": scale}, {"": _rows(scale)})], stage=stage)
        client = WriterClient(StoreWriter(store))
        binding = client.call(
            StoreWriter.bind,
            kind="run",
            name="train",
            pipeline="sweep",
            stage=stage,
            type_name=RUN_EXECUTION_TYPE,
            props={TRIAL_PROPERTY: "t"},
        )
        key = SeriesKey(binding, "train_steps")
        buffer = MetricBuffer(sink=client.sink(key))
        for row in _rows(10 * scale):
            buffer.append(row)
        buffer.close()
        runs[stage] = store.resolve(properties(client.call(StoreWriter.commit, key=key))["url"])
        client.call(StoreWriter.end, binding=binding, props={}, state="COMPLETE")
    sweep = Sweep(store.root)
    assert list(sweep.trials()["trial_id"]) == ["first/t", "second/t"]
    assert sweep.delete(["first/t"]) == ["first/t"]
    freed = collect(store)
    assert len(freed.files) == 2  # the first trial's results and its run's steps
    assert not runs["first"].exists() and runs["second"].exists()
    assert Sweep(store.root).steps()["loss"].tolist() == [2.0 / (i + 1) for i in range(5)]


def test_two_sweeps_of_one_stage_and_trial_id_keep_their_train_runs_apart_through_gc(tmp_path: Path) -> None:
    """Two sweeps left a trial ``t`` in one stage, each running a Train run of one name: each run is its
    trial's own and reads as it; deleting one trial and collecting frees that trial's run only (gc matched a
    run to its trial by stage and id, which both trials share)."""
    from ray_cmf.binding import SeriesKey
    from ray_cmf.client import WriterClient
    from ray_cmf.constants import RUN_EXECUTION_TYPE, SPILL_MANIFEST, TRIAL_EXECUTION_TYPE, TRIAL_PROPERTY
    from ray_cmf.lineage import config_properties, properties
    from ray_cmf.series_format import SpillManifest
    from ray_cmf.store import Store
    from ray_cmf.writer import StoreWriter

    store = Store(tmp_path / "store")
    client = WriterClient(StoreWriter(store))
    where = {"pipeline": "sweep", "stage": "exp"}
    files = {}
    for sweep, scale in (("one", 1.0), ("two", 2.0)):
        props = {**config_properties({"lr": scale}), "trial_id": "t"}
        trial = client.call(
            StoreWriter.bind,
            kind="trial",
            name="t",
            type_name=TRIAL_EXECUTION_TYPE,
            **where,
            props=props,
            sweep=sweep,
            start=True,
        )
        run = client.call(
            StoreWriter.bind,
            kind="run",
            name="train@t",
            type_name=RUN_EXECUTION_TYPE,
            **where,
            props={TRIAL_PROPERTY: "t"},
            trial=trial,
            start=True,
        )
        key = SeriesKey(run, "train_steps")
        buffer = MetricBuffer(sink=client.sink(key))
        for row in _rows(scale):
            buffer.append(row)
        buffer.sealed().result()
        files[scale] = store.resolve(properties(client.call(StoreWriter.commit, key=key))["url"])
        buffer.append({"training_iteration": 6, "loss": -scale})  # logged after the commit: in the spill only
        buffer.close()
        if sweep == "one":  # the other sweep's driver died: its last row waits in the spill for `recover`
            for ended in (run, trial):
                client.call(StoreWriter.end, binding=ended, props={}, state="COMPLETE")
        spilled = run
    sweep = Sweep(store.root)
    keys = dict(zip(sweep.trials()["config/lr"], sweep.trials()["trial_id"], strict=True))
    assert len(set(keys.values())) == 2 and all(k.startswith("exp/t#") for k in keys.values())
    steps = sweep.of_series("train_steps").steps(["loss"])
    assert {t: rows["loss"].tolist() for t, rows in steps.groupby("trial_id")} == {
        keys[1.0]: [*(1.0 / (i + 1) for i in range(5)), -1.0],  # its last row committed at its end
        keys[2.0]: [2.0 / (i + 1) for i in range(5)],
    }
    assert sweep.delete([keys[1.0]]) == [keys[1.0]]
    freed = collect(store, force=True)  # the dead driver's trial still reads RUNNING
    assert not files[1.0].exists() and files[2.0].exists()
    assert freed.spills == 0  # the first run's last row was committed at its end; the second's is not its
    assert [SpillManifest.read(m.parent).execution_id for m in store.root.glob(f"spill/*/{SPILL_MANIFEST}")] == [
        spilled.execution_id
    ]
    assert Sweep(store.root).of_series("train_steps").steps()["loss"].tolist() == [2.0 / (i + 1) for i in range(5)]


def test_a_trial_id_that_several_pipelines_or_stages_hold_is_asked_for_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tune's ids recur: ``show`` of an id that two pipelines hold picked one silently (the one where the id
    was bare), a bare id that two stages share read as 'No trial', and ``pipelines`` counted a Train run
    inside a trial as a trial of its own (found by a new user)."""
    from ray_cmf.client import WriterClient
    from ray_cmf.constants import RUN_EXECUTION_TYPE, TRIAL_EXECUTION_TYPE, TRIAL_PROPERTY
    from ray_cmf.writer import StoreWriter

    root = tmp_path / "store"
    for pipeline, stage in (("collide", "first"), ("collide", "second"), ("other", "first")):
        write_trials(root, [Trial("c0ffe_00000", {"lr": 0.1}, {"": _rows(1.0)})], pipeline=pipeline, stage=stage)
    client = WriterClient(StoreWriter(Store(root)))
    where = {"pipeline": "other", "stage": "first"}
    trial = client.call(StoreWriter.bind, kind="trial", name="c0ffe_00000", type_name=TRIAL_EXECUTION_TYPE, **where)
    run = client.call(
        StoreWriter.bind,
        kind="run",
        name="train@c0ffe_00000",
        type_name=RUN_EXECUTION_TYPE,
        **where,
        trial=trial,
        props={TRIAL_PROPERTY: "c0ffe_00000"},
    )
    client.call(StoreWriter.end, binding=run, props={}, state="COMPLETE")
    code, listed = _cli(capsys, "pipelines", "--store", str(root))
    assert code == 0 and {row["pipeline"]: row["trials"] for row in listed} == {"collide": 2, "other": 1}
    for key in ("c0ffe_00000", "first/c0ffe_00000"):
        assert main(["show", key, "--store", str(root)]) == 2
        assert "Pipelines ['collide', 'other'] all hold trial(s) ['c0ffe_00000']" in capsys.readouterr().err
    assert main(["show", "c0ffe_00000", "--store", str(root), "--pipeline", "collide"]) == 2
    said = capsys.readouterr().err
    assert (
        "'c0ffe_00000' is the Tune id of 2 trials in collide; name one: ['first/c0ffe_00000', 'second/c0ffe_00000']"
        in said
    )
    with pytest.raises(RayCmfError, match=r"name one: \['first/c0ffe_00000', 'second/c0ffe_00000'\]"):
        Sweep(root, "collide").tag("c0ffe_00000", team="x")
    code, shown = _cli(capsys, "show", "second/c0ffe_00000", "--store", str(root), "--pipeline", "collide")
    assert code == 0 and shown["trial_id"] == "second/c0ffe_00000"
    code, shown = _cli(capsys, "show", "c0ffe_00000", "--store", str(root), "--pipeline", "other")
    assert code == 0 and shown["trial_id"] == "c0ffe_00000"
    code, shown = _cli(capsys, "show", "second/c0ffe_00000", "--store", str(root))  # a name only collide has
    assert code == 0 and shown["trial_id"] == "second/c0ffe_00000" and shown["stage"] == "second"


def test_the_python_api_refuses_to_delete_twice_or_undelete_a_live_trial(tmp_path: Path) -> None:
    """README: "Deleting a deleted trial, or undeleting one that is not, is an error that says so." The CLI
    refused; ``Sweep.delete`` deleted again, moving ``deleted_at`` (what ``gc --older-than`` reads), and
    ``Sweep.undelete`` of a live trial said it had undeleted it (found by a new user)."""
    store = _sweep(tmp_path / "store")
    Sweep(store.root).delete("c")
    deleted_at = Sweep(store.root, include_deleted=True).trials().set_index("trial_id").at["c", DELETED_COLUMN]
    time.sleep(1.1)  # deleted_at counts seconds: a second delete would show
    for sweep in (Sweep(store.root), Sweep(store.root, include_deleted=True)):
        with pytest.raises(InvalidArgumentError, match=r"\['c'\] are already deleted"):
            sweep.delete(["a", "c"])
        with pytest.raises(InvalidArgumentError, match=r"\['a', 'b'\] are not deleted"):
            sweep.undelete(["a", "b", "c"])
    table = Sweep(store.root, include_deleted=True).trials().set_index("trial_id")
    assert table.at["c", DELETED_COLUMN] == deleted_at and table[DELETED_COLUMN].notna().sum() == 1
    assert Sweep(store.root).undelete("c") == ["c"] and Sweep(store.root).delete(["a", "c"]) == ["a", "c"]


def _twice_in_a_stage(root: Path) -> list[str]:
    """One Tune id in two sweeps of stage ``exp_a`` (execution ids 4 and 14) and one of ``exp_b``, tied on loss
    with each other and with trials of ids of their own; returns the shared id's keys, in execution order."""
    rows = {"": [{"training_iteration": 1, "loss": 0.5}]}
    write_trials(root, [Trial(f"f{i}", {}, rows) for i in range(3)], stage="exp_a")
    write_trials(root, [Trial("x", {}, rows)], stage="exp_a", sweep="first")
    write_trials(root, [Trial(f"g{i}", {}, rows) for i in range(8)], stage="exp_b")
    write_trials(root, [Trial("x", {}, rows)], stage="exp_b")
    write_trials(root, [Trial("x", {}, rows)], stage="exp_a", sweep="second")
    keys = [k for k in Sweep(root).trials()["trial_id"] if k.endswith("x") or "x#" in k]
    return sorted(keys, key=lambda k: int(k.split("#")[1]) if "#" in k else 10)


def test_tied_trials_that_share_an_id_are_ranked_earlier_first(tmp_path: Path) -> None:
    """README: "of tied trials, the earlier trial id first". Keys that a stage's two trials of one Tune id
    carry (``exp_a/x#4``, ``exp_a/x#14``) were ordered as text, so the later trial ranked first."""
    first, _, later = keys = _twice_in_a_stage(tmp_path / "store")
    assert (first, later) == ("exp_a/x#4", "exp_a/x#14"), keys
    sweep = Sweep(tmp_path / "store")
    ranked = sweep.trials(["loss"], sort="loss_best")["trial_id"].tolist()
    assert ranked[:3] == ["exp_a/x#4", "exp_a/x#14", "exp_b/x"], ranked
    assert sweep.best("loss", n=2)["trial_id"].tolist() == ["exp_a/x#4", "exp_a/x#14"]


def test_a_shared_id_that_one_shown_trial_holds_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bare id whose other trials were deleted was refused as "the Tune id of 1 trials ...; name one":
    the count left out the deleted ones, and "name one" of one said nothing of why; and ``ray-cmf delete`` of
    a bare id that several trials share said there is no such trial (found by new users)."""
    first, second, later = _twice_in_a_stage(tmp_path / "store")
    root = str(tmp_path / "store")
    named = "'x' is the Tune id of 3 trials in sweep; name one: ['exp_a/x#4', 'exp_a/x#14', 'exp_b/x']"
    for command in (["delete", "x", "--yes"], ["undelete", "x"], ["show", "x"]):
        assert main([*command, "--store", root]) == 2
        assert named in capsys.readouterr().err
    for wrong, said in ((["x", "f0"], named), ("nosuch", "Unknown trial(s) ['nosuch']")):
        with pytest.raises(RayCmfError, match=re.escape(said)):  # dropped without a word, a report lacked them
            Sweep(root).only(wrong)
    assert Sweep(root).only("f0").trials()["trial_id"].tolist() == ["f0"]
    assert main(["show", "x\udcff", "--store", root]) == 2  # a name no trial can have (it crashed, exit 1)
    assert "Unknown trial(s) ['x\\udcff']" in capsys.readouterr().err
    Sweep(tmp_path / "store").delete([first, later])
    assert main(["show", "x", "--store", root]) == 2
    said = capsys.readouterr().err
    assert f"3 trials in sweep (2 of them deleted): name the one this sweep shows, {second!r}" in said, said
    with pytest.raises(RayCmfError) as refused:
        Sweep(tmp_path / "store").config("x")
    assert str(refused.value) == (
        f"'x' is the Tune id of 3 trials in sweep (2 of them deleted): name the one this sweep shows, {second!r}"
    )
    Sweep(tmp_path / "store").delete(second)
    with pytest.raises(RayCmfError, match=r"'x' is the Tune id of 3 trials in sweep, all deleted: read them with"):
        Sweep(tmp_path / "store").config("x")


@given(st.lists(st.text(), min_size=1, max_size=8), st.lists(st.integers(0, 10**20), min_size=1, max_size=8))
@example(ids=["110f9_00002", "13a05_00002", "a#", "a#١٢", "#"], numbers=[4, 14])
def test_trial_ids_order_as_text_but_execution_ids_as_numbers(ids: list[str], numbers: list[int]) -> None:
    """Any trial ids sort: as text (Tune's, whose hex prefix a number-aware order misread: ``13a05_00002``
    came before ``110f9_00002``, found by a new user), and a name's ``#<execution id>`` as a number."""
    from ray_cmf.frames import trial_order

    tune_ids = [i for i in ids if "#" not in i]
    assert [i for i in sorted(ids, key=trial_order) if "#" not in i] == sorted(tune_ids)
    assert sorted([f"exp/x#{n}" for n in numbers], key=trial_order) == [f"exp/x#{n}" for n in sorted(numbers)]


def test_show_names_only_the_series_a_trial_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``show`` of a trial that reported nothing (only resource samples) said "(also: --metrics-name
    ['tune_results'])", a series the trial has no rows of (found by a new user)."""
    root = tmp_path / "store"
    write_trials(root, [Trial("busy", {}, {"": _rows(1.0)})])
    write_trials(root, [Trial("quiet", {}, {"": [{"step": 1, "cpu": 3.0}]})], metrics_name="system_metrics")
    for name in ("a_series", "b_series"):
        write_trials(root, [Trial("two", {}, {"": [{"step": 1, "x": 1.0}]})], metrics_name=name)
    assert main(["show", "quiet", "--store", str(root)]) == 0
    said = capsys.readouterr().err
    assert "the last rows are of series 'system_metrics'" in said and "also" not in said, said
    assert main(["show", "two", "--store", str(root)]) == 0
    said = capsys.readouterr().err
    assert "the last rows are of series 'a_series'; it also has rows of 'b_series' (--metrics-name)" in said, said


def test_curating_a_run_needs_no_series_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tags, notes and deletion are the execution's, in MLMD alone, but ``ray-cmf tag`` of a cmflib-API run
    that logged two series refused without ``--metrics-name`` ("No series of Tune results ...; name one of
    them"), where one series worked (found by a new user)."""
    cmf = Cmf(pipeline_name="p", store=tmp_path / "store")
    cmf.create_execution("Train", {"lr": 0.1})
    for name in ("s", "t"):
        cmf.log_metric(name, {"step": 1, "x": 1.0})
        cmf.commit_metrics(name)
    cmf.close()
    root = str(tmp_path / "store")
    [trial] = Sweep(root, "p", metrics_name="s").trials()["trial_id"]
    for command in (["tag", trial, "team=vision"], ["note", trial, "baseline"], ["delete", trial, "--yes"]):
        assert main([*command, "--store", root]) == 0, capsys.readouterr().err
    assert main(["undelete", trial, "--store", root]) == 0, capsys.readouterr().err
    [row] = Sweep(root, "p", metrics_name="t").trials().to_dict("records")
    assert (row["tag/team"], row["note"]) == ("vision", "baseline")
    assert main(["delete", "--where", "x_best > 0", "--store", root, "--yes"]) == 2  # a metric: of which series?
    assert "name one of them" in capsys.readouterr().err


def test_a_trial_whose_file_is_absent_says_how_to_get_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A team store's trial whose file another machine never pushed read "cannot read ... ([Errno 2] No such
    file or directory)": nothing said where it is or what brings it (found by a new user)."""
    from ray_cmf.versioning import cache_path

    store = write_trials(tmp_path / "store", [Trial("here", {}, {"": _rows(1.0)}), Trial("away", {}, {"": _rows(2.0)})])
    [away] = [f for f in Sweep(store).files() if f.trial_id == "away"]
    for path in {away.path, store.resolve(away.url), cache_path(store.root, away.md5)}:
        path.unlink()  # never pushed from the machine that wrote it: neither here nor in the cache
    table = Sweep(store).trials().set_index("trial_id")
    assert table.at["here", "steps"] == 5 and table.at["away", "steps"] == 0
    assert "skipping trial away: its file" in caplog.text and "`ray-cmf push`" in caplog.text


def test_a_store_read_by_its_mlmd_file_alone_names_every_trial_skipped_and_the_store_holding_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Cmf(filepath="X/mlmd.sqlite")`` keeps its files in ``./cmf_store`` (cmflib's filepath names the MLMD file
    only). Read as ``Sweep("X")``, the first trial was said skipped, and the others, whose series held the same
    content (one file), read as empty unsaid; nothing named the store that holds the files (a new user)."""
    monkeypatch.chdir(tmp_path)
    for run in ("first", "second"):
        cmf = Cmf(filepath="X/mlmd.sqlite", pipeline_name="p")
        cmf.create_context(pipeline_stage="train")
        cmf.create_execution(execution_type=run)
        cmf.log_metric("m", {"step": 1, "loss": 0.5})
        cmf.commit_metrics("m")
        cmf.close()
    table = Sweep("X", "p", metrics_name="m").trials()
    assert list(table["steps"]) == [0, 0]
    [said] = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert all(trial in said for trial in table["trial_id"]), said
    assert f"committed into the store {tmp_path / 'cmf_store'}" in said, said
    assert len(Sweep(tmp_path / "cmf_store", "p", metrics_name="m").steps()) == 2  # the store it names reads them
    cli = [sys.executable, "-m", "ray_cmf.cli", "--store", "X", "trials"]
    said = subprocess.run(cli, capture_output=True, text=True, check=True).stderr
    assert said.startswith("ray_cmf: skipping trial"), said  # it read "WARNING:ray_cmf.compare:ray_cmf: skipping"


def test_gc_refuses_while_a_writer_runs_on_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = write_trials(
        tmp_path / "store",
        [Trial("done", {}, {"": _rows(1.0)}), Trial("live", {}, {"": _rows(1.0)}, status="RUNNING")],
    )
    Sweep(store.root).delete(["done"])
    with pytest.raises(StoreError, match=r"being written: 1 execution running \(live \(pid"):
        collect(store)
    assert main(["gc", "--store", str(store.root)]) == 2
    assert "is being written" in capsys.readouterr().err
    dry = collect(store, dry_run=True)  # a dry run only reads, and says the real gc would be refused
    assert dry.files and dry.refused is not None and "being written" in dry.refused
    assert main(["gc", "--store", str(store.root), "--dry-run"]) == 0
    assert "a gc now would be refused: the store" in capsys.readouterr().err
    code, said = _cli(capsys, "gc", "--store", str(store.root), "--dry-run")
    assert code == 0 and "being written" in said["refused"]
    assert collect(store, dry_run=True, force=True).refused is None


def test_a_gc_killed_half_way_leaves_a_store_verify_accepts_and_a_second_gc_finishes(tmp_path: Path) -> None:
    trials = [Trial(f"t{i:03d}", {"i": i}, {"": _rows(float(i + 1), steps=3)}) for i in range(120)]
    store = write_trials(tmp_path / "store", trials)
    Sweep(store.root).delete([t.trial_id for t in trials[:-1]])
    files = sorted((store.root / "artifacts").rglob("*.parquet"))
    gc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_GC, str(store.root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while all(f.exists() for f in files) and time.monotonic() < deadline and gc.poll() is None:
        time.sleep(0.005)
    os.kill(gc.pid, signal.SIGKILL)
    gc.wait()
    left = [f for f in files if f.exists()]
    assert 1 < len(left) < len(files), "the gc was not interrupted half-way"
    assert main(["verify", "--store", str(store.root)]) == 0  # files marked for deletion are not checked
    freed = collect(store)
    assert [f for f in files if f.exists()] == [files[-1]] and len(freed.files) >= len(left) - 1
    assert main(["verify", "--store", str(store.root)]) == 0
    assert list(Sweep(store.root).trials()["trial_id"]) == ["t119"]


# Every removal of the gc in the child takes a millisecond, so that the parent's SIGKILL lands half-way.
_SLOW_GC = """
import sys, time
from pathlib import Path
from ray_cmf import Store
from ray_cmf.cleanup import collect
unlink = Path.unlink
def slow_unlink(self, missing_ok=False):
    time.sleep(0.01)
    unlink(self, missing_ok=missing_ok)
Path.unlink = slow_unlink
collect(Store(sys.argv[1]))
"""


# -- grouping and smoothing ------------------------------------------------------------------------------
def _seeded(store_dir: Path) -> Store:
    """Two optimizers, three seeds each; seed 2 of sgd diverged (an inf at its end) and another failed."""
    trials = []
    for opt, scale in (("adam", 1.0), ("sgd", 2.0)):
        for seed in range(3):
            rows = [{"training_iteration": i + 1, "loss": scale * (seed + 1) / (i + 1)} for i in range(20)]
            if opt == "sgd" and seed == 2:
                rows[-1]["loss"] = math.inf
            status = "FAILED" if (opt, seed) == ("adam", 2) else "COMPLETE"
            trials.append(Trial(f"{opt}-{seed}", {"opt": opt, "seed": seed}, {"": rows}, status=status))
    return write_trials(store_dir, trials)


def test_group_by_gives_each_groups_mean_and_std_of_every_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _seeded(tmp_path / "store")
    trials = Sweep(store).trials()
    for group_by in ("config/opt", "config except seed"):
        groups = Sweep(store).trials(group_by=group_by, sort="loss_best").set_index("group")
        assert list(groups.index) == ["opt=adam", "opt=sgd"] and list(groups["trials"]) == [3, 3]
        for opt in ("adam", "sgd"):
            mine = trials[trials["config/opt"] == opt]
            for column in ("loss_best", "loss_final", "steps"):
                values = mine[column].astype(float)
                finite = values[np.isfinite(values)]  # sgd-2's final is inf: the mean is over finite values
                row = groups.loc[f"opt={opt}"]
                assert row[f"{column}_mean"] == pytest.approx(finite.mean())
                assert row[f"{column}_std"] == pytest.approx(finite.std()) or finite.std() != finite.std()
        assert groups.loc["opt=adam", "status"] == "2 COMPLETE, 1 FAILED"
        assert groups.loc["opt=sgd", "trial_ids"] == ["sgd-0", "sgd-1", "sgd-2"]
    code, rows = _cli(capsys, "trials", "--store", str(store.root), "--group-by", "config/opt", "--metric", "loss")
    assert code == 0 and [r["group"] for r in rows] == ["opt=adam", "opt=sgd"] and "loss_best_mean" in rows[0]
    assert main(["trials", "--store", str(store.root), "--group-by", "opt"]) == 2
    assert "group_by 'opt' is not a column" in capsys.readouterr().err


def test_a_nan_config_value_is_a_group_of_its_own_apart_from_trials_without_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN is a value (``--where 'config/eps == nan'`` finds it), not a missing one: grouping kept it with the
    trials that lack the key, under ``eps=`` and null."""
    from tests._stores import Trial, write_trials

    rows = [{"training_iteration": 1, "loss": 1.0}]
    configs = [{"eps": math.nan}, {"eps": math.nan}, {}, {"eps": 0.1}]
    store = write_trials(tmp_path / "store", [Trial(f"t{i}", c, {"": rows}) for i, c in enumerate(configs)])
    groups = Sweep(store).trials(group_by="config/eps").set_index("group")
    assert groups["trials"].to_dict() == {"eps=nan": 2, "eps=": 1, "eps=0.1": 1}
    assert math.isnan(groups.loc["eps=nan", "config/eps"]) and groups.loc["eps=", "config/eps"] is None
    code, out = _cli(capsys, "trials", "--store", str(store.root), "--group-by", "config/eps")
    assert code == 0 and {r["group"]: r["config/eps"] for r in out} == {"eps=nan": "NaN", "eps=": None, "eps=0.1": 0.1}


def test_groups_come_best_first_as_trials_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trials`` without ``--metric`` lists trials best first by the metric the sweep ranked by; with
    ``--group-by`` the groups came in the order of their first trials, so ``--limit 1`` gave the first
    optimizer tried, not the best (found by a new user)."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY
    from tests._stores import Trial, write_trials

    ranked = {RANKED_BY_PROPERTY: "acc", RANKED_MODE_PROPERTY: "max"}
    accs = {"adam": 0.7, "sgd": 0.5, "rmsprop": 0.9}
    trials = [
        Trial(f"{opt}-{seed}", {"opt": opt, "seed": seed}, {"": [{"training_iteration": 1, "acc": acc}]}, props=ranked)
        for opt, acc in accs.items()
        for seed in range(2)
    ]
    store = write_trials(tmp_path / "store", trials)
    code, rows = _cli(capsys, "trials", "--store", str(store.root), "--group-by", "config/opt")
    assert code == 0 and [r["group"] for r in rows] == ["opt=rmsprop", "opt=adam", "opt=sgd"]
    code, rows = _cli(capsys, "trials", "--store", str(store.root), "--group-by", "config/opt", "--limit", "1")
    assert code == 0 and [r["group"] for r in rows] == ["opt=rmsprop"]


def test_mode_without_metric_ranks_the_table_it_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trials --mode max`` of a sweep ranked by the min: the table's ``acc_best`` was each trial's highest, but
    it was sorted lowest first under the header "best first", so ``--limit 1`` gave the worst (a new user)."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY
    from tests._stores import Trial, write_trials

    ranked = {RANKED_BY_PROPERTY: "acc", RANKED_MODE_PROPERTY: "min"}
    accs = {"a": [0.7, 0.1], "b": [0.5], "c": [0.9, 0.2], "d": [math.nan]}
    steps = {k: [{"training_iteration": i + 1, "acc": v} for i, v in enumerate(vs)] for k, vs in accs.items()}
    trials = [Trial(k, {"k": k}, {"": rows}, props=ranked) for k, rows in steps.items()]
    store = write_trials(tmp_path / "store", trials)
    for group in ([], ["--group-by", "config/k"]):
        for mode, order in ((["--mode", "max"], ["c", "a", "b", "d"]), ([], ["a", "c", "b", "d"])):
            code, rows = _cli(capsys, "trials", "--store", str(store.root), *mode, *group)
            assert code == 0 and [r["group" if group else "trial_id"][-1] for r in rows] == order, (mode, group)


def test_an_empty_text_and_a_text_that_reads_as_a_number_are_groups_of_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--group-by`` took a config (or tag) of "" and trials without the key for one group, labelled
    ``team=`` and shown as "" (found by a new user); the text "1" and the number 1 were one group too."""
    from tests._stores import Trial, write_trials

    rows = [{"training_iteration": 1, "loss": 1.0}]
    configs = [{"team": ""}, {}, {}, {"team": "vision"}, {"team": 1}, {"team": "1"}]
    store = write_trials(tmp_path / "store", [Trial(f"t{i}", c, {"": rows}) for i, c in enumerate(configs)])
    groups = Sweep(store).trials(group_by="config/team").set_index("group")
    assert groups["trials"].to_dict() == {'team=""': 1, "team=": 2, "team=vision": 1, "team=1": 1, 'team="1"': 1}
    assert groups.loc['team=""', "config/team"] == "" and groups.loc["team=", "config/team"] is None
    assert groups.loc['team="1"', "config/team"] == "1" and groups.loc["team=1", "config/team"] == 1


def test_a_list_and_the_text_of_a_list_are_groups_of_their_own_and_read_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A list config is a cell of its JSON text, so ``x=[1, 2]`` and ``x="[1, 2]"`` made one group, under
    ``--group-by config/x`` and ``config except seed`` alike (two configs folded into one row), and the
    table showed both as ``[1, 2]`` (found by a new user). ``--where`` still matches a list by its text."""
    rows = [{"training_iteration": 1, "loss": 1.0}]
    configs = [{"x": [1, 2], "seed": 0}, {"x": "[1, 2]", "seed": 1}, {"x": [1, 2], "seed": 2}, {"x": [{"a": 1}]}]
    configs.append({"x": '[{"a": 1}]'})
    store = write_trials(tmp_path / "store", [Trial(f"t{i}", c, {"": rows}) for i, c in enumerate(configs)])
    for group_by in ("config/x", "config except seed"):
        groups = Sweep(store).trials(group_by=group_by).set_index("group")
        assert groups["trial_ids"].to_dict() == {
            "x=[1, 2]": ["t0", "t2"],
            'x="[1, 2]"': ["t1"],
            'x=[{"a": 1}]': ["t3"],
            'x="[{\\"a\\": 1}]"': ["t4"],
        }
    code, rows = _cli(capsys, "trials", "--store", str(store.root), "--group-by", "config/x")
    assert code == 0 and {r["group"]: r["config/x"] for r in rows} == {  # --json: the list itself, or the text
        "x=[1, 2]": [1, 2],
        'x="[1, 2]"': "[1, 2]",
        'x=[{"a": 1}]': [{"a": 1}],
        'x="[{\\"a\\": 1}]"': '[{"a": 1}]',
    }
    where = Sweep(store).trials(where='config/x == "[1, 2]"')
    assert list(where["trial_id"]) == ["t0", "t1", "t2"]  # as the README has it: a list is its JSON text there
    assert main(["trials", "--store", str(store.root)]) == 0
    lines = [line.split("│")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    shown = {cells[0].strip(): cells[3].strip() for cells in lines}  # trial_id, status, config/seed, config/x
    assert shown == {"t0": "[1, 2]", "t1": '"[1, 2]"', "t2": "[1, 2]", "t3": '[{"a": 1}]', "t4": '"[{\\"a\\": 1}]"'}


def test_one_number_is_one_group_whether_it_was_logged_as_an_int_or_a_float(tmp_path: Path) -> None:
    """``lr`` of 1 in one trial and 1.0 in another made two groups, where ``diff`` and ``--where`` call them
    the same value (found by a new user); a bool stays apart from the number, as ``diff`` has it."""
    rows = [{"training_iteration": 1, "loss": 1.0}]
    configs = [{"学习率": 1}, {"学习率": 1.0}, {"学习率": -0.0}, {"学习率": 0}, {"学习率": True}, {"学习率": 2.5}]
    store = write_trials(tmp_path / "store", [Trial(f"t{i}", c, {"": rows}) for i, c in enumerate(configs)])
    groups = Sweep(store).trials(group_by="config/学习率").set_index("group")
    assert groups["trial_ids"].to_dict() == {
        "学习率=1": ["t0", "t1"],
        "学习率=0": ["t2", "t3"],
        "学习率=True": ["t4"],
        "学习率=2.5": ["t5"],
    }


def test_the_grouped_report_draws_means_with_a_band_and_smooths_on_the_page(tmp_path: Path, browser: Any) -> None:
    from tests._browser import open_report, screenshot

    store = _seeded(tmp_path / "store")
    path = Sweep(store).report(tmp_path / "grouped.html", group_by="config/opt")
    page, _, errors = open_report(browser, path.as_uri(), offline=True)
    assert [r.get_attribute("data-trial") for r in page.locator("#trials tbody tr").all()] == ["opt=adam", "opt=sgd"]
    assert "±" in page.locator("#trials tbody tr").first.inner_text()

    def curve(name: str) -> list[float]:
        return page.evaluate(f"document.getElementById('curve-0').data.filter(t => t.name === {json.dumps(name)})[0].y")

    def visible_bands() -> list[str]:
        script = "document.getElementById('curve-0').data.filter(t => t.visible !== false && t.legendgroup)"
        return sorted(set(page.evaluate(f"{script}.map(t => t.legendgroup)")))

    adam = [sum(s * 1.0 / (i + 1) for s in (1, 2, 3)) / 3 for i in range(20)]  # the mean of its 3 seeds
    assert curve("opt=adam") == pytest.approx(adam)
    assert visible_bands() == ["band-minmax"]
    page.select_option("#band", "band-std")
    assert visible_bands() == ["band-std"]
    page.locator("#smoothing").fill("0.9")
    smoothed = curve("opt=adam")
    assert smoothed[0] == pytest.approx(adam[0]) and smoothed[5] > adam[5]  # a decreasing curve lags behind
    screenshot(page, "report-grouped-smoothed.png")
    page.locator("#smoothing").fill("0")
    assert curve("opt=adam") == pytest.approx(adam)
    assert errors == []


_CONFIG_VALUES = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 1e-3, -2.5]), st.sampled_from(["a", "é", "b"]))


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    configs=st.lists(
        st.fixed_dictionaries({"n": st.integers(-3, 3)}, optional={"mixed": _CONFIG_VALUES, "word": _WORDS}),
        min_size=1,
        max_size=5,
    ),
    data=st.data(),
)
def test_where_on_a_real_store_of_mixed_configs_agrees_with_pandas(
    tmp_path_factory: pytest.TempPathFactory, configs: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Trials whose configs mix ints, floats and text under one key, or lack it; a query that MLMD answers
    alone (before any footer is read) and one over summaries pick what pandas picks from the whole table."""
    configs[0] = {"mixed": "a", "word": "b", **configs[0]}  # every key queried is some trial's (else: an error)
    trials = [Trial(f"t{i}", config, {"": _rows(float(i + 1))}) for i, config in enumerate(configs)]
    store = write_trials(tmp_path_factory.mktemp("store"), trials)
    table = Sweep(store).trials()
    literal = data.draw(_CONFIG_VALUES)
    text = json.dumps(literal, ensure_ascii=False) if isinstance(literal, str) else repr(literal)
    op = data.draw(st.sampled_from(["==", "!="]))
    number = data.draw(st.integers(-3, 3))
    for ours, theirs in (
        (f"config/mixed {op} {text} or config/n > {number}", f"`config/mixed` {op} {text} or `config/n` > {number}"),
        (
            f"config/word in ['a', 'é'] and loss_best < {number + 3}",
            f"`config/word` in ['a', 'é'] and `loss_best` < {number + 3}",
        ),
    ):
        expected = list(table.query(theirs, engine="python")["trial_id"])
        assert list(Sweep(store).trials(where=ours)["trial_id"]) == expected, ours


def test_a_query_that_keeps_no_trial_gives_an_empty_table_with_every_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _sweep(tmp_path / "store")
    for where in ("config/layers > 100", "loss_best < -1"):
        table = Sweep(store).trials(where=where, sort="loss_best")
        assert len(table) == 0 and {"trial_id", "status", "config/lr", "steps"} <= set(table.columns)
        code, rows = _cli(capsys, "trials", "--store", str(store.root), "--where", where, "--sort", "loss_best")
        assert code == 0 and rows == []


def test_what_a_new_user_ran_into_says_what_happened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by trying the features as a new user: each answer names what happened."""
    store = _sweep(tmp_path / "store")
    root = str(store.root)
    assert main(["report", "--store", root, "--where", "steps < 0", "-o", str(tmp_path / "r.html")]) == 2
    assert "--where 'steps < 0' keeps no trial" in capsys.readouterr().err
    assert main(["compare", "--store", root, "--metric", "loss", "--where", "steps < 0"]) == 2
    assert "keeps no trial" in capsys.readouterr().err

    Sweep(root).delete("c")  # one id, not its characters
    assert main(["tag", "c", "team=x", "--store", root]) == 2  # deleted trials leave every command
    assert "'c' is deleted" in capsys.readouterr().err
    assert main(["tag", "c", "team=x", "--store", root, "--include-deleted"]) == 0
    assert "tag/team" in capsys.readouterr().out
    assert main(["delete", "c", "--store", root, "--yes"]) == 2
    assert "['c'] are already deleted" in capsys.readouterr().err
    assert main(["undelete", "a", "--store", root]) == 2
    assert "['a'] are not deleted" in capsys.readouterr().err
    assert main(["show", "c", "--store", root]) == 2
    assert "it is deleted: pass --include-deleted" in capsys.readouterr().err
    code, shown = _cli(capsys, "show", "c", "--store", root, "--include-deleted")
    assert code == 0 and shown["deleted_at"]

    assert collect(store).trials == [("sweep", "c")]
    code, again = _cli(capsys, "gc", "--store", root)
    assert code == 0 and again["trials"] == 0 and again["files"] == 0  # nothing left to free
    code, shown = _cli(capsys, "show", "c", "--store", root, "--include-deleted")
    assert [f["freed"] for f in shown["files"] if f["type"] == "Step_Metrics"] == [True]

    Sweep(root).tag("b", team="vision")
    code, groups = _cli(capsys, "trials", "--store", root, "--group-by", "tag/team")
    assert {g["group"]: g["tag/team"] for g in groups} == {"team=": None, "team=vision": "vision"}
    assert {g["group"]: g["status"] for g in groups}["team=vision"] == "1 COMPLETE"
    assert main(["trials", "--store", root, "--group-by", "config except nope"]) == 2
    assert "['config/nope'] are not config keys" in capsys.readouterr().err
    assert (
        main(["plot", "--store", root, "--metric", "loss", "--color-by", "config/lr", "-o", str(tmp_path / "p.png")])
        == 0
    )


def test_commands_refuse_what_they_cannot_do_as_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a new user: each of these exited 0, doing something else than asked."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY

    typo = tmp_path / "typo" / "cmf_stor"  # recover after a crash, on a mistyped path: "none recovered"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a store")
    for command in (["recover"], ["gc"], ["trials"]):
        assert main([*command, "--store", str(typo)]) == 2  # it said "No MLMD database at .../mlmd.sqlite"
        assert f"{typo} is not a store (no such directory)" in capsys.readouterr().err
        assert main([*command, "--store", str(a_file)]) == 2
        assert f"{a_file} is not a store (a file)" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()  # nor did it make a store there

    store = _sweep(tmp_path / "store")
    root = str(store.root)
    Sweep(root).delete("c")
    assert main(["note", "c", "why", "--store", root]) == 2
    assert "'c' is deleted" in capsys.readouterr().err
    assert main(["note", "c", "why", "--store", root, "--include-deleted"]) == 0
    capsys.readouterr()
    Sweep(root).tag("a", team="x")
    assert main(["tag", "a", "prio=1", "--remove", "tem", "--store", root]) == 2  # a typo: nothing is changed
    assert "has no tag 'tem' to remove; its tags: ['team']" in capsys.readouterr().err
    assert Sweep(root).config("a") and Sweep(root).trials(metrics=[]).set_index("trial_id").loc["a", "tag/team"] == "x"
    assert "tag/prio" not in Sweep(root).trials(metrics=[]).columns

    assert main(["show", "a", "--metric", "los", "--store", root]) == 2  # was ignored: every column shown
    assert "los" in capsys.readouterr().err
    code, shown = _cli(capsys, "show", "a", "--metric", "loss", "--store", root)
    assert code == 0 and {k for row in shown["last_rows"] for k in row} == {"trial_id", "step", "loss"}
    rows = [[{"step": 1, "loss": v, "acc": v / 10}] for v in (1.0, 2.0)]
    pair = str(write_trials(tmp_path / "pair", [Trial(t, {}, {"": r}) for t, r in zip("xy", rows, strict=True)]).root)
    code, differs = _cli(capsys, "diff", "x", "y", "--metric", "acc", "--store", pair)  # was ignored
    assert code == 0 and {row["field"] for row in differs} == {"acc_best", "acc_final"}

    assert main(["plot", "--store", root, "--metric", "loss", "-o", str(tmp_path / "c.jpg")]) == 2  # held a PNG
    assert ".png, .svg or .pdf" in capsys.readouterr().err and not (tmp_path / "c.jpg").exists()
    assert main(["plot", "--store", root, "--metric", "loss", "-o", str(tmp_path / "c.svg")]) == 0
    assert "<svg" in (tmp_path / "c.svg").read_text()

    for stage, mode in (("sweep_min", "min"), ("sweep_max", "max")):  # two sweeps rank `score` both ways
        ranked = {RANKED_BY_PROPERTY: "score", RANKED_MODE_PROPERTY: mode}
        rows = [{"step": 1, "score": 1.0}, {"step": 2, "score": 2.0}]
        write_trials(tmp_path / "two", [Trial(f"t_{mode}", {}, {"": rows}, props=ranked)], stage=stage)
    two = str(tmp_path / "two")
    for command in (["show", "t_min"], ["tag", "t_min", "k=v"], ["note", "t_min", "n"], ["trials", "--metric", "x"]):
        caplog.clear()
        assert main([*command, "--store", two]) == (2 if command[0] == "trials" else 0)
        assert "both ways" not in caplog.text, command  # they rank nothing by it
    caplog.clear()
    assert main(["trials", "--store", two]) == 0
    assert "rank 'score' both ways" in caplog.text


def test_json_rows_keep_their_keys_whatever_the_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trials --json`` left out the columns that the kept trials have empty (``error``, ``note``), so a
    program's keys changed with ``--where`` (found by a new user)."""
    store = _sweep(tmp_path / "store")
    root = str(store.root)
    Sweep(root).note("c", "diverged")
    _, every = _cli(capsys, "trials", "--store", root)
    _, some = _cli(capsys, "trials", "--store", root, "--where", 'status == "COMPLETE"')
    assert {"note", "error", "recovered"} <= set(every[0]) and [set(row) for row in some] == [set(every[0])] * 3
    _, best = _cli(capsys, "compare", "--store", root, "--metric", "loss", "--top", "1")
    assert set(best[0]) >= {"note", "error", "recovered"}


def test_options_may_come_between_the_trial_and_its_tags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ray-cmf tag a --store S team=x`` exited 2 ("unrecognized arguments: team=x"): argparse ends a list
    positional at the first option. The words after an option now join the list, for ``tag`` and ``delete``;
    an unknown option is still refused."""
    root = str(_sweep(tmp_path / "store").root)
    assert main(["tag", "a", "--store", root, "team=x", "prio=1"]) == 0
    assert main(["delete", "b", "--store", root, "c", "--yes"]) == 0
    table = Sweep(root).everyone().trials().set_index("trial_id")
    assert table.loc["a", "tag/team"] == "x" and table.loc["a", "tag/prio"] == "1"
    assert sorted(Sweep(root).trials()["trial_id"]) == ["a", "d"]
    with pytest.raises(SystemExit) as exited:
        main(["tag", "a", "--store", root, "team=y", "--colour", "red"])
    assert exited.value.code == 2 and "--colour" in capsys.readouterr().err


def _on_a_terminal(argv: list[str], columns: int = 80, answer: tuple[bytes, bytes] | None = None) -> tuple[int, str]:
    """``ray-cmf argv`` run on a terminal ``columns`` wide (``answer``: once its first text shows, type its
    second): its exit code and what it printed, without colours."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(COLUMNS=str(columns), LINES="50")
        os.execv(sys.executable, [sys.executable, "-m", "ray_cmf.cli", *argv])
    output = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child ended: its side of the terminal closed
            break
        if not chunk:
            break
        output += chunk
        if answer is not None and answer[0] in output:
            os.write(fd, answer[1])
            answer = None
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", output.decode()).replace("\r", "")


def test_a_table_wider_than_the_terminal_shows_every_value_whole(tmp_path: Path) -> None:
    """On a terminal narrower than a table, every trial id read ``d0988`` and 1.79847e-08 read ``1.7984``
    (``1.`` at 40 columns), with nothing marking the cut: rich shrank the columns to fit (a new user). A table
    now keeps its width (the terminal wraps its lines), so each value shows whole."""
    ids = [f"d0988_{i:05d}" for i in range(3)]
    store = write_trials(
        tmp_path / "store",
        [Trial(t, {"lr": 0.01 * (i + 1)}, {"": _rows(1.79847e-08 * (i + 1))}) for i, t in enumerate(ids)],
    )
    code, out = _on_a_terminal(["trials", "--store", str(store.root)], columns=40)
    assert code == 0, out
    lines = " ".join(out.split())  # the terminal's own line breaks mean nothing
    assert all(t in lines for t in ids) and "3.59694e-09" in lines and "1.07908e-08" in lines, out


def test_output_a_command_cannot_write_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report -o /proc/nope.html`` (and plot, export) ended in a traceback naming a temporary file beside it
    (a new user): the path given is refused, named, with exit 2."""
    store = str(_sweep(tmp_path / "store").root)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, where a directory is needed")  # no directory can be made under it
    for command, name in ((["report"], "r.html"), (["export"], "e.csv"), (["plot", "--metric", "loss"], "p.png")):
        target = str(blocked / "sub" / name)
        assert main([*command, "--store", store, "-o", target]) == 2
        assert f"cannot write {target}" in capsys.readouterr().err


def test_serve_says_why_it_cannot_listen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port in use, or one beyond 65535, ended ``serve`` in a traceback (a new user)."""
    import socket

    store = str(_sweep(tmp_path / "store").root)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--store", store, "--port", str(port)]) == 2
        assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["serve", "--store", store, "--port", "99999"]) == 2
    assert "cannot serve on 127.0.0.1:99999" in capsys.readouterr().err


def test_show_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """``ray-cmf show T | head -1`` exited 1, silently, where every other command ends 0 (a new user): rich's
    console exits 1 itself when its reader goes."""
    store = str(_sweep(tmp_path / "store").root)
    command = f"{sys.executable} -m ray_cmf.cli show a --store {store} --rows 50 | head -c 10; exit ${{PIPESTATUS[0]}}"
    for _ in range(3):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_ctrl_c_ends_a_command_with_a_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a long ``export`` printed a whole KeyboardInterrupt traceback (a new user)."""
    import ray_cmf.cli

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_cmf.cli, "cmd_export", interrupted)
    store = str(_sweep(tmp_path / "store").root)
    assert main(["export", "--store", store, "-o", str(tmp_path / "out.csv")]) == 130
    assert capsys.readouterr().err == "ray-cmf export: interrupted\n"


def test_a_tag_given_twice_with_two_values_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tag T a=1 a=2`` kept the last value without a word (a new user)."""
    store = str(_sweep(tmp_path / "store").root)
    assert main(["tag", "a", "team=x", "team=y", "--store", store]) == 2
    assert "tag 'team' is given twice, as 'x' and 'y'" in capsys.readouterr().err
    assert "tag/team" not in Sweep(store).trials().columns


def test_show_names_the_train_runs_inside_a_trial_with_their_state_error_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial that caught its TorchTrainer's failure read COMPLETE everywhere; its run's FAILED, its error and
    its ``train_loop_config`` (keys the trial's config lacks) were in the store only: no reader showed them
    (a new user)."""
    from ray_cmf.binding import SeriesKey
    from ray_cmf.client import WriterClient
    from ray_cmf.constants import RUN_EXECUTION_TYPE, TRIAL_PROPERTY
    from ray_cmf.lineage import config_properties
    from ray_cmf.writer import StoreWriter

    store = write_trials(tmp_path / "store", [Trial("t", {"lr": 0.1}, {"": _rows(1.0)})])
    client = WriterClient(StoreWriter(store))
    trial = client.call(StoreWriter.binding, kind="trial", name="t")
    binding = client.call(
        StoreWriter.bind,
        kind="run",
        name="train@t",
        pipeline="sweep",
        stage="exp",
        type_name=RUN_EXECUTION_TYPE,
        props={TRIAL_PROPERTY: "t", "run_name": "train", **config_properties({"lr": 0.1, "layers": 4})},
        trial=trial,
    )
    key = SeriesKey(binding, "train_steps")
    buffer = MetricBuffer(sink=client.sink(key))
    buffer.append({"step": 1, "loss": 0.5})
    buffer.close()
    client.call(StoreWriter.commit, key=key)
    error = "rank 1: RuntimeError: boom"
    client.call(StoreWriter.end, binding=binding, props={"status": "FAILED", "error": error}, state="FAILED")
    code, shown = _cli(capsys, "show", "t", "--store", str(store.root))
    assert code == 0 and shown["status"] == "COMPLETE"
    assert shown["runs"] == [{"run": "train", "status": "FAILED", "error": error, "config": {"lr": 0.1, "layers": 4}}]
    assert main(["show", "t", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "train run train: FAILED  rank 1: RuntimeError: boom" in out and "layers=4" in out, out


def test_an_output_through_a_link_is_written_where_it_points_and_a_device_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report -o link.html`` replaced the symlink with a file (its target stayed empty), and, as root,
    ``-o /dev/full`` and ``-o /dev/stdout`` replaced the device and the link in /dev (a new user): the
    atomic write renamed its file over whatever the path was."""
    store = str(_sweep(tmp_path / "store").root)
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "real" / "steps.csv")
    assert main(["export", "--store", store, "-o", str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "real" / "steps.csv").read_text().startswith("trial_id")
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "nowhere" / "steps.csv")
    assert main(["export", "--store", store, "-o", str(dangling)]) == 2  # it made the directories it points into
    assert "in a directory that does not exist" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["report", "--store", store, "-o", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err and fifo.is_fifo()


def test_an_output_under_a_file_names_the_file_in_the_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``export -o notes.txt/steps.csv``, where ``notes.txt`` is a file, said only "File exists" (a new user)."""
    store = str(_sweep(tmp_path / "store").root)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["export", "--store", store, "-o", str(tmp_path / "notes.txt" / "steps.csv")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'notes.txt'} is a file, not a directory" in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    for command in ("export", "report", "plot"):  # "-o '' is a directory", "--format is needed"
        with pytest.raises(SystemExit) as usage:
            main([command, "--store", store, "-o", ""])
        assert usage.value.code == 2 and "needs a file name, got ''" in capsys.readouterr().err


def test_a_tag_both_set_and_removed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(_sweep(tmp_path / "store").root)
    assert main(["tag", "a", "team=x", "--remove", "team", "--store", store]) == 2
    assert "tag 'team' is both set (team=x) and removed" in capsys.readouterr().err


def test_ctrl_d_at_the_delete_prompt_is_no(tmp_path: Path) -> None:
    """Ctrl-D (end of input) at ``delete``'s ``[y/N]`` printed an EOFError traceback (a new user)."""
    store = _sweep(tmp_path / "store")
    code, out = _on_a_terminal(["delete", "a", "--store", str(store.root)], answer=(b"[y/N]", b"\x04"))  # Ctrl-D
    assert code == 1 and "Traceback" not in out, out
    assert "nothing changed" in out and len(Sweep(store.root).trials()) == 4
