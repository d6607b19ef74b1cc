"""Audit a store: every recorded file must exist and match its md5 in MLMD, its .dvc file and the DVC cache."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ray_cmf.constants import DATASET_TYPE, ENVIRONMENT_TYPE, MODEL_TYPE, STEP_METRICS_TYPE
from ray_cmf.lineage import Lineage, properties
from ray_cmf.store import Store
from ray_cmf.versioning import cache_path, file_md5

_AUDITED_TYPES = (STEP_METRICS_TYPE, DATASET_TYPE, MODEL_TYPE, ENVIRONMENT_TYPE)


@dataclass(frozen=True)
class Finding:
    """One audited file: ``ok`` or what is wrong with it."""

    url: str
    md5: str
    status: str  # ok | missing | modified | dvc-mismatch | cache-missing | symlink-out

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _dvc_md5(dvc_file: Path) -> str | None:
    for line in dvc_file.read_text().splitlines():
        stripped = line.strip().lstrip("- ")
        if stripped.startswith("md5:"):
            return stripped.split(":", 1)[1].strip()
    return None


def audit(store: Store) -> Iterator[Finding]:
    """Re-hash every file artifact of the store and check it against MLMD and DVC."""
    lineage = Lineage(store.mlmd, readonly=True)
    for type_name in _AUDITED_TYPES:
        if lineage.find_type_id("artifact", type_name) is None:
            continue
        for artifact in lineage.store.get_artifacts_by_type(type_name):
            props = properties(artifact)
            url, md5 = str(props.get("url", artifact.uri)), str(props.get("Commit", ""))
            path = store.resolve(url)
            if store.escapes(path):
                status = "symlink-out"  # never followed out of the store
            elif md5.endswith(".dir") or not path.is_relative_to(store.root):
                status = "ok" if path.exists() else "missing"  # outside the store: existence only
            elif not path.is_file():
                status = "missing"
            elif file_md5(path) != md5:
                status = "modified"
            else:
                dvc_file = path.with_name(path.name + ".dvc")
                if dvc_file.exists() and _dvc_md5(dvc_file) != md5:
                    status = "dvc-mismatch"
                elif dvc_file.exists() and not cache_path(store.root, md5).is_file():
                    status = "cache-missing"
                else:
                    status = "ok"
            yield Finding(url, md5, status)
