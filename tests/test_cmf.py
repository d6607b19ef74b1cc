"""Cmf facade against a real MLMD SQLite store and a real DVC repo (the dvc CLI checks the result)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf import (
    Cmf,
    InvalidArgumentError,
    InvalidNameError,
    MetricsNotFoundError,
    PrecisionError,
    RayCmfError,
    Store,
    StoreError,
    Sweep,
)
from ray_cmf.audit import audit
from ray_cmf.constants import ENV_STORE, ENVIRONMENT_TYPE, PIPELINE_CONTEXT_TYPE, STAGE_CONTEXT_TYPE, STEP_METRICS_TYPE
from ray_cmf.lineage import properties


def _dvc(store_dir: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=store_dir, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _log_steps(cmf: Cmf, name: str, n: int) -> None:
    for step in range(n):
        cmf.log_metric(name, {"step": step, "loss": 1.0 / (step + 1)})


def test_commit_and_read_back(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="mnist", store=store_dir, flush_rows=4)
    _log_steps(cmf, "train", 10)
    artifact = cmf.commit_metrics("train")
    props = properties(artifact)
    path = store_dir / props["url"]
    assert props["Commit"] == hashlib.md5(path.read_bytes()).hexdigest()
    assert props["rows"] == 10 and props["size"] == path.stat().st_size and props["metrics_name"] == "train"
    df = cmf.read_metrics("train")
    assert df.index.name == "SequenceNumber" and list(df.index) == list(range(1, 11))
    assert df["loss"].tolist() == [1.0 / (s + 1) for s in range(10)]


def test_mlmd_structure_matches_cmflib_model(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="pipe", store=store_dir, custom_properties={"owner": "me"})
    stage = cmf.create_context("train", {"gpu": False})
    execution = cmf.create_execution("Train", {"lr": 0.1, "cfg": {"a": 1}.__repr__()})
    _log_steps(cmf, "train", 3)
    artifact = cmf.commit_metrics("train")
    mlmd = cmf.store.lineage.store

    [pipeline] = mlmd.get_contexts_by_type(PIPELINE_CONTEXT_TYPE)
    assert pipeline.name == "pipe" and properties(pipeline)["owner"] == "me"
    [child] = mlmd.get_contexts_by_type(STAGE_CONTEXT_TYPE)
    assert child.id == stage.id
    assert [p.id for p in mlmd.get_parent_contexts_by_context(child.id)] == [pipeline.id]
    assert [e.id for e in mlmd.get_executions_by_context(child.id)] == [execution.id]
    kinds = {mlmd.get_artifact_types_by_id([a.type_id])[0].name: a.id for a in mlmd.get_artifacts_by_context(child.id)}
    assert kinds.keys() == {STEP_METRICS_TYPE, ENVIRONMENT_TYPE} and kinds[STEP_METRICS_TYPE] == artifact.id
    [event] = mlmd.get_events_by_artifact_ids([artifact.id])
    assert event.type == mlpb.Event.OUTPUT and event.execution_id == execution.id
    assert mlmd.get_artifact_type(STEP_METRICS_TYPE).properties.keys() >= {
        "Commit",
        "url",
        "metrics_name",
        "rows",
        "size",
    }
    assert properties(mlmd.get_executions_by_id([execution.id])[0])["lr"] == 0.1


def test_implicit_context_and_execution(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    cmf.log_metric("m", {"x": 1})
    cmf.commit_metrics("m")
    assert cmf.child_context is not None and cmf.execution is not None
    assert cmf.store.lineage.contexts_of(cmf.execution.id)[0].id == cmf.child_context.id


def test_an_execution_reopened_from_another_pipeline_says_where_its_rows_go(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Cmf(pipeline_name="P3")`` reopening the name of pipeline P2's execution logged into P2's, and ``ray-cmf
    pipelines`` then listed P3 with no trial: the warning only named a property that differed, and none
    did where the config was the same (a new user's). It names the pipeline and stage the rows go to."""
    first = Cmf(pipeline_name="P2", store=store_dir)
    first.create_context("s2")
    first.create_execution("Train", {"who": "A"}, execution_name="B")
    first.close()
    for config in ({"who": "A"}, {"who": "C"}):
        caplog.clear()
        other = Cmf(pipeline_name="P3", store=store_dir)
        other.create_context("other")
        with caplog.at_level("WARNING", logger="ray_cmf"):
            other.create_execution("Train", config, execution_name="B")
        assert "execution 'B' belongs to pipeline 'P2', stage 's2', not to" in caplog.text, caplog.text
        assert "not to pipeline 'P3', stage 'other'" in caplog.text, caplog.text
        other.close()
    caplog.clear()
    again = Cmf(pipeline_name="P2", store=store_dir)
    again.create_context("s2")
    with caplog.at_level("WARNING", logger="ray_cmf"):
        again.create_execution("Train", {"who": "A"}, execution_name="B")
    assert "belongs to" not in caplog.text  # its own pipeline and stage: nothing to say


def test_an_execution_reopened_by_name_with_other_properties_says_it_keeps_its_own(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The name reopens the execution, whose recorded properties stay: the other ones given were dropped
    without a word (found by a new user)."""
    first = Cmf(pipeline_name="p", store=store_dir)
    first.create_execution("Train", {"who": "A", "lr": 0.1}, execution_name="same")
    first.close()
    second = Cmf(pipeline_name="p", store=store_dir)
    with caplog.at_level("WARNING", logger="ray_cmf"):
        second.create_execution("Train", {"who": "B", "lr": 0.1}, execution_name="same")
    assert "execution 'same' exists and was reopened" in caplog.text and "who ('A' recorded, 'B' given)" in caplog.text
    assert "lr" not in caplog.text.split("differ:")[1]
    assert Sweep(store_dir).config("same") == {"who": "A", "lr": 0.1}
    caplog.clear()
    with caplog.at_level("WARNING", logger="ray_cmf"):
        Cmf(pipeline_name="p", store=store_dir).create_execution("Train", {"who": "A"}, execution_name="same")
    assert "reopened" not in caplog.text  # the same properties: nothing to say


def test_update_execution_merges_properties(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    execution = cmf.create_execution("Train", {"a": 1})
    cmf.update_execution(execution.id, {"b": "two", "best": float("nan")})
    props = properties(cmf.store.lineage.get_execution(execution.id))
    assert props["a"] == 1 and props["b"] == "two" and props["best"] != props["best"]


def test_an_execution_id_or_a_row_of_the_wrong_kind_is_an_error_that_names_it(store_dir: Path) -> None:
    """``update_execution`` of an id no execution has raised "not enough values to unpack", of a text id a
    TypeError from ML-Metadata, and ``log_metric`` of a list of pairs "'list' object has no attribute 'items'"
    (a cmflib user's). Each now names the value and what it should be; the refused row leaves no trace."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    execution = cmf.create_execution("Train")
    with pytest.raises(StoreError, match="No MLMD execution with id 999999"):
        cmf.update_execution(999999, {"lr": 0.2})
    with pytest.raises(InvalidArgumentError, match=r"execution_id '1' is not an int: pass an execution's \.id"):
        cmf.update_execution("1", {"lr": 0.2})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"Row 1 is a list \(\[\('loss', 0.5\)\]\), not a mapping"):
        cmf.log_metric("steps", [("loss", 0.5)])  # type: ignore[arg-type]
    cmf.log_metric("steps", {"loss": 0.25})
    cmf.commit_metrics("steps")
    assert cmf.read_metrics("steps")["loss"].to_dict() == {1: 0.25}
    assert properties(cmf.update_execution(execution.id, {"lr": 0.2}))["lr"] == 0.2


def test_the_config_a_sweep_shows_is_what_the_execution_holds(store_dir: Path) -> None:
    """cmflib's custom properties are the config ``Sweep.trials()`` shows: ``update_execution``'s changes did
    not show (the config stayed as created), NaN and inf read back as the strings "NaN" and "Infinity", and
    numpy scalars were recorded in MLMD as their repr ("np.float32(0.5)")."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    config = {"a": 1, "nan": math.nan, "inf": math.inf, "f32": np.float32(0.5), "i64": np.int64(3)}
    execution = cmf.create_execution("Train", config)
    cmf.log_metric("steps", {"step": 0, "loss": 1.0})
    cmf.commit_metrics("steps")
    cmf.update_execution(execution.id, {"a": 3, "b": 2.5})
    [row] = Sweep(store_dir, metrics_name="steps").trials().to_dict("records")
    assert (row["config/a"], row["config/b"], row["config/inf"], row["config/f32"]) == (3, 2.5, math.inf, 0.5)
    assert math.isnan(row["config/nan"]) and row["config/i64"] == 3 and type(row["config/i64"]) is not str
    assert Sweep(store_dir, metrics_name="steps").trials(where="config/inf > 1")["config/a"].tolist() == [3]
    props = properties(cmf.store.lineage.get_execution(execution.id))
    assert (props["f32"], props["i64"], props["a"], props["b"]) == (0.5, 3, 3, 2.5)


def test_scripts_that_start_on_one_new_store_at_once_all_run(tmp_path: Path) -> None:
    """Two scripts started together on a store that did not exist yet: one died initialising DVC ("'.dvc'
    exists"), and its execution was left RUNNING (then shown as CRASHED, not FAILED)."""
    store, go = tmp_path / "store", tmp_path / "go"
    script = (
        "import sys, time\nfrom pathlib import Path\nfrom ray_cmf import Cmf\n"
        "while not Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
        "cmf = Cmf(pipeline_name='race', store=sys.argv[1])\ncmf.create_execution('Train')\n"
        "cmf.log_metric('m', {'x': 1.0})\nassert cmf.commit_metrics('m') is not None\n"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", script, str(store), str(go)], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    go.touch()
    errors = [child.communicate(timeout=120)[1] for child in children]
    assert [child.returncode for child in children] == [0] * 4, "\n".join(errors)[-3000:]
    states = [e.last_known_state for e in Store(store).lineage.store.get_executions()]
    assert states == [mlpb.Execution.COMPLETE] * 4


def test_commit_again_creates_a_new_version(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    _log_steps(cmf, "train", 5)
    first = properties(cmf.commit_metrics("train"))
    cmf.log_metric("train", {"step": 5, "loss": 0.1})
    second = properties(cmf.commit_metrics("train"))
    assert first["Commit"] != second["Commit"] and first["url"] != second["url"]
    assert len(cmf.read_metrics("train")) == 6
    assert len(cmf.read_metrics("train", commit=first["Commit"])) == 5
    with pytest.raises(MetricsNotFoundError, match="0000"):
        cmf.read_metrics("train", commit="0000")


def test_dvc_status_is_clean_and_push_works(store_dir: Path, tmp_path: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    for name in ("train", "eval"):
        _log_steps(cmf, name, 20)
        cmf.commit_metrics(name)
    assert "up to date" in _dvc(store_dir, "status")
    remote = tmp_path / "remote"
    cmf.store.dvc.add_remote("local", str(remote))
    cmf.store.dvc.push()
    pushed = {p.parent.name + p.name for p in (remote / "files" / "md5").rglob("*") if p.is_file()}
    committed = {properties(a)["Commit"] for a in cmf.store.lineage.artifacts([cmf.child_context], STEP_METRICS_TYPE)}
    assert committed and committed <= pushed
    assert "in sync" in _dvc(store_dir, "status", "-c")


def test_dvc_status_sees_a_tampered_artifact(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    _log_steps(cmf, "train", 3)
    path = store_dir / properties(cmf.commit_metrics("train"))["url"]
    path.write_bytes(path.read_bytes() + b"x")
    assert "modified" in _dvc(store_dir, "status")


def test_log_dataset_and_model(store_dir: Path, tmp_path: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    outside = tmp_path / "data.csv"
    outside.write_text("a,b\n1,2\n")
    dataset = cmf.log_dataset(str(outside), "input", {"split": "train"})
    assert properties(dataset)["Commit"] == hashlib.md5(outside.read_bytes()).hexdigest()
    assert properties(dataset)["dvc_tracked"] is False
    model_path = store_dir / "models" / "model.pt"
    model_path.parent.mkdir(parents=True)
    model_path.write_bytes(b"\x00weights")
    model = cmf.log_model(str(model_path), "output", model_framework="torch", model_name="mlp")
    assert properties(model)["dvc_tracked"] is True and properties(model)["model_name"] == "mlp"
    assert "up to date" in _dvc(store_dir, "status")
    mlmd = cmf.store.lineage.store
    [environment] = mlmd.get_artifacts_by_type(ENVIRONMENT_TYPE)
    events = {e.artifact_id: e.type for e in mlmd.get_events_by_execution_ids([cmf.execution.id])}
    assert events == {dataset.id: mlpb.Event.INPUT, model.id: mlpb.Event.OUTPUT, environment.id: mlpb.Event.INPUT}
    with pytest.raises(StoreError, match="no such file or directory"):
        cmf.log_dataset(str(tmp_path / "missing.csv"), "input")


def test_verify_re_hashes_datasets_and_models_outside_the_store(store_dir: Path, tmp_path: Path) -> None:
    """A file logged from outside the store was only checked to exist: one edited by hand read ``ok``, and so
    did both versions of a dataset logged before and after a change (found by a new user). Each is re-hashed:
    the version the file holds now is ``ok``, an earlier one ``superseded`` (its bytes are kept nowhere, and
    that is no fault), a file that matches no version ``modified``."""
    data, images = tmp_path / "data.csv", tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(b"a")
    cmf = Cmf(pipeline_name="p", store=store_dir)
    data.write_text("a,b\n1,2\n")
    first = cmf.log_dataset(str(data), "input")
    data.write_text("a,b\n1,3\n")
    second = cmf.log_dataset(str(data), "input")
    folder = cmf.log_dataset(str(images), "input")
    status = {f.md5: f.status for f in audit(cmf.store)}
    md5 = [properties(a)["Commit"] for a in (first, second, folder)]
    assert [status[m] for m in md5] == ["superseded", "ok", "ok"]
    assert all(f.ok for f in audit(cmf.store))  # a superseded version is no fault
    data.write_text("edited by hand\n")
    (images / "b.png").write_bytes(b"b")
    status = {f.md5: f.status for f in audit(cmf.store)}
    assert [status[m] for m in md5] == ["modified", "modified", "modified"]
    data.unlink()
    assert {f.status for f in audit(cmf.store) if f.md5 in md5[:2]} == {"missing"}


def test_read_metrics_reads_what_was_logged_though_the_file_was_edited_by_hand(store_dir: Path) -> None:
    """Reads take the content the md5 names (the DVC cache object), read_metrics as Sweep does."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    for step in range(3):
        cmf.log_metric("m", {"step": step, "loss": 1.0 / (step + 1)})
    artifact = cmf.commit_metrics("m")
    other = Cmf(pipeline_name="p", store=store_dir)
    other.log_metric("m", {"step": 0, "loss": 99.0})
    edited = cmf.store.resolve(properties(artifact)["url"])
    edited.write_bytes(other.store.resolve(properties(other.commit_metrics("m"))["url"]).read_bytes())
    assert cmf.read_metrics("m")["loss"].tolist() == [1.0, 0.5, 1.0 / 3]


def test_log_execution_metrics(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    with pytest.raises(InvalidNameError, match="a name is a string, not a dict: pass the name first"):
        cmf.log_execution_metrics({"accuracy": 0.91})  # type: ignore[arg-type]  # the README showed no name
    artifact = cmf.log_execution_metrics("final", {"accuracy": 0.91, "epochs": 3})
    props = properties(artifact)
    assert props["accuracy"] == 0.91 and props["epochs"] == 3 and props["metrics_name"] == "final"


@pytest.mark.parametrize("name", ["a/b", "a\\b", "..", "x..y", ""])
def test_bad_names_are_rejected(store_dir: Path, name: str) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    with pytest.raises(InvalidNameError, match="Invalid metrics_name"):
        cmf.log_metric(name, {"x": 1})
    with pytest.raises(InvalidNameError):
        Cmf(pipeline_name=name, store=store_dir)


def test_a_name_too_long_for_a_file_name_is_refused_when_it_is_given(store_dir: Path) -> None:
    """A 200-character metrics_name (or a 300-character pipeline name) passed every check and failed only at
    commit ("File name too long"): the commit returned None, its warning advised a retry that could never
    succeed, and the rows were dropped at exit. Such a name is refused where it is given."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    with pytest.raises(InvalidNameError, match=r"metrics_name 'mmm.*128 bytes"):
        cmf.log_metric("m" * 200, {"x": 1})
    with pytest.raises(InvalidNameError, match="pipeline_name"):
        Cmf(pipeline_name="p" * 300, store=store_dir)
    with pytest.raises(InvalidNameError, match="execution_name"):
        cmf.create_execution("Train", execution_name="e" * 300)
    longest = "ü" * 64  # 128 bytes in UTF-8: the longest name taken
    cmf = Cmf(pipeline_name=longest, store=store_dir)
    cmf.create_context(longest)
    cmf.create_execution(longest, execution_name=longest)
    cmf.log_metric(longest, {"x": 1})
    assert cmf.commit_metrics(longest) is not None and cmf.read_metrics(longest)["x"].tolist() == [1]


def test_a_metric_named_rank_is_refused_by_name_since_a_sweep_reads_that_column_as_a_train_rank(
    store_dir: Path,
) -> None:
    """Logged as a metric, ``rank`` was read as a Train rank's key: a trial's summary kept only the rows of its
    lowest ``rank`` value and its ``loss_final`` came from another step. It is refused where it is logged."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    cmf.log_metric("m", {"step": 0, "loss": 1.0})
    with pytest.raises(InvalidNameError, match=r"'rank'.*Train rank"):
        cmf.log_metric("m", {"step": 1, "loss": 0.5, "rank": 2})
    cmf.log_metric("m", {"step": 2, "loss": 0.25})
    assert cmf.commit_metrics("m") is not None and cmf.read_metrics("m")["loss"].tolist() == [1.0, 0.25]


def test_misuses_of_a_cmf_get_errors_that_say_what_to_do(store_dir: Path) -> None:
    """A typo in close()'s state was a warning, and left the execution RUNNING (then CRASHED); logging after
    close() blamed a "MetricBuffer" the user never made; a non-string key was called an unsupported value."""
    from ray_cmf import InvalidArgumentError

    cmf = Cmf(pipeline_name="p", store=store_dir)
    execution = cmf.create_execution("Train")
    with pytest.raises(InvalidArgumentError, match=r"state='BOGUS'.*'COMPLETE', 'FAILED', 'CANCELED'"):
        cmf.close(state="BOGUS")
    with pytest.raises(InvalidNameError, match=r"metric name 1: .*keys of a row.*strings"):
        cmf.log_metric("m", {1: 2})  # type: ignore[dict-item]
    cmf.log_metric("m", {"x": 1})
    cmf.close(state="CANCELED")
    assert cmf.store.lineage.get_execution(execution.id).last_known_state == mlpb.Execution.CANCELED
    with pytest.raises(RayCmfError, match=r"closed.*create_execution") as closed:
        cmf.log_metric("m", {"x": 2})
    assert "MetricBuffer" not in str(closed.value)


def test_commit_without_logging_names_the_metric(store_dir: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=store_dir)
    with pytest.raises(MetricsNotFoundError, match="'nothing'"):
        cmf.commit_metrics("nothing")


def test_commit_of_a_series_whose_every_row_was_refused_says_so(store_dir: Path) -> None:
    """A series whose only rows ``log_metric`` refused holds nothing: committing it raised nothing and returned
    None, and reading it then advised calling commit_metrics, which had just been called (a new user)."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    cmf.create_execution("Train")
    with pytest.raises(PrecisionError):
        cmf.log_metric("g", {"step": 0, "x": 2**63})
    refused = r"Nothing was logged under metrics_name='g': log_metric refused every row given to it"
    with pytest.raises(MetricsNotFoundError, match=refused):
        cmf.commit_metrics("g")
    with pytest.raises(MetricsNotFoundError, match=refused):
        cmf.read_metrics("g")
    cmf.log_metric("g", {"step": 1, "x": 2})  # the series takes rows that fit
    assert cmf.commit_metrics("g") is not None
    assert cmf.read_metrics("g")[["step", "x"]].values.tolist() == [[1, 2]]


def test_a_series_not_committed_is_answered_with_those_that_are(store_dir: Path) -> None:
    """``read_metrics`` of a name the execution never committed named neither the near one (a typo) nor the
    series it has; a wrong md5 of a series it has says only that."""
    with Cmf(pipeline_name="p", store=store_dir) as cmf:
        cmf.create_execution("train")
        for name in ("train_steps", "val_steps"):
            cmf.log_metric(name, {"step": 0, "v": 1.0})
            cmf.commit_metrics(name)
        with pytest.raises(MetricsNotFoundError, match=r"in execution \d+ of .*; did you mean 'train_steps'\?$"):
            cmf.read_metrics("train_stepz")
        with pytest.raises(MetricsNotFoundError, match=r"; it has \['train_steps', 'val_steps'\]$"):
            cmf.read_metrics("loss")
        with pytest.raises(MetricsNotFoundError, match=r"'train_steps' with md5 'f00' in execution \d+ of [^;]*$"):
            cmf.read_metrics("train_steps", commit="f00")


def test_store_from_env_and_missing_dirs_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "er" / "store"
    monkeypatch.setenv(ENV_STORE, str(target))
    cmf = Cmf(pipeline_name="p")
    cmf.log_metric("m", {"x": 1})
    cmf.commit_metrics("m")
    assert (target / "mlmd.sqlite").is_file() and (target / ".dvc").is_dir()


def test_an_empty_store_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty store path (``--store ""``, ``Sweep("")``, ``RAY_CMF_STORE=``) read as the current directory: a
    store there was made, or read, without a word. It is refused, naming where it came from."""
    from ray_cmf import Sweep

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"store: an empty path"):
        Cmf(pipeline_name="p", store="")
    with pytest.raises(InvalidArgumentError, match=r"store: an empty path"):
        Sweep("")
    monkeypatch.setenv(ENV_STORE, "")
    with pytest.raises(InvalidArgumentError, match=rf"\${ENV_STORE}: an empty path"):
        Cmf(pipeline_name="p")
    assert list(tmp_path.iterdir()) == []  # nothing was made here


def test_filepath_keeps_cmflib_meaning(store_dir: Path, tmp_path: Path) -> None:
    mlmd_file = tmp_path / "elsewhere" / "mlmd"
    cmf = Cmf(filepath=str(mlmd_file), pipeline_name="p", store=store_dir)
    cmf.log_metric("m", {"x": 1})
    cmf.commit_metrics("m")
    assert mlmd_file.is_file() and not (store_dir / "mlmd.sqlite").exists()


def test_corrupt_or_unusable_store_gives_clear_error(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "mlmd.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="Cannot open the MLMD database"):
        Cmf(pipeline_name="p", store=corrupt)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        Cmf(pipeline_name="p", store=not_a_dir)


def test_store_is_picklable_before_and_after_use(store: Store) -> None:
    import pickle

    store.pipeline("p")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.root == store.root and clone.pipeline("p").name == "p"


def test_a_store_records_an_mlmd_kept_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """cmflib's ``Cmf(filepath="mlmd")``: the CLI and recover find that MLMD from the store directory alone."""
    from ray_cmf import recover
    from ray_cmf.cli import main

    monkeypatch.chdir(tmp_path)
    killed = """if True:
        import os
        from ray_cmf import Cmf
        cmf = Cmf(filepath="mlmd", pipeline_name="p")  # MLMD at ./mlmd, the store at ./cmf_store
        cmf.log_metric("m", {"x": 1})
        cmf.commit_metrics("m")
        cmf.log_metric("m", {"x": 2})
        cmf.metrics["m"].flush()  # spilled, not committed
        os._exit(0)
    """
    subprocess.run([sys.executable, "-c", killed], check=True)
    assert Store("cmf_store").mlmd == str(tmp_path / "mlmd")
    capsys.readouterr()
    assert main(["pipelines", "--store", "cmf_store", "--json"]) == 0
    assert [row["pipeline"] for row in json.loads(capsys.readouterr().out)] == ["p"]
    [artifact] = recover(Store("cmf_store"))  # its execution is found in ./mlmd
    assert properties(artifact)["rows"] == 2


def test_a_project_copied_or_moved_keeps_its_own_lineage_and_recovers_its_spills(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cmflib's ``Cmf(filepath="mlmd")`` keeps the MLMD beside the store, which named it by its absolute path,
    as a spill named its files: a copy of the project wrote its runs into the original's database (whose
    ``verify`` then failed), a moved one could not be read ("No MLMD database at" the old path), and
    ``recover`` there failed ("lies outside the store"), or wrote into the original store."""
    import shutil

    from ray_cmf import recover
    from ray_cmf.cli import main

    project = tmp_path / "project"
    project.mkdir()
    crashes = """if True:
        import os
        from ray_cmf import Cmf
        cmf = Cmf(filepath="mlmd", pipeline_name="p")
        cmf.create_execution("train", execution_name="first")
        cmf.log_metric("m", {"x": 1})
        cmf.commit_metrics("m")
        cmf.log_metric("m", {"x": 2})
        cmf.metrics["m"].flush()  # spilled, not committed
        os._exit(0)
    """
    subprocess.run([sys.executable, "-c", crashes], cwd=project, check=True)
    shutil.copytree(project, tmp_path / "copy")
    project.rename(tmp_path / "moved")
    for where in ("copy", "moved"):
        store = tmp_path / where / "cmf_store"
        [artifact] = recover(Store(store))
        assert Path(properties(artifact)["url"]).parts[0] == "artifacts" and properties(artifact)["rows"] == 2
        assert Sweep(store, metrics_name="m").steps()["x"].tolist() == [1, 2], where
    with Cmf(pipeline_name="p", store=tmp_path / "copy" / "cmf_store") as cmf:
        cmf.create_execution("train", execution_name="second")
        cmf.log_metric("m", {"x": 3})
        cmf.commit_metrics("m")
    assert sorted(Sweep(tmp_path / "copy" / "cmf_store", metrics_name="m").trials()["trial_id"]) == ["first", "second"]
    assert Sweep(tmp_path / "moved" / "cmf_store", metrics_name="m").trials()["trial_id"].tolist() == ["first"]
    for where in ("copy", "moved"):
        assert main(["verify", "--store", str(tmp_path / where / "cmf_store")]) == 0, capsys.readouterr().out
    assert not project.exists()  # nothing was written where the project was
    with Cmf(filepath=str(tmp_path / "copy" / "sub" / ".." / "mlmd"), store=tmp_path / "copy" / "cmf_store") as cmf:
        cmf.create_execution("train", execution_name="third")  # the same database, named another way
    config = tmp_path / "copy" / "cmf_store" / "ray_cmf.json"  # as an earlier version recorded it, moved since
    config.write_text(json.dumps({"mlmd": str(tmp_path / "gone" / "mlmd")}))
    with pytest.raises(StoreError, match=r"No MLMD database at .*gone/mlmd, where the store .* \(ray_cmf\.json names"):
        Sweep(tmp_path / "copy" / "cmf_store")  # it said "run a sweep or Cmf commit first"


def test_a_password_in_an_mlmd_url_is_never_written(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", mlmd="mysql://user:s3cret@127.0.0.1:3306/mlmd")
    store._ensure_root()
    store._record_config()  # as opening its MLMD does, once it answered
    recorded = (tmp_path / "store" / "ray_cmf.json").read_text()
    assert "s3cret" not in recorded and "mysql://user@127.0.0.1:3306/mlmd" in recorded


def test_committing_again_without_new_rows_records_the_same_version(store_dir: Path) -> None:
    """A commit with no row logged since the last one rewrote the last version's rows into new row groups:
    new bytes, a new md5 and a second file of the same rows (a new user's: a changed md5 where no data
    changed). It records the last version again: its file, its md5, its artifact."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    cmf.log_metric("m", {"x": 1})
    first = cmf.commit_metrics("m")
    cmf.log_metric("m", {"x": 2})  # the second version: the first's row group, then this row's
    second = cmf.commit_metrics("m")
    third = cmf.commit_metrics("m")
    fourth = cmf.commit_metrics("m")
    assert first is not None and second is not None and third is not None and fourth is not None
    assert third.id == second.id and fourth.id == second.id, [properties(a)["Commit"] for a in (second, third)]
    files = sorted(p.name for p in store_dir.rglob("*.parquet") if "artifacts" in p.parts)
    assert len(files) == 2, files
    assert cmf.read_metrics("m")["x"].tolist() == [1, 2]


def test_read_metrics_reads_its_own_execution_never_another(store_dir: Path) -> None:
    """Two executions of one pipeline log and commit a series of the same name: each reads its own rows, and
    one that has committed nothing yet is told so instead of being given the other's."""
    first = Cmf(pipeline_name="p", store=store_dir)
    first.create_execution("Train")
    for _ in range(5):
        first.log_metric("steps", {"v": 1.0})
    first.commit_metrics("steps")
    second = Cmf(pipeline_name="p", store=store_dir)
    second.create_execution("Train")
    for _ in range(3):
        second.log_metric("steps", {"v": 2.0})
    with pytest.raises(MetricsNotFoundError, match=r"3 rows .* none committed"):
        second.read_metrics("steps")  # it logged rows but committed none: not the first one's rows
    second.commit_metrics("steps")
    assert first.read_metrics("steps")["v"].tolist() == [1.0] * 5
    assert second.read_metrics("steps")["v"].tolist() == [2.0] * 3
    older = properties(first.commit_metrics("steps"))["Commit"]
    with pytest.raises(MetricsNotFoundError, match="md5"):
        second.read_metrics("steps", commit=older)  # a version of another execution is not one of its own


def test_a_second_execution_of_one_cmf_gets_its_own_series(store_dir: Path) -> None:
    """cmflib's pattern: one Cmf, create_execution again for the next step. The rows logged after it belong
    to the new execution (they went into the first one's series, and read_metrics then failed)."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    cmf.create_context("train")
    train = cmf.create_execution("Train")
    cmf.log_metric("m", {"step": 0, "v": 1.0})
    cmf.commit_metrics("m")
    cmf.create_context("eval")
    evaluation = cmf.create_execution("Eval")
    with pytest.raises(MetricsNotFoundError, match=r"No committed metrics 'm' in execution"):
        cmf.read_metrics("m")  # Eval has logged nothing yet
    cmf.log_metric("m", {"step": 0, "v": 9.0})
    artifact = cmf.commit_metrics("m")
    assert artifact is not None and "/eval/" in properties(artifact)["url"]
    assert cmf.read_metrics("m")["v"].tolist() == [9.0]
    events = cmf.store.lineage.store.get_events_by_artifact_ids([artifact.id])
    assert [e.execution_id for e in events if e.type == mlpb.Event.OUTPUT] == [evaluation.id]
    first = Cmf(pipeline_name="p", store=store_dir)
    first.create_execution("Train", execution_name=train.name, create_new_execution=False)
    assert first.read_metrics("m")["v"].tolist() == [1.0]


def test_each_cmf_of_a_shared_execution_reads_back_its_own_series(store_dir: Path) -> None:
    """Two Cmf objects on one execution (a notebook cell run twice, a resumed script): each logs its own
    series, and ``read_metrics`` gave both the one committed last. A Cmf that logged nothing of the name
    still reads the execution's newest version."""
    a, b = Cmf(pipeline_name="p", store=store_dir), Cmf(pipeline_name="p", store=store_dir)
    a.create_execution("run", execution_name="shared")
    b.create_execution("run", execution_name="shared", create_new_execution=False)
    for i in range(3):
        a.log_metric("m", {"step": i, "v": float(i)})
        b.log_metric("m", {"step": i, "v": 10.0 + i})
    a.commit_metrics("m")
    b.commit_metrics("m")
    assert a.read_metrics("m")["v"].tolist() == [0.0, 1.0, 2.0]
    assert b.read_metrics("m")["v"].tolist() == [10.0, 11.0, 12.0]
    reader = Cmf(pipeline_name="p", store=store_dir)
    reader.create_execution("run", execution_name="shared", create_new_execution=False)
    assert reader.read_metrics("m")["v"].tolist() == [10.0, 11.0, 12.0]
    md5 = properties(a.commit_metrics("m"))["Commit"]
    assert b.read_metrics("m", commit=md5)["v"].tolist() == [0.0, 1.0, 2.0]  # a version named: of the execution
    for cmf in (a, b, reader):
        cmf.close()


def test_a_with_block_that_raises_records_why_the_execution_failed(tmp_path: Path) -> None:
    """The exception that ends a ``with Cmf(...)`` block is the FAILED execution's error."""
    from ray_cmf import Sweep

    store = tmp_path / "store"
    with pytest.raises(ValueError, match="bad batch 7"), Cmf(pipeline_name="p", store=store) as cmf:
        cmf.create_execution("train", {"lr": 0.1}, execution_name="run")
        cmf.log_metric("m", {"step": 0, "x": 1.0})
        raise ValueError("bad batch 7")
    [row] = Sweep(store).trials(metrics=[]).to_dict(orient="records")
    assert (row["status"], row["error"]) == ("FAILED", "ValueError: bad batch 7")


@pytest.mark.parametrize("ending", ["exit", "raise", "close", "next_execution"])
def test_rows_logged_but_never_committed_are_committed_when_the_execution_ends(tmp_path: Path, ending: str) -> None:
    """A script that logs and forgets ``commit_metrics`` (or logs more after its last commit) read as COMPLETE
    with 0 steps until ``ray-cmf recover``. Its execution's end commits them, marked ``at_end``, as a Tune
    trial's end does, however it ends."""
    store = tmp_path / "store"
    script = f"""
from ray_cmf import Cmf
cmf = Cmf(pipeline_name="p", store={str(store)!r})
cmf.create_execution("train", {{"lr": 0.1}}, execution_name="run")
for step in range(5):
    cmf.log_metric("m", {{"step": step, "loss": 1.0 / (step + 1)}})
cmf.commit_metrics("m")
for step in range(5, 7):
    cmf.log_metric("m", {{"step": step, "loss": 1.0 / (step + 1)}})
cmf.log_metric("other", {{"step": 0, "x": 1.0}})
if {ending!r} == "raise":
    raise RuntimeError("diverged")
if {ending!r} == "close":
    cmf.close()
if {ending!r} == "next_execution":
    cmf.create_execution("eval", execution_name="eval")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == (1 if ending == "raise" else 0), done.stderr[-2000:]
    sweep = Sweep(store, metrics_name="m")
    [row] = sweep.trials().to_dict(orient="records")[:1]
    assert (row["trial_id"], row["steps"], row["loss_final"]) == ("run", 7, 1.0 / 7)
    assert row["status"] == ("FAILED" if ending == "raise" else "COMPLETE")
    assert Sweep(store, metrics_name="other").steps()["x"].tolist() == [1.0]
    assert not list((store / "spill").iterdir())  # nothing left for recover
    [at_end] = [a for a in sweep.lineage.store.get_artifacts() if properties(a).get("metrics_name") == "other"]
    assert properties(at_end)["at_end"] is True


def test_the_versions_a_run_shows_are_its_own_numbered_from_one(store_dir: Path) -> None:
    """``show`` and the report listed a series' versions by their database ids (2 and 3 for the first run's
    two commits, 4 for the second run's first): each execution's versions of a name count from 1."""
    cmf = Cmf(pipeline_name="p", store=store_dir)
    for name, commits in (("A", 2), ("B", 1)):
        cmf.create_execution("train", execution_name=name)
        for step in range(commits):
            cmf.log_metric("m", {"step": step, "v": float(step)})
            cmf.commit_metrics("m")
    cmf.close()
    sweep = Sweep(store_dir, metrics_name="m")
    files = sweep.lineage.files_of([e.id for e, _ in sweep.executions()])
    versions = {
        sweep.key(e): [(f["version"], f["rows"]) for f in files[e.id] if f["type"] == STEP_METRICS_TYPE]
        for e, _ in sweep.executions()
    }
    assert versions == {"A": [(1, 1), (2, 2)], "B": [(1, 1)]}


@given(st.text(max_size=20) | st.sampled_from(["ray_cmf:b64:", "ray_cmf:b64:eA==", "C:\\x", "é"]))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_text_property_reads_back_as_it_was(tmp_path: Path, text: str) -> None:
    """Texts are held as they are, except where a server cannot take them (see test_team_store) or where one
    begins as an encoded text does: "ray_cmf:b64:eA==" must not read back as "x"."""
    store = tmp_path / f"store-{hashlib.md5(text.encode()).hexdigest()}"
    with Cmf(pipeline_name="p", store=store) as cmf:
        cmf.create_execution("train", {"text": text}, execution_name="run")
        cmf.set_tags(t=text)
        cmf.log_metric("s", {"step": 0})
        cmf.commit_metrics("s")
    sweep = Sweep(store, metrics_name="s")
    assert sweep.config("run") == {"text": text}
    assert sweep.trials().loc[0, "tag/t"] == text


def test_a_store_with_its_own_database_refuses_another(tmp_path: Path) -> None:
    """Naming another SQLite file for a store that holds its lineage in its own re-pointed it without a word;
    every reader of the store directory then lost its runs. It is refused, naming both."""
    store = tmp_path / "store"
    with Cmf(pipeline_name="p", store=store) as cmf:
        cmf.create_execution("train", execution_name="run")
        cmf.log_metric("s", {"step": 0})
        cmf.commit_metrics("s")
    with pytest.raises(StoreError, match=r"keeps its lineage in .*mlmd\.sqlite, not in .*other\.sqlite"):
        Cmf(filepath=str(tmp_path / "other.sqlite"), pipeline_name="p", store=store).create_execution("x")
    assert Sweep(store, metrics_name="s").trials()["trial_id"].tolist() == ["run"]


def test_execution_metrics_refuse_a_blank_key(tmp_path: Path) -> None:
    """``log_execution_metrics("fin", {"": 1})`` was kept as a column ``metrics/fin/``; ``log_metric`` refuses
    such a name, and so does this, naming it."""
    with Cmf(pipeline_name="p", store=tmp_path / "store") as cmf:
        cmf.create_execution("train", execution_name="run")
        for blank in ("", "  ", "\x85"):  # NEL: blank too
            with pytest.raises(
                InvalidNameError, match=rf"Invalid metric name {re.escape(repr(blank))}: the keys of 'fin'"
            ):
                cmf.log_execution_metrics("fin", {"acc": 0.5, blank: 1})
        cmf.log_execution_metrics("fin", {"acc": 0.5})
    assert Sweep(tmp_path / "store").execution_metrics("run") == {"fin/acc": 0.5}
