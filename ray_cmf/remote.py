"""A store's DVC remote, read by content: the object of an md5, for a machine that lacks the files.

``ray-cmf push`` uploads with DVC itself (``dvc push``). A machine that reaches the store's MLMD and its
remote but holds none of the files fetches each file it reads by the md5 that MLMD records, from DVC's
remote layout (dvc_data's, ``<remote>/files/md5/<2 hex>/<30 hex>``), into its local DVC cache, once. Local
directories and S3-compatible endpoints (``s3://bucket/prefix`` with ``endpoint_url``, through the s3fs
filesystem that DVC's own S3 remote uses) are supported; credentials come from the usual AWS
variables and files, never from the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_cmf._atomic import atomic_write
from ray_cmf.errors import StoreError
from ray_cmf.versioning import object_path


@dataclass(frozen=True)
class Remote:
    """Where a store's files are pushed: a URL (``s3://bucket/prefix`` or a directory) and, for S3-compatible
    servers other than AWS, their ``endpoint_url``."""

    url: str
    endpoint_url: str | None = None

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    def _fs(self) -> Any:
        import fsspec

        if self.is_s3:
            options = {"client_kwargs": {"endpoint_url": self.endpoint_url}} if self.endpoint_url else {}
            return fsspec.filesystem("s3", **options)
        return fsspec.filesystem("file")

    def _root(self) -> str:
        return self.url[len("s3://") :].rstrip("/") if self.is_s3 else str(Path(self.url).absolute())

    def object_path(self, md5: str) -> str:
        """Where DVC keeps the object of ``md5`` on this remote."""
        return object_path(self._root(), md5)

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Say which remote failed, and how, where a call to it fails otherwise than by a missing object (an
        endpoint that does not answer, credentials it refuses): one line, not the client library's traceback."""
        try:
            yield
        except (FileNotFoundError, StoreError):
            raise
        except Exception as exc:
            where = f"{self.url} (endpoint {self.endpoint_url})" if self.endpoint_url else self.url
            raise StoreError(
                f"The remote {where} failed: {type(exc).__name__}: {exc}. Is it up, and are the "
                "credentials (AWS_ACCESS_KEY_ID, ~/.aws) right? `ray-cmf push --add-remote` changes it"
            ) from exc

    def check(self) -> None:
        """Raise StoreError, naming why, where files cannot be put here: a server that does not answer,
        credentials it refuses, a bucket it lacks (which holds no object either, so an object's probe passes)."""
        with self._answering():
            fs = self._fs()
            bucket = self._root().split("/")[0]
            if self.is_s3 and not fs.exists(bucket):
                raise StoreError(f"The remote {self.url}: its server has no bucket {bucket!r}; make it first")
            fs.exists(self.object_path("0" * 32))

    def exists(self, md5: str) -> bool:
        """Whether the remote holds the object of ``md5``."""
        with self._answering():
            return bool(self._fs().exists(self.object_path(md5)))

    def fetch(self, md5: str, dest: Path) -> Path:
        """Download the object of ``md5`` to ``dest`` (atomically; read-only, as DVC's cache keeps it)."""
        try:
            with self._answering(), atomic_write(dest, readonly=True) as pending:
                self._fs().get_file(self.object_path(md5), str(pending.tmp))
        except FileNotFoundError as exc:
            raise StoreError(f"The remote {self.url} has no object for md5 {md5}; was the store pushed?") from exc
        return dest

    def upload(self, md5: str, src: Path) -> bool:
        """Put ``src`` on the remote as the object of ``md5``, unless it is there already; True if uploaded."""
        with self._answering():
            fs, target = self._fs(), self.object_path(md5)
            if fs.exists(target):
                return False
            fs.put_file(str(src), target)
            return True

    def remove(self, md5: str) -> bool:
        """Delete the object of ``md5`` from the remote; True if it was there."""
        with self._answering():
            fs, target = self._fs(), self.object_path(md5)
            if not fs.exists(target):
                return False
            fs.rm_file(target)
            return True

    def to_config(self) -> dict[str, str]:
        return {"url": self.url, **({"endpoint_url": self.endpoint_url} if self.endpoint_url else {})}
