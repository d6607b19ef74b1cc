"""ML-Metadata lineage in cmflib's model: pipeline (parent) and stage (child) contexts, executions, artifacts.

Only the store's single writer opens a Lineage for writing; readers open it read-only.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from ml_metadata import errors as mlmd_errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as mlpb

from ray_cmf._json import NONFINITE_TEXT, JsonText, float_of
from ray_cmf._names import check_texts, escaped, unstorable
from ray_cmf.connection import POSTGRES_SCHEMES, connection_config, explain, is_url, scheme_of
from ray_cmf.constants import (
    CONFIG_JSON,
    ENV_PREFIX,
    EXECUTION_METRICS_TYPE,
    NAME_PROPERTY,
    OWNER_PROPERTY,
    PIPELINE_CONTEXT_TYPE,
    RECORDED_PROPERTIES,
    RESERVED_PREFIX,
    SEED_PREFIX,
    STAGE_CONTEXT_TYPE,
    TRIAL_EXECUTION_TYPE,
    TRIAL_PROPERTY,
    VALUES_JSON,
)
from ray_cmf.errors import InvalidArgumentError, StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")
# ML-Metadata's protobuf classes, named once (it ships no type information: to a type checker they are Any)
Artifact: TypeAlias = mlpb.Artifact
Context: TypeAlias = mlpb.Context
Execution: TypeAlias = mlpb.Execution

_STATES = {
    "RUNNING": mlpb.Execution.RUNNING,
    "COMPLETE": mlpb.Execution.COMPLETE,
    "FAILED": mlpb.Execution.FAILED,
    "CANCELED": mlpb.Execution.CANCELED,
}
_EVENTS = {"input": mlpb.Event.INPUT, "output": mlpb.Event.OUTPUT}
RUNNING = mlpb.Execution.RUNNING
_STATE_NAMES = {0: "UNKNOWN", 1: "NEW", 2: "RUNNING", 3: "COMPLETE", 4: "FAILED", 5: "CACHED", 6: "CANCELED"}
_PROPERTY_TYPES = {str: mlpb.STRING, int: mlpb.INT, float: mlpb.DOUBLE}
_SCHEMA_RACE_PAUSES = (0.2, 0.5, 1.0, 2.0, 4.0)  # seconds between tries while another process makes the schema
_CREATION_RACES = (  # what ML-Metadata says when another process creates the same database at once
    "schema_version",
    "already exists",
    "duplicate key",
    "subset of tables",
    "retry the connection",
    "database is locked",
    "Concurrent writes aborted",  # SQLite's: ML-Metadata's own retries of a busy database ran out
)
_DEADLOCKS = ("Deadlock found", "deadlock detected")  # MySQL's and PostgreSQL's: the transaction was rolled back
_DEADLOCK_PAUSES = (0.05, 0.1, 0.2, 0.5, 1.0)  # seconds between the tries of a call that a deadlock rolled back
_SOURCE_ERROR = "metadata source error"  # what ML-Metadata says of a server's error, a lost connection's too


def flatten_config(config: Mapping[str, Any], *, as_json: bool = True, warn: bool = False) -> dict[str, Any]:
    """Flatten nested mappings to ``a.b`` keys; keep scalars, and anything else (a list, say) as its JSON
    text when ``as_json`` (an MLMD property or a table cell holds a scalar) or as it is.

    Of keys that flatten to one name, the one written with fewer levels is kept (``"a.b"`` over
    ``{"a": {"b": ...}}``: the key a cmflib user wrote as an MLMD property), then the first in sorted order,
    so that recording and reading a config keep the same one. ``warn`` (where a config is recorded) names
    each key left out."""
    flat: dict[str, Any] = {}
    kept: dict[str, tuple[str, ...]] = {}  # each name's path of keys
    for path, value in sorted(_leaves(config, ()), key=lambda leaf: len(leaf[0])):  # stable: sorted keys within
        name = ".".join(path)
        if name in kept:
            if warn:
                log.warning(
                    "ray_cmf: config%s and config%s both flatten to %r: the first is kept (config_json keeps both)",
                    _subscripts(kept[name]),
                    _subscripts(path),
                    name,
                )
            continue
        kept[name] = path
        if value is None or isinstance(value, bool | int | float | str):
            flat[name] = value
        elif _scalar(value):
            flat[name] = value.item()
        else:
            flat[name] = JsonText(json.dumps(value, default=_plain)) if as_json else value
    return dict(sorted(flat.items(), key=lambda item: kept[item[0]]))


def _subscripts(path: tuple[str, ...]) -> str:
    return "".join(f"[{key!r}]" for key in path)


def _leaves(config: Mapping[str, Any], path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each non-mapping value of a nested config with its path of keys, each level in sorted key order; an
    empty mapping is a value (``{}``), not a level of no keys, so that it reads back."""
    for key in sorted(config, key=str):
        value = config[key]
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, (*path, str(key)))
        else:
            yield (*path, str(key)), value


def _scalar(value: Any) -> bool:
    """Whether a value is a NumPy scalar or a 0-d array or tensor (``np.float32(0.5)``, a grid of
    ``np.arange`` values): recorded as the Python number it holds."""
    return hasattr(value, "item") and getattr(value, "ndim", None) == 0


def _plain(value: Any) -> Any:
    """What JSON records for a value it has no type for: a scalar's number, an array's list, else its repr."""
    if _scalar(value):
        return value.item()
    return value.tolist() if hasattr(value, "tolist") else repr(value)


def config_json(config: Mapping[str, Any]) -> str:
    """A config as the execution's ``config_json``: what ``Sweep`` reads back as ``config/<key>`` columns.
    NaN and inf are kept as numbers (JSON's lenient ``NaN`` and ``Infinity``, which ``json.loads`` reads);
    other text than ASCII as it is, not as ``\\u`` escapes (see :class:`Dialect`)."""
    return json.dumps(config, default=_plain, sort_keys=True, ensure_ascii=False)


def config_properties(config: Mapping[str, Any]) -> dict[str, Any]:
    """Execution properties for a config: its flattened scalars plus the whole config as JSON. A key named
    like what ray_cmf records (see :func:`records`) stays in the JSON only, so it can neither pose as a tag,
    a seed or the run's status, nor write over them."""
    check_texts("config", config)
    return {**not_recorded(flatten_config(config, warn=True)), CONFIG_JSON: config_json(config)}


def observed_config_properties(config: Mapping[str, Any], whose: str) -> dict[str, Any]:
    """:func:`config_properties` of a config that ray_cmf records but was not handed (a Tune trial's, a Train
    run's ``train_loop_config``; ``whose`` names it): a text in it that the store cannot hold is recorded
    escaped, with a warning, since refusing it would leave a trial or run that Ray runs anyway unrecorded."""
    try:
        return config_properties(config)
    except InvalidArgumentError as exc:
        log.warning("ray_cmf: %s: %s; its config is recorded with such texts escaped", whose, exc)
        return config_properties(escaped(config))


def records(key: str) -> bool:
    """Whether an execution property of this name holds what ray_cmf records of a run (its status, error,
    seeds, environment, tags, ...), which a config's key of the same name must not write over."""
    return key in RECORDED_PROPERTIES or key.startswith((ENV_PREFIX, SEED_PREFIX, RESERVED_PREFIX))


def not_recorded(props: Mapping[str, Any]) -> dict[str, Any]:
    """``props`` less the names that ray_cmf records itself (see :func:`records`)."""
    return {k: v for k, v in props.items() if not records(k)}


@dataclass(frozen=True)
class Dialect:
    """What a database's ML-Metadata can hold: ints of ``int_bits`` (64 in SQLite, 32 in ML-Metadata's
    PostgreSQL and MySQL schemas), and text with a backslash or not (ML-Metadata 1.17 writes such a text
    to PostgreSQL as broken SQL, ``'E'...'``: there it is held as base64, see :func:`_text`)."""

    int_bits: int = 64
    backslashes: bool = True

    @classmethod
    def of(cls, target: str) -> Dialect:
        """The dialect of an MLMD target: a SQLite file, or a server's URL."""
        if not is_url(target):
            return cls()
        return cls(int_bits=32, backslashes=scheme_of(target) not in POSTGRES_SCHEMES)


ENCODED_TEXT = "ray_cmf:b64:"  # a text property held as base64 (see _text); any text that begins so is too


def _text(value: str, dialect: Dialect) -> str:
    """A text (a property's value or name) as the database holds it: as it is, or base64 behind
    :data:`ENCODED_TEXT` where it has a backslash the database cannot take, or begins as an encoded text does
    (so that reading is unambiguous)."""
    if value.startswith(ENCODED_TEXT) or (not dialect.backslashes and "\\" in value):
        return ENCODED_TEXT + base64.b64encode(value.encode()).decode("ascii")
    return value


def _decoded(raw: str) -> str:
    """A text property as it was written (see :func:`_text`; one that only looks encoded, as it is)."""
    if not raw.startswith(ENCODED_TEXT):
        return raw
    try:
        return base64.b64decode(raw[len(ENCODED_TEXT) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return raw


def _value(value: Any, dialect: Dialect) -> mlpb.Value:
    """A Python scalar as an MLMD Value (bool, int, double or string; anything else as JSON), as the
    database's ``dialect`` holds it: an int wider than its int column is kept exactly, as its decimal
    string, and a text it cannot take is encoded (see :func:`_text`)."""
    if _scalar(value):
        value = value.item()
    if isinstance(value, bool):
        return mlpb.Value(bool_value=value)
    if isinstance(value, int):
        bound = 2 ** (dialect.int_bits - 1)
        return mlpb.Value(int_value=value) if -bound <= value < bound else mlpb.Value(string_value=str(value))
    if isinstance(value, float | int):
        if not math.isfinite(value):  # MLMD's SQL writer renders nan/inf as bare words and fails
            return mlpb.Value(string_value=NONFINITE_TEXT[str(float(value))])
        return mlpb.Value(double_value=float(value))
    text = value if isinstance(value, str) else json.dumps(value, default=_plain, ensure_ascii=False)
    return mlpb.Value(string_value=_text(text, dialect))


def python_value(value: mlpb.Value, *, text: bool = False) -> Any:
    """An MLMD Value back as a Python scalar (non-finite floats included; ``text``: a string as it is, where
    the property only ever holds text, such as a tag, whose "NaN" is no float)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    raw = getattr(value, kind)
    if kind != "string_value":
        return raw
    raw = _decoded(raw)
    return raw if text else float_of(raw)


def properties(node: Artifact | Execution | Context, *, text: bool = False) -> dict[str, Any]:
    """Typed and custom properties of an MLMD node as one plain dict (``text``: see :func:`python_value`)."""
    out = {_decoded(k): python_value(v, text=text) for k, v in node.custom_properties.items()}
    out.update({_decoded(k): python_value(v, text=text) for k, v in node.properties.items()})
    return out


def _duplicate(exc: BaseException) -> bool:
    """Whether a write failed on a unique key: another writer of a shared database got there first."""
    text = str(exc).lower()
    return isinstance(exc, mlmd_errors.AlreadyExistsError) or "duplicate" in text or "already exists" in text


def _created_or_found(create: Callable[[], T], find: Callable[[], T | None]) -> T:
    """``create()``, or, when another writer created the same node first, the node it created."""
    try:
        return create()
    except Exception as exc:
        found = find() if _duplicate(exc) else None
        if found is None:
            raise
        return found


def lineage_away(error: BaseException) -> bool:
    """Whether an error says the MLMD server did not answer (down, restarting) or failed a call: what a
    later try may not meet. Not a unique key that another writer took first: ML-Metadata words that as a
    source error too, but the server answered, and trying again meets the same key."""
    return _SOURCE_ERROR in str(error) and not _duplicate(error)


class _Restarting:
    """A database server's MetadataStore whose calls run again when the server rolled their transaction back
    on a deadlock (two writers of one database at once, as a team's drivers are): what MySQL's "try
    restarting transaction" asks of its clients. Each ML-Metadata call is one transaction.

    A call that fails with a source error (the server restarted, and ML-Metadata keeps its dead connection
    for ever) connects again, and runs once more where the server answers: its transaction was rolled back.
    """

    def __init__(self, connect: Callable[[], metadata_store.MetadataStore]) -> None:
        self._connect = connect
        self._store = connect()

    def __getattr__(self, name: str) -> Any:
        if not callable(getattr(self._store, name)):
            return getattr(self._store, name)

        def restarting(*args: Any, **kwargs: Any) -> Any:
            reconnected = False
            for pause in (*_DEADLOCK_PAUSES, None):
                try:
                    return getattr(self._store, name)(*args, **kwargs)
                except Exception as exc:
                    if not reconnected and lineage_away(exc) and self._reconnected():
                        reconnected = True
                        continue
                    if pause is None or not any(deadlock in str(exc) for deadlock in _DEADLOCKS):
                        raise
                    time.sleep(pause)
            raise AssertionError("unreachable")

        return restarting

    def _reconnected(self) -> bool:
        """Whether a new connection to the server could be made (it replaces the old one)."""
        try:
            self._store = self._connect()
        except StoreError:
            return False
        return True


def _set(target: Any, props: Mapping[str, Any] | None, dialect: Dialect) -> None:
    for key, value in (props or {}).items():
        if value is None:
            continue
        target[_text(key, dialect)].CopyFrom(_value(value, dialect))  # a name is a text too


class Lineage:
    """A typed, cmflib-shaped view of one MLMD database.

    Args:
        target: SQLite file path (created on demand) or a MySQL URL.
        readonly: Open without write access (for readers beside the single writer).
    """

    def __init__(self, target: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.target = os.fspath(target)
        if not is_url(self.target):
            path = Path(self.target)
            if readonly and not path.is_file():
                raise StoreError(f"No MLMD database at {path}; run a sweep or Cmf commit first")
            if not readonly:
                path.parent.mkdir(parents=True, exist_ok=True)
        connect = functools.partial(self._connect, readonly)
        self.store: metadata_store.MetadataStore = _Restarting(connect) if is_url(self.target) else connect()
        self._dialect = Dialect.of(self.target)
        self._type_ids: dict[tuple[str, str], int] = {}

    def _connect(self, readonly: bool) -> metadata_store.MetadataStore:
        """Open the database; retry ML-Metadata's first-connection races (two processes
        creating the database, or its schema, at once: "already exists", "MLMDEnv table exists but no
        schema_version", "There are a subset of tables in MLMD instance ... Please retry the connection")."""
        config = connection_config(self.target, readonly=readonly)
        for pause in (*_SCHEMA_RACE_PAUSES, None):
            try:
                store = metadata_store.MetadataStore(config)
                store.get_context_types()  # fail here, not at first use, on a corrupt file
                return store
            except Exception as exc:
                if pause is None or not any(race in str(exc) for race in (*_CREATION_RACES, *_DEADLOCKS)):
                    raise StoreError(explain(self.target, exc)) from exc
                time.sleep(pause)
        raise AssertionError("unreachable")

    # -- types ---------------------------------------------------------------------------------------
    def type_id(self, kind: str, name: str, typed: Mapping[str, type] | None = None) -> int:
        """Id of the artifact/execution/context type ``name``, created (or extended) on first use."""
        key = (kind, name)
        if key not in self._type_ids:
            proto = {"artifact": mlpb.ArtifactType, "execution": mlpb.ExecutionType, "context": mlpb.ContextType}[kind]
            node = proto(name=name)
            for prop, py in (typed or {}).items():
                node.properties[prop] = _PROPERTY_TYPES[py]
            put = getattr(self.store, f"put_{kind}_type")
            self._type_ids[key] = _created_or_found(
                lambda: put(node, can_add_fields=True, can_omit_fields=True),
                lambda: put(node, can_add_fields=True, can_omit_fields=True),  # the other writer's type, extended
            )
        return self._type_ids[key]

    def find_type_id(self, kind: str, name: str) -> int | None:
        """Id of an existing type, or None; never writes (safe on a read-only database)."""
        if (kind, name) not in self._type_ids:
            try:
                found = getattr(self.store, f"get_{kind}_type")(name)
            except mlmd_errors.NotFoundError:
                return None
            self._type_ids[(kind, name)] = found.id
        return self._type_ids[(kind, name)]

    # -- contexts ------------------------------------------------------------------------------------
    def _context(self, type_name: str, name: str, props: Mapping[str, Any] | None) -> Context:
        type_id = self.type_id("context", type_name)
        existing = self.store.get_context_by_type_and_name(type_name, name)
        if existing is not None:
            return existing
        ctx = mlpb.Context(type_id=type_id, name=name)
        _set(ctx.custom_properties, props, self._dialect)

        def create() -> Context:
            [ctx.id] = self.store.put_contexts([ctx])
            return ctx

        return _created_or_found(create, lambda: self.store.get_context_by_type_and_name(type_name, name))

    def pipeline(self, name: str, props: Mapping[str, Any] | None = None) -> Context:
        """The pipeline (parent) context called ``name``, created on first use."""
        return self._context(PIPELINE_CONTEXT_TYPE, name, props)

    def stage(self, pipeline: Context, stage: str, props: Mapping[str, Any] | None = None) -> Context:
        """The stage (child) context of ``pipeline``, created and linked to its parent on first use."""
        ctx = self._context(
            STAGE_CONTEXT_TYPE, f"{pipeline.name}/{stage}", {"pipeline": pipeline.name, "stage": stage, **(props or {})}
        )
        parents = self.store.get_parent_contexts_by_context(ctx.id)
        if not any(p.id == pipeline.id for p in parents):
            link = mlpb.ParentContext(child_id=ctx.id, parent_id=pipeline.id)
            _created_or_found(lambda: self.store.put_parent_contexts([link]), lambda: link)
        return ctx

    def stages(self, pipeline: Context) -> list[Context]:
        """Stage contexts of a pipeline, oldest first."""
        return sorted(self.store.get_children_contexts_by_context(pipeline.id), key=lambda c: c.id)

    def pipelines(self) -> list[Context]:
        """Every pipeline context, oldest first."""
        return sorted(self.store.get_contexts_by_type(PIPELINE_CONTEXT_TYPE), key=lambda c: c.id)

    def find_pipeline(self, name: str) -> Context | None:
        """The pipeline called ``name``; None when there is none (a name the store cannot hold names none)."""
        if unstorable(name) is not None:
            return None
        return self.store.get_context_by_type_and_name(PIPELINE_CONTEXT_TYPE, name)

    # -- executions ----------------------------------------------------------------------------------
    def execution(
        self,
        stage: Context,
        type_name: str,
        name: str,
        props: Mapping[str, Any] | None = None,
        *,
        in_stage: bool = True,
        owner: str | None = None,
    ) -> Execution:
        """The execution ``name`` of ``type_name`` in ``stage``: reused if the stage holds it (restores), else
        created.

        ``in_stage``: the name is the stage's own, not the database's: Tune's trial ids (``<5 hex digits of
        the clock>_<n>``) and Train's run names recur across the sweeps of one store. MLMD names are unique
        per type, so where another stage holds ``name`` this stage's is recorded as
        ``<pipeline>/<stage>/<name>`` (then ``...#2``, ``#3``: see ``owner``), its own name in the
        ``ray_cmf:name`` property. False: the database's, as cmflib names executions (reopened by name from
        any stage).
        ``owner``: the sweep or trial it belongs to (``OWNER_PROPERTY``): a stage's execution of that name
        with another owner is not reused (a new sweep whose trial ids coincide with an earlier one's there).
        """
        type_id = self.type_id("execution", type_name)
        if not in_stage:
            return self._named_execution(stage, type_id, type_name, name, props, name)
        owned = {**(props or {}), **({OWNER_PROPERTY: owner} if owner is not None else {})}
        qualified = (f"{stage.name}/{name}#{n}" if n > 1 else f"{stage.name}/{name}" for n in itertools.count(1))
        candidates = (
            self._named_execution(stage, type_id, type_name, recorded, owned, name)
            for recorded in itertools.chain([name], qualified)
        )
        return next(e for e in candidates if self._held(stage, e, owner))

    def _held(self, stage: Context, execution: Execution, owner: str | None) -> bool:
        """Whether ``stage`` holds ``execution`` (for ``owner``, when one is given)."""
        if owner is not None and property_of(execution, OWNER_PROPERTY) != owner:
            return False
        return any(c.id == stage.id for c in self.contexts_of(execution.id))

    def _named_execution(
        self, stage: Context, type_id: int, type_name: str, recorded: str, props: Mapping[str, Any] | None, name: str
    ) -> Execution:
        """The execution MLMD records as ``recorded``, created in ``stage`` where there is none."""
        existing = self.store.get_execution_by_type_and_name(type_name, recorded)
        if existing is not None:
            return existing
        execution = mlpb.Execution(type_id=type_id, name=recorded, last_known_state=mlpb.Execution.RUNNING)
        own = {NAME_PROPERTY: name} if recorded != name else {}
        _set(execution.custom_properties, {**(props or {}), **own}, self._dialect)

        def create() -> Execution:
            execution.id, _, _ = self.store.put_execution(execution, [], [stage], reuse_context_if_already_exist=True)
            return execution

        return _created_or_found(create, lambda: self.store.get_execution_by_type_and_name(type_name, recorded))

    def update_execution(
        self,
        execution_id: int,
        props: Mapping[str, Any] | None = None,
        state: str | None = None,
        *,
        config: bool = False,
        remove: Iterable[str] = (),
    ) -> Execution:
        """Merge ``props`` into an execution's custom properties (``config``: into its config too), drop those
        named in ``remove`` and optionally set its state."""
        execution = self.get_execution(execution_id)
        held = (_text(key, self._dialect) for key in remove)
        dropped = [key for key in held if key in execution.custom_properties]
        if not props and state is None and not dropped:
            return execution  # nothing to change: no write
        if config and props:
            recorded = execution.custom_properties.get(CONFIG_JSON)
            before = json.loads(python_value(recorded, text=True)) if recorded is not None else {}
            props = {**not_recorded(props), CONFIG_JSON: config_json({**before, **props})}
        _set(execution.custom_properties, props, self._dialect)
        for key in dropped:
            del execution.custom_properties[key]
        if state is not None:
            execution.last_known_state = _STATES[state]
        self.store.put_executions([execution])
        return execution

    def patch_executions(
        self, execution_ids: Sequence[int], props: Mapping[str, Any], remove: Iterable[str] = ()
    ) -> None:
        """Set ``props`` and drop the properties ``remove`` of executions, touching no other field, in one
        transaction: a field mask makes it an update that cannot undo what another process wrote meanwhile
        (a state, a status)."""
        paths = [f"custom_properties.{_text(key, self._dialect)}" for key in dict.fromkeys([*props, *remove])]
        if not paths or not execution_ids:
            return
        types = {e.id: e.type_id for e in self.store.get_executions_by_id(list(execution_ids))}
        patches = []
        for execution_id in execution_ids:
            patch = mlpb.Execution(id=execution_id, type_id=types[execution_id])
            _set(patch.custom_properties, props, self._dialect)
            patches.append(patch)
        self.store.put_executions(patches, field_mask_paths=paths)

    def get_execution(self, execution_id: int) -> Execution:
        found = self.store.get_executions_by_id([execution_id])
        if not found:
            raise StoreError(f"No MLMD execution with id {execution_id} in {self.target}")
        return found[0]

    def contexts_of(self, execution_id: int) -> list[Context]:
        return list(self.store.get_contexts_by_execution(execution_id))

    # -- artifacts -----------------------------------------------------------------------------------
    def put_artifact(
        self,
        execution_id: int,
        type_name: str,
        name: str,
        uri: str,
        typed: Mapping[str, Any],
        custom: Mapping[str, Any] | None = None,
        event: str = "output",
        instance: str = "",
    ) -> Artifact:
        """Record an artifact, its event and its attribution in ONE ``put_execution`` transaction.

        ``instance`` names which of the execution's series of one name this is (a Train rank's, say): it is
        the event's path, so content shared by several executions keeps each one's role.
        """
        if self._dialect.int_bits < 64:  # a size or row count may pass 2**31: a double holds it exactly (to 2**53)
            typed = {k: float(v) if type(v) is int else v for k, v in typed.items()}
        type_id = self.type_id("artifact", type_name, {k: type(v) for k, v in typed.items()})
        execution = self.get_execution(execution_id)
        contexts = self.contexts_of(execution_id)
        artifact = self.store.get_artifact_by_type_and_name(type_name, name)
        if artifact is not None and self._has_event(execution_id, artifact.id, event):
            return artifact  # the same content committed again by the same execution: already recorded
        if artifact is None:  # the same content logged again (e.g. one dataset, many trials) is linked, not copied
            artifact = mlpb.Artifact(type_id=type_id, name=name, uri=uri, state=mlpb.Artifact.LIVE)
            _set(artifact.properties, typed, self._dialect)
            _set(artifact.custom_properties, custom, self._dialect)
        try:
            _, [artifact.id], _ = self.store.put_execution(
                execution, [(artifact, _event(event, instance))], contexts, reuse_context_if_already_exist=True
            )
        except Exception as exc:  # another writer of a shared database recorded the same content first
            existing = self.store.get_artifact_by_type_and_name(type_name, name) if _duplicate(exc) else None
            if existing is None:
                raise
            artifact = existing
            self.link(execution_id, artifact.id, event, instance)
        return artifact

    def link(self, execution_id: int, artifact_id: int, event: str, instance: str = "") -> None:
        """Add an event between an existing execution and artifact (one transaction), attributing the
        artifact to the execution's contexts too."""
        if self._has_event(execution_id, artifact_id, event):
            return
        execution = self.get_execution(execution_id)
        [artifact] = self.store.get_artifacts_by_id([artifact_id])
        self.store.put_execution(
            execution,
            [(artifact, _event(event, instance))],
            self.contexts_of(execution_id),
            reuse_context_if_already_exist=True,
        )

    def _has_event(self, execution_id: int, artifact_id: int, event: str) -> bool:
        """Whether the execution already has this event with the artifact (MLMD refuses a second one)."""
        return any(
            e.execution_id == execution_id and e.type == _EVENTS[event]
            for e in self.store.get_events_by_artifact_ids([artifact_id])
        )

    def artifacts(self, contexts: Iterable[Context], type_name: str) -> list[Artifact]:
        """Artifacts of one type attributed to any of ``contexts``, oldest first."""
        seen: dict[int, Artifact] = {}
        type_id = self.find_type_id("artifact", type_name)
        if type_id is None:
            return []
        for ctx in contexts:
            for artifact in self.store.get_artifacts_by_context(ctx.id):
                if artifact.type_id == type_id:
                    seen[artifact.id] = artifact
        return [seen[k] for k in sorted(seen)]

    def producers(self, artifact_ids: list[int]) -> list[Output]:
        """Every OUTPUT event of the artifacts (one query), oldest first.

        A Train run's file is an output of the run and of its Tune trial.
        """
        events = self.store.get_events_by_artifact_ids(artifact_ids) if artifact_ids else []
        return _outputs(events)

    def files_of(self, execution_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """Per execution, every artifact it used or made (inputs and outputs, every version), as the rows
        that ``ray-cmf show`` and the report list: event, type, name, version (the execution's versions of
        one name, counted from 1 in the order it recorded them), md5, rows, rows lost, url, and whether
        ``ray-cmf gc`` freed its file."""
        events = self.store.get_events_by_execution_ids(execution_ids) if execution_ids else []
        ids = list({e.artifact_id for e in events})
        artifacts = {a.id: a for a in self.store.get_artifacts_by_id(ids)} if ids else {}
        types = {t.id: t.name for t in self.store.get_artifact_types()}
        out: dict[int, list[dict[str, Any]]] = {}
        counted: dict[tuple[int, str, str, str], int] = {}
        for event in sorted(events, key=lambda e: (e.execution_id, e.milliseconds_since_epoch, e.artifact_id)):
            artifact = artifacts[event.artifact_id]
            props = properties(artifact)
            kind = "input" if event.type == mlpb.Event.INPUT else "output"
            type_name = types.get(artifact.type_id, "?")
            name = props.get("metrics_name", artifact.name.split(":")[0])
            series = (event.execution_id, kind, type_name, name)
            counted[series] = counted.get(series, 0) + 1
            out.setdefault(event.execution_id, []).append(
                {
                    "event": kind,
                    "type": type_name,
                    "name": name,
                    "version": counted[series],
                    "md5": props.get("Commit", ""),
                    "rows": props.get("rows"),
                    "rows_lost": props.get("rows_lost"),
                    "url": props.get("url", artifact.uri),
                    "freed": collected(artifact),  # gc took its bytes; the record stays
                }
            )
        return out

    def execution_metrics(self, execution_ids: Collection[int], *, as_json: bool = True) -> dict[int, dict[str, Any]]:
        """Per execution, what it logged with ``log_execution_metrics``, as ``{"<metrics_name>/<key>": value}``
        (``as_json``: a list or other value no table cell holds as its JSON text); a name logged again takes
        the later values. A few executions' are read through their events, a sweep's by type: each query
        then reads what it asks for, not every Metrics artifact of the store."""
        if len(execution_ids) <= _FEW_EXECUTIONS:
            type_id = self.find_type_id("artifact", EXECUTION_METRICS_TYPE)
            events = self.store.get_events_by_execution_ids(list(execution_ids)) if type_id is not None else []
            made = list(dict.fromkeys(o.artifact_id for o in _outputs(events)))
            found = self.store.get_artifacts_by_id(made) if made else []
            artifacts = {a.id: a for a in found if a.type_id == type_id}
        else:
            artifacts = {a.id: a for a in self.store.get_artifacts_by_type(EXECUTION_METRICS_TYPE)}
            events = self.store.get_events_by_artifact_ids(list(artifacts)) if artifacts else []
        out: dict[int, dict[str, Any]] = {}
        for output in _outputs(events):
            if output.artifact_id in artifacts and output.execution_id in execution_ids:
                artifact = artifacts[output.artifact_id]
                name = property_of(artifact, "metrics_name")
                values = logged_values(artifact, as_json=as_json)
                out.setdefault(output.execution_id, {}).update({f"{name}/{k}": v for k, v in values.items()})
        return out

    def outputs(self, execution_ids: list[int]) -> list[Output]:
        """Every OUTPUT event of the executions (one query), oldest first."""
        events = self.store.get_events_by_execution_ids(execution_ids) if execution_ids else []
        return _outputs(events)


_FEW_EXECUTIONS = 64  # execution_metrics of up to this many executions reads their events, not the whole type


def logged_values(artifact: Artifact, *, as_json: bool = True) -> dict[str, Any]:
    """What ``log_execution_metrics`` logged on a Metrics artifact, as logged (None, text and ints beyond
    int64 included; ``as_json``: see :func:`flatten_config`), from its JSON; an artifact recorded before that
    JSON was kept, from its properties."""
    raw = property_of(artifact, VALUES_JSON)
    if isinstance(raw, str):
        return flatten_config(json.loads(raw), as_json=as_json)
    return {_decoded(k): python_value(v) for k, v in artifact.custom_properties.items()}


def collected(artifact: Artifact) -> bool:
    """Whether ``ray-cmf gc`` took (or is taking) an artifact's file away: its record stays, its bytes do not."""
    return bool(artifact.state in (mlpb.Artifact.MARKED_FOR_DELETION, mlpb.Artifact.DELETED))


def state_name(execution: Execution) -> str:
    """An execution's state as MLMD records it (``RUNNING``, ``COMPLETE``, ``FAILED``, ...)."""
    return _STATE_NAMES.get(execution.last_known_state, "UNKNOWN")


def owner_of(*, sweep: str | None = None, trial: int | None = None) -> str | None:
    """The ``OWNER_PROPERTY`` of a trial of ``sweep``, or of a Train run inside the trial execution ``trial``."""
    return f"sweep:{sweep}" if sweep is not None else f"trial:{trial}" if trial is not None else None


def property_of(node: Artifact | Execution | Context, key: str) -> Any:
    """One property of an MLMD node, typed or custom (None when it has none), converting no other."""
    for found in (node.properties, node.custom_properties):
        if key in found:
            return python_value(found[key])
    return None


def trial_id_of(execution: Execution) -> str:
    """The trial id of an execution (its name for executions that are not Tune trials)."""
    trial_id = property_of(execution, "trial_id")
    if trial_id is None:
        trial_id = property_of(execution, NAME_PROPERTY)
    return str(trial_id) if trial_id is not None else str(execution.name)


def shown_executions(lineage: Lineage, stages: Iterable[Context]) -> list[tuple[Execution, str]]:
    """The executions of ``stages`` that a table of trials shows, with their stage, oldest first: all but the
    Train runs inside a Tune trial of their stage (each shows as its trial)."""
    return trials_and_runs(lineage, stages)[0]


def trials_and_runs(
    lineage: Lineage, stages: Iterable[Context]
) -> tuple[list[tuple[Execution, str]], dict[int, list[Execution]]]:
    """:func:`shown_executions`, and the Train runs inside each Tune trial among them, by the trial's
    execution id, oldest first (what the trial ran on, and its seeds, are theirs)."""
    found = [
        (execution, str(properties(ctx).get("stage", ctx.name)))
        for ctx in stages
        for execution in lineage.store.get_executions_by_context(ctx.id)
    ]
    trial_type = lineage.find_type_id("execution", TRIAL_EXECUTION_TYPE)
    trials = {(stage, trial_id_of(e)): e.id for e, stage in found if e.type_id == trial_type}
    shown: list[tuple[Execution, str]] = []
    runs: dict[int, list[Execution]] = {}
    for execution, stage in sorted(found, key=lambda pair: pair[0].id):
        trial = trials.get((stage, property_of(execution, TRIAL_PROPERTY)))
        if trial is None:
            shown.append((execution, stage))
        else:
            runs.setdefault(trial, []).append(execution)
    return shown, runs


def trial_keys(executions: Sequence[tuple[Execution, str]]) -> dict[int, str]:
    """Each execution's key in a table of ``executions`` (with their stages): its trial id, unless others hold
    that id too (Tune's trial ids recur across sweeps), then ``<stage>/<trial id>``, and where that is still
    another's key (one stage holds the id twice), ``#<execution id>`` after it."""
    held = Counter(trial_id_of(e) for e, _ in executions)
    lone = {e.id: trial_id_of(e) for e, _ in executions if held[trial_id_of(e)] == 1}
    staged = {e.id: f"{stage}/{trial_id_of(e)}" for e, stage in executions if e.id not in lone}
    taken = Counter([*lone.values(), *staged.values()])
    return {**lone, **{i: key if taken[key] == 1 else f"{key}#{i}" for i, key in staged.items()}}


def tune_id_of_key(key: str) -> str:
    """The trial id in a key of :func:`trial_keys` (``c0ffe_00000`` of ``first/c0ffe_00000#12``)."""
    return key.rsplit("/", 1)[-1].split("#", 1)[0]


@dataclass(frozen=True)
class Output:
    """An execution's output: which artifact, and which of the execution's series of that name it is."""

    execution_id: int
    artifact_id: int
    instance: str
    when: int  # milliseconds since the epoch


_clock_lock = threading.Lock()
_last_ms = 0


def _now_ms() -> int:
    """Milliseconds since the epoch, strictly increasing in this process: a writer's events keep their order
    even when two land in one millisecond (MLMD's own stamp would tie them, and the newest version of a
    series is read from that order)."""
    global _last_ms
    with _clock_lock:
        _last_ms = max(_last_ms + 1, time.time_ns() // 1_000_000)
        return _last_ms


def _event(kind: str, instance: str) -> mlpb.Event:
    event = mlpb.Event(type=_EVENTS[kind], milliseconds_since_epoch=_now_ms())
    if instance:
        event.path.steps.add().key = instance
    return event


def _outputs(events: Iterable[mlpb.Event]) -> list[Output]:
    """OUTPUT events as :class:`Output`, in the order they were recorded (ties: the older artifact first)."""
    found = [
        Output(e.execution_id, e.artifact_id, e.path.steps[0].key if e.path.steps else "", e.milliseconds_since_epoch)
        for e in events
        if e.type == mlpb.Event.OUTPUT
    ]
    return sorted(found, key=lambda o: (o.when, o.artifact_id))
