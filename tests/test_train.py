"""Ray Train: TorchTrainer on 2 CPU workers (gloo), StepLogger's packed syncs, CmfTrainCallback, restarts."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf.compare import Sweep
from ray_cmf.constants import MLMD_FILE, STEP_METRICS_TYPE
from ray_cmf.errors import InvalidNameError, StoreError
from ray_cmf.lineage import Lineage, properties
from tests._dist import count_collectives

pytestmark = pytest.mark.integration

STEPS, SYNC_EVERY = 40, 5


def _value(step: int, rank: int) -> float:
    """Different data per rank: rank r sees step * (r + 1)."""
    return float(step * (rank + 1))


def loop(config: dict[str, Any]) -> None:
    """The training loop under test: metrics per step, StepLogger syncs, checkpoints, an optional crash."""
    import tempfile

    import ray.train

    from ray_cmf.metrics import Max, Mean, MetricCollection, Sum
    from ray_cmf.train import StepLogger

    context = ray.train.get_context()
    rank = context.get_world_rank()
    if config.get("never_stalled"):
        import ray_cmf.stall

        ray_cmf.stall.STALL_SECONDS = float("inf")
    counts = count_collectives()
    metrics = MetricCollection({"loss": Mean(), "top": Max(), "seen": Sum(cumulative=True)})
    steps = StepLogger(
        metrics,
        sync_every=SYNC_EVERY,
        report_every=config.get("report_every"),
        store=config["store"],
        pipeline_name="train_test",
        trial_id=config.get("trial_id"),
        system_metrics=config.get("system_metrics"),
    )
    steps.log_seeds(loader=1234)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(Path(d) / "state.pt", weights_only=False)
        steps.load_state_dict(state)
        start = state["step"]
    per_sync = []
    last = config.get("steps_on_rank_1", STEPS) if rank == 1 else STEPS
    for step in range(start + 1, last + 1):
        metrics["loss"].update(torch.tensor([_value(step, rank)]))
        metrics["top"].update(torch.tensor(_value(step, rank)))
        metrics["seen"].update(torch.tensor(1.0))
        before = sum(counts.values())
        time.sleep(config.get("step_sleep", 0))
        steps.step(samples=4)
        if sum(counts.values()) > before:  # a sync started in this call
            per_sync.append(sum(counts.values()) - before)
        if config.get("raise_at") == step and rank == 1 and not config.get("raise_again_at"):
            raise RuntimeError(f"rank 1 fails at step {step}")  # rank 0 waits in its next sync until it is stopped
        again = Path(config["store"]) / "raised_once"
        fails_at = config.get("raise_again_at") if again.exists() else config.get("raise_at")
        if rank == 1 and config.get("raise_again_at") and step == fails_at:
            again.touch(exist_ok=True)
            raise RuntimeError(f"rank 1 fails at step {step}")  # Ray Train restarts the workers once
        if config.get("own_collective"):  # as DDP's backward does: rank 0 waits here once rank 1 is gone
            torch.distributed.all_reduce(torch.zeros(1))
        crash = Path(config["store"]) / "crashed"
        if config.get("crash_at") == step and rank == 1 and not crash.exists():
            crash.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies for real
        if step % 10 == 0 and config.get("checkpoint"):
            state = steps.state_dict()
            with tempfile.TemporaryDirectory() as d:
                torch.save(state, Path(d) / "state.pt")
                ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d))
    if config.get("finish", True):
        steps.finish()
    if rank == 0:
        (Path(config["store"]) / f"collectives-{context.get_experiment_name()}.json").write_text(json.dumps(per_sync))


def _fit(
    tmp: Path,
    name: str,
    workers: int = 2,
    sampling: float | None = 10.0,
    train: Any = None,
    max_failures: int = 1,
    **config: Any,
) -> Any:
    """Run ``train`` (default: ``loop``) on ``workers`` workers, with a CmfTrainCallback that samples them every
    ``sampling`` seconds, restarted after up to ``max_failures`` failures."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_cmf import CmfTrainCallback

    trainer = TorchTrainer(
        train or loop,
        train_loop_config={"store": str(tmp / "store"), **config},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp / "results"),
            callbacks=[CmfTrainCallback("train_test", store=str(tmp / "store"), system_metrics=sampling)],
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def _series(tmp: Path, metrics_name: str, **kwargs: Any):
    return Sweep(tmp / "store", pipeline="train_test", metrics_name=metrics_name, **kwargs)


def _closed_form(step: int, world: int) -> dict[str, float]:
    window = range(step - SYNC_EVERY + 1, step + 1)
    values = [_value(s, r) for s in window for r in range(world)]
    return {"loss": sum(values) / len(values), "top": max(values), "seen": step * world}


@pytest.fixture(scope="module")
def two_workers(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    _fit(tmp, "plain", sampling=0.1, report_every=3, system_metrics=0.1, step_sleep=0.02)
    return tmp


def test_committed_parquet_holds_globally_reduced_values(two_workers: Path) -> None:
    steps = _series(two_workers, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, STEPS + 1, SYNC_EVERY))
    for _, row in steps.iterrows():
        expected = _closed_form(int(row["step"]), 2)
        assert row["loss"] == pytest.approx(expected["loss"])
        assert row["top"] == expected["top"] and row["seen"] == expected["seen"]
    assert (steps["samples_per_s"] > 0).all()
    assert not [c for c in steps.columns if "ray_cmf" in c], list(steps.columns)  # StepLogger's own checks


def test_at_most_three_collectives_per_sync(two_workers: Path) -> None:
    per_sync = json.loads((two_workers / "store" / "collectives-plain.json").read_text())
    assert len(per_sync) == STEPS // SYNC_EVERY
    assert per_sync[0] <= 4  # + the one-time layout check
    assert max(per_sync[1:]) <= 3


def test_run_lineage_and_every_ranks_reports(two_workers: Path) -> None:
    lineage = Lineage(two_workers / "store" / "mlmd.sqlite", readonly=True)
    [execution] = lineage.store.get_executions()
    assert execution.name == "plain" and execution.last_known_state == mlpb.Execution.COMPLETE
    artifacts = lineage.store.get_artifacts_by_id(
        [e.artifact_id for e in lineage.store.get_events_by_execution_ids([execution.id])]
    )
    names = {properties(a).get("metrics_name") for a in artifacts}
    assert names == {"train_steps", "train_reports", "system_metrics", None}  # None: the package list
    [run] = _series(two_workers, "train_reports").trials().to_dict(orient="records")  # its train_loop_config
    assert (run["config/report_every"], run["config/step_sleep"], run["config/system_metrics"]) == (3, 0.02, 0.1)
    reports = _series(two_workers, "train_reports").steps(["rank", "loss"])
    assert sorted(set(reports["rank"])) == [0, 1]  # every rank, not only rank 0
    # every 3rd sync's row (steps 15 and 30), then finish() reports the last row (step 40), which the cadence
    # skipped: the run's reports ended at step 30. StepLogger's final flag is no row.
    assert reports.groupby("rank")["step"].apply(list).to_dict() == {0: [15, 30, 40], 1: [15, 30, 40]}
    assert reports["loss"].notna().all()  # a row (and its nulls) the loop never reported


def _reports_only(config: dict[str, Any]) -> None:
    """A loop that reports its loss three times and counts no step of its own, and a ``rank``, a
    ``training_iteration`` and a ``pid`` of its own."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    for i in range(3):
        ray.train.report({"loss": float(10 * rank + i), "rank": 7, "training_iteration": 500 + rank, "pid": 4242})


def test_reports_without_a_step_are_read_by_their_report_index(ray_session: None, tmp_path: Path) -> None:
    """Each report of a loop that names no step is one step for every rank (the two ranks' copies of the
    first report read as steps 1 and 2), and the callback's bookkeeping columns are no metrics; a ``rank``
    the loop reports is dropped and named (it replaced the worker's rank), its own ``training_iteration`` is
    data (it was the step, another on each rank), and so is its ``pid`` (dropped as Tune's, without a word)."""
    _fit(tmp_path, "reports", train=_reports_only, sampling=None)
    reports = _series(tmp_path, "train_reports")
    [run] = reports.trials().to_dict(orient="records")  # rank 0's host, though no StepLogger recorded it
    assert run["env/host"] == socket.gethostname()
    steps = reports.steps(["rank", "loss", "training_iteration", "pid"])
    assert steps.groupby("rank")["step"].apply(list).to_dict() == {0: [1, 2, 3], 1: [1, 2, 3]}  # not its own
    assert steps.groupby("rank")["training_iteration"].apply(list).to_dict() == {0: [500] * 3, 1: [501] * 3}
    assert steps["pid"].tolist() == [4242] * 6  # Tune's bookkeeping names are a Train loop's data
    assert steps.groupby("rank")["loss"].apply(list).to_dict() == {0: [0.0, 1.0, 2.0], 1: [10.0, 11.0, 12.0]}
    [summary] = reports.trials(["loss"], mode="max").to_dict(orient="records")  # Ray Train's result: rank 0's
    assert (summary["loss_best"], summary["loss_final"], summary["steps"]) == (2.0, 2.0, 3)
    columns = set(reports.trials().columns)
    assert {"loss_best", "loss_final"} <= columns
    assert not {f"{c}_{k}" for c in ("report", "worker_group", "checkpointed") for k in ("best", "final")} & columns


def _system_tables(store: Path) -> list[list[dict[str, Any]]]:
    """The rows of each committed ``system_metrics`` series of the one run in ``store`` (its latest version)."""
    lineage = Lineage(store / MLMD_FILE, readonly=True)
    [execution] = lineage.store.get_executions()
    artifacts = lineage.store.get_artifacts_by_id(
        [e.artifact_id for e in lineage.store.get_events_by_execution_ids([execution.id])]
    )
    system = [a for a in artifacts if properties(a).get("metrics_name") == "system_metrics"]
    latest = {properties(a)["url"].rsplit("-", 1)[0]: a for a in sorted(system, key=lambda a: a.id)}
    return [pq.read_table(store / properties(a)["url"]).to_pylist() for a in latest.values()]


def _system_rows(store: Path) -> dict[int, list[dict[str, Any]]]:
    """The rows of the one run's ``system_metrics`` series in ``store``, by rank (each series holds one)."""
    tables = _system_tables(store)
    by_rank = {table[0]["rank"]: table for table in tables}
    assert len(by_rank) == len(tables) and all({r["rank"] for r in t} == {t[0]["rank"]} for t in tables)
    return by_rank


def test_every_worker_samples_system_metrics_and_the_run_records_its_environment(two_workers: Path) -> None:
    """The callback samples each worker from its node; StepLogger, asked to sample too, leaves it to it: every
    row of a rank's series names that rank's one process."""
    lineage = Lineage(two_workers / "store" / MLMD_FILE, readonly=True)
    [execution] = lineage.store.get_executions()
    props = properties(execution)
    assert props["env_host"] == socket.gethostname() and props["env_torch"] == torch.__version__
    assert props["env_python"] and props["seed_loader"] == 1234 and "seed_torch" in props
    by_rank = _system_rows(two_workers / "store")
    assert sorted(by_rank) == [0, 1] and all(len(ranked) >= 2 for ranked in by_rank.values())  # one series each
    pids = {rank: {r["pid"] for r in rows} for rank, rows in by_rank.items()}
    assert all(len(p) == 1 and None not in p for p in pids.values()) and pids[0] != pids[1]  # never twice
    rows = [r for ranked in by_rank.values() for r in ranked]
    assert all(r["proc_rss_mb"] > 0 for r in rows)
    cpu = [r["proc_cpu_percent"] for r in rows if r["proc_cpu_percent"] is not None]  # none in the first 0.2 s
    assert all(ranked[-1]["proc_cpu_percent"] is not None for ranked in by_rank.values())
    assert all(0 <= c <= 100 * (os.cpu_count() or 1) for c in cpu)


def test_a_step_logger_runs_samples_are_committed_when_fit_returns(ray_session: None, tmp_path: Path) -> None:
    """StepLogger's final report ends the run before Ray stops the workers, whose last samples reach the
    writer only then: the run's end commits them again before ``fit`` returns (a script that ends right
    after it found them uncommitted)."""
    _fit(tmp_path, "final", sampling=0.2, step_sleep=0.01)
    by_rank = _system_rows(tmp_path / "store")  # read at once: nothing may still be on its way
    assert sorted(by_rank) == [0, 1] and all(len(rows) >= 2 for rows in by_rank.values())
    assert not list((tmp_path / "store").glob("spill/*system_metrics*"))  # nothing left for `recover`


def test_without_the_callbacks_sampling_each_step_logger_samples_its_own_process(
    ray_session: None, tmp_path: Path
) -> None:
    """``CmfTrainCallback(system_metrics=None)``: each worker's StepLogger samples its own process, into the same
    series with the same columns (``rank``, ``pid``)."""
    _fit(tmp_path, "self_sampled", sampling=None, system_metrics=0.1, step_sleep=0.02)
    by_rank = _system_rows(tmp_path / "store")
    pids = {rank: {r["pid"] for r in rows} for rank, rows in by_rank.items()}
    assert sorted(by_rank) == [0, 1] and all(len(rows) >= 2 for rows in by_rank.values())
    assert all(len(p) == 1 for p in pids.values()) and pids[0] != pids[1]


def report_only(config: dict[str, Any]) -> None:
    """A loop that calls no ray_cmf code: it only reports, with its process id."""
    import ray.train

    for step in range(1, 5):
        time.sleep(0.2)
        ray.train.report({"step": step, "loss": 1.0 / step, "worker_pid": os.getpid()})


def test_workers_of_a_loop_that_logs_nothing_are_sampled_and_the_run_ends_complete(
    ray_session: None, tmp_path: Path
) -> None:
    """Zero-code: the loop only reports; the callback samples every worker's process from its node into its
    rank's series, and commits the reports and marks the run COMPLETE at the run's end."""
    _fit(tmp_path, "zero", sampling=0.2, train=report_only)
    reports = _series(tmp_path, "train_reports").steps(["rank", "loss", "worker_pid"])
    assert sorted(zip(reports["rank"], reports["step"], strict=True)) == [(r, s) for r in (0, 1) for s in range(1, 5)]
    reported = {int(rank): set(rows["worker_pid"]) for rank, rows in reports.groupby("rank")}
    by_rank = _system_rows(tmp_path / "store")
    assert {rank: {r["pid"] for r in rows} for rank, rows in by_rank.items()} == reported
    assert all(len(rows) >= 2 for rows in by_rank.values())  # a first and a last sample at least
    [execution] = Lineage(tmp_path / "store" / MLMD_FILE, readonly=True).store.get_executions()
    assert execution.last_known_state == mlpb.Execution.COMPLETE and properties(execution)["status"] == "COMPLETE"


def test_a_train_run_has_its_nodes_samplers_up_before_its_workers_start(ray_session: None, tmp_path: Path) -> None:
    """A standalone TorchTrainer run's node sampler was started with its first worker group, and came up a
    second or more into the workers' loops: their start was never sampled, nor any of a loop shorter than that
    (a new user's). The callback now starts every live node's sampler as the controller starts, before any
    worker, and waits for it, as a sweep's start does (the controller's process has none cached yet)."""
    import ray

    from ray_cmf import CmfTrainCallback, node_sampler
    from ray_cmf.node_sampler import SAMPLER_NAME

    name = f"{SAMPLER_NAME}_{ray.get_runtime_context().get_node_id()}"
    with contextlib.suppress(ValueError):  # an earlier test's: this test needs the node without one
        ray.kill(ray.get_actor(name))
    while True:  # a killed actor's name is freed a moment later
        try:
            ray.get_actor(name)
        except ValueError:
            break
        time.sleep(0.05)
    node_sampler._SAMPLERS.clear()  # as in a new controller's process
    callback = CmfTrainCallback("early", store=str(tmp_path / "store"))
    callback.after_controller_start(None)
    assert ray.get(ray.get_actor(name).ready.remote()) is True


def test_worker_killed_once_then_restarted_leaves_the_series_intact(ray_session: None, tmp_path: Path) -> None:
    """Also: the restarted loop reports every third sync's row where the run would have without the restart
    (from the checkpoint's count of syncs); it counted from 0 again, so it reported at other steps (found by
    a new user)."""
    _fit(tmp_path, "restarted", sampling=0.2, checkpoint=True, crash_at=27, step_sleep=0.01, report_every=3)
    assert (tmp_path / "store" / "crashed").exists()
    tables = _system_tables(tmp_path / "store")  # committed when fit returns: each worker process in its own
    assert len(tables) == 4 and all(len({r["pid"] for r in t}) == 1 for t in tables)  # 2 ranks, 2 groups each
    assert all([r["step"] for r in t] == list(range(1, len(t) + 1)) for t in tables)
    reports = _series(tmp_path, "train_reports").steps(["rank", "worker_group", "loss"])
    by_group = reports.groupby("worker_group")["step"].apply(list).to_dict()  # the restart resumed at a checkpoint
    assert sorted(by_group) == [1, 2] and by_group[1][:2] == [10, 10] and by_group[2][-2:] == [40, 40]
    rows = reports[reports["loss"].notna() & (reports["rank"] == 0)]  # StepLogger's: every 3rd sync, and the last
    reported = rows.groupby("worker_group")["step"].apply(list).to_dict()
    # the restart resumes from the checkpoint at step 10 or 20 (whichever Ray Train took before the kill), and its
    # reports replace the earlier group's from its first on: step 15 once, the restart's where it reported it too
    assert reported in ({1: [15], 2: [30, 40]}, {2: [15, 30, 40]}), reported
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, STEPS + 1, SYNC_EVERY))  # no duplicates, no holes
    for _, row in steps.iterrows():
        expected = _closed_form(int(row["step"]), 2)
        assert row["loss"] == pytest.approx(expected["loss"]) and row["seen"] == expected["seen"]  # state restored
    [run] = _series(tmp_path, "train_steps").trials().to_dict(orient="records")
    assert run["status"] == "COMPLETE" and run["error"] is None  # the failure it recovered from is not its end
    raw = Sweep(tmp_path / "store", pipeline="train_test", metrics_name="train_steps").files()[0].path
    import pyarrow.parquet as pq

    assert set(pq.read_table(raw).column("attempt").to_pylist()) == {1, 2}


def test_a_run_name_used_again_in_one_ray_session_records_each_run_where_it_names(
    ray_session: None, tmp_path: Path
) -> None:
    """Users name their runs (``RunConfig(name=...)``) and run the cell again, here into another store, in the
    same Ray session: the second run's workers found the first run's registration with the writer and
    logged into it (rank 0's seeds, and every rank's system metrics), so the second store missed them."""
    first, second = tmp_path / "first", tmp_path / "second"
    _fit(first, "again", sampling=0.1, step_sleep=0.02)
    pids = {rank: {r["pid"] for r in rows} for rank, rows in _system_rows(first / "store").items()}
    _fit(second, "again", sampling=0.1, step_sleep=0.02)
    assert {rank: {r["pid"] for r in rows} for rank, rows in _system_rows(first / "store").items()} == pids
    [execution] = Lineage(second / "store" / MLMD_FILE, readonly=True).store.get_executions()
    assert properties(execution)["seed_loader"] == 1234
    by_rank = _system_rows(second / "store")
    assert sorted(by_rank) == [0, 1] and all(len(rows) >= 2 for rows in by_rank.values())
    assert not {r["pid"] for rows in by_rank.values() for r in rows} & set().union(*pids.values())


def test_a_run_name_used_again_in_one_store_continues_its_reports_as_a_later_attempt(
    ray_session: None, tmp_path: Path
) -> None:
    """A run name used again continues that run (as a restored Tune trial continues its Train run): its
    ``train_steps`` read the later attempt's rows, but ``train_reports`` held both fits' reports, each
    (rank, step) twice, with nothing to tell them apart (found by a new user after a Tune restore). Each
    start of the callback is now an attempt of the report series, whose rows supersede the earlier's."""
    _fit(tmp_path, "twice", step_sleep=0.01, report_every=2)
    once = _series(tmp_path, "train_reports").steps(["rank", "worker_group"])
    _fit(tmp_path, "twice", step_sleep=0.01, report_every=2)
    reports = _series(tmp_path, "train_reports").steps(["rank", "worker_group"])
    assert not reports.duplicated(["rank", "step"]).any()
    assert reports[["rank", "step"]].values.tolist() == once[["rank", "step"]].values.tolist()  # in report order
    [run] = _series(tmp_path, "train_reports").trials().to_dict(orient="records")
    assert run["steps"] == len(once[once["rank"] == 0])
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, STEPS + 1, SYNC_EVERY))  # as before: no duplicates
    # each fit's workers are sampled into series of their own: the second fit's went on in the first's series,
    # its steps numbered from 1 again, as after a Tune restore of a trial that runs a TorchTrainer (a new user)
    tables = _system_tables(tmp_path / "store")
    assert len(tables) == 4 and all(len({r["pid"] for r in t}) == 1 for t in tables), [len(t) for t in tables]
    assert all([r["step"] for r in t] == list(range(1, len(t) + 1)) for t in tables)


def test_single_worker(ray_session: None, tmp_path: Path) -> None:
    _fit(tmp_path, "single", workers=1)
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, STEPS + 1, SYNC_EVERY))
    assert steps["loss"].tolist() == [_closed_form(s, 1)["loss"] for s in steps["step"]]


def test_a_run_whose_config_the_store_cannot_hold_is_recorded_with_it_escaped(
    ray_session: None, tmp_path: Path
) -> None:
    """A ``train_loop_config`` holding a lone surrogate (a file name that is not UTF-8) is recorded with that text
    escaped (the controller's log says so): refused, the run that Ray Train runs anyway would go unrecorded."""
    import os

    _fit(tmp_path, "odd_config", workers=1, source=os.fsdecode(b"\xff.png"))
    [run] = _series(tmp_path, "train_steps").trials().to_dict("records")
    assert run["status"] == "COMPLETE" and run["config/source"] == "\\udcff.png" and run["steps"] > 0


def test_a_loop_that_never_calls_finish_still_commits_every_logged_row(ray_session: None, tmp_path: Path) -> None:
    """Rows still in rank 0's memory when the loop returns reach the writer, which commits them at the run's
    end. The last step's sync, which only ``finish`` completed, lost its row without a word: every rank
    started it, so rank 0 now completes it as its loop's thread ends."""
    _fit(tmp_path, "unfinished", finish=False)
    lineage = Lineage(tmp_path / "store" / MLMD_FILE, readonly=True)
    [artifact] = [a for a in lineage.store.get_artifacts() if properties(a).get("metrics_name") == "train_steps"]
    assert properties(artifact)["at_end"] is True  # committed by the writer, not by the loop
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, STEPS + 1, SYNC_EVERY))
    assert steps["loss"].tolist() == [_closed_form(s, 2)["loss"] for s in steps["step"]]


def test_rows_rank_0_logged_survive_another_rank_that_raises(ray_session: None, tmp_path: Path) -> None:
    """Rank 1 raises at step 27; rank 0, which logged the rows of steps 5 to 25, waits in the sync of step 30
    until Ray Train kills it, so its loop neither returns nor raises. Those rows stayed in its memory (a
    flush interval is 30 s) and the FAILED run had no step series at all; each row now leaves as it is
    logged (one per sync interval)."""
    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError):
        _fit(tmp_path, "raised", max_failures=0, raise_at=27, step_sleep=0.01)
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, 27, SYNC_EVERY))
    assert steps["loss"].tolist() == [_closed_form(s, 2)["loss"] for s in steps["step"]]
    [run] = _series(tmp_path, "train_steps").trials().to_dict(orient="records")
    assert run["status"] == "FAILED" and "rank 1: RuntimeError: rank 1 fails at step 27" in run["error"]


def test_rows_rank_0_logged_survive_another_rank_that_raises_while_it_waits_in_the_loops_own_collective(
    ray_session: None, tmp_path: Path
) -> None:
    """As in DDP: rank 1 raises at step 27, and rank 0 waits in the loop's own all_reduce of that step, never
    in a StepLogger sync. Its batched rows left only if the loop looked stalled (0.1 s) before Ray Train
    stopped it, a race it lost about one time in six. Ray Train now lets every worker hand its rows over
    before it is stopped (the loop here never looks stalled, to show that alone keeps them)."""
    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError):
        _fit(tmp_path, "ddp", max_failures=0, raise_at=27, own_collective=True, never_stalled=True)
    steps = _series(tmp_path, "train_steps").steps()
    assert steps["step"].tolist() == list(range(SYNC_EVERY, 27, SYNC_EVERY))
    assert steps["loss"].tolist() == [_closed_form(s, 2)["loss"] for s in steps["step"]]


def test_a_restart_that_fails_before_its_first_row_leaves_none_of_the_rows_it_replaced(
    ray_session: None, tmp_path: Path
) -> None:
    """Rank 1 fails at step 27, Ray Train restarts the run from scratch (no checkpoint), and rank 1 fails
    again at step 3 (every step all-reduces, so rank 0 has stepped too), before the restart logged a row.
    The series read back the first start's rows of steps 5
    to 25 as the run's, since nothing of the restart superseded them; with one row logged, it would have
    dropped them all. Each start now records the step it resumes after, as it takes its first step."""
    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError):
        _fit(tmp_path, "again", max_failures=1, raise_at=27, raise_again_at=3, own_collective=True)
    sweep = _series(tmp_path, "train_steps")
    assert sweep.steps()["step"].tolist() == []
    [run] = sweep.trials().to_dict(orient="records")
    assert run["status"] == "FAILED" and run["steps"] == 0 and "step 3" in run["error"]


@pytest.mark.timeout(300)
def test_ranks_that_run_unequal_steps_fail_and_say_so(ray_session: None, tmp_path: Path) -> None:
    """Rank 1 runs 35 steps, rank 0 runs 40 (uneven data, say): their collectives paired up wrongly, rank 0's
    last sync waited for a rank that had finished, and the run hung with no word. Every sync now carries the
    ranks' step counts, and ``finish`` syncs once more to compare them: the run fails, naming the steps."""
    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError, match=r"ranks are at steps 35 to 40"):
        _fit(tmp_path, "uneven", max_failures=0, steps_on_rank_1=35)


def test_throughput_counts_from_the_first_step_not_from_the_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``samples_per_s`` of the first interval counted from when StepLogger was built: the model and data
    set-up that follows (3 s) made a run of 200 samples/s read 26 in its first row, and again after every
    restart. Throughput now counts from the first step: that step and what came before it are no training
    time it can measure."""
    from types import SimpleNamespace

    import ray_cmf.train
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    clock = SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(ray_cmf.train, "time", SimpleNamespace(time=lambda: clock.now))
    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=5, store=str(tmp_path / "store"), pipeline_name="p", run_name="r")
    clock.now += 100.0  # building the model, loading the data
    rows = []
    for step in range(12):
        clock.now += 0.01  # a step of 10 samples
        metrics["loss"].update(torch.tensor(float(step)))
        rows.append(steps.step(samples=10))
    rows.append(steps.sync())
    got = [(r["step"], r["samples_per_s"]) for r in rows if r is not None]
    assert [s for s, _ in got] == [5, 10, 12] and [r for _, r in got] == pytest.approx([1000.0] * 3), got
    steps.finish()


def test_trials_never_ranks_train_runs_by_their_throughput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ray-cmf trials`` without ``--metric`` put the fastest Train run first, the run with the lowest loss
    last: StepLogger declares ``samples_per_s`` best highest, and it was the first metric any logger
    declared. A speed is no result to rank by: runs whose loggers declare nothing else are in id order."""
    from types import SimpleNamespace

    import ray_cmf.train
    from ray_cmf.cli import main
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    clock = SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(ray_cmf.train, "time", SimpleNamespace(time=lambda: clock.now))
    for name, seconds, loss in (("a-good", 0.5, 0.1), ("b-fast", 0.01, 0.9)):
        metrics = MetricCollection({"loss": Mean()})
        steps = StepLogger(metrics, sync_every=2, store=str(tmp_path / "store"), pipeline_name="p", run_name=name)
        for _ in range(4):
            clock.now += seconds
            metrics["loss"].update(torch.tensor(loss))
            steps.step(samples=8)
        steps.finish()
    assert main(["trials", "--store", str(tmp_path / "store"), "--metrics-name", "train_steps", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["trial_id"] for r in shown] == ["a-good", "b-fast"], shown
    assert shown[1]["samples_per_s_best"] > shown[0]["samples_per_s_best"]
    assert main(["trials", "--store", str(tmp_path / "store"), "--metrics-name", "train_steps"]) == 0
    assert "trials of p (train_steps), by trial_id" in capsys.readouterr().out  # the title says the order
    assert (
        main(["trials", "--store", str(tmp_path / "store"), "--metrics-name", "train_steps", "--metric", "loss"]) == 0
    )
    assert "sorted by loss_best" in capsys.readouterr().out


def test_a_plain_scripts_run_records_its_config_for_trials_and_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain PyTorch script had no way to record its hyperparameters: ``show`` printed an empty config and
    ``diff`` of two runs at different learning rates showed results only (found by a new user)."""
    import ray_cmf.train
    from ray_cmf import InvalidArgumentError, Sweep
    from ray_cmf.cli import main
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    store = str(tmp_path / "store")
    for name, config in (("a", {"lr": 0.1, "opt": {"name": "sgd"}}), ("b", {"lr": 0.5, "opt": {"name": "sgd"}})):
        metrics = MetricCollection({"loss": Mean()})
        steps = StepLogger(metrics, sync_every=1, store=store, pipeline_name="p", run_name=name, config=config)
        metrics["loss"].update(torch.tensor(config["lr"]))
        steps.step()
        steps.finish()
    sweep = Sweep(store, "p", metrics_name="train_steps")
    assert sweep.config("a") == {"lr": 0.1, "opt.name": "sgd"}
    assert main(["diff", "a", "b", "--store", store, "--metrics-name", "train_steps", "--json"]) == 0
    fields = {row["field"] for row in json.loads(capsys.readouterr().out)}
    assert "config/lr" in fields and "config/opt.name" not in fields, fields
    with pytest.raises(InvalidArgumentError, match="config"):
        StepLogger(MetricCollection({"loss": Mean()}), store=store, run_name="c", config={"bad": "\udc80"})
    monkeypatch.setattr(ray_cmf.train, "_train_context", lambda: object())  # inside Ray Train
    with pytest.raises(InvalidArgumentError, match="train_loop_config"):
        StepLogger(MetricCollection({"loss": Mean()}), store=store, run_name="d", config={"lr": 0.1})


def test_a_step_loggers_own_counts_stay_out_of_the_users_collection(tmp_path: Path) -> None:
    """StepLogger syncs its sample and step counts with the user's metrics, in the same collective, but they
    are not the user's: they were among the collection's keys and in its ``state_dict``, which then loaded
    into no freshly built collection ("unexpected ['ray_cmf_steps_max.extremum', ...]"), and a second
    StepLogger on the same collection (an evaluation after training) failed to add them again."""
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    store = str(tmp_path / "store")
    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=2, store=store, pipeline_name="p", run_name="train", system_metrics=None)
    assert list(metrics) == list(metrics.keys()) == ["loss"] and len(metrics) == 1
    assert [name for name, _ in metrics.items()] == ["loss"] and len(list(metrics.values())) == 1
    for step in range(3):
        metrics["loss"].update(torch.tensor(float(step)))
        steps.step(samples=4)
    assert set(metrics.compute()) == {"loss", "loss_nonfinite"} and "samples" not in metrics.compute()
    state = metrics.state_dict()
    assert sorted(state) == ["loss.__metric__", "loss.nonfinite", "loss.weight", "loss.weighted_sum"]
    fresh = MetricCollection({"loss": Mean()})
    fresh.load_state_dict(state)  # before any StepLogger is built on it, as a restart restores its state first
    assert fresh.compute()["loss"].item() == 2.0  # the interval since the last sync: step 2's update
    older = {**state, "samples.total": torch.tensor(0.0), "ray_cmf_steps_max.extremum": torch.tensor(-math.inf)}
    again = StepLogger(fresh, sync_every=2, store=store, pipeline_name="p", run_name="resumed", system_metrics=None)
    fresh.load_state_dict(older)  # a checkpoint that holds the counts, as earlier versions wrote them
    fresh.load_state_dict(state)
    again.finish()
    assert steps.finish() is not None
    evaluation = StepLogger(metrics, sync_every=2, store=store, pipeline_name="p", run_name="eval", system_metrics=None)
    metrics["loss"].update(torch.tensor(7.0))
    assert evaluation.sync()["loss"] == 7.0 and evaluation.finish() is not None
    with pytest.raises(KeyError, match="no metric named 'samples'"):
        metrics.update(samples=torch.tensor(1.0))


def test_a_refused_checkpoint_leaves_the_step_logger_as_it_was(tmp_path: Path) -> None:
    """A checkpoint whose metrics were saved with other settings was refused, but its step was taken first: a
    script that caught the error and started afresh logged every row 7 steps late (a new user's)."""
    from ray_cmf import RayCmfError
    from ray_cmf.metrics import Histogram, MetricCollection
    from ray_cmf.train import StepLogger

    store = str(tmp_path / "store")
    saved = StepLogger(MetricCollection({"h": Histogram(4, 0.0, 1.0)}), sync_every=2, store=store, run_name="a")
    for _ in range(7):
        saved.metrics["h"].update(torch.tensor(0.5))
        saved.step()
    state = saved.state_dict()
    saved.finish()
    other = StepLogger(MetricCollection({"h": Histogram(4, 0.0, 2.0)}), sync_every=2, store=store, run_name="b")
    with pytest.raises(RayCmfError, match=r"metric 'h' was saved as Histogram\(4, 0, 1\)"):
        other.load_state_dict(state)
    assert other.steps_done == 0
    alike = StepLogger(MetricCollection({"h": Histogram(4, 0.0, 1.0)}), sync_every=2, store=store, run_name="c")
    with pytest.raises(ValueError, match="invalid literal"):
        alike.load_state_dict({**state, "step": "abc"})
    assert alike.steps_done == 0 and alike.metrics.to_row()["h_count"] == 0  # nothing was loaded
    alike.finish()
    other.finish()


def test_no_process_group_local_mode(tmp_path: Path) -> None:
    from ray_cmf import RayCmfError
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(
        metrics, sync_every=4, store=str(tmp_path / "store"), pipeline_name="train_test", run_name="local"
    )
    returned = {}
    for step in range(1, 11):
        metrics["loss"].update(torch.tensor(float(step)))
        returned[step] = steps.step()
    # a sync started at steps 4 and 8 completes (and returns its row) in the next step's call
    assert {s: (r["step"], r["loss"]) for s, r in returned.items() if r is not None} == {5: (4, 2.5), 9: (8, 6.5)}
    artifact = steps.finish()
    assert properties(artifact)["rows"] == 3  # steps 4, 8 and the final partial interval at 10
    assert steps.finish() == artifact  # again: what it committed (it raised "This series is closed")
    with pytest.raises(RayCmfError, match=r"step\(\) after finish\(\)"):  # its updates were dropped without a word
        steps.step()
    frame = _series(tmp_path, "train_steps").steps(["loss"])
    assert frame["step"].tolist() == [4, 8, 10] and frame["loss"].tolist() == [2.5, 6.5, 9.5]
    for own in ("step", "wall_time", "samples_per_s", "samples"):  # they replaced StepLogger's own columns
        with pytest.raises(ValueError, match=rf"metric {own!r} .*StepLogger fills"):
            StepLogger(MetricCollection({own: Mean()}), store=str(tmp_path / "store"), run_name="clash")
    for own in ("rank", "SequenceNumber", "attempt"):  # a metric "rank" was taken, then read as the rows' rank
        with pytest.raises(InvalidNameError, match=rf"Invalid metric name {own!r}: ray_cmf .*another name"):
            StepLogger(MetricCollection({own: Mean()}), store=str(tmp_path / "store"), run_name="clash")
    for unread in ("report", "pid", "training_iteration"):  # taken, then never summarised, best or plotted
        with pytest.raises(InvalidNameError, match=rf"{unread!r}: ray_cmf reads that column as a step, a key"):
            StepLogger(MetricCollection({unread: Mean()}), store=str(tmp_path / "store"), run_name="clash")


@pytest.mark.parametrize("checkpoint_at", [3, 4])
def test_a_checkpoint_on_a_sync_step_still_returns_that_intervals_row(tmp_path: Path, checkpoint_at: int) -> None:
    """``state_dict()`` right after a sync step completes the sync to checkpoint it: the row was logged, but
    the next ``step()`` returned None, so a loop that prints or stops early on the returned rows skipped
    every interval it checkpointed (found by a new user). ``sync()`` returns the newest row, and no step
    returns an older one after it; on a sync step it completes that step's sync, where it logged a second row
    of the step, of an empty interval."""
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(
        metrics,
        sync_every=3,
        store=str(tmp_path / "store"),
        pipeline_name="train_test",
        run_name="ckpt",
        system_metrics=None,
    )
    returned = []
    for step in range(1, 10):
        metrics["loss"].update(torch.tensor(float(step)))
        row = steps.step()
        returned += [(row["step"], row["loss"])] if row is not None else []
        if step == checkpoint_at:
            steps.state_dict()
        if step in (6, 7):  # at 6, the sync its step started is the interval so far: no second row of step 6
            row = steps.sync()
            returned.append((row["step"], row["loss"]))
    steps.finish()
    assert returned == [(3, 2.0), (6, 5.0), (7, 7.0)]
    rows = _series(tmp_path, "train_steps").steps(["loss"])
    assert rows["step"].tolist() == [3, 6, 7, 9] and rows["loss"].tolist() == [2.0, 5.0, 7.0, 8.5]


def test_a_runs_nonfinite_counts_add_up_so_its_final_count_is_the_runs(tmp_path: Path) -> None:
    """A loss that was NaN at step 3, inf at 7 and -inf at 12 of 20 (synced every 5): each row counted its own
    interval's, so the run's ``loss_nonfinite_final`` (what ``trials`` shows of a count) was 0, a clean run to
    every reader (found by a new user). A row counts the values left out so far, across a restart too."""
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    def run(name: str, steps: range, state: dict[str, Any] | None = None) -> dict[str, Any]:
        metrics = MetricCollection({"loss": Mean()})
        logger = StepLogger(metrics, sync_every=5, store=str(tmp_path / "store"), pipeline_name="p", run_name=name)
        if state is not None:
            logger.load_state_dict(state)
        for step in steps:
            bad = {3: math.nan, 7: math.inf, 12: -math.inf}.get(step)
            metrics["loss"].update(torch.tensor(float(step) if bad is None else bad))
            logger.step()
            if step == 10:
                state = logger.state_dict()
        logger.finish()
        assert state is not None
        return state

    checkpoint = run("once", range(1, 21))
    run("resumed", range(11, 21), checkpoint)  # a restart from the checkpoint at step 10
    sweep = Sweep(tmp_path / "store", pipeline="p", metrics_name="train_steps")
    rows = sweep.steps(["loss_nonfinite"])
    for run_name in ("once", "resumed"):
        mine = rows[rows["trial_id"] == run_name]
        expected = [1, 2, 3, 3] if run_name == "once" else [3, 3]
        assert mine["loss_nonfinite"].tolist() == expected, run_name
    assert set(sweep.trials(["loss_nonfinite"])["loss_nonfinite_final"]) == {3}


def _live_steps(tmp: Path) -> Any:
    """The run's step series as read while it runs; empty until the writer (an actor, in a Ray session) has
    made the store."""
    try:
        return _series(tmp, "train_steps").steps(["loss"], live=True)
    except StoreError:
        return []


def test_rank_0_batches_its_rows_and_hands_them_over_once_the_loop_stalls(tmp_path: Path) -> None:
    """Each row left for the writer as it was logged: on a host that the workers fill, every send woke three
    processes and cost the run 8 points of wall time. Rows now wait while the loop steps, and leave once it
    stops stepping (blocked in a collective whose peer died, say), with no finish and no flush."""
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(
        metrics, sync_every=1, store=str(tmp_path / "store"), pipeline_name="train_test", run_name="stalls"
    )
    for step in range(1, 6):
        metrics["loss"].update(torch.tensor(float(step)))
        steps.step()
    assert steps._buffer is not None and steps._buffer.pending_rows >= 1  # the row of step 4 at least waits
    deadline = time.monotonic() + 30
    while len(live := _live_steps(tmp_path)) < 4:
        assert time.monotonic() < deadline, f"the stalled loop's rows never reached the store: {live}"
        time.sleep(0.1)  # the loop stalls: no step() call
    assert live["step"].tolist() == [1, 2, 3, 4] and live["loss"].tolist() == [1.0, 2.0, 3.0, 4.0]
    steps.finish()
    frame = _series(tmp_path, "train_steps").steps(["loss"])
    assert frame["step"].tolist() == [1, 2, 3, 4, 5] and frame["loss"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_best_is_the_right_way_round_for_a_metric_that_knows_it_and_one_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Accuracy knows that higher is better and ``modes`` declares it for a Max of rewards: the run's
    ``acc_best`` is its best accuracy and ``reward_best`` its highest reward, where both read as the lowest
    (the worst); a loss stays lowest-is-best."""
    from ray_cmf.metrics import Accuracy, Max, Mean, MetricCollection
    from ray_cmf.train import StepLogger

    metrics = MetricCollection({"loss": Mean(), "acc": Accuracy(), "reward": Max()})
    steps = StepLogger(
        metrics, sync_every=2, store=str(tmp_path / "store"), pipeline_name="train_test", modes={"reward": "max"}
    )
    for step in range(1, 7):  # accuracy falls 1, 1/2, 0 and rewards rise 2, 4, 6 over the three intervals
        right = torch.tensor([1, 1]) if step <= 2 else torch.tensor([1, 0]) if step <= 4 else torch.tensor([0, 0])
        metrics.update(loss=torch.tensor(1.0 / step), acc=(right, torch.tensor([1, 1])), reward=torch.tensor(step))
        steps.step()
    steps.finish()
    sweep = _series(tmp_path, "train_steps")
    assert sweep.modes() == {"acc": "max", "reward": "max", "samples_per_s": "max"}
    [run] = sweep.trials(["loss", "acc", "reward"]).to_dict(orient="records")
    assert (run["acc_best"], run["reward_best"], run["loss_best"]) == (1.0, 6.0, pytest.approx((1 / 5 + 1 / 6) / 2))
    assert (run["acc_final"], run["reward_final"]) == (0.0, 6.0)
    from ray_cmf.cli import main  # the command's table: a count of left-out values has a final, and no best

    assert main(["trials", "--store", str(tmp_path / "store"), "--metrics-name", "train_steps", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert "loss_nonfinite_final" in shown and "loss_nonfinite_best" not in shown and shown["acc_best"] == 1.0
    assert (
        main(["trials", "--store", str(tmp_path / "store"), "--metrics-name", "train_steps", "--json", "--all-columns"])
        == 0
    )
    [every] = json.loads(capsys.readouterr().out)  # more columns, but no best of a count (found by a new user)
    assert "loss_nonfinite_final" in every and "loss_nonfinite_best" not in every


@pytest.mark.parametrize(
    ("modes", "error"),
    [
        ({"rewrd": "max"}, r"modes names \['rewrd'\], which are not among the metrics \['loss', 'samples_per_s'\]"),
        (["loss"], r"modes must be a mapping of metric to 'min' or 'max', got \['loss'\]"),
        ({"loss": "lower"}, r"modes\['loss'\] must be 'min' or 'max', got 'lower'"),
    ],
)
def test_a_step_logger_names_a_bad_mode(tmp_path: Path, modes: dict[str, str], error: str) -> None:
    from ray_cmf import InvalidArgumentError
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    with pytest.raises(InvalidArgumentError, match=error):
        StepLogger(MetricCollection({"loss": Mean()}), store=str(tmp_path / "store"), modes=modes)


def test_store_error_in_the_writer_is_a_warning_not_a_crash(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Logging never kills training: the writer's failure reaches the loop as a warning that names it."""
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    store = tmp_path / "store"
    (store / MLMD_FILE).mkdir(parents=True)  # the writer actor cannot open MLMD there
    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=1, store=str(store), pipeline_name="train_test", run_name="broken")
    metrics["loss"].update(1.0)
    steps.step()
    steps.state_dict()  # a checkpoint flushes: warns, does not raise
    assert steps.finish() is None
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "could not commit run 'broken'" in warned and "Cannot open the MLMD database" in warned


def test_torch_trainer_inside_a_tune_trial_is_linked(ray_session: None, tmp_path: Path) -> None:
    from ray import tune

    from ray_cmf import CmfRayLogger

    def trainable(config: dict[str, Any]) -> None:
        result = _fit(
            tmp_path, f"inner-{tune.get_context().get_trial_id()}", trial_id=tune.get_context().get_trial_id()
        )
        tune.report({"done": 1.0, "ok": result.error is None})

    logger = CmfRayLogger("sweep_train", pipeline_stage="outer", store=str(tmp_path / "store"))
    tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.1}),
        param_space={"x": 1},
        run_config=tune.RunConfig(name="outer", storage_path=str(tmp_path / "tune"), callbacks=[logger], verbose=0),
    ).fit()
    lineage = Lineage(tmp_path / "store" / "mlmd.sqlite", readonly=True)
    by_type = {lineage.store.get_execution_types_by_id([e.type_id])[0].name: e for e in lineage.store.get_executions()}
    trial, run = by_type["Ray_Tune_Trial"], by_type["Ray_Train_Run"]
    assert properties(run)["tune_trial_id"] == properties(trial)["trial_id"]
    step_type = lineage.store.get_artifact_type(STEP_METRICS_TYPE).id
    [artifact] = [
        a
        for a in lineage.store.get_artifacts()
        if a.type_id == step_type and properties(a)["metrics_name"] == "train_steps"
    ]
    producers = {
        e.execution_id for e in lineage.store.get_events_by_artifact_ids([artifact.id]) if e.type == mlpb.Event.OUTPUT
    }
    assert producers == {trial.id, run.id}
    [stage] = [c for c in lineage.store.get_contexts() if c.name == "sweep_train/outer"]
    assert artifact.id in {a.id for a in lineage.store.get_artifacts_by_context(stage.id)}
    assert run.id in {e.id for e in lineage.store.get_executions_by_context(stage.id)}
    # what the trial ran on and its seeds are its run's: they read as the trial's (they read nowhere)
    sweep = Sweep(tmp_path / "store", pipeline="sweep_train")
    [row] = sweep.trials().to_dict(orient="records")
    environment = sweep.environment(row["trial_id"])
    assert row["seed/loader"] == environment["seed/loader"] == 1234
    assert environment["env/cpu_count"] == os.cpu_count()
    assert environment["env/node_id"] == properties(run)["env_node_id"]


def _two_trials(trainable: Any, logger: Any, tmp_path: Path) -> tuple[Sweep, dict[str, float]]:
    """Run ``trainable`` as two Tune trials at once (lr 1 and 10) recorded by ``logger`` into
    ``tmp_path/store``; returns the sweep and each trial's lr."""
    from ray import tune

    tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.1}),
        param_space={"lr": tune.grid_search([1.0, 10.0])},
        run_config=tune.RunConfig(name="outer", storage_path=str(tmp_path / "tune"), callbacks=[logger], verbose=0),
    ).fit()
    sweep = Sweep(tmp_path / "store")
    return sweep, dict(zip(sweep.trials()["trial_id"], sweep.trials()["config/lr"], strict=True))


def test_train_runs_of_one_name_inside_two_trials_are_two_runs(ray_session: None, tmp_path: Path) -> None:
    """Ray Train names a run ``ray_train_run-<the second it started>``: the trials of a sweep that start at
    once name their runs alike. Each trial's run is its own (both trials' runs were one execution)."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from ray_cmf.constants import RUN_EXECUTION_TYPE
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    def trainable(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        steps = StepLogger(
            MetricCollection({"loss": Mean()}), run_name="train", trial_id=trial_id, sync_every=1, system_metrics=None
        )
        for it in range(3):
            steps.metrics.update(loss=torch.tensor(config["lr"] * (it + 1)))
            steps.step()
        steps.finish()
        tune.report({"done": 1.0})

    sweep, configs = _two_trials(trainable, CmfRayLogger("same_run_name", store=str(tmp_path / "store")), tmp_path)
    steps = sweep.of_series("train_steps").steps(["loss"])
    assert {t: rows["loss"].tolist() for t, rows in steps.groupby("trial_id")} == {
        t: [lr, 2 * lr, 3 * lr] for t, lr in configs.items()
    }
    lineage = Lineage(tmp_path / "store" / "mlmd.sqlite", readonly=True)
    runs = lineage.store.get_executions_by_type(RUN_EXECUTION_TYPE)
    assert sorted(properties(r)["tune_trial_id"] for r in runs) == sorted(configs)


def test_two_train_runs_inside_one_trial_read_as_two_series_of_it(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial that runs two Train runs (one after the other) read only the second: both runs' files are the
    trial's, under one series name, so the later one read as a new version of the first (found by a new
    user). Each run is now a series of the trial, named by its run; a trial with one run reads as before."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from ray_cmf.cli import main
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    def trainable(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        for run in ["first", "second"] if config["lr"] == 1.0 else ["only"]:
            steps = StepLogger(
                MetricCollection({"loss": Mean()}), run_name=run, trial_id=trial_id, sync_every=1, system_metrics=None
            )
            steps.log_seeds(**{"графа": len(run)})  # 5, 6, 4
            for it in range(3):
                steps.metrics.update(loss=torch.tensor(config["lr"] * (it + 1) + (run == "second") * 100))
                steps.step(samples=4)
            steps.finish()
        tune.report({"score": 1.0})

    logger = CmfRayLogger("two_runs", metric="score", mode="max", store=str(tmp_path / "store"))
    sweep, configs = _two_trials(trainable, logger, tmp_path)
    steps = sweep.of_series("train_steps").steps(["loss"])
    by_lr = {lr: steps[steps["trial_id"] == t] for t, lr in configs.items()}
    two = by_lr[1.0]
    assert {series: rows["loss"].tolist() for series, rows in two.groupby("series")} == {
        "first": [1.0, 2.0, 3.0],
        "second": [101.0, 102.0, 103.0],
    }
    assert by_lr[10.0]["loss"].tolist() == [10.0, 20.0, 30.0] and by_lr[10.0]["series"].isna().all()
    table = sweep.of_series("train_steps").trials(["loss", "samples_per_s"]).set_index("config/lr")
    assert table.loc[1.0, "steps"] == 6 and table.loc[1.0, "loss_best"] == 1.0 and table.loc[10.0, "steps"] == 3
    throughput = sweep.of_series("train_steps").steps(["samples_per_s"]).groupby("trial_id")["samples_per_s"].max()
    assert table["samples_per_s_best"].tolist() == [throughput[t] for t in table["trial_id"]]  # best is highest
    seeds = {lr: sweep.environment(t)["seed/графа"] for t, lr in configs.items()}
    assert seeds == {1.0: 6, 10.0: 4}  # a trial's seeds are its later run's, as the README says
    # the table named the first run's file as the trial's, and `show` gave the last rows of one series only
    assert table.loc[1.0, "md5"] is None and table.loc[1.0, "url"] is None
    assert isinstance(table.loc[10.0, "md5"], str) and str(table.loc[10.0, "url"]).endswith(".parquet")
    [two_runs] = [t for t, lr in configs.items() if lr == 1.0]
    show = ["show", two_runs, "--store", str(tmp_path / "store"), "--metrics-name", "train_steps", "--rows", "2"]
    capsys.readouterr()  # what the sweep printed
    code = main([*show, "--json"])
    shown = json.loads(capsys.readouterr().out)["last_rows"]
    assert code == 0 and [(r["series"], r["step"]) for r in shown] == [
        (s, i) for s in ("first", "second") for i in (2, 3)
    ]


def _reports_its_lr(config: dict[str, Any]) -> None:
    import ray.train

    for it in range(3):
        ray.train.report({"rep": config["lr"] * (it + 1)})


def test_a_train_callback_in_a_trial_records_what_the_trial_reads(ray_session: None, tmp_path: Path) -> None:
    """A CmfTrainCallback built inside a Tune trial records the run's reports (and its workers' samples) as
    series of the trial: reading the sweep finds them. They were outputs of the Train run only, so the trial
    read 0 steps of ``train_reports`` while its files were on disk (found by a new user)."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_cmf import CmfRayLogger, CmfTrainCallback

    store = str(tmp_path / "store")

    def trainable(config: dict[str, Any]) -> None:
        trainer = TorchTrainer(
            _reports_its_lr,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(
                name="alike",  # as Ray Train names the runs of trials that start in the same second
                storage_path=str(tmp_path / "train" / tune.get_context().get_trial_id()),
                callbacks=[CmfTrainCallback("ignored_in_a_trial", store=store, system_metrics=0.1)],
            ),
        )
        tune.report({"ok": trainer.fit().error is None})

    sweep, configs = _two_trials(trainable, CmfRayLogger("reports_in_trial", store=store), tmp_path)
    reports = sweep.of_series("train_reports").steps(["rep"])
    assert {t: rows["rep"].tolist() for t, rows in reports.groupby("trial_id")} == {
        t: [lr, 2 * lr, 3 * lr] for t, lr in configs.items()
    }
    assert set(sweep.of_series("train_reports").trials()["steps"]) == {3}
    sampled = sweep.of_series("system_metrics").steps()
    # each trial's own sampler and its run's worker: the runs' samplers were one watch, and one trial lost its
    # worker's series (a new user)
    workers = sampled[sampled["rank"].notna()]
    assert workers.groupby("trial_id")["rank"].apply(set).to_dict() == {t: {0} for t in configs}
    assert set(sampled["trial_id"]) == set(configs)


def _reports_val_loss_then_finishes(config: dict[str, Any]) -> None:
    import ray.train
    import torch

    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=2, trial_id=config["trial_id"], system_metrics=None)
    for step in range(1, 5):
        metrics["loss"].update(torch.tensor(float(step)))
        steps.step()
        if step % 2 == 0:
            ray.train.report({"val_loss": 1.0 / step, "step": step})
    steps.finish()


def test_a_train_run_whose_reports_reach_tune_ends_with_its_own_last_report(ray_session: None, tmp_path: Path) -> None:
    """Ray's TuneReportCallback passes a Train run's reports on to the Tune trial that runs it. ``finish()`` made
    one more report, flagged ``ray_cmf_final``, to tell CmfTrainCallback the loop completed: Tune took it for a
    result without the sweep's metric, and with ``TuneConfig(metric=...)`` stopped the whole sweep (found by a
    new user). The run's end is now the controller's alone, and the trial's last result is the loop's."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from ray_cmf import CmfRayLogger, CmfTrainCallback

    store = str(tmp_path / "store")

    def trainable(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        TorchTrainer(
            _reports_val_loss_then_finishes,
            train_loop_config={"trial_id": trial_id},
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(
                storage_path=str(tmp_path / "train"),
                callbacks=[CmfTrainCallback("reaches_tune", store=store, system_metrics=None), TuneReportCallback()],
            ),
        ).fit()

    results = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.1}),
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(
            name="reaches_tune",
            storage_path=str(tmp_path / "tune"),
            callbacks=[CmfRayLogger("reaches_tune", store=store, system_metrics=None)],
            verbose=0,
        ),
    ).fit()
    [result] = results
    assert result.error is None and result.metrics["val_loss"] == 0.25, result.error
    sweep = Sweep(store, pipeline="reaches_tune")
    [trial] = sweep.trials(["val_loss"]).to_dict(orient="records")
    assert trial["status"] == "COMPLETE" and trial["steps"] == 2 and trial["val_loss_final"] == 0.25
    assert not [c for c in sweep.steps().columns if "ray_cmf" in c]
    [run] = sweep.of_series("train_reports").trials().to_dict(orient="records")
    assert run["status"] == "COMPLETE" and run["steps"] == 2


def test_a_step_logger_waits_for_its_trials_registration(ray_session: None, tmp_path: Path) -> None:
    """A Train run inside a Tune trial may start before the driver's writer has registered the trial: the
    StepLogger waits for it (it raised ValueError into the training loop), and an id that never comes is a
    clear error."""
    import threading

    from ray_cmf import RayCmfError
    from ray_cmf.actor import start_writer
    from ray_cmf.constants import TRIAL_EXECUTION_TYPE
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger
    from ray_cmf.writer import StoreWriter

    client = start_writer(tmp_path / "store")
    client.call(StoreWriter.sweep_runs, sweep="the driver's", running=True)  # what CmfRayLogger's setup says

    def register() -> None:
        time.sleep(1.0)
        client.call(
            StoreWriter.bind, kind="trial", name="late", pipeline="p", stage="s", type_name=TRIAL_EXECUTION_TYPE
        )

    threading.Thread(target=register).start()
    steps = StepLogger(MetricCollection({"loss": Mean()}), sync_every=1, trial_id="late", system_metrics=None)
    steps.metrics.update(loss=torch.tensor(1.0))
    steps.step()
    assert steps.finish() is not None
    with pytest.raises(RayCmfError, match=r"'never'.*none was registered in 1 s"):
        StepLogger(MetricCollection({"loss": Mean()}), trial_id="never", system_metrics=None, registration_timeout=1)
    client.call(StoreWriter.sweep_runs, sweep="the driver's", running=False)
    with pytest.raises(RayCmfError, match=r"'nobody'.*no CmfRayLogger runs a sweep"):  # not "none ... in 5 s"
        StepLogger(MetricCollection({"loss": Mean()}), trial_id="nobody", system_metrics=None, registration_timeout=5)


NO_CMF_RAY_LOGGER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import ray
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray_cmf import CmfTrainCallback

    address, store, results = sys.argv[1:]

    def loop(config):
        Path(results, "the loop ran").touch()
        ray.train.report({"loss": 1.0})

    def trainable(config):
        TorchTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(storage_path=results, callbacks=[CmfTrainCallback("inner", store=store)]),
        ).fit()

    ray.init(address=address, log_to_driver=False)  # a job of its own: no CmfRayLogger started its writer
    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.1}), run_config=tune.RunConfig(storage_path=results, verbose=0)
    ).fit()
    print(repr(grid[0].error))
    """
)


def test_a_train_callback_in_a_sweep_without_cmf_ray_logger_is_an_error_before_training(
    ray_session: None, tmp_path: Path
) -> None:
    """A CmfTrainCallback built in a Tune trial records through the writer that the sweep's CmfRayLogger
    starts on the driver. Without one, the run trained, then failed at its first report (a ControllerError
    of Train's, from the callback): logging killed training. Now building the callback says what to add."""
    import subprocess
    import sys

    import ray

    results = tmp_path / "results"
    results.mkdir()
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run(
        [sys.executable, "-c", NO_CMF_RAY_LOGGER, address, str(tmp_path / "store"), str(results)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RayCmfError" in done.stdout and "CmfRayLogger" in done.stdout, done.stdout[-3000:]
    assert not (results / "the loop ran").exists()


def test_the_report_of_a_train_run_shows_each_series_and_rank(two_workers: Path, browser: Any) -> None:
    """A Train run's report: its step series, its ranks' reports and system metrics, each under its name,
    a curve per rank where the series holds several, in Chromium."""
    from tests._browser import open_report, screenshot

    path = _series(two_workers, "train_steps").report(two_workers / "train.html")
    page, _, errors = open_report(browser, path.as_uri(), offline=True)
    titles = page.locator(".plot .gtitle").all_text_contents()
    assert {"loss · train_steps", "top · train_steps", "seen · train_steps", "loss · train_reports"} <= set(titles)
    assert any(t.endswith("· system_metrics") for t in titles)
    assert not any(t.startswith(("step ·", "wall_time ·")) for t in titles)  # axes, not metrics
    reports = titles.index("loss · train_reports")
    names = page.evaluate(f"document.getElementById('curve-{reports}').data.map(t => t.name)")
    assert len(names) == 2 and all("rank" in n for n in names)  # one curve per rank
    screenshot(page, "report-train-run.png")
    assert errors == []


ENDING_DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import ray, torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    import ray_cmf
    from ray_cmf import CmfTrainCallback, StepLogger
    from ray_cmf.metrics import Mean, MetricCollection

    store, progress = sys.argv[1], Path(sys.argv[2])

    def loop(config):
        torch.set_num_threads(1)
        metrics = MetricCollection({"v": Mean()})
        steps = StepLogger(metrics, sync_every=1, pipeline_name="ending", system_metrics=None)
        rank = ray.train.get_context().get_world_rank()
        for step in range(1, config["steps"] + 1):
            metrics.update(v=torch.tensor(float(step), dtype=torch.float64))
            steps.step()
            if step % 10 == 0:
                ray.train.report({"at": step})
            if rank == 0:
                progress.write_text(str(step))
            time.sleep(0.02)
        steps.finish()

    ray.init(num_cpus=3, include_dashboard=False)
    if sys.argv[4] == "callback":
        callbacks = [CmfTrainCallback("ending", store=store)]
    else:  # StepLogger alone: the README's start_writer
        ray_cmf.start_writer(store)
        callbacks = []
    TorchTrainer(
        loop,
        train_loop_config={"lr": 0.1, "名前": "é", "steps": int(sys.argv[5])},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="cut_short", storage_path=sys.argv[3], callbacks=callbacks),
    ).fit()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "callback"),
    [(signal.SIGTERM, "callback"), (signal.SIGINT, "callback"), (signal.SIGTERM, "none"), (None, "none")],
)
def test_a_train_run_whose_driver_is_stopped_ends_canceled_with_its_rows_and_config(
    tmp_path: Path, stop: signal.Signals | None, callback: str
) -> None:
    """A TorchTrainer driver stopped by SIGTERM or Ctrl-C left its run CRASHED with 0 steps, its rows for
    ``recover``, and no config (recorded only at the run's end): the README promises that a driver stopped
    so commits its rows. The run is now recorded as its workers start, and ends with the driver, CANCELED;
    a run that completed stays COMPLETE (without the callback, the driver's end read it CANCELED)."""
    import subprocess
    import sys

    store, progress = tmp_path / "store", tmp_path / "progress"
    steps = "3000" if stop is not None else "30"
    driver = subprocess.Popen(
        [sys.executable, "-c", ENDING_DRIVER, str(store), str(progress), str(tmp_path / "results"), callback, steps],
        env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while stop and time.monotonic() < deadline and int(progress.read_text() or 0 if progress.exists() else 0) < 50:
            time.sleep(0.1)
        if stop is not None:
            driver.send_signal(stop)  # the driver only, as a terminal's Ctrl-C or a scheduler's SIGTERM reaches it
        driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    [run] = Sweep(store, pipeline="ending", metrics_name="train_steps").trials().to_dict("records")
    assert run["status"] == ("CANCELED" if stop is not None else "COMPLETE")
    if stop is None:
        assert run["steps"] == 30
    if callback == "callback":  # the controller's reports and the nodes' samples, which Ray stops with the driver
        reports = Sweep(store, pipeline="ending", metrics_name="train_reports").steps()
        assert sorted(set(reports["rank"])) == [0, 1] and reports["at"].max() >= 40
        samples = Sweep(store, pipeline="ending", metrics_name="system_metrics").steps()
        assert set(samples["series"]) == {"rank0", "rank1"}
    if callback == "callback":  # the run's config is the callback's to record
        assert run["config/lr"] == 0.1 and run["config/名前"] == "é"
    rows = Sweep(store, pipeline="ending", metrics_name="train_steps").steps()
    steps = rows["step"].tolist()
    assert len(steps) >= (40 if stop else 30) and steps == list(range(1, len(steps) + 1))  # committed, in order
    assert rows["v"].tolist() == [float(s) for s in steps]  # each step's mean over both ranks
