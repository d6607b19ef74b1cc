"""DVC versioning of the store: init without git, constant-cost tracking of finished files, push.

Tracking a file writes exactly what ``dvc add`` would leave behind (the object in
``.dvc/cache/files/md5/xx/…`` and a ``<file>.dvc`` beside the file) without DVC's repo-wide index, so the
cost of one commit does not grow with the number of files already tracked. The real ``dvc`` CLI reads
the result: ``dvc status`` is clean and ``dvc push`` uploads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from ray_cmf._atomic import atomic_write, write_text
from ray_cmf.errors import StoreError

_CHUNK = 1 << 20
_DVC_FILE = """outs:
- md5: {md5}
  size: {size}
  hash: md5
  path: {name}
"""


def file_md5(path: str | os.PathLike[str]) -> str:
    """md5 (hex) of a file's bytes, as DVC 3 computes it for ``hash: md5`` outputs."""
    digest = hashlib.md5()
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_md5(path: str | os.PathLike[str]) -> tuple[str, int]:
    """(md5, total size) of a file, or of a directory as DVC records it (``<md5>.dir``), computed by DVC's own
    code (``dvc_data``): the same value ``dvc add`` writes."""
    root = Path(path)
    if root.is_file():
        return file_md5(root), root.stat().st_size
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory() as scratch:  # dry_run: nothing is written into it
        _, meta, tree = build(HashFileDB(fs, scratch), str(root.absolute()), fs, "md5", dry_run=True)
    return str(tree.hash_info.value), int(meta.size or 0)


def object_path(odb_root: str, md5: str) -> str:
    """Where a DVC object database (a repo's cache, a remote) rooted at ``odb_root`` keeps the object with
    this md5: ``files/md5/<2 hex>/<30 hex>``, dvc_data's layout (``HashFileDB.oid_to_path``; a test holds the
    two equal). Computed here because importing dvc_data costs 0.17 s, which a run's first ``log_metric``
    would wait for."""
    return f"{odb_root.rstrip('/')}/files/md5/{md5[:2]}/{md5[2:]}"


def cache_path(root: str | os.PathLike[str], md5: str) -> Path:
    """Where the DVC repo at ``root`` keeps the object with this md5 (computed: nothing is opened)."""
    return Path(object_path(str(Path(root) / ".dvc" / "cache"), md5))


class DvcRepo:
    """The DVC repository at the store root (created on first use, with git only when asked).

    Args:
        root: Repository root.
        scm: Initialise with git (``dvc init``) instead of ``dvc init --no-scm``.
    """

    def __init__(self, root: str | os.PathLike[str], *, scm: bool = False) -> None:
        self.root = Path(root)
        self._remotes: set[tuple[str, str, bool, str | None]] = set()  # configured through this object
        if not (self.root / ".dvc" / "config").is_file():
            self._init(scm)

    def _init(self, scm: bool) -> None:
        """``dvc init``; a ``.dvc`` that holds only a cache (objects that reads fetched from the remote into a
        store made on another machine) is set aside meanwhile, since DVC refuses to init over it, and its
        cache is then the repo's."""
        fetched = self.root / ".dvc" / "cache"
        aside = self.root / f".dvc-cache-{uuid.uuid4().hex}"
        if fetched.is_dir():
            fetched.rename(aside)
            shutil.rmtree(self.root / ".dvc", ignore_errors=True)
        try:
            self._init_repo(scm)
        finally:
            if aside.is_dir():
                fetched.parent.mkdir(exist_ok=True)
                aside.rename(fetched)

    def _init_repo(self, scm: bool) -> None:
        from dvc.repo import Repo  # a heavy import, paid once per new store

        if scm:
            subprocess.run(["git", "init", "-q", str(self.root)], check=True)
        try:
            dvc_log = logging.getLogger("dvc")
            level = dvc_log.level
            dvc_log.setLevel(logging.WARNING)  # dvc announces the init on stdout and in the log
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    Repo.init(str(self.root), no_scm=not scm)
            finally:
                dvc_log.setLevel(level)
        except Exception as exc:  # dvc raises its own hierarchy
            if (self.root / ".dvc").is_dir():  # another process started on this new store at the same time
                return
            raise StoreError(f"Cannot initialise a DVC repo at {self.root}: {exc}") from exc

    def cache_path(self, md5: str) -> Path:
        """Where DVC keeps the object with this md5."""
        return cache_path(self.root, md5)

    def track(self, path: str | os.PathLike[str], md5: str, size: int) -> Path:
        """Put ``path`` (inside the repo, already hashed) into the cache and write its ``.dvc`` file.

        Returns the ``.dvc`` file. The cache object is a copy, so editing the workspace file later
        cannot corrupt the cache (DVC's own default, ``reflink,copy``).
        """
        path = Path(path).absolute()
        if not path.is_relative_to(self.root.absolute()):
            raise StoreError(f"Cannot track {path} with DVC: it lies outside the store {self.root}")
        obj = self.cache_path(md5)
        if not obj.exists():
            with atomic_write(obj, readonly=True) as pending:  # two writer threads may track one md5
                shutil.copyfile(path, pending.tmp)
        return write_text(path.with_name(path.name + ".dvc"), _DVC_FILE.format(md5=md5, size=size, name=path.name))

    def add_remote(self, name: str, url: str, *, default: bool = True, endpoint_url: str | None = None) -> None:
        """Configure a DVC remote (``dvc remote add [-d] NAME URL``; ``endpoint_url`` for an S3-compatible
        server). Where DVC fails, its config is left as it was (DVC can fail half-way through writing it, as on a
        path it cannot encode, and leave it empty). One this object configured already is not configured again
        (``push --add-remote`` sets the remote, then the push makes sure of it)."""
        wanted = (name, url, default, endpoint_url)
        if wanted in self._remotes:
            return
        config = self.root / ".dvc" / "config"
        kept = config.read_bytes()
        try:
            self._cli(["remote", "add", "--force"] + (["-d"] if default else []) + [name, url])
            if endpoint_url:
                self._cli(["remote", "modify", name, "endpointurl", endpoint_url])
        except StoreError:
            config.write_bytes(kept)
            raise
        self._remotes.add(wanted)

    def push(self, remote: str | None = None) -> str:
        """Upload every tracked object to the remote (``dvc push``) and return DVC's report."""
        return self._cli(["push"] + (["-r", remote] if remote else []))

    def status(self) -> str:
        """``dvc status`` output for the store (empty-ish when clean)."""
        return self._cli(["status"])

    def _cli(self, args: list[str]) -> str:
        """Run the real dvc CLI in the repo so that what users see is what DVC itself says."""
        result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=self.root, capture_output=True, text=True)
        if result.returncode != 0:
            raise StoreError(f"dvc {' '.join(args)} failed in {self.root}:\n{result.stdout}{result.stderr}")
        return result.stdout
