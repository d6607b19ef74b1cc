"""Progress on long work (verify, pull, recover, push, export): shown on a terminal, silent when piped.

Both helpers draw on stderr, so a command's output on stdout stays clean for pipes and ``--json``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _on_terminal() -> bool:
    return sys.stderr.isatty()


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """``items``, with a progress bar (``description``, done/``total``, time left) while they are consumed."""
    if not _on_terminal():
        yield from items
        return
    from rich.console import Console
    from rich.progress import track as rich_track

    yield from rich_track(items, description, total=total, console=Console(stderr=True), transient=True)


@contextlib.contextmanager
def status(description: str) -> Iterator[None]:
    """A spinner with ``description`` while one long call (a DVC push, a large read) runs."""
    if not _on_terminal():
        yield
        return
    from rich.console import Console
    from rich.text import Text

    with Console(stderr=True).status(Text(description)):  # a pipeline's "[x]" is no style
        yield
