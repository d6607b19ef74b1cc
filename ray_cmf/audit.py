"""A store's recorded files: audit them (each must exist and match its md5 in MLMD, its .dvc file, the DVC
cache and, when asked, the remote; a file the store keeps no copy of, its own version or a later one logged
too), or pull the missing ones from the remote by their md5."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ray_cmf._progress import track
from ray_cmf.constants import DATASET_TYPE, ENVIRONMENT_TYPE, MODEL_TYPE, STEP_METRICS_TYPE
from ray_cmf.errors import StoreError
from ray_cmf.lineage import collected, properties
from ray_cmf.store import Store
from ray_cmf.versioning import cache_path, file_md5, tree_md5

_AUDITED_TYPES = (STEP_METRICS_TYPE, DATASET_TYPE, MODEL_TYPE, ENVIRONMENT_TYPE)


@dataclass(frozen=True)
class Finding:
    """One audited file: ``ok`` (or ``superseded`` or ``remote-only``, see :attr:`ok`) or what is wrong with
    it: ``missing``, ``modified``, ``dvc-missing``, ``dvc-mismatch``, ``cache-missing``, ``cache-modified``,
    ``symlink-out``, ``remote-missing``."""

    url: str
    md5: str
    status: str
    rows_lost: int = 0  # rows its logger could not hand over (the file is intact; the series has holes)

    @property
    def ok(self) -> bool:
        """No fault: the file holds this version, or (a file the store keeps no copy of) a later one, or it is
        not here but on the remote (another machine's file of a team store: reads and ``pull`` fetch it)."""
        return self.status in ("ok", "superseded", "remote-only")


def _dvc_md5(dvc_file: Path) -> str | None:
    """The md5 a ``.dvc`` file records, read by DVC's own parser."""
    from dvc.utils.serialize import load_yaml

    outs = load_yaml(dvc_file).get("outs") or [{}]
    return outs[0].get("md5")


def _recorded(store: Store) -> Iterator[tuple[str, str, Path, int]]:
    """(url, md5, path, rows lost) of every file artifact that MLMD records for the store."""
    lineage = store.reader()
    for type_name in _AUDITED_TYPES:
        if lineage.find_type_id("artifact", type_name) is None:
            continue
        for artifact in lineage.store.get_artifacts_by_type(type_name):
            if collected(artifact):  # gc took its bytes (or is taking them): nothing to check or pull
                continue
            props = properties(artifact)
            url, md5 = str(props.get("url", artifact.uri)), str(props.get("Commit", ""))
            yield url, md5, store.resolve(url), int(props.get("rows_lost") or 0)


def audit(store: Store, *, remote: bool = False) -> Iterator[Finding]:
    """Re-hash every file artifact of the store and check it against MLMD and DVC (``remote``: and check that
    the store's remote holds it)."""
    pushed = store.require_remote() if remote else None
    recorded = list(_recorded(store))
    versions: dict[Path, set[str]] = {}
    for _, md5, path, _ in recorded:
        versions.setdefault(path, set()).add(md5)
    untracked: dict[Path, str | None] = {}  # what a file the store keeps no copy of holds now (hashed once)
    for url, md5, path, lost in track(recorded, "verifying files", len(recorded)):
        if store.escapes(path):
            status = "symlink-out"  # never followed out of the store
        elif md5.endswith(".dir") or not path.is_relative_to(store.root):
            if path not in untracked:
                untracked[path] = tree_md5(path)[0] if path.exists() else None
            status = _untracked_status(md5, untracked[path], versions[path])
            yield Finding(url, md5, status, lost)  # no copy is kept, so none is pushed: the remote has none
            continue
        else:
            status = _tracked_status(store, md5, path)
        if pushed is not None and status in ("ok", "missing"):
            on_remote = pushed.exists(md5)
            status = "remote-missing" if status == "ok" and not on_remote else status
            status = "remote-only" if status == "missing" and on_remote else status
        yield Finding(url, md5, status, lost)


def _untracked_status(md5: str, now: str | None, recorded: set[str]) -> str:
    """A directory, or a file outside the store: no copy is kept, so only what it holds now (``now``, None
    when it is gone) tells whether it is this version, a later one that was logged too, or neither."""
    if now is None:
        return "missing"
    if now == md5:
        return "ok"
    return "superseded" if now in recorded else "modified"


def _tracked_status(store: Store, md5: str, path: Path) -> str:
    """A file inside the store, which DVC tracks."""
    if not path.is_file():
        return "missing"
    if file_md5(path) != md5:
        return "modified"
    dvc_file = path.with_name(path.name + ".dvc")
    if not dvc_file.exists():
        return "dvc-missing"  # DVC no longer tracks it
    if _dvc_md5(dvc_file) != md5:
        return "dvc-mismatch"
    cached = cache_path(store.root, md5)
    if not cached.is_file():
        return "cache-missing"
    if file_md5(cached) != md5:  # what every read takes
        return "cache-modified"
    return "ok"


def pull(store: Store) -> list[Path]:
    """Bring back every file of the store that is missing here, from its remote by md5 (into the DVC cache,
    then its place in the store, with its ``.dvc`` file), and the cache object of one that is here without
    it. Returns the files restored; raises, once every other file is back, naming those the remote lacks."""
    remote = store.require_remote()
    restored, lacking = [], []
    recorded = list(_recorded(store))
    for _, md5, path, _lost in track(recorded, f"pulling from {remote.url}", len(recorded)):
        if md5.endswith(".dir") or not path.is_relative_to(store.root) or store.escapes(path):
            continue
        if path.exists():
            if not cache_path(store.root, md5).is_file() and store.fetch(md5) is not None:
                restored.append(path)  # its cache object, which reads and verify take its content from
            continue
        cached = store.fetch(md5)
        if cached is None:
            lacking.append(f"{store.url(path)} (md5 {md5})")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, path)
        store.dvc.track(path, md5, path.stat().st_size)  # tracked here too: dvc status, push and gc know it
        restored.append(path)
    if lacking:
        raise StoreError(
            f"Neither this store nor its remote {remote.url} holds {len(lacking)} of its files: "
            f"{', '.join(lacking[:10])}{' ...' if len(lacking) > 10 else ''}; pulled the other {len(restored)} "
            "(the store that committed them can `ray-cmf push` them)"
        )
    return restored
