"""Where an MLMD database is: a SQLite file, or a PostgreSQL or MySQL server named by a URL.

``postgresql://user[:password]@host[:port]/database`` and ``mysql://user[:password]@host[:port]/database``.
A password not in the URL comes from the environment at run time, never from a file of ours:
``PGPASSWORD`` or ``~/.pgpass`` (``PGPASSFILE``) for PostgreSQL, ``MYSQL_PWD`` for MySQL. Locations
that are written to disk (the store's config file, logs, MLMD properties) go through
:func:`without_password`. ML-Metadata creates a missing database when the user may.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf.errors import StoreError

POSTGRES_SCHEMES = ("postgresql", "postgres")
URL_SCHEMES = (*POSTGRES_SCHEMES, "mysql")


def scheme_of(location: str) -> str:
    """A location's URL scheme in lower case, as URLs read in any case (``""`` where it has none)."""
    return location.split("://", 1)[0].lower() if "://" in location else ""


def is_url(location: str) -> bool:
    """Whether an MLMD location names a database server (else it is a SQLite file path)."""
    return scheme_of(location) in URL_SCHEMES


def without_password(location: str) -> str:
    """A location fit to write down: a URL's password removed, and its query (``?password=...``) too, however
    the URL is written (a password it did not percent-encode may hold ``@``, ``/``, ``?`` or ``#``: the user
    part ends at the last ``@``)."""
    if not is_url(location):
        return location
    userinfo, at, place = _user_part(location)
    place = re.split(r"[?#]", place, maxsplit=1)[0]
    if not at:  # no user part: a ':' that is no port's may be a password whose '@' is missing
        host, colon, port = place.partition("/")[0].partition(":")
        place = place if not colon or port.isdigit() else f"{host}:…{place[len(host) + 1 + len(port) :]}"
    return f"{scheme_of(location)}://{userinfo.split(':', 1)[0]}{at}{place}"


def _user_part(location: str) -> tuple[str, str, str]:
    """A URL's text after ``scheme://`` split at its last ``@``: the user part, the ``@`` (or ``""`` where it has
    none) and the rest (host, port, database and any query), however its password was written."""
    return location.split("://", 1)[1].rpartition("@")


def _password_variable(scheme: str) -> str:
    """The environment variable a password is read from for a server of ``scheme`` (in lower case)."""
    return "MYSQL_PWD" if scheme == "mysql" else "PGPASSWORD"


def _pgpassfile() -> Path:
    """PostgreSQL's password file, as libpq finds it."""
    return Path(os.environ.get("PGPASSFILE", str(Path.home() / ".pgpass")))


def _refuse_unencoded(location: str) -> None:
    """Refuse a URL whose user or password holds what a URL must percent-encode: it would be read as another
    host, port or database (and its password be shown where those are)."""
    if any(char in _user_part(location)[0] for char in "@/?#"):
        variable = _password_variable(scheme_of(location))
        raise StoreError(
            f"MLMD URL {without_password(location)!r}: its user or password holds @, /, ? or #, which a URL must "
            f"percent-encode (urllib.parse.quote(password, safe='')); or leave the password out and set {variable}"
        )


def database_of(location: str) -> str:
    """Which database a location names, whoever connects: a SQLite file's path, or a server URL's kind, host,
    port (its default filled in) and database, without user or password."""
    if not is_url(location):
        return location
    url = urlsplit(location)
    postgres = url.scheme in POSTGRES_SCHEMES
    port = url.port or (5432 if postgres else 3306)
    return f"{'postgresql' if postgres else url.scheme}://{url.hostname}:{port}/{url.path.lstrip('/')}"


def connection_config(location: str, *, readonly: bool = False) -> mlpb.ConnectionConfig:
    """The ML-Metadata connection for a SQLite path or a server URL (``readonly`` applies to SQLite)."""
    config = mlpb.ConnectionConfig()
    if not is_url(location):
        config.sqlite.filename_uri = location
        config.sqlite.connection_mode = (
            mlpb.SqliteMetadataSourceConfig.READONLY
            if readonly
            else mlpb.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        )
        return config
    _refuse_unencoded(location)
    url = urlsplit(location)
    database = url.path.lstrip("/")
    if url.query or url.fragment:
        variable = _password_variable(url.scheme)
        raise StoreError(
            f"MLMD URL {without_password(location)!r} takes no query (?...): ray_cmf reads its user, password, host, "
            f"port and database; give the password in the URL or in {variable}"
        )
    if not url.hostname or not database or "/" in database or not _port_is_number(url):
        raise StoreError(
            f"MLMD URL {without_password(location)!r} must look like "
            f"{url.scheme}://user[:password]@host[:port]/database"
        )
    user, password = unquote(url.username or ""), unquote(url.password or "")
    if url.scheme in POSTGRES_SCHEMES:
        pg = config.postgresql
        pg.host, pg.port, pg.dbname, pg.user = url.hostname, str(url.port or 5432), database, _libpq_value(user)
        password = password or os.environ.get("PGPASSWORD", "")
        if password:
            pg.password = _libpq_value(password)
        elif (passfile := _pgpassfile()).is_file():
            pg.passfile = _libpq_value(str(passfile))
    else:
        my = config.mysql
        my.host, my.port, my.database, my.user = url.hostname, url.port or 3306, database, user
        my.password = password or os.environ.get("MYSQL_PWD", "")
    return config


def _libpq_value(value: str) -> str:
    """``value`` quoted for libpq's connection string, which ML-Metadata builds by pasting each setting in as
    it is: unquoted, a space would end a password, and a backslash escape the character after it."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _port_is_number(url: SplitResult) -> bool:
    """Whether the URL's port, where it gives one, is a number (urllib raises on reading one that is not)."""
    try:
        return url.port is None or url.port >= 0
    except ValueError:  # "Port could not be cast to integer value as ..."
        return False


def explain(location: str, error: Exception) -> str:
    """What went wrong opening an MLMD database, and what to do about it.

    ML-Metadata reports a refused connection only as "connection pointer is NULL" (PostgreSQL: libpq's
    reason goes to its log) or an empty "mysql_real_connect failed", so a server location is probed: a
    port that does not answer is reported as such, one that answers means the server turned the login down.
    """
    text = str(error).strip()
    where = without_password(location)
    if not is_url(location):
        return (
            f"Cannot open the MLMD database {where}: {text}. "
            "Is it a valid ML-Metadata SQLite file that this user may write?"
        )
    lowered = text.lower()
    url = urlsplit(location)
    postgres = url.scheme in POSTGRES_SCHEMES
    refused = ("connection pointer is null", "mysql_real_connect failed", "access denied", "authentication")
    if any(s in lowered for s in ("permission denied to create database", "does not exist", "creating database")):
        database = url.path.lstrip("/")
        hint = f"the database {database!r} does not exist: create the database, or let this user create databases"
    elif not _answers(url.hostname or "", port := url.port or (5432 if postgres else 3306)):
        hint = f"nothing answers on {url.hostname}:{port}: is the server running, and does it listen there?"
    elif "permission denied for schema" in lowered:  # PostgreSQL 15 and later: public is its owner's alone
        hint = (
            f"user {url.username!r} may not use the tables of this database, which another user made: its owner "
            f"grants them (GRANT ALL ON SCHEMA public TO {url.username}; GRANT ALL ON ALL TABLES IN SCHEMA public "
            f"TO {url.username}; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {url.username};)"
        )
    elif any(s in lowered for s in refused):
        where_password = "PGPASSWORD or ~/.pgpass" if postgres else "MYSQL_PWD"
        where_hosts = "pg_hba.conf" if postgres else "the user's host in its grants"
        check = "check the password" if _password_given(url) else "no password was given"
        hint = (
            f"the server turned down user {url.username!r}: {check} (in the URL, or {where_password}) "
            f"and that the server lets this host in ({where_hosts})"
        )
    else:
        hint = "see the server's message"
    return f"Cannot open the MLMD database {where}: {hint} ({text})"


def _password_given(url: SplitResult) -> bool:
    """Whether a login had a password: in the URL, the environment, or (PostgreSQL) a password file."""
    given = bool(url.password or os.environ.get(_password_variable(url.scheme)))
    return given or (url.scheme in POSTGRES_SCHEMES and _pgpassfile().is_file())


def _answers(host: str, port: int) -> bool:
    """Whether a TCP server accepts connections at host:port (within 3 seconds)."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False
