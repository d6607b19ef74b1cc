"""Store: one directory holding the MLMD database, the DVC repo and the artifacts.

Every write to MLMD and DVC goes through one :class:`Store` object, owned by the store's single writer
(:mod:`ray_cmf.writer`). Its methods take and return plain, picklable values (names, ids, protos,
:class:`FinishedFile`). A Store pickles to its location only, so it also serves as the store's name in
requests to the writer: nothing is opened until a method needs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ray_cmf._atomic import file_in_the_way, write_bytes, write_text
from ray_cmf._names import check_name, what_exists
from ray_cmf.connection import database_of, is_url, without_password
from ray_cmf.constants import (
    ARTIFACTS_DIR,
    ATTEMPT_PROPERTY,
    DEFAULT_STORE,
    ENV_STORE,
    ENVIRONMENT_TYPE,
    ENVIRONMENTS_DIR,
    ERROR_PROPERTY,
    EXECUTION_METRICS_TYPE,
    MLMD_FILE,
    PENDING_ENDS_DIR,
    SPILL_DIR,
    STEP_METRICS_TYPE,
    STORE_CONFIG,
    STORE_LOCK,
    VALUES_JSON,
)
from ray_cmf.environment import Environment
from ray_cmf.errors import InvalidArgumentError, MetricsNotFoundError, StoreError
from ray_cmf.exits import holder
from ray_cmf.lineage import Artifact, Context, Execution, Lineage, Output, collected, config_json, properties
from ray_cmf.remote import Remote
from ray_cmf.series_format import FinishedFile, Spill
from ray_cmf.versioning import DvcRepo, cache_path, file_md5, tree_md5

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _real(root: Path) -> Path:
    """Where a store root really is (symlinks resolved), once per root: every file read checks against it."""
    return root.resolve()


def resolve_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The store directory: the argument, else ``$RAY_CMF_STORE``, else ``./cmf_store``. An empty path is refused:
    it would be the current directory, where a store would be made or read without a word."""
    named, given = ("store", root) if root is not None else (f"${ENV_STORE}", os.environ.get(ENV_STORE, DEFAULT_STORE))
    if not os.fspath(given):
        raise InvalidArgumentError(f"{named}: an empty path; name the store's directory (default ./{DEFAULT_STORE})")
    return Path(given).absolute()


def _location(mlmd: str | os.PathLike[str]) -> str:
    """An MLMD location as the writer must see it: a URL as given, a SQLite path made absolute."""
    text = os.fspath(mlmd)
    return text if is_url(text) else os.path.normpath(Path(text).absolute())


class Store:
    """The embedded store and its single writer. Created on first use; needs no init and no remote.

    Args:
        root: Store directory (default: ``$RAY_CMF_STORE`` or ``./cmf_store``).
        mlmd: MLMD database: a SQLite path, or a ``postgresql://`` or ``mysql://`` URL (see
            :mod:`ray_cmf.connection`; default: ``<root>/mlmd.sqlite``).
        scm: Initialise the DVC repo with git instead of ``--no-scm``.

    Example:
        >>> import tempfile
        >>> store = Store(tempfile.mkdtemp())
        >>> store.pipeline("demo").name
        'demo'
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        mlmd: str | os.PathLike[str] | None = None,
        scm: bool = False,
    ) -> None:
        self.root = resolve_root(root)
        self._mlmd = _location(mlmd) if mlmd is not None else None  # else read from the store, on first use
        self.scm = scm
        self._lineage: Lineage | None = None
        self._dvc: DvcRepo | None = None
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle only the location; connections reopen lazily where the object lands. An MLMD location not
        read yet stays unread: a worker that names the store sends its path, and the writer, where the store
        is, reads the store's config file."""
        return {"root": self.root, "mlmd": self._mlmd, "scm": self.scm}

    @property
    def mlmd(self) -> str:
        """The MLMD database: as given, else the one the store's config file names, else ``<root>/mlmd.sqlite``
        (read on first use, on the machine that uses it)."""
        if self._mlmd is None:
            self._mlmd = self._configured_mlmd()
        return self._mlmd

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], mlmd=state["mlmd"], scm=state["scm"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Store) and (self.root, self.mlmd) == (other.root, other.mlmd)

    def __hash__(self) -> int:
        return hash((self.root, self.mlmd))

    # -- the store's config file ----------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        config = self.root / STORE_CONFIG
        return dict(json.loads(config.read_text())) if config.is_file() else {}

    def _write_config(self, **entries: Any) -> None:
        """Merge entries into the config file (never a password: callers pass what may be written down)."""
        config = self._config()
        if all(config.get(k) == v for k, v in entries.items()):
            return
        write_text(self.root / STORE_CONFIG, json.dumps({**config, **entries}, indent=2) + "\n")

    def _configured_mlmd(self) -> str:
        """Where the store's config file says its MLMD is (cmflib's ``filepath``), else ``<root>/mlmd.sqlite``."""
        return self._kept_mlmd() or str(self.root / MLMD_FILE)

    def _kept_mlmd(self) -> str | None:
        """The MLMD the config file names: a URL, or a SQLite file, relative to the store directory when it
        was recorded beside it (an absolute path when it was recorded elsewhere, or by an earlier version)."""
        kept = self._config().get("mlmd")
        if not kept or is_url(kept):
            return kept or None
        return os.path.normpath(self.root / kept)

    def _record_config(self) -> None:
        """Record an MLMD kept outside the store in its config file (never a password), so every tool finds
        it from the store directory alone. A SQLite file in the directory that holds the store (cmflib's
        ``Cmf(filepath="mlmd")`` beside ``./cmf_store``) is recorded relative to the store: a copy of the
        project then records into its own copy of the database, and a moved one finds its own. A server URL
        already recorded stays as it is when another user opens the same database (the store's owner reads as
        that user)."""
        if self.mlmd == str(self.root / MLMD_FILE):
            return
        kept = self._kept_mlmd()
        if is_url(self.mlmd) and kept is not None and database_of(kept) == database_of(self.mlmd):
            return
        if not is_url(self.mlmd) and Path(self.mlmd).is_relative_to(self.root.parent):
            self._write_config(mlmd=os.path.relpath(self.mlmd, self.root))
        else:
            self._write_config(mlmd=without_password(self.mlmd))

    def _check_mlmd(self) -> None:
        """Refuse to write a store's runs into another MLMD than the one that holds its lineage (its config
        file's, else its own SQLite file where one exists): the store would name the other database, and every
        tool that finds it from the store directory would lose the earlier runs."""
        kept = self._kept_mlmd() or ((self.root / MLMD_FILE).is_file() and str(self.root / MLMD_FILE))
        if kept and database_of(kept) != database_of(self.mlmd):
            raise StoreError(
                f"The store {self.root} keeps its lineage in {kept}, not in {without_password(self.mlmd)}: pass "
                "that database, or another store directory for this one"
            )

    @property
    def remote(self) -> Remote | None:
        """The remote the store's files are pushed to (from its config file), if one was set."""
        entry = self._config().get("remote")
        return Remote(**entry) if entry else None

    def require_lineage(self) -> None:
        """Open a server's MLMD database now (a SQLite file opens as it is first written): a server that does
        not answer, or refuses the user, is an error before a sweep or a run starts, not warnings as it
        records nothing."""
        if is_url(self.mlmd):
            self.lineage  # noqa: B018 (opened for its errors)

    def require_remote(self) -> Remote:
        """The store's remote; a StoreError that says how to set one when there is none."""
        remote = self.remote
        if remote is None:
            raise self._no_remote()
        return remote

    def _no_remote(self) -> StoreError:
        return StoreError(f"The store {self.root} has no remote; set one with `ray-cmf push --add-remote URL`")

    def set_remote(self, url: str, endpoint_url: str | None = None, *, check: bool = False) -> Remote:
        """Make ``url`` the store's DVC remote (``endpoint_url``: an S3-compatible server) and record it in
        the config file, so that other machines can fetch files by their md5. A relative directory is taken
        from the current directory, as every other path a command is given. ``check``: try it first.

        Raises:
            InvalidArgumentError: ``url`` cannot hold the files (another scheme, inside the store, under a file),
                or ``endpoint_url`` is given for a remote that is not ``s3://``.
            StoreError: ``check``, and the remote does not answer, refuses the credentials or lacks its bucket:
                the store keeps the remote it had.
        """
        remote = Remote(self._remote_url(url), endpoint_url)
        if endpoint_url is not None and not remote.is_s3:
            raise InvalidArgumentError(
                f"endpoint URL {endpoint_url!r} is for an s3:// remote (an S3 server); {url!r} is a directory"
            )
        if check:
            remote.check()
        self.dvc.add_remote("default", remote.url, endpoint_url=endpoint_url)
        self._write_config(remote=remote.to_config())
        return remote

    def _remote_url(self, url: str) -> str:
        """``url`` as a remote of this store: an ``s3://bucket/prefix`` URL as given, a directory (or a
        ``file:`` URL) as an absolute path; refused, naming why, where it cannot hold the store's files."""
        parsed = urllib.parse.urlsplit(url)
        if not url.isascii():  # DVC 3 fails on it ("'ascii' codec can't encode"), and empties its config
            raise InvalidArgumentError(f"DVC cannot take a remote named with other than ASCII characters: {url!r}")
        if parsed.scheme == "s3" and parsed.netloc:
            return url
        if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path:
            url = urllib.parse.unquote(parsed.path)
        elif not url or parsed.scheme:
            raise InvalidArgumentError(
                f"A remote is an s3://BUCKET/PREFIX URL or a directory (a file: URL too); got {url!r}"
            )
        path = Path(os.path.normpath(Path(url).absolute()))
        if path.resolve().is_relative_to(self.root.resolve()):
            raise InvalidArgumentError(f"The remote {path} is inside the store {self.root}: put it elsewhere")
        if in_the_way := file_in_the_way(path):
            raise InvalidArgumentError(f"The remote {path} cannot be made: {in_the_way} is a file, not a directory")
        return str(path)

    def push(self) -> str:
        """Upload every tracked file to the store's remote (``dvc push``) and return DVC's report. The remote its
        config file names is DVC's too: a store made by ``pull`` on another machine has no DVC remote yet."""
        remote = self.remote
        if remote is not None:
            self.dvc.add_remote("default", remote.url, endpoint_url=remote.endpoint_url)
        try:
            return self.dvc.push()
        except StoreError as exc:
            if remote is None and "no remote specified" in str(exc):  # nor one set in DVC itself
                raise self._no_remote() from None
            raise

    def fetch(self, md5: str) -> Path | None:
        """The local copy of the file with this md5: the DVC cache's object, fetched from the remote on
        first use. None when neither has it (or no remote was set)."""
        cached = cache_path(self.root, md5)
        if cached.is_file():
            return cached
        remote = self.remote
        if remote is None or not remote.exists(md5):
            return None
        return remote.fetch(md5, cached)

    # -- lazily opened parts -------------------------------------------------------------------------
    def _ensure_root(self) -> None:
        """The store directory, made and writable, about to be written with its own MLMD (see _check_mlmd)."""
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"Store path {self.root} exists and is not a directory; pass another store path")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{uuid.uuid4().hex}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise StoreError(
                f"Store directory {self.root} is not writable: {exc}. Name a writable store (store=... or "
                f"${ENV_STORE}); reading this one (ray-cmf trials / verify, Sweep) still works"
            ) from exc
        self._check_mlmd()

    @property
    def lineage(self) -> Lineage:
        """The MLMD database, opened for writing on first use."""
        with self._lock:
            if self._lineage is None:
                self._ensure_root()
                self._lineage = Lineage(self.mlmd)
                self._record_config()  # once it opened: a database that never answered is not the store's
            return self._lineage

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """While a file is tracked and registered: ``gc`` (see :meth:`collecting`) waits, so it never frees the
        cache object of content that a commit is registering (the content of a deleted trial's freed file,
        say) in the moment between the two."""
        with self._store_lock(fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """While ``gc`` decides what no live trial holds and frees it: commits wait (see :meth:`tracking`)."""
        with self._store_lock(fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def _store_lock(self, mode: int) -> Iterator[None]:
        path = self.root / STORE_LOCK
        try:
            lock = open(path, "a")  # noqa: SIM115 (closed below)
        except OSError:
            self._ensure_root()  # makes a new store; says what is wrong with one that cannot be written
            lock = open(path, "a")  # noqa: SIM115
        with lock:
            fcntl.flock(lock, mode)
            yield

    def reader(self) -> Lineage:
        """The MLMD database opened read-only (for readers beside the writer), which must exist: an error that
        names it, and the config file that named it where the database is not in the store."""
        try:
            return Lineage(self.mlmd, readonly=True)
        except StoreError:
            if self.root.is_file() or not self.root.exists():
                what = "a file" if self.root.is_file() else "no such directory"
                raise StoreError(
                    f"{self.root} is not a store ({what}): give the directory that a sweep or a Cmf wrote"
                ) from None
            kept = self._kept_mlmd()
            if kept is None or kept != self.mlmd or is_url(kept):  # a server's own error says what it did
                raise
            raise StoreError(
                f"No MLMD database at {kept}, where the store {self.root} keeps its lineage ({STORE_CONFIG} names it): "
                f'if the database was moved, give its path as "mlmd" in {self.root / STORE_CONFIG}'
            ) from None

    @property
    def dvc(self) -> DvcRepo:
        """The DVC repo at the store root, initialised on first use."""
        with self._lock:
            if self._dvc is None:
                self._ensure_root()
                self._record_config()  # a store set up for a team (its remote) names the team's MLMD
                self._dvc = DvcRepo(self.root, scm=self.scm)
            return self._dvc

    # -- paths ---------------------------------------------------------------------------------------
    def artifact_dir(self, pipeline: str, stage: str, run: str) -> Path:
        """``artifacts/<pipeline>/<stage>/<run>``: where one execution's files live."""
        names = (check_name("pipeline", pipeline), check_name("stage", stage), check_name("execution name", run))
        return self.root.joinpath(ARTIFACTS_DIR, *names)

    def series_path(self, pipeline: str, stage: str, run: str, metrics_name: str, instance: str = "") -> Path:
        """Where a series' next version goes (``instance``: which of the execution's series of that name);
        ``{md5}`` becomes the content hash when it is written."""
        stem = check_name("metrics_name", metrics_name)
        if instance:
            stem += f"-{check_name('series instance', instance)}"
        return self.artifact_dir(pipeline, stage, run) / f"{stem}-{{md5}}.parquet"

    def spill_dir(self, key: str) -> Path:
        """A fresh-per-key directory for a buffer's crash-safe segments."""
        return self.root / SPILL_DIR / key

    def url(self, path: str | os.PathLike[str]) -> str:
        """A path as stored in MLMD: relative to the store root when inside it, else absolute."""
        path = Path(path).absolute()
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)

    def resolve(self, url: str) -> Path:
        """Inverse of :meth:`url`."""
        path = Path(url)
        return path if path.is_absolute() else self.root / path

    def escapes(self, path: Path) -> bool:
        """Whether a path that names a place in the store really leads out of it (through a symlink)."""
        return path.is_relative_to(self.root) and not path.resolve().is_relative_to(_real(self.root))

    # -- writes (the single writer) ------------------------------------------------------------------
    def pipeline(self, name: str, props: Mapping[str, Any] | None = None) -> Context:
        """Get or create the pipeline context ``name``."""
        with self._lock:
            return self.lineage.pipeline(check_name("pipeline", name), props)

    def stage(self, pipeline: str, stage: str, props: Mapping[str, Any] | None = None) -> Context:
        """Get or create the stage context ``stage`` under ``pipeline``."""
        with self._lock:
            parent = self.pipeline(pipeline)
            return self.lineage.stage(parent, check_name("stage", stage), props)

    def execution(
        self,
        pipeline: str,
        stage: str,
        type_name: str,
        name: str,
        props: Mapping[str, Any] | None = None,
        *,
        in_stage: bool = True,
        owner: str | None = None,
    ) -> Execution:
        """Get (on restore) or create the execution ``name`` in the stage context (``in_stage``, ``owner``: see
        :meth:`Lineage.execution`)."""
        check_name("execution name", name)
        with self._lock:
            ctx = self.stage(pipeline, stage)
            type_name = check_name("execution type", type_name)
            return self.lineage.execution(
                ctx, type_name, name, {**(props or {}), **holder()}, in_stage=in_stage, owner=owner
            )

    def update_execution(
        self,
        execution_id: int,
        props: Mapping[str, Any] | None = None,
        state: str | None = None,
        *,
        config: bool = False,
    ) -> Execution:
        """Merge properties into an execution (``config``: into its config too, see
        :meth:`Lineage.update_execution`) and optionally set RUNNING/COMPLETE/FAILED/CANCELED.

        Marking it RUNNING records this process as its holder (see ``exits.abandoned``). One marked RUNNING or
        COMPLETE keeps no ``error`` of an earlier failure (a restored trial, a restarted run)."""
        if state == "RUNNING":
            props = {**(props or {}), **holder()}
        remove = [ERROR_PROPERTY] if state in ("RUNNING", "COMPLETE") else []
        with self._lock:
            return self.lineage.update_execution(execution_id, props, state, config=config, remove=remove)

    def note_end(
        self, execution_id: int, props: Mapping[str, Any] | None, state: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """Write down how an execution is about to end (``props``, ``state``), before its lineage is told: if
        it does not answer, :func:`ray_cmf.recover` ends it so (not ``CRASHED``) once it does. Returns what is
        noted now, with what an earlier end the lineage never learned noted (its state, unless this one has
        one): what to tell the lineage. :meth:`forget_end` drops the note once the lineage has it."""
        note = self._end_note(execution_id)
        earlier = json.loads(note.read_text()) if note.is_file() else {"props": {}, "state": None}
        merged, state = {**earlier["props"], **(props or {})}, state or earlier["state"]
        write_text(note, config_json({"execution_id": execution_id, "props": merged, "state": state}))
        return merged, state

    def forget_end(self, execution_id: int) -> None:
        """Drop the note of how an execution was to end (it ended so, or it starts again)."""
        self._end_note(execution_id).unlink(missing_ok=True)

    def _end_note(self, execution_id: int) -> Path:
        return self.root / PENDING_ENDS_DIR / f"{execution_id}.json"

    def pending_ends(self) -> list[dict[str, Any]]:
        """The notes of executions whose end the lineage never learned (see :meth:`note_end`)."""
        notes = sorted((self.root / PENDING_ENDS_DIR).glob("*.json"))
        return [json.loads(note.read_text()) for note in notes]

    def patch_executions(
        self, execution_ids: Sequence[int], props: Mapping[str, Any], remove: Iterable[str] = ()
    ) -> None:
        """Set and drop some properties of executions and nothing else, in one transaction (see
        :meth:`Lineage.patch_executions`)."""
        with self._lock:
            self.lineage.patch_executions(execution_ids, props, remove)

    def start_attempt(
        self,
        execution_id: int,
        counter: str = ATTEMPT_PROPERTY,
        props: Mapping[str, Any] | None = None,
        state: str | None = None,
    ) -> int:
        """Count one more start of an execution (a trial's or a run's) and return it: 1 for the first.
        ``counter``: the property that counts them (a Train run's callback counts its own starts). ``props``
        and ``state`` are merged in the same MLMD transaction (see :meth:`update_execution`)."""
        with self._lock:
            recorded = properties(self.lineage.get_execution(execution_id)).get(counter, 0)
            attempt = int(recorded) + 1
            self.update_execution(execution_id, {**(props or {}), counter: attempt}, state)
            return attempt

    def commit_metrics(
        self,
        execution_id: int,
        metrics_name: str,
        finished: FinishedFile,
        custom: Mapping[str, Any] | None = None,
        instance: str = "",
        *,
        also_output_of: int | None = None,
    ) -> Artifact:
        """Track a finished Parquet file with DVC and record its Step_Metrics artifact (one MLMD transaction,
        and one more for ``also_output_of``, the Tune trial of a Train run's series); ``instance`` says which
        of the execution's series of that name it is (a Train rank's, say).

        Content is shared: executions that commit the same bytes share one artifact, and one file: the copy
        just written goes when an artifact of that content already has its file here (gc frees the one file
        with the last execution that holds it). An execution that commits bytes it committed before, after
        another version, records them again as its newest version (MLMD keeps one output event per execution
        and artifact, so the new event goes to a new artifact of the same content); so does content whose
        artifact a gc freed.

        The DVC cache copy runs outside the MLMD lock: a large file does not stall other requests.
        """
        with self.tracking():
            return self._commit_metrics(execution_id, metrics_name, finished, custom, instance, also_output_of)

    def _commit_metrics(
        self,
        execution_id: int,
        metrics_name: str,
        finished: FinishedFile,
        custom: Mapping[str, Any] | None,
        instance: str,
        also_output_of: int | None,
    ) -> Artifact:
        self.dvc.track(finished.path, finished.md5, finished.size)
        with self._lock:
            url = self.url(finished.path)
            typed = {
                "Commit": finished.md5,
                "url": url,
                "metrics_name": metrics_name,
                "rows": finished.rows,
                "size": finished.size,
            }
            name = f"{metrics_name}:{finished.md5}"
            if self._needs_own_artifact(execution_id, name, metrics_name, instance):
                name = f"{name}:{uuid.uuid4().hex[:8]}"
            artifact = self.lineage.put_artifact(
                execution_id, STEP_METRICS_TYPE, name, str(finished.path), typed, custom, instance=instance
            )
            if also_output_of is not None:
                self.lineage.link(also_output_of, artifact.id, "output", instance)
        shared = self.file_of(artifact)
        if shared.is_file() and finished.path.is_file() and not shared.samefile(finished.path):  # another copy
            finished.path.unlink(missing_ok=True)
            finished.path.with_name(finished.path.name + ".dvc").unlink(missing_ok=True)
        return artifact

    def file_of(self, artifact: Artifact) -> Path:
        """Where an artifact's file is (or was) in the store."""
        return self.resolve(str(properties(artifact).get("url", artifact.uri)))

    def _needs_own_artifact(self, execution_id: int, name: str, metrics_name: str, instance: str) -> bool:
        """Whether the content's artifact ``name`` cannot take this commit: a gc freed (or is freeing) its
        bytes, or the execution holds it as an output that is not its newest version of ``metrics_name`` from
        this instance (so recording it again would not make it the newest)."""
        existing = self.lineage.store.get_artifact_by_type_and_name(STEP_METRICS_TYPE, name)
        if existing is None:
            return False
        if collected(existing):
            return True
        versions = [output for output, _ in self._series_outputs(self.lineage.outputs([execution_id]), metrics_name)]
        held = any(output.artifact_id == existing.id for output in versions)
        newest = versions[-1] if versions else None
        return held and not (newest is not None and newest.artifact_id == existing.id and newest.instance == instance)

    def log_file(
        self,
        execution_id: int,
        type_name: str,
        path: str | os.PathLike[str],
        event: str,
        custom: Mapping[str, Any] | None = None,
        *,
        digest: tuple[str, int] | None = None,
    ) -> Artifact:
        """Record a dataset or model (file or directory) in MLMD; DVC-track files inside the store.

        ``digest`` is the (md5, size) that the caller computed where the file is (another node's file);
        without it the file is hashed here.
        """
        path = Path(path).absolute()
        if event not in ("input", "output"):
            raise ValueError(f"event must be 'input' or 'output', got {event!r}")
        if digest is None:
            if not path.exists():
                raise StoreError(f"Cannot log {type_name} {str(path)!r}: no such file or directory")
            digest = tree_md5(path)
        md5, size = digest
        with self.tracking(), self._lock:
            tracked = path.is_file() and path.is_relative_to(self.root)
            if tracked:
                self.dvc.track(path, md5, size)
            typed = {"Commit": md5, "url": self.url(path), "size": size}
            return self.lineage.put_artifact(
                execution_id,
                type_name,
                f"{path.name}:{md5}",
                str(path),
                typed,
                {"dvc_tracked": tracked, **(custom or {})},
                event,
            )

    def log_environment(self, execution_id: int, environment: Environment, *, merged: bool = False) -> Artifact | None:
        """Merge an environment's properties into the execution (``merged``: the caller did, with others) and
        link its package list (one file per distinct list, ``environments/packages-<md5>.txt``, shared by every
        execution that has it)."""
        if environment.props and not merged:
            self.update_execution(execution_id, environment.props)
        if not environment.packages:
            return None
        path = self.root / ENVIRONMENTS_DIR / f"packages-{environment.md5}.txt"
        data = environment.packages.encode()
        if not path.is_file():
            write_bytes(path, data)
        return self.log_file(execution_id, ENVIRONMENT_TYPE, path, "input", digest=(environment.md5, len(data)))

    def log_execution_metrics(self, execution_id: int, metrics_name: str, values: Mapping[str, Any]) -> Artifact:
        """Record execution-level metrics (no file) as a ``Metrics`` artifact, as cmflib does."""
        with self._lock:
            name = f"{metrics_name}:{uuid.uuid4().hex}"
            exact = {**values, VALUES_JSON: config_json(values)}  # each value as logged, beside cmflib's properties
            return self.lineage.put_artifact(
                execution_id, EXECUTION_METRICS_TYPE, name, "", {"metrics_name": metrics_name}, exact
            )

    # -- reads ---------------------------------------------------------------------------------------
    def content(self, path: Path, md5: str) -> Path | None:
        """Where a committed file's content is read: the DVC cache object its md5 names (a file edited by hand
        in the store reads as logged); else the file, if it still holds that content; else the remote's copy
        (a file committed elsewhere). None, with a warning, for a file that holds other content and no copy."""
        cached = cache_path(self.root, md5)
        if cached.is_file():
            return cached
        if not path.is_file():
            return self.fetch(md5) or path  # a missing file reads as missing
        if file_md5(path) == md5:
            return path
        fetched = self.fetch(md5)
        if fetched is None:
            log.warning("ray_cmf: skipping %s: it does not match its md5 %s (edited since it was committed)", path, md5)
        return fetched

    def find_version(
        self,
        pipeline: str,
        metrics_name: str,
        commit: str | None = None,
        execution_id: int | None = None,
        instance: str | None = None,
    ) -> dict[str, Any]:
        """The properties (``url``, ``Commit``: its md5, ...) of the newest committed version of
        ``metrics_name`` (or of its version ``commit``) that ``execution_id`` produced: of its series
        ``instance`` when given (one logger's, where several logged the name).

        Without an execution, the pipeline's: by ``commit``, or the newest version when one execution alone
        has committed that name (which execution is meant is otherwise ambiguous, and that is an error).
        """
        lineage = self.lineage
        if execution_id is not None:
            outputs, where = lineage.outputs([execution_id]), f"execution {execution_id}"
        else:
            parent = lineage.find_pipeline(pipeline)
            contexts = [parent, *lineage.stages(parent)] if parent is not None else []
            outputs = lineage.producers([a.id for a in lineage.artifacts(contexts, STEP_METRICS_TYPE)])
            where = f"pipeline {pipeline!r}"
        versions = [
            (o, props)
            for o, props in self._series_outputs(outputs, metrics_name)
            if commit in (None, props["Commit"]) and instance in (None, o.instance)
        ]
        if not versions:
            which = f" with md5 {commit!r}" if commit else ""
            held = list(dict.fromkeys(props["metrics_name"] for _, props in self._series_outputs(outputs)))
            listed = "" if metrics_name in held else f"; {what_exists([metrics_name], held)}" if held else ""
            raise MetricsNotFoundError(f"No committed metrics {metrics_name!r}{which} in {where} of {self}{listed}")
        producers = sorted({output.execution_id for output, _ in versions})
        if commit is None and len(producers) > 1:
            names = [e.name for e in lineage.store.get_executions_by_id(producers)]
            raise MetricsNotFoundError(
                f"{len(producers)} executions of pipeline {pipeline!r} committed {metrics_name!r} ({names}): read it "
                "from the Cmf of one of them (create_execution(..., execution_name=NAME, create_new_execution=False)), "
                "by its md5 (commit=...), or compare them with ray_cmf.Sweep"
            )
        return versions[-1][1]

    def settle(self, spill: Spill) -> None:
        """Name the version a spill extends where it began while the lineage did not answer (see
        ``SpillManifest.base_unknown``): before it is committed, by its writer or by ``recover``."""
        if spill.base_unknown and spill.manifest is not None:
            manifest = spill.manifest
            spill.settle_base(self.newest_version(manifest.execution_id, manifest.metrics_name, manifest.instance))

    def newest_version(self, execution_id: int, metrics_name: str, instance: str = "") -> Path | None:
        """The file of the newest committed version of an execution's series (its ``instance``), or None when
        it has none, or its file is gone: what a series that is continued extends."""
        with self._lock:
            outputs = self._series_outputs(self.lineage.outputs([execution_id]), metrics_name)
        versions = [props for output, props in outputs if output.instance == instance]
        path = self.resolve(str(versions[-1]["url"])) if versions else None
        return path if path is not None and path.is_file() else None

    def _series_outputs(
        self, outputs: list[Output], metrics_name: str | None = None
    ) -> list[tuple[Output, dict[str, Any]]]:
        """The outputs that are committed versions of the series ``metrics_name`` (of every series: None), that
        is Step_Metrics artifacts, in the order they were recorded, each with its artifact's properties."""
        type_id = self.lineage.find_type_id("artifact", STEP_METRICS_TYPE)
        ids = list({output.artifact_id for output in outputs})
        found = self.lineage.store.get_artifacts_by_id(ids) if ids else []
        series = {a.id: properties(a) for a in found if a.type_id == type_id}
        return [
            (o, series[o.artifact_id])
            for o in outputs
            if o.artifact_id in series and metrics_name in (None, series[o.artifact_id].get("metrics_name"))
        ]
