"""MetricBuffer: O(1) columnar append, schema evolution, spill, atomic hashed finish."""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from ray_cmf import InvalidValueError, MetricBuffer, RayCmfError, SchemaError
from ray_cmf.series_format import read_segments


def _read(path: Path):
    return pq.read_table(path).to_pandas().set_index("SequenceNumber")


def test_rows_numbered_from_one_and_round_trip(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill")
    for step in range(5):
        assert buf.append({"step": step, "loss": step / 10, "ok": step % 2 == 0, "tag": f"s{step}"}) == step + 1
    done = buf.finish(tmp_path / "out.parquet")
    df = _read(done.path)
    assert list(df.index) == [1, 2, 3, 4, 5]
    assert df["step"].tolist() == [0, 1, 2, 3, 4]
    assert df["loss"].tolist() == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert df["ok"].tolist() == [True, False, True, False, True]
    assert df["tag"].tolist() == ["s0", "s1", "s2", "s3", "s4"]
    assert done.rows == 5


def test_late_and_missing_keys_are_null(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill", flush_rows=2)
    buf.append({"a": 1.0})
    buf.append({"a": 2.0, "b": "x"})
    buf.append({"b": "y"})
    buf.append({"a": None, "b": "z", "c": True})
    df = _read(buf.finish(tmp_path / "o.parquet").path)
    assert df["a"].isna().tolist() == [False, False, True, True]
    assert df["b"].isna().tolist() == [True, False, False, False]
    assert df["c"].isna().tolist() == [True, True, True, False]


def test_int_and_float_widen_within_and_across_spills(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill", flush_rows=2)
    buf.append({"x": 1, "y": 1.5})
    buf.append({"x": 2, "y": 2})  # int into a float column
    buf.append({"x": 3})
    buf.append({"x": 4.5})  # float into a column spilled as int64
    table = pq.read_table(buf.finish(tmp_path / "o.parquet").path)
    assert str(table.schema.field("x").type) == "double"
    assert table.column("x").to_pylist() == [1.0, 2.0, 3.0, 4.5]
    assert table.column("y").to_pylist()[:2] == [1.5, 2.0]


def test_type_change_that_cannot_widen_names_key_row_and_types(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill")
    buf.append({"loss": 0.5, "step": 1})
    with pytest.raises(SchemaError) as err:
        buf.append({"step": 2, "loss": "high"})
    message = str(err.value)
    assert "'loss'" in message and "row 2" in message and "float" in message and "str" in message
    # the rejected row left nothing behind
    buf.append({"loss": 0.25, "step": 2})
    df = _read(buf.finish(tmp_path / "o.parquet").path)
    assert df["step"].tolist() == [1, 2]
    assert df["loss"].tolist() == [0.5, 0.25]


@pytest.mark.parametrize("value", [{"nested": 1}, [1, 2], object(), (1,), {1, 2}])
def test_non_scalar_values_raise_naming_key_and_type(tmp_path: Path, value: object) -> None:
    buf = MetricBuffer(tmp_path / "spill")
    buf.append({"ok": 0.5})
    with pytest.raises(InvalidValueError) as err:
        buf.append({"ok": 1.0, "bad": value})
    assert "'bad' at row 2" in str(err.value) and type(value).__name__ in str(err.value)  # as the README says
    assert buf.rows == 1


def test_an_empty_metric_name_is_refused(tmp_path: Path) -> None:
    """``{"": 1}`` was stored as a column with no name, summarised as ``_best`` and ``_final``."""
    buf = MetricBuffer(tmp_path / "spill")
    for blank in ("", " "):  # " " made columns " _best" and " _final", which read as "_best" and "_final"
        with pytest.raises(RayCmfError, match=rf"Invalid metric name '{blank}': metric names .* must be non-blank"):
            buf.append({"ok": 1.0, blank: 1})
    assert buf.rows == 0


@pytest.mark.parametrize(
    "row",
    [
        {"flag": 2},  # after a bool: SchemaError
        {"big": 2**70},  # PrecisionError
        {"attempt": 1},  # a name ray_cmf fills: InvalidNameError
        {"obj": object()},  # InvalidValueError, its value not picklable
    ],
)
def test_a_logging_error_survives_copy_and_pickle(tmp_path: Path, row: dict[str, Any]) -> None:
    """Tune copies the error of a failed trial, and Ray pickles it: ``SchemaError.__init__() missing 3
    required positional arguments`` was what a trial recorded when its ``log_metric`` raised, never the
    error itself. Each error now copies and pickles with its message and its fields."""
    import copy
    import pickle

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=10)
    buffer.append({"flag": True})
    with pytest.raises(RayCmfError) as raised:
        buffer.append(row)
    buffer.close()
    error = raised.value
    for again in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert type(again) is type(error) and str(again) == str(error)
        assert {k: v for k, v in vars(again).items() if k != "value"} == {
            k: v for k, v in vars(error).items() if k != "value"
        }


def test_nan_and_inf_are_data_not_nulls(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill")
    for v in (float("nan"), float("inf"), -float("inf"), np.float32(1.5), np.int64(3)):
        buf.append({"v": v})
    table = pq.read_table(buf.finish(tmp_path / "o.parquet").path)
    values = table.column("v").to_pylist()
    assert table.column("v").null_count == 0
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf
    assert values[3:] == [1.5, 3.0]


def test_spill_keeps_memory_bounded_and_writes_row_groups(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill", flush_rows=100)
    for i in range(1050):
        buf.append({"i": i, "sq": float(i * i)})
        assert buf.pending_rows < 100
    buf.flush()
    spilled = list(read_segments(tmp_path / "spill"))
    assert sum(b.num_rows for b in spilled) == 1050
    done = buf.finish(tmp_path / "o.parquet")
    meta = pq.ParquetFile(done.path).metadata
    assert meta.num_rows == 1050 and meta.num_row_groups == 11
    assert _read(done.path)["i"].tolist() == list(range(1050))
    assert not (tmp_path / "spill").exists()


def _spilled(directory: Path, rows: int) -> list[dict[str, Any]]:
    """The spilled rows, once there are ``rows`` of them (the flush clock hands them over in the background;
    waits at most 30 s, then returns what is there)."""
    deadline = time.monotonic() + 30
    while True:
        batches = list(read_segments(directory)) if directory.exists() else []
        if sum(batch.num_rows for batch in batches) >= rows or time.monotonic() > deadline:
            return [row for batch in batches for row in batch.to_pylist()]
        time.sleep(0.01)


def test_rows_that_waited_flush_seconds_are_spilled_without_another_row(tmp_path: Path) -> None:
    """Rows logged before a pause (a long evaluation) waited for the next row, so a SIGKILL in the pause lost
    them: the time was checked only as rows were appended."""
    buf = MetricBuffer(tmp_path / "spill", flush_rows=10_000, flush_seconds=0.05)
    for step in range(3):
        buf.append({"step": step, "loss": step / 2})
    assert _spilled(tmp_path / "spill", 3) == [
        {"SequenceNumber": step + 1, "step": step, "loss": step / 2} for step in range(3)
    ]
    assert buf.pending_rows == 0
    buf.append({"step": 3, "note": "é"})
    assert _spilled(tmp_path / "spill", 4)[3:] == [{"SequenceNumber": 4, "step": 3, "note": "é"}]
    done = buf.finish(tmp_path / "out.parquet")  # each row once, in order
    assert pq.read_table(done.path).to_pydict() == {
        "SequenceNumber": [1, 2, 3, 4],
        "step": [0, 1, 2, 3],
        "loss": [0.0, 0.5, 1.0, None],
        "note": [None, None, None, "é"],
    }


def test_finish_is_atomic_and_hashes_while_writing(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill", flush_rows=7)
    for i in range(50):
        buf.append({"i": i})
    done = buf.finish(tmp_path / "series-{md5}.parquet")
    data = done.path.read_bytes()
    assert done.md5 == hashlib.md5(data).hexdigest()
    assert done.size == len(data)
    assert done.path.name == f"series-{done.md5[:12]}.parquet"
    assert not list(tmp_path.glob("*.tmp"))


def test_second_finish_extends_the_first_version(tmp_path: Path) -> None:
    buf = MetricBuffer(tmp_path / "spill", flush_rows=3)
    for i in range(4):
        buf.append({"i": i})
    first = buf.finish(tmp_path / "v-{md5}.parquet")
    buf.append({"i": 4, "j": "new"})
    second = buf.finish(tmp_path / "v-{md5}.parquet")
    assert first.md5 != second.md5 and first.path.exists()
    df = _read(second.path)
    assert list(df.index) == [1, 2, 3, 4, 5] and df["i"].tolist() == [0, 1, 2, 3, 4]
    assert _read(first.path).shape[0] == 4


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_rows"):
        MetricBuffer(tmp_path, flush_rows=0)
    with pytest.raises(ValueError, match="flush_seconds"):
        MetricBuffer(tmp_path, flush_seconds=0)


def test_a_refused_chunk_is_counted_and_later_chunks_still_spill(tmp_path: Path) -> None:
    """A spill that fails for a while (a file where its directory must go) loses what it refused, says how
    much, and takes the rows that come after the fault (it used to drop every later chunk silently)."""
    blocked = tmp_path / "spill"
    blocked.write_text("not a directory")
    buffer = MetricBuffer(blocked, flush_rows=10)
    for step in range(20):
        buffer.append({"step": step})
    with pytest.raises(RayCmfError, match="20 rows are lost"):
        buffer.flush()
    blocked.unlink()
    for step in range(20, 30):
        buffer.append({"step": step})
    buffer.flush()
    assert buffer.rows_lost == 20
    done = buffer.finish(tmp_path / "out.parquet")
    assert pq.read_table(done.path).column("step").to_pylist() == list(range(20, 30))


def _random_rows(seed: int, count: int) -> list[dict[str, Any]]:
    """Rows as a sweep logs them: columns that come late, skip rows or hold None, ints that widen to floats,
    text, flags, infinities, and rows the buffer refuses (a text into a number column)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for step in range(count):
        row: dict[str, Any] = {"step": step}
        if rng.random() < 0.7:
            row["loss"] = float(rng.choice([rng.normal(), math.inf, -math.inf, 1e-300]))
        if step > count // 4 and rng.random() < 0.5:
            row["n"] = int(rng.integers(-(2**40), 2**40)) if rng.random() < 0.8 else float(rng.normal())
        if rng.random() < 0.3:
            row["名前"] = None if rng.random() < 0.3 else f"t{step}"
        if rng.random() < 0.2:
            row["ok"] = bool(rng.random() < 0.5)
        if rng.random() < 0.05:
            row["loss"] = "diverged"  # refused, and the row with it
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_another_thread_seals_and_flushes_while_rows_are_appended(tmp_path: Path, seed: int) -> None:
    """Sealing or flushing from another thread (the flush clock, a stall watch, a commit thread) while the
    appending thread logs: every accepted row comes back once, in order, with its values."""
    import threading

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=997, flush_seconds=0.001)
    stop = threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            while not stop.is_set():
                buffer.seal()
                buffer.flush()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=other)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: mid-row, mid-widening, mid-rollback
    thread.start()
    accepted = []
    try:
        for row in _random_rows(seed, 20_000):
            try:
                buffer.append(row)
            except SchemaError:
                continue
            accepted.append(row)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switching)
    assert not errors
    table = pq.read_table(buffer.finish(tmp_path / "out.parquet").path)
    assert table.column("SequenceNumber").to_pylist() == list(range(1, len(accepted) + 1))
    for key in ("step", "loss", "n", "名前", "ok"):
        assert table.column(key).to_pylist() == [row.get(key) for row in accepted], key


def test_another_thread_takes_the_rows_not_handed_over_once(tmp_path: Path) -> None:
    """A script's exit commits on the main thread what a thread logged: ``take()`` there was refused, and
    the run read COMPLETE with 0 steps (a new user's find). Another thread now takes a copy of the complete
    rows, and they are never handed over again."""
    import threading

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=4)
    logger = threading.Thread(target=lambda: [buffer.append({"step": step}) for step in range(6)])
    logger.start()
    logger.join()
    batch = buffer.take()  # rows 5 and 6: 1-4 were sealed as a chunk
    assert batch is not None and batch.to_pydict() == {"SequenceNumber": [5, 6], "step": [4, 5]}
    assert buffer.take() is None and buffer.pending_rows == 0
    buffer.flush()
    assert sum(b.num_rows for b in read_segments(tmp_path / "spill")) == 4


@pytest.mark.parametrize("name", ["trial_id", "series", "attempt", "SequenceNumber"])
def test_a_column_ray_cmf_fills_itself_is_refused_by_name_and_its_row_kept_out(tmp_path: Path, name: str) -> None:
    """Logged under a name that ray_cmf gives the rows itself, a metric came back replaced (``trial_id``,
    ``attempt``) or not at all (``series``), and a logged ``attempt`` column made the reader drop rows as
    older attempts. It is refused at once, by name, and the row is not half-logged."""
    buffer = MetricBuffer(tmp_path / "spill", flush_rows=10)
    buffer.append({"step": 0, "loss": 1.0})
    with pytest.raises(RayCmfError, match=rf"{name!r}.*ray_cmf"):
        buffer.append({"step": 1, "loss": 0.5, name: 3})
    buffer.append({"step": 2, "loss": 0.25})
    buffer.close()
    [table] = [b for b in read_segments(tmp_path / "spill")]
    assert table.column_names == ["SequenceNumber", "step", "loss"] and table.column("step").to_pylist() == [0, 2]


def test_a_result_with_a_column_ray_cmf_fills_itself_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Tune result that reports ``attempt`` of its own keeps its other metrics; the value is dropped and named
    (the writer overwrote it with the trial's attempt before, without a word)."""
    from ray_cmf.results import append_result

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=10)
    for step in (1, 2):
        append_result(buffer, {"training_iteration": step, "loss": 0.5, "attempt": 7}, f"trial t at step {step}")
    buffer.close()
    [table] = [b for b in read_segments(tmp_path / "spill")]
    assert table.column_names == ["SequenceNumber", "training_iteration", "loss"] and table.num_rows == 2
    assert "drop their metric 'attempt' (first at trial t at step 1)" in caplog.text
    assert caplog.text.count("'attempt'") == 2  # said once (its message names it twice), not at every result


def test_a_result_with_a_text_the_store_cannot_hold_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Tune result holding a lone surrogate (a file name's byte that is not UTF-8), as a value or a name,
    keeps its other metrics, the value dropped and named, as for a type change; raised, it would fail the
    sweep's callback."""
    from ray_cmf.results import append_result

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=10)
    append_result(buffer, {"training_iteration": 1, "loss": 0.5, "file": "a\udc80.png"}, "trial t at step 1")
    append_result(buffer, {"training_iteration": 2, "loss": 0.25, "b\udc80": 1.0}, "trial t at step 2")
    buffer.close()
    [table] = [b for b in read_segments(tmp_path / "spill")]
    assert table.column_names == ["SequenceNumber", "training_iteration", "loss"]
    assert table.column("loss").to_pylist() == [0.5, 0.25]
    assert "trial t at step 1: dropping metric 'file'" in caplog.text and "lone surrogate" in caplog.text
    assert "'b\\udc80'" in caplog.text


def test_a_value_refused_in_every_result_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A trial that reports a numpy uint64 beyond int64 in every result was told so at every result (a new
    user): said once per metric and reason, with where it was first; each result keeps its other metrics."""
    import numpy as np

    from ray_cmf.results import append_result

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=10)
    for step in (1, 2, 3):
        append_result(
            buffer, {"training_iteration": step, "u8": np.uint64(2**64 - 1).item()}, f"trial u at step {step}"
        )
    buffer.close()
    [table] = [b for b in read_segments(tmp_path / "spill")]
    assert table.column_names == ["SequenceNumber", "training_iteration"] and table.num_rows == 3
    assert caplog.text.count("dropping metric 'u8'") == 1 and "trial u at step 1" in caplog.text, caplog.text


def test_a_row_that_ctrl_c_interrupts_is_all_or_nothing(tmp_path: Path) -> None:
    """Ctrl-C raises KeyboardInterrupt wherever the main thread is, also inside ``append`` (a Tune driver's
    result hook, say): at any line of it, the row is wholly in or wholly out, and the rows before it and after
    it are finished intact. Interrupted after it had filled a row's missing columns but before it counted the
    row, the buffer's columns disagreed in length, and finishing it failed: every row of the series was lost."""
    code = MetricBuffer.append.__code__
    lines = sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})
    for line in lines:
        buf = MetricBuffer(tmp_path / f"spill{line}")
        buf.append({"a": 1.0, "b": 1})

        def interrupt(frame: Any, event: str, arg: Any, at: int = line) -> Any:
            if frame.f_code is code and event == "line" and frame.f_lineno == at:
                raise KeyboardInterrupt
            return interrupt

        sys.settrace(lambda frame, event, arg: interrupt if frame.f_code is code else None)
        try:
            buf.append({"a": 2.0})  # a row that lacks a column: its null is filled in
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        kept = buf.rows
        buf.append({"a": 3.0, "b": 3})
        df = _read(buf.finish(tmp_path / f"o{line}.parquet").path)
        if kept == 2:  # interrupted once the row was in
            assert df["a"].tolist() == [1.0, 2.0, 3.0] and df["b"].isna().tolist() == [False, True, False], line
        else:
            assert kept == 1 and df["a"].tolist() == [1.0, 3.0] and df["b"].tolist() == [1, 3], (line, kept)


def _interrupted_at(code: Any, line: int) -> Callable[..., Any]:
    """A trace function that raises KeyboardInterrupt, once, as ``code`` is about to run ``line``."""
    armed = [True]

    def interrupt(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line and armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return interrupt

    return lambda frame, event, arg: interrupt if frame.f_code is code else None


def _finished_within(buf: MetricBuffer, path: Path, seconds: float) -> Any:
    """``buf.finish(path)`` on a thread of its own; None where it had not returned after ``seconds``."""
    import threading

    finished: list[Any] = []
    end = threading.Thread(target=lambda: finished.append(buf.finish(path)), daemon=True)
    end.start()
    end.join(seconds)
    return finished[0] if finished else None


def test_a_hand_over_that_ctrl_c_interrupts_never_hangs_the_end(tmp_path: Path) -> None:
    """Ctrl-C inside the hand-over of a sealed chunk to the spill thread (``queue.put``), at the line of
    ``Condition.notify`` after it woke the thread but before it forgot the wake-up (CPython's gh-92530): the
    next hand-over's wake-up went to that stale one, the spill thread slept on with chunks queued, and the
    script hung at its end instead of exiting on Ctrl-C (found by a new user: 1 Ctrl-C in 45)."""
    import threading

    code = threading.Condition.notify.__code__
    lines = sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})
    for line in lines:
        buf = MetricBuffer(tmp_path / f"spill{line}", flush_rows=2)
        buf.append({"a": 1.0})
        buf.append({"a": 2.0})  # the first chunk starts the spill thread, which then waits for the next
        time.sleep(0.05)
        buf.append({"a": 3.0})
        sys.settrace(_interrupted_at(code, line))
        try:
            buf.append({"a": 4.0})  # seals the second chunk: its hand-over wakes the spill thread
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        finished = _finished_within(buf, tmp_path / f"o{line}.parquet", 30)
        assert finished is not None, f"finishing hung after Ctrl-C at line {line} of Condition.notify"
        assert _read(finished.path)["a"].tolist() == [1.0, 2.0, 3.0, 4.0], line


def test_a_spill_thread_that_cannot_start_leaves_the_rows_in_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python refuses a new thread (at the interpreter's end, or out of threads): the first hand-over had cut
    the chunk before it started the spill thread, so its rows were gone, and the half-made thread then failed
    the buffer's close ("cannot join thread before it is started"). The rows stay for the next hand-over."""
    import threading

    buf = MetricBuffer(tmp_path / "spill")
    for step in range(3):
        buf.append({"v": float(step)})
    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        if self.name.startswith("ray_cmf-spill"):
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        buf.seal()
    monkeypatch.setattr(threading.Thread, "start", start)
    buf.append({"v": 3.0})
    assert _read(buf.finish(tmp_path / "o.parquet").path)["v"].tolist() == [0.0, 1.0, 2.0, 3.0]
