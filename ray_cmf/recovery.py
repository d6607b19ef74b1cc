"""Recovery: commit the spilled segments of runs that died before ``commit_metrics``."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ray_cmf.buffer import discard_spill, read_segments, write_parquet
from ray_cmf.constants import SPILL_DIR, SPILL_MANIFEST
from ray_cmf.lineage import Artifact
from ray_cmf.store import Store

log = logging.getLogger(__name__)


def _alive(manifest: dict[str, object]) -> bool:
    """Whether the process that wrote a spill still runs on this host (then its spill is not dangling)."""
    pid = manifest.get("pid")
    if manifest.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _execution_id(store: Store, manifest: dict[str, Any]) -> int:
    """The execution a spill belongs to: by id, or by name for writers that never learned the id."""
    if "execution_id" in manifest:
        return int(manifest["execution_id"])
    return store.execution(
        manifest["pipeline"], manifest["stage"], manifest["execution_type"], manifest["execution_name"]
    ).id


def recover(store: str | os.PathLike[str] | Store | None = None, *, force: bool = False) -> list[Artifact]:
    """Turn every dangling spill of ``store`` into a committed, valid Parquet Step_Metrics artifact.

    Every complete spilled row group is kept; a batch torn by the crash is dropped. Spills of processes
    still alive on this host are skipped unless ``force``.

    Returns:
        The Step_Metrics artifacts created, each with the custom property ``recovered=True``.
    """
    store = store if isinstance(store, Store) else Store(store)
    recovered: list[Artifact] = []
    for manifest_path in sorted((store.root / SPILL_DIR).glob(f"*/{SPILL_MANIFEST}")):
        spill = manifest_path.parent
        manifest = json.loads(manifest_path.read_text())
        if not force and _alive(manifest):
            log.info("ray_cmf.recover: skipping %s, its writer (pid %s) is alive", spill, manifest.get("pid"))
            continue
        batches: list[pa.RecordBatch] = list(read_segments(spill))
        if batches:
            base = manifest.get("base")
            if base and Path(base).exists():
                batches[:0] = pq.ParquetFile(base).iter_batches(batch_size=1 << 20)
            finished = write_parquet(batches, Path(manifest["dest"]))
            artifact = store.commit_metrics(
                _execution_id(store, manifest), str(manifest["metrics_name"]), finished, {"recovered": True}
            )
            log.warning(
                "ray_cmf.recover: committed %d rows of %r from %s", finished.rows, manifest["metrics_name"], spill
            )
            recovered.append(artifact)
        discard_spill(spill)
    return recovered
