"""Nothing leaves the store: names that could escape it are refused, and symlinks out of it are not followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ray_cmf import Cmf, InvalidNameError, Store
from ray_cmf.audit import audit
from ray_cmf.cli import main
from ray_cmf.lineage import properties

ESCAPES = ["/etc/passwd", "..", "../outside", "a/b", "a\\b", "nul\x00byte", "C:evil", ".", ""]


@pytest.mark.parametrize("bad", ESCAPES, ids=repr)
def test_names_that_could_leave_the_store_are_refused(tmp_path: Path, bad: str) -> None:
    store = tmp_path / "store"
    with pytest.raises(InvalidNameError):
        Cmf(pipeline_name=bad, store=store)
    cmf = Cmf(pipeline_name="p", store=store)
    with pytest.raises(InvalidNameError):
        cmf.create_context(bad)
    with pytest.raises(InvalidNameError):
        cmf.log_metric(bad, {"x": 1})
    cmf.create_context("stage")
    with pytest.raises(InvalidNameError):
        cmf.create_execution("Train", execution_name=bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # nothing was created beside the store


def _committed(tmp_path: Path) -> tuple[Store, Path]:
    cmf = Cmf(pipeline_name="p", store=tmp_path / "store")
    cmf.create_execution("Train")
    cmf.log_metric("train", {"step": 1})
    artifact = cmf.commit_metrics("train")
    return cmf.store, cmf.store.resolve(properties(artifact)["url"])


def test_verify_and_compare_do_not_follow_a_symlink_out_of_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, path = _committed(tmp_path)
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(path.read_bytes())  # the same bytes: only the link itself is wrong
    path.unlink()
    path.symlink_to(outside)
    statuses = {f.url: f.status for f in audit(store)}
    assert statuses.pop(store.url(path)) == "symlink-out" and set(statuses.values()) == {"ok"}  # the package list
    assert main(["verify", "--store", str(store.root), "--json"]) == 1
    assert "symlink-out" in capsys.readouterr().out

    from ray_cmf.compare import Sweep

    assert Sweep(store, pipeline="p", metrics_name="train").files() == []


def test_store_files_follow_the_umask_and_none_is_world_writable(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store, _ = _committed(tmp_path)
    finally:
        os.umask(old)
    for path in [store.root, *store.root.rglob("*")]:
        assert not path.lstat().st_mode & stat.S_IWOTH, path


SECRETS = ("hunter2", "s3cr3t-pw", "sk-abc123", "tok-xyz789", "ghp_0123456789")


def test_a_secret_on_the_command_line_never_reaches_the_store(tmp_path: Path) -> None:
    """cmflib records the command line of the script; credentials in it are redacted before they reach MLMD."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from ray_cmf import Cmf
            cmf = Cmf(pipeline_name="p", store=sys.argv[-1])
            cmf.log_metric("m", {"x": 1})
            cmf.commit_metrics("m")
            print(cmf.execution.custom_properties["Execution"].string_value)
            """
        )
    )
    argv = [
        "--password", "hunter2",
        "--db=postgresql://alice:s3cr3t-pw@db.example.com/mlmd",
        "--api-key=sk-abc123",
        "HF_TOKEN=tok-xyz789",
        "--github_token", "ghp_0123456789",
        "--lr", "0.1",
        "--store", str(tmp_path / "store"),
    ]  # fmt: skip
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, check=True)
    recorded = done.stdout.strip()
    assert "--lr 0.1" in recorded and "postgresql://alice:***@db.example.com/mlmd" in recorded
    assert recorded.count("***") == 5
    for path in (tmp_path / "store").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in SECRETS if s.encode() in data], path


@given(st.text(alphabet="xyz@:/?#%&= Z", min_size=1, max_size=12))  # no hex digit: "%" stays a "%"
@example("hunter2/xyz")  # a new user's URLs, the password not percent-encoded
@example("hunter2#xyz")
@example("b@b:p/w%#?&x")
def test_a_password_a_url_did_not_percent_encode_is_in_no_error_or_file(password: str) -> None:
    """``postgresql://bob:hunter2/xyz@host/db``: the URL could not be parsed as meant, and the error quoted it,
    password and all ("MLMD URL 'postgresql://bob:hunter2/xyz@...' must look like ..."), or a part of it
    ("... 'postgresql://bob:hunter2' takes no query"), or failed inside urllib naming a piece of it (a new
    user). What ray_cmf writes down of a URL holds no password however it is written, and a URL whose
    password needs percent-encoding is refused, saying so."""
    from ray_cmf.connection import _libpq_value, connection_config, without_password
    from ray_cmf.errors import StoreError

    secret = f"SECRETpw{password}"
    url = f"postgresql://bob:{secret}@127.0.0.1:55432/mlmd"
    assert "SECRETpw" not in without_password(url) and without_password(url).startswith("postgresql://bob@127.0.0.1")
    try:
        config = connection_config(url)
    except StoreError as refused:
        assert "SECRETpw" not in str(refused) and "percent-encode" in str(refused), str(refused)
    else:  # only where the URL reads as meant
        assert config.postgresql.password == _libpq_value(secret) and config.postgresql.host == "127.0.0.1"


def test_an_error_names_the_default_port_of_a_url_that_gives_none() -> None:
    from ray_cmf.connection import explain

    said = explain("postgresql://alice@127.0.0.1/mlmd", RuntimeError("connection pointer is NULL"))
    assert "None" not in said and ("127.0.0.1:5432" in said or "turned down" in said), said


def test_a_store_whose_server_does_not_answer_says_so_not_that_its_database_moved(tmp_path: Path) -> None:
    """A store whose ``ray_cmf.json`` names a PostgreSQL server, read while the server is down (or with a wrong
    password): every such failure read "No MLMD database at ...: if the database was moved, give its path"
    (a new user's team store). The reader says what the server did, as opening it by its URL does."""
    import json

    from ray_cmf import Sweep
    from ray_cmf.errors import StoreError
    from tests._servers import free_port

    store = tmp_path / "store"
    store.mkdir()
    (store / "ray_cmf.json").write_text(json.dumps({"mlmd": f"postgresql://bob@127.0.0.1:{free_port()}/mlmd"}))
    with pytest.raises(StoreError) as refused:
        Sweep(store)
    assert "nothing answers on 127.0.0.1" in str(refused.value) and "moved" not in str(refused.value)


def test_a_colleague_who_opens_a_store_as_another_user_leaves_its_recorded_server_as_it_was(tmp_path: Path) -> None:
    """Bob opened alice's store with his own user for the same database: its ``ray_cmf.json`` was rewritten to
    name bob, and alice's reads from the store directory then logged in as bob and were turned down (a new
    user's team store). The store keeps the URL it recorded; another database is still refused."""
    import json

    from ray_cmf.errors import StoreError

    root = tmp_path / "store"
    Store(root, mlmd="postgresql://alice:pw@127.0.0.1:55432/mlmd").dvc  # noqa: B018  # records where its MLMD is
    Store(root, mlmd="postgresql://bob:pw@127.0.0.1:55432/mlmd").dvc  # noqa: B018
    assert json.loads((root / "ray_cmf.json").read_text())["mlmd"] == "postgresql://alice@127.0.0.1:55432/mlmd"
    with pytest.raises(StoreError, match="keeps its lineage in postgresql://alice@"):
        Store(root, mlmd="postgresql://bob:pw@127.0.0.1:55432/other")._check_mlmd()


@pytest.mark.parametrize("scheme", ["POSTGRESQL", "Postgres", "MySQL"])
def test_a_url_whose_scheme_is_in_capitals_is_a_server_and_its_password_stays_out_of_files(
    tmp_path: Path, scheme: str
) -> None:
    """``POSTGRESQL://alice:pw@host/db`` was taken for a SQLite file's path: the runs went to a local file made
    under a directory named after the URL, password and all, and ``ray_cmf.json`` recorded it (a re-check by a
    new user). A URL's scheme reads in any case, as URLs' do."""
    from ray_cmf.connection import _libpq_value, connection_config, is_url, without_password

    url = f"{scheme}://alice:SECRETpw@127.0.0.1:5/mlmd"
    assert is_url(url) and "SECRETpw" not in without_password(url)
    config = connection_config(url)
    server = config.mysql if scheme == "MySQL" else config.postgresql
    assert (server.host, server.password) == (
        "127.0.0.1",
        "SECRETpw" if scheme == "MySQL" else _libpq_value("SECRETpw"),
    )
    Store(tmp_path / "store", mlmd=url).dvc  # noqa: B018  # records where its MLMD is
    assert "SECRETpw" not in (tmp_path / "store" / "ray_cmf.json").read_text()
