"""A team store: MLMD on a real PostgreSQL server on 127.0.0.1 (started by the tests, stopped by its pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_cmf import Cmf, Store, StoreError, Sweep
from ray_cmf.cli import main
from ray_cmf.constants import STORE_CONFIG
from ray_cmf.lineage import lineage_away, properties
from tests._require import require
from tests._servers import (
    ADMIN_PASSWORD,
    FAKE_AWS,
    MariaDB,
    Postgres,
    free_port,
    mariadb,
    mariadb_skip_reason,
    postgres,
    postgres_skip_reason,
)
from tests._sweeps import run_grid

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    require(postgres_skip_reason())
    with postgres() as server:
        server.sql("CREATE ROLE team LOGIN PASSWORD 'team-secret' CREATEDB")
        server.sql("CREATE ROLE reader LOGIN PASSWORD 'reader-secret' NOCREATEDB")
        yield server


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDB]:
    require(mariadb_skip_reason())
    with mariadb() as server:
        yield server


@pytest.fixture(params=["postgresql", "mysql"])
def db(request: pytest.FixtureRequest) -> Postgres | MariaDB:
    """Each server ML-Metadata supports: PostgreSQL, and MySQL (MariaDB)."""
    server: Postgres | MariaDB = request.getfixturevalue("pg" if request.param == "postgresql" else "maria")
    return server


def _log(cmf: Cmf, name: str, rows: int) -> None:
    for step in range(rows):
        cmf.log_metric(name, {"step": step, "loss": 1.0 / (step + 1)})


def _one_run(url: str, store: Path, rows: int) -> None:
    """A store whose MLMD is on a server: one run, ``run-1``, with ``rows`` committed rows of ``steps``."""
    cmf = Cmf(filepath=url, pipeline_name="pg", store=store)
    cmf.create_execution("train", execution_name="run-1")
    _log(cmf, "steps", rows)
    cmf.commit_metrics("steps")
    cmf.close()


def test_cmf_on_a_server_creates_the_database_and_keeps_no_password(db: Postgres | MariaDB, tmp_path: Path) -> None:
    url = db.url("team", "team-secret", "cmf_one")
    cmf = Cmf(filepath=url, pipeline_name="pg", store=tmp_path / "store")
    cmf.create_execution("train", execution_name="run-1")
    cmf.log_seeds(small=7, wide=2**40)  # ML-Metadata's server schemas hold 32-bit ints
    _log(cmf, "steps", 10)
    artifact = cmf.commit_metrics("steps")
    assert artifact is not None and cmf.read_metrics("steps")["loss"].tolist() == [1.0 / (s + 1) for s in range(10)]
    environment = Sweep(Store(tmp_path / "store", mlmd=url), metrics_name="steps").environment("run-1")
    assert environment["seed/wide"] == 2**40 and environment["seed/small"] == 7  # held as text, read as the int
    cmf.close()
    assert db.has_database("cmf_one")  # created by ML-Metadata
    config = json.loads((tmp_path / "store" / STORE_CONFIG).read_text())
    assert config["mlmd"] == f"{db.scheme}://team@127.0.0.1:{db.port}/cmf_one"
    leaked = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and b"team-secret" in p.read_bytes()]
    assert leaked == []


TRICKY_TEXTS = ("café", "C:\\data\\run", 'say "hi"', "line\nbreak", "tab\there", "ray_cmf:b64:x", "λ≥1 ✓")


def test_text_with_backslashes_and_unicode_reads_back_from_a_server(db: Postgres | MariaDB, tmp_path: Path) -> None:
    """ML-Metadata 1.17 writes a PostgreSQL string with a backslash as broken SQL (``'E'...'``): a config of
    "café" (``\\u00e9`` in its JSON), a tag ``a\\b`` or an error whose text holds a backslash failed to write,
    and the failed run stayed CRASHED without its error. Every text reads back as it was, on either server."""
    url = db.url("team", "team-secret", "cmf_text")
    store = tmp_path / "store"
    config = {f"k{i}": text for i, text in enumerate(TRICKY_TEXTS)} | {"ключ": "значение", "nested": {"p": "a\\b"}}
    config |= {"w\\k": 1, "ray_cmf:b64:k": 2}  # keys are texts too
    with Cmf(filepath=url, pipeline_name="pg", store=store) as cmf:
        cmf.create_execution("train", config, execution_name="run-1")
        cmf.set_tags(path="a\\b", word="é")
        cmf.log_execution_metrics("final", {"where": "C:\\out", "ok": "ok ✓", "k\\ey": 3})
        _log(cmf, "steps", 2)
        cmf.commit_metrics("steps")
    with pytest.raises(RuntimeError), Cmf(filepath=url, pipeline_name="pg", store=store) as cmf:
        cmf.create_execution("train", execution_name="run-2")
        _log(cmf, "steps", 2)
        raise RuntimeError("no file C:\\data\\x")
    sweep = Sweep(Store(store, mlmd=url), metrics_name="steps")
    assert sweep.config("run-1") == {**{k: v for k, v in config.items() if k != "nested"}, "nested.p": "a\\b"}
    table = sweep.trials().set_index("trial_id")
    assert table.loc["run-1", "tag/path"] == "a\\b" and table.loc["run-1", "tag/word"] == "é"
    assert table.loc["run-1", "config/w\\k"] == 1 and table.loc["run-1", "config/ray_cmf:b64:k"] == 2
    assert sweep.execution_metrics("run-1") == {"final/where": "C:\\out", "final/ok": "ok ✓", "final/k\\ey": 3}
    sweep.tag("run-1", remove=["path"])
    assert "tag/path" not in sweep.refresh().trials().columns
    assert table.loc["run-2", "status"] == "FAILED" and "C:\\data\\x" in table.loc["run-2", "error"]


def test_a_file_over_two_gib_is_registered(db: Postgres | MariaDB, tmp_path: Path) -> None:
    """ML-Metadata's server schemas keep 32-bit ints; a 3 GiB model's size must still be recorded exactly."""
    model = tmp_path / "model.bin"
    with open(model, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB of zeros without the disk
    cmf = Cmf(filepath=db.url("team", "team-secret", "cmf_big"), pipeline_name="pg", store=tmp_path / "store")
    cmf.create_execution("train", execution_name="run-1")
    artifact = cmf.log_model(str(model), "output", model_name="big")
    assert properties(artifact)["size"] == 3 * 2**30
    cmf.close()


def test_the_store_directory_alone_finds_the_server_with_the_password_from_the_environment(
    db: Postgres | MariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    _one_run(db.url("team", "team-secret", "cmf_two"), store, 5)
    monkeypatch.setenv(db.password_env, "team-secret")
    assert Store(store).mlmd == f"{db.scheme}://team@127.0.0.1:{db.port}/cmf_two"  # from the config file
    assert Sweep(store, metrics_name="steps").steps()["step"].tolist() == list(range(5))
    assert main(["trials", "--store", str(store), "--metrics-name", "steps", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["trial_id"] == "run-1" and row["steps"] == 5
    assert main(["verify", "--store", str(store)]) == 0


def test_a_store_keeps_the_database_it_holds_its_lineage_in(pg: Postgres, tmp_path: Path) -> None:
    """A run that named another database for the store rewrote its ``ray_cmf.json`` without a word, and every
    reader lost the earlier runs; a run whose server never answered left the store naming that server. The
    store keeps its database: another is refused, and one that never opened is not written down."""
    store = tmp_path / "store"
    dead = f"postgresql://team@127.0.0.1:{free_port()}/cmf_keep"
    with pytest.raises(StoreError, match="nothing answers"):
        _one_run(dead, store, 1)
    assert "mlmd" not in json.loads((store / STORE_CONFIG).read_text() if (store / STORE_CONFIG).exists() else "{}")
    with pytest.raises(StoreError, match=r"takes no query \(\?\.\.\.\)") as refused:  # it was written down
        _one_run(f"postgresql://team@127.0.0.1:{pg.port}/cmf_keep?password=team-secret", store, 1)
    assert "team-secret" not in str(refused.value) and not (store / STORE_CONFIG).exists()
    url = pg.url("team", "team-secret", "cmf_keep")
    _one_run(url, store, 3)
    with pytest.raises(StoreError, match=r"keeps its lineage in postgresql://team@127\.0\.0\.1:\d+/cmf_keep, not in"):
        _one_run(pg.url("team", "team-secret", "cmf_other"), store, 1)
    with pytest.raises(StoreError, match="keeps its lineage in"):
        _one_run(str(tmp_path / "local.sqlite"), store, 1)
    assert json.loads((store / STORE_CONFIG).read_text())["mlmd"] == f"postgresql://team@127.0.0.1:{pg.port}/cmf_keep"
    _one_run(f"postgres://team:team-secret@127.0.0.1:{pg.port}/cmf_keep", store, 4)  # the same database
    assert Sweep(Store(store, mlmd=url), metrics_name="steps").trials()["trial_id"].tolist() == ["run-1"]


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unreachable", "nothing answers on 127.0.0.1:.*is the server running"),
        ("wrong password", "turned down user 'team': check the password"),
        ("missing database", "'nobody_made_it' does not exist: create the database"),
    ],
)
def test_clear_errors(db: Postgres | MariaDB, tmp_path: Path, case: str, says: str) -> None:
    url = {
        "unreachable": f"{db.scheme}://team:team-secret@127.0.0.1:{free_port()}/x",
        "wrong password": db.url("team", "not-it", "cmf_one"),
        "missing database": db.url("reader", "reader-secret", "nobody_made_it"),  # may not create databases
    }[case]
    with pytest.raises(StoreError, match=says) as raised:
        Cmf(filepath=url, pipeline_name="pg", store=tmp_path / "store")
    assert "secret" not in str(raised.value) and "not-it" not in str(raised.value)
    # the loggers say so as they are built, before any trial or run starts: a new user's sweep with a wrong
    # password ran to its end and recorded nothing, with only warnings in its log
    from ray_cmf import CmfRayLogger, CmfTrainCallback

    for logger in (CmfRayLogger, CmfTrainCallback):
        with pytest.raises(StoreError, match=says):
            logger("pg", file_path=url, store=str(tmp_path / "store"))


DRIVER = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    url, store, name = sys.argv[1], sys.argv[2], sys.argv[3]
    for run in range(8):
        cmf = Cmf(filepath=url, pipeline_name="shared", store=store)
        cmf.create_execution("train", execution_name=f"{name}-{run}")
        for step in range(50):
            cmf.log_metric("steps", {"step": step, "loss": 1.0 / (step + 1)})
        assert cmf.commit_metrics("steps") is not None
        cmf.close()
    print("ok")
    """
)


def test_two_drivers_write_one_empty_database_at_once(db: Postgres | MariaDB, tmp_path: Path) -> None:
    """Both start on a database that does not exist yet (ML-Metadata's first-connection races), then
    write it at the same time, each through its own writer, the same content (one artifact, recorded by
    whichever commits it first)."""
    url = db.url("team", "team-secret", "cmf_shared")
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, url, str(tmp_path / name), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "error::UserWarning:ray_cmf"},
        )
        for name in ("a", "b")
    ]
    outputs = [driver.communicate(timeout=300) for driver in drivers]
    errors = [[line for line in err.splitlines() if "Error" in line][-3:] for _, err in outputs]
    assert [d.returncode for d in drivers] == [0, 0], errors
    assert "could not commit" not in "".join(err for _, err in outputs)
    assert db.execution_names("cmf_shared") == sorted(f"{d}-{r}" for d in "ab" for r in range(8))
    for name in ("a", "b"):  # one MLMD: each driver sees all 16 runs; it holds the (identical) content of each
        runs = Sweep(Store(tmp_path / name, mlmd=url), pipeline="shared", metrics_name="steps").trials()
        assert len(runs) == 16 and set(runs["steps"]) == {50}


SWEEP_DRIVER = textwrap.dedent(
    """
    import sys
    import ray
    from ray import tune
    from ray_cmf import CmfRayLogger

    url, store, results, name = sys.argv[1:5]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)

    scale = {"first": 1.0, "second": 10.0}[name]

    def trainable(config):
        for it in range(10):
            tune.report({"loss": scale * config["lr"] / (it + 1)})

    logger = CmfRayLogger("two_sweeps", pipeline_stage=name, file_path=url, store=store, metric="loss", mode="min")
    tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1, 0.2, 0.3])},
        run_config=tune.RunConfig(name=name, storage_path=results, callbacks=[logger], verbose=0),
    ).fit()
    print("ok")
    """
)


@pytest.mark.slow
def test_two_tune_sweeps_from_two_drivers_write_one_database_at_once(pg: Postgres, tmp_path: Path) -> None:
    """Two driver processes, each with its own Ray instance and writer, sweep into one PostgreSQL MLMD at
    once. Their trials get one set of ids, as sweeps that start in the same 0.4 ms do (Tune's ids are 5 hex
    digits of uuid1's clock): each driver's trials stay its own."""
    url = pg.url("team", "team-secret", "cmf_two_sweeps")
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "_TEST_TUNE_TRIAL_UUID": "c0ffe"}
    drivers = {
        name: subprocess.Popen(
            [sys.executable, "-c", SWEEP_DRIVER, url, str(tmp_path / name), str(tmp_path / "results"), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("first", "second")
    }
    outputs = {name: driver.communicate(timeout=600) for name, driver in drivers.items()}
    failed = {name: err[-3000:] for name, (_, err) in outputs.items() if drivers[name].returncode != 0}
    assert failed == {}
    warned = [line for _, err in outputs.values() for line in err.splitlines() if "ray_cmf:" in line]
    lost = [line for line in warned if "could not" in line or "failed" in line]
    assert not lost, "\n".join(lost)  # no write was lost (whole lines: an assertion's repr cuts the error)
    for name, scale in (("first", 1.0), ("second", 10.0)):
        trials = Sweep(Store(tmp_path / name, mlmd=url), pipeline="two_sweeps", stage=name).trials(["loss"])
        trials = trials.sort_values("trial_id")  # rows come in the order trials started
        assert list(trials["trial_id"]) == ["c0ffe_00000", "c0ffe_00001", "c0ffe_00002"]
        assert list(trials["loss_best"]) == pytest.approx([scale * lr / 10 for lr in (0.1, 0.2, 0.3)])
        assert set(trials["status"]) == {"COMPLETE"} and set(trials["steps"]) == {10}
    assert len(pg.execution_names("cmf_two_sweeps")) == 6


def test_a_tune_sweep_records_into_a_server(db: Postgres | MariaDB, ray_session: None, tmp_path: Path) -> None:
    from ray import tune

    from ray_cmf import CmfRayLogger

    url = db.url("team", "team-secret", "cmf_tune")

    def trainable(config: dict) -> None:
        for it in range(5):
            tune.report({"loss": config["lr"] / (it + 1)})

    logger = CmfRayLogger("pg_sweep", file_path=url, store=str(tmp_path / "store"), metric="loss", mode="min")
    run_grid(trainable, {"lr": [0.1, 0.2], "data": ["café\\raw"]}, tmp_path / "results", logger)
    trials = Sweep(Store(tmp_path / "store", mlmd=url), pipeline="pg_sweep").trials(["loss"])
    assert sorted(trials["loss_best"]) == [0.02, 0.04] and set(trials["status"]) == {"COMPLETE"}
    assert set(trials["config/data"]) == {"café\\raw"}  # a trial of such a config was never registered
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and b"team-secret" in p.read_bytes()]
    assert leaked == []  # not in the store, nor in Tune's experiment state (tuner.pkl)


def test_a_writer_carries_on_once_a_restarted_server_answers(tmp_path: Path) -> None:
    """PostgreSQL restarted under a running writer (a new user's): every later write failed with ML-Metadata's
    "PostgreSQL metadata source error", for as long as the writer lived, since ML-Metadata keeps its dead
    connection. The writer connects again: a commit after the restart is recorded."""
    with postgres() as server:
        cmf = Cmf(filepath=server.url(db="restarted"), pipeline_name="p", store=tmp_path / "store")
        cmf.create_execution("train", execution_name="run")
        _log(cmf, "before", 3)
        assert cmf.commit_metrics("before") is not None
        server.stop()
        server.start()
        _log(cmf, "after", 4)
        assert cmf.commit_metrics("after") is not None
        cmf.close()
        sweep = Sweep(Store(tmp_path / "store", mlmd=server.url(db="restarted")), metrics_name="after")
        assert sweep.trials()["steps"].tolist() == [4] and sweep.trials()["status"].tolist() == ["COMPLETE"]


def test_a_trial_that_starts_while_the_server_is_down_is_registered_once_it_answers(tmp_path: Path) -> None:
    """A trial that started while the team's server was down failed at once (its ``get_cmf()`` raised the
    registration's error) and left no trace in the store (a new user's). The writer tries again while the
    server stays away briefly (a restart), and the trial's process waits for its registration meanwhile."""
    import threading

    from ray_cmf.client import WriterClient
    from ray_cmf.constants import TRIAL_EXECUTION_TYPE
    from ray_cmf.writer import StoreWriter

    with postgres() as server:
        url = server.url(db="late")
        writer = WriterClient(StoreWriter(Store(tmp_path / "store", mlmd=url)))
        server.stop()
        back = threading.Timer(3.0, server.start)
        back.start()
        try:
            binding = writer.call(
                StoreWriter.bind, kind="trial", name="t1", pipeline="p", stage="s", type_name=TRIAL_EXECUTION_TYPE
            )
        finally:
            back.join()  # restarted before the server is stopped for good, by the pid it then has
        assert binding.name == "t1"
        assert writer.call(StoreWriter.binding, kind="trial", name="t1") == binding
        assert [e.name for e, _ in Sweep(Store(tmp_path / "store", mlmd=url), pipeline="p").executions()] == ["t1"]


OUTAGE_SCRIPT = textwrap.dedent(
    """
    import sys
    from ray_cmf import Cmf
    cmf = Cmf(filepath=sys.argv[1], pipeline_name="p", store=sys.argv[2])
    cmf.create_execution("train", execution_name="run")
    for step in range(3):
        cmf.log_metric("s", {"step": step, "loss": 1.0 / (step + 1)})
    cmf.commit_metrics("s")
    print("committed", flush=True)
    sys.stdin.readline()  # while the server is stopped
    for step in range(3, 5):
        cmf.log_metric("s", {"step": step, "loss": 1.0 / (step + 1)})
    print("committed while down:", cmf.commit_metrics("s"), flush=True)
    """
)


def test_a_script_that_ends_while_the_server_is_down_ends_as_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cmf script that exited 0 while the team's server was down read CRASHED after ``recover`` (a new user):
    its end was only warned about, where a sweep's trials' ends are noted for ``recover``. It is noted too, and
    ``recover`` ends it COMPLETE, with every row."""
    store = tmp_path / "store"
    with postgres() as server:
        url = server.url(db="ended")
        script = subprocess.Popen(
            [sys.executable, "-c", OUTAGE_SCRIPT, url, str(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert script.stdin is not None and script.stdout is not None
        assert script.stdout.readline().strip() == "committed"
        server.stop()
        out, _ = script.communicate("go\n", timeout=120)
        assert script.returncode == 0 and "committed while down: None" in out, out
        server.start()
        monkeypatch.setenv(server.password_env, ADMIN_PASSWORD)  # the store's config holds the URL without it
        assert main(["recover", "--store", str(store)]) == 0
        [run] = Sweep(Store(store, mlmd=url), pipeline="p", metrics_name="s").trials().to_dict("records")
        assert run["status"] == "COMPLETE" and run["recovered"] and run["steps"] == 5, run


OUTAGE_DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import ray
    from ray import tune
    from ray_cmf import CmfRayLogger
    from ray_cmf.tune import get_cmf

    url, store, results, ready, go = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        cmf = get_cmf(system_metrics=None)
        for step in range(3):
            cmf.log_metric("fine", {"step": step, "x": config["lr"] * step})
            tune.report({"loss": config["lr"] / (step + 1)})
        (ready / str(config["lr"])).touch()
        while not go.exists():
            time.sleep(0.05)
        cmf.log_metric("fine", {"step": 3, "x": -1.0})  # while the server is down

    logger = CmfRayLogger("down", file_path=url, store=store, system_metrics=None, metric="loss", top_n=1)
    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.5}),
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(name="down", storage_path=results, callbacks=[logger], verbose=0),
    ).fit()
    print("trial errors:", grid.num_errors)
    """
)


def test_a_database_that_goes_down_fails_no_trial_and_loses_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The team's server stops while the trials run (a new user stopped PostgreSQL mid-sweep): every trial
    failed, with ML-Metadata's InternalError, raised in the trainable by the hand-over at its end (the
    trial's seeds, recorded through the writer); the rest of that hand-over never ran, and the writer, which
    asks the lineage which version a series extends before it spills the series' first rows, lost them all.
    Logging never fails training: the trials complete, their rows wait in the spill, and once the server is
    back ``recover`` commits every one and ends the trials as they ended (COMPLETE, not CRASHED, with their
    top-N rank, which the sweep's end could not record either)."""
    import time

    ready, go, store = tmp_path / "ready", tmp_path / "go", tmp_path / "store"
    ready.mkdir()
    with postgres() as server:
        url = server.url(db="down")
        argv = [url, str(store), str(tmp_path / "results"), str(ready), str(go)]
        driver = subprocess.Popen(
            [sys.executable, "-c", OUTAGE_DRIVER, *argv],
            env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180
            while len(list(ready.iterdir())) < 2 and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            server.stop()
            go.touch()
            out, _ = driver.communicate(timeout=180)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, 9)
                driver.wait()
        assert driver.returncode == 0 and "trial errors: 0" in out, out[-3000:]
        assert [p for p in (store / "spill").rglob("*.arrows")], out[-3000:]  # the rows wait for `recover`
        server.start()
        monkeypatch.setenv(server.password_env, ADMIN_PASSWORD)  # the store's config holds the URL without it
        assert main(["recover", "--store", str(store)]) == 0
        sweep = Sweep(Store(store, mlmd=url), pipeline="down")
        trials = sweep.trials()
        assert trials["status"].tolist() == ["COMPLETE", "COMPLETE"] and trials["recovered"].all(), trials
        ranks = trials.set_index("config/lr")[["in_top_n", "top_rank"]].to_dict(orient="index")
        assert ranks == {0.1: {"in_top_n": True, "top_rank": 1}, 0.2: {"in_top_n": False, "top_rank": None}}
        for name, steps in (("fine", [0, 1, 2, 3]), ("tune_results", [1, 2, 3])):
            rows = Sweep(Store(store, mlmd=url), pipeline="down", metrics_name=name).steps()
            assert sorted(rows.groupby("trial_id")["step"].apply(list).tolist()) == [steps, steps], (name, rows)


# -- files on an S3-compatible server (moto, on 127.0.0.1) ---------------------------------------------
BUCKET = "team-bucket"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server in this process, on a free loopback port, with fake credentials (set in the
    environment before Ray starts too, by tests/conftest.py, so that the writer actor has them)."""
    from moto.server import ThreadedMotoServer

    os.environ.update(FAKE_AWS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


def _runs(store: Path, count: int) -> None:
    for run in range(count):
        cmf = Cmf(pipeline_name="team", store=store)
        cmf.create_execution("train", execution_name=f"run-{run}")
        for step in range(20):
            cmf.log_metric("steps", {"step": step, "loss": (run + 1) / (step + 1)})
        cmf.commit_metrics("steps")
        cmf.close()


def test_push_to_s3_then_compare_and_pull_on_a_machine_without_the_files(
    s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    _runs(store, 3)
    remote = f"s3://{BUCKET}/team"
    assert main(["push", "--store", str(store), "--add-remote", remote, "--endpoint-url", s3, "--json"]) == 0
    capsys.readouterr()
    assert main(["verify", "--store", str(store), "--remote", "--json"]) == 0
    assert {row["status"] for row in json.loads(capsys.readouterr().out)} == {"ok"}

    elsewhere = tmp_path / "elsewhere"  # reaches the MLMD and the remote; holds no file
    Store(elsewhere, mlmd=str(store / "mlmd.sqlite")).set_remote(remote, s3)
    expected = Sweep(store, metrics_name="steps").steps()
    fetched = Sweep(elsewhere, metrics_name="steps").steps()
    assert fetched.equals(expected) and not (elsewhere / "artifacts").exists()  # read from the DVC cache
    capsys.readouterr()
    assert main(["verify", "--store", str(elsewhere), "--remote", "--json"]) == 0  # read "missing" (exit 1)
    assert {row["status"] for row in json.loads(capsys.readouterr().out)} == {"remote-only"}
    assert main(["pull", "--store", str(elsewhere), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4  # three series and the package list
    assert main(["verify", "--store", str(elsewhere), "--json"]) == 0


def test_a_remote_that_does_not_answer_is_one_clear_error(
    s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An S3 endpoint that is down: ``verify --remote`` and ``trials`` on a machine without the files printed
    some 80 lines of botocore and aiohttp traceback (a new user's). They say which remote failed, and how."""
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    _runs(store, 1)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    Store(elsewhere, mlmd=str(store / "mlmd.sqlite")).set_remote(f"s3://{BUCKET}/down", down)
    for command in (["verify", "--remote"], ["trials", "--metrics-name", "steps"]):
        capsys.readouterr()
        assert main([*command, "--store", str(elsewhere)]) == 2, command
        err = capsys.readouterr().err
        assert f"remote s3://{BUCKET}/down (endpoint {down}) failed" in err and "Traceback" not in err, err


def test_a_bucket_the_server_lacks_is_no_remote(s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``push --add-remote s3://missing-bucket/x`` failed with DVC's NoSuchBucket text yet replaced the remote that
    worked (a new user): the bucket was probed for an object, which a missing bucket lacks too."""
    store = tmp_path / "store"
    _runs(store, 1)
    assert main(["push", "--store", str(store), "--add-remote", str(tmp_path / "remote")]) == 0
    configs = [(store / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")]
    capsys.readouterr()
    assert main(["push", "--store", str(store), "--add-remote", "s3://missing-bucket/x", "--endpoint-url", s3]) == 2
    err = capsys.readouterr().err
    assert "has no bucket 'missing-bucket'" in err and "Hit us up" not in err, err
    assert [(store / name).read_bytes() for name in ("ray_cmf.json", ".dvc/config")] == configs


def test_verify_names_an_object_missing_from_the_remote(
    s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    store = tmp_path / "store"
    _runs(store, 2)
    assert main(["push", "--store", str(store), "--add-remote", f"s3://{BUCKET}/gone", "--endpoint-url", s3]) == 0
    [file] = [f for f in Sweep(store, metrics_name="steps").files() if f.trial_id == "run-1"]
    url = file.url  # (file.path is where reads take it: the DVC cache object)
    boto3.client("s3", endpoint_url=s3).delete_object(
        Bucket=BUCKET, Key=f"gone/files/md5/{file.md5[:2]}/{file.md5[2:]}"
    )
    capsys.readouterr()
    assert main(["verify", "--store", str(store), "--remote", "--json"]) == 1
    statuses = {row["url"]: row["status"] for row in json.loads(capsys.readouterr().out)}
    assert statuses.pop(url) == "remote-missing" and set(statuses.values()) == {"ok"}


def test_a_sweep_pushes_each_committed_file_as_it_goes(
    s3: str, ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ray import tune

    from ray_cmf import CmfRayLogger

    store = tmp_path / "store"
    Store(store).set_remote(f"s3://{BUCKET}/auto", s3)

    def trainable(config: dict) -> None:
        for it in range(5):
            tune.report({"loss": config["lr"] / (it + 1)})

    logger = CmfRayLogger("auto", store=str(store), push=True)
    run_grid(trainable, {"lr": [0.1, 0.2]}, tmp_path / "results", logger)
    files = Sweep(store, pipeline="auto").files()
    assert len(files) == 2 and all(Store(store).remote.exists(f.md5) for f in files)  # no `ray-cmf push` ran
    capsys.readouterr()
    assert main(["verify", "--store", str(store), "--remote", "--json"]) == 0  # the package list went too (it did not)
    assert {row["status"] for row in json.loads(capsys.readouterr().out)} == {"ok"}
    with pytest.raises(StoreError, match="no remote"):  # refused when it is built, before any trial starts
        CmfRayLogger("auto", store=str(tmp_path / "bare"), push=True)


def test_ml_metadata_log_lines_reach_the_terminal_only_with_verbose(pg: Postgres, tmp_path: Path) -> None:
    """ML-Metadata's C++ library prints 'I1201 ... Connecting to database' on every server connection: the
    CLI keeps them off the terminal, and shows them with -v."""
    store = tmp_path / "store"
    _one_run(pg.url("team", "team-secret", "cmf_glog"), store, 3)
    env = {k: v for k, v in os.environ.items() if k != "GLOG_minloglevel"}
    env["PGPASSWORD"] = "team-secret"
    command = [sys.executable, "-m", "ray_cmf.cli", "pipelines", "--store", str(store)]
    quiet = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    loud = subprocess.run([*command[:3], "-v", *command[3:]], env=env, capture_output=True, text=True, check=True)
    assert "pg" in quiet.stdout and "pg" in loud.stdout
    assert "Connecting to database" not in quiet.stderr and not quiet.stderr.strip()
    assert "Connecting to database" in loud.stderr


def test_tags_deletion_and_gc_on_a_team_store_and_its_s3_remote(
    pg: Postgres, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run-0 and run-1 logged the same rows (one object); run-2 other rows. A machine that holds no file tags
    a run through the database alone; deleting run-0 and run-2 then frees run-2's object, here and on S3."""
    url = pg.url("team", "team-secret", "cmf_life")
    store = tmp_path / "store"
    for run, rows in enumerate((5, 5, 7)):
        cmf = Cmf(filepath=url, pipeline_name="pg", store=store)
        cmf.create_execution("train", execution_name=f"run-{run}")
        _log(cmf, "steps", rows)
        cmf.commit_metrics("steps")
        cmf.close()
    assert main(["push", "--store", str(store), "--add-remote", f"s3://{BUCKET}/life", "--endpoint-url", s3]) == 0
    monkeypatch.setenv(pg.password_env, "team-secret")
    elsewhere = tmp_path / "elsewhere"
    Store(elsewhere, mlmd=url).set_remote(f"s3://{BUCKET}/life", s3)  # its config: the database and the remote
    assert main(["tag", "run-1", "team=vision", "--store", str(elsewhere), "--metrics-name", "steps"]) == 0
    assert main(["note", "run-1", "the baseline", "--store", str(elsewhere), "--metrics-name", "steps"]) == 0
    assert main(["delete", "run-0", "run-2", "--store", str(elsewhere), "--metrics-name", "steps", "--yes"]) == 0
    capsys.readouterr()

    files = {f.trial_id: f for f in Sweep(store, metrics_name="steps", include_deleted=True).files()}
    remote = Store(store).require_remote()
    assert main(["gc", "--store", str(store), "--remote", "--json"]) == 0
    freed = json.loads(capsys.readouterr().out)
    assert freed["freed_trials"] == [{"pipeline": "pg", "trial_id": "run-2"}]
    assert freed["files"] == 1 and freed["kept_shared"] == 1  # run-0: shared
    assert freed["remote_objects"] == 1 and not remote.exists(files["run-2"].md5) and remote.exists(files["run-1"].md5)
    assert not files["run-2"].path.exists() and files["run-1"].path.exists()
    assert main(["verify", "--store", str(store), "--remote"]) == 0
    [row] = Sweep(elsewhere, metrics_name="steps").trials().to_dict(orient="records")
    assert row["trial_id"] == "run-1" and row["tag/team"] == "vision" and row["note"] == "the baseline"
    assert row["steps"] == 5  # read from the remote by md5: this machine holds no file


def test_a_store_that_kept_copies_of_what_gc_freed_elsewhere_frees_them(
    pg: Postgres, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc run on another machine frees a deleted trial's objects on the remote, but the store that wrote the
    files keeps its copies, which its next push sent back for good, since its own gc found nothing to free (a
    new user's). A gc there frees its copies, and their objects on the remote again."""
    url = pg.url("team", "team-secret", "cmf_gc_elsewhere")
    store = tmp_path / "store"
    for run in range(2):
        cmf = Cmf(filepath=url, pipeline_name="pg", store=store)
        cmf.create_execution("train", execution_name=f"run-{run}")
        _log(cmf, "steps", 5 + run)
        cmf.commit_metrics("steps")
        cmf.close()
    assert main(["push", "--store", str(store), "--add-remote", f"s3://{BUCKET}/gcx", "--endpoint-url", s3]) == 0
    monkeypatch.setenv(pg.password_env, "team-secret")
    elsewhere = tmp_path / "elsewhere"
    Store(elsewhere, mlmd=url).set_remote(f"s3://{BUCKET}/gcx", s3)
    assert main(["delete", "run-1", "--store", str(elsewhere), "--metrics-name", "steps", "--yes"]) == 0
    files = {f.trial_id: f for f in Sweep(store, metrics_name="steps", include_deleted=True).files()}
    remote, kept = Store(store).require_remote(), store / files["run-1"].url
    assert main(["gc", "--store", str(elsewhere), "--remote"]) == 0
    assert not remote.exists(files["run-1"].md5) and kept.is_file()  # its copy stays in the store that wrote it
    assert main(["push", "--store", str(store)]) == 0 and remote.exists(files["run-1"].md5)  # sent back
    capsys.readouterr()
    assert main(["gc", "--store", str(store), "--remote", "--json"]) == 0
    freed = json.loads(capsys.readouterr().out)
    assert freed["files"] == 1 and freed["remote_objects"] == 1, freed
    assert not kept.exists() and not remote.exists(files["run-1"].md5) and remote.exists(files["run-0"].md5)
    assert main(["verify", "--store", str(store), "--remote"]) == 0


@pytest.mark.parametrize("password", ["abc def", "a\\b", "it's", "p@ss:w/o?r#d%x&y z'\\"])
def test_a_password_with_spaces_quotes_or_backslashes_logs_in(
    pg: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str
) -> None:
    """``abc def`` (psql takes it) never logged in: ML-Metadata puts the password into libpq's connection
    string unquoted, so a space ended it and a backslash escaped what followed; the error then blamed the
    password or pg_hba.conf (a re-check by a new user). It logs in, from the URL percent-encoded and from
    PGPASSWORD alike."""
    from urllib.parse import quote

    role = f"odd{abs(hash(password)) % 10_000}"
    pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password.replace(chr(39), chr(39) * 2)}' CREATEDB")
    url = f"postgresql://{role}:{quote(password, safe='')}@127.0.0.1:{pg.port}/cmf_{role}"
    _one_run(url, tmp_path / "store", 2)
    monkeypatch.setenv("PGPASSWORD", password)
    _one_run(f"postgresql://{role}@127.0.0.1:{pg.port}/cmf_{role}", tmp_path / "store", 3)  # the run again
    assert pg.execution_names(f"cmf_{role}") == ["run-1"]


def test_a_login_without_a_password_and_one_without_grants_say_what_to_do(
    pg: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No password anywhere read like a wrong one ("check the password"), and a colleague whose user may not
    use the tables another user made got "see the server's message" over ML-Metadata's SQL (a re-check by a
    new user). Each now says which it is, the second with the grants its owner gives."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(StoreError, match="turned down user 'team': no password was given"):
        Cmf(filepath=f"postgresql://team@127.0.0.1:{pg.port}/cmf_grants", pipeline_name="pg", store=tmp_path / "a")
    _one_run(pg.url("team", "team-secret", "cmf_grants"), tmp_path / "team", 1)
    with pytest.raises(
        StoreError, match=r"user 'reader' may not use the tables .*GRANT ALL ON SCHEMA public TO reader"
    ):
        _one_run(pg.url("reader", "reader-secret", "cmf_grants"), tmp_path / "reader", 1)


def test_a_duplicate_key_from_another_writer_is_an_answer_not_a_lost_server(pg: Postgres, tmp_path: Path) -> None:
    """Two writers of one database record the same node at once (two drivers' identical package lists, say):
    the later insert fails on the unique key, and ML-Metadata's message says "PostgreSQL metadata source
    error", as it says of a lost connection. It was read as one: the writer connected to the server again and
    ran the call once more, and a registration was run again from its start, counting the trial's attempt
    twice. It is the server's answer, and the caller's to take (by reading the node the other writer made)."""
    from ml_metadata.proto import metadata_store_pb2 as mlpb

    url = pg.url("team", "team-secret", "cmf_duplicate")
    first, second = (Store(tmp_path / name, mlmd=url) for name in ("first", "second"))
    node = mlpb.Artifact(type_id=first.lineage.type_id("artifact", "Dataset"), name="data:8d77", uri="data")
    first.lineage.store.put_artifacts([node])
    connection = second.lineage.store._store  # the writer's connection to the server
    with pytest.raises(Exception, match="metadata source error") as raised:
        second.lineage.store.put_artifacts([node])
    assert not lineage_away(raised.value)
    assert second.lineage.store._store is connection  # answered on the connection it has: not connected again
