"""Validation of names that become path components or MLMD names."""

from __future__ import annotations

from ray_cmf.errors import InvalidNameError


def check_name(what: str, name: object) -> str:
    """Return ``name`` if it is safe as one path component, else raise InvalidNameError."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or ".." in name:
        raise InvalidNameError(what, name)
    return name
