"""The single writer and its client: ordered appends, continued series, and a writer that cannot be reached."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_cmf import Cmf, InvalidNameError, RayCmfError, Store, Sweep
from ray_cmf import client as client_module
from ray_cmf.binding import SeriesKey
from ray_cmf.client import WriterClient
from ray_cmf.constants import (
    ATTEMPT_PROPERTY,
    ENVIRONMENTS_DIR,
    RESULTS_METRICS_NAME,
    RUN_EXECUTION_TYPE,
    SEQUENCE_COLUMN,
    SPILL_DIR,
    SYSTEM_METRICS_NAME,
    TRIAL_EXECUTION_TYPE,
)
from ray_cmf.environment import Environment
from ray_cmf.frames import SERIES_COLUMN
from ray_cmf.lineage import properties
from ray_cmf.series_format import SpillManifest, read_segments
from ray_cmf.writer import StoreWriter


def _writer(store_dir: Path) -> tuple[WriterClient, SeriesKey]:
    client = WriterClient(StoreWriter(Store(store_dir)))
    binding = client.call(StoreWriter.bind, kind="run", name="r", pipeline="p", stage="s", type_name=RUN_EXECUTION_TYPE)
    return client, SeriesKey(binding, "steps")


def _batch(first: int, n: int) -> pa.RecordBatch:
    rows = list(range(first, first + n))
    return pa.RecordBatch.from_pydict({SEQUENCE_COLUMN: rows, "x": [float(r) for r in rows]})


def test_chunks_arriving_out_of_order_are_spilled_in_order(store_dir: Path) -> None:
    client, key = _writer(store_dir)
    for first in (4, 1, 7):  # a threaded actor may run calls out of order
        client.call(StoreWriter.append, key=key, session="a", first_row=first, batch=_batch(first, 3))
    artifact = client.call(StoreWriter.commit, key=key)
    table = pq.read_table(Store(store_dir).resolve(properties(artifact)["url"]))
    assert table.column(SEQUENCE_COLUMN).to_pylist() == list(range(1, 10))
    assert table.column("x").to_pylist() == [float(r) for r in range(1, 10)]


def test_a_restarted_client_continues_the_series(store_dir: Path) -> None:
    client, key = _writer(store_dir)
    client.call(StoreWriter.append, key=key, session="first", first_row=1, batch=_batch(1, 5))
    client.call(StoreWriter.commit, key=key)
    client.call(StoreWriter.append, key=key, session="restarted", first_row=1, batch=_batch(1, 2))  # numbers from 1
    artifact = client.call(StoreWriter.commit, key=key, props={"steps": 7}, state="COMPLETE")
    table = pq.read_table(Store(store_dir).resolve(properties(artifact)["url"]))
    assert table.column(SEQUENCE_COLUMN).to_pylist() == list(range(1, 8))  # continued after the first 5


def test_a_new_writer_adopts_a_dead_writers_spill(store_dir: Path) -> None:
    """A Tune restore starts a new writer for the same store: the spilled rows are kept and continued."""
    client, key = _writer(store_dir)
    client.call(StoreWriter.append, key=key, session="old", first_row=1, batch=_batch(1, 4))
    [spill] = (store_dir / SPILL_DIR).iterdir()
    assert SpillManifest.read(spill).execution_id == key.binding.execution_id
    fresh, same_key = _writer(store_dir)
    fresh.call(StoreWriter.append, key=same_key, session="new", first_row=1, batch=_batch(1, 3))
    artifact = fresh.call(StoreWriter.commit, key=same_key)
    assert properties(artifact)["rows"] == 7


def test_end_commits_what_a_dead_logger_left(store_dir: Path) -> None:
    client, key = _writer(store_dir)
    client.call(StoreWriter.append, key=key, session="dead", first_row=1, batch=_batch(1, 6))
    client.call(StoreWriter.end, binding=key.binding, props={"status": "FAILED"}, state="FAILED")
    url = Store(store_dir).find_version("p", "steps")["url"]
    assert pq.read_table(Store(store_dir).resolve(url)).num_rows == 6
    assert not list((store_dir / SPILL_DIR).iterdir())


def test_series_committed_at_the_end_by_design_warn_nothing(store_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every trial's ``system_metrics`` series is committed by the trial's end, not by its logger: a sweep of
    N trials must not print N warnings. The version still says it was committed at the end."""
    client, key = _writer(store_dir)
    sampled = SeriesKey(key.binding, SYSTEM_METRICS_NAME)
    client.call(StoreWriter.append, key=sampled, session="sampler", first_row=1, batch=_batch(1, 2))
    with caplog.at_level(logging.INFO, logger="ray_cmf.writer"):
        client.call(StoreWriter.end, binding=key.binding, state="COMPLETE")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any(SYSTEM_METRICS_NAME in r.getMessage() for r in caplog.records)  # said, at INFO
    url = Store(store_dir).find_version("p", SYSTEM_METRICS_NAME)["url"]
    assert pq.read_table(Store(store_dir).resolve(url)).num_rows == 2


def _block_spill(store_dir: Path) -> Path:
    """A real fault: a regular file where the spill directory must go, so every spill write fails."""
    _ = Store(store_dir).lineage  # the store itself opens fine
    blocker = store_dir / SPILL_DIR
    blocker.write_text("not a directory")
    return blocker


@pytest.mark.parametrize("sealed", [True, False], ids=["sent-before-the-commit", "sent-on-the-commit"])
def test_an_unreachable_writer_warns_keeps_rows_and_retries(
    store_dir: Path, caplog: pytest.LogCaptureFixture, sealed: bool
) -> None:
    """Rows sealed before the commit, and rows that ride on the commit request itself (the last ones)."""
    cmf = Cmf(pipeline_name="p", store=store_dir, flush_rows=10 if sealed else 1000)
    blocker = _block_spill(store_dir)
    for step in range(25):
        cmf.log_metric("train", {"step": step})  # never raises
    if sealed:
        cmf.metrics["train"].seal()
    assert cmf.commit_metrics("train") is None  # the failure is a warning, not an exception
    assert "could not send rows to the writer" in caplog.text
    assert "could not commit 'train'" in caplog.text
    blocker.unlink()  # the fault goes away
    artifact = cmf.commit_metrics("train")  # the kept rows are sent again
    assert artifact is not None
    assert cmf.read_metrics("train")["step"].tolist() == list(range(25))


def test_rows_kept_for_an_unreachable_writer_are_bounded(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(client_module, "MAX_RETAINED_BYTES", 1000)
    monkeypatch.setattr(client_module, "_RETRY_SECONDS", ())
    cmf = Cmf(pipeline_name="p", store=store_dir, flush_rows=10)
    _block_spill(store_dir)
    for step in range(200):
        cmf.log_metric("train", {"step": float(step)})
    cmf.metrics["train"].seal()
    assert cmf.commit_metrics("train") is None
    sink = cmf.metrics["train"]._sink
    assert isinstance(sink, client_module.WriterSink)
    assert sink.dropped_rows >= 100 and sink._retained_bytes <= 1000 + 10 * 16
    assert "dropped" in caplog.text


def test_local_cmf_spills_through_the_in_process_writer(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir, flush_rows=4)
    for step in range(10):
        cmf.log_metric("train", {"step": step})
    cmf.metrics["train"].flush()
    [spill] = (store_dir / SPILL_DIR).iterdir()
    assert sum(b.num_rows for b in read_segments(spill)) == 10  # flush() sealed the last 2 rows too
    assert SpillManifest.read(spill).execution_id == cmf.execution.id


def test_per_rank_series_of_one_run_commit_at_once_into_their_own_files(store_dir: Path) -> None:
    """Two ranks' series of one name and one run, committed on two writer threads at the same moment, many
    times: each version is its own intact file (destinations name the instance; temporary names are unique)."""
    from concurrent.futures import ThreadPoolExecutor

    client, key = _writer(store_dir)
    ranks = [SeriesKey(key.binding, "system_metrics", f"rank{r}") for r in range(2)]
    for rank, series in enumerate(ranks):
        rows = list(range(1, 20_001))
        batch = pa.RecordBatch.from_pydict({SEQUENCE_COLUMN: rows, "rank": [rank] * len(rows)})
        client.call(StoreWriter.append, key=series, session=f"s{rank}", first_row=1, batch=batch)
    with ThreadPoolExecutor(2) as pool:
        for _ in range(5):
            artifacts = list(pool.map(lambda series: client.call(StoreWriter.commit, key=series), ranks))
            paths = [Store(store_dir).resolve(properties(a)["url"]) for a in artifacts]
            assert paths[0] != paths[1] and all(f"-rank{r}-" in p.name for r, p in enumerate(paths))
            for rank, path in enumerate(paths):
                assert set(pq.read_table(path).column("rank").to_pylist()) == {rank}
    assert not [p for p in store_dir.rglob("*.tmp")]


def test_a_dropped_chunk_is_a_counted_hole_and_the_rows_after_it_are_kept(
    store_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A client gave up on rows 11-20 (the writer was unreachable) and says so with its next chunk: the writer
    steps over them (it used to hold every later chunk back for ever, waiting for row 11), records the
    count on every later version, and ``ray-cmf show`` and ``verify`` list it."""
    import json

    from ray_cmf.cli import main

    client, key = _writer(store_dir)
    client.call(StoreWriter.append, key=key, session="a", first_row=1, batch=_batch(1, 10))
    client.call(StoreWriter.append, key=key, session="a", first_row=21, batch=_batch(21, 10), skipped=((11, 10),))
    client.call(StoreWriter.append, key=key, session="a", first_row=31, batch=_batch(31, 5))
    artifact = client.call(StoreWriter.commit, key=key)
    table = pq.read_table(Store(store_dir).resolve(properties(artifact)["url"]))
    assert table.column(SEQUENCE_COLUMN).to_pylist() == [*range(1, 11), *range(21, 36)]  # the hole shows
    assert properties(artifact)["rows_lost"] == 10
    capsys.readouterr()
    assert main(["show", "r", "--store", str(store_dir), "--metrics-name", "steps", "--json"]) == 0
    [shown] = [f for f in json.loads(capsys.readouterr().out)["files"] if f["name"] == "steps"]
    assert shown["rows_lost"] == 10
    assert main(["verify", "--store", str(store_dir)]) == 0  # the file itself is intact
    assert "10 rows that their loggers could not hand over" in capsys.readouterr().err


def test_rows_a_client_gave_up_on_but_the_writer_kept_are_not_lost(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, a chunk the spill refused stays parked at the writer: the client's warning over-counts,
    the committed series has every row and records no loss."""
    monkeypatch.setattr(client_module, "MAX_RETAINED_BYTES", 1000)
    monkeypatch.setattr(client_module, "_RETRY_SECONDS", ())
    cmf = Cmf(pipeline_name="p", store=store_dir, flush_rows=10)
    blocker = _block_spill(store_dir)
    for step in range(200):
        cmf.log_metric("train", {"step": float(step)})
    assert cmf.commit_metrics("train") is None and cmf.metrics["train"].rows_lost >= 100
    blocker.unlink()
    artifact = cmf.commit_metrics("train")
    assert artifact is not None and properties(artifact)["rows_lost"] == 0
    assert cmf.read_metrics("train")["step"].tolist() == [float(s) for s in range(200)]


def test_a_new_writer_continues_the_newest_committed_version(store_dir: Path) -> None:
    """A restored sweep's writer (a new driver) finds no spill, only a committed version: it extends it."""
    client, key = _writer(store_dir)
    client.call(StoreWriter.append, key=key, session="first", first_row=1, batch=_batch(1, 4))
    client.call(StoreWriter.commit, key=key)
    fresh, same_key = _writer(store_dir)
    fresh.call(StoreWriter.append, key=same_key, session="restored", first_row=1, batch=_batch(1, 3))
    artifact = fresh.call(StoreWriter.commit, key=same_key)
    table = pq.read_table(Store(store_dir).resolve(properties(artifact)["url"]))
    assert table.column(SEQUENCE_COLUMN).to_pylist() == list(range(1, 8))  # the 4 committed, then the 3 new


def test_a_trials_cmf_continues_its_series_when_the_trial_starts_again(store_dir: Path) -> None:
    """A restored trial re-logs the steps after its checkpoint: one series, each step once, the latest attempt's.
    The names of the trial's own series (its Tune results, its system metrics) are not the trainable's to use."""
    client = WriterClient(StoreWriter(Store(store_dir)))
    start = {"kind": "trial", "name": "t1", "pipeline": "p", "stage": "s", "type_name": TRIAL_EXECUTION_TYPE}
    for attempt, steps in ((1, [0, 1, 2]), (2, [1, 2, 3])):  # the second attempt restarts from step 1
        client.call(StoreWriter.bind, **start, start=True)
        cmf = Cmf.joined(client, client.call(StoreWriter.join, kind="trial", name="t1"))
        for step in steps:
            cmf.log_metric("fine", {"step": step, "attempt_logged": attempt})
        cmf.commit_metrics("fine")
    frame = Sweep(store_dir, pipeline="p", metrics_name="fine").steps()
    assert SERIES_COLUMN not in frame.columns
    assert frame["step"].tolist() == [0, 1, 2, 3]
    assert frame["attempt_logged"].tolist() == [1, 2, 2, 2]
    for reserved in (RESULTS_METRICS_NAME, SYSTEM_METRICS_NAME):
        with pytest.raises(InvalidNameError, match=reserved):
            cmf.log_metric(reserved, {"x": 1.0})


def test_a_trial_whose_registration_failed_learns_why_at_once(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that refused a trial's registration (a team store's SQL error, say) left the trial waiting 60 s,
    then failing with "not registered with ray_cmf ... add CmfRayLogger", which it had. The writer remembers
    why, and the waiting trial fails at once with it; a registration that then succeeds is the trial's."""
    writer = StoreWriter(Store(store_dir))
    client = WriterClient(writer)
    client.call(StoreWriter.sweep_runs, sweep="s1", running=True)
    real = StoreWriter.execution

    def refused(self: StoreWriter, **kwargs: object) -> object:
        raise RuntimeError("the server refused it")

    monkeypatch.setattr(StoreWriter, "execution", refused)
    arguments = {"kind": "trial", "name": "t1", "pipeline": "p", "stage": "s", "type_name": RUN_EXECUTION_TYPE}
    with pytest.raises(RuntimeError, match="refused"):
        client.call(StoreWriter.bind, **arguments)
    with pytest.raises(
        RayCmfError, match=r"could not register trial 't1' in the store: RuntimeError: the server refused"
    ):
        client.wait_for_trial(StoreWriter.binding, "t1", timeout=60.0)
    monkeypatch.setattr(StoreWriter, "execution", real)
    bound = client.call(StoreWriter.bind, **arguments)
    assert client.wait_for_trial(StoreWriter.binding, "t1", timeout=1.0) == bound


def test_a_trial_whose_environment_cannot_be_recorded_is_still_registered_once(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The package list a trial runs with is written beside its record; where it cannot be (here its folder is
    a file; on a shared database, another writer's same list at the same moment), the trial registered all the
    same, in its first attempt: its rows are the record, the list completes it. Before, the registration
    failed, and the driver lost every result of the trial."""
    store = Store(store_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    (store.root / ENVIRONMENTS_DIR).write_text("not a folder")
    client = WriterClient(StoreWriter(store))
    environment = Environment({"env_host": "node-1"}, "torch==2.13.0\n")
    arguments = {"kind": "trial", "name": "t1", "pipeline": "p", "stage": "s", "type_name": TRIAL_EXECUTION_TYPE}
    with caplog.at_level(logging.WARNING, logger="ray_cmf"):
        bound = client.call(StoreWriter.bind, **arguments, environment=environment, start=True)
    assert bound.attempt == 1
    assert client.wait_for_trial(StoreWriter.binding, "t1", timeout=1.0) == bound
    recorded = properties(store.lineage.get_execution(bound.execution_id))
    assert recorded["env_host"] == "node-1" and recorded[ATTEMPT_PROPERTY] == 1  # what could be recorded was
    assert [r.message for r in caplog.records if "package list" in r.message] != []
