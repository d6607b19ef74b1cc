"""Recovery: commit the spilled segments of runs that died before ``commit_metrics``."""

from __future__ import annotations

import functools
import logging
import os
import socket

from ray_cmf.constants import SPILL_DIR, SPILL_MANIFEST
from ray_cmf.lineage import Artifact
from ray_cmf.series_format import FinishedFile, Spill, SpillManifest, discard_spill
from ray_cmf.store import Store

log = logging.getLogger(__name__)


def _alive(manifest: SpillManifest) -> bool:
    """Whether the process that wrote a spill still runs on this host (then its spill is not dangling)."""
    if manifest.host != socket.gethostname():
        return False
    try:
        os.kill(manifest.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _register(store: Store, manifest: SpillManifest, finished: FinishedFile) -> Artifact:
    """Record a recovered series' file as the artifact it would have been (marked ``recovered``)."""
    return store.commit_metrics(
        manifest.execution_id, manifest.metrics_name, finished, {"recovered": True}, manifest.instance
    )


def recover(store: str | os.PathLike[str] | Store | None = None, *, force: bool = False) -> list[Artifact]:
    """Turn every dangling spill of ``store`` into a committed, valid Parquet Step_Metrics artifact.

    Every complete spilled row group is kept; a batch torn by the crash is dropped. Spills of processes
    still alive on this host (the writer of a running job, for one) are skipped unless ``force``.

    Returns:
        The Step_Metrics artifacts created, each with the custom property ``recovered=True``.
    """
    store = store if isinstance(store, Store) else Store(store)
    recovered: list[Artifact] = []
    for manifest_path in sorted((store.root / SPILL_DIR).glob(f"*/{SPILL_MANIFEST}")):
        manifest = SpillManifest.read(manifest_path.parent)
        if not force and _alive(manifest):
            log.info("ray_cmf.recover: skipping %s, its writer (pid %s) is alive", manifest_path.parent, manifest.pid)
            continue
        spill = Spill(manifest_path.parent, manifest)
        if not spill.pending:
            discard_spill(spill.directory)
            continue
        artifact = spill.finish(manifest.dest, functools.partial(_register, store, manifest))
        log.warning("ray_cmf.recover: committed %d rows of %r from %s", spill.rows, manifest.metrics_name, spill)
        recovered.append(artifact)
    return recovered
