"""Recovery: commit the spilled segments of runs that died before ``commit_metrics``, and mark the
executions whose process died without ending them as crashed."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ray_cmf._progress import track
from ray_cmf.constants import RECOVERED, SPILL_DIR, SPILL_MANIFEST
from ray_cmf.errors import RayCmfError, RecoveryError
from ray_cmf.exits import CRASHED, ENDED_STATES, abandoned, process_alive
from ray_cmf.lineage import Artifact, Execution, properties, state_name
from ray_cmf.series_format import FinishedFile, Spill, SpillManifest, discard_spill, held_by_a_writer
from ray_cmf.store import Store

log = logging.getLogger(__name__)


HELD_WAIT_S = 2.0  # a writer killed a moment ago lets go of its spill as its last thread ends


def _alive(manifest: SpillManifest) -> bool:
    """Whether the process that wrote a spill still runs on this host (then its spill is not dangling)."""
    return process_alive(manifest.host, manifest.pid) is True


@dataclass(frozen=True)
class RecoveredSeries:
    """A spilled series that recover committed: whose it is, how many rows its version holds, and the artifact
    (which a run whose rows are alike another's shares with it: files are content-addressed)."""

    execution_id: int
    metrics_name: str
    rows: int
    artifact: Artifact


def _register(store: Store, manifest: SpillManifest, finished: FinishedFile) -> RecoveredSeries:
    """Record a recovered series' file as the artifact it would have been (marked ``recovered``)."""
    artifact = store.commit_metrics(
        manifest.execution_id,
        manifest.metrics_name,
        finished,
        {RECOVERED: True},
        manifest.instance,
        also_output_of=manifest.also_output_of,
    )
    store.update_execution(manifest.execution_id, {RECOVERED: True})
    return RecoveredSeries(manifest.execution_id, manifest.metrics_name, finished.rows, artifact)


def mark_crashed(store: Store) -> list[Execution]:
    """Mark every RUNNING execution whose holder died on this machine (SIGKILL, a lost node's job) as FAILED
    with status ``CRASHED``: nothing else will ever end it. Executions held on other machines are left."""
    ended = _end_as_noted(store)
    crashed = []
    for execution in store.lineage.store.get_executions():
        if execution.id not in ended and abandoned(state_name(execution), properties(execution)):
            crashed.append(store.update_execution(execution.id, {"status": CRASHED}, "FAILED"))
            log.info("ray_cmf.recover: execution %r crashed (its process is gone); marked %s", execution.name, CRASHED)
    return crashed


def _end_as_noted(store: Store) -> set[int]:
    """End each execution whose end its writer noted but the lineage never learned (it did not answer), as
    noted (its state, and properties such as its top-N rank), where nothing has run it since; returns the
    ids of those it gave a state. Every note is dropped."""
    ended = set()
    for note in store.pending_ends():
        execution_id, state = int(note["execution_id"]), note["state"]
        [execution] = store.lineage.store.get_executions_by_id([execution_id]) or [None]
        if execution is not None and _takes_note(execution, state):
            store.update_execution(execution_id, note["props"], state)
            ended.update([execution_id] if state else [])
            log.info("ray_cmf.recover: execution %r ended %s, as its writer noted", execution.name, state)
        store.forget_end(execution_id)
    return ended


def _takes_note(execution: Execution, state: str | None) -> bool:
    """Whether an execution still takes the end its writer noted: one that nothing ended (its holder is gone),
    or, for a note that sets no state (a sweep's ranks of trials that had ended), one that has ended. One that
    runs again (under a live holder) does not."""
    now = state_name(execution)
    return abandoned(now, properties(execution)) or (state is None and now in ENDED_STATES)


def recover(store: str | os.PathLike[str] | Store | None = None, *, force: bool = False) -> list[Artifact]:
    """Turn every dangling spill of ``store`` into a committed, valid Parquet Step_Metrics artifact.

    Every complete spilled row group is kept; a batch torn by the crash is dropped. Spills of processes
    still alive on this host are skipped unless ``force``, and a spill that a live writer still writes (a
    running job's) always is.

    Then every execution whose process died on this machine without ending it is marked crashed
    (:func:`mark_crashed`); those whose rows were recovered carry ``recovered=True`` too.

    Returns:
        The Step_Metrics artifacts created, each with the custom property ``recovered=True``.

    Raises:
        RecoveryError: Some spills could not be committed (each is named, with why, and left as it was); every
            other spill was committed and the crashed executions marked all the same.
    """
    store = store if isinstance(store, Store) else Store(store)
    spills = commit_spills(store, force=force)
    mark_crashed(store)
    if spills.failed:
        raise RecoveryError(spills.failed, spills.artifacts)
    return spills.artifacts


@dataclass
class Spills:
    """What :func:`commit_spills` did with a store's dangling spills, by spill directory."""

    committed: list[RecoveredSeries] = field(default_factory=list)
    failed: dict[Path, Exception] = field(default_factory=dict)  # could not be committed, and why
    skipped: dict[Path, int] = field(default_factory=dict)  # the pid of a writer still alive (without force)
    held: dict[Path, int] = field(default_factory=dict)  # the pid of a writer that still writes it (even with force)

    @property
    def artifacts(self) -> list[Artifact]:
        """The artifacts of the committed series, in commit order."""
        return [series.artifact for series in self.committed]


def commit_spills(store: Store, *, force: bool = False) -> Spills:
    """The first half of :func:`recover`: commit every dangling spill (those of live processes only with
    ``force``). A spill that cannot be committed does not stop the others."""
    spills = Spills()
    manifests = sorted((store.root / SPILL_DIR).glob(f"*/{SPILL_MANIFEST}"))
    for manifest_path in track(manifests, "recovering spilled series", len(manifests)):
        try:
            _commit_spill(store, manifest_path.parent, force, spills)
        except Exception as exc:  # reported, all together, once every other spill is committed
            spills.failed[manifest_path.parent] = exc
    return spills


def _commit_spill(store: Store, directory: Path, force: bool, spills: Spills) -> None:
    """Commit one dangling spill into ``spills`` (skipped while its writer is alive, and with ``force`` too
    while it writes the spill; discarded if empty)."""
    try:
        manifest = SpillManifest.read(directory)
    except (OSError, ValueError, TypeError) as exc:
        raise RayCmfError(f"its {SPILL_MANIFEST} cannot be read ({exc})") from exc
    alive = not force and _alive(manifest)  # a live writer's spill waits for no writer to let go of it
    with held_by_a_writer(directory, wait=0.0 if alive else HELD_WAIT_S) as held:
        if held:  # committed and emptied here, it would leave its writer a spill of nothing to commit
            log.info("ray_cmf.recover: skipping %s, its writer (pid %s) writes it", directory, manifest.pid)
            spills.held[directory] = manifest.pid
        elif alive:
            log.info("ray_cmf.recover: skipping %s, its writer (pid %s) is alive", directory, manifest.pid)
            spills.skipped[directory] = manifest.pid
        else:
            _commit(store, directory, manifest, spills)


def _commit(store: Store, directory: Path, manifest: SpillManifest, spills: Spills) -> None:
    """Commit a spill no process writes as a recovered version (an empty one is discarded)."""
    spill = Spill(directory, manifest)
    if not spill.pending:
        discard_spill(spill.directory)
        return
    store.settle(spill)  # one begun while the lineage was down: the version it extends is found now
    spills.committed.append(spill.finish(manifest.dest, functools.partial(_register, store, manifest)))
    log.info("ray_cmf.recover: committed %d rows of %r from %s", spill.rows, manifest.metrics_name, spill)
