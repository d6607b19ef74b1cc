"""Validation of what callers name: names that become path components or MLMD names, and modes; what errors
say exists where a name was not found."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ray_cmf.constants import MODE_PREFIX
from ray_cmf.errors import InvalidArgumentError, InvalidNameError

MODES = ("min", "max")

_UNSAFE = re.compile(r"[/\\\x00]|\.\.|^\.$|^[A-Za-z]:")  # separators, NUL, "..", ".", a drive letter
# A name becomes a file name with a content hash, suffixes and a temporary file's prefix around it (about 90
# bytes), and file systems cap a file name at 255 bytes.
NAME_MAX_BYTES = 128


def unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored (Parquet, Arrow and MLMD hold UTF-8): a lone surrogate, such as the
    ``\udc80`` Python makes of a byte of a file name that is not UTF-8; None when it can be."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"holds {text[exc.start]!r}, a lone surrogate, which UTF-8 (and so the store) cannot hold"
    return None


def check_texts(what: str, value: object, path: str = "") -> None:
    """Refuse ``value`` (a config, execution metrics, a tag or a note) where a text in it, a key or a value,
    at any depth of its mappings and sequences, cannot be stored (see :func:`unstorable`), naming where; it
    would fail deep in the store, as an encoding error that names nothing."""
    if isinstance(value, str):
        if (wrong := unstorable(value)) is not None:
            raise InvalidArgumentError(f"{what}{path} {wrong}: {value!r:.80}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and (wrong := unstorable(key)) is not None:
                raise InvalidArgumentError(f"{what}{path}: the key {key!r:.80} {wrong}")
            check_texts(what, item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            check_texts(what, item, f"{path}[{i}]")


def escaped(value: Any) -> Any:
    """``value`` with every text the store cannot hold (see :func:`unstorable`), key or value, at any depth of
    its mappings, lists and tuples, written with backslash escapes (``'a\\udc80b'``): for what ray_cmf
    records but did not choose (a Tune trial's config), where refusing would leave the trial unrecorded."""
    if isinstance(value, str):
        return value if unstorable(value) is None else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, Mapping):
        return {escaped(key): escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(map(escaped, value)) if type(value) in (list, tuple) else value
    return value


def check_metric_key(key: object, why: str) -> None:
    """Refuse a metric name (a row's or an execution metric's key) that is no string or is blank: it would
    read as a column of no name, ``_best`` and ``_final``; or one the store cannot hold (see
    :func:`unstorable`). ``why`` ends the first error: what must be non-blank."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidNameError("metric name", key, f"{why} must be non-blank strings")
    if (wrong := unstorable(key)) is not None:
        raise InvalidNameError("metric name", key, f"it {wrong}")


def check_name(what: str, name: object) -> str:
    """Return ``name`` if it is safe as one path component inside the store, else raise InvalidNameError.

    Refused: non-strings, the empty string, "." and anything with "..", a path separator, a NUL byte or
    a leading drive letter, so no name can reach outside the store's directory; names the store cannot
    hold (see :func:`unstorable`); and names longer than :data:`NAME_MAX_BYTES` in UTF-8, which would fail
    only when a file is written.
    """
    if not isinstance(name, str):  # e.g. the values passed where the name goes: log_metric({"loss": 0.1})
        raise InvalidNameError(what, name, f"a name is a string, not a {type(name).__name__}: pass the name first")
    if not name or _UNSAFE.search(name):
        raise InvalidNameError(what, name)
    if (wrong := unstorable(name)) is not None:
        raise InvalidNameError(what, name, f"it {wrong}")
    if len(name.encode()) > NAME_MAX_BYTES:
        why = f"names are at most {NAME_MAX_BYTES} bytes in UTF-8 (they become file names), and this one has"
        raise InvalidNameError(what, name, f"{why} {len(name.encode())}")
    return name


def check_mode(mode: object, argument: str = "mode") -> str:
    """Return ``mode`` if it is ``"min"`` or ``"max"`` (whether lower or higher is better), else raise."""
    if mode not in MODES:
        raise InvalidArgumentError(f"{argument} must be 'min' or 'max', got {mode!r}")
    return str(mode)


def mode_properties(modes: Mapping[str, object], argument: str = "modes") -> dict[str, str]:
    """The execution properties that declare each metric's mode (``{metric: "min" | "max"}``), checked."""
    if not isinstance(modes, Mapping):
        raise InvalidArgumentError(f"{argument} must be a mapping of metric to 'min' or 'max', got {modes!r}")
    for metric in modes:
        if not isinstance(metric, str) or not metric:
            raise InvalidArgumentError(f"{argument}: a metric's name must be a non-empty string, got {metric!r}")
    return {MODE_PREFIX + metric: check_mode(mode, f"{argument}[{metric!r}]") for metric, mode in modes.items()}


def recorded_modes(props: Mapping[str, Any]) -> dict[str, str]:
    """The modes an execution's properties declare (see :func:`mode_properties`), by metric, in the order of
    their names: a database gives properties back in an order that may change from one process to the next,
    and which metric comes first decides what a sweep is ranked by where none is named."""
    declared = {k[len(MODE_PREFIX) :]: v for k, v in props.items() if k.startswith(MODE_PREFIX) and v in MODES}
    return dict(sorted(declared.items()))


def check_limit(limit: object, argument: str = "limit") -> int | None:
    """Return ``limit`` if it is None (no limit) or an int >= 1, else raise naming it."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidArgumentError(f"{argument} must be an int >= 1, got {limit!r}")
    return limit


LISTED_AT_MOST = 20  # names an error lists where it names what exists


def what_exists(asked: Sequence[str], names: Sequence[str]) -> str:
    """What an error says exists beside names it was asked for that do not: the near ones where a name looks
    mistyped, else the names, at most ``LISTED_AT_MOST`` of them (a sweep may hold thousands)."""
    near = list(dict.fromkeys(n for a in asked for n in difflib.get_close_matches(a, names, n=3, cutoff=0.75)))
    if near:
        return f"did you mean {', '.join(map(repr, near))}?"
    more = f" and {len(names) - LISTED_AT_MOST} more" if len(names) > LISTED_AT_MOST else ""
    return f"it has {list(names[:LISTED_AT_MOST])}{more}"
