"""The one way this package writes a file: to a unique temporary name beside it, synced, then renamed over it.

A reader never sees half a file, two writers of one destination never share a temporary file, and a
crash leaves at most a stray ``.<name>.<random>.tmp`` beside the destination, never a torn destination.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Pending:
    """A file being written: write to ``tmp``; ``dest`` may change before the write ends (a name that holds
    the content's hash, say)."""

    tmp: Path
    dest: Path


@contextlib.contextmanager
def atomic_write(dest: str | os.PathLike[str], *, readonly: bool = False, sync_dir: bool = False) -> Iterator[Pending]:
    """Yield a :class:`Pending` whose ``tmp`` the caller fills; on success it is fsynced and renamed to
    ``dest`` (made read-only first when ``readonly``; the directory fsynced too when ``sync_dir``, for a
    file whose existence matters after a power loss). On failure the temporary file is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    pending = Pending(dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp"), dest)
    try:
        yield pending
        with open(pending.tmp, "rb+") as written:
            os.fsync(written.fileno())
        if readonly:
            os.chmod(pending.tmp, 0o444)
        os.replace(pending.tmp, pending.dest)
    except BaseException:
        pending.tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        _fsync_dir(pending.dest.parent)


def write_bytes(dest: str | os.PathLike[str], data: bytes, *, readonly: bool = False) -> Path:
    """Write ``data`` to ``dest`` atomically (see :func:`atomic_write`); returns ``dest``."""
    with atomic_write(dest, readonly=readonly) as pending:
        pending.tmp.write_bytes(data)
    return pending.dest


def write_text(dest: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``dest`` atomically; returns ``dest``."""
    return write_bytes(dest, text.encode("utf-8"))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_in_the_way(directory: Path) -> Path | None:
    """The first of ``directory`` and its parents that exists as something other than a directory (which no
    file can be written under), or None."""
    return next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
