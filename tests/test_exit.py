"""Exit paths: a process that logged rows and never committed keeps every row, however it ends (but SIGKILL).

Each case is a real child process: it exits normally, raises, or is sent SIGTERM or SIGINT for real. Its
end must commit every logged row, and leave nothing for ``recover``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_cmf import Store, recover
from ray_cmf.errors import ERROR_CHARS, exception_of, recorded_error
from ray_cmf.exits import error_text
from ray_cmf.lineage import properties

ROWS = 195_000  # 19 full chunks of 10 000 and a partial one: most rows wait in memory or in the spill queue

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    store, how = sys.argv[1], sys.argv[2]
    if how == "chained-sigterm":  # the process had its own SIGTERM handler before ray_cmf came
        def handler(signum, frame):
            Path(store, "handler-ran").write_text("yes")
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
    stop = []
    if how == "handled-sigterm":  # a graceful stop: the handler asks the loop to end, and the script goes on
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if how == "ignored-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ray_cmf import Cmf
    cmf = Cmf(pipeline_name="exit", store=store)
    if how == "thread-first":  # ray_cmf's first buffer is made on another thread (a sampler's, say)
        import threading
        from ray_cmf import MetricBuffer
        side = threading.Thread(target=lambda: MetricBuffer(Path(store, "side"), flush_rows=10).append({"x": 1}))
        side.start()
        side.join()
    def log():
        for i in range(ROWS):
            cmf.log_metric("train", {"step": i, "loss": i * 0.5})
    if how == "thread-logs":  # the main thread, which ends the process, never logged
        import threading
        logging = threading.Thread(target=log)
        logging.start()
        logging.join()
    else:
        log()
    if how == "raise":
        raise RuntimeError("training blew up")
    if how in ("handled-sigterm", "ignored-sigterm"):  # it goes on after SIGTERM: one more row, then a normal end
        print("ready", flush=True)
        deadline = time.monotonic() + (60 if how == "handled-sigterm" else 2)
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)
        cmf.log_metric("train", {"step": ROWS, "loss": 0.0})
    elif how not in ("normal", "thread-logs"):
        print("ready", flush=True)
        time.sleep(60)
    """
).replace("ROWS", str(ROWS))


def _run(store: Path, how: str, send: signal.Signals | None = None) -> subprocess.CompletedProcess[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if send is not None:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, send)
    stdout, stderr = child.communicate(timeout=120)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def _committed_steps(store: Path) -> list[int]:
    """The steps of the one version the process's end committed (``at_end``), once ``recover`` found nothing."""
    assert recover(Store(store)) == []
    lineage = Store(store).lineage
    [artifact] = [a for a in lineage.store.get_artifacts() if properties(a).get("metrics_name") == "train"]
    assert properties(artifact)["at_end"] is True
    return pq.read_table(Store(store).resolve(properties(artifact)["url"])).column("step").to_pylist()


@pytest.mark.parametrize(
    ("how", "send", "returncode", "state"),
    [
        ("normal", None, 0, "COMPLETE"),
        ("raise", None, 1, "FAILED"),
        ("wait", signal.SIGTERM, -signal.SIGTERM, "CANCELED"),
        ("wait", signal.SIGINT, -signal.SIGINT, "CANCELED"),  # KeyboardInterrupt, then Python re-raises it
        ("chained-sigterm", signal.SIGTERM, 3, "CANCELED"),
        ("thread-first", signal.SIGTERM, -signal.SIGTERM, "CANCELED"),
        ("thread-logs", None, 0, "COMPLETE"),  # it read COMPLETE with 0 steps, its rows left to recover
        ("handled-sigterm", signal.SIGTERM, 0, "COMPLETE"),  # it read CANCELED, and its next row raised
        ("ignored-sigterm", signal.SIGTERM, 0, "COMPLETE"),
    ],
    ids=[
        "normal-exit",
        "uncaught-exception",
        "sigterm",
        "sigint",
        "sigterm-chained-to-the-previous-handler",
        "sigterm-after-a-first-buffer-on-another-thread",
        "normal-exit-after-logging-on-another-thread",
        "sigterm-whose-previous-handler-lets-the-script-go-on",
        "sigterm-that-the-script-ignores",
    ],
)
def test_every_exit_path_keeps_every_logged_row_and_ends_the_execution(
    tmp_path: Path, how: str, send: signal.Signals | None, returncode: int, state: str
) -> None:
    """Every row comes back, and the script's execution says how it ended (it stayed RUNNING for ever). A
    SIGTERM that the script's own handler (or SIG_IGN) lets it survive ends nothing: ray_cmf ended its runs
    anyway, and the script's next row raised (found by a new user)."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    done = _run(store, how, send)
    assert done.returncode == returncode, done.stderr[-3000:]
    assert "Fatal Python error" not in done.stderr
    [execution] = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert state_name(execution) == state
    expected_error = "RuntimeError: training blew up" if how == "raise" else None  # why it FAILED, when it did
    assert properties(execution).get("error") == expected_error
    goes_on = how in ("handled-sigterm", "ignored-sigterm")  # its last row comes after the SIGTERM
    assert _committed_steps(store) == list(range(ROWS + goes_on))
    if how == "chained-sigterm":
        assert (store / "handler-ran").read_text() == "yes"


MID_COMMIT = textwrap.dedent(
    """
    import os, signal, sys, time
    import ray_cmf.buffer, ray_cmf.client, ray_cmf.series_format
    from ray_cmf import Cmf
    store, name, rows, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cmf = Cmf(pipeline_name="exit", store=store)
    for i in range(2 * rows):
        cmf.log_metric("train", {"step": i, "loss": i * 0.5})
        if i == rows:
            cmf.commit_metrics("train")
    # the signal arrives as a commit writes its file, or sends the rows it took from the buffer, or as the buffer
    # cuts a chunk to hand over (holding its lock: a flush, or every flush_rows rows of logging)
    module, function = {
        "file": (ray_cmf.series_format, "write_parquet"),
        "tail": (ray_cmf.client, "Tail"),
        "flush": (ray_cmf.buffer.MetricBuffer, "_cut"),
        "logging": (ray_cmf.buffer.MetricBuffer, "_cut"),
    }[where]
    original = getattr(module, function)
    def signalled(*args, **kwargs):
        setattr(module, function, original)
        os.kill(os.getpid(), getattr(signal, name))
        return original(*args, **kwargs)
    setattr(module, function, signalled)
    if where == "logging":
        for i in range(2 * rows, 3 * rows):
            cmf.log_metric("train", {"step": i, "loss": i * 0.5})
    elif where == "flush":
        cmf.flush()
    else:
        cmf.commit_metrics("train")
    print("committed", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("where", ["file", "tail", "flush", "logging"])
@pytest.mark.parametrize(("name", "returncode"), [("SIGTERM", -signal.SIGTERM), ("SIGINT", -signal.SIGINT)])
def test_a_signal_during_a_commit_ends_the_run_with_every_row(
    tmp_path: Path, name: str, returncode: int, where: str
) -> None:
    """SIGTERM while ``commit_metrics`` ran: its handler committed the run from inside the commit, waited for the
    lock the commit held, and the process hung for good. SIGINT there (or a SIGTERM that did not hang) dropped
    the rows the commit had taken from the buffer, with nothing left to recover (a new user, killing writers of
    a shared store). SIGTERM while ``flush()`` or ``log_metric`` cut a chunk hung alike, on the buffer's lock.
    Either signal now acts as that section ends: the run ends CANCELED with every row logged."""
    from ray_cmf.lineage import Lineage, state_name

    store, rows = tmp_path / "store", 25_000
    child = subprocess.Popen(
        [sys.executable, "-c", MID_COMMIT, str(store), name, str(rows), where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == returncode, stderr[-3000:]
    assert "committed" not in stdout  # the process ended as the commit did
    assert recover(Store(store)) == []
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    [execution] = lineage.store.get_executions()
    assert state_name(execution) == "CANCELED"
    versions = [a for a in lineage.store.get_artifacts() if properties(a).get("metrics_name") == "train"]
    newest = max(versions, key=lambda a: a.id)
    steps = pq.read_table(Store(store).resolve(properties(newest)["url"])).column("step").to_pylist()
    if where == "logging":  # it ended as the chunk was handed over: every row up to there
        assert 2 * rows < len(steps) < 3 * rows and steps == list(range(len(steps)))
    else:
        assert steps == list(range(2 * rows))


MID_ROW = textwrap.dedent(
    """
    import os, signal, sys, time
    from ray_cmf import Cmf
    store, name = sys.argv[1], sys.argv[2]
    class Row(dict):  # the signal arrives between two of a row's values, inside log_metric
        def items(self):
            for i, item in enumerate(dict.items(self)):
                if i == 2 and self.get("step") == 1234:
                    os.kill(os.getpid(), getattr(signal, name))
                yield item
    cmf = Cmf(pipeline_name="exit", store=store, flush_rows=500)
    for i in range(100_000):
        cmf.log_metric("train", Row(step=i, loss=i * 0.5, acc=1.0 - i / 1e6, lr=0.1))
    print("logged", flush=True)
    """
)


@pytest.mark.parametrize(("name", "returncode"), [("SIGTERM", -signal.SIGTERM), ("SIGINT", -signal.SIGINT)])
def test_a_signal_inside_log_metric_keeps_every_whole_row(tmp_path: Path, name: str, returncode: int) -> None:
    """SIGTERM between two values of a row: its handler closed the buffer, whose chunk then held a column one
    row longer than the others ("Arrays were not all the same length: 325 vs 324"), and the chunk's rows were
    lost for good (a re-check by a new user: up to flush_rows rows). The row being logged is left out whole,
    every row before it is committed."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", MID_ROW, str(store), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == returncode, stderr[-3000:]
    assert "not all the same length" not in stderr and "logged" not in stdout, stderr[-3000:]
    assert recover(Store(store)) == []
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    [execution] = lineage.store.get_executions()
    assert state_name(execution) == "CANCELED"
    [artifact] = [a for a in lineage.store.get_artifacts() if properties(a).get("metrics_name") == "train"]
    table = pq.read_table(Store(store).resolve(properties(artifact)["url"]))
    assert table.column("step").to_pylist() == list(range(1234))  # the interrupted row wholly out
    assert table.column("lr").null_count == 0


AT_EXIT = textwrap.dedent(
    """
    import os, signal, sys
    import ray_cmf.series_format
    from ray_cmf import Cmf
    store, how = sys.argv[1], sys.argv[2]
    runs = [Cmf(pipeline_name="exit", store=store) for _ in range(2)]
    for i in range(30_000):
        for cmf in runs:
            cmf.log_metric("train", {"step": i, "loss": i * 0.5})
    write = ray_cmf.series_format.write_parquet
    calls = []
    def interrupted(*args, **kwargs):  # Ctrl-C as the end commits a run, and again as it commits the next
        calls.append(1)
        if len(calls) <= 2:
            os.kill(os.getpid(), signal.SIGINT)
        return write(*args, **kwargs)
    ray_cmf.series_format.write_parquet = interrupted
    if how == "interrupted":
        raise KeyboardInterrupt  # a first Ctrl-C ended the script
    """
)


@pytest.mark.parametrize(
    ("how", "returncode", "state"), [("interrupted", -signal.SIGINT, "CANCELED"), ("ended", 0, "COMPLETE")]
)
def test_ctrl_c_during_the_ends_commit_still_ends_every_run(
    tmp_path: Path, how: str, returncode: int, state: str
) -> None:
    """Ctrl-C during the commit the script's end makes (after a first that ended it, or twice after a normal
    end): it escaped that commit, and the other runs were never ended (CRASHED, their rows left to
    ``recover``; new users' re-checks). The end's commits run to their end: every run ends as the script did,
    with its rows."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    command = [sys.executable, "-c", AT_EXIT, str(store), how]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == returncode, done.stderr[-3000:]
    assert recover(Store(store)) == []
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    states = [state_name(e) for e in lineage.store.get_executions()]
    assert states == [state, state], (states, done.stderr[-3000:])
    for execution in lineage.store.get_executions():
        versions = lineage.store.get_artifacts_by_id([o.artifact_id for o in lineage.outputs([execution.id])])
        newest = max(versions, key=lambda a: a.id)
        steps = pq.read_table(Store(store).resolve(properties(newest)["url"])).column("step").to_pylist()
        assert steps == list(range(30_000))


def test_close_with_fewer_rows_than_a_chunk_spills_them(tmp_path: Path) -> None:
    from ray_cmf import MetricBuffer
    from ray_cmf.series_format import read_segments

    buffer = MetricBuffer(tmp_path / "spill", flush_rows=1000)
    for step in range(7):
        buffer.append({"step": step})
    buffer.close()
    assert sum(b.num_rows for b in read_segments(tmp_path / "spill")) == 7


FRAME = '  File "/venv/lib/ray/tune/trainable/function_trainable.py", line 249, in _trainable_func\n    output = fn()\n'


@given(
    st.text(min_size=0, max_size=300),
    st.integers(0, 60),
    st.sampled_from(["ValueError", "ray_cmf.errors.RayCmfError", "KeyboardInterrupt"]),
    st.text(min_size=0, max_size=6000),
)
@settings(max_examples=200, deadline=None)
def test_a_recorded_error_keeps_its_exception_within_its_bound(head: str, frames: int, kind: str, message: str) -> None:
    """However long, an error (a Ray task's line, a traceback, then the exception) is recorded in at most
    ERROR_CHARS characters: whole when it fits, else with its exception's type and the start and end of its
    message, and a mark of what was cut."""
    text = f"ray::ImplicitFunc.train() {head}\nTraceback (most recent call last):\n{FRAME * frames}{kind}: {message}"
    recorded, whole = recorded_error(text), text.strip()
    assert len(recorded) <= ERROR_CHARS
    if len(whole) <= ERROR_CHARS:
        assert recorded == whole
        return
    exception = exception_of(whole)
    assert exception.startswith(f"{kind}:") or not frames  # without a frame, the text is all exception
    assert exception[:100] in recorded and recorded.endswith(whole[-100:]) and "characters cut …]" in recorded
    assert f"{kind}:" in recorded


def test_the_type_of_an_exception_with_a_long_message_is_kept() -> None:
    text = error_text(RuntimeError("HEAD " + "ø" * 5000 + " TAIL"))
    assert text.startswith("RuntimeError: HEAD ø") and text.endswith("ø TAIL") and len(text) <= ERROR_CHARS


LOOP = textwrap.dedent(
    """
    import gc, sys
    from ray_cmf import Cmf
    from ray_cmf.lineage import Lineage, state_name
    store = sys.argv[1]

    def run(name, commit):
        cmf = Cmf(pipeline_name="loop", store=store)
        cmf.create_execution("run", execution_name=name)
        for step in range(5):
            cmf.log_metric("train", {"step": step, "loss": 1.0 / (step + 1)})
        if commit:
            cmf.commit_metrics("train")

    run("in-a-function", commit=True)
    run("in-a-function-uncommitted", commit=False)
    gc.collect()
    for ended in Lineage(store + "/mlmd.sqlite", readonly=True).store.get_executions():
        print(state_name(ended), flush=True)  # while the process still runs
    for name in ("rebound-committed", "rebound-uncommitted"):
        cmf = Cmf(pipeline_name="loop", store=store)  # the previous Cmf is freed here
        cmf.create_execution("run", execution_name=name)
        for step in range(5):
            cmf.log_metric("train", {"step": step, "loss": 1.0 / (step + 1)})
        if name.endswith("-committed"):
            cmf.commit_metrics("train")
    """
)


def test_a_cmf_the_script_lets_go_of_ends_its_execution_complete_with_every_row(tmp_path: Path) -> None:
    """A script that makes a Cmf per run (in a function, or rebinding one name in a loop) let go of each
    as it made the next: their executions stayed RUNNING, then read as CRASHED once the script ended."""
    from ray_cmf import Sweep
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", LOOP, str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["COMPLETE", "COMPLETE"]
    executions = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert {e.name: state_name(e) for e in executions} == {
        "in-a-function": "COMPLETE",
        "in-a-function-uncommitted": "COMPLETE",
        "rebound-committed": "COMPLETE",
        "rebound-uncommitted": "COMPLETE",
    }
    trials = Sweep(str(store), "loop", metrics_name="train").trials()
    assert list(trials["status"]) == ["COMPLETE"] * 4
    assert list(trials["steps"]) == [5] * 4
    assert recover(Store(store)) == []


STEPS = textwrap.dedent(
    """
    import gc, sys, torch
    from ray_cmf.lineage import Lineage, state_name
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger
    store, how = sys.argv[1], sys.argv[2]

    def run(name):
        metrics = MetricCollection({"loss": Mean()})
        steps = StepLogger(metrics, sync_every=3, store=store, pipeline_name="p", run_name=name, system_metrics=None)
        for step in range(1, 10):
            metrics["loss"].update(torch.tensor(float(step)))
            steps.step()  # the sync of step 9 is started, and no later step completes it
        return steps

    if how == "let-go":
        run(how)
        gc.collect()
        [ended] = Lineage(store + "/mlmd.sqlite", readonly=True).store.get_executions()
        print(state_name(ended), flush=True)  # while the process still runs
    else:
        kept = run(how)
        if how == "raise":
            raise RuntimeError("loop blew up")
    """
)


@pytest.mark.parametrize(
    ("how", "returncode", "state"), [("normal", 0, "COMPLETE"), ("raise", 1, "FAILED"), ("let-go", 0, "COMPLETE")]
)
def test_a_step_logger_without_ray_that_never_finishes_ends_its_run_with_every_row(
    tmp_path: Path, how: str, returncode: int, state: str
) -> None:
    """A loop without Ray that ends without ``finish()``: its run stayed RUNNING (CRASHED once the script
    ended) with nothing committed, and the row of the sync its last step started was lost for good, where
    inside Ray Train the same loop commits all three rows (found by a new user)."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", STEPS, str(store), how], capture_output=True, text=True, timeout=120)
    assert done.returncode == returncode, done.stderr[-3000:]
    assert done.stdout.split() == ([state] if how == "let-go" else [])
    [execution] = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert state_name(execution) == state
    assert properties(execution).get("error") == ("RuntimeError: loop blew up" if how == "raise" else None)
    assert recover(Store(store)) == []
    from ray_cmf import Sweep

    rows = Sweep(str(store), "p", metrics_name="train_steps").steps(["loss"])
    assert rows["step"].tolist() == [3, 6, 9] and rows["loss"].tolist() == [2.0, 5.0, 8.0]


RANKS = textwrap.dedent(
    """
    import sys, time, torch, torch.distributed as dist
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger
    store, rank, init = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=1, store=store, pipeline_name="p", run_name="ranks", system_metrics=None)
    for step in range(1, 10):
        if step == 4 and rank == 1:
            raise RuntimeError("rank 1 blew up")  # before its step: rank 0's sync of step 4 never pairs up
        metrics["loss"].update(torch.tensor(float(step)))
        steps.step()
        if step == 4:
            time.sleep(0.5)
            dist.all_reduce(torch.zeros(1))  # as DDP's backward does: the peer is gone
    """
)


def test_a_rank_that_dies_with_a_sync_in_flight_still_ends_rank_0s_run(tmp_path: Path) -> None:
    """In a torch.distributed job without Ray, rank 1 died and rank 0 failed in its next collective while the
    sync of its last step was in flight: that sync's wait at exit raised gloo's error, the run never ended and
    read CRASHED with 0 steps and no error (found by a new user). The row of that sync is given up; the run
    ends FAILED with rank 0's error and every row before it."""
    from ray_cmf import Sweep
    from ray_cmf.lineage import Lineage, state_name

    store, init = tmp_path / "store", tmp_path / "init"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANKS, str(store), str(rank), str(init)], stderr=subprocess.PIPE, text=True
        )
        for rank in range(2)
    ]
    errors = [rank.communicate(timeout=180)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [1, 1], errors
    [execution] = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert state_name(execution) == "FAILED", errors[0][-3000:]
    assert properties(execution)["error"].startswith("RuntimeError"), properties(execution)
    assert recover(Store(store)) == []
    rows = Sweep(str(store), "p", metrics_name="train_steps").steps(["loss"])
    assert rows["step"].tolist() == [1, 2, 3] and rows["loss"].tolist() == [1.0, 2.0, 3.0]


REOPENS = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    cmf = Cmf(pipeline_name="p", store=sys.argv[1])
    cmf.create_execution("T", {"k": 3}, execution_name="same")  # the second script reopens the first's
    cmf.log_metric("m", {"step": int(sys.argv[2]), "x": float(sys.argv[2])})
    """
)


def test_a_script_that_reopens_a_finished_execution_commits_its_rows_as_it_ends(tmp_path: Path) -> None:
    """A later script that reopened an execution by its ``execution_name`` left its rows spilled at its end,
    uncommitted and unsaid: the execution read one step of two, and ``recover`` then marked it recovered,
    though nothing had crashed (found by a new user). Its rows are committed as it ends; the execution keeps
    the state its own run left it in."""
    from ray_cmf import Sweep
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    for step in ("0", "7"):
        done = subprocess.run([sys.executable, "-c", REOPENS, str(store), step], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    rows = Sweep(str(store), "p", metrics_name="m").steps(["x"])
    assert rows["step"].tolist() == [0, 7] and rows["x"].tolist() == [0.0, 7.0]
    assert list((store / "spill").iterdir()) == [] and recover(Store(store)) == []
    [execution] = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert state_name(execution) == "COMPLETE" and not properties(execution).get("recovered")


EXITS = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    store, how, code = sys.argv[1], sys.argv[2], sys.argv[3]
    code = None if code == "none" else int(code) if code.lstrip("-").isdigit() else code
    if how == "with":
        with Cmf(pipeline_name="exits", store=store) as cmf:
            cmf.create_execution("run", execution_name="r")
            cmf.log_metric("m", {"step": 0})
            sys.exit(code)
    cmf = Cmf(pipeline_name="exits", store=store)
    cmf.create_execution("run", execution_name="r")
    cmf.log_metric("m", {"step": 0})
    sys.exit(code)
    """
)


@pytest.mark.parametrize("how", ["with", "script"])
@pytest.mark.parametrize(
    ("code", "returncode", "state", "error"),
    [
        ("0", 0, "COMPLETE", None),
        ("none", 0, "COMPLETE", None),
        ("1", 1, "FAILED", "SystemExit: 1"),
        ("fatal: bad config", 1, "FAILED", "SystemExit: fatal: bad config"),
    ],
)
def test_sys_exit_ends_the_execution_as_its_code_says(
    tmp_path: Path, how: str, code: str, returncode: int, state: str, error: str | None
) -> None:
    """``sys.exit(0)`` inside ``with Cmf(...)`` read FAILED (``SystemExit: 0``), and ``sys.exit(1)`` outside one
    read COMPLETE (found by a new user): a zero (or no) code is a success, any other a failure, either way."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", EXITS, str(store), how, code], capture_output=True, text=True)
    assert done.returncode == returncode, done.stderr[-3000:]
    [execution] = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert (state_name(execution), properties(execution).get("error")) == (state, error)


def test_a_sys_exit_that_was_caught_ends_no_later_run(tmp_path: Path) -> None:
    """A ``SystemExit`` that something caught (argparse's under ``pytest.raises``, a notebook's cell) made every
    run that ended later in the process read FAILED (``SystemExit: 2``), as the whole suite found."""
    from ray_cmf import Cmf
    from ray_cmf.lineage import Lineage, state_name

    before = Cmf(pipeline_name="caught", store=str(tmp_path / "store"))
    before.create_execution("run", execution_name="before")  # installs the exit hooks
    with pytest.raises(SystemExit):
        sys.exit(2)
    after = Cmf(pipeline_name="caught", store=str(tmp_path / "store"))
    after.create_execution("run", execution_name="after")
    after.close()
    before.close()
    executions = Lineage(tmp_path / "store" / "mlmd.sqlite", readonly=True).store.get_executions()
    assert {e.name: state_name(e) for e in executions} == {"before": "COMPLETE", "after": "COMPLETE"}


def test_an_error_the_interactive_prompt_shows_ends_no_run(tmp_path: Path) -> None:
    """At an interactive prompt (``python -i``), a statement that raised (``1/0``, a Ctrl-C) made every run that
    ended later in the session read FAILED with that error, or CANCELED, though it began after it and was
    closed cleanly (found by a new user): the prompt shows the error through ``sys.excepthook`` and goes on."""
    from ray_cmf.lineage import Lineage, state_name

    store = tmp_path / "store"
    session = textwrap.dedent(
        f"""
        from ray_cmf import Cmf
        def run(name):
            cmf = Cmf(pipeline_name="p", store={str(store)!r})
            cmf.create_execution("run", execution_name=name)
            cmf.log_metric("m", {{"step": 0, "v": 1.0}})
            return cmf

        live = run("live across the errors")
        1 / 0
        run("after an error").close()
        raise KeyboardInterrupt
        run("after a ctrl-c").close()
        live.close()
        left = run("left to the session's end")
        """
    )
    done = subprocess.run([sys.executable, "-i"], input=session, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ZeroDivisionError" in done.stderr, done.stderr[-3000:]
    executions = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    ended = {e.name: (state_name(e), properties(e).get("error")) for e in executions}
    assert ended == dict.fromkeys(
        ["live across the errors", "after an error", "after a ctrl-c", "left to the session's end"], ("COMPLETE", None)
    )


AFTER_TUNES_CTRL_C = textwrap.dedent(
    """
    import os, queue, signal, sys, threading
    from pathlib import Path
    from ray_cmf import MetricBuffer
    from ray_cmf.series_format import read_segments
    spill, at = Path(sys.argv[1]), sys.argv[2]
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # Tune's handler, in place while fit() runs
    buffer = MetricBuffer(spill, flush_rows=1000)  # a trial's results buffer, opened by the driver's result hook
    for step in range(4):
        buffer.append({"v": float(step)})
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the first Ctrl-C: Tune puts Python's back
    patched = threading.Thread if at == "thread" else queue.Queue
    method = "start" if at == "thread" else "put"
    original = getattr(patched, method)
    def ctrl_c_again(self, *args, **kwargs):  # the second Ctrl-C, as Tune's last checkpoint hands the rows over
        setattr(patched, method, original)
        if at == "thread":  # the thread runs: Ctrl-C as start() waits for it to say so
            original(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        if at == "put":  # before the chunk is in the queue
            original(self, *args, **kwargs)
    setattr(patched, method, ctrl_c_again)
    try:
        buffer.seal()
    except KeyboardInterrupt:
        print("interrupted")
    buffer.close()
    print(sum(batch.num_rows for batch in read_segments(spill)))
    """
)


@pytest.mark.parametrize("at", ["thread", "put"])
def test_ctrl_c_after_tune_put_pythons_handler_back_loses_no_row_it_hands_over(tmp_path: Path, at: str) -> None:
    """A Tune driver's buffers are opened while Tune's own SIGINT handler is in place, so ray_cmf's, which
    holds a Ctrl-C off until a hand-over ends, was never installed: the first Ctrl-C puts Python's back, and a
    second one inside the hand-over that Tune's last experiment checkpoint makes (starting the spill thread,
    or handing it the chunk) dropped the chunk the buffer had cut: an interrupted sweep's trial committed no
    result (1 run in 3 of ``test_a_sweep_interrupted_twice_commits_what_its_trials_reported``). The Ctrl-C
    now ends the hand-over first, and every row reaches the spill."""
    child = subprocess.run(
        [sys.executable, "-c", AFTER_TUNES_CTRL_C, str(tmp_path / "spill"), at],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["interrupted", "4"], child.stderr[-3000:]
