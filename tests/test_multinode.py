"""Multi-node without a shared filesystem: a real 2-node cluster whose worker node cannot see the store.

Trials and Train workers run on the worker node (the ``far`` resource); the store lives under a
directory that is an empty tmpfs there. Everything must still land complete in the driver's store,
because only the writer, on the driver's node, touches the store. Faults are real: a trial process is
SIGKILLed, and the whole worker node is killed.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf.compare import Sweep
from ray_cmf.lineage import Lineage, properties
from tests._cluster import TwoNodeCluster, unshare_skip_reason
from tests._require import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _namespaces() -> None:
    """The cluster's worker node needs its own mount and network namespaces (root)."""
    require(unshare_skip_reason())


PRELUDE = """
import json, os, signal, sys, time
from pathlib import Path
import ray
from ray import tune
import ray_cmf
address, hidden, shared = sys.argv[1], sys.argv[2], Path(sys.argv[3])
ray.init(address=address, log_to_driver=False)
DRIVER_NODE = ray.get_runtime_context().get_node_id()

def where():
    return {"node": ray.get_runtime_context().get_node_id(), "sees_store": any(Path(hidden).iterdir())}
"""

TUNE_DRIVER = PRELUDE + textwrap.dedent(
    """
    def trainable(config):
        cmf = ray_cmf.tune.get_cmf(flush_rows=30)
        cmf.set_tags(team="far", lr=config["lr"])  # through the writer: this node cannot see the store
        for it in range(10):
            for sub in range(20):
                cmf.log_metric("steps", {"it": it, "sub": sub, "lr": config["lr"]})
            tune.report({"loss": config["lr"] / (it + 1), **where()})
        cmf.commit_metrics("steps")

    logger = ray_cmf.CmfRayLogger("mn_tune", metric="loss", mode="min", flush_rows=4)  # store: $RAY_CMF_STORE
    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1, "far": 1}),
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(name="mn", storage_path=str(shared / "results"), callbacks=[logger], verbose=0),
    ).fit()
    print(json.dumps({"driver": DRIVER_NODE, "trials": [dict(r.metrics) for r in grid]}, default=str))
    """
)

ZERO_CODE_DRIVER = PRELUDE + textwrap.dedent(
    """
    from ray._private.state import actors

    def trainable(config):  # no ray_cmf call: its process is sampled from outside
        for it in range(4):
            time.sleep(0.2)
            tune.report({"loss": config["lr"] / (it + 1), **where()})

    logger = ray_cmf.CmfRayLogger("mn_zero", system_metrics=0.2)  # store: $RAY_CMF_STORE
    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1, "far": 1}),
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(name="mn0", storage_path=str(shared / "results"), callbacks=[logger], verbose=0),
    ).fit()
    samplers = [a["Address"]["NodeID"] for a in actors().values() if a["ActorClassName"] == "NodeSampler"]
    print(json.dumps({"trials": [dict(r.metrics) for r in grid], "samplers": samplers}, default=str))
    """
)

TRAIN_LOOP = """
def loop(config):
    import ray.train, torch
    from ray_cmf.metrics import Max, Mean, MetricCollection
    from ray_cmf.train import StepLogger
    rank = ray.train.get_context().get_world_rank()
    metrics = MetricCollection({"loss": Mean(), "top": Max()})
    steps = StepLogger(metrics, sync_every=5, report_every=1, pipeline_name=config["pipeline"],
                       trial_id=config.get("trial_id"), store=config.get("store"), flush_rows=2)
    for step in range(1, 51):
        metrics.update(loss=torch.tensor(float(step * (rank + 1))), top=torch.tensor(float(step)))
        steps.step(samples=4)
    steps.finish()
    if rank == 0:
        (shared / f"where-{config['pipeline']}.json").write_text(json.dumps(where()))

def trainer(name, pipeline, store=None, worker_store=None, **config):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    return TorchTrainer(
        loop,
        train_loop_config={"pipeline": pipeline, "store": worker_store, **config},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "far": 0.9}),
        run_config=RunConfig(name=name, storage_path=str(shared / "results"),
                             callbacks=[ray_cmf.CmfTrainCallback(pipeline, store=store)]),
    )
"""

TRAIN_DRIVER = (
    PRELUDE
    + TRAIN_LOOP
    + textwrap.dedent(
        """
    result = trainer("mn_train_run", "mn_train", store=sys.argv[4]).fit()
    assert result.error is None, result.error
    print(json.dumps({"driver": DRIVER_NODE}))
    """
    )
)

TRAIN_ZERO_DRIVER = PRELUDE + textwrap.dedent(
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def report_only(config):  # no ray_cmf call: the workers' processes are sampled from their node
        import ray.train
        rank = ray.train.get_context().get_world_rank()
        (shared / f"train0-rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), **where()}))
        for step in range(1, 5):
            time.sleep(0.2)
            ray.train.report({"step": step, "loss": 1.0 / step})

    callback = ray_cmf.CmfTrainCallback("mn_train0", store=sys.argv[4], system_metrics=0.2)
    result = TorchTrainer(
        report_only,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "far": 0.9}),
        run_config=RunConfig(name="mn_train0_run", storage_path=str(shared / "results"), callbacks=[callback]),
    ).fit()
    assert result.error is None, result.error
    print(json.dumps({"driver": DRIVER_NODE}))
    """
)

ELSEWHERE_DRIVER = (
    PRELUDE
    + TRAIN_LOOP
    + textwrap.dedent(
        """
    ray_cmf.Cmf(filepath=sys.argv[5], pipeline_name="setup", store=sys.argv[4])  # the store's MLMD is elsewhere
    result = trainer("mn_elsewhere_run", "mn_elsewhere", store=sys.argv[4], worker_store=sys.argv[4]).fit()
    assert result.error is None, result.error
    print(json.dumps({"driver": DRIVER_NODE}))
    """
    )
)

TUNE_TRAIN_DRIVER = (
    PRELUDE
    + TRAIN_LOOP
    + textwrap.dedent(
        """
    def trainable(config):
        trial_id = tune.get_context().get_trial_id()
        result = trainer(f"inner-{trial_id}", "mn_nested", trial_id=trial_id).fit()  # built in the trial
        tune.report({"ok": result.error is None, **where()})

    logger = ray_cmf.CmfRayLogger("mn_nested", pipeline_stage="outer", store=sys.argv[4])
    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0, "far": 0.1}),
        param_space={"x": 1},
        run_config=tune.RunConfig(name="outer", storage_path=str(shared / "results"), callbacks=[logger], verbose=0),
    ).fit()
    print(json.dumps({"driver": DRIVER_NODE, "trials": [dict(r.metrics) for r in grid]}, default=str))
    """
    )
)

SLOW_TRIAL_DRIVER = PRELUDE + textwrap.dedent(
    """
    FLUSH, KILL_AT = 50, int(sys.argv[5])

    def trainable(config):
        cmf = ray_cmf.tune.get_cmf(flush_rows=FLUSH)
        progress = shared / "progress"
        for i in range(1, 100_000):
            cmf.log_metric("steps", {"i": i})
            if i % FLUSH == 0:
                (shared / "progress.tmp").write_text(str(i))  # rows sealed and sent so far, renamed into place:
                (shared / "progress.tmp").replace(progress)  # the test reads it while this runs
                time.sleep(0.2)
            if i == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)  # the trial process dies for real
            time.sleep(0.002)

    logger = ray_cmf.CmfRayLogger("mn_fault", store=sys.argv[4])
    tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1, "far": 1}),
        param_space={"x": 1},
        run_config=tune.RunConfig(name="fault", storage_path=str(shared / "results"), callbacks=[logger], verbose=0),
    ).fit()
    print(json.dumps({"driver": DRIVER_NODE}))
    """
)


NO_WRITER_DRIVER = PRELUDE + textwrap.dedent(
    """
    left = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == "ray_cmf_writer"]

    @ray.remote(num_cpus=1, resources={"far": 1})
    def trial_without_writer():
        from ray_cmf.actor import connect

        try:
            connect()
        except ray_cmf.RayCmfError as exc:
            return str(exc)
        return "connected"

    print(json.dumps({"left": left, "error": ray.get(trial_without_writer.remote())}))
    """
)


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the worker node cannot see; each test's store lives in it."""
    path = tmp_path_factory.mktemp("driver_only")
    (path / "marker").write_text("only the driver's node sees this")
    return path


@pytest.fixture(scope="module")
def cluster(hidden: Path) -> Iterator[TwoNodeCluster]:
    cluster = TwoNodeCluster(hidden)
    yield cluster
    cluster.close()


def _driver(cluster: TwoNodeCluster, script: str, hidden: Path, shared: Path, *extra: str, **kw: Any) -> dict:
    out = cluster.run_driver(script, str(hidden), str(shared), *extra, **kw)
    return json.loads(out.strip().splitlines()[-1])


def _executions(store: Path) -> dict[str, Any]:
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    return {e.name: e for e in lineage.store.get_executions()}


def test_tune_in_trial_series_and_results_land_in_the_drivers_store(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    store = hidden / "tune_store"
    out = _driver(cluster, TUNE_DRIVER, hidden, tmp_path, env={"RAY_CMF_STORE": str(store)})
    assert len(out["trials"]) == 2
    for metrics in out["trials"]:
        assert metrics["node"] != out["driver"] and metrics["sees_store"] is False  # really elsewhere, blind
    executions = _executions(store)
    assert len(executions) == 2
    assert all(e.last_known_state == mlpb.Execution.COMPLETE for e in executions.values())
    tags = Sweep(store, pipeline="mn_tune").trials()[["tag/team", "tag/lr"]].values.tolist()
    assert sorted(tags) == [["far", "0.1"], ["far", "0.2"]]
    results = Sweep(store, pipeline="mn_tune").steps(["loss"])
    assert results.groupby("trial_id")["step"].apply(list).tolist() == [list(range(1, 11))] * 2
    steps = Sweep(store, pipeline="mn_tune", metrics_name="steps")
    for trial in steps.files():
        import pyarrow.parquet as pq

        table = pq.read_table(trial.path).to_pandas()
        assert table["SequenceNumber"].tolist() == list(range(1, 201))  # 0 of 200 rows lost, in order
        assert len(set(table["lr"])) == 1


def test_trials_that_log_nothing_are_sampled_on_their_node(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    """The trainables call only ``tune.report``, on the node that cannot see the store: that node's sampler
    samples each trial's process into its ``system_metrics`` series at the driver's writer."""
    store = hidden / "zero_store"
    out = _driver(cluster, ZERO_CODE_DRIVER, hidden, tmp_path, env={"RAY_CMF_STORE": str(store)})
    far = {m["node"] for m in out["trials"]}
    assert len(far) == 1 and far <= set(out["samplers"]) and all(m["sees_store"] is False for m in out["trials"])
    pids = {m["trial_id"]: m["pid"] for m in out["trials"]}
    system = Sweep(store, pipeline="mn_zero", metrics_name="system_metrics").steps(["pid", "proc_rss_mb"])
    for trial_id, rows in system.groupby("trial_id"):
        assert len(rows) >= 2 and set(rows["pid"]) == {pids[trial_id]} and (rows["proc_rss_mb"] > 0).all()
    assert set(system["trial_id"]) == set(pids)


def test_train_run_on_the_worker_node_lands_in_the_drivers_store(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    store = hidden / "train_store"
    out = _driver(cluster, TRAIN_DRIVER, hidden, tmp_path, str(store))
    where = json.loads((tmp_path / "where-mn_train.json").read_text())
    assert where["node"] != out["driver"] and where["sees_store"] is False
    [execution] = _executions(store).values()
    assert execution.last_known_state == mlpb.Execution.COMPLETE
    steps = Sweep(store, pipeline="mn_train", metrics_name="train_steps").steps(["loss", "top"])
    assert steps["step"].tolist() == list(range(5, 51, 5))  # 10 of 10 rows
    assert steps["top"].tolist() == [float(s) for s in range(5, 51, 5)]
    reports = Sweep(store, pipeline="mn_train", metrics_name="train_reports").steps(["rank"])
    assert sorted(set(reports["rank"])) == [0, 1]


def test_train_workers_that_log_nothing_are_sampled_on_their_node(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    """A TorchTrainer loop that only reports, on the node that cannot see the store: that node's sampler samples
    each worker's process into its rank's ``system_metrics`` series at the driver's writer."""
    store = hidden / "train_zero_store"
    out = _driver(cluster, TRAIN_ZERO_DRIVER, hidden, tmp_path, str(store))
    workers = {rank: json.loads((tmp_path / f"train0-rank{rank}.json").read_text()) for rank in (0, 1)}
    assert all(w["node"] != out["driver"] and w["sees_store"] is False for w in workers.values())  # elsewhere, blind
    pids = {rank: {w["pid"]} for rank, w in workers.items()}
    system = Sweep(store, pipeline="mn_train0", metrics_name="system_metrics").steps(["rank", "pid", "proc_rss_mb"])
    sampled = {int(rank): rows for rank, rows in system.groupby("rank")}
    assert sorted(sampled) == [0, 1] == sorted(pids)
    for rank, rows in sampled.items():
        assert len(rows) >= 2 and set(rows["pid"]) == pids[rank] and (rows["proc_rss_mb"] > 0).all()
    [execution] = _executions(store).values()
    assert execution.last_known_state == mlpb.Execution.COMPLETE


def test_a_worker_that_names_the_store_uses_the_drivers_description_of_it(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    """StepLogger(store=PATH) on the blind node: the store's config file (its MLMD lives elsewhere) is read
    by the writer, where the store is; the worker used to read its own disk, find no config, and point the
    writer at a new SQLite file inside the store."""
    store, elsewhere = hidden / "elsewhere_store", hidden / "elsewhere.sqlite"
    _driver(cluster, ELSEWHERE_DRIVER, hidden, tmp_path, str(store), str(elsewhere))
    assert not (store / "mlmd.sqlite").exists()
    runs = [e for e in Lineage(elsewhere, readonly=True).store.get_executions() if e.name == "mn_elsewhere_run"]
    assert len(runs) == 1 and runs[0].last_known_state == mlpb.Execution.COMPLETE
    steps = Sweep(store, pipeline="mn_elsewhere", metrics_name="train_steps").steps(["loss"])
    assert steps["step"].tolist() == list(range(5, 51, 5))


def test_torch_trainer_inside_a_tune_trial_on_the_worker_node(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    store = hidden / "nested_store"
    out = _driver(cluster, TUNE_TRAIN_DRIVER, hidden, tmp_path, str(store))
    [trial_metrics] = out["trials"]
    assert trial_metrics["ok"] is True and trial_metrics["sees_store"] is False
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    by_type = {lineage.store.get_execution_types_by_id([e.type_id])[0].name: e for e in lineage.store.get_executions()}
    trial, run = by_type["Ray_Tune_Trial"], by_type["Ray_Train_Run"]
    assert properties(run)["tune_trial_id"] == properties(trial)["trial_id"]
    assert run.last_known_state == mlpb.Execution.COMPLETE
    files = Sweep(store, pipeline="mn_nested", metrics_name="train_steps").files()
    import pyarrow.parquet as pq

    assert pq.read_table(files[0].path).column("step").to_pylist() == list(range(5, 51, 5))
    events = lineage.store.get_events_by_artifact_ids([_artifact_id(lineage, files[0])])
    assert {e.execution_id for e in events if e.type == mlpb.Event.OUTPUT} == {trial.id, run.id}


def _artifact_id(lineage: Lineage, trial_file: Any) -> int:
    [artifact] = [a for a in lineage.store.get_artifacts() if properties(a).get("Commit") == trial_file.md5]
    return artifact.id


def _committed_rows(store: Path, pipeline: str) -> list[int]:
    import pyarrow.parquet as pq

    return pq.read_table(Sweep(store, pipeline=pipeline, metrics_name="steps").files()[0].path).column("i").to_pylist()


def test_sigkilled_trial_loses_at_most_one_flush_interval(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    store = hidden / "kill_store"
    _driver(cluster, SLOW_TRIAL_DRIVER, hidden, tmp_path, str(store), "425")
    rows = _committed_rows(store, "mn_fault")  # committed by the writer when Tune saw the trial die
    print(f"SIGKILLed trial: logged 425 rows (flush_rows=50), committed {len(rows)}, lost {425 - len(rows)}")
    assert rows == list(range(1, len(rows) + 1))  # a prefix: no holes, no duplicates
    assert 425 - 50 <= len(rows) <= 425
    [execution] = _executions(store).values()
    assert execution.last_known_state == mlpb.Execution.FAILED


def test_killed_worker_node_loses_at_most_one_flush_interval(hidden: Path, tmp_path: Path) -> None:
    """A whole worker node dies (raylet and workers, SIGKILL): the rows that reached the writer are committed."""
    import subprocess

    own = TwoNodeCluster(hidden)
    store = hidden / "node_store"
    try:
        driver = own.driver(
            SLOW_TRIAL_DRIVER,
            str(hidden),
            str(tmp_path),
            str(store),
            "0",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        progress = tmp_path / "progress"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (progress.exists() and int(progress.read_text() or 0) >= 300):
            time.sleep(0.1)
        sent = int(progress.read_text())
        own.stop_far()
        _, stderr = driver.communicate(timeout=300)
        assert driver.returncode == 0, stderr[-4000:]
    finally:
        own.close()
    sealed = int(progress.read_text())  # rows sealed and sent before the trial died with its node
    rows = _committed_rows(store, "mn_fault")
    print(
        f"killed worker node: killed at >= {sent} rows sealed, the trial had sealed {sealed} when it died "
        f"(flush_rows=50); committed {len(rows)}: lost {sealed - len(rows)} sealed rows + < 50 unsealed"
    )
    assert sealed >= sent
    assert rows == list(range(1, len(rows) + 1))
    assert len(rows) >= sealed - 50  # at most one flush interval in flight is lost, plus the unsealed rows


def test_writer_ends_with_its_job_and_a_trial_without_one_says_what_to_add(
    cluster: TwoNodeCluster, hidden: Path, tmp_path: Path
) -> None:
    out = _driver(cluster, NO_WRITER_DRIVER, hidden, tmp_path)
    assert out["left"] == []  # the earlier tests' jobs ended, and their writers with them
    assert "No ray_cmf writer runs in this Ray job" in out["error"] and "CmfRayLogger" in out["error"]
