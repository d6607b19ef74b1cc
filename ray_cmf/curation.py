"""What users curate on an execution after the fact: tags, a note and the soft-delete mark.

Each is a property under ray_cmf's reserved prefix (no config key can take it), written as a field-masked
MLMD update: editing a tag from the command line while the sweep's writer marks the same execution
COMPLETE loses neither change. Editing needs MLMD only, so it works from any machine that reaches a team
store's database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ray_cmf._names import check_texts
from ray_cmf.constants import DELETED_PROPERTY, NOTE_PROPERTY, TAG_PREFIX
from ray_cmf.errors import InvalidArgumentError

TAG_COLUMN = "tag/"  # the trial table's column prefix of a tag
NOTE_COLUMN = "note"
DELETED_COLUMN = "deleted_at"
_TAG_KEY = re.compile(r"^[^\W\d][\w-]*$")  # a letter or "_" first; then letters, digits, "_" and "-"


def check_tag_key(key: object) -> str:
    """Return ``key`` if it can name a tag (``team``, ``run-kind``, ``équipe``), else raise naming it."""
    if not isinstance(key, str) or not _TAG_KEY.match(key):
        raise InvalidArgumentError(
            f"Invalid tag key {key!r}: a tag key starts with a letter or '_' and holds letters, digits, '_' and '-'"
        )
    return key


def tag_properties(tags: Mapping[str, Any]) -> dict[str, str]:
    """The execution properties of ``tags`` (values as text, as MLflow and W&B keep them)."""
    props = {}
    for key, value in tags.items():
        check_tag_key(key)
        if not isinstance(value, str | int | float | bool) or (isinstance(value, float) and value != value):
            raise InvalidArgumentError(
                f"Tag {key!r} has value {value!r}: a tag's value is text, a number other than NaN, or a bool "
                f"(a tag is removed with remove=[{key!r}])"
            )
        check_texts(f"tag {key!r}", value)
        props[TAG_PREFIX + key] = str(value)
    return props


def untag_properties(keys: Iterable[str]) -> list[str]:
    """The execution properties that removing the tags ``keys`` drops."""
    return [TAG_PREFIX + check_tag_key(key) for key in keys]


def note_properties(text: str) -> tuple[dict[str, str], list[str]]:
    """(set, remove) for a note: an empty text removes it."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"A note is text, got {text!r}")
    check_texts("the note", text)
    return ({NOTE_PROPERTY: text}, []) if text else ({}, [NOTE_PROPERTY])


def deleted_properties(deleted: bool, when: datetime | None = None) -> tuple[dict[str, str], list[str]]:
    """(set, remove) that marks an execution deleted (at ``when``, default now) or not."""
    if not deleted:
        return {}, [DELETED_PROPERTY]
    moment = when or datetime.now(timezone.utc)
    return {DELETED_PROPERTY: moment.astimezone(timezone.utc).isoformat(timespec="seconds")}, []


def check_deleted(wrong: Sequence[str], deleted: bool) -> None:
    """Refuse trials that a delete (``deleted=False``: each must not be deleted yet) or an undelete
    (``deleted=True``) names but cannot act on: ``wrong``, the ones whose mark is not ``deleted``."""
    if wrong:
        raise InvalidArgumentError(f"{list(wrong)} {'are not deleted' if deleted else 'are already deleted'}")


def curated_columns(props: Mapping[str, Any]) -> dict[str, Any]:
    """An execution's tags (``tag/<key>``) and note, as trial-table columns."""
    columns: dict[str, Any] = {
        TAG_COLUMN + k[len(TAG_PREFIX) :]: v for k, v in sorted(props.items()) if k.startswith(TAG_PREFIX)
    }
    columns[NOTE_COLUMN] = props.get(NOTE_PROPERTY)
    return columns


def deleted_at(mark: object) -> datetime | None:
    """When an execution was marked deleted, from its ``DELETED_PROPERTY`` value (None: it is not)."""
    return datetime.fromisoformat(str(mark)) if mark else None
