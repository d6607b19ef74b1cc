"""CmfRayLogger against real Tune sweeps, a real MLMD store and a real DVC repo."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf import MetricsNotFoundError, Store, Sweep
from ray_cmf.attempts import dedup_attempts
from ray_cmf.constants import DATASET_TYPE, MODEL_TYPE, RESULTS_METRICS_NAME, STEP_METRICS_TYPE, TRIAL_EXECUTION_TYPE
from ray_cmf.frames import SERIES_COLUMN
from ray_cmf.lineage import Lineage, properties
from ray_cmf.system import CPU_WINDOW_S
from ray_cmf.versioning import file_md5

pytestmark = pytest.mark.integration

GOOD_LRS = [0.1, 0.2, 0.3, 0.4]
FAIL_LATE, FAIL_EARLY = 0.5, 0.6
RESULTS = 20


def _trainable_factory(logger: Any) -> Any:
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        lr = config["lr"]
        if lr == FAIL_EARLY:
            raise RuntimeError("fails before its first result")
        trial_id = tune.get_context().get_trial_id()
        cmf = logger.cmf_obj[trial_id]  # the cmflib pattern, inside the trial
        model = Path(tune.get_context().get_trial_dir()) / "model.bin"
        for it in range(RESULTS):
            for sub in range(5):
                cmf.log_metric("fine", {"it": it, "sub": sub, "lr_echo": lr})
            cmf.log_metric("uncommitted", {"it": it, "lr_echo": lr})  # never committed by the trainable
            if lr == FAIL_LATE and it == 3:
                raise RuntimeError("fails after 3 results")
            model.write_bytes(f"weights {lr} {it}".encode())
            tune.report(
                {
                    "loss": lr / (it + 1),
                    "lr_echo": lr,
                    "note": "text",
                    "nested": {"a": it, "none": None if it % 2 else it},
                    "maybe_nan": math.nan if it % 2 else 1.0,
                    "model_path": str(model),
                }
            )
        cmf.commit_metrics("fine")

    return trainable


@pytest.fixture(scope="session")
def sweep(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from ray import tune

    from ray_cmf import CmfRayLogger

    tmp = tmp_path_factory.mktemp("sweep")
    data = tmp / "data"
    data.mkdir()
    (data / "train.csv").write_text("x,y\n1,2\n")
    store = tmp / "store"
    logger = CmfRayLogger(
        "sweep", pipeline_stage="stage1", data_dir=str(data), metric="loss", mode="min", top_n=2, store=str(store)
    )
    tuner = tune.Tuner(
        _trainable_factory(logger),
        param_space={"lr": tune.grid_search([*GOOD_LRS, FAIL_LATE, FAIL_EARLY]), "nested": {"depth": 2}},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name="exp", storage_path=str(tmp / "results"), callbacks=[logger], verbose=0),
    )
    grid = tuner.fit()
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    executions = {properties(e)["trial_id"]: e for e in lineage.store.get_executions()}
    lrs = {r.metrics.get("trial_id") or r.path.split("_")[-1]: r.config["lr"] for r in grid}
    by_lr = {properties(e)["lr"]: e for e in executions.values()}
    return {"store": store, "lineage": lineage, "executions": executions, "by_lr": by_lr, "grid": grid, "lrs": lrs}


def _artifacts(sweep: dict[str, Any], execution: Any, type_name: str = STEP_METRICS_TYPE) -> dict[str, Any]:
    lineage: Lineage = sweep["lineage"]
    type_id = lineage.store.get_artifact_type(type_name).id
    events = lineage.store.get_events_by_execution_ids([execution.id])
    ids = [e.artifact_id for e in events]
    arts = [a for a in lineage.store.get_artifacts_by_id(ids) if a.type_id == type_id]
    return {properties(a).get("metrics_name", a.name): a for a in arts}


def _frame(sweep: dict[str, Any], artifact: Any):
    return pq.read_table(sweep["store"] / properties(artifact)["url"]).to_pandas()


def test_mlmd_structure_one_execution_per_trial(sweep: dict[str, Any]) -> None:
    lineage: Lineage = sweep["lineage"]
    [pipeline] = lineage.pipelines()
    assert pipeline.name == "sweep"
    [stage] = lineage.stages(pipeline)
    assert stage.name == "sweep/stage1"
    executions = sweep["executions"]
    assert len(executions) == 6
    assert {e.id for e in lineage.store.get_executions_by_context(stage.id)} == {e.id for e in executions.values()}
    for trial_id, execution in executions.items():
        props = properties(execution)
        assert props["trial_id"] == trial_id and props["experiment"] == "stage1"
        assert props["nested.depth"] == 2 and '"lr"' in props["config_json"]


def test_per_trial_isolation_and_md5(sweep: dict[str, Any]) -> None:
    for lr in GOOD_LRS:
        execution = sweep["by_lr"][lr]
        arts = _artifacts(sweep, execution)
        results = _frame(sweep, arts["tune_results"])
        assert len(results) == RESULTS
        assert set(results["lr_echo"]) == {lr}  # no other trial's rows
        assert results["training_iteration"].tolist() == list(range(1, RESULTS + 1))
        assert set(arts) == {"tune_results", "fine", "uncommitted", "system_metrics"}
        for name, artifact in arts.items():
            path = sweep["store"] / properties(artifact)["url"]
            assert properties(artifact)["Commit"] == hashlib.md5(path.read_bytes()).hexdigest()
            if name != "system_metrics":  # sampled from outside the trial: it logs no lr_echo
                assert lr == pytest.approx(_frame(sweep, artifact)["lr_echo"].iloc[0])


def test_in_trial_fine_grained_logging(sweep: dict[str, Any]) -> None:
    for lr in GOOD_LRS:
        fine = _frame(sweep, _artifacts(sweep, sweep["by_lr"][lr])["fine"])
        assert len(fine) == RESULTS * 5 and set(fine["lr_echo"]) == {lr}
        assert fine["SequenceNumber"].tolist() == list(range(1, RESULTS * 5 + 1))


def test_completed_trials_record_best_status_and_top_n(sweep: dict[str, Any]) -> None:
    for lr in GOOD_LRS:
        execution = sweep["by_lr"][lr]
        props = properties(execution)
        assert execution.last_known_state == mlpb.Execution.COMPLETE and props["status"] == "COMPLETE"
        assert props["best_loss"] == pytest.approx(lr / RESULTS)
        assert props["in_top_n"] is (lr in (0.1, 0.2))


def test_error_paths_commit_what_exists_and_mark_failed(sweep: dict[str, Any]) -> None:
    late, early = sweep["by_lr"][FAIL_LATE], sweep["by_lr"][FAIL_EARLY]
    for execution in (late, early):
        assert execution.last_known_state == mlpb.Execution.FAILED and properties(execution)["status"] == "FAILED"
    assert len(_frame(sweep, _artifacts(sweep, late)["tune_results"])) == 3
    assert "tune_results" not in _artifacts(sweep, early)  # nothing was logged, nothing committed
    assert math.isnan(properties(early)["best_loss"])
    for execution, raised in ((late, "RuntimeError: fails after 3 results"), (early, "fails before its first")):
        error = properties(execution)["error"]  # what the trial raised, as Tune recorded it, without colours
        assert raised in error and "\x1b" not in error


def test_the_trial_table_and_show_say_why_a_trial_failed(sweep: dict[str, Any], capsys: Any) -> None:
    """A FAILED trial's error is in its row of the table (None for the others) and in ``show``."""
    from ray_cmf import Sweep
    from ray_cmf.cli import main

    table = Sweep(sweep["store"], pipeline="sweep").trials(metrics=[]).set_index("trial_id")
    late = properties(sweep["by_lr"][FAIL_LATE])["trial_id"]
    assert "RuntimeError: fails after 3 results" in table.loc[late, "error"]
    assert table["error"].isna().sum() == len(GOOD_LRS)
    assert main(["show", late, "--store", str(sweep["store"])]) == 0
    assert "fails after 3 results" in capsys.readouterr().out
    assert main(["trials", "--store", str(sweep["store"]), "--json"]) == 0  # the whole text
    errors = {row["trial_id"]: row["error"] for row in json.loads(capsys.readouterr().out)}
    assert errors[late] == table.loc[late, "error"] and "\n" in errors[late]  # a traceback, not one line
    assert main(["trials", "--store", str(sweep["store"]), "--status", "FAILED"]) == 0  # its last line
    out = capsys.readouterr().out
    assert "RuntimeError: fails after 3 results" in out and "File " not in out


def test_a_series_the_trainable_never_committed_is_committed_when_its_trial_ends(sweep: dict[str, Any]) -> None:
    """Every trial logs an "uncommitted" series and never commits or flushes it; its rows are still in the
    trial's memory (fewer than a chunk) when the trainable returns or raises. All of them are committed."""
    for lr in GOOD_LRS:
        arts = _artifacts(sweep, sweep["by_lr"][lr])
        assert _frame(sweep, arts["uncommitted"])["it"].tolist() == list(range(RESULTS))
        assert properties(arts["uncommitted"])["at_end"] is True
    failed = _artifacts(sweep, sweep["by_lr"][FAIL_LATE])  # raised mid-run: "fine" was never committed either
    assert _frame(sweep, failed["uncommitted"])["it"].tolist() == [0, 1, 2, 3]
    assert _frame(sweep, failed["fine"])[["it", "sub"]].values.tolist() == [[i, s] for i in range(4) for s in range(5)]
    assert properties(failed["fine"])["at_end"] is True


def test_odd_result_values_are_handled_as_documented(sweep: dict[str, Any]) -> None:
    results = _frame(sweep, _artifacts(sweep, sweep["by_lr"][0.1])["tune_results"])
    assert "note" not in results.columns and "config/lr" not in results.columns  # strings, config dropped
    assert results["nested/a"].tolist() == list(range(RESULTS))  # nested dicts flattened with '/'
    assert results["nested/none"].isna().tolist() == [it % 2 == 1 for it in range(RESULTS)]  # None is null
    assert results["maybe_nan"].isna().sum() == RESULTS // 2 and results["maybe_nan"].notna().sum() == RESULTS // 2
    assert math.isnan(results["maybe_nan"].iloc[1])  # NaN kept as data (not null)
    assert results["attempt"].eq(1).all()


def test_dataset_and_model_artifacts(sweep: dict[str, Any]) -> None:
    execution = sweep["by_lr"][0.1]
    [dataset] = _artifacts(sweep, execution, DATASET_TYPE).values()
    assert properties(dataset)["Commit"].endswith(".dir")
    models = [properties(m) for m in _artifacts(sweep, execution, MODEL_TYPE).values()]
    # the trial wrote over its model at every result: recorded at its first result (hashed by the writer a
    # moment later) and again as the trial left it, which verify finds there; never once per result
    assert 1 <= len(models) <= 2 and len({m["url"] for m in models}) == 1
    assert file_md5(Path(models[0]["url"])) == models[-1]["Commit"]


def test_dvc_agrees(sweep: dict[str, Any]) -> None:
    out = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=sweep["store"], capture_output=True, text=True)
    assert out.returncode == 0 and "up to date" in out.stdout


def test_result_row_filters_values() -> None:
    import numpy as np

    from ray_cmf.results import result_row

    row = result_row(
        {
            "loss": np.float32(0.5),
            "config": {"lr": 1},
            "pid": 3,
            "date": "x",
            "ok": True,
            "obj": object(),
            "nested": {"deep": {"x": 1}},
            "training_iteration": 4,
        }
    )
    assert row == {"loss": 0.5, "ok": True, "nested/deep/x": 1, "training_iteration": 4}


def test_a_results_model_path_is_no_metric_and_draws_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """CmfRayLogger records a result's ``model_path`` as the trial's model, yet every such trial was warned
    that ray_cmf does not record it (found by a new user)."""
    from ray_cmf.results import result_row

    with caplog.at_level("WARNING", logger="ray_cmf"):
        assert result_row({"loss": 1.0, "model_path": "/tmp/model.pt"}) == {"loss": 1.0}
    assert "model_path" not in caplog.text


def test_a_result_value_that_is_not_a_number_is_named_once_as_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """``tune.report({"per_class_acc": [0.9, 0.7]})`` or a text metric vanished from the trial's series without
    a word. Each such metric is now named once (its type too), and the rest of the result is kept."""
    import numpy as np
    import torch

    from ray_cmf.results import result_row

    result = {
        "loss": 0.5,
        "per_class_acc": [0.9, 0.7],
        "confusion": np.eye(2),
        "logits": torch.ones(3),
        "phase": "warmup",
        "val": {"hist": (1, 2)},
        "hostname": "node-1",  # Tune's own text: dropped without a word
    }
    for _ in range(3):
        assert result_row(result) == {"loss": 0.5}
    dropped = [r.getMessage() for r in caplog.records if "does not record" in r.getMessage()]
    named = {"per_class_acc": "list", "confusion": "ndarray", "logits": "Tensor", "phase": "str", "val/hist": "tuple"}
    assert len(dropped) == len(named)  # once per metric, not once per result
    for name, kind in named.items():
        assert any(repr(name) in m and kind in m for m in dropped), (name, dropped)


def test_a_sweep_ranked_by_max_is_read_back_by_max(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CmfRayLogger(mode="max") records its mode: reading the sweep back without a mode ranks by it, so that
    ``_best``, ``best()``, ``top_rank``, the CLI and the report agree (they took the lowest accuracy as best)."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep
    from ray_cmf.cli import main

    def trainable(config: dict[str, Any]) -> None:
        for acc in config["accs"]:
            tune.report({"acc": acc})

    store = tmp_path / "store"
    logger = CmfRayLogger("ranked", metric="acc", mode="max", top_n=1, store=str(store))
    tune.Tuner(
        trainable,
        param_space={"accs": tune.grid_search([[0.8, 0.6], [0.5, 0.9]])},  # the best trial is the second
        run_config=tune.RunConfig(name="ranked", storage_path=str(tmp_path / "results"), callbacks=[logger], verbose=0),
    ).fit()
    sweep = Sweep(store)
    assert sweep.modes() == {"acc": "max"}
    table = sweep.trials(["acc"]).set_index("config/accs")
    assert table["acc_best"].to_dict() == {"[0.5, 0.9]": 0.9, "[0.8, 0.6]": 0.8}
    best = sweep.best("acc").iloc[0]
    assert best["config/accs"] == "[0.5, 0.9]" and best["top_rank"] == 1
    assert sweep.best("acc", "min").iloc[0]["acc_best"] == 0.5  # a mode given still decides
    assert main(["compare", "--store", str(store), "--metric", "acc", "--top", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["trials", "--store", str(store), "--json"]) == 0  # no --metric: best first by the logger's
    assert [row["config/accs"] for row in json.loads(capsys.readouterr().out)] == [[0.5, 0.9], [0.8, 0.6]]  # lists
    page = sweep.report(tmp_path / "r.html").read_text()
    assert '"mode": "max"' in page and page.index("[0.5, 0.9]") < page.index("[0.8, 0.6]")


def test_logger_is_picklable_and_validates_arguments(tmp_path: Path) -> None:
    import pickle

    from ray_cmf import CmfRayLogger

    logger = CmfRayLogger("p", store=str(tmp_path), metric="loss", order="max", top_n=1)
    clone = pickle.loads(pickle.dumps(logger))
    assert clone.mode == "max" and clone.root == logger.root
    with pytest.raises(ValueError, match="disagree"):
        CmfRayLogger("p", metric="loss", order="min", mode="max")
    with pytest.raises(ValueError, match="'median'"):
        CmfRayLogger("p", metric="loss", mode="median")
    with pytest.raises(ValueError, match="top_n"):
        CmfRayLogger("p", top_n=2)
    for tunes in ("done", "pid", "trial_id"):  # Tune's own keys: the warning at the sweep's end said not why
        with pytest.raises(ValueError, match=rf"metric={tunes!r} is Tune's own bookkeeping.*not recorded"):
            CmfRayLogger("p", metric=tunes)
        with pytest.raises(ValueError, match=rf"modes\[{tunes!r}\]: Tune's own bookkeeping"):
            CmfRayLogger("p", modes={tunes: "max"})


RESTORE_DRIVER = textwrap.dedent(
    """
    import os, sys, time, tempfile
    from pathlib import Path
    import ray
    from ray import tune
    from ray.tune import Checkpoint
    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import get_cmf

    store, results, phase = sys.argv[1], sys.argv[2], sys.argv[3]
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)  # every trial at once

    def trainable(config):
        cmf = get_cmf()
        start = 0
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            start = int((Path(checkpoint.path) / "it").read_text())
        for it in range(start, 3 if config["lr"] == 0.05 else 30):  # 0.05 ends before the driver is killed
            time.sleep(0.15)
            cmf.log_metric("fine", {"step": it, "lr": config["lr"]})  # re-logged after a restore, as Tune re-reports
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "it").write_text(str(it + 1))
                tune.report({"loss": config["lr"] / (it + 1), "it": it}, checkpoint=Checkpoint.from_directory(d))

    if phase == "first":
        logger = CmfRayLogger("restore", pipeline_stage="exp", metric="loss", mode="min", top_n=2, store=store)
        tuner = tune.Tuner(trainable, param_space={"lr": tune.grid_search([0.05, 0.1, 0.2])},
                           run_config=tune.RunConfig(name="exp", storage_path=results, callbacks=[logger], verbose=0))
    else:
        tuner = tune.Tuner.restore(os.path.join(results, "exp"), trainable=trainable, resume_unfinished=True)
    print("fit", flush=True)
    tuner.fit()
    print("done", flush=True)
    """
)


def _spilled_results(spill: Path) -> list[int]:
    """Tune results in each trial's spill directory (complete batches only), while a writer appends to them."""
    from ray_cmf.series_format import read_segments

    found = spill.glob(f"*-{RESULTS_METRICS_NAME}") if spill.is_dir() else []
    return [sum(b.num_rows for b in read_segments(d)) for d in found]


@pytest.mark.slow
@pytest.mark.parametrize("interruption", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_restore_continues_the_same_executions_without_dups_or_holes(tmp_path: Path, interruption: str) -> None:
    """Under Tune's default settings (its experiment checkpoint, and the callback state in it, may be older
    than what the store holds), the driver is stopped 12 results into two 30-result trials, then restored:
    killed with everything it started, or interrupted as Ctrl-C or a scheduler's SIGTERM does (what the
    trials logged is committed, and they end CANCELED, before the driver exits). Under SIGKILL the get_cmf()
    series had a hole: the rows logged before the checkpoint the restore resumed from had not left the
    trial's memory. Under SIGTERM, which Tune answers by exiting at once, the trials were left CRASHED with
    nothing committed."""
    store, results = tmp_path / "store", tmp_path / "results"
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    first = subprocess.Popen(
        [sys.executable, "-c", RESTORE_DRIVER, str(store), str(results), "first"], env=env, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until both long trials have 12 results in the store
        if sorted(_spilled_results(store / "spill"))[-2:] >= [12, 12]:
            break
        time.sleep(0.1)
    if interruption == "SIGKILL":
        os.killpg(first.pid, signal.SIGKILL)  # the driver and everything it started, for real
        first.wait()
    else:
        first.send_signal(getattr(signal, interruption))  # the driver only, as a terminal's Ctrl-C reaches Tune
        first.wait(timeout=120)
        interrupted = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
        statuses = {properties(e)["lr"]: properties(e)["status"] for e in interrupted}
        assert statuses == {0.05: "COMPLETE", 0.1: "CANCELED", 0.2: "CANCELED"}  # they were COMPLETE
        committed = Sweep(store, pipeline="restore", metrics_name="fine").steps().groupby("lr").size()
        assert committed[0.1] >= 12 and committed[0.2] >= 12  # not left in the spill for `recover`
    second = subprocess.run(
        [sys.executable, "-c", RESTORE_DRIVER, str(store), str(results), "restore"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    from ray_cmf import Store, recover

    recover(Store(store))  # what the killed driver's writer left: adopted by the restore, nothing to redo
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    executions = {properties(e)["lr"]: e for e in lineage.store.get_executions()}
    assert len(executions) == 3  # no second execution per trial
    short = properties(executions.pop(0.05))  # ended before the kill: ranked after the restore all the same
    assert short["status"] == "COMPLETE" and short["in_top_n"] is False and short["top_rank"] == 0
    assert {lr: properties(e)["top_rank"] for lr, e in executions.items()} == {0.1: 1, 0.2: 2}
    for execution in executions.values():
        assert execution.last_known_state == mlpb.Execution.COMPLETE
        assert properties(execution)["attempt"] == 2
        artifact = _artifacts({"lineage": lineage}, execution)["tune_results"]
        raw = pq.read_table(store / properties(artifact)["url"]).to_pandas()
        assert set(raw["attempt"]) == {1, 2}  # raw rows keep the attempt number
        series = dedup_attempts(raw)
        assert series["training_iteration"].tolist() == list(range(1, 31))  # no duplicates, no holes
        assert series["it"].tolist() == list(range(30))
    fine = Sweep(store, pipeline="restore", metrics_name="fine").steps()
    assert SERIES_COLUMN not in fine.columns  # a restored trial continues its series: no second one
    for lr, rows in fine.groupby("lr"):
        steps = rows["step"].tolist()
        assert len(steps) == len(set(steps)), (lr, steps)  # re-logged steps resolved to the latest attempt
        # nothing was lost: every row of every attempt is there, also under SIGKILL (a trial's get_cmf() rows
        # reach the store at each checkpoint, and the restore re-logs what came after the one it resumes from)
        assert sorted(steps) == list(range(3 if lr == 0.05 else 30)), (lr, steps)


TERMINATED_DRIVER = textwrap.dedent(
    """
    import faulthandler, signal, sys, time
    from pathlib import Path
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a driver that hangs is
    import ray
    from ray import tune
    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import get_cmf

    store, progress = sys.argv[1], Path(sys.argv[2])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        cmf = get_cmf(system_metrics=None)
        for step in range(10_000):
            cmf.log_metric("fine", {"step": step, "lr": config["lr"]})
            (progress / str(config["lr"])).write_text(str(step))  # after the row: it was logged
            if step % 5 == 4:
                tune.report({"loss": config["lr"] / (step + 1)})  # no checkpoint: nothing seals the rows
            time.sleep(0.05)

    logger = CmfRayLogger("terminated", store=store)
    tune.Tuner(trainable, param_space={"lr": tune.grid_search([0.1, 0.2])},
               run_config=tune.RunConfig(name="exp", storage_path=sys.argv[3], callbacks=[logger], verbose=0)).fit()
    """
)


@pytest.mark.slow
def test_a_sweep_whose_driver_is_terminated_commits_every_row_its_trials_logged(tmp_path: Path) -> None:
    """SIGTERM to a Tune driver (a scheduler's stop) ended its trials CANCELED with what had reached the
    writer, but the rows each trial logged since its last checkpoint were still in the trial's process, and
    Ray stopped it with the driver (found by a new user: 3 of 13 rows lost). The driver's end now has every
    running trial's process hand its rows over first, as a trial's own end does."""
    store, progress = tmp_path / "store", tmp_path / "progress"
    progress.mkdir()
    with open(tmp_path / "stderr", "wb") as stderr:
        driver = subprocess.Popen(
            [sys.executable, "-c", TERMINATED_DRIVER, str(store), str(progress), str(tmp_path / "results")],
            env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
            start_new_session=True,
            stderr=stderr,
        )
    try:
        started = time.monotonic()
        logged = lambda: [int(f.read_text() or 0) for f in progress.iterdir()]  # noqa: E731
        while time.monotonic() < started + 120 and (len(logged()) < 2 or min(logged()) < 12):
            time.sleep(0.05)
        waited, before = time.monotonic() - started, logged()
        driver.send_signal(signal.SIGTERM)  # the driver only, as a scheduler's SIGTERM reaches it
        try:
            driver.wait(timeout=120)
        except subprocess.TimeoutExpired:
            driver.send_signal(signal.SIGUSR1)  # its threads' stacks, to stderr
            time.sleep(3)
            trace = (tmp_path / "stderr").read_text(errors="replace")[-12_000:]
            when = f"{waited:.0f} s after its start, its trials at steps {before}"
            pytest.fail(f"the driver did not end within 120 s of SIGTERM ({when}):\n{trace}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    last = {float(f.name): int(f.read_text()) for f in progress.iterdir()}  # each trial's last row logged
    sweep = Sweep(store, pipeline="terminated", metrics_name="fine")
    assert set(sweep.trials()["status"]) == {"CANCELED"}
    rows = sweep.steps()
    for lr, steps in rows.groupby("lr")["step"]:
        assert steps.tolist() == list(range(len(steps))) and len(steps) > last[lr], (lr, last, steps.tolist())


INTERRUPTED_TWICE_DRIVER = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    import ray
    from ray import tune
    from ray_cmf import CmfRayLogger

    store, progress, results, then = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    # room for a restore beside the interrupted trials, which Tune aborted without stopping them
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        for step in range(1, 3 if config["k"] == 2 else 13):  # k=2 ends before the interruption
            time.sleep(0.5)
            tune.report({"v": config["k"] + step / 1000})
            written = progress / f".{config['k']}"  # after the report: Tune has it; renamed, so never read half-written
            written.write_text(str(step))
            written.replace(progress / str(config["k"]))

    def ctrl_c_twice():  # Ctrl-C, then again once Tune answered, as its warning offers ("Press CTRL+C ... to skip")
        steps = lambda k: int((progress / k).read_text()) if (progress / k).exists() else 0
        while steps("0") < 4 or steps("1") < 4 or steps("2") < 2:
            time.sleep(0.05)
        tunes = signal.getsignal(signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        while signal.getsignal(signal.SIGINT) is tunes:  # Tune's handler puts back the one it replaced
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_twice, daemon=True).start()
    logger = CmfRayLogger("twice", store=store, metric="v", mode="min", top_n=3)
    try:
        tune.Tuner(trainable, param_space={"k": tune.grid_search([0, 1, 2])},
                   run_config=tune.RunConfig(name="exp", storage_path=results, callbacks=[logger], verbose=0)).fit()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    if then == "restore":  # the next cell of a notebook
        tune.Tuner.restore(os.path.join(results, "exp"), trainable=trainable, resume_unfinished=True).fit()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("then", ["exit", "restore"])
def test_a_sweep_interrupted_twice_commits_what_its_trials_reported(tmp_path: Path, then: str) -> None:
    """Ctrl-C pressed twice aborts Tune before it ends the experiment, so the trials end as the driver does,
    after Python has shut its thread pools down: each trial's commit was refused there ("cannot schedule new
    futures after shutdown"), and the trials were left CRASHED with no step committed (found by a new user).
    They end CANCELED with every result Tune had; or, restored in the same process (a notebook's next
    cell), COMPLETE, which the interrupted sweep's end at the driver's exit leaves as it is, and so the
    ranking that the restore made of every trial."""
    store, progress = tmp_path / "store", tmp_path / "progress"
    progress.mkdir()
    driver = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_TWICE_DRIVER, str(store), str(progress), str(tmp_path / "results"), then],
        env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "interrupted" in driver.stdout, driver.stderr[-3000:]  # the second Ctrl-C ended fit() at once
    assert "may be left RUNNING" not in driver.stderr, driver.stderr[-3000:]
    warned = "before the sweep: its running trials end with it" in driver.stderr
    assert warned == (then == "exit"), driver.stderr[-3000:]
    reported = {int(f.name): int(f.read_text()) for f in progress.glob("[0-9]")}  # each trial's last report
    sweep = Sweep(store, pipeline="twice")
    trials = sweep.trials(["v"]).set_index("config/k")
    ended = "CANCELED" if then == "exit" else "COMPLETE"
    said = driver.stderr[-3000:]
    assert trials["status"].to_dict() == {0: ended, 1: ended, 2: "COMPLETE"}, said
    assert trials["top_rank"].to_dict() == {0: 1, 1: 2, 2: 3}, said  # by the best v, which every trial reported
    assert then == "exit" or reported == {0: 12, 1: 12, 2: 2}
    for k, last in reported.items():  # a trial's rows were all lost once, the second Ctrl-C inside its append
        values = sweep.steps(["v"]).merge(trials.reset_index()[["trial_id", "config/k"]])
        mine = values[values["config/k"] == k]
        assert mine["step"].tolist()[:last] == list(range(1, last + 1)), (k, last, mine["step"].tolist(), said)
        assert mine["v"].tolist()[:last] == [k + step / 1000 for step in range(1, last + 1)]


def _runs_until_stopped(config: dict[str, Any]) -> None:
    from ray import tune

    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=None)
    for it in range(100):
        for sub in range(5):
            cmf.log_metric("fine", {"it": it, "sub": sub})  # never committed, never flushed
        tune.report({"loss": config["lr"] / (it + 1)})


def test_a_trial_that_tune_stops_hands_over_every_row(ray_session: None, tmp_path: Path) -> None:
    """Tune stops each trial at its third result, while the trainable waits inside ``report``: the rows it
    logged are still in its memory, and stopping waits for them to reach the writer."""
    from ray import tune

    from ray_cmf import CmfRayLogger

    store = tmp_path / "store"
    tune.Tuner(
        _runs_until_stopped,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(
            name="stopped",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("stopped", store=str(store))],
            stop={"training_iteration": 3},
            verbose=0,
        ),
    ).fit()
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    for execution in lineage.store.get_executions():
        fine = _artifacts({"lineage": lineage}, execution)["fine"]
        assert properties(fine)["at_end"] is True
        rows = pq.read_table(store / properties(fine)["url"]).to_pandas()
        assert rows[["it", "sub"]].values.tolist() == [[i, s] for i in range(3) for s in range(5)]


def _runs_long(config: dict[str, Any]) -> None:
    from ray import tune

    for it in range(200):
        time.sleep(0.05)
        tune.report({"loss": config["lr"] / (it + 1)})


def test_a_trial_the_experiments_end_stops_is_canceled_not_complete(ray_session: None, tmp_path: Path) -> None:
    """Tune stops every running trial when the experiment ends early (Ctrl-C, ``time_budget_s``, a stopper's
    ``stop_all``), marks it TERMINATED and calls no ``on_trial_complete``: such trials were recorded
    COMPLETE (and so passed ``--where 'status == "COMPLETE"'``), though they never finished."""
    from ray import tune

    from ray_cmf import CmfRayLogger

    class StopAllAfter(tune.stopper.Stopper):  # once both trials run (a busy host may start one late)
        def __init__(self) -> None:
            self.results: dict[str, int] = {}

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            self.results[trial_id] = self.results.get(trial_id, 0) + 1
            return False

        def stop_all(self) -> bool:
            return len(self.results) == 2 and min(self.results.values()) >= 3

    store = tmp_path / "store"
    tune.Tuner(
        _runs_long,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(
            name="cut",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("cut", metric="loss", mode="min", store=str(store))],
            stop=StopAllAfter(),
            verbose=0,
        ),
    ).fit()
    executions = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert [properties(e)["status"] for e in executions] == ["CANCELED", "CANCELED"]
    assert [e.last_known_state for e in executions] == [mlpb.Execution.CANCELED] * 2
    statuses = Sweep(store, pipeline="cut").trials()["status"].tolist()
    assert statuses == ["CANCELED", "CANCELED"]


def test_a_diverged_result_never_becomes_a_trials_best() -> None:
    """Tune's driver-side best (MLMD's best_<metric> and the top-N) skips NaN and ±inf, and reads the results
    as the series does: a retry's first result supersedes what the failed attempt reported from its step on."""
    from ray_cmf.tune import _TrialState

    for mode, expected in (("min", 0.4), ("max", 0.5)):
        state = _TrialState()
        for step, value in enumerate((0.5, -math.inf, math.nan, math.inf, 0.4), start=1):
            state.rank(step, value)
        assert state.best(mode) == expected
    retried = _TrialState()
    for step, value in ((1, 0.9), (2, 0.01), (3, 0.02)):
        retried.rank(step, value)
    retried.started = True  # Tune retries it from its checkpoint after step 1
    for step, value in ((2, 0.6), (3, 0.5)):
        retried.rank(step, value)
    assert retried.best("min") == 0.5 and retried.ranked == [(1.0, 0.9), (2.0, 0.6), (3.0, 0.5)]


def test_a_data_dir_that_does_not_exist_is_refused_before_any_trial_starts(tmp_path: Path) -> None:
    from ray_cmf import CmfRayLogger

    with pytest.raises(ValueError, match=r"data_dir='missing/'.*does not exist"):
        CmfRayLogger("p", data_dir="missing/", store=str(tmp_path / "store"))


def _logs_steps(config: dict[str, Any]) -> None:
    from ray import tune

    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=None)
    for it in range(3):
        cmf.log_metric("steps", {"it": it})
        tune.report({"loss": config["lr"] / (it + 1)})
    cmf.commit_metrics("steps")


def test_logging_never_ends_a_sweep(ray_session: None, tmp_path: Path) -> None:
    """The data directory disappears after the logger was built, so logging it fails for every trial: the
    sweep still finishes, and every trial keeps its results and its steps."""
    import shutil

    from ray_cmf import CmfRayLogger, Sweep
    from tests._sweeps import run_grid

    data = tmp_path / "data"
    data.mkdir()
    logger = CmfRayLogger("fragile", data_dir=str(data), metric="loss", store=str(tmp_path / "store"))
    shutil.rmtree(data)
    run_grid(_logs_steps, {"lr": [0.1, 0.2]}, tmp_path / "results", logger)  # raised TuneError before
    table = Sweep(tmp_path / "store").trials(["loss"])
    assert table["status"].tolist() == ["COMPLETE", "COMPLETE"] and table["steps"].tolist() == [3, 3]
    assert Sweep(tmp_path / "store", metrics_name="steps").trials()["steps"].tolist() == [3, 3]


def _writes_over_its_model(config: dict[str, Any]) -> None:
    import time

    from ray import tune

    model = Path(config["model"])
    for epoch in range(2):
        model.write_bytes(f"weights after epoch {epoch}".encode())
        tune.report({"loss": 1.0 / (epoch + 1), "model_path": str(model)})
        time.sleep(1.0)  # the writer hashes the first version meanwhile


def test_a_model_file_a_trial_writes_over_is_recorded_as_it_left_it(ray_session: None, tmp_path: Path) -> None:
    """The logger recorded a result's ``model_path`` once, at its first result: a trial that wrote over its
    model every epoch left a file that matched no recorded version, which ``verify`` (re-hashing files
    outside the store) then read as ``modified``."""
    from ray_cmf import CmfRayLogger
    from ray_cmf.audit import audit
    from tests._sweeps import run_grid

    model = tmp_path / "model.bin"
    logger = CmfRayLogger("models", store=str(tmp_path / "store"))
    run_grid(_writes_over_its_model, {"model": [str(model)]}, tmp_path / "results", logger)
    found = {f.md5: f.status for f in audit(Store(tmp_path / "store")) if f.url == str(model)}
    assert found == {file_md5(model): "ok", hashlib.md5(b"weights after epoch 0").hexdigest(): "superseded"}


def test_the_driver_holds_every_trials_cmf_at_once(ray_session: None, tmp_path: Path) -> None:
    """cmflib's ``logger.cmf_obj[trial_id]`` on the driver: asking for trial b's Cmf leaves trial a's open."""
    from ray_cmf.actor import start_writer
    from ray_cmf.constants import TRIAL_EXECUTION_TYPE
    from ray_cmf.tune import trial_cmf
    from ray_cmf.writer import StoreWriter

    client = start_writer(tmp_path / "store")
    for trial in ("driver-a", "driver-b"):
        client.call(StoreWriter.bind, kind="trial", name=trial, pipeline="p", stage="s", type_name=TRIAL_EXECUTION_TYPE)
    a = trial_cmf("driver-a")
    a.log_metric("m", {"x": 1})
    b = trial_cmf("driver-b")
    b.log_metric("m", {"x": 2})
    a.log_metric("m", {"x": 3})  # raised "MetricBuffer is closed": b's Cmf had closed a's
    assert a.commit_metrics("m") is not None and b.commit_metrics("m") is not None
    assert a.read_metrics("m")["x"].tolist() == [1, 3] and b.read_metrics("m")["x"].tolist() == [2]
    with pytest.raises(MetricsNotFoundError) as refused:  # raised by the writer actor: was a RayTaskError holding
        a.read_metrics("never")  # the actor's traceback, in colour (a new user)
    assert type(refused.value) is MetricsNotFoundError and str(refused.value).startswith("No committed metrics 'never'")


def test_a_writer_actors_error_reaches_the_caller_as_itself(ray_session: None, tmp_path: Path) -> None:
    """A request that the writer actor failed raised Ray's wrapper of the error, whose text is the actor's
    traceback and whose repr named no error: a spill that failed so warned "spilling metrics to the ray_cmf
    writer failed: RayTaskError(Al..., actor_id=...)". It raises the writer's own error, Ray's (and the
    actor's traceback) chained to it."""
    import ray

    from ray_cmf.actor import start_writer
    from ray_cmf.constants import TRIAL_EXECUTION_TYPE
    from ray_cmf.writer import StoreWriter

    client = start_writer(tmp_path / "store")
    binding = client.call(
        StoreWriter.bind, kind="trial", name="errs", pipeline="p", stage="s", type_name=TRIAL_EXECUTION_TYPE
    )
    with pytest.raises(ValueError, match="event must be 'input' or 'output', got 'sideways'") as raised:
        client.call(StoreWriter.log_file, binding=binding, type_name="Dataset", path=str(tmp_path), event="sideways")
    assert type(raised.value) is ValueError
    assert isinstance(raised.value.__cause__, ray.exceptions.RayTaskError)


def test_a_trial_that_no_sweep_will_register_is_an_error_at_once(ray_session: None, tmp_path: Path) -> None:
    """cmflib's docs build ``CmfRayLogger(trial_id)`` inside the trainable: where the Tuner has no
    CmfRayLogger of its own, nothing ever registers the trial, and asking for its Cmf waited a minute before it
    said so. While no CmfRayLogger's sweep runs, it says so at once (not "none was registered in 5 s")."""
    from ray_cmf import CmfRayLogger, RayCmfError
    from ray_cmf.actor import start_writer
    from ray_cmf.tune import trial_cmf

    start_writer(tmp_path / "store")  # a writer runs (an earlier sweep of the notebook started it)
    with pytest.raises(RayCmfError, match=r"'abcde_00000' is not registered .*no CmfRayLogger runs a sweep"):
        trial_cmf("abcde_00000", timeout=5)
    with pytest.raises(RayCmfError, match="add CmfRayLogger"):
        CmfRayLogger("abcde_00000").cmf_obj["abcde_00000"]  # the cmflib docs' pattern


def _reports(config: dict[str, Any]) -> None:
    from ray import tune

    for i in range(config["reports"]):
        tune.report({"loss": 1.0 / (i + 1)})


def test_a_trial_that_tune_stopped_reads_as_stopped(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial that a scheduler (ASHA) or a stop criterion ended read COMPLETE, the same as one that ran to
    its end: only its step count told them apart. It is still COMPLETE, as Tune has it, and ``stopped``."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep
    from ray_cmf.cli import main

    logger = CmfRayLogger("stopped", store=str(tmp_path / "store"), metric="loss")
    tune.Tuner(
        _reports,
        param_space={"reports": tune.grid_search([0, 1, 5])},
        run_config=tune.RunConfig(
            name="stopped", storage_path=str(tmp_path / "results"), callbacks=[logger], stop={"training_iteration": 2}
        ),
    ).fit()
    table = Sweep(tmp_path / "store").trials().set_index("config/reports")
    assert table.loc[0, "status"] == table.loc[1, "status"] == table.loc[5, "status"] == "COMPLETE"
    assert (table.loc[0, "stopped"], table.loc[1, "stopped"], table.loc[5, "stopped"]) == (False, False, True)
    assert table.loc[5, "steps"] == 2
    capsys.readouterr()  # Tune's own output
    assert main(["trials", "--store", str(tmp_path / "store"), "--json"]) == 0
    shown = {row["config/reports"]: row["stopped"] for row in json.loads(capsys.readouterr().out)}
    assert shown == {0: False, 1: False, 5: True}
    page = Sweep(tmp_path / "store").report(tmp_path / "r.html").read_text()
    assert "<th>stopped</th>" in page and "<td>True</td>" in page


def _reports_scaled(config: dict[str, Any]) -> None:
    """Twelve falling losses; a trial given a ``gate`` file waits for it before its ninth (HyperBand's max_t)."""
    from ray import tune

    for i in range(12):
        if i == 8 and config.get("gate"):
            _wait_for(Path(config["gate"]))
        time.sleep(0.02)
        tune.report({"loss": config["scale"] / (i + 1)})


def _wait_for(gate: Path, limit_s: float = 120.0) -> None:
    """Wait for ``gate`` to exist, or ``limit_s`` seconds: the sweep runs on either way."""
    deadline = time.monotonic() + limit_s
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_trials_hyperband_cut_read_as_stopped(ray_session: None, tmp_path: Path) -> None:
    """HyperBand stops the trials it cuts from a bracket itself (``stop_trial``), not by its answer to their
    result: their last result says nothing of it, and half of a sweep it stopped read ``stopped=False``, as if
    they had run to their end (a new user's, with Tune's defaults). A trial that ended on its own is not.

    With max_t=9 the first three trials share a bracket: the first two to reach step 9 are paused, and stopped
    when the third gets there. The third waits until both are paused, as it would in a real sweep of unequal
    trials: Tune's HyperBand stops only trials already paused when a bracket ends, and one still saving then
    stays paused for ever (a hang CI met once, in Tune, with identical trials reaching step 9 together)."""
    from ray import tune
    from ray.tune.schedulers import HyperBandScheduler

    from ray_cmf import CmfRayLogger, Sweep

    gate = tmp_path / "others-paused"

    class OpensGate(tune.Callback):
        def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
            waiting = [t for t in trials if t.config["scale"] in (1.0, 2.0)]
            if len(waiting) == 2 and all(t.status == "PAUSED" for t in waiting):
                gate.touch()

    tune.Tuner(
        tune.with_resources(_reports_scaled, {"cpu": 0.5}),
        param_space={
            "scale": tune.grid_search([1.0, 2.0, 3.0, 4.0]),
            "gate": tune.sample_from(lambda spec: str(gate) if spec.config.scale == 3.0 else None),
        },
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=HyperBandScheduler(max_t=9)),
        run_config=tune.RunConfig(
            name="hb",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("hb", store=str(tmp_path / "store")), OpensGate()],
            verbose=0,
        ),
    ).fit()
    assert gate.exists(), "the two trials HyperBand pauses at step 9 were never both paused"
    table = Sweep(tmp_path / "store").trials()
    assert (table["status"] == "COMPLETE").all() and (table["steps"] <= 9).all(), table[["steps", "status"]]
    assert table["stopped"].tolist() == [True] * 4, table[["config/scale", "steps", "stopped"]]


def test_a_metric_no_result_holds_is_warned_about(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """CmfRayLogger(metric="los") when the trials report "loss": no best and no top-N could be recorded, and
    the sweep said nothing."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    logger = CmfRayLogger("typo", metric="los", top_n=1, store=str(tmp_path / "store"))
    with caplog.at_level("WARNING", logger="ray_cmf"):
        run_grid(_logs_steps, {"lr": [0.1, 0.2]}, tmp_path / "results", logger)
    warned = [r.getMessage() for r in caplog.records if "is not in the results" in r.getMessage()]
    assert len(warned) == 1 and "'loss'" in warned[0]


def _fails_once(trainable: Any, tmp_path: Path, name: str, **run_config: Any) -> None:
    """Run one trial of ``trainable`` into ``tmp_path/store`` (pipeline ``name``); it fails on its first
    attempt, and marks the file its config names so that its retry does not."""
    from ray import tune

    from ray_cmf import CmfRayLogger

    logger = CmfRayLogger(name, store=str(tmp_path / "store"))
    tune.Tuner(
        trainable,
        param_space={"mark": str(tmp_path / "failed")},
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path / "tune"), verbose=0, callbacks=[logger], **run_config
        ),
    ).fit()
    assert (tmp_path / "failed").exists()  # it did fail once


class _DiesOnce:
    """A tune.Trainable (made a subclass in the test) that logs a row per step, checkpoints every 2 steps,
    and dies at step 5 of its first attempt as a process killed for memory does (no exit hook runs)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.it, self.mark = 0, Path(config["mark"])

    def step(self) -> dict[str, float]:
        import ray_cmf.tune

        self.it += 1
        ray_cmf.tune.trial_cmf(self.trial_id).log_metric("inner", {"step": self.it, "v": self.it * 0.5})
        if self.it == 5 and not self.mark.exists():
            self.mark.touch()
            os._exit(1)
        return {"loss": float(self.it)}

    def save_checkpoint(self, directory: str) -> None:
        (Path(directory) / "it").write_text(str(self.it))

    def load_checkpoint(self, directory: str) -> None:
        self.it = int((Path(directory) / "it").read_text())


def test_a_class_trainable_killed_after_a_checkpoint_keeps_its_rows(ray_session: None, tmp_path: Path) -> None:
    """A tune.Trainable's rows reached the store only every flush_seconds: killed after its checkpoint of
    step 4, its retry resumed at step 5 and steps 1-4 were lost (found by a new user; a function trainable's
    rows reach the store as it reports a checkpoint). They now do as Tune saves the checkpoint."""
    from ray import tune

    trainable = type("DiesOnce", (_DiesOnce, tune.Trainable), {})
    _fails_once(
        trainable,
        tmp_path,
        "dies",
        stop={"training_iteration": 8},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2),
        failure_config=tune.FailureConfig(max_failures=2),
    )
    inner = Sweep(tmp_path / "store", pipeline="dies", metrics_name="inner").steps(["v"])
    assert inner["step"].tolist() == list(range(1, 9)) and inner["v"].tolist() == [i * 0.5 for i in range(1, 9)]


def _commits_after_its_loop(config: dict[str, Any]) -> None:
    """Logs a row per iteration with a checkpoint, fails once after its last report, then commits."""
    import tempfile

    from ray import tune

    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=None)
    checkpoint = tune.get_checkpoint()
    start = int((Path(checkpoint.path) / "it").read_text()) if checkpoint else 0
    for it in range(start + 1, 4):
        cmf.log_metric("inner", {"step": it, "v": it / 4})
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / "it").write_text(str(it))
            tune.report({"loss": float(it)}, checkpoint=tune.Checkpoint.from_directory(directory))
    mark = Path(config["mark"])
    if not mark.exists():
        mark.touch()
        raise RuntimeError("after the last report")
    cmf.commit_metrics("inner")  # the retry resumed at the end: it logged nothing, its first attempt did


def test_a_retry_with_nothing_left_to_log_commits_what_its_first_attempt_logged(
    ray_session: None, tmp_path: Path
) -> None:
    """``commit_metrics`` in a retry (or a PBT trial resumed at its last iteration) that logged nothing raised
    "Nothing was logged under 'inner'", and failed the trial, whose series the store holds (a new user's
    find: every trial of a PBT sweep ended FAILED)."""
    from ray import tune

    _fails_once(_commits_after_its_loop, tmp_path, "resumed", failure_config=tune.FailureConfig(max_failures=1))
    [trial] = Sweep(tmp_path / "store", pipeline="resumed", metrics_name="inner").trials().to_dict("records")
    assert trial["status"] == "COMPLETE" and trial["steps"] == 3
    inner = Sweep(tmp_path / "store", pipeline="resumed", metrics_name="inner").steps(["v"])
    assert inner["step"].tolist() == [1, 2, 3] and inner["v"].tolist() == [0.25, 0.5, 0.75]


def test_a_logger_pickled_by_an_earlier_version_restores_with_defaults(ray_session: None, tmp_path: Path) -> None:
    """``Tuner.restore`` unpickles the experiment's CmfRayLogger as the version that started the sweep pickled it:
    one that predates an attribute (``_modes``, ``push``, ``system_metrics``, ...) failed every hook with an
    AttributeError, and each restored trial's ``get_cmf()`` waited 60 s and failed it (a user who upgraded)."""
    import pickle

    from ray.tune.experiment import Trial

    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import _TrialState

    store = tmp_path / "store"
    logger = CmfRayLogger("old", metric="loss", store=str(store), top_n=1)
    for added in ("_modes", "push", "system_metrics", "flush_rows", "flush_seconds", "_sweep", "_restored"):
        delattr(logger, added)  # as an earlier version's pickle lacks them
    logger._trials["old_0"] = _TrialState(committed=False)
    restored = pickle.loads(pickle.dumps(logger))
    restored.setup()
    trials = [Trial("old", config={"lr": i / 10}, trial_id=f"old_{i}", stub=True) for i in range(2)]
    for trial in trials:
        restored.on_trial_start(0, trials, trial)
        restored.on_trial_result(0, trials, trial, {"loss": 1.0 - trial.config["lr"], "training_iteration": 1})
        restored.on_trial_complete(0, trials, trial)
    restored.on_experiment_end(trials)
    table = Sweep(store, pipeline="old").trials(["loss"]).set_index("trial_id")
    assert table["status"].to_dict() == {"old_0": "COMPLETE", "old_1": "COMPLETE"}
    assert table["loss_best"].to_dict() == {"old_0": 1.0, "old_1": 0.9} and table["top_rank"]["old_1"] == 1
    old = _TrialState(committed=True)
    del old.keys, old.models  # fields an earlier version's trial state lacks
    again = pickle.loads(pickle.dumps(old))
    assert again.committed is True and again.keys == set() and again.models == {}


def test_a_trial_restored_without_tags_is_paired_by_tunes_trial_index(tmp_path: Path) -> None:
    """Without the experiment tags an earlier version's state lacks, a new trial is paired with the restored trial
    whose id ends in its tag's index, and with none where the tag or the ids hold no index."""
    from types import SimpleNamespace

    from ray_cmf import CmfRayLogger
    from ray_cmf.constants import RESTARTED_FROM_PROPERTY
    from ray_cmf.tune import _TrialState

    logger = CmfRayLogger("paired", store=str(tmp_path / "store"))
    logger._trials = {"ab12c_00000": _TrialState(), "ab12c_00001": _TrialState(), "custom": _TrialState()}
    new = SimpleNamespace(trial_id="f00d1234", experiment_tag="1_lr=0.2")
    assert logger._replaced(new) == {RESTARTED_FROM_PROPERTY: "ab12c_00001"}
    assert logger._replaced(SimpleNamespace(trial_id="f00d1234", experiment_tag="lr=0.2")) == {}
    assert logger._replaced(SimpleNamespace(trial_id="f00d1234", experiment_tag="7_lr=0.2")) == {}
    assert logger._replaced(SimpleNamespace(trial_id="ab12c_00001", experiment_tag="1_lr=0.2")) == {}  # itself


def test_a_trial_that_errors_as_it_starts_is_marked_failed(ray_session: None, tmp_path: Path) -> None:
    """Tune calls ``on_trial_error`` right after ``on_trial_start`` for a trainable that raises at once. The
    writer runs requests on several threads, so the end must wait for the start's registration, not race it
    (the FAIL_EARLY trial of the shared sweep was left RUNNING once in CI)."""
    from ray.tune.experiment import Trial

    from ray_cmf import CmfRayLogger

    store = tmp_path / "store"
    logger = CmfRayLogger("early", metric="loss", store=str(store))
    logger.setup()
    trials = [Trial("early", config={"lr": i / 10}, trial_id=f"early_{i}", stub=True) for i in range(8)]
    for trial in trials:
        logger.on_trial_start(0, trials, trial)
        logger.on_trial_error(0, trials, trial)
    logger.on_experiment_end(trials)
    executions = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions()
    assert sorted((properties(e)["trial_id"], e.last_known_state) for e in executions) == [
        (f"early_{i}", mlpb.Execution.FAILED) for i in range(8)
    ]


def _reports_only(config: dict[str, Any]) -> None:
    from ray import tune

    if config["kind"] == "own_cmf":  # asks for its Cmf (which would sample its process): sampled once still
        import ray_cmf.tune

        ray_cmf.tune.get_cmf().log_metric("steps", {"it": 0})
    for it in range(config["results"]):
        time.sleep(0.3 if config["results"] > 1 else 0)  # one result at once: shorter than any interval
        tune.report({"loss": 1.0 / (it + 1)})


def test_every_trial_gets_system_metrics_without_code_in_its_trainable(ray_session: None, tmp_path: Path) -> None:
    """The trainables only call ``tune.report``: the sampler of their node samples each trial's process,
    from its start to its end, however short it is, and a trial that asks for its Cmf is not sampled twice."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep

    store = tmp_path / "store"
    grid = tune.Tuner(
        _reports_only,
        param_space={"kind": tune.grid_search(["plain", "own_cmf"]), "results": tune.grid_search([1, 6])},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name="zero_code",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("zero_code", store=str(store), system_metrics=0.25)],
            verbose=0,
        ),
    ).fit()
    pids = {r.metrics["trial_id"]: r.metrics["pid"] for r in grid}
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    for execution in lineage.store.get_executions():
        trial_id = properties(execution)["trial_id"]
        [system] = [a for name, a in _artifacts({"lineage": lineage}, execution).items() if name == "system_metrics"]
        assert properties(system)["at_end"] is True  # nobody committed it: the trial's end did
        rows = pq.read_table(store / properties(system)["url"]).to_pylist()
        assert len(rows) >= 2 and {r["pid"] for r in rows} == {pids[trial_id]}  # the trial's process, only
        assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))  # one sampler: no step twice
        assert all(r["proc_rss_mb"] > 0 for r in rows)
        if rows[-1]["wall_time"] - rows[0]["wall_time"] > 2 * CPU_WINDOW_S:  # a trial sampled for less has no CPU %
            assert rows[-1].get("proc_cpu_percent") is not None
    long = Sweep(store, metrics_name="system_metrics").trials(where="`config/results` == 6")
    assert (long["steps"] >= 6).all()  # 1.8 s at a row every 0.25 s


def test_system_metrics_reach_the_writer_as_often_as_the_loggers_rows(ray_session: None, tmp_path: Path) -> None:
    """The node sampler handed a trial's samples over every 30 s whatever ``CmfRayLogger(flush_seconds=...)``
    said: a node that died within them took the trial's samples with it (a new user's 2-node cluster). They
    reach the writer as the logger's rows do: a live read sees them while the trial still runs."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep

    store = tmp_path / "store"

    def trainable(config: dict[str, Any]) -> None:
        from ray_cmf import RayCmfError

        seen, deadline = 0, time.monotonic() + 15  # half the 30 s the sampler waited before
        while not seen and time.monotonic() < deadline:  # until the sampler's rows can be read, while it runs
            time.sleep(0.2)
            with contextlib.suppress(RayCmfError):  # no series yet
                seen = len(Sweep(store, metrics_name="system_metrics").steps(live=True))
        tune.report({"seen_live": seen})

    [result] = tune.Tuner(
        trainable,
        run_config=tune.RunConfig(
            name="flushed",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("flushed", store=str(store), system_metrics=0.1, flush_seconds=0.5)],
            verbose=0,
        ),
    ).fit()
    assert result.error is None and result.metrics["seen_live"] > 0


def test_a_retried_trial_keeps_each_starts_system_metrics_apart(ray_session: None, tmp_path: Path) -> None:
    """Tune retries a trial that failed 0.6 s in: the failed start's samples were lost (its sampler was never
    stopped, and the retry's took its place), and where both starts' samples were kept they read as one
    series that numbered its steps from 1 twice (found by a new user). Each start is its own series now."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep

    marker, pids = tmp_path / "failed-once", tmp_path / "pids"

    def trainable(config: dict[str, Any]) -> None:
        with pids.open("a") as out:
            out.write(f"{os.getpid()}\n")
        if not marker.exists():
            marker.touch()
            time.sleep(0.6)
            raise RuntimeError("fails once")
        time.sleep(0.6)
        tune.report({"loss": 1.0})

    store = tmp_path / "store"
    _retried_once(trainable, {}, CmfRayLogger("retried", store=str(store)), tmp_path)
    rows = Sweep(store, metrics_name="system_metrics").steps()
    first, retry = [int(pid) for pid in pids.read_text().split()]
    assert set(rows["pid"]) == {first, retry}
    for pid in (first, retry):  # each start: its own series, its samples numbered from 1, at least two of them
        mine = rows[rows["pid"] == pid]
        assert mine["series"].nunique() == 1 and len(mine) >= 2
        assert mine["step"].tolist() == list(range(1, len(mine) + 1))
    assert rows[rows["pid"] == first]["series"].iloc[0] != rows[rows["pid"] == retry]["series"].iloc[0]


def test_tied_trials_rank_alike_in_top_rank_best_and_the_table(ray_session: None, tmp_path: Path) -> None:
    """Three trials tie for the best accuracy (mode max, top 2): ``top_rank`` took the highest trial ids,
    and ``Sweep.best`` sorted its own way, so the recorded top 2, ``best(n=2)`` and the table's first two
    named different trials (found by a new user). Ties go to the earlier trial in each."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    def trainable(config: dict[str, Any]) -> None:
        tune.report({"acc": config["acc"]})

    logger = CmfRayLogger("ties", metric="acc", mode="max", top_n=2, store=str(tmp_path / "store"))
    run_grid(trainable, {"acc": [0.5, 0.9, 0.9, 0.9]}, tmp_path / "results", logger)
    sweep = Sweep(tmp_path / "store")
    table = sweep.trials(["acc"])
    ranked = table[table["top_rank"] > 0].sort_values("top_rank")["trial_id"].tolist()
    earliest = sorted(table[table["acc_best"] == 0.9]["trial_id"])[:2]
    assert ranked == earliest
    assert sweep.best("acc", n=2)["trial_id"].tolist() == earliest
    assert sweep.trials(["acc"], sort="acc_best")["trial_id"].tolist()[:2] == earliest


def _logs_its_file(config: dict[str, Any]) -> None:
    from ray import tune

    from ray_cmf.tune import get_cmf

    get_cmf().log_metric("files", {"step": 0, "size": len(config["file"])})
    tune.report({"loss": 1.0})


def test_a_trial_whose_config_the_store_cannot_hold_is_recorded_with_it_escaped(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A config holding a lone surrogate (``os.fsdecode`` of a file name that is not UTF-8) was refused as the
    trial started: it was never recorded, and its ``get_cmf()`` waited 60 s for it, then blamed a missing
    CmfRayLogger (found by a new user). Tune runs such a trial: it is recorded, that text escaped, and said so."""
    import os

    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    odd = os.fsdecode(b"\xff.png")
    logger = CmfRayLogger("odd_config", metric="loss", store=str(tmp_path / "store"))
    with caplog.at_level("WARNING", logger="ray_cmf"):
        run_grid(_logs_its_file, {"file": ["a.png", odd]}, tmp_path / "results", logger)
    table = Sweep(tmp_path / "store").trials().sort_values("config/file")
    assert table["status"].tolist() == ["COMPLETE", "COMPLETE"] and table["steps"].tolist() == [1, 1]
    assert table["config/file"].tolist() == ["\\udcff.png", "a.png"]
    assert sorted(Sweep(tmp_path / "store", metrics_name="files").steps()["size"]) == [5, 5]
    assert "config['file'] holds '\\udcff', a lone surrogate" in caplog.text and "escaped" in caplog.text


def _instant(config: dict[str, Any]) -> None:
    from ray import tune

    tune.report({"loss": config["i"]})


def test_trials_that_end_at_once_are_each_sampled_from_their_start(ray_session: None, tmp_path: Path) -> None:
    """Two at a time, under the default interval: a trial that ends as it starts still gets two rows, even
    while its node's sampler hands another trial's rows to a writer that is busy with that trial's end."""
    from ray import tune

    from ray_cmf import CmfRayLogger, Sweep

    store = tmp_path / "store"
    tune.Tuner(
        _instant,
        param_space={"i": tune.grid_search(list(range(6)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name="instant", storage_path=str(tmp_path / "results"), callbacks=[CmfRayLogger("instant", store=store)]
        ),
    ).fit()
    table = Sweep(store, pipeline="instant", metrics_name="system_metrics").trials()
    assert len(table) == 6 and table["steps"].min() >= 2, table[["trial_id", "steps"]]


def test_a_trial_is_looked_up_for_sampling_before_tune_runs_it(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial's process was looked up in Ray's actor table on a thread of the driver that may lag Tune (a
    starved machine, a slow control store): an instant trial had ended by then, and got no system rows at all.
    The lookup now happens as Tune starts the trial, before it runs: here it answers a second late."""
    from ray import tune

    import ray_cmf.node_sampler
    from ray_cmf import CmfRayLogger, Sweep

    found = ray_cmf.node_sampler.actor_process

    def slow(actor: Any) -> tuple[int, str] | None:
        time.sleep(1.0)
        return found(actor)

    monkeypatch.setattr(ray_cmf.node_sampler, "actor_process", slow)
    store = tmp_path / "store"
    tune.Tuner(
        _instant,
        param_space={"i": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(
            name="late", storage_path=str(tmp_path / "results"), callbacks=[CmfRayLogger("late", store=store)]
        ),
    ).fit()
    table = Sweep(store, pipeline="late", metrics_name="system_metrics").trials()
    assert len(table) == 2 and table["steps"].min() >= 1, table[["trial_id", "steps"]]


def _reused(config: dict[str, Any]) -> None:
    from ray import tune
    from ray.train._internal.session import get_session

    import ray_cmf.tune

    ray_cmf.tune.get_cmf(system_metrics=None).log_metric("steps", {"i": 0})
    report, depth = get_session().report, 0
    while hasattr(report, "__wrapped__"):
        report, depth = report.__wrapped__, depth + 1
    tune.report({"loss": config["i"], "wrappers": depth, "process": os.getpid()})


def test_a_process_that_tune_reuses_for_many_trials_wraps_its_session_once(ray_session: None, tmp_path: Path) -> None:
    """With ``reuse_actors=True`` one process runs trial after trial on one Tune session object: each trial's
    get_cmf() wrapped it again, and after about a thousand trials its report overflowed the stack."""
    from ray import tune

    from ray_cmf import CmfRayLogger

    grid = tune.Tuner(
        _reused,
        param_space={"i": tune.grid_search(list(range(6)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(
            name="reused",
            storage_path=str(tmp_path / "results"),
            callbacks=[CmfRayLogger("reused", store=str(tmp_path / "store"))],
            verbose=0,
        ),
    ).fit()
    assert len({r.metrics["process"] for r in grid}) < len(grid)  # Tune did reuse a process
    assert {r.metrics["wrappers"] for r in grid} == {1}


def _reports_like_a_user(config: dict[str, Any]) -> None:
    """Results as real trainables report them: their own ``step``, a value ray_cmf must refuse (an int beyond
    2**53 after floats), a flat key that a nested one flattens onto, and a ``rank`` of their own (a sweep
    reads that column as a Train rank's)."""
    from ray import tune

    for i in range(4):
        big = 2**53 + 1 if i == 2 else 0.5
        rank = 3 - i  # ranked first at its last step: read as a Train rank, loss_final was this step's
        tune.report(
            {
                "loss": config["lr"] / (i + 1),
                "step": 100 * i,
                "big": big,
                "val/acc": 1.0,
                "val": {"acc": 2.0},
                "rank": rank,
            }
        )


def test_results_are_read_back_as_the_trainable_reported_them(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainable's own ``step`` is the step read back (it was replaced by Tune's iteration, and reading it
    raised 'Field "step" exists 2 times'); a refused value drops that value, not the whole result; a config
    value of None is a config column; two keys that flatten to one name keep the first and say so."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    logger = CmfRayLogger("as_reported", metric="loss", store=str(tmp_path / "store"))
    with caplog.at_level("WARNING", logger="ray_cmf"):
        run_grid(_reports_like_a_user, {"lr": [0.1, 0.2], "clip": [None]}, tmp_path / "results", logger)
    sweep = Sweep(tmp_path / "store")
    steps = sweep.steps()
    for _, rows in steps.groupby("trial_id", observed=True):
        assert rows["step"].tolist() == [0, 100, 200, 300]
        assert rows["loss"].notna().all() and rows["big"].isna().tolist() == [False, False, True, False]
        assert rows["val/acc"].tolist() == [1.0] * 4
    assert sweep.steps(["step", "loss"])["step"].tolist() == [0, 100, 200, 300] * 2
    table = sweep.trials()
    assert table["steps"].tolist() == [4, 4] and "config/clip" in table.columns
    assert sorted(table["loss_final"]) == pytest.approx([0.1 / 4, 0.2 / 4]) and "rank" not in steps.columns
    assert len(sweep.trials(where="config/clip == null")) == 2
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "'val/acc'" in messages and "drop their metric 'rank'" in messages
    dropped = [r.getMessage() for r in caplog.records if "'big'" in r.getMessage()]
    assert len(dropped) == 2, dropped  # one value of each trial
    assert all("step 200" in m and "row" not in m for m in dropped), dropped  # the step reported, not a row


def _fails_once_at_its_third_report(config: dict[str, Any]) -> None:
    """Reports 1/(i+1) (+1 on the first start of x=1, which raises at its third report), logging a row each."""
    from ray import tune

    from ray_cmf.tune import get_cmf

    marker = Path(config["dir"]) / f"started_{config['x']}"
    first = config["x"] == 1 and not marker.exists()
    marker.touch()
    cmf = get_cmf()
    for i in range(4):
        if first and i == 2:
            raise RuntimeError("fails once")
        cmf.log_metric("fine", {"step": i, "v": float(i)})
        tune.report({"loss": 1.0 / (i + 1) - (1.0 if first else 0.0)})


@pytest.mark.parametrize("saved_by", ["this version", "an earlier version"])
def test_a_trial_that_restart_errored_replaced_is_shown_replaced_and_never_best(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], saved_by: str
) -> None:
    """``Tuner.restore(restart_errored=True)`` reruns a failed trial as a new one (a new trial id, its old
    results discarded): ray_cmf kept the old one FAILED beside it, and ranked its discarded results best. It
    is now REPLACED, names its new trial, and is no candidate for best; the new one names what it replaced.
    An earlier version saved no experiment tags in Tune's experiment state, by which the two are paired: the
    failed trial kept its rank beside the new one (a user who upgraded)."""
    import pickle

    from ray import tune

    from ray_cmf import CmfRayLogger
    from ray_cmf.cli import main

    logger = CmfRayLogger("restarted", metric="loss", mode="min", top_n=3, store=str(tmp_path / "store"))
    grid = {"x": tune.grid_search([0, 1]), "dir": str(tmp_path)}
    run = tune.RunConfig(name="restarted", storage_path=str(tmp_path / "results"), callbacks=[logger], verbose=0)
    first = tune.Tuner(_fails_once_at_its_third_report, param_space=grid, run_config=run).fit()
    [failed] = [r for r in first if r.error is not None]
    old = failed.metrics["trial_id"]
    if saved_by == "an earlier version":  # its state held each trial's best and whether it was committed
        [saved] = (tmp_path / "results" / "restarted").glob("callback-states-*.pkl")
        states = pickle.loads(saved.read_bytes())
        [ours] = [state for state in states.values() if state and "trials" in state]
        for trial in ours["trials"].values():
            trial.pop("tag"), trial.pop("ranked")
        saved.write_bytes(pickle.dumps(states))
    again = tune.Tuner.restore(
        str(tmp_path / "results" / "restarted"), _fails_once_at_its_third_report, restart_errored=True
    )
    [new] = [r.metrics["trial_id"] for r in again.fit() if r.config["x"] == 1]
    assert new != old  # Tune's restart: a new trial
    sweep = Sweep(tmp_path / "store")
    table = sweep.trials().set_index("trial_id")
    assert table.loc[old, "status"] == "REPLACED" and table.loc[old, "replaced_by"] == new
    assert table.loc[new, "status"] == "COMPLETE" and table.loc[new, "restarted_from"] == old
    assert old not in set(sweep.best("loss", n=5)["trial_id"])  # its -1.0 was the lowest loss logged
    capsys.readouterr()
    assert main(["trials", "--store", str(tmp_path / "store"), "--status", "REPLACED", "--json"]) == 0
    out = capsys.readouterr()
    [row] = json.loads(out.out)
    assert row["trial_id"] == old, out
    # its rank from before the restart is no rank; it read null, where every other unranked trial reads false,
    # so `--where 'in_top_n == false'` left it out (found by a new user)
    assert row["in_top_n"] is False and row["top_rank"] is None, row
    # the one-trial views name the other trial too (they named neither; found by a new user)
    for trial, link, other in ((old, "replaced by", new), (new, "restarted from", old)):
        assert main(["show", trial, "--store", str(tmp_path / "store"), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown[link.replace(" ", "_")] == other, shown
        assert main(["show", trial, "--store", str(tmp_path / "store")]) == 0
        assert f"{link} {other}" in capsys.readouterr().out
    assert main(["diff", old, new, "--store", str(tmp_path / "store"), "--json"]) == 0
    fields = {r["field"]: (r[old], r[new]) for r in json.loads(capsys.readouterr().out)}
    assert fields["replaced_by"] == (new, None) and fields["restarted_from"] == (None, old), fields


def _checkpoints_after_logging(config: dict[str, Any]) -> None:
    """Logs rows, reports a checkpoint, then reports how many of those rows the store's spill holds."""
    import tempfile

    from ray import tune
    from ray.tune import Checkpoint

    import ray_cmf.tune
    from ray_cmf.series_format import read_segments

    cmf = ray_cmf.tune.get_cmf()
    for step in range(5):
        cmf.log_metric("fine", {"step": step})
    with tempfile.TemporaryDirectory() as d:
        tune.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(d))
    spills = Path(config["store"]).glob("spill/*-fine*")
    tune.report({"loss": 0.5, "spilled": sum(b.num_rows for s in spills for b in read_segments(s))})


def test_a_trials_rows_reach_the_store_when_it_reports_a_checkpoint(ray_session: None, tmp_path: Path) -> None:
    """A restore resumes from the trial's checkpoint and never logs the rows before it again: they must have
    left the trial's memory by then. After the driver was SIGKILLed and the sweep restored, a get_cmf()
    series held only the rows logged after the checkpoint (found by a new user)."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    store = tmp_path / "store"
    run_grid(
        _checkpoints_after_logging,
        {"store": [str(store)]},
        tmp_path / "results",
        CmfRayLogger("ckpt", store=str(store)),
    )
    [spilled] = Sweep(store).steps(["spilled"])["spilled"].dropna().tolist()
    assert spilled == 5


def test_sweeps_whose_trial_ids_coincide_keep_apart(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tune names trials ``<5 hex digits of uuid1's clock>_<counter>``: sweeps started in the same 0.4 ms
    (modulo 430 s) share every trial id, so ids repeat across the sweeps of a store that many runs fill.
    Each sweep's trials stay its own: the second trial of the name was written into the first's execution,
    and its stage read no trial at all."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    monkeypatch.setenv("_TEST_TUNE_TRIAL_UUID", "c0ffe")  # what a clock that coincides gives
    store = tmp_path / "store"
    sweeps = {("p", "first"): [0.1, 0.2], ("p", "second"): [0.3, 0.4], ("q", "first"): [0.5, 0.6]}
    for (pipeline, stage), lrs in sweeps.items():
        logger = CmfRayLogger(pipeline, pipeline_stage=stage, store=str(store), metric="loss", mode="min")
        run_grid(_reports_five, {"lr": lrs}, tmp_path / f"results_{pipeline}_{stage}", logger)

    def read(pipeline: str, stage: str | None = None) -> list[tuple[str, float, float, int]]:
        trials = Sweep(store, pipeline, stage).trials(["loss"])
        return sorted(zip(trials["trial_id"], trials["config/lr"], trials["loss_best"], trials["steps"], strict=True))

    for (pipeline, stage), lrs in sweeps.items():
        rows = read(pipeline, stage)
        assert [lr for _, lr, _, _ in rows] == lrs and [t for t, *_ in rows] == ["c0ffe_00000", "c0ffe_00001"]
        assert [(best, steps) for _, lr, best, steps in rows] == [(pytest.approx(lr / 5), 5) for lr in lrs]
    both = read("p")  # one pipeline, two stages that hold the same ids: each row names its stage
    assert [t for t, *_ in both] == [f"{s}/c0ffe_0000{i}" for s in ("first", "second") for i in (0, 1)]
    assert [lr for _, lr, _, _ in both] == [0.1, 0.2, 0.3, 0.4] and {steps for *_, steps in both} == {5}
    steps = Sweep(store, "p").steps(["loss"])
    assert steps.groupby("trial_id")["loss"].min().to_dict() == pytest.approx({t: lr / 5 for t, lr, _, _ in both})
    lineage = Lineage(store / "mlmd.sqlite", readonly=True)
    assert len(lineage.store.get_executions_by_type(TRIAL_EXECUTION_TYPE)) == 6


def test_a_new_sweep_into_a_stage_that_holds_its_ids_keeps_the_earlier_trials(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script run again into the same stage, whose trial ids happen to coincide, is a new sweep, not a
    restore: its trials are new executions. They were taken for restores of the earlier ones (attempt 2, the
    earlier config overwritten, the earlier results hidden by "latest attempt wins"), silently."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    monkeypatch.setenv("_TEST_TUNE_TRIAL_UUID", "c0ffe")
    store = tmp_path / "store"
    for run, lrs in enumerate(([0.1, 0.2], [0.3, 0.4])):
        logger = CmfRayLogger("again", pipeline_stage="exp", store=str(store), metric="loss", mode="min")
        run_grid(_reports_five, {"lr": lrs}, tmp_path / f"results{run}", logger)
    trials = Sweep(store, "again", "exp").trials(["loss"])
    assert sorted(trials["config/lr"]) == [0.1, 0.2, 0.3, 0.4]
    assert set(trials["steps"]) == {5}
    executions = Lineage(store / "mlmd.sqlite", readonly=True).store.get_executions_by_type(TRIAL_EXECUTION_TYPE)
    assert sorted((properties(e)["lr"], properties(e)["attempt"]) for e in executions) == [
        (lr, 1) for lr in (0.1, 0.2, 0.3, 0.4)
    ]
    assert dict(zip(trials["config/lr"], trials["loss_best"], strict=True)) == pytest.approx(
        {lr: lr / 5 for lr in (0.1, 0.2, 0.3, 0.4)}
    )
    assert len(set(trials["trial_id"])) == 4 and all(t.startswith("exp/c0ffe_0000") for t in trials["trial_id"])
    sweep = Sweep(store, "again", "exp")
    assert {sweep.config(t)["lr"] for t in trials["trial_id"]} == {0.1, 0.2, 0.3, 0.4}


def _reports_five(config: dict[str, Any]) -> None:
    from ray import tune

    for it in range(5):
        tune.report({"loss": config["lr"] / (it + 1)})


def test_the_error_recorded_is_the_last_failure_without_colours(tmp_path: Path) -> None:
    """Tune appends each failure of a trial to its error file; the last one is why the trial ended."""
    from ray_cmf.tune import last_failure

    path = tmp_path / "error.txt"
    path.write_text(
        "Failure # 1 (occurred at 2026-12-04_10-00-00)\n\x1b[36mray::ImplicitFunc.train()\x1b[39m\nOSError: disk\n"
        "Failure # 2 (occurred at 2026-12-04_10-05-00)\n\x1b[36mray::ImplicitFunc.train()\x1b[39m\n"
        + "  frame\n" * 400
        + "ValueError: diverged at step 3\n"
    )
    error = last_failure(str(path))
    assert error is not None and error.startswith("ray::ImplicitFunc.train()\n  frame")
    assert error.endswith("ValueError: diverged at step 3") and "characters cut" in error
    assert "OSError" not in error and "\x1b" not in error and len(error) <= 2000
    path.write_text("RuntimeError: no header\n")
    assert last_failure(str(path)) == "RuntimeError: no header"
    assert last_failure(str(tmp_path / "missing.txt")) is None


def test_modes_declare_which_way_other_results_are_best(ray_session: None, tmp_path: Path) -> None:
    """A sweep ranked by its loss also reports an accuracy: ``modes`` says higher is better for it, so its
    ``_best`` is each trial's highest accuracy, not its lowest."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    def trainable(config: dict[str, Any]) -> None:
        for it in range(3):
            tune.report({"loss": config["lr"] / (it + 1), "val_acc": 0.5 + config["lr"] * it})

    logger = CmfRayLogger("modes", metric="loss", store=str(tmp_path / "store"), modes={"val_acc": "max"})
    run_grid(trainable, {"lr": [0.1, 0.2]}, tmp_path / "results", logger)
    sweep = Sweep(tmp_path / "store")
    assert sweep.modes() == {"loss": "min", "val_acc": "max"}
    table = sweep.trials(["loss", "val_acc"]).set_index("config/lr")
    assert table["val_acc_best"].to_dict() == {0.1: pytest.approx(0.7), 0.2: pytest.approx(0.9)}
    assert table["loss_best"].to_dict() == {0.1: pytest.approx(0.1 / 3), 0.2: pytest.approx(0.2 / 3)}
    with pytest.raises(ValueError, match=r"modes\['loss'\]='max' and mode='min' disagree"):
        CmfRayLogger("modes", metric="loss", mode="min", modes={"loss": "max"})


def _retried_once(trainable: Any, config: dict[str, Any], logger: Any, tmp_path: Path) -> None:
    """Run one trial of ``trainable`` that Tune retries once if it fails (``FailureConfig(max_failures=1)``)."""
    from ray import tune

    tune.Tuner(
        trainable,
        param_space=config,
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"),
            callbacks=[logger],
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    ).fit()


def test_a_trial_retried_by_tune_keeps_each_attempts_rows_apart(ray_session: None, tmp_path: Path) -> None:
    """Tune retries a trial that fails (``FailureConfig(max_failures=1)``) from scratch: the retry reports
    steps 1 and 2 again, and ends there. Its rows were written as the first attempt's, so steps 1 and 2 read
    twice; then the first attempt's steps 3 and 4, which the run that completed never reached, still read as
    its last steps (its final and its steps were the failed attempt's). Its recorded best (what ranks it)
    counted the failed attempt's values too, and disagreed with its ``loss_best``."""
    from ray import tune

    from ray_cmf import CmfRayLogger

    marker = tmp_path / "failed-once"

    def trainable(config: dict[str, Any]) -> None:
        first = not marker.exists()
        marker.touch()
        for step in range(1, 5 if first else 3):
            tune.report({"loss": config["lr"] * step * (0.1 if first else 1)})  # the failed attempt's: lower
        if first:
            raise RuntimeError("fails once")

    _retried_once(
        trainable, {"lr": 0.5}, CmfRayLogger("retried", metric="loss", store=str(tmp_path / "store")), tmp_path
    )
    sweep = Sweep(tmp_path / "store")
    [trial] = sweep.trials(["loss"]).to_dict(orient="records")
    assert (trial["status"], trial["error"], trial["steps"]) == ("COMPLETE", None, 2)
    assert (trial["loss_best"], trial["loss_final"]) == (0.5, 1.0)
    [execution] = [e for e, _ in sweep.executions()]
    assert properties(execution)["best_loss"] == 0.5  # what ranks it: the read's best, not the failed attempt's
    steps = sweep.steps(["loss", "attempt"])
    assert steps[["step", "loss", "attempt"]].values.tolist() == [[s, 0.5 * s, 2] for s in range(1, 3)]


def test_a_retried_trials_failed_attempt_gets_its_last_system_sample(ray_session: None, tmp_path: Path) -> None:
    """Tune retries a failed trial (``on_trial_recover``) and stops its process: the failed attempt's sampler
    was stopped only at the retry's start, after that, so the attempt had no last row and its final second (an
    allocation before a crash, say) was never sampled; a trial that failed for good had one (a new user)."""
    from ray_cmf import CmfRayLogger

    marker = tmp_path / "failed-once"

    def trainable(config: dict[str, Any]) -> None:
        first = not marker.exists()
        time.sleep(1.0)  # sampled at 0, 0.05, 0.15, 0.35 and 0.75 s by the ramp; the last row comes after
        if first:
            marker.write_text(json.dumps(time.time()))
            raise RuntimeError("fails once")

    logger = CmfRayLogger("retried", store=str(tmp_path / "store"))
    _retried_once(trainable, {}, logger, tmp_path)
    rows = Sweep(tmp_path / "store", metrics_name="system_metrics").steps(["wall_time", "pid"])
    attempts = [group for _, group in rows.groupby(rows[SERIES_COLUMN].astype(str), sort=False)]
    assert len(attempts) == 2 and attempts[0]["pid"].nunique() == 1  # the failed start's series, then the retry's
    assert attempts[0]["wall_time"].max() >= json.loads(marker.read_text())  # sampled as it failed


def _logs_4_fails_then_logs_3(tmp_path: Path) -> Any:
    """A trainable whose first attempt logs steps 1-4 of ``inner`` (each handed to the store) and fails; its
    retry logs steps 1-3, commits them, and writes what ``read_metrics`` reads (the latest version, and that
    version by its md5) to ``tmp_path/read.json``."""
    marker = tmp_path / "failed-once"

    def trainable(config: dict[str, Any]) -> None:
        from ray_cmf.lineage import properties
        from ray_cmf.tune import get_cmf

        first = not marker.exists()
        marker.touch()
        cmf = get_cmf()
        for step in range(1, 5 if first else 4):
            cmf.log_metric("inner", {"step": step, "loss": step * (0.1 if first else 1.0)})
            cmf.flush()
        if first:
            raise RuntimeError("fails once")
        artifact = cmf.commit_metrics("inner")
        assert artifact is not None
        latest = cmf.read_metrics("inner")
        by_md5 = cmf.read_metrics("inner", commit=str(properties(artifact)["Commit"]))
        read = [list(latest.columns), latest.values.tolist(), by_md5.values.tolist()]
        (tmp_path / "read.json").write_text(json.dumps(read))

    return trainable


def _late_to_register_the_retry(pipeline: str, store: Path) -> Any:
    """A CmfRayLogger that registers a retried trial 2 s late, as a busy writer may."""
    from ray_cmf import CmfRayLogger

    class LateToRegisterTheRetry(CmfRayLogger):
        def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            if trial.trial_id in self._trials:  # the retry
                threading.Timer(2.0, super().on_trial_start, (iteration, trials, trial), info).start()
            else:
                super().on_trial_start(iteration, trials, trial, **info)

    return LateToRegisterTheRetry(pipeline, store=str(store), system_metrics=None)


def test_a_retried_trials_own_series_is_the_retrys_even_when_its_registration_comes_late(
    ray_session: None, tmp_path: Path
) -> None:
    """A retried trial's process may call ``get_cmf()`` before the driver's callback has registered the retry
    (the writer may take the join before the registration Tune's hook sent): it joined the failed attempt's
    registration, so the retry's rows were stamped attempt 1, and the failed attempt's step 4 read as the
    trial's last (found by a new user, in 1 of 11 sweeps). The registration comes late here every time."""

    logger = _late_to_register_the_retry("retried", tmp_path / "store")
    _retried_once(_logs_4_fails_then_logs_3(tmp_path), {}, logger, tmp_path)
    sweep = Sweep(tmp_path / "store", metrics_name="inner")
    steps = sweep.steps(["loss", "attempt"])
    assert steps[["step", "loss", "attempt"]].values.tolist() == [[s, float(s), 2] for s in range(1, 4)]
    [trial] = sweep.trials(["loss"]).to_dict(orient="records")
    assert (trial["status"], trial["steps"], trial["loss_final"]) == ("COMPLETE", 3, 3.0)


def test_a_retried_class_trainables_series_is_the_retrys_even_when_its_registration_comes_late(
    ray_session: None, tmp_path: Path
) -> None:
    """The same for a ``tune.Trainable`` that logs through ``trial_cmf(self.trial_id)`` in ``step()``: its
    retry joined the failed attempt's registration, which the function trainables' fix did not cover (a
    class trainable's ``step()`` runs on its actor's main thread), so re-logged steps read twice (a new user,
    in 2 of 6 trials)."""
    from ray import tune

    from ray_cmf.tune import trial_cmf

    marker = tmp_path / "failed-once"

    class LogsThenFailsOnce(tune.Trainable):
        def setup(self, config: dict[str, Any]) -> None:
            self.first = not marker.exists()
            marker.touch()

        def step(self) -> dict[str, Any]:
            step = self.iteration + 1
            trial_cmf(self.trial_id).log_metric("inner", {"step": step, "loss": step * (0.1 if self.first else 1.0)})
            if self.first and step == 4:
                trial_cmf(self.trial_id).flush()
                raise RuntimeError("fails once")
            return {"loss": float(step), "done": step == 3 and not self.first}

        def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:  # Tune may save a retried trial's end
            return {}

        def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            return

    logger = _late_to_register_the_retry("retried", tmp_path / "store")
    _retried_once(LogsThenFailsOnce, {}, logger, tmp_path)
    sweep = Sweep(tmp_path / "store", metrics_name="inner")
    assert sweep.trials()["status"].tolist() == ["COMPLETE"]
    steps = sweep.steps(["loss", "attempt"])
    assert steps[["step", "loss", "attempt"]].values.tolist() == [[s, float(s), 2] for s in range(1, 4)]


def test_a_class_trainable_that_raises_hands_over_what_it_logged_before_tune_stops_it(
    ray_session: None, tmp_path: Path
) -> None:
    """A ``tune.Trainable`` whose ``step()`` raised lost the rows it logged since its last flush where Tune took
    its actor down before the process's exit handed them over (a fresh clone's run: the retry's 3 rows, gone).
    Its rows reach the writer as Tune stops it, as a function trainable's do as its thread ends."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import trial_cmf

    class LogsThenRaises(tune.Trainable):
        def step(self) -> dict[str, Any]:
            step = self.iteration + 1
            trial_cmf(self.trial_id).log_metric("inner", {"step": step, "loss": 1.0 / step})  # never flushed
            if step == 3:
                raise RuntimeError("boom")
            return {"loss": 1.0 / step}

        def cleanup(self) -> None:  # a slow one: the process exits only after Tune has moved on
            time.sleep(3)

    logger = CmfRayLogger("raises", store=str(tmp_path / "store"), system_metrics=None)
    tune.Tuner(
        LogsThenRaises, run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), callbacks=[logger], verbose=0)
    ).fit()
    sweep = Sweep(tmp_path / "store", metrics_name="inner")
    assert sweep.trials()["status"].tolist() == ["FAILED"]
    assert sweep.steps(["loss"])[["step", "loss"]].values.tolist() == [[1, 1.0], [2, 0.5], [3, 1 / 3]]


def test_a_retried_trial_reads_back_its_series_as_the_sweep_does(ray_session: None, tmp_path: Path) -> None:
    """``read_metrics`` in a retried trial returned every attempt's rows: the failed attempt's steps 1-4 and
    then the retry's 1-3, seven rows, where ``Sweep.steps`` and the CLI read the retry's three (latest
    attempt wins). The trial now reads back what the sweep reads, with or without the md5 of its commit."""
    from ray_cmf import CmfRayLogger

    logger = CmfRayLogger("reread", store=str(tmp_path / "store"), system_metrics=None)
    _retried_once(_logs_4_fails_then_logs_3(tmp_path), {}, logger, tmp_path)
    columns, latest, by_md5 = json.loads((tmp_path / "read.json").read_text())
    assert columns == ["step", "loss"]
    assert latest == by_md5 == [[s, float(s)] for s in range(1, 4)]


def test_a_trial_that_asks_for_a_trial_id_of_its_own_making_is_told_tunes(ray_session: None, tmp_path: Path) -> None:
    """cmflib's example names its trials itself (``cmf_obj[config["trial_id"]]``): in ray_cmf such a trial
    waited 60 s, then failed saying to add the CmfRayLogger that was in its callbacks (a cmflib user's). It
    is now told at once which id Tune gave it."""
    from ray import tune

    from ray_cmf import CmfRayLogger, RayCmfError

    said = tmp_path / "said.txt"

    def trainable(config: dict[str, Any]) -> None:
        try:
            logger.cmf_obj[config["trial_id"]]
        except RayCmfError as exc:
            said.write_text(f"{exc}\n{tune.get_context().get_trial_id()}")
        tune.report({"loss": 1.0})

    logger = CmfRayLogger("named", store=str(tmp_path / "store"), system_metrics=None)
    tune.Tuner(
        trainable,
        param_space={"trial_id": "t1"},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), callbacks=[logger], verbose=0),
    ).fit()
    error, own = said.read_text().rsplit("\n", 1)
    assert error == (
        f"'t1' is no trial of this sweep; Tune names this trial {own!r}: ask for ray_cmf.tune.get_cmf(), or "
        "logger.cmf_obj[ray.tune.get_context().get_trial_id()]"
    )


def test_a_trainable_class_logs_through_trial_cmf_in_step_and_is_told_where_not_to(
    ray_session: None, tmp_path: Path
) -> None:
    """A ``tune.Trainable`` subclass: ``get_cmf()`` said it "runs inside a Tune trial", which it was, and
    ``trial_cmf(self.trial_id)`` in ``setup()`` waited 60 s, then said the trial was not registered and to
    add the CmfRayLogger that was there (``setup`` runs before Tune starts the trial). Each now says at
    once what to do, and ``trial_cmf`` in ``step()`` records every row (found by a new user)."""
    from ray import tune

    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import get_cmf, trial_cmf

    class Steps(tune.Trainable):
        def setup(self, config: dict[str, Any]) -> None:
            self.i = 0
            if config["ask"] == "in setup":
                trial_cmf(self.trial_id)

        def step(self) -> dict[str, Any]:
            self.i += 1
            cmf = get_cmf() if self.config["ask"] == "get_cmf" else trial_cmf(self.trial_id)
            cmf.log_metric("inner", {"step": self.i, "loss": 1.0 / self.i})  # never committed: the trial's end does
            return {"loss": 1.0 / self.i, "done": self.i >= 3}

        def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
            return {"i": self.i}

        def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.i = checkpoint["i"]

    logger = CmfRayLogger("classes", store=str(tmp_path / "store"), system_metrics=None)
    tune.Tuner(
        Steps,
        param_space={"ask": tune.grid_search(["in step", "in setup", "get_cmf"])},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), callbacks=[logger], verbose=0),
    ).fit()
    sweep = Sweep(tmp_path / "store", metrics_name="inner")
    table = sweep.trials(["loss"]).set_index("config/ask")
    assert (table.loc["in step", "status"], table.loc["in step", "steps"]) == ("COMPLETE", 3)
    assert sweep.steps(["loss"])[["step", "loss"]].values.tolist() == [[1, 1.0], [2, 0.5], [3, 1 / 3]]
    assert table.loc["in setup", "status"] == "FAILED"
    assert "asked for in a tune.Trainable's setup()" in table.loc["in setup", "error"]
    assert "ray_cmf.tune.trial_cmf(self.trial_id) in step()" in table.loc["get_cmf", "error"]


def test_a_class_trainable_that_pbt_restarts_in_its_own_actor_logs_each_step_once(
    ray_session: None, tmp_path: Path
) -> None:
    """PBT with ``reuse_actors=True`` (what Tune's own warning recommends): the worse trial is paused and
    resumed, in the actor it had, from the better one's checkpoint, and logs its steps from there again. Its
    ``trial_cmf(self.trial_id)`` was the Cmf it held before, bound to the attempt before, so the series read
    those steps twice (a new user's). The restart hands that Cmf over: the next one is the new attempt's."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import trial_cmf

    class Climbs(tune.Trainable):
        def setup(self, config: dict[str, Any]) -> None:
            self.i, self.s = 0, 0.0

        def step(self) -> dict[str, Any]:
            self.i += 1
            self.s += self.config["lr"]
            trial_cmf(self.trial_id).log_metric("fine", {"step": self.i, "s": self.s})
            time.sleep(0.05)  # trials that take turns on the 2 CPUs: a paused one resumes in an actor it had
            return {"s": self.s}

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            self.i, self.s = 0, 0.0
            return True

        def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
            return {"i": self.i, "s": self.s}

        def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.i, self.s = checkpoint["i"], checkpoint["s"]

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 1.0, 3.0]},
        quantile_fraction=0.5,
    )
    logger = CmfRayLogger("pbt_reused", store=str(tmp_path / "store"), metric="s", mode="max", system_metrics=None)
    tune.Tuner(
        Climbs,
        param_space={"lr": tune.grid_search([0.1, 0.3, 1.0, 3.0])},
        tune_config=tune.TuneConfig(metric="s", mode="max", scheduler=pbt, reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"),
            callbacks=[logger],
            stop={"training_iteration": 8},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
            verbose=0,
        ),
    ).fit()
    rows = Sweep(tmp_path / "store", metrics_name="fine").steps(["s", "attempt"])
    steps = {trial: group["step"].tolist() for trial, group in rows.groupby("trial_id")}
    assert all(sorted(s) == list(range(1, 9)) for s in steps.values()), steps  # each step once
    assert rows["attempt"].max() >= 2, rows  # a trial was restarted from the other's checkpoint


def test_a_long_errors_table_cell_is_its_exception_line() -> None:
    """A trial that raised ``ValueError("x" * 5000)``: the error keeps the type, and the trials table shows
    the exception's line, shortened, where it showed the end of the cut message (a row of x's)."""
    from ray_cmf.cli import HEADLINE_CHARS, _headline
    from ray_cmf.errors import recorded_error

    trace = '  File "/ray/tune/trainable/function_trainable.py", line 249, in _trainable_func\n    output = fn()\n'
    error = recorded_error(f"ray::ImplicitFunc.train() (pid=1)\nTraceback:\n{trace * 30}ValueError: {'x' * 5000}")
    assert "ValueError: xxx" in error and len(error) <= 2000
    cell = _headline(error)
    assert cell is not None and cell.startswith("ValueError: xxx") and len(cell) == HEADLINE_CHARS
    assert _headline(None) is None and _headline("RuntimeError: short") == "RuntimeError: short"


def _reports_m_as(config: dict[str, Any]) -> None:
    from ray import tune

    for it in range(1, 4):
        tune.report({"m": it % 2 == 0 if config["kind"] == "bool" else it + 0.25, "loss": 1.0 / it})


def test_a_metric_one_trial_reports_as_a_bool_is_said_as_it_happens(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One trial reported the sweep's ranking metric as a bool, the others as numbers: across the sweep the
    column reads as text (the README's rule), so ``m`` had no best, no final and no ranking for any trial, and
    nothing said so until the sweep was read (a new user). The driver says it once, naming both trials."""
    from ray_cmf import CmfRayLogger
    from tests._sweeps import run_grid

    logger = CmfRayLogger("kinds", store=str(tmp_path / "store"), metric="m", mode="max")
    with caplog.at_level("WARNING", logger="ray_cmf"):
        run_grid(_reports_m_as, {"kind": ["number", "bool", "number"]}, tmp_path / "results", logger)
    said = [r.getMessage() for r in caplog.records if "'m' is" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "a bool" in said[0] and "a number" in said[0] and "reads as text" in said[0], said
    assert not [r for r in caplog.records if "'loss' is" in r.getMessage()]  # one kind everywhere: no word
