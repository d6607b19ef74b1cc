"""Reproducibility: code version, software, hardware and seeds per execution; the system-metrics series."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from ray_cmf import Cmf, Sweep
from ray_cmf.buffer import MetricBuffer
from ray_cmf.cli import main
from ray_cmf.constants import ENVIRONMENT_TYPE, MLMD_FILE, STEP_METRICS_TYPE
from ray_cmf.environment import strip_credentials
from ray_cmf.lineage import Lineage, properties
from ray_cmf.series_format import SpillManifest, read_segments
from ray_cmf.system import CPU_WINDOW_S, SystemSampler
from tests._sweeps import run_grid

SECRET = "hunter2-not-for-the-store"
SCRIPT = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    cmf = Cmf(pipeline_name="p", store=sys.argv[1])
    cmf.create_execution("train", execution_name=sys.argv[2])
    cmf.log_seeds(numpy=7, huge=2**64 - 1)
    cmf.log_metric("m", {"x": 1.0})
    cmf.commit_metrics("m")
    """
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _run_script(directory: Path, store: Path, name: str, script_name: str = "train.py", extra: str = "") -> None:
    """Run the user's script from ``directory`` (its code version is that directory's git state)."""
    script = directory / script_name
    script.write_text(SCRIPT + extra)
    env = {**os.environ, "RAY_CMF_TEST_SECRET": SECRET}
    subprocess.run([sys.executable, str(script), str(store), name], check=True, env=env, cwd=directory, timeout=120)


def _execution_props(store: Path) -> dict[str, dict[str, Any]]:
    lineage = Lineage(store / MLMD_FILE, readonly=True)
    return {e.name: properties(e) for e in lineage.store.get_executions()}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _git(repo, "remote", "add", "origin", f"https://alice:{SECRET}@example.com/team/model.git")
    (repo / "model.py").write_text("LAYERS = 2\n")
    (repo / "train.py").write_text(SCRIPT)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_execution_records_the_commit_dirty_flag_and_no_secrets(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _run_script(repo, store, "clean")
    (repo / "model.py").write_text("LAYERS = 3\n")  # an uncommitted change
    _run_script(repo, store, "dirty")
    props = _execution_props(store)
    head = _git(repo, "rev-parse", "HEAD")
    clean, dirty = props["clean"], props["dirty"]
    assert clean["env_git_commit"] == dirty["env_git_commit"] == head
    assert clean["env_git_branch"] == "main"
    assert clean["env_git_dirty"] is False and clean["env_git_diff_md5"] == ""
    assert dirty["env_git_dirty"] is True and len(dirty["env_git_diff_md5"]) == 32
    assert clean["env_git_remote"] == "https://example.com/team/model.git"  # credentials stripped
    assert clean["env_python"] == ".".join(map(str, sys.version_info[:3]))
    assert clean["env_host"] == socket.gethostname() and clean["env_cpu_count"] == os.cpu_count()
    assert clean["seed_numpy"] == 7 and clean["seed_huge"] == str(2**64 - 1)
    leaked = [p for p in store.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []  # neither the remote's password nor the environment variable reached the store


def test_an_execution_reopened_by_name_keeps_the_code_version_it_was_made_with(repo: Path, tmp_path: Path) -> None:
    """A script of another commit that reopened the execution (cmflib's rule: its name reopens it) wrote its
    own code version over the one of the run that made the data (found by a new user)."""
    store = tmp_path / "store"
    _run_script(repo, store, "run")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "model.py").write_text("LAYERS = 4\n")
    _git(repo, "commit", "-qam", "second")
    _run_script(repo, store, "run")  # reopens "run" and logs a second version of its series
    props = _execution_props(store)["run"]
    assert props["env_git_commit"] == first != _git(repo, "rev-parse", "HEAD")


STEP_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger
    metrics = MetricCollection({"loss": Mean()})
    steps = StepLogger(metrics, sync_every=2, store=sys.argv[1], pipeline_name="p", run_name=sys.argv[2])
    for step in range(4):
        metrics["loss"].update(torch.tensor(float(step)))
        steps.step()
    steps.finish()
    """
)


def test_a_step_logger_without_ray_records_the_code_version(repo: Path, tmp_path: Path) -> None:
    """A StepLogger in a plain script recorded no ``env/git_*``: inside Ray Train the driver's callback
    records the code version, and outside it nothing did (found by a new user)."""
    (repo / "loop.py").write_text(STEP_SCRIPT)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the loop")
    store = tmp_path / "store"
    subprocess.run([sys.executable, "loop.py", str(store), "steps"], check=True, cwd=repo, timeout=120)
    props = _execution_props(store)["steps"]
    assert props["env_git_commit"] == _git(repo, "rev-parse", "HEAD")
    assert props["env_git_dirty"] is False and props["env_git_remote"] == "https://example.com/team/model.git"


def test_a_script_that_git_does_not_track_makes_the_code_version_dirty(repo: Path, tmp_path: Path) -> None:
    """A new script, never added to git, ran in a clean checkout: ``git_dirty`` said False, as if the commit
    held the code that ran. It is now dirty, and its diff md5 tells one version of the script from another."""
    store = tmp_path / "store"
    _run_script(repo, store, "tracked")
    _run_script(repo, store, "untracked", "sweep.py")
    _run_script(repo, store, "edited", "sweep.py", "# another version\n")
    props = _execution_props(store)
    assert props["tracked"]["env_git_dirty"] is False and props["tracked"]["env_git_diff_md5"] == ""
    untracked, edited = props["untracked"], props["edited"]
    assert untracked["env_git_dirty"] is True and edited["env_git_dirty"] is True
    assert len(untracked["env_git_diff_md5"]) == 32 and untracked["env_git_diff_md5"] != edited["env_git_diff_md5"]


def test_code_that_is_no_file_of_the_repository_is_never_recorded_clean(repo: Path, tmp_path: Path) -> None:
    """``python -c`` in a clean checkout recorded the commit as clean, whatever code it ran, and two programs piped
    to ``python -`` recorded one diff md5, the md5 of nothing (found by a new user). The text of ``-c`` counts as an
    untracked script's; code ray_cmf cannot read (stdin, a REPL, a notebook) is dirty with no md5: no two programs
    can then look alike."""
    store = tmp_path / "store"

    def run(name: str, *how: str, stdin: str | None = None, extra: str = "") -> None:
        code = SCRIPT + extra
        argv = [sys.executable, *how, *([code] if stdin is None else []), str(store), name]
        subprocess.run(argv, input=code if stdin is not None else None, text=True, check=True, cwd=repo, timeout=120)

    run("c", "-c")
    run("c_edited", "-c", extra="# another program\n")
    run("piped", "-", stdin="yes")
    props = _execution_props(store)
    head = _git(repo, "rev-parse", "HEAD")
    assert {props[name]["env_git_commit"] for name in ("c", "c_edited", "piped")} == {head}
    assert props["c"]["env_git_dirty"] is True and props["c_edited"]["env_git_dirty"] is True
    assert props["c"]["env_git_diff_md5"] == hashlib.md5(SCRIPT.encode()).hexdigest()  # the tree is clean
    assert props["c_edited"]["env_git_diff_md5"] != props["c"]["env_git_diff_md5"]
    assert props["piped"]["env_git_dirty"] is True and props["piped"]["env_git_diff_md5"] == ""


def test_a_torch_without_cuda_records_no_cuda_version() -> None:
    """The CPU build of torch recorded ``env_cuda=""``, which ``show`` printed, where the README says CUDA is
    recorded where there is one (found by a new user)."""
    import torch

    from ray_cmf.environment import software_versions

    props = software_versions()
    assert props.get("env_cuda") == (torch.version.cuda or None)
    assert ("env_nccl" in props) == torch.cuda.is_available()


def test_outside_a_git_repository_no_code_version_is_recorded(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    _run_script(plain, tmp_path / "store", "run")
    props = _execution_props(tmp_path / "store")["run"]
    assert not any(k.startswith("env_git") for k in props) and props["env_ray_cmf"]


def test_executions_with_one_environment_share_one_package_list(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _run_script(repo, store, "a")
    _run_script(repo, store, "b")
    lineage = Lineage(store / MLMD_FILE, readonly=True)
    [package_list] = lineage.store.get_artifacts_by_type(ENVIRONMENT_TYPE)
    producers = lineage.store.get_events_by_artifact_ids([package_list.id])
    assert len({e.execution_id for e in producers}) == 2
    path = store / properties(package_list)["url"]
    lines = path.read_text().splitlines()
    assert any(line.startswith("ray-cmf==") for line in lines) and lines == sorted(  # names as PEP 503 has them
        lines, key=lambda line: line.split("==")[0].lower()
    )
    assert len(list((store / "environments").glob("packages-*.txt"))) == 1


def test_two_runs_whose_packages_differ_say_so_in_diff(repo: Path, tmp_path: Path) -> None:
    """Two runs with different package lists linked different Environment artifacts, but ``diff`` and
    ``Sweep.environment`` showed nothing of it (found by a new user): each run records its list's md5."""
    store = tmp_path / "store"
    _run_script(repo, store, "a")
    extra = tmp_path / "site"
    (extra / "tinyx-0.0.1.dist-info").mkdir(parents=True)
    (extra / "tinyx-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyx\nVersion: 0.0.1\n")
    script = repo / "train.py"
    env = {**os.environ, "PYTHONPATH": str(extra)}
    subprocess.run([sys.executable, str(script), str(store), "b"], check=True, env=env, cwd=repo, timeout=120)
    lineage = Lineage(store / MLMD_FILE, readonly=True)
    lists = lineage.store.get_artifacts_by_type(ENVIRONMENT_TYPE)
    files = {properties(a)["url"].rsplit("-", 1)[1].removesuffix(".txt") for a in lists}
    props = _execution_props(store)
    assert {props["a"]["env_packages_md5"], props["b"]["env_packages_md5"]} == files and len(files) == 2
    sweep = Sweep(store, pipeline="p", metrics_name="m")
    assert "env/packages_md5" in sweep.diff("a", "b").index
    assert sweep.environment("a")["env/packages_md5"] == props["a"]["env_packages_md5"]


def test_seeds_must_be_ints_and_name_the_bad_one(tmp_path: Path) -> None:
    cmf = Cmf(pipeline_name="p", store=tmp_path / "store")
    with pytest.raises(TypeError, match="'lr'"):
        cmf.log_seeds(lr=0.1)  # type: ignore[arg-type]
    cmf.close()


def test_a_seed_beyond_int64_reads_back_as_the_int_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch's initial seed is often 2**63 or more, which MLMD's int64 properties cannot hold: such a seed is
    stored as its decimal text, and read back as that text: ``seed/torch`` was "18446744073709551615", so
    ``--where '`seed/torch` > 0'`` matched no trial, and a sort put "9" above "10"."""
    store = tmp_path / "store"
    for name, seed in (("small", 7), ("huge", 2**64 - 1), ("edge", 2**63), ("negative", -(2**63) - 5)):
        with Cmf(pipeline_name="p", store=store) as cmf:
            cmf.create_execution("trial", {"lr": 0.1}, execution_name=name)
            cmf.log_seeds(torch=seed)
            cmf.log_metric("s", {"step": 0, "loss": 1.0})
            cmf.commit_metrics("s")
    sweep = Sweep(store, pipeline="p", metrics_name="s")
    for name, seed in (("small", 7), ("huge", 2**64 - 1), ("edge", 2**63), ("negative", -(2**63) - 5)):
        recorded = sweep.environment(name)["seed/torch"]
        assert recorded == seed and type(recorded) is int, (name, recorded)
        assert sweep.trials().set_index("trial_id").loc[name, "seed/torch"] == seed
    assert sorted(sweep.trials(where="`seed/torch` > 0")["trial_id"]) == ["edge", "huge", "small"]
    args = ["trials", "--store", str(store), "--pipeline", "p", "--metrics-name", "s", "--json", "--all-columns"]
    assert main(args) == 0
    shown = {row["trial_id"]: row["seed/torch"] for row in json.loads(capsys.readouterr().out)}
    assert shown == {"small": 7, "huge": 2**64 - 1, "edge": 2**63, "negative": -(2**63) - 5}


def test_config_keys_named_like_seeds_or_environment_stay_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config's ``seed_data`` and ``env_name`` (an RL environment) are stored as properties beside the seeds
    and the environment ray_cmf records, and read back as a seed ``seed/data`` and an environment field
    ``env/name`` that nothing logged: ``--where 'seed/data == 7'`` matched a trial that never logged a seed.
    A seed logged under a config key's name is still a seed, and a config key that collides with an
    environment field leaves the recorded field and the config value apart."""
    store = tmp_path / "store"
    for name, seeds in (("plain", {}), ("seeded", {"data": 123}), ("same", {"data": 7})):
        with Cmf(pipeline_name="p", store=store) as cmf:
            config = {"lr": 0.1, "seed_data": 7, "env_name": "CartPole-v1", "env_host": "mine", "seed_big": 2**60 + 1}
            cmf.create_execution("trial", config, execution_name=name)
            cmf.log_seeds(**seeds)
            cmf.log_metric("s", {"step": 0, "loss": 1.0})
            cmf.commit_metrics("s")
    sweep = Sweep(store, pipeline="p", metrics_name="s")
    table = sweep.trials().set_index("trial_id")
    for trial in ("plain", "seeded", "same"):
        recorded = sweep.environment(trial)
        assert "env/name" not in recorded and "seed/big" not in recorded, recorded
        assert recorded["env/host"] == socket.gethostname()
        assert sweep.config(trial)["env_host"] == "mine" and sweep.config(trial)["seed_data"] == 7
        assert table.loc[trial, "config/env_name"] == "CartPole-v1"
        assert table.loc[trial, "env/host"] == socket.gethostname()
    assert "seed/data" not in sweep.environment("plain") and sweep.environment("seeded")["seed/data"] == 123
    assert sweep.environment("same")["seed/data"] == 7  # the seed the config names, logged: it was hidden
    assert "seed/big" not in table.columns and "env/name" not in table.columns
    assert pd.isna(table.loc["plain", "seed/data"]) and table.loc["seeded", "seed/data"] == 123
    assert sweep.trials(where="`seed/data` == 7")["trial_id"].tolist() == ["same"]
    args = ["trials", "--store", str(store), "--pipeline", "p", "--metrics-name", "s", "--json"]
    assert main([*args, "--all-columns"]) == 0  # --where could query them, and no table showed them
    shown = {row["trial_id"]: row for row in json.loads(capsys.readouterr().out)}
    assert shown["same"]["seed/data"] == 7 and shown["plain"]["env/host"] == socket.gethostname()
    assert {"stage", "started_at", "md5", "url"} <= set(shown["same"])  # as --where reads them (a new user's find)


def test_a_config_never_writes_over_what_ray_cmf_records() -> None:
    """A Train run's config was written after its StepLogger's seeds: ``seed_data=111`` in the config replaced
    the logged seed 112 in MLMD. A config key named like what ray_cmf records (a seed, the environment, the
    status, the trial id, ...) is kept in the config's JSON only, not as a property beside those."""
    from ray_cmf.constants import CONFIG_JSON
    from ray_cmf.lineage import config_properties

    config = {"seed_data": 111, "env_host": "x", "status": "draft", "error": 0.1, "trial_id": "t", "top_rank": 1}
    config |= {"steps": 5555, "world_size": 99, "Execution": "e", "config_json": "{}"}  # a Train run's, cmflib's
    props = config_properties({**config, "lr": 0.1})
    assert set(props) == {"lr", CONFIG_JSON} and json.loads(props[CONFIG_JSON]) == {**config, "lr": 0.1}


def test_a_config_key_named_config_json_is_config(tmp_path: Path) -> None:
    """``create_execution("x", {"lr": 0.1, "config_json": ...})`` took the key's value as the whole config
    (``config/lr`` read 5), and a value that is no JSON broke ``trials`` for the whole pipeline."""
    store = tmp_path / "store"
    for name, own in (("a", '{"lr": 5}'), ("b", "not json")):
        with Cmf(pipeline_name="p", store=store) as cmf:
            cmf.create_execution("x", {"lr": 0.1, "config_json": own}, execution_name=name)
            cmf.log_metric("s", {"step": 0, "loss": 1.0})
            cmf.commit_metrics("s")
    sweep = Sweep(store, pipeline="p", metrics_name="s")
    assert sweep.config("a") == {"lr": 0.1, "config_json": '{"lr": 5}'}
    assert sweep.trials().set_index("trial_id").loc["b", "config/config_json"] == "not json"


def test_config_keys_named_like_what_ray_cmf_records_stay_config(tmp_path: Path) -> None:
    """A config's ``error`` (a tolerance, say), ``status``, ``top_rank`` or ``trial_id`` read back as the
    trial's error, status, rank and id: a COMPLETE run showed the error 0.1, and ``--where 'error != null'``
    matched it."""
    store = tmp_path / "store"
    config = {"error": 0.1, "status": "draft", "top_rank": 3, "in_top_n": True, "trial_id": "not_mine"}
    with Cmf(pipeline_name="p", store=store) as cmf:
        cmf.create_execution("trial", config, execution_name="mine")
        cmf.log_metric("s", {"step": 0, "loss": 1.0})
        cmf.commit_metrics("s")
    sweep = Sweep(store, pipeline="p", metrics_name="s")
    [row] = sweep.trials().to_dict(orient="records")
    assert row["trial_id"] == "mine" and row["status"] == "COMPLETE" and row["error"] is None
    assert "top_rank" not in row and "in_top_n" not in row
    assert {k: row[f"config/{k}"] for k in config} == config
    assert sweep.trials(where="error != null").empty


def test_strip_credentials() -> None:
    assert strip_credentials("https://u:p@host/r.git") == "https://host/r.git"
    assert strip_credentials("ssh://git@host/r.git") == "ssh://host/r.git"
    assert strip_credentials("git@host:r.git") == "git@host:r.git"  # scp-like: a user name, no secret
    assert strip_credentials("https://host/x.git?private_token=t0k#f") == "https://host/x.git"  # a query holds secrets


def test_sampler_rows_have_plausible_values_at_its_cadence(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    buffer = MetricBuffer(spill, manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s.parquet")))
    sampler = SystemSampler(buffer, interval=0.1, extra={"rank": 3}).start()
    time.sleep(1.05)
    sampler.stop()
    rows = [row for batch in read_segments(spill) for row in batch.to_pylist()]
    assert 7 <= len(rows) <= 13  # one at the start, one a tenth of a second, one at the stop
    gaps = [b["wall_time"] - a["wall_time"] for a, b in itertools.pairwise(rows[:-1])]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.1, abs=0.05)
    first, *later = rows
    assert first["proc_cpu_percent"] is None and first["disk_read_mb_s"] is None  # no previous reading yet
    for row in rows:
        assert row["rank"] == 3 and row["proc_rss_mb"] > 0 and row["node_mem_used_mb"] > 0
    for row in later:
        assert row["disk_read_mb_s"] >= 0 and row["net_recv_mb_s"] >= 0
    cpu = [(row["proc_cpu_percent"], row["node_cpu_percent"]) for row in later if row["proc_cpu_percent"] is not None]
    assert len(cpu) >= len(later) - 2  # all but rows closer than CPU_WINDOW_S to the first
    assert all(0 <= process <= 100 * (os.cpu_count() or 1) and 0 <= node <= 100 for process, node in cpu)
    assert [row["step"] for row in rows] == list(range(1, len(rows) + 1))


def test_rows_closer_than_the_cpu_window_read_no_tick_rounding_as_cpu(tmp_path: Path) -> None:
    """A row taken moments after the previous one (a trial's last, at its end) read 222% CPU on a 2-core host:
    process CPU time advances in 10-ms clock ticks, so over a few ms one tick reads as several CPUs. Each row's
    CPU % now spans at least CPU_WINDOW_S, and a row with no reading that old has none."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s")))
        sampler = SystemSampler(buffer, interval=60, pid=busy.pid)
        began = time.monotonic()
        rows = [sampler.sample(first=True)]
        while time.monotonic() - began < 3 * CPU_WINDOW_S:  # back-to-back rows, a fraction of a tick apart
            rows.append(sampler.sample())
    finally:
        busy.kill()
        busy.wait()
    measured = [r for r in rows if r.get("proc_cpu_percent") is not None]
    assert len(measured) > len(rows) // 3  # every row from CPU_WINDOW_S on
    for row in measured:
        assert 0 <= row["proc_cpu_percent"] <= 100 * (os.cpu_count() or 1), row
        assert 0 <= row["node_cpu_percent"] <= 100, row
    assert max(r["proc_cpu_percent"] for r in measured) > 0  # the busy process, seen (as busy as the host lets it)


def test_a_process_shorter_than_an_interval_gets_a_first_and_a_last_row(tmp_path: Path) -> None:
    buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s.parquet")))
    sampler = SystemSampler(buffer, interval=60).start()
    time.sleep(2 * CPU_WINDOW_S)  # long enough for a CPU reading
    sampler.stop()
    rows = [row for batch in read_segments(tmp_path / "spill") for row in batch.to_pylist()]
    assert [row["step"] for row in rows] == [1, 2] and rows[1]["proc_cpu_percent"] is not None


def test_a_ramped_sampler_samples_densely_at_first_then_at_its_interval(tmp_path: Path) -> None:
    """Sampled from outside, a process's end is not seen in time for a last row: the ramp gives a short one
    rows after its first (0, 0.05, 0.15, 0.35, 0.75 s, ...), and a long one rows at its interval."""
    buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s.parquet")))
    sampler = SystemSampler(buffer, interval=0.4, ramp=True).start()
    time.sleep(1.7)
    sampler.stop()
    rows = [row for batch in read_segments(tmp_path / "spill") for row in batch.to_pylist()]
    gaps = [b["wall_time"] - a["wall_time"] for a, b in itertools.pairwise(rows[:-1])]
    assert gaps[0] < gaps[-1] and gaps[0] < 0.3  # dense at first (0.05 s), its interval (0.4 s) later
    assert len(rows) >= 6  # 0, 0.05, 0.15, 0.35, 0.75 and 1.15 s at least, and the last


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "a zombie"])
def test_sampling_another_process_ends_quietly_when_it_exits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reaped: bool
) -> None:
    """No row after the process exits, also while it is a zombie its parent has not reaped yet (whose memory
    reads as 0 MB: such a row made a worker's proc_rss_mb_best 0)."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("system_metrics", 1, str(tmp_path / "s.parquet")))
    sampler = SystemSampler(buffer, interval=0.1, extra={"pid": child.pid}, pid=child.pid).start()
    if reaped:
        child.wait()
    else:
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.02)
    time.sleep(0.3)  # intervals after the exit: no rows, no warnings
    sampler.stop()
    child.wait()
    rows = [row for batch in read_segments(tmp_path / "spill") for row in batch.to_pylist()]
    assert len(rows) >= 2 and {row["pid"] for row in rows} == {child.pid}
    assert all(row["proc_rss_mb"] > 0 for row in rows) and not caplog.records


def test_sampler_refuses_a_bad_interval(tmp_path: Path) -> None:
    buffer = MetricBuffer(tmp_path / "spill", manifest=SpillManifest("s", 1, str(tmp_path / "s.parquet")))
    with pytest.raises(ValueError, match="interval"):
        SystemSampler(buffer, interval=0)


# -- in a real Tune sweep ----------------------------------------------------------------------------
def _trainable(config: dict[str, Any]) -> None:
    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=0.2)
    cmf.log_seeds(data=int(config["lr"] * 100))
    for step in range(8):
        time.sleep(0.2)  # a training step that releases the GIL, as torch's kernels do
        cmf.log_metric("steps", {"step": step, "loss": config["lr"] / (step + 1)})
    cmf.commit_metrics("steps")


@pytest.fixture(scope="module")
def sweep(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ray_cmf import CmfRayLogger

    tmp = tmp_path_factory.mktemp("env_sweep")
    logger = CmfRayLogger("envs", store=str(tmp / "store"), system_metrics=None)  # the trial samples itself
    run_grid(_trainable, {"lr": [0.1, 0.2]}, tmp / "results", logger)
    return tmp / "store"


def test_each_trial_records_its_host_seeds_and_a_shared_package_list(sweep: Path) -> None:
    lineage = Lineage(sweep / MLMD_FILE, readonly=True)
    trials = lineage.store.get_executions()
    assert len(trials) == 2
    for trial in trials:
        props = properties(trial)
        assert props["env_host"] == socket.gethostname() and props["env_node_id"]  # from the trial's process
        assert props["env_node_ip"] == "127.0.0.1"  # recorded by the trial's process: these trials never report
        assert props["env_ray"] and props["env_python"]  # from the driver
        assert props["seed_data"] == round(props["lr"] * 100)
    [package_list] = lineage.store.get_artifacts_by_type(ENVIRONMENT_TYPE)
    users = {e.execution_id for e in lineage.store.get_events_by_artifact_ids([package_list.id])}
    assert users == {t.id for t in trials}


def test_each_trial_has_a_system_metrics_series_committed_at_its_end(sweep: Path) -> None:
    lineage = Lineage(sweep / MLMD_FILE, readonly=True)
    for trial in lineage.store.get_executions():
        events = lineage.store.get_events_by_execution_ids([trial.id])
        series = [
            a
            for a in lineage.store.get_artifacts_by_id([e.artifact_id for e in events])
            if a.type_id == lineage.store.get_artifact_type(STEP_METRICS_TYPE).id
            and properties(a)["metrics_name"] == "system_metrics"
        ]
        [artifact] = series
        assert properties(artifact)["at_end"] is True  # the trainable never committed it
        rows = pq.read_table(sweep / properties(artifact)["url"]).to_pylist()
        assert len(rows) >= 4  # 1.6 s of training, a row every 0.2 s
        cpu = [r["proc_cpu_percent"] for r in rows if r["proc_cpu_percent"] is not None]  # none in the first 0.2 s
        assert rows[-1]["proc_cpu_percent"] is not None and all(0 <= c <= 100 * (os.cpu_count() or 1) for c in cpu)
        assert all(r["proc_rss_mb"] > 0 for r in rows)
        pids = {r["pid"] for r in rows}  # the README's pid column, which rows sampled in-process lacked (a new user)
        assert len(pids) == 1 and os.getpid() not in pids  # sampled in the trial's process


def test_sweep_shows_and_diffs_environments(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ray_cmf.cli import main

    trials = Sweep(sweep, pipeline="envs", metrics_name="steps").trials()
    assert set(trials["env/host"]) == {socket.gethostname()}
    assert sorted(trials["seed/data"]) == [10, 20]
    a, b = trials["trial_id"]
    diff = Sweep(sweep, pipeline="envs", metrics_name="steps").diff(a, b)
    assert {"config/lr", "seed/data"} <= set(diff.index)
    assert not [f for f in diff.index if f.startswith("env/")]  # one machine, one environment
    assert main(["diff", a, b, "--store", str(sweep), "--metrics-name", "steps", "--json"]) == 0
    fields = {row["field"] for row in json.loads(capsys.readouterr().out)}
    assert fields == set(diff.index)


def test_show_prints_the_environment(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ray_cmf.cli import main

    a = Sweep(sweep, pipeline="envs", metrics_name="steps").trials()["trial_id"][0]
    assert main(["show", a, "--store", str(sweep), "--metrics-name", "steps", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["environment"]["env/host"] == socket.gethostname() and "seed/data" in shown["environment"]
