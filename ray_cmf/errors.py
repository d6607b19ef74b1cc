"""Exception hierarchy: every message names the offending key and value and says what to do."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

ERROR_CHARS = 2000  # of an error's text, what a trial or run records at most (see recorded_error)


class RayCmfError(Exception):
    """Base class of every error raised by ray_cmf."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles rebuild the error from its message and fields, not by calling ``__init__`` with
        its message: Tune copies a failed trial's error, and Ray pickles it across processes."""
        state = {k: v for k, v in self.__dict__.items() if _picklable(v)}
        return (_rebuilt, (type(self), self.args), state)


def _rebuilt(cls: type[RayCmfError], args: tuple[Any, ...]) -> RayCmfError:
    """An error of ``cls`` with ``args`` (its message), its ``__init__`` not run: pickle then sets its fields."""
    return cls.__new__(cls, *args)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


class InvalidNameError(RayCmfError, ValueError):
    """A metrics, pipeline, stage or column name that cannot be used as a path component."""

    def __init__(
        self,
        what: str,
        name: Any,
        why: str = "names must be non-empty strings without '/', '\\', '..', NUL or a drive letter, and not '.'",
    ) -> None:
        super().__init__(f"Invalid {what} {name!r}: {why}.")
        self.what = what
        self.name = name


class InvalidValueError(RayCmfError, ValueError):
    """A logged value of a type that cannot be stored as a scalar column (or a text the store cannot hold:
    ``why`` says so)."""

    def __init__(self, key: str, value: Any, hint: str = "", row: int | None = None, *, why: str | None = None) -> None:
        at = "" if row is None else f" at row {row}"
        if why is None:
            why = (
                f"has unsupported type {type(value).__name__} (value {value!r:.80}); log int, float, bool, str or None."
            )
        else:
            why = f"{why} (value {value!r:.80})."
        self.reason = why
        super().__init__(f"Metric {key!r}{at} {why}" + (f" {hint}" if hint else ""))
        self.key = key
        self.value = value
        self.row = row


class SchemaError(RayCmfError, ValueError):
    """A column changed type in a way that cannot widen (e.g. number to str)."""

    def __init__(self, key: str, row: int, old: str, new: str) -> None:
        self.reason = f"changed type from {old} to {new}; only int -> float widens. Log it under another name."
        super().__init__(f"Metric {key!r} at row {row} {self.reason}")
        self.key = key
        self.row = row
        self.old = old
        self.new = new


class PrecisionError(RayCmfError, ValueError):
    """A number that its column cannot hold exactly (an int beyond int64, or beyond 2**53 among floats)."""

    def __init__(self, key: str, row: int, value: Any, why: str) -> None:
        self.reason = (
            f"{value!r} {why}, so it would not come back exactly. Log float(value) yourself, or log it under "
            "another name."
        )
        super().__init__(f"Metric {key!r} at row {row}: {self.reason}")
        self.key = key
        self.row = row
        self.value = value


class InvalidArgumentError(RayCmfError, ValueError):
    """An argument a caller passed (a mode, a count, a column to colour by) that cannot be used."""


class StoreError(RayCmfError):
    """The store directory or its MLMD database cannot be opened or written."""


class MetricsNotFoundError(RayCmfError, KeyError):
    """No committed metrics of that name (or md5) exist in the pipeline; ``held``: the names it has, where
    the error lists them."""

    def __init__(self, message: str, held: list[str] | None = None) -> None:
        super().__init__(message)
        self.held = held or []

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0])


class RecoveryError(RayCmfError):
    """Some dangling spills could not be committed: every other one was (``recovered``), and each that failed
    (``failed``: its directory and why) is left as it was, to be fixed and recovered again."""

    def __init__(self, failed: dict[Path, Exception], recovered: list[Any]) -> None:
        lines = "".join(f"\n  {directory}: {type(exc).__name__}: {exc}" for directory, exc in failed.items())
        super().__init__(
            f"{len(failed)} spilled series could not be committed; they are kept as they were, so recover again "
            f"once the cause is fixed ({len(recovered)} other series were committed):{lines}"
        )
        self.failed = failed
        self.recovered = recovered


def recorded_error(text: str) -> str:
    """An error's text as a trial or run records it (its ``error``): at most ``ERROR_CHARS`` characters. A
    longer one keeps the exception that ends it (see :func:`exception_of`): its type and the start and end
    of its message; then as much of the traceback before it as fits, innermost frames first. A mark says how
    much was cut."""
    text = text.strip()
    if len(text) <= ERROR_CHARS:
        return text
    trace, exception = _split(text)
    exception = _cut_middle(exception, ERROR_CHARS // 2 if trace else ERROR_CHARS)
    room = ERROR_CHARS - len(exception) - 1
    return f"{_cut_start(trace, room)}\n{exception}" if trace and room > len(_mark(len(trace))) else exception


def exception_of(text: str) -> str:
    """The exception that ends an error's text: what follows a traceback's last frame (its ``File ...`` line
    and the indented lines under it), or the whole text where it holds no traceback."""
    return _split(text.strip())[1]


def _split(text: str) -> tuple[str, str]:
    """(the traceback, the exception) of an error's text; the traceback is empty where there is none."""
    lines = text.split("\n")
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if not frames:
        return "", text
    end = frames[-1] + 1
    while end < len(lines) and lines[end].startswith((" ", "\t")):
        end += 1
    if end == len(lines):
        return "", text
    return "\n".join(lines[:end]).rstrip(), "\n".join(lines[end:]).strip()


def _mark(cut: int) -> str:
    return f" [… {cut} characters cut …] "


def _cut_middle(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters: its start and its end around a mark of the cut."""
    if len(text) <= most:
        return text
    keep = (most - len(_mark(len(text)))) // 2
    return f"{text[:keep]}{_mark(len(text) - 2 * keep)}{text[-keep:]}"


def _cut_start(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters: its end, after a mark of the cut."""
    if len(text) <= most:
        return text
    keep = most - len(_mark(len(text)))
    return f"{_mark(len(text) - keep).lstrip()}{text[-keep:]}"
