"""Property-based round trip: log_metric -> commit_metrics -> read_metrics gives back every value exactly.

Names are unicode, long or reserved; values are ints near the int64 bounds (and beyond), floats with NaN,
infinities, -0.0 and subnormals, bools and None; column sets change from row to row and commits are
interleaved with logging. A row is either kept exactly (floats bit for bit) or refused with a clear
error that names its key, and a refused row leaves no trace.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_cmf import (
    Cmf,
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    PrecisionError,
    SchemaError,
    StoreError,
    Sweep,
)
from ray_cmf.cli import main
from tests._values import INT64_MAX, INT64_MIN, column_of, expected_column, floats, same

REFUSALS = (InvalidNameError, InvalidValueError, PrecisionError, SchemaError)

any_text = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates too: UTF-8 cannot hold them
names = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(min_size=200, max_size=300),
    any_text,
    st.sampled_from(["SequenceNumber", "step", "None", "null", "index", "attempt", "__index_level_0__", "é ü 字"]),
)
ints = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 2**53, 2**53 + 1, -(2**53) - 1, 0]),
    st.sampled_from([INT64_MAX + 1, INT64_MIN - 1, 2**100]),  # beyond int64: refused
)
values = st.one_of(ints, floats, st.booleans(), st.none())
values_and_texts = st.one_of(values, any_text, st.sampled_from(["", "nul\x00in", "bad\ud800", "\udc80.png", "é ü 字"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]) | names, values_and_texts, max_size=4), max_size=30),
    commit_after=st.sets(st.integers(0, 30), max_size=3),
)
@example(rows=[{"t": "good", "x": 1.0}, {"t": "bad\ud800", "x": 2.0}, {"t": "after", "x": 3.0}], commit_after=set())
def test_values_come_back_exactly_or_are_refused_clearly(rows: list[dict[str, Any]], commit_after: set[int]) -> None:
    store = tempfile.mkdtemp()
    cmf = Cmf(pipeline_name="prop", store=store, flush_rows=7)  # several chunks: widening across chunks
    try:
        kept: list[dict[str, Any]] = []
        versions: list[tuple[str, int]] = []
        for index, row in enumerate(rows):
            try:
                cmf.log_metric("series", row)
                kept.append(row)
            except REFUSALS as exc:
                assert any(repr(key) in str(exc) or str(key) in str(exc) for key in row), exc
            if index in commit_after and kept:
                artifact = cmf.commit_metrics("series")
                versions.append((artifact.properties["Commit"].string_value, len(kept)))
        if not kept:
            return
        assert cmf.commit_metrics("series") is not None
        frame = cmf.read_metrics("series")
        assert frame.index.tolist() == list(range(1, len(kept) + 1))
        for name in {key for row in kept for key in row}:
            expected, read = expected_column(kept, name), column_of(frame, name, len(kept))
            assert all(same(e, r) for e, r in zip(expected, read, strict=True)), (name, expected, read)
        for md5, count in versions:  # every earlier version still reads back as the prefix it held
            assert len(cmf.read_metrics("series", commit=md5)) == count
    finally:
        cmf.close()  # before its store goes: a Cmf left open ends its execution at exit
        shutil.rmtree(store, ignore_errors=True)


def test_a_text_the_store_cannot_hold_is_refused_where_it_is_given(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lone surrogate (what Python makes of a file name's byte that is not UTF-8) in a logged text was
    accepted, and then its whole series, good rows too, failed to reach the store and was lost (found by a
    new user); in a config, execution metrics, a tag or a note it failed as an encoding error naming nothing.
    Each is now refused as it is given, naming where it is, and the rest is kept."""
    bad = "frame\udc80.png"
    cmf = Cmf(pipeline_name="p", store=tmp_path / "store")
    with pytest.raises(
        InvalidArgumentError, match=r"config\['data'\]\['files'\]\[1\] holds '\\udc80', a lone surrogate"
    ):
        cmf.create_execution("Train", {"data": {"files": ["a.png", bad]}})
    with pytest.raises(InvalidArgumentError, match=r"config: the key 'frame\\udc80.png' holds"):
        cmf.create_execution("Train", {bad: 1})
    with pytest.raises(InvalidNameError, match=r"Invalid execution_type .* lone surrogate"):
        cmf.create_execution(bad, {})
    execution = cmf.create_execution("Train", {"lr": 0.1})
    with pytest.raises(InvalidArgumentError, match=r"custom_properties\['n'\]\['y'\]\[1\] holds"):
        cmf.update_execution(execution.id, {"n": {"y": [1, bad]}})
    cmf.log_metric("s", {"file": "good", "x": 1.0})
    with pytest.raises(InvalidValueError, match=r"Metric 'file' at row 2 is a text that holds '\\udc80'"):
        cmf.log_metric("s", {"file": bad, "x": 2.0})
    for name, row in ((bad, {"x": 1.0}), ("s", {bad: 1.0})):
        with pytest.raises(InvalidNameError, match="lone surrogate"):
            cmf.log_metric(name, row)
    with pytest.raises(InvalidArgumentError, match=r"execution metrics 'test'\['path'\] holds"):
        cmf.log_execution_metrics("test", {"acc": 0.9, "path": bad})
    cmf.log_metric("s", {"file": "after", "x": 3.0})
    assert cmf.commit_metrics("s") is not None
    assert cmf.read_metrics("s")["file"].tolist() == ["good", "after"]
    cmf.close()
    sweep = Sweep(tmp_path / "store", "p", metrics_name="s")
    [trial] = sweep.trials()["trial_id"]
    with pytest.raises(InvalidArgumentError, match=r"tag 'source' holds"):
        sweep.tag(trial, source=bad)
    with pytest.raises(InvalidArgumentError, match=r"the note holds"):
        sweep.note(trial, bad)
    assert sweep.config(trial) == {"lr": 0.1}
    assert main(["pipelines", "--store", str(tmp_path / "store"), "--json"]) == 0
    assert [row["stages"] for row in json.loads(capsys.readouterr().out)] == [["Train"]]  # none of a refused call
    with pytest.raises(StoreError, match=r"No pipeline 'p\\udc80' in .*; it has \['p'\]"):
        Sweep(tmp_path / "store", "p\udc80")


def test_refused_row_leaves_no_trace(tmp_path: Any) -> None:
    cmf = Cmf(pipeline_name="prop", store=tmp_path / "store")
    cmf.log_metric("s", {"x": 1})
    with pytest.raises(PrecisionError, match=r"'big'.*does not fit in int64"):
        cmf.log_metric("s", {"new": 2.5, "big": 2**64})  # "new" is taken back with the row
    cmf.log_metric("s", {"new": "text"})  # so "new" may still become a str column
    with pytest.raises(InvalidNameError, match="SequenceNumber"):
        cmf.log_metric("s", {"SequenceNumber": 3})
    cmf.log_metric("s", {"x": 2**60})
    with pytest.raises(PrecisionError, match=r"at row 4: 0\.5 is a float.*1152921504606846976 beyond 2\*\*53"):
        cmf.log_metric("s", {"x": 0.5})  # widening x to float would round 2**60 (the error names both)
    cmf.commit_metrics("s")
    frame = cmf.read_metrics("s")
    assert column_of(frame, "x", 3) == [1, None, 2**60] and column_of(frame, "new", 3) == [None, "text", None]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.dictionaries(st.sampled_from(["a", "b", "é ü 字"]), values, max_size=3), min_size=1, max_size=12)
)
def test_a_sweep_reads_back_every_value_exactly_by_default(rows: list[dict[str, Any]]) -> None:
    """``Sweep.steps()`` without options gives what ``read_metrics`` gives: ints with gaps stay exact ints, and
    a null (nothing logged) stays apart from a NaN logged."""
    store = tempfile.mkdtemp()
    cmf = Cmf(pipeline_name="prop", store=store)
    try:
        kept = _log(cmf, rows)
        if not kept:
            return
        cmf.commit_metrics("series")
        cmf.close()
        frame = Sweep(store, pipeline="prop", metrics_name="series").steps()
        assert frame["step"].tolist() == list(range(1, len(kept) + 1))
        for name in {key for row in kept for key in row}:
            expected, read = expected_column(kept, name), column_of(frame, name, len(kept))
            assert all(same(e, r) for e, r in zip(expected, read, strict=True)), (name, expected, read)
    finally:
        cmf.close()
        shutil.rmtree(store, ignore_errors=True)


def _log(cmf: Cmf, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log each row into the series ``series``; returns the rows kept (the others were refused)."""
    kept = []
    for row in rows:
        try:
            cmf.log_metric("series", row)
            kept.append(row)
        except REFUSALS:
            pass
    return kept


def _as_logged(logged: Any, read: Any) -> Any:
    """A value read back from a column that became text (its types differ across trials), parsed by its look
    alone, as a reader of the text would: digits are an int; a float has a point, an exponent, inf or nan."""
    if not isinstance(read, str) or isinstance(logged, str) or logged is None:
        return read
    if isinstance(logged, bool):
        return {"true": True, "false": False}.get(read, read)
    if isinstance(logged, float) and math.isnan(logged) and read == "nan":
        return logged  # text keeps a NaN as NaN, not its sign or payload bits (the README says so)
    return int(read) if re.fullmatch(r"-?[0-9]+", read) else float(read)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trials=st.lists(
        st.lists(st.dictionaries(st.sampled_from(["a", "é ü 字"]), values, max_size=2), min_size=1, max_size=6),
        min_size=2,
        max_size=3,
    )
)
@example(trials=[[{"a": 2**60 + 1}], [{"a": 0.5}]])  # an int beyond 2**53 in one trial, floats in another
@example(trials=[[{"a": 2**53 + 1}], [{"a": -math.nan}]])  # and a NaN with its sign bit set
@example(trials=[[{"a": 0.0}, {"a": -0.0}, {"a": 3.0}], [{"a": "x"}]])  # whole floats read as "0", "-0": ints
def test_a_sweep_reads_back_every_trials_values_whatever_the_others_logged(trials: list[list[dict[str, Any]]]) -> None:
    """Across trials a metric may be ints in one, floats or bools in another: each trial's values come back
    exactly, as numbers where one type holds them all, else as text that parses back to each value."""
    store = tempfile.mkdtemp()
    try:
        logged: dict[str, list[dict[str, Any]]] = {}
        for index, rows in enumerate(trials):
            cmf = Cmf(pipeline_name="prop", store=store)
            cmf.create_execution(f"t{index}")
            kept = logged[f"t{index}"] = _log(cmf, rows)
            if kept:
                cmf.commit_metrics("series")
            cmf.close()
        if not any(logged.values()):
            return
        frame = Sweep(store, pipeline="prop", metrics_name="series").steps()
        for trial_id, rows in frame.groupby("trial_id", observed=True):
            kept = logged[str(trial_id).split("-")[0]]
            assert rows["step"].tolist() == list(range(1, len(kept) + 1))
            for name in {key for row in kept for key in row}:
                expected, read = expected_column(kept, name), column_of(rows, name, len(kept))
                read = [_as_logged(e, r) for e, r in zip(expected, read, strict=True)]
                assert all(same(e, r) for e, r in zip(expected, read, strict=True)), (trial_id, name, expected, read)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def test_a_refused_row_takes_back_the_widening_it_made(tmp_path: Any) -> None:
    """A row whose float widened an int column, then refused for another key, left the column float: the ints
    logged before and after read back as floats."""
    cmf = Cmf(pipeline_name="prop", store=tmp_path / "store", flush_rows=2)
    cmf.log_metric("s", {"a": 10**10})
    with pytest.raises(PrecisionError, match="'b'"):
        cmf.log_metric("s", {"a": 0.0, "b": 2**63})
    cmf.log_metric("s", {"a": 3})
    cmf.log_metric("s", {"a": 4})
    with pytest.raises(PrecisionError, match="'b'"):  # across a spill: the new chunk's column widens back too
        cmf.log_metric("s", {"a": 0.5, "b": 2**63})
    cmf.log_metric("s", {"a": 5})
    cmf.commit_metrics("s")
    assert column_of(cmf.read_metrics("s"), "a", 4) == [10**10, 3, 4, 5]
    assert all(type(v) is int for v in column_of(cmf.read_metrics("s"), "a", 4))
