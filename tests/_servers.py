"""Real database servers for the tests, started on 127.0.0.1 and stopped by the pid the test started.

PostgreSQL: Debian's ``postgresql`` package (``.ci/run`` installs it when missing). The server runs as the
``postgres`` user (it refuses root) from a fresh ``initdb`` in a temporary directory, on a free port, with
password (scram) authentication over TCP only.

MySQL: Debian's ``mariadb-server`` package (``.ci/run`` installs it when missing), from a fresh
``mariadb-install-db`` in a temporary directory, run as the ``mysql`` user on a free port of 127.0.0.1.
Both give the tests a ``team`` user that may create databases and a ``reader`` user that may not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ADMIN_PASSWORD = "admin-secret"
# Credentials for moto's S3 server on 127.0.0.1; no test reaches AWS.
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def postgres_bin() -> Path | None:
    """The directory of Debian's PostgreSQL server binaries, if installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


def postgres_skip_reason() -> str | None:
    if postgres_bin() is None:
        return "PostgreSQL server binaries are missing (.ci/run installs Debian's postgresql)"
    if os.geteuid() != 0:
        return "starting PostgreSQL as the postgres user needs root"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user on this machine"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Postgres:
    """A running server: ``url(user, password, db)`` builds the MLMD URLs the tests use; ``stop()`` and
    ``start()`` take it down and bring it back on its data (an outage)."""

    scheme = "postgresql"
    password_env = "PGPASSWORD"
    port: int
    bin: Path
    data: Path  # the directory of its data, socket and log
    process: subprocess.Popen[bytes] | None = None  # while started

    def start(self) -> None:
        """Start the server on its data and port, as the postgres user, and wait until it answers."""
        self.process = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data / "pgdata"),
                "-p",
                str(self.port),
                "-k",
                str(self.data / "pgsock"),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=100",
            ],
            user="postgres",
            group="postgres",
            stdout=subprocess.DEVNULL,
            stderr=open(self.data / "postgres.log", "ab"),  # noqa: SIM115 (the server keeps it open)
        )
        _wait_until_ready(self.process, lambda: self.sql("SELECT 1"), self.data / "postgres.log")

    def stop(self) -> None:
        """A fast shutdown (SIGINT) of the server started here, by its pid; SIGKILL after 30 s."""
        if self.process is not None:
            _stop(self.process, signal.SIGINT)

    def url(self, user: str = "postgres", password: str | None = ADMIN_PASSWORD, db: str = "mlmd") -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{db}"

    def sql(self, statement: str, db: str = "postgres") -> str:
        """Run one statement as the admin (psql over TCP, with the password from the environment)."""
        done = subprocess.run(
            [
                str(self.bin / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                db,
                "-tAc",
                statement,
            ],
            env={**os.environ, "PGPASSWORD": ADMIN_PASSWORD},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    def has_database(self, name: str) -> bool:
        return self.sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") == "1"

    def execution_names(self, db: str) -> list[str]:
        """The names of the executions in the MLMD database ``db``, sorted."""
        return self.sql("SELECT name FROM execution ORDER BY name", db=db).split()


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """Start PostgreSQL in a fresh directory and stop it (SIGINT, a fast shutdown, then SIGKILL, to the pid
    started here). The directory is under /tmp itself: the postgres user cannot enter pytest's tmp dirs."""
    binaries = postgres_bin()
    assert binaries is not None
    tmp = Path(tempfile.mkdtemp(prefix="ray_cmf_pg_"))
    data, sockets = tmp / "pgdata", tmp / "pgsock"
    for directory in (tmp, sockets):
        directory.mkdir(parents=True, exist_ok=True)
        shutil.chown(directory, "postgres", "postgres")
    pwfile = tmp / "pw"
    pwfile.write_text(ADMIN_PASSWORD)
    shutil.chown(pwfile, "postgres", "postgres")
    subprocess.run(
        [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256", f"--pwfile={pwfile}"],
        user="postgres",
        group="postgres",
        check=True,
        capture_output=True,
    )
    server = Postgres(free_port(), binaries, tmp)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _running(process: subprocess.Popen[bytes], ready: Callable[[], object], log: Path, stop: int) -> Iterator[None]:
    """Wait (up to 60 s) until ``ready()`` stops raising, then yield; in the end stop the server by the pid
    started here (``stop``, then SIGKILL after 30 s)."""
    try:
        _wait_until_ready(process, ready, log)
        yield
    finally:
        _stop(process, stop)


def _wait_until_ready(process: subprocess.Popen[bytes], ready: Callable[[], object], log: Path) -> None:
    """Wait (up to 60 s) until ``ready()`` stops raising; an error with the server's log if it never does."""
    deadline = time.monotonic() + 60
    while True:
        try:
            ready()
            return
        except subprocess.CalledProcessError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{process.args[0]} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes], signum: int) -> None:
    """Stop a server started here by its pid (``signum``, then SIGKILL after 30 s)."""
    process.send_signal(signum)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def mariadb_skip_reason() -> str | None:
    if shutil.which("mariadbd", path="/usr/sbin:/usr/bin") is None or shutil.which("mariadb-install-db") is None:
        return "the MariaDB server is missing (.ci/run installs Debian's mariadb-server)"
    if os.geteuid() != 0:
        return "starting MariaDB as the mysql user needs root"
    return None


@dataclass
class MariaDB:
    """A running MariaDB server, the MySQL that ML-Metadata's ``mysql://`` URLs reach."""

    scheme = "mysql"
    password_env = "MYSQL_PWD"
    port: int
    process: subprocess.Popen[bytes]

    def url(self, user: str, password: str | None, db: str = "mlmd") -> str:
        secret = f":{password}" if password else ""
        return f"mysql://{user}{secret}@127.0.0.1:{self.port}/{db}"

    def sql(self, statement: str) -> str:
        """Run one statement as the server's root (no password, over TCP on 127.0.0.1)."""
        command = ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(self.port), "-u", "root", "-N", "-e"]
        return subprocess.run([*command, statement], capture_output=True, text=True, check=True).stdout.strip()

    def has_database(self, name: str) -> bool:
        return self.sql(f"SHOW DATABASES LIKE '{name}'") == name

    def execution_names(self, db: str) -> list[str]:
        """The names of the executions in the MLMD database ``db``, sorted."""
        return self.sql(f"SELECT name FROM `{db}`.Execution ORDER BY name").split()


INSTALL = (
    "mariadb-install-db",
    "--no-defaults",
    "--user=mysql",
    "--skip-test-db",
    "--auth-root-authentication-method=normal",
)
SERVE = ("/usr/sbin/mariadbd", "--no-defaults", "--user=mysql", "--bind-address=127.0.0.1", "--skip-name-resolve")


@contextlib.contextmanager
def mariadb() -> Iterator[MariaDB]:
    """Start MariaDB in a fresh directory and stop it (SIGTERM, then SIGKILL, to the pid started here)."""
    tmp = Path(tempfile.mkdtemp(prefix="ray_cmf_maria_"))
    shutil.chown(tmp, "mysql", "mysql")
    data = tmp / "data"
    subprocess.run(
        [*INSTALL, f"--datadir={data}"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    process = subprocess.Popen(
        [*SERVE, f"--datadir={data}", f"--port={port}", f"--socket={tmp / 'sock'}", f"--pid-file={tmp / 'pid'}"],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "mariadb.log", "wb"),  # noqa: SIM115 (the server keeps it open)
    )
    server = MariaDB(port, process)
    with _running(process, lambda: server.sql("SELECT 1"), tmp / "mariadb.log", signal.SIGTERM):
        server.sql("CREATE USER 'team'@'127.0.0.1' IDENTIFIED BY 'team-secret'")
        server.sql("GRANT ALL PRIVILEGES ON *.* TO 'team'@'127.0.0.1'")
        server.sql("CREATE USER 'reader'@'127.0.0.1' IDENTIFIED BY 'reader-secret'")
        yield server
    shutil.rmtree(tmp, ignore_errors=True)
