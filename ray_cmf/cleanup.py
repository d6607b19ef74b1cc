"""Garbage collection: free the files that only deleted trials hold (``ray-cmf gc``).

A trial marked deleted keeps its MLMD record, so its lineage stays explainable; gc takes away the bytes:
its committed Parquet files (with their ``.dvc`` files), their DVC cache objects, on request their objects
on the store's remote, and its spill segments. Content addressing means one object can belong to a live
and a deleted trial; such an object stays.

A gc killed half-way leaves a store that ``ray-cmf verify`` accepts, and the next gc finishes: every
artifact to free is first marked ``MARKED_FOR_DELETION`` in one transaction (verify and every read then
skip it), its bytes are removed (each removal may already have happened), and it is marked ``DELETED``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

import ml_metadata.proto.metadata_store_pb2 as mlpb

from ray_cmf._progress import track
from ray_cmf.constants import (
    ARTIFACTS_DIR,
    DELETED_PROPERTY,
    OWNER_PROPERTY,
    SPILL_DIR,
    SPILL_MANIFEST,
    STEP_METRICS_TYPE,
    TRIAL_PROPERTY,
)
from ray_cmf.curation import deleted_at
from ray_cmf.errors import StoreError
from ray_cmf.exits import process_alive, running_holder
from ray_cmf.lineage import (
    Artifact,
    Execution,
    Lineage,
    collected,
    owner_of,
    properties,
    property_of,
    shown_executions,
    state_name,
    trial_id_of,
    trial_keys,
)
from ray_cmf.remote import Remote
from ray_cmf.series_format import SpillManifest, discard_spill
from ray_cmf.store import Store
from ray_cmf.versioning import cache_path

log = logging.getLogger(__name__)


class FreedTrial(NamedTuple):
    """A trial that a gc freed: its pipeline, and its key in that pipeline's table (see ``Sweep.key``)."""

    pipeline: str
    trial_id: str


@dataclass
class Collected:
    """What a gc freed (or, dry, would free)."""

    trials: list[FreedTrial] = field(default_factory=list)  # the deleted trials whose files were freed
    files: list[str] = field(default_factory=list)  # store URLs of the Parquet files
    bytes: int = 0  # of the files and their cache objects
    cache_objects: int = 0
    remote_objects: int = 0
    spills: int = 0
    kept_shared: int = 0  # files of deleted trials kept because a live trial holds the same artifact or file
    refused: str | None = None  # why a gc now would be refused (a dry run's; a gc that is refused raises it)


def running_holders(lineage: Lineage) -> list[str]:
    """The executions a live process still runs (held here by a live pid, or on another machine, which
    cannot be checked from here), as ``name (pid P on H)``."""
    held = []
    for execution in lineage.store.get_executions():
        holder = running_holder(state_name(execution), properties(execution))
        if holder is not None and process_alive(*holder) is not False:
            held.append(f"{execution.name} (pid {holder[1]} on {holder[0]})")
    return held


def collect(
    store: Store,
    *,
    older_than: timedelta | None = None,
    remote: bool = False,
    dry_run: bool = False,
    force: bool = False,
) -> Collected:
    """Free what only the trials deleted at least ``older_than`` ago hold (see the module's docstring).

    ``remote`` also removes their objects from the store's DVC remote; ``dry_run`` removes nothing and says
    what would go. Refuses while a writer runs a sweep on the store (an execution RUNNING under a live
    process), unless ``force``.
    """
    lineage = store.lineage
    held = running_holders(lineage)
    refused = None
    if held and not force:
        refused = (
            f"the store {store.root} is being written: {len(held)} execution{'' if len(held) == 1 else 's'} running "
            f"({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}). Run gc once the sweep ends "
            "(or `ray-cmf recover` marks crashed ones; --force runs it anyway)."
        )
        if not dry_run:
            raise StoreError(refused)
    pushed = store.require_remote() if remote else None
    with contextlib.nullcontext() if dry_run else store.collecting():  # no commit registers a file meanwhile
        return _collect(store, older_than, pushed, dry_run, Collected(refused=refused))


def _collect(
    store: Store, older_than: timedelta | None, pushed: Remote | None, dry_run: bool, out: Collected
) -> Collected:
    """:func:`collect`'s work once it may run: what no live trial holds, found and freed into ``out``."""
    lineage = store.lineage
    executions = lineage.store.get_executions()
    counted_as = _dead(lineage, executions, older_than)
    dead = set(counted_as)
    doomed, freed_before, live_md5s, out.kept_shared = _doomed(lineage, executions, dead)
    doomed += _left_over(store, freed_before, live_md5s | {_md5(a) for a in doomed}, pushed)
    out.files = [str(properties(a).get("url", a.uri)) for a in doomed]
    spills = _spills(store, dead)
    out.spills = len(spills)
    out.trials = _trials_of(lineage, counted_as, doomed, spills)
    if not dry_run:
        _set_state(lineage, doomed, mlpb.Artifact.MARKED_FOR_DELETION)
    for artifact in track(doomed, "freeing deleted trials' files", len(doomed)):
        for path in _paths(store, artifact, live_md5s):
            if path.is_file():  # an interrupted gc may have removed it already
                out.bytes += path.stat().st_size
                out.cache_objects += path.is_relative_to(store.root / ".dvc")
                if not dry_run:
                    path.unlink()
        md5 = _md5(artifact)
        if md5 in live_md5s:
            continue  # its content stays, on the remote too
        if pushed is not None and md5 and (pushed.exists(md5) if dry_run else pushed.remove(md5)):
            out.remote_objects += 1
    if dry_run:
        return out
    _set_state(lineage, doomed, mlpb.Artifact.DELETED)
    for directory in spills:
        discard_spill(directory)
    _prune_empty(store.root / ARTIFACTS_DIR)
    log.info("ray_cmf.gc: freed %d files, %d bytes of %d deleted trials", len(out.files), out.bytes, len(out.trials))
    return out


def _trials_of(
    lineage: Lineage, counted_as: dict[int, int], doomed: list[Artifact], spills: list[Path]
) -> list[FreedTrial]:
    """The trials whose files or spills this gc frees (a Train run's count as its trial), each named by its
    key in its pipeline's table of trials (Tune's trial ids recur, so an id alone may name several)."""
    ids = (
        {event.execution_id for event in lineage.store.get_events_by_artifact_ids([a.id for a in doomed])}
        if doomed
        else set()
    )
    ids |= {SpillManifest.read(directory).execution_id for directory in spills}
    freed = {counted_as[i] for i in ids if i in counted_as}
    named = []
    for pipeline in lineage.pipelines() if freed else []:
        shown = shown_executions(lineage, lineage.stages(pipeline))
        keys = trial_keys(shown)
        named += [FreedTrial(pipeline.name, keys[e.id]) for e, _ in shown if e.id in freed]
    return sorted(named)


def _dead(lineage: Lineage, executions: list[Execution], older_than: timedelta | None) -> dict[int, int]:
    """The executions to collect, each with the trial it counts as: the trials deleted long enough ago, and
    the Train runs inside such a trial: those that name it as their owner, or (runs recorded before owners)
    those of its Tune id in its stage. Another sweep's trial of the id, in any stage, is another trial."""
    cutoff = datetime.now(timezone.utc) - (older_than or timedelta(0))
    marks = {e.id: deleted_at(property_of(e, DELETED_PROPERTY)) for e in executions}
    dead = {i: i for i, when in marks.items() if when is not None and when <= cutoff}
    runs = [e for e in executions if property_of(e, TRIAL_PROPERTY) is not None]
    owners = {owner_of(trial=i): i for i in dead}
    inside = {r.id: owners[owner] for r in runs if (owner := property_of(r, OWNER_PROPERTY)) in owners}
    unowned = [r for r in runs if property_of(r, OWNER_PROPERTY) is None]
    if unowned and dead:
        stage_of = _stage_of(lineage)
        where = {(stage_of.get(e.id), trial_id_of(e)): e.id for e in executions if e.id in dead}
        for run in unowned:
            trial = where.get((stage_of.get(run.id), property_of(run, TRIAL_PROPERTY)))
            if trial is not None:
                inside[run.id] = trial
    return dead | inside


def _stage_of(lineage: Lineage) -> dict[int, int]:
    """Each execution's stage context id (one query per stage)."""
    return {
        execution.id: stage.id
        for pipeline in lineage.pipelines()
        for stage in lineage.stages(pipeline)
        for execution in lineage.store.get_executions_by_context(stage.id)
    }


def _doomed(
    lineage: Lineage, executions: list[Execution], dead: set[int]
) -> tuple[list[Artifact], list[Artifact], set[str], int]:
    """The metric files that only dead executions hold (those an interrupted gc marked, too); those of them
    that a gc freed already (on another machine, maybe: see :func:`_left_over`); the md5s that live
    executions hold, whose cache objects stay; and how many files of dead executions stay because a live
    execution holds the same artifact or path."""
    events = lineage.store.get_events_by_execution_ids([e.id for e in executions]) if executions else []
    holders: dict[int, set[int]] = {}
    for event in events:
        holders.setdefault(event.artifact_id, set()).add(event.execution_id)
    type_id = lineage.find_type_id("artifact", STEP_METRICS_TYPE)
    artifacts = lineage.store.get_artifacts_by_id(list(holders)) if holders else []
    live_md5s, live_urls = set(), set()
    for artifact in artifacts:
        if holders[artifact.id] - dead and not collected(artifact):  # a freed one holds no content
            props = properties(artifact)
            live_md5s.add(str(props.get("Commit")))
            live_urls.add(str(props.get("url", artifact.uri)))
    doomed, freed, shared = [], [], 0
    for artifact in artifacts:
        if artifact.type_id != type_id or not holders[artifact.id] & dead:
            continue
        if artifact.state == mlpb.Artifact.DELETED:
            freed.append(artifact)
            continue
        held_alive = (
            bool(holders[artifact.id] - dead) or str(properties(artifact).get("url", artifact.uri)) in live_urls
        )
        if held_alive and artifact.state != mlpb.Artifact.MARKED_FOR_DELETION:
            shared += 1
        else:
            doomed.append(artifact)
    return doomed, freed, live_md5s, shared


def _left_over(store: Store, freed: list[Artifact], held_md5s: set[str], pushed: Remote | None) -> list[Artifact]:
    """The freed files whose bytes are still here, or (``pushed``) on the remote: a team's gc on one machine
    frees what that machine and the remote hold, and the store that wrote the files keeps its copies (which a
    push of it would send back) until a gc there frees them too. Content that ``held_md5s`` names is another
    artifact's (a live one's, or one this gc frees anyway): it leaves no freed file over."""
    return [
        artifact
        for artifact in freed
        if any(path.is_file() for path in _paths(store, artifact, held_md5s))
        or (pushed is not None and (md5 := _md5(artifact)) not in held_md5s and pushed.exists(md5))
    ]


def _md5(artifact: Artifact) -> str:
    return str(properties(artifact).get("Commit", ""))


def _paths(store: Store, artifact: Artifact, live_md5s: set[str]) -> list[Path]:
    """The bytes an artifact holds alone in the store: its file and ``.dvc`` file (when inside the store) and
    its DVC cache object, unless a live execution's file has the same content (``live_md5s``)."""
    path = store.file_of(artifact)
    md5 = _md5(artifact)
    paths = [] if md5 in live_md5s else [cache_path(store.root, md5)]
    if path.is_relative_to(store.root / ARTIFACTS_DIR) and not store.escapes(path):
        paths = [path, path.with_name(path.name + ".dvc"), *paths]
    return paths


def _set_state(lineage: Lineage, artifacts: list[Artifact], state: int) -> None:
    """Set the state of every artifact in one transaction (nothing else of theirs changes)."""
    if not artifacts:
        return
    patches = [mlpb.Artifact(id=a.id, type_id=a.type_id, state=state) for a in artifacts]
    lineage.store.put_artifacts(patches, field_mask_paths=["state"])


def _spills(store: Store, dead: set[int]) -> list[Path]:
    """The spill directories of dead executions."""
    found = []
    for manifest in sorted((store.root / SPILL_DIR).glob(f"*/{SPILL_MANIFEST}")):
        try:
            if SpillManifest.read(manifest.parent).execution_id in dead:
                found.append(manifest.parent)
        except (OSError, ValueError, TypeError):
            continue
    return found


def _prune_empty(root: Path) -> None:
    """Remove the directories that gc left empty under ``root``."""
    if not root.is_dir():
        return
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
