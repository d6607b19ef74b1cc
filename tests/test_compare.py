"""Sweep API, plots and the ray-cmf CLI against stores made by real sweeps (and by Cmf alone)."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as pads
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_cmf import Cmf, InvalidArgumentError, RayCmfError, Store, StoreError, Sweep, lineage
from ray_cmf.cli import main
from ray_cmf.versioning import cache_path, file_md5
from tests._values import floats, same
from tests.test_tune import GOOD_LRS, RESULTS

pytestmark = pytest.mark.integration


@pytest.fixture
def store_copy(sweep: dict[str, Any], tmp_path: Path) -> Path:
    """A private copy of the session's sweep store, safe to tamper with."""
    target = tmp_path / "store"
    shutil.copytree(sweep["store"], target)
    return target


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_trials_table(sweep: dict[str, Any]) -> None:
    table = Sweep(sweep["store"], pipeline="sweep").trials(["loss"], verify=True)
    assert len(table) == 6 and table["trial_id"].is_unique
    done = table[table["status"] == "COMPLETE"].set_index("config/lr")
    for lr in GOOD_LRS:
        assert done.loc[lr, "loss_best"] == pytest.approx(lr / RESULTS)
        assert done.loc[lr, "loss_final"] == pytest.approx(lr / RESULTS)
        assert done.loc[lr, "steps"] == RESULTS and done.loc[lr, "verified"] is True
    assert {"md5", "url", "config/nested.depth"} <= set(table.columns)


def test_steps_reads_only_the_requested_columns(sweep: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import ray_cmf.compare

    asked: list[list[str]] = []

    class Spy:
        """Wraps the real pyarrow dataset and records what each scan projects."""

        def __init__(self, dataset: Any) -> None:
            self.schema = dataset.schema
            self._dataset = dataset

        def scanner(self, columns: Any = None, **kwargs: Any) -> Any:
            asked.append(list(columns))
            return self._dataset.scanner(columns=columns, **kwargs)

    spy_module = types.SimpleNamespace(dataset=lambda *a, **k: Spy(pads.dataset(*a, **k)))
    monkeypatch.setattr(ray_cmf.compare, "pads", spy_module)
    steps = Sweep(sweep["store"], pipeline="sweep").steps(metrics=["loss"])
    assert list(steps.columns) == ["trial_id", "step", "loss"]
    assert len(asked) == 1 and set(asked[0]) <= {"training_iteration", "loss", "attempt"}
    assert len(steps) == 4 * RESULTS + 3


def test_trial_table_from_footers_matches_a_full_scan(sweep: dict[str, Any]) -> None:
    s = Sweep(sweep["store"], pipeline="sweep")
    every = {f.trial_id for f in s.files()}
    footers = s._summary_from_footers(["loss", "nested/a"], {"loss": "min", "nested/a": "max"}, every)
    scan = s._summary_from_scan(["loss", "nested/a"], {"loss": "min", "nested/a": "max"}, every)
    assert footers is not None
    assert footers.sort_index().equals(scan.sort_index().astype(footers.dtypes.to_dict()))


def test_best_and_diff(sweep: dict[str, Any]) -> None:
    s = Sweep(sweep["store"], pipeline="sweep")
    best = s.best("loss", mode="min", n=2)
    assert best["config/lr"].tolist() == [0.1, 0.2]
    assert s.best("loss", mode="max", n=1)["config/lr"].iloc[0] == 0.5
    a, b = best["trial_id"]
    diff = s.diff(a, b)
    assert "config/lr" in diff.index and "config/nested.depth" not in diff.index
    assert diff.loc["top_rank"].tolist() == [1, 2]  # both in the top 2 (in_top_n alike): their places differ
    assert "in_top_n" not in diff.index
    last = s.best("loss", mode="max", n=1)["trial_id"].iloc[0]
    assert s.diff(a, last).loc["in_top_n"].tolist() == [True, False]
    with pytest.raises(RayCmfError, match="Unknown trial"):
        s.diff(a, "nope")
    with pytest.raises(RayCmfError, match="Unknown metric") as unknown:
        s.best("no_such_metric")
    assert "hold" not in str(unknown.value)
    with pytest.raises(RayCmfError, match=r"\['fine'\] holds them: name it") as elsewhere:  # a trial's get_cmf() series
        s.best("sub", also=["it"])
    assert "Unknown metric(s) ['sub', 'it'] in series 'tune_results'" in str(elsewhere.value)


def test_diff_tells_a_nan_config_from_a_missing_key(tmp_path: Path) -> None:
    """A config of NaN is a value (``--where 'config/eps == nan'`` finds it, ``== null`` does not): ``diff``
    of a trial with ``eps=nan`` against one without ``eps`` said nothing differs. So is an execution metric
    of NaN (``diff`` hid ``metrics/final/x``, NaN against none: a new user). A summary's NaN and a metric
    never logged still read alike, as the README says."""
    for name, config, rows in (("a", {"eps": math.nan, "lr": 0.1}, [1.0]), ("b", {"lr": 0.1}, [1.0])):
        with Cmf(pipeline_name="p", store=tmp_path / "store") as cmf:
            cmf.create_execution("trial", config, execution_name=name)
            for step, loss in enumerate(rows):
                cmf.log_metric("s", {"step": step, "loss": loss, **({"extra": math.nan} if name == "a" else {})})
            cmf.commit_metrics("s")
            cmf.log_execution_metrics("final", {"x": math.nan, "y": 1.0} if name == "a" else {"y": 1.0})
    diff = Sweep(tmp_path / "store", metrics_name="s").diff("a", "b")
    assert (
        "config/eps" in diff.index and math.isnan(diff.loc["config/eps", "a"]) and diff.loc["config/eps", "b"] is None
    )
    assert math.isnan(diff.loc["metrics/final/x", "a"]) and diff.loc["metrics/final/x", "b"] is None
    assert "metrics/final/y" not in diff.index
    assert "extra_best" not in diff.index  # a NaN summary and no summary read alike


def test_plot_params_draws_any_number_of_config_keys(tmp_path: Path) -> None:
    """With 4, 5, 7, ... numeric config keys varying, ``plot_params`` raised ``zip() argument 2 is shorter than
    argument 1``: its grid of 3 columns has panels to spare, which it zipped strictly with the keys (a new user)."""
    for keys in range(1, 8):
        store = tmp_path / f"store{keys}"
        for run in range(3):
            with Cmf(pipeline_name="p", store=store) as cmf:
                cmf.create_execution(
                    "trial", {f"k{i}": run * (i + 1) + 0.5 for i in range(keys)}, execution_name=f"r{run}"
                )
                cmf.log_metric("s", {"step": 0, "loss": 1.0 / (run + 1)})
                cmf.commit_metrics("s")
        path = Sweep(store, metrics_name="s").plot_params("loss", tmp_path / f"params{keys}.png")
        assert Path(path).read_bytes().startswith(b"\x89PNG"), keys
    with Cmf(pipeline_name="p", store=store) as cmf:  # a trial without the metric is no point: said, not counted
        cmf.create_execution("trial", {f"k{i}": 9.5 for i in range(keys)}, execution_name="none")
        cmf.log_metric("s", {"step": 0, "other": 1.0})
        cmf.commit_metrics("s")
    svg = Sweep(store, metrics_name="s").plot_params("loss", tmp_path / "params.svg").read_text()
    assert "(3 trials, 1 without a finite best loss)" in svg


def test_the_metrics_offered_to_rank_by_are_those_that_can_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked for a metric to rank by, ``compare`` offered a bool and a text column, then refused each of them as
    holding no numbers (a new user)."""
    with Cmf(pipeline_name="p", store=tmp_path / "store") as cmf:
        cmf.create_execution("trial", {"lr": 0.1}, execution_name="a")
        cmf.log_metric("s", {"step": 0, "loss": 0.5, "flag": True, "optimizer": "adam", "big": 2**40})
        cmf.commit_metrics("s")
    code, _, err = _cli(capsys, "compare", "--store", str(tmp_path / "store"), "--pipeline", "p", "--metrics-name", "s")
    assert code == 2 and "they are ['big', 'loss']" in err, err
    code, _, err = _cli(
        capsys,
        "compare",
        "--store",
        str(tmp_path / "store"),
        "--pipeline",
        "p",
        "--metrics-name",
        "s",
        "--metric",
        "big",
    )
    assert code == 0, err


def test_plots_are_written(sweep: dict[str, Any], tmp_path: Path) -> None:
    s = Sweep(sweep["store"], pipeline="sweep")
    for path in (
        s.plot_curves("loss", tmp_path / "c.png", color_by="lr", top=3),
        s.plot_params("loss", tmp_path / "p.png"),
    ):
        data = Path(path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(RayCmfError, match=r"color_by='nope'"):
        s.plot_curves("loss", tmp_path / "x.png", color_by="nope")


def test_compare_shows_every_metric_it_is_given(sweep: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``--metric`` is repeatable, ranked by the first: compare showed the first metric's columns only (a new
    user's ``--metric val_loss --metric acc``), where ``trials`` shows each."""
    store = str(sweep["store"])
    argv = ("--store", store, "--metric", "loss", "--metric", "lr_echo", "--json")
    code, out, _ = _cli(capsys, "compare", *argv, "--top", "2")
    rows = json.loads(out)
    assert code == 0 and [r["config/lr"] for r in rows] == [0.1, 0.2]
    assert [(r["loss_best"], r["lr_echo_best"], r["lr_echo_final"]) for r in rows] == [
        (0.1 / RESULTS, 0.1, 0.1),
        (0.2 / RESULTS, 0.2, 0.2),
    ]
    code, out, _ = _cli(capsys, "trials", *argv)
    assert code == 0 and all("lr_echo_best" in r for r in json.loads(out))
    code, _, err = _cli(capsys, "compare", "--store", store, "--metric", "lr_echo", "--json")
    assert code == 0 and "no logger recorded which way 'lr_echo' is best: ranked lowest first" in err
    code, _, err = _cli(capsys, "compare", "--store", store, "--metric", "loss", "--json")  # the logger's metric
    assert code == 0 and "recorded which way" not in err


def test_cli_json_and_exit_codes(sweep: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = str(sweep["store"])
    code, out, _ = _cli(capsys, "compare", "--store", store, "--metric", "loss", "--top", "2", "--json")
    assert code == 0 and [r["config/lr"] for r in json.loads(out)] == [0.1, 0.2]
    code, out, _ = _cli(capsys, "trials", "--store", store, "--metric", "loss", "--json")
    assert code == 0 and len(json.loads(out)) == 6
    trial = json.loads(out)[0]["trial_id"]
    code, out, _ = _cli(capsys, "show", trial, "--store", store, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["trial_id"] == trial and shown["files"] and "lr" in shown["config"]
    code, out, _ = _cli(capsys, "pipelines", "--store", store, "--json")
    assert code == 0 and [(r["pipeline"], r["stages"], r["trials"]) for r in json.loads(out)] == [
        ("sweep", ["stage1"], 6)
    ]
    code, out, _ = _cli(capsys, "plot", "--store", store, "--metric", "loss", "-o", str(tmp_path / "c.png"), "--json")
    assert code == 0 and Path(json.loads(out)[0]["plot"]).stat().st_size > 0
    for fmt in ("csv", "parquet"):
        code, out, _ = _cli(
            capsys, "export", "--store", store, "--format", fmt, "-o", str(tmp_path / f"s.{fmt}"), "--json"
        )
        assert code == 0 and json.loads(out)[0]["rows"] == 4 * RESULTS + 3
    code, _, err = _cli(capsys, "show", "no-such-trial", "--store", store)
    assert code == 2 and "no-such-trial" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _cli(capsys, "trials", "--store", str(tmp_path / "empty"))
    assert code == 2 and "No MLMD database" in err  # a directory, but no store in it (yet)
    code, ranked, _ = _cli(capsys, "compare", "--store", store, "--top", "2", "--json")  # the logger's metric
    assert code == 0 and json.loads(ranked) == json.loads(
        _cli(capsys, "compare", "--store", store, "--metric", "loss", "--top", "2", "--json")[1]
    )
    with pytest.raises(SystemExit) as usage:
        main(["compare", "--store", store, "--top", "0"])
    assert usage.value.code == 2


def test_console_script_runs(sweep: dict[str, Any]) -> None:
    exe = Path(sys.executable).with_name("ray-cmf")
    result = subprocess.run(
        [str(exe), "trials", "--store", str(sweep["store"]), "--metric", "loss"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "loss_best" in result.stdout


def test_export_to_stdout_pipes_the_steps(sweep: dict[str, Any], tmp_path: Path) -> None:
    """``ray-cmf export --format csv -o -`` wrote a file named ``-``; ``-`` is the standard output, as for
    most tools, and it holds the steps only (the summary goes to stderr)."""
    import io

    exe = str(Path(sys.executable).with_name("ray-cmf"))
    args = [exe, "export", "--store", str(sweep["store"]), "--metric", "loss", "-o", "-"]
    csv = subprocess.run([*args, "--format", "csv"], capture_output=True, text=True, cwd=tmp_path)
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert csv.returncode == 0 and len(frame) == 4 * RESULTS + 3 and "loss" in frame.columns, csv.stderr
    parquet = subprocess.run([*args, "--format", "parquet"], capture_output=True, cwd=tmp_path)
    assert parquet.returncode == 0 and len(pd.read_parquet(io.BytesIO(parquet.stdout))) == len(frame)
    assert not (tmp_path / "-").exists()
    bare = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path)  # it asked for --format: CSV now
    assert bare.returncode == 0 and bare.stdout == csv.stdout


def test_verify_detects_tampered_and_deleted_files(store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "verify", "--store", str(store_copy), "--json")
    findings = json.loads(out)
    # each trial's model file, written over at every result, reads ok as left, superseded as first recorded
    assert code == 0 and {f["status"] for f in findings} <= {"ok", "superseded"}
    parquet = [f["url"] for f in findings if "tune_results" in f["url"]]
    tampered, deleted = store_copy / parquet[0], store_copy / parquet[1]
    tampered.write_bytes(tampered.read_bytes()[:-10] + b"0123456789")
    deleted.unlink()
    code, out, _ = _cli(capsys, "verify", "--store", str(store_copy), "--json")
    status = {f["url"]: f["status"] for f in json.loads(out)}
    assert code == 1
    assert status[parquet[0]] == "modified" and status[parquet[1]] == "missing"
    table = Sweep(store_copy, pipeline="sweep").trials(["loss"], verify=True)
    assert table["verified"].tolist().count(False) == 0  # reads take the logged content, from the DVC cache
    md5 = next(f["md5"] for f in findings if f["url"] == parquet[2])
    cached = cache_path(store_copy, md5)
    cached.chmod(0o644)  # DVC keeps its objects read-only
    cached.write_bytes(cached.read_bytes()[:-10] + b"0123456789")
    table = Sweep(store_copy, pipeline="sweep").trials(["loss"], verify=True)
    assert table["verified"].tolist().count(False) == 1  # what is read no longer matches its md5
    # the deleted one is read from the DVC cache by its md5 (the same content), and verifies there
    [gone] = table.loc[table["url"].str.endswith(Path(parquet[1]).name, na=False), "trial_id"]
    steps = Sweep(store_copy, pipeline="sweep").steps(["loss"])
    assert len(steps[steps["trial_id"] == gone]) > 0


def test_push_to_a_local_remote(store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    remote = tmp_path / "remote"
    code, _out, err = _cli(capsys, "push", "--store", str(store_copy), "--add-remote", str(remote), "--json")
    assert code == 0, err
    assert len([p for p in remote.rglob("*") if p.is_file()]) >= 9  # every committed Parquet file
    for missing in (tmp_path / "mistyped", tmp_path / "empty"):  # it made a store there and said "up to date"
        if missing.name == "empty":
            missing.mkdir()
        code, _out, err = _cli(capsys, "push", "--store", str(missing), "--add-remote", str(tmp_path / "r2"))
        assert code == 2 and ("is not a store" in err or "No MLMD database" in err), err
        code, _out, err = _cli(capsys, "pull", "--store", str(missing))  # it said the store has no remote
        assert code == 2 and ("is not a store" in err or "No MLMD database" in err), err
        assert not (tmp_path / "r2").exists() and not (missing / ".dvc").exists()


def test_a_push_to_a_remote_that_cannot_be_reached_keeps_the_remote_there_was(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``push --add-remote s3://... --endpoint-url`` that failed ("Unable to locate credentials") had made that
    remote the store's all the same, in ``ray_cmf.json`` and DVC's config, in place of the one that worked (a
    new user). A remote is now tried before it is set."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws
    working = tmp_path / "remote"
    assert _cli(capsys, "push", "--store", str(store_copy), "--add-remote", str(working))[0] == 0
    configs = [(store_copy / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")]
    code, _, err = _cli(
        capsys,
        "push",
        "--store",
        str(store_copy),
        "--add-remote",
        "s3://nowhere/x",
        "--endpoint-url",
        "http://127.0.0.1:1",
    )
    assert code == 2 and "s3://nowhere/x" in err, err
    assert [(store_copy / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")] == configs
    code, _, err = _cli(capsys, "push", "--store", str(store_copy), "--endpoint-url", "http://127.0.0.1:1")
    assert code == 2 and "--add-remote" in err, err  # it was ignored without a word
    # a directory with an endpoint: DVC's "extra keys not allowed" (a new user)
    code, _, err = _cli(
        capsys, "push", "--store", str(store_copy), "--add-remote", str(tmp_path / "r"), "--endpoint-url", "http://x"
    )
    assert code == 2 and "is for an s3:// remote" in err and "extra keys" not in err, err
    assert [(store_copy / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")] == configs


def test_a_remote_that_cannot_hold_the_files_is_refused_and_the_one_there_was_kept(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a new user: ``--add-remote file:///dir`` said "4 files pushed" and put them inside the store (under
    ``file:/dir``); a remote under a regular file failed with DVC's own error yet replaced the remote that worked;
    the store's own directory was taken as its remote; ``--add-remote ""`` was no remote at all; a push without
    a remote passed DVC's advice on (``dvc remote add -d``)."""
    code, _, err = _cli(capsys, "push", "--store", str(store_copy))
    assert code == 2 and "has no remote; set one with `ray-cmf push --add-remote URL`" in err, err
    working = tmp_path / "remote"
    assert _cli(capsys, "push", "--store", str(store_copy), "--add-remote", str(working))[0] == 0
    configs = [(store_copy / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")]
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    (tmp_path / "link").symlink_to(store_copy)  # inside the store through a link
    refused = {
        str(tmp_path / "link" / "backup"): "inside the store",
        "file://": "an s3://BUCKET/PREFIX URL or a directory",
        "file://host/x": "an s3://BUCKET/PREFIX URL or a directory",
        "s3://": "an s3://BUCKET/PREFIX URL or a directory",
        str(a_file): f"{a_file} is a file, not a directory",
        str(a_file / "sub"): f"{a_file} is a file, not a directory",
        str(store_copy / "backup"): "inside the store",
        str(store_copy): "inside the store",
        "gs://bucket/x": "an s3://BUCKET/PREFIX URL or a directory",
        "": "an s3://BUCKET/PREFIX URL or a directory",
    }
    for url, says in refused.items():
        code, _, err = _cli(capsys, "push", "--store", str(store_copy), "--add-remote", url)
        assert code == 2 and says in err and "Hit us up" not in err, (url, err)
        assert [(store_copy / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")] == configs, url
    for url in ("file://{}", "file:{}", "file://localhost{}"):  # every form of a file: URL
        elsewhere = tmp_path / f"elsewhere{len(url)}"
        code, out, err = _cli(
            capsys, "push", "--store", str(store_copy), "--add-remote", url.format(elsewhere), "--json"
        )
        assert code == 0, err
        assert json.loads(out)[0]["remote"] == str(elsewhere) and list(elsewhere.rglob("*")), (url, out)
    assert not (store_copy / "file:").exists() and not list(Path.cwd().glob("localhost"))


def test_pull_brings_back_a_lost_cache_as_well_as_lost_files(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the DVC cache and ``artifacts/`` lost, ``pull`` restored the series files, but ``verify`` then still
    failed: the package lists (``environments/``), still there, had no cache object, and nothing said how to
    get it back (a new user). ``pull`` fetches the cache object of a file that is there too."""
    assert _cli(capsys, "push", "--store", str(store_copy), "--add-remote", str(tmp_path / "remote"))[0] == 0
    shutil.rmtree(store_copy / ".dvc" / "cache")
    shutil.rmtree(store_copy / "artifacts")
    code, _, err = _cli(capsys, "pull", "--store", str(store_copy))
    assert code == 0, err
    code, out, _ = _cli(capsys, "verify", "--store", str(store_copy), "--json")
    assert code == 0, [f for f in json.loads(out) if f["status"] not in ("ok", "superseded")]


def test_a_colleagues_store_made_by_pull_is_a_store_like_any(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A colleague who copies ``mlmd.sqlite`` and ``ray_cmf.json`` and runs ``pull`` got the files without their
    ``.dvc`` files and no DVC remote: ``dvc status`` tracked nothing, ``push`` failed ("no remote specified")
    and ``push --add-remote`` pushed nothing. A relative ``--add-remote`` was recorded as given but set in DVC
    relative to the store (``verify --remote`` then failed), and a removed ``.dvc`` file read ``ok``."""
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, "push", "--store", str(store_copy), "--add-remote", "remote")  # relative to here
    assert code == 0, err
    assert json.loads((store_copy / "ray_cmf.json").read_text())["remote"]["url"] == str(tmp_path / "remote")
    code, out, err = _cli(capsys, "verify", "--store", str(store_copy), "--remote", "--json")
    assert code == 0, [f for f in json.loads(out) if f["status"] not in ("ok", "superseded")]
    colleague = tmp_path / "colleague"
    colleague.mkdir()
    for name in ("mlmd.sqlite", "ray_cmf.json"):
        shutil.copy(store_copy / name, colleague / name)
    code, _, err = _cli(capsys, "pull", "--store", str(colleague))
    assert code == 0, err
    pulled = sorted(p.relative_to(colleague) for p in colleague.rglob("*.parquet"))
    assert (
        pulled and sorted(p.relative_to(colleague).with_suffix("") for p in colleague.rglob("*.parquet.dvc")) == pulled
    )
    dvc = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=colleague, capture_output=True, text=True)
    assert dvc.returncode == 0 and "up to date" in dvc.stdout, dvc.stdout + dvc.stderr
    code, out, _ = _cli(capsys, "verify", "--store", str(colleague), "--json")
    assert code == 0 and {f["status"] for f in json.loads(out)} <= {"ok", "superseded"}
    code, _, err = _cli(capsys, "push", "--store", str(colleague))  # to the remote its ray_cmf.json names
    assert code == 0, err
    again = tmp_path / "second-remote"
    assert _cli(capsys, "push", "--store", str(colleague), "--add-remote", str(again))[0] == 0
    assert len([p for p in again.rglob("*") if p.is_file()]) >= len(pulled)
    config = (colleague / ".dvc" / "config").read_bytes()
    code, _, err = _cli(capsys, "push", "--store", str(colleague), "--add-remote", str(tmp_path / "remote é"))
    assert code == 2 and "other than ASCII characters" in err  # DVC 3 fails on it, and emptied .dvc/config
    assert (colleague / ".dvc" / "config").read_bytes() == config
    next(colleague.rglob("*.parquet.dvc")).unlink()
    code, out, _ = _cli(capsys, "verify", "--store", str(colleague), "--json")
    assert code == 1 and [f["status"] for f in json.loads(out)].count("dvc-missing") == 1


def test_a_store_from_cmf_alone_is_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmf = Cmf(pipeline_name="plain", store=tmp_path / "store")
    cmf.create_execution("Train", {"lr": 0.5})
    for step in range(10):
        cmf.log_metric("train", {"loss": 1.0 / (step + 1)})
    cmf.commit_metrics("train")
    sweep = Sweep(tmp_path / "store", metrics_name="train")
    table = sweep.trials()
    assert len(table) == 1 and table["loss_best"].iloc[0] == pytest.approx(0.1) and table["steps"].iloc[0] == 10
    assert sweep.steps(["loss"])["step"].tolist() == list(range(1, 11))
    code, out, _ = _cli(capsys, "trials", "--store", str(tmp_path / "store"), "--metrics-name", "train", "--json")
    assert code == 0 and json.loads(out)[0]["steps"] == 10
    assert json.loads(out)[0]["config/lr"] == 0.5  # create_execution's properties are the run's config
    code, _, err = _cli(
        capsys, "trials", "--store", str(tmp_path / "store"), "--metrics-name", "train", "--status", "done"
    )
    assert code == 2 and "--status done: no such status" in err and "COMPLETE" in err
    code, out, _ = _cli(
        capsys, "trials", "--store", str(tmp_path / "store"), "--metrics-name", "train", "--status", "FAILED"
    )
    assert code == 0 and "none" in out  # an empty answer says so
    with pytest.raises(StoreError, match="No pipeline"):
        Sweep(Store(tmp_path / "store"), pipeline="missing")


def test_trials_with_identical_series_each_get_their_rows(tmp_path: Path) -> None:
    """Identical content is one file and one artifact, linked to each trial; each trial still shows it."""
    for name in ("a", "b", "c"):
        cmf = Cmf(pipeline_name="same", store=tmp_path / "store")
        cmf.create_execution("trial", execution_name=name)
        for step in range(5):
            cmf.log_metric("s", {"step": step, "loss": 1.0 / (step + 1)})
        cmf.commit_metrics("s")
    sweep = Sweep(tmp_path / "store", metrics_name="s")
    assert len({f.path for f in sweep.files()}) == 1
    steps = sweep.steps()
    assert steps.groupby("trial_id", observed=True).size().to_dict() == {"a": 5, "b": 5, "c": 5}
    assert sweep.trials()["steps"].tolist() == [5, 5, 5]


_EXECUTION_VALUES = st.one_of(
    floats,
    st.integers(-(2**80), 2**80),  # beyond int64 too: kept exactly, not as text
    st.booleans(),
    st.text(max_size=6) | st.sampled_from(["NaN", "Infinity", "-Infinity", "null", "1"]),  # text stays text
    st.none(),
    st.lists(st.integers(-5, 5), max_size=3),  # a list comes back a list (the table's cell: its JSON text)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(  # a blank key ("\x85", " ") is refused, naming it: see test_execution_metrics_refuse_a_blank_key
    values=st.dictionaries(
        st.text(min_size=1, max_size=5).filter(lambda k: "." not in k and k.strip()), _EXECUTION_VALUES
    )
)
@example(values={"nan": math.nan, "text": "NaN", "none": None, "big": 2**70, "metrics_name": "mine", "größe": -0.0})
def test_execution_metrics_read_back_as_logged(
    tmp_path_factory: pytest.TempPathFactory, values: dict[str, Any]
) -> None:
    """What ``log_execution_metrics`` recorded read back as it was logged: the text "NaN" came back as a float
    NaN, an int beyond int64 as text, None not at all, and a key named ``metrics_name`` as the series name."""
    store = tmp_path_factory.mktemp("execution_metrics") / "store"
    cmf = Cmf(pipeline_name="final", store=store)
    cmf.create_execution("trial", execution_name="t")
    cmf.log_metric("s", {"step": 1})
    cmf.commit_metrics("s")
    cmf.log_execution_metrics("test", values)
    cmf.close()
    read = Sweep(store, metrics_name="s").execution_metrics("t")
    assert sorted(read) == sorted(f"test/{k}" for k in values)
    for key, value in values.items():
        got = read[f"test/{key}"]
        nan = isinstance(value, float) and math.isnan(value)  # a NaN's sign and payload are not kept: JSON has one
        assert (isinstance(got, float) and math.isnan(got)) if nan else same(value, got), (key, value, got)


def test_execution_metrics_are_columns_of_the_trial_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``log_execution_metrics("test", {"acc": 0.9})`` (cmflib's final metrics of a run) was recorded in MLMD
    and shown nowhere: not by ``trials``, ``compare`` or ``--sort``. Each is now a ``metrics/<name>/<key>``
    column of the trial's row, the latest logged under a name winning, NaN kept."""
    logged = {
        "a": [{"acc": 0.7}, {"acc": 0.9, "loss": math.nan}],  # logged twice: the second is the trial's
        "b": [{"acc": 0.8, "split": "held-out"}],
        "c": [],
    }
    for name, values in logged.items():
        cmf = Cmf(pipeline_name="final", store=tmp_path / "store")
        cmf.create_execution("trial", execution_name=name)
        cmf.log_metric("s", {"step": 1, "loss": 1.0})
        cmf.commit_metrics("s")
        for one in values:
            cmf.log_execution_metrics("test", one)
        cmf.close()
    sweep = Sweep(tmp_path / "store", metrics_name="s")
    table = sweep.trials(sort="metrics/test/acc").set_index("trial_id")
    assert table.index.tolist() == ["b", "a", "c"]  # ascending, blanks last: it is not a _best column
    assert table["metrics/test/acc"].tolist()[:2] == [0.8, 0.9] and pd.isna(table.loc["c", "metrics/test/acc"])
    assert math.isnan(table.loc["a", "metrics/test/loss"]) and table.loc["b", "metrics/test/split"] == "held-out"
    kept = sweep.trials(where="`metrics/test/acc` > 0.85")["trial_id"].tolist()
    assert kept == ["a"]
    store = str(tmp_path / "store")
    code, out, _ = _cli(capsys, "trials", "--store", store, "--metrics-name", "s", "--sort", "metrics/test/acc")
    assert code == 0 and "metrics/test/acc" in out and "0.9" in out and "held-out" in out, out
    code, out, _ = _cli(capsys, "diff", "a", "b", "--store", store, "--metrics-name", "s", "--json")
    differs = {row["field"]: (row["a"], row["b"]) for row in json.loads(out)}
    assert differs["metrics/test/acc"] == (0.9, 0.8) and differs["metrics/test/split"] == (None, "held-out")
    code, out, _ = _cli(capsys, "show", "b", "--store", store, "--metrics-name", "s", "--json")
    assert code == 0 and json.loads(out)["execution_metrics"] == {"test/acc": 0.8, "test/split": "held-out"}
    code, _, _ = _cli(capsys, "report", "--store", store, "--metrics-name", "s", "-o", str(tmp_path / "r.html"))
    assert code == 0 and "<th>metrics/test/acc</th>" in (tmp_path / "r.html").read_text()
    executions = {e.id for e, _ in sweep.executions()}
    by_events = sweep.lineage.execution_metrics(executions)  # a few executions: read through their events
    monkeypatch.setattr(lineage, "_FEW_EXECUTIONS", 0)  # a sweep's: every Metrics artifact, by type
    assert sweep.lineage.execution_metrics(executions) == by_events
    assert sweep.lineage.execution_metrics({min(executions)}) == {min(executions): by_events[min(executions)]}


def test_text_tables_never_show_two_different_values_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``diff`` of lr 0.1 against 0.10000001 printed "what differs between a and b" over two cells that both
    read 0.1, and ``trials`` showed the two trials' lr alike: a table rounded every float to 6 digits. A value
    now gets the digits that tell it apart from the other values of its column and of its row."""
    for name, lr in (("a", 0.1), ("b", 0.10000001), ("c", 0.2), ("s", "0.1")):
        with Cmf(pipeline_name="p", store=tmp_path / "store") as cmf:
            cmf.create_execution("trial", {"lr": lr, "wd": 1 / 3}, execution_name=name)
            cmf.log_metric("s", {"step": 0, "loss": 1.0 + float(lr)})
            cmf.commit_metrics("s")
    store = str(tmp_path / "store")
    code, out, _ = _cli(capsys, "diff", "a", "b", "--store", store, "--metrics-name", "s")
    cells = {line.split("│")[1].strip(): line.split("│")[2:4] for line in out.splitlines() if "│" in line}
    assert code == 0 and [c.strip() for c in cells["config/lr"]] == ["0.1", "0.10000001"], out
    assert [c.strip() for c in cells["loss_best"]] == ["1.1", "1.10000001"], out
    code, out, _ = _cli(capsys, "trials", "--store", store, "--metrics-name", "s")
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in out.splitlines()
        if "│" in line
    }
    assert code == 0 and "0.10000001" in rows["b"] and "0.1" in rows["a"] and "0.2" in rows["c"], out
    assert "0.333333" in rows["a"] and "0.2" in rows["c"], out  # where nothing needs more digits, 6 as before
    assert rows["s"][1] == '"0.1"' and rows["a"][1] == "0.1", out  # the text "0.1" is no number 0.1
    code, out, _ = _cli(capsys, "diff", "a", "s", "--store", store, "--metrics-name", "s")
    cells = {line.split("│")[1].strip(): line.split("│")[2:4] for line in out.splitlines() if "│" in line}
    assert [c.strip() for c in cells["config/lr"]] == ["0.1", '"0.1"'], out


def test_text_tables_show_text_that_reads_as_rich_markup_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config of ``[None]`` showed as an empty cell in ``trials`` and ``diff``, and a tag ``[bold]x[/bold] [n]``
    as ``x``: rich read each ``[word]`` of a cell as a style (a new user)."""
    store = tmp_path / "store"
    for name, value in (("a", [None]), ("b", "[red]")):
        with Cmf(pipeline_name="p", store=store) as cmf:
            cmf.create_execution("trial", {"[k]": value}, execution_name=name)
            cmf.log_metric("s", {"step": 0, "loss": 1.0})
            cmf.commit_metrics("s")
    Sweep(store, "p", metrics_name="s").tag("a", lbl="[bold]x[/bold] [n]")
    Sweep(store, "p", metrics_name="s").note("a", "see [link] and [red]")
    code, out, _ = _cli(capsys, "trials", "--store", str(store), "--metrics-name", "s")
    lines = [line.replace("┃", "│") for line in out.splitlines() if "│" in line or "┃" in line]
    header, *rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert code == 0 and (table["a"]["config/[k]"], table["b"]["config/[k]"]) == ("[null]", "[red]"), out
    assert (table["a"]["tag/lbl"], table["a"]["note"]) == ("[bold]x[/bold] [n]", "see [link] and [red]"), out
    code, out, _ = _cli(capsys, "diff", "a", "b", "--store", str(store), "--metrics-name", "s")
    assert code == 0 and "│ [null] " in out and '│ "[red]" ' in out, out  # diff writes text as JSON
    code, out, _ = _cli(capsys, "show", "a", "--store", str(store), "--metrics-name", "s")
    assert code == 0 and "[bold]x[/bold] [n]" in out and "see [link] and [red]" in out, out


_texts = st.sampled_from(["0.1", "1", "True", "NaN", "abc", "abc ", "", "1e-07", "ab\tcd", "ab cd", "a\nb", "a\r\nb"])


@given(
    st.lists(
        st.lists(floats | st.integers(-(2**70), 2**70) | st.booleans() | _texts, min_size=3, max_size=3),
        min_size=1,
        max_size=6,
    )
)
@example([[0.1, 0.10000001, 1], [1.0000000000000002, 1.0, 1]])
@example([[0.1, "0.1", True], ["True", 1e-07, "1e-07"]])
@example([["abc"], ["abc "], [""], [None]])
@example([["ab\tcd"], ["ab"], ["a\nb"], ["a\r\nb"]])  # a tab cut the text short, \r\n read as \n
def test_a_table_cell_tells_its_value_from_its_column_and_row(values: list[list[Any]]) -> None:
    """In a text table, two different values never read alike in one column (a float and a close one, the text
    "0.1" and the number 0.1, the text "True" and True, "a" and "a ", "" and nothing), nor two different numbers
    in one row; a float reads as short as it can (0.1 never as 0.10000000000000001)."""
    from ray_cmf.cli import _cells

    columns = [f"c{i}" for i in range(len(values[0]))]
    texts = _cells([dict(zip(columns, row, strict=True)) for row in values], columns)
    cells = [list(zip(row, shown, strict=True)) for row, shown in zip(values, texts, strict=True)]

    def told_apart(line: list[tuple[Any, str]]) -> None:
        for (a, shown_a), (b, shown_b) in itertools.combinations(line, 2):
            if shown_a == shown_b and not (isinstance(a, float) and a != a):
                assert isinstance(a, str) == isinstance(b, str) and a == b, line

    for column in zip(*cells, strict=True):
        told_apart(list(column))
        assert all(t.isprintable() for _, t in column), column  # a tab or a line break is written, not laid out
    for row in cells:
        told_apart([(v, t) for v, t in row if isinstance(v, int | float) and not isinstance(v, bool)])
    for row, shown in zip(values, texts, strict=True):
        for value, text in zip(row, shown, strict=True):
            if value is None:
                assert text == ""
            elif isinstance(value, str | bool):
                assert text in (str(value), json.dumps(value))
            elif isinstance(value, int):
                assert text == str(value)
            elif value is not None and math.isfinite(value):
                assert math.isclose(float(text), value, rel_tol=5e-6), (value, text)
                assert len(text) <= max(len(repr(value)), len(f"{value:.6g}")), (value, text)


@given(st.floats(allow_nan=False, allow_infinity=False))
@example(1e23)
@example(1e25)
def test_a_number_shown_exactly_is_its_shortest_exact_text(value: float) -> None:
    """``show`` printed 1e23 as 9.9999999999999992e+22 and 1e25 as 1.0000000000000001e+25, where ``--json``,
    ``trials`` and ``export`` wrote 1e+23 (found by a new user): exact is the shortest text that reads back."""
    from ray_cmf._cells import MOST, number_text

    text = number_text(value, MOST)
    assert float(text) == value and len(text) <= max(len(repr(value)), len(f"{value:g}"))


def test_a_numpy_float_reads_as_the_same_python_float() -> None:
    """NumPy 2 writes a float64's repr as ``np.float64(0.1)``: a cell's digits must come from the number."""
    import numpy as np

    from ray_cmf._cells import number_text

    for value in (0.1, 123.456789, 1e-7, 2.5e300, 0.30000000000000004, 0.1 + 1e-15):
        assert [number_text(np.float64(value), d) for d in (6, 17)] == [number_text(value, d) for d in (6, 17)]


def _stderr_on_a_terminal(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``ray-cmf`` with stderr on a pseudo-terminal (stdout piped); returns the run and what the terminal
    showed."""
    import os
    import pty

    exe = Path(sys.executable).with_name("ray-cmf")
    leader, follower = pty.openpty()
    with open(follower, "w") as terminal:
        result = subprocess.run([str(exe), *argv], stdout=subprocess.PIPE, stderr=terminal, text=True)
    shown = b""
    os.set_blocking(leader, False)
    while True:
        try:
            chunk = os.read(leader, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return result, shown.decode(errors="replace")


def test_long_commands_show_progress_on_a_terminal_and_stay_quiet_when_piped(store_copy: Path) -> None:
    result, shown = _stderr_on_a_terminal(["verify", "--store", str(store_copy), "--json"])
    assert result.returncode == 0 and json.loads(result.stdout)  # stdout stays clean JSON
    assert "verifying files" in shown
    piped = subprocess.run(
        [str(Path(sys.executable).with_name("ray-cmf")), "verify", "--store", str(store_copy), "--json"],
        capture_output=True,
        text=True,
    )
    assert piped.returncode == 0 and piped.stderr == ""
    result, shown = _stderr_on_a_terminal(["export", "--store", str(store_copy), "-o", str(store_copy / "x.csv")])
    assert result.returncode == 0 and "reading the steps of" in shown


def test_a_metric_of_a_series_nobody_committed_yet_says_how_to_read_it(tmp_path: Path) -> None:
    """A crashed sweep (or a running one) has rows spilled and none committed: the error says where they are."""
    cmf = Cmf(pipeline_name="crashed", store=tmp_path / "store", flush_rows=1)
    cmf.log_metric("steps", {"loss": 1.0})
    cmf.metrics["steps"].flush()  # spilled, never committed
    with pytest.raises(RayCmfError, match=r"live=True.*ray-cmf recover"):
        Sweep(tmp_path / "store", pipeline="crashed", metrics_name="steps").trials(["loss"])
    cmf.close()


def test_a_metric_of_bools_or_words_asked_for_by_name_is_said_to_have_no_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trials --metric flag`` (a bool metric) said "sort 'flag_best' is not a column", ``report --metric flag``
    said the series has no metrics at all, and ``Sweep.trials(["flag"])`` returned no column for it. Each now
    says that 'flag' holds no numbers and names the metrics that do; its curve is still drawn."""
    from tests._stores import Trial, write_trials

    def rows(flag: Any) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": 1.0 / (i + 1), "flag": flag} for i in range(3)]}

    trials = [Trial("a", {"lr": 0.1}, rows(True)), Trial("b", {"lr": 0.2}, rows(False))]
    store = write_trials(tmp_path / "store", trials)
    root = str(store.root)
    with pytest.raises(RayCmfError, match=r"\['flag'\] hold values that are not numbers.*\['loss'\]"):
        Sweep(root).trials(["flag", "loss"])
    for argv in (["trials", "--metric", "flag"], ["report", "--metric", "flag", "-o", str(tmp_path / "r.html")]):
        code, _, err = _cli(capsys, *argv, "--store", root)
        assert code == 2 and "['flag'] hold values that are not numbers" in err and "['loss']" in err, err
    assert Sweep(root).plot_curves("flag", tmp_path / "flag.png").stat().st_size > 0
    mixed = write_trials(tmp_path / "mixed", [Trial("n", {}, rows(1.5)), Trial("w", {}, rows("high"))])
    with pytest.raises(RayCmfError, match=r"\['flag'\] hold values that are not numbers \(bools or text, in some"):
        Sweep(mixed.root).trials(["flag"])


def test_the_metrics_an_error_offers_leave_out_tunes_bookkeeping(tmp_path: Path) -> None:
    """``Sweep.trials(["flag"])`` on a Tune sweep offered ``time_this_iter_s``, ``time_total_s`` ... beside
    ``loss``: the numbers Tune adds to every result, which the trial table itself hides. They are now only said
    to be there; a series that holds nothing else still offers them by name."""
    from tests._stores import Trial, write_trials

    def rows(extra: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        bookkeeping = {"time_this_iter_s": 0.1, "time_total_s": 0.3, "iterations_since_restore": 1}
        return {"": [{"training_iteration": i + 1, **bookkeeping, "flag": True, **extra} for i in range(3)]}

    tuned = write_trials(tmp_path / "tuned", [Trial("a", {"lr": 0.1}, rows({"loss": 0.5}))])
    offered = r"are \['loss'\] and Tune's bookkeeping \(time_this_iter_s, time_total_s, iterations_since_restore\)$"
    with pytest.raises(RayCmfError, match=offered):
        Sweep(tuned.root).trials(["flag"])
    bare = write_trials(tmp_path / "bare", [Trial("a", {"lr": 0.1}, rows({}))])
    with pytest.raises(RayCmfError, match=r"the numeric metrics are \[.*'time_total_s'"):
        Sweep(bare.root).trials(["flag"])


def test_the_ranked_metric_asked_of_another_series_is_unknown_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Sweep(store, metrics_name="system_metrics").trials(["loss"])`` on a sweep ranked by ``loss`` read every
    trial's ``loss_best`` as NaN, compare printed a top-5 of NaNs and ``best`` named a NaN trial (a new user's):
    a metric the logger declares passed as one not logged yet in any series. It is refused, as any metric of
    another series is, naming the series that holds it; while no series holds it, it reads as awaited as long as a
    trial runs. A finished sweep that never logged it says so."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY
    from tests._stores import Trial, write_trials

    ranked = {RANKED_BY_PROPERTY: "loss", RANKED_MODE_PROPERTY: "min"}
    results = [{"training_iteration": 1, "loss": 0.5}, {"training_iteration": 2, "loss": 0.25}]
    trials = [Trial(t, {"lr": 0.1}, {"": results}, props=ranked) for t in ("a", "b")]
    store = write_trials(tmp_path / "store", trials)
    system = [{"step": 1, "proc_rss_mb": 10.0}]
    write_trials(
        tmp_path / "store",
        [Trial(t, {"lr": 0.1}, {"": system}, props=ranked) for t in ("a", "b")],
        metrics_name="system_metrics",
    )
    root = str(store.root)
    with pytest.raises(RayCmfError, match=r"Unknown metric\(s\) \['loss'\] in series 'system_metrics'.*tune_results"):
        Sweep(root, metrics_name="system_metrics").trials(["loss"])
    with pytest.raises(RayCmfError, match=r"\['tune_results'\] holds them"):
        Sweep(root, metrics_name="system_metrics").best("loss")
    code, _, err = _cli(capsys, "compare", "--metrics-name", "system_metrics", "--metric", "loss", "--store", root)
    assert code == 2 and "['tune_results'] holds them" in err, err
    running = write_trials(tmp_path / "running", [Trial("c", {}, {"": system}, status="RUNNING", props=ranked)])
    assert math.isnan(Sweep(running.root).trials(["loss"])["loss_best"].iloc[0])  # declared, logged nowhere yet
    live = [Trial("d", {}, {"": results}, status="RUNNING", props=ranked)]  # its results spilled, not committed
    write_trials(tmp_path / "live", live)
    write_trials(
        tmp_path / "live", [Trial("d", {}, {"": system}, status="RUNNING", props=ranked)], metrics_name="system_metrics"
    )
    for read_live in (True, False):  # each read it as awaited: a NaN column
        with pytest.raises(RayCmfError, match=r"\['tune_results'\] holds them"):
            Sweep(tmp_path / "live", metrics_name="system_metrics").trials(["loss"], live=read_live)
    ended = write_trials(tmp_path / "ended", [Trial("c", {}, {"": [{"step": 1, "acc": 0.5}]}, props=ranked)])
    with pytest.raises(RayCmfError, match=r"Unknown metric\(s\) \['loss'\] in series 'tune_results'"):
        Sweep(ended.root).best("loss")  # the sweep ranks by it, and no trial ever logged it
    code, _, err = _cli(capsys, "compare", "--store", str(ended.root))
    assert code == 2 and "'sweep' ranks by 'loss', which no trial has logged in tune_results" in err, err


def test_metrics_named_like_recorded_columns_are_shown_once_as_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Metrics named ``config/lr``, ``tag/team`` or ``env/reward`` (an RL result's key): ``ray-cmf trials`` listed
    their ``_best``/``_final`` columns twice, beside the config and the tags, and pandas warned that columns
    were not unique (a new user's). Each is shown once, among the metrics; the config stays itself."""
    import warnings

    from tests._stores import Trial, write_trials

    rows = [{"training_iteration": i + 1, "config/lr": 1.0 + i, "tag/team": 2.0, "env/reward": -i} for i in range(3)]
    diverged = [  # another execution: non-finite values, and a unicode metric only it logs (a ragged column)
        {"training_iteration": 1, "config/lr": math.nan, "config/学习率": 0.5},
        {"training_iteration": 2, "config/lr": -math.inf},
        {"training_iteration": 3, "config/lr": 4.0, "config/学习率": 0.25},
    ]
    trials = [Trial("a", {"lr": 0.1}, {"": rows}), Trial("b", {"lr": 0.2, "学习率": 0.3}, {"": diverged})]
    store = write_trials(tmp_path / "store", trials)
    for every in ([], ["--all-columns"]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            code, out, err = _cli(capsys, "trials", "--store", str(store.root), "--json", *every)
            assert code == 0, err
            code, _, err = _cli(capsys, "trials", "--store", str(store.root), *every)  # no warning either
            assert code == 0, err
        row, other = sorted(json.loads(out), key=lambda r: r["trial_id"])
        assert row["config/lr"] == 0.1 and row["config/lr_best"] == 1.0 and row["config/lr_final"] == 3.0, row
        assert row["tag/team_final"] == 2.0 and row["env/reward_best"] == -2.0, row
        assert other["config/学习率"] == 0.3 and other["config/学习率_best"] == 0.25, other
        assert other["config/lr_best"] == 4.0 and other["config/lr_final"] == 4.0, other  # NaN and -inf never best
        keys = list(row)
        summaries = [k for k in keys if k.endswith(("_best", "_final"))]
        first = keys.index(summaries[0])
        assert keys[first : first + len(summaries)] == summaries and "config/lr_best" in summaries, keys  # together


def test_a_summary_named_as_a_recorded_column_keeps_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A config key ``x_best`` beside a metric ``config/x``: ``Sweep.trials`` and every table raised pandas'
    "columns overlap but no suffix specified: ['config/x_best']" (a new user's). The recorded column stays, and
    a warning says which summary it hides and how to read that metric."""
    from tests._stores import Trial, write_trials

    rows = {"": [{"training_iteration": i + 1, "loss": 0.5, "config/x": float(i)} for i in range(3)]}
    store = write_trials(tmp_path / "store", [Trial("a", {"x_best": 7, "lr": 0.1}, rows)])
    with caplog.at_level("WARNING", logger="ray_cmf"):
        [row] = Sweep(store.root).trials().to_dict(orient="records")
    assert row["config/x_best"] == 7 and row["config/x_final"] == 2.0 and row["loss_best"] == 0.5, row
    assert "'config/x_best'" in caplog.text and "steps(['config/x'])" in caplog.text, caplog.text
    code, out, err = _cli(capsys, "trials", "--store", str(store.root), "--json")
    assert code == 0 and json.loads(out)[0]["config/x_best"] == 7, err


def test_a_config_key_ending_in_best_is_config_in_groups_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config key ``lr_best``: ``report`` refused to run ("Unknown metric(s) ['config/lr']"), ``--group-by``
    averaged it as a result (``config/lr_best_mean``), and ``config except i`` grouped by the summaries of a
    metric named ``config/x`` (a new user's). A summary is a ``_best``/``_final`` pair, wherever its name starts."""
    from tests._stores import Trial, write_trials

    def rows(loss: float, x: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": loss, "config/x": x} for i in range(2)]}

    trials = [Trial(t, {"i": i, "s": "a", "lr_best": 0.5}, rows(0.1 * (i + 1), 7.0 - i)) for i, t in enumerate("abc")]
    store = write_trials(tmp_path / "store", trials)
    sweep = Sweep(store.root)
    groups = sweep.trials(group_by="config except i")
    assert groups["group"].tolist() == ["lr_best=0.5, s=a"], groups["group"]
    assert "config/lr_best_mean" not in groups and groups["loss_best_mean"].iloc[0] == pytest.approx(0.2)
    assert groups["config/x_best_mean"].iloc[0] == 6.0  # the metric named config/x is a result
    code, _, err = _cli(capsys, "report", "--store", str(store.root), "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    data = json.loads(re.search(r"let DATA = (.*);\n", (tmp_path / "r.html").read_text()).group(1))  # type: ignore[union-attr]
    axes = [d["label"] for d in data["parcoords"]["dimensions"]]  # its summaries were drawn as config axes
    assert axes == ["i", "best loss"] and [p["key"] for p in data["params"]] == ["i"], (axes, data["params"])
    hover = data["sections"][0]["traces"][0]["hovertemplate"].split("<br>")[1]
    assert hover == "i=0, lr_best=0.5, s=a", hover


def test_a_text_that_reads_as_a_number_is_quoted_whatever_the_filter_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config text "NaN" was quoted in the whole table, beside the number NaN, and shown bare where
    ``--where 'config/lr == "NaN"'`` kept that trial alone: just as the number reads (a new user's). Such a text
    is quoted in every table, whatever else its column holds; so is "null", which ``--where`` reads as no value."""
    from tests._stores import Trial, write_trials

    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    configs = {
        "t": {"lr": "NaN"},
        "u": {"lr": "0.1"},
        "v": {"lr": "true"},
        "w": {"lr": float("nan")},
        "x": {"lr": "adam"},
        "y": {"lr": "null"},
    }
    store = write_trials(tmp_path / "store", [Trial(t, config, rows) for t, config in configs.items()])
    cells = {}
    for where in (None, 'config/lr == "NaN"', 'config/lr in ["0.1", "true"]', 'config/lr == "adam"'):
        code, out, err = _cli(capsys, "trials", "--store", str(store.root), *(["--where", where] if where else []))
        assert code == 0, err
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("│")]
            if len(parts) > 3 and parts[1] in configs:
                cells.setdefault(parts[1], set()).add(parts[3])
    assert cells == {"t": {'"NaN"'}, "u": {'"0.1"'}, "v": {'"true"'}, "w": {"NaN"}, "x": {"adam"}, "y": {'"null"'}}, (
        cells
    )


def test_a_trial_id_of_digits_is_shown_bare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tune's trial ids are 5 hex digits of the clock, ``_``, and the trial's index: in about one sweep of ten
    the hex digits are all decimal, and ``98145_00000`` reads as a number to Python (``float`` takes the
    ``_``), so every table quoted every id of the sweep, and a copied id held the quotes (a new user's). No
    table shows a number with an ``_``: such a text is shown as it is."""
    from tests._stores import Trial, write_trials

    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    ids = ["98145_00000", "98145_00001"]
    store = write_trials(tmp_path / "store", [Trial(t, {"opt": "1_000"}, rows) for t in ids])
    code, out, err = _cli(capsys, "trials", "--store", str(store.root))
    assert code == 0, err
    lines = [[p.strip() for p in line.split("│")] for line in out.splitlines() if "98145" in line]
    assert [line[1] for line in lines] == ids and {line[3] for line in lines} == {"1_000"}, out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a_00000", "a_00001", "first/a_00000"]),
            st.sampled_from(["first", "x", "étape/β", "a#1"]) | st.text(min_size=1, max_size=4),
        )
    )
)
def test_every_trial_gets_a_key_of_its_own_and_a_lone_id_is_its_key(trials: list[tuple[str, str]]) -> None:
    """Keys of the trials of several stages (unicode names, ``/`` and ``#`` in them), some sharing an id (even
    one stage holding an id twice, or an id that reads like another's ``<stage>/<id>``): all differ, an id held
    once is its own key, and a Tune id (no ``/``) reads back from every key of it."""
    from ml_metadata.proto import metadata_store_pb2 as mlpb

    from ray_cmf.lineage import trial_keys, tune_id_of_key

    executions = []
    for i, (trial_id, stage) in enumerate(trials, start=1):
        execution = mlpb.Execution(id=i, name=f"{stage}/{trial_id}")
        execution.custom_properties["trial_id"].string_value = trial_id
        executions.append((execution, stage))
    keys = trial_keys(executions)
    assert sorted(keys) == list(range(1, len(trials) + 1)) and len(set(keys.values())) == len(trials)
    held = Counter(trial_id for trial_id, _ in trials)
    for i, (trial_id, stage) in enumerate(trials, start=1):
        assert keys[i] == trial_id if held[trial_id] == 1 else keys[i].startswith(f"{stage}/{trial_id}")
        if "/" not in trial_id:
            assert tune_id_of_key(keys[i]) == trial_id


def test_diff_of_trials_in_two_pipelines_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``diff`` of two runs of two pipelines said that no pipeline holds them, and listed the two pipelines,
    each holding one (found by a new user)."""
    from ray_cmf import Cmf

    store = tmp_path / "store"
    for pipeline, run in (("main", "run_main"), ("other", "run_fail")):
        with Cmf(pipeline_name=pipeline, store=str(store)) as cmf:
            cmf.create_execution("train", execution_name=run)
            cmf.log_metric("m", {"step": 0, "loss": 1.0})
    code, _, err = _cli(capsys, "diff", "--store", str(store), "run_main", "run_fail")
    assert code == 2 and "The trials are in different pipelines (run_main in main; run_fail in other)" in err
    code, _, err = _cli(capsys, "diff", "--store", str(store), "run_main", "nope")  # it blamed run_main too
    assert code == 2 and "No pipeline of the store holds trial(s) ['nope']; it has ['run_fail', 'run_main']" in err
    code, _, err = _cli(capsys, "show", "--store", str(store), "run_mian")  # it listed the pipelines only
    assert code == 2 and "holds trial(s) ['run_mian']; did you mean 'run_main'?; its pipelines:" in err


def test_an_unknown_name_is_answered_with_near_ones_or_a_few() -> None:
    """An error about a trial that does not exist names the near ones where the name looks mistyped, and
    otherwise lists what exists, at most 20 of them: it printed every key of a sweep of thousands."""
    from ray_cmf._names import what_exists

    keys = [f"a1b2c_{i:05d}" for i in range(5000)]
    assert what_exists(["run_mian"], ["run_main", "eval", "zzz"]) == "did you mean 'run_main'?"
    assert what_exists(["zzz"], keys) == f"it has {keys[:20]} and 4980 more"
    assert what_exists(["zzz"], ["b", "a"]) == "it has ['b', 'a']"


def test_plot_draws_a_series_only_metric_without_being_told_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain pipeline whose series holds one metric, no logger having declared a mode: ``plot`` asked for
    ``--metric`` all the same (a new user), though drawing every trial ranks nothing. It draws that metric;
    ``--top`` (which ranks) and ``compare`` still ask which, and a series of two metrics too."""
    for run in range(2):
        cmf = Cmf(pipeline_name="one", store=tmp_path / "store")
        cmf.create_execution("train", execution_name=f"run{run}")
        for step in range(3):
            cmf.log_metric("steps", {"step": step, "loss": 1.0 / (step + run + 1)})
        cmf.commit_metrics("steps")
        cmf.close()
    store = ("--store", str(tmp_path / "store"), "--pipeline", "one")
    code, out, err = _cli(capsys, "plot", *store, "-o", str(tmp_path / "one.png"), "--json")
    assert code == 0 and json.loads(out)[0]["plot"].endswith("one.png"), err
    for argv in (("plot", "-o", str(tmp_path / "top.png"), "--top", "1"), ("compare",)):
        code, _, err = _cli(capsys, argv[0], *store, *argv[1:])
        assert code == 2 and "--metric" in err and "they are ['loss']" in err, (argv, err)


def test_asked_which_metric_to_rank_by_the_error_offers_metrics_not_counters(tmp_path: Path) -> None:
    """A StepLogger's series without ``modes=``: ``Sweep.ranked_metric()`` told a Python user to pass
    ``--metric``, and offered the ``_nonfinite`` counts and the throughput, which nothing ranks by (a new
    user's). It names both ways to say it and offers the metrics."""
    cmf = Cmf(pipeline_name="train", store=tmp_path / "store")
    for step in range(3):
        row = {"step": step, "loss": 1.0 / (step + 1), "loss_nonfinite": 0.0, "samples_per_s": 100.0}
        cmf.log_metric("steps", row)
    cmf.commit_metrics("steps")
    cmf.close()
    with pytest.raises(InvalidArgumentError) as refused:
        Sweep(tmp_path / "store", metrics_name="steps").ranked_metric()
    said = str(refused.value)
    assert said.startswith("Name a metric (metric=..., --metric on the command line)") and said.endswith(
        "they are ['loss']"
    ), said


def test_pull_brings_back_every_file_it_can_and_then_names_those_it_cannot(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One file never reached the remote (a colleague recovered a crashed run and did not push): ``pull``
    stopped at it and fetched nothing after it, leaving files the remote holds unread (a new user's team
    store). It brings back every other file, then fails naming the one it could not."""
    remote = tmp_path / "remote"
    assert _cli(capsys, "push", "--store", str(store_copy), "--add-remote", str(remote))[0] == 0
    files = sorted(store_copy.glob("artifacts/**/*.parquet"))
    assert len(files) > 2
    never_pushed = files[0]
    [object_of_it] = [p for p in remote.rglob("*") if p.is_file() and file_md5(p) == file_md5(never_pushed)]
    object_of_it.unlink()
    shutil.rmtree(store_copy / ".dvc" / "cache")
    shutil.rmtree(store_copy / "artifacts")
    code, _, err = _cli(capsys, "pull", "--store", str(store_copy))
    assert code == 2 and str(never_pushed.relative_to(store_copy)) in err and "pulled the other" in err, err
    assert sorted(store_copy.glob("artifacts/**/*.parquet")) == files[1:]
