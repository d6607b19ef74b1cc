"""Crash safety: a child process is SIGKILLed mid-run; recover() commits every complete spilled row group."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ray_cmf import Store, recover
from ray_cmf.lineage import properties

CHILD = textwrap.dedent(
    """
    import sys, time
    from ray_cmf import Cmf
    store, total, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    cmf = Cmf(pipeline_name="crash", store=store, flush_rows=1000)
    for i in range(total):
        cmf.log_metric("train", {"step": i, "loss": i * 0.5, "tag": "t%d" % (i % 3)})
        if pause and i % 1000 == 999:
            if i + 1 == 10_000:
                cmf.metrics["train"].flush()   # the first 10 000 rows are durable from here on
            print("rows", i + 1, flush=True)
            time.sleep(pause)
    cmf.metrics["train"].flush()   # every sealed chunk is on disk now
    print("spilled", flush=True)
    for i in range(total, total + 500):   # still in memory: lost by design (at most one interval)
        cmf.log_metric("train", {"step": i, "loss": i * 0.5, "tag": "late"})
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _started(store_dir: Path, total: int, pause: float = 0.0, until: str = "ready") -> subprocess.Popen[str]:
    """The logging child, once it has printed a line that starts with ``until``."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_dir), str(total), str(pause)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(until):
            break
    return child


def _run_and_kill(store_dir: Path, total: int, pause: float, kill_on: str) -> None:
    child = _started(store_dir, total, pause, kill_on)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL


def _recovered_frame(store_dir: Path):
    store = Store(store_dir)
    [artifact] = recover(store)
    props = properties(artifact)
    assert props["recovered"] is True
    path = store.resolve(props["url"])
    table = pq.read_table(path)  # a valid Parquet file with its footer
    assert props["rows"] == table.num_rows
    assert not list((store_dir / "spill").iterdir())
    return table.to_pandas()


def test_sigkill_after_spill_loses_nothing_that_was_spilled(store_dir: Path) -> None:
    _run_and_kill(store_dir, 100_000, 0.0, kill_on="ready")
    df = _recovered_frame(store_dir)
    assert len(df) == 100_000
    assert df["SequenceNumber"].tolist() == list(range(1, 100_001))
    assert (df["loss"] == df["step"] * 0.5).all()
    assert df["tag"].tolist()[:4] == ["t0", "t1", "t2", "t0"]


def test_sigkill_mid_run_keeps_a_complete_prefix(store_dir: Path) -> None:
    _run_and_kill(store_dir, 100_000, 0.02, kill_on="rows 20000")
    df = _recovered_frame(store_dir)
    rows = len(df)
    # at least what was durable before the kill, and always whole chunks of 1000 rows
    assert 10_000 <= rows <= 21_000 and rows % 1000 == 0
    assert df["step"].tolist() == list(range(rows))


def test_recover_skips_live_writers_and_is_idempotent(store_dir: Path) -> None:
    child = _started(store_dir, 5000)
    store = Store(store_dir)
    assert recover(store) == []  # its writer is alive
    cli = subprocess.run(
        [sys.executable, "-m", "ray_cmf.cli", "recover", "--store", str(store_dir)], capture_output=True, text=True
    )
    assert cli.returncode == 0 and f"(pid {child.pid})" in cli.stderr and "--force" in cli.stderr  # said, not silent
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert len(recover(store)) == 1
    assert recover(store) == []


LIVE = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    cmf = Cmf(pipeline_name="live", store=sys.argv[1])
    for i in range(1000):
        cmf.log_metric("s", {"step": i, "v": i * 0.5})
    cmf.flush()
    print("flushed", flush=True)
    sys.stdin.readline()  # while the test recovers the store with --force
    for i in range(1000, 1500):
        cmf.log_metric("s", {"step": i, "v": i * 0.5})
    cmf.commit_metrics("s")
    print(len(cmf.read_metrics("s")), flush=True)
    """
)


def test_recover_with_force_leaves_a_spill_its_live_writer_holds(store_dir: Path) -> None:
    """``recover --force`` committed a live job's spill and deleted it under the writer: the job's own commit
    then made a version of 0 rows, and every row it logged later was lost, without a word. The writer holds
    its spill (a lock the OS drops with the process), and no ``--force`` takes a spill that is held."""
    child = subprocess.Popen(
        [sys.executable, "-c", LIVE, str(store_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "flushed"
    for force in ([], ["--force"]):  # without it, the advice was to force: which then says it does not take it
        cli = subprocess.run(
            [sys.executable, "-m", "ray_cmf.cli", "recover", *force, "--store", str(store_dir)],
            capture_output=True,
            text=True,
        )
        assert cli.returncode == 0 and f"(pid {child.pid})" in cli.stderr, cli.stderr
        assert "writes and holds" in cli.stderr and "--force commits" not in cli.stderr, cli.stderr
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "1500" and child.wait() == 0
    assert recover(Store(store_dir)) == []


def test_a_killed_run_shows_crashed_and_recover_marks_it_recovered(store_dir: Path) -> None:
    """A run SIGKILLed mid-way never ends its execution: readers on its machine show it CRASHED, not RUNNING
    (its process is gone), recover() records that for good, and the run says its rows were recovered."""
    from ray_cmf import Cmf, Sweep

    _run_and_kill(store_dir, 20_000, 0.0, kill_on="ready")
    [before] = Sweep(store_dir, "crash", metrics_name="train").trials().to_dict("records")
    assert before["status"] == "CRASHED" and before["recovered"] is False
    live = Cmf(pipeline_name="crash", store=store_dir)  # a run that is alive (this process) stays RUNNING
    live.create_execution("live")
    live.log_metric("live", {"step": 0, "loss": 1.0})
    statuses = set(Sweep(store_dir, "crash", metrics_name="train").trials()["status"])
    assert statuses == {"CRASHED", "RUNNING"}
    _recovered_frame(store_dir)
    table = Sweep(store_dir, "crash", metrics_name="train").trials()
    crashed = table[table["status"] == "CRASHED"]
    assert len(crashed) == 1 and bool(crashed["recovered"].iloc[0]) and crashed["steps"].iloc[0] == 20_000
    assert set(table["status"]) == {"CRASHED", "RUNNING"}
    live.close()


def test_a_spill_that_cannot_be_committed_does_not_stop_the_others(store_dir: Path) -> None:
    """Two runs are killed; one's manifest is then unreadable (a disk that filled). recover() commits the other,
    marks both crashed, keeps the bad spill as it was, and raises an error that names it; so does the CLI."""
    from ray_cmf import RecoveryError, Sweep

    _run_and_kill(store_dir, 3000, 0.0, kill_on="ready")
    _run_and_kill(store_dir, 2000, 0.0, kill_on="ready")
    spills = sorted(p.parent for p in (store_dir / "spill").glob("*/manifest.json"))
    assert len(spills) == 2
    bad = spills[0]
    (bad / "manifest.json").write_text('{"metrics_name": "tr')
    cli = subprocess.run(
        [sys.executable, "-m", "ray_cmf.cli", "recover", "--store", str(store_dir)], capture_output=True, text=True
    )
    assert cli.returncode == 1, cli.stderr
    assert str(bad) in cli.stderr and "manifest.json" in cli.stderr
    assert "train" in cli.stdout  # the other series was committed and listed
    assert sorted(p.parent for p in (store_dir / "spill").glob("*/manifest.json")) == [bad]  # kept, untouched
    with pytest.raises(RecoveryError, match=re.escape(str(bad))) as caught:
        recover(store_dir)
    assert caught.value.recovered == [] and list(caught.value.failed) == [bad]
    table = Sweep(store_dir, "crash", metrics_name="train").trials()
    assert sorted(table["steps"].tolist()) in ([0, 2000], [0, 3000])  # the good spill's rows were committed
    assert set(table["status"]) == {"CRASHED"}


def test_recover_names_the_run_of_each_series_it_committed(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``recover`` listed each committed series by its name, rows and file only: two killed runs whose rows were
    alike (one content-addressed file) read as one run twice, and ``--json`` left out the runs it marked CRASHED
    (a new user). Each row now names its run and the state the run was left in."""
    from ray_cmf.cli import main

    _run_and_kill(store_dir, 2000, 0.0, kill_on="ready")
    _run_and_kill(store_dir, 2000, 0.0, kill_on="ready")  # the same rows: the same file
    _run_and_kill(store_dir, 3000, 0.0, kill_on="ready")
    runs = sorted(Store(store_dir).lineage.store.get_executions(), key=lambda e: e.id)
    assert main(["recover", "--store", str(store_dir), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((row["execution"], row["rows"]) for row in listed) == sorted(
        zip([e.name for e in runs], [2000, 2000, 3000], strict=True)
    )
    assert {row["status"] for row in listed} == {"CRASHED"} and {row["metrics_name"] for row in listed} == {"train"}
    assert len({row["url"] for row in listed}) == 2  # two contents
    assert main(["recover", "--store", str(store_dir)]) == 0  # nothing left: said
    assert "nothing to recover" in capsys.readouterr().out


def test_recover_applies_the_ranks_noted_for_trials_that_had_ended(store_dir: Path) -> None:
    """A sweep's end ranks its trials (``in_top_n``, ``top_rank``) once they have ended; with the team's server
    down then, the ranks were noted for ``recover``, which dropped them unapplied since the trials had ended:
    every trial out of the top read ``in_top_n=None`` (a new user). A note that sets no state is applied to
    an ended execution; one whose execution runs again is dropped."""
    from ray_cmf import Cmf

    with Cmf(pipeline_name="p", store=store_dir) as cmf:
        cmf.create_execution("trial", execution_name="ended")
        cmf.log_metric("s", {"step": 0, "loss": 1.0})
    running = Cmf(pipeline_name="p", store=store_dir)  # runs again, in this live process
    running.create_execution("trial", execution_name="running")
    store = Store(store_dir)
    ids = {e.name: e.id for e in store.lineage.store.get_executions()}
    for name in ids:
        store.note_end(ids[name], {"in_top_n": False, "top_rank": 0}, None)
    assert recover(store) == [] and not store.pending_ends()
    ranks = {name: properties(store.lineage.get_execution(i)).get("in_top_n") for name, i in ids.items()}
    assert ranks == {"ended": False, "running": None}
    running.close()


def test_a_killed_run_not_yet_reaped_is_recovered(store_dir: Path) -> None:
    """A process that was killed but is not reaped yet (a zombie: a driver's writer, seconds after the driver
    died) is gone: its spill is recovered and its execution marked crashed (it was skipped as alive)."""
    from ray_cmf import Sweep

    child = _started(store_dir, 2000)
    os.kill(child.pid, signal.SIGKILL)
    while Path(f"/proc/{child.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        time.sleep(0.01)  # dead, and not reaped: nothing has waited for it
    try:
        [artifact] = recover(store_dir)
        assert properties(artifact)["rows"] == 2000
        [trial] = Sweep(store_dir, "crash", metrics_name="train").trials().to_dict("records")
        assert trial["status"] == "CRASHED" and trial["recovered"] is True
    finally:
        child.wait()


PAUSING = textwrap.dedent(
    """
    import sys, time
    from ray_cmf import Cmf
    cmf = Cmf(pipeline_name="pause", store=sys.argv[1], flush_seconds=0.5)
    for i in range(50):
        cmf.log_metric("train", {"step": i, "loss": i / 4, "名前": "é" * (i % 3)})
    print("evaluating", flush=True)
    time.sleep(600)  # a long evaluation, killed before it ends
    """
)


def test_rows_logged_before_a_long_pause_survive_a_sigkill(store_dir: Path) -> None:
    """Rows logged before a pause in the logging waited for the next row to be handed over: a SIGKILL in a long
    evaluation lost them all (0 recovered). They now leave once they have waited ``flush_seconds``."""
    from ray_cmf.series_format import read_segments

    child = subprocess.Popen([sys.executable, "-c", PAUSING, str(store_dir)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "evaluating\n"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the rows reach the spill while the child sleeps
        spills = (store_dir / "spill").glob("*/")
        if sum(batch.num_rows for spill in spills for batch in read_segments(spill)) >= 50:
            break
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    [artifact] = recover(store_dir)
    table = pq.read_table(Store(store_dir).resolve(properties(artifact)["url"])).to_pydict()
    assert table == {
        "SequenceNumber": list(range(1, 51)),
        "step": list(range(50)),
        "loss": [i / 4 for i in range(50)],
        "名前": ["é" * (i % 3) for i in range(50)],
    }
