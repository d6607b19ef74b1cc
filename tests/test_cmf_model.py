"""The public Cmf API against a reference model (hypothesis state machine): what any read returns is exactly
what the model says was committed, whatever the interleaving.

Several pipelines and executions, several series each; ``log_metric``, ``commit_metrics``, ``read_metrics``
(its own latest version, the execution's where it logged nothing of the name, and an older one by its md5),
a new ``Cmf`` bound to an existing execution (each Cmf logs its own series), and a process that ends
without committing (its end commits what is pending). Values cover the whole range: ints, floats
with ±inf, NaN, -0.0 and subnormals, None, bools, strings; names are unicode.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from ray_cmf import Cmf, MetricsNotFoundError, recover
from ray_cmf.lineage import properties
from tests._values import column_of, expected_column, floats, same

PIPELINES = ("p0", "pipeline ü")
SERIES = ("train", "ëval", "步骤")
EXECUTIONS = ("a", "b", "c")
# A key's kind is fixed (a change of kind is refused, and test_roundtrip covers that); None is any kind's null.
KEYS = {
    "loss": floats,
    "step": st.integers(-(2**63), 2**63 - 1),
    "ok": st.booleans(),
    "note": st.text(max_size=8),
    "größe": st.integers(-(2**53), 2**53) | floats,  # ints and floats share this column: ints widen to float
}
rows = st.fixed_dictionaries({}, optional={key: st.none() | values for key, values in KEYS.items()})


@dataclass
class Version:
    md5: str
    rows: list[dict[str, Any]]
    owner: int  # the id() of the Handle whose Cmf committed it


@dataclass
class Handle:
    """A live Cmf and the rows it logged per series (its own series instance: numbered from 1)."""

    cmf: Cmf
    execution: tuple[str, str]
    logged: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)  # rows in its last commit of each series


class CmfModel(RuleBasedStateMachine):
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.store = tempfile.mkdtemp()
        self.versions: dict[tuple[tuple[str, str], str], list[Version]] = {}  # (execution, series) -> versions
        self.opened: list[Cmf] = []

    def teardown(self) -> None:
        for cmf in self.opened:  # before the store goes: a Cmf left open ends its execution at exit
            cmf.close()
        shutil.rmtree(self.store, ignore_errors=True)

    # -- making Cmfs ---------------------------------------------------------------------------------
    def _open(self, pipeline: str, execution: str) -> Handle:
        cmf = Cmf(pipeline_name=pipeline, store=self.store, flush_rows=1_000_000)
        cmf.create_execution("Train", execution_name=f"{pipeline}-{execution}", create_new_execution=False)
        self.opened.append(cmf)
        return Handle(cmf, (pipeline, execution))

    @initialize(target=handles, pipeline=st.sampled_from(PIPELINES), execution=st.sampled_from(EXECUTIONS))
    def first(self, pipeline: str, execution: str) -> Handle:
        return self._open(pipeline, execution)

    @rule(target=handles, pipeline=st.sampled_from(PIPELINES), execution=st.sampled_from(EXECUTIONS))
    def open_cmf(self, pipeline: str, execution: str) -> Handle:
        """A new Cmf, of a new execution or bound to one that exists (another process of the same run)."""
        return self._open(pipeline, execution)

    # -- logging and committing ----------------------------------------------------------------------
    @rule(handle=handles, series=st.sampled_from(SERIES), row=rows)
    def log(self, handle: Handle, series: str, row: dict[str, Any]) -> None:
        handle.cmf.log_metric(series, row)
        handle.logged.setdefault(series, []).append(row)

    @rule(handle=handles, series=st.sampled_from(SERIES))
    def commit(self, handle: Handle, series: str) -> None:
        if series not in handle.logged:
            with pytest.raises(MetricsNotFoundError):
                handle.cmf.commit_metrics(series)
            return
        artifact = handle.cmf.commit_metrics(series)
        assert artifact is not None
        self._committed(handle, series, str(properties(artifact)["Commit"]))

    def _committed(self, handle: Handle, series: str, md5: str) -> None:
        rows = list(handle.logged[series])
        self.versions.setdefault((handle.execution, series), []).append(Version(md5, rows, id(handle)))
        handle.committed[series] = len(rows)

    @rule(handle=consumes(handles))
    def end_without_committing(self, handle: Handle) -> None:
        """The process ends with rows not committed: its end commits them (``at_end``), and nothing is left
        for ``recover``."""
        pending = {s for s, rows in handle.logged.items() if len(rows) > handle.committed.get(s, 0)}
        handle.cmf.close()
        assert recover(self.store, force=True) == []
        lineage = handle.cmf.store.lineage
        outputs = lineage.outputs([handle.cmf.execution.id])
        found = {a.id: properties(a) for a in lineage.store.get_artifacts_by_id([o.artifact_id for o in outputs])}
        for series in pending:
            instance = handle.cmf._sinks[series].key.instance
            [*_, newest] = [found[o.artifact_id] for o in outputs if o.instance == instance]
            assert newest["metrics_name"] == series  # (identical content may be an artifact committed before)
            self._committed(handle, series, str(newest["Commit"]))

    # -- reading -------------------------------------------------------------------------------------
    @rule(handle=handles, series=st.sampled_from(SERIES))
    def read_latest(self, handle: Handle, series: str) -> None:
        versions = self.versions.get((handle.execution, series), [])
        if series in handle.logged:  # its own series, never another Cmf's of the same execution
            versions = [v for v in versions if v.owner == id(handle)]
        if not versions:  # never another execution's series, whatever it committed under this name
            with pytest.raises(MetricsNotFoundError):
                handle.cmf.read_metrics(series)
            return
        _check(handle.cmf.read_metrics(series), versions[-1].rows)

    @rule(handle=handles, series=st.sampled_from(SERIES), data=st.data())
    def read_a_version(self, handle: Handle, series: str, data: st.DataObject) -> None:
        every = [v for versions in self.versions.values() for v in versions]
        if not every:
            return
        wanted = data.draw(st.sampled_from(every))
        mine = [v for v in self.versions.get((handle.execution, series), []) if v.md5 == wanted.md5]
        if not mine:  # a version of another execution or series is not one of this execution's
            with pytest.raises(MetricsNotFoundError):
                handle.cmf.read_metrics(series, commit=wanted.md5)
            return
        _check(handle.cmf.read_metrics(series, commit=wanted.md5), mine[-1].rows)

    @invariant()
    def versions_are_content_addressed(self) -> None:
        """Two versions with one md5 hold the same rows (content addressing), wherever they were committed."""
        by_md5: dict[str, list[dict[str, Any]]] = {}
        for versions in self.versions.values():
            for version in versions:
                assert _same_rows(by_md5.setdefault(version.md5, version.rows), version.rows)


def _same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    keys = {k for row in a + b for k in row}
    return len(a) == len(b) and all(
        all(same(x, y) for x, y in zip(expected_column(a, k), expected_column(b, k), strict=True)) for k in keys
    )


def _check(frame: Any, expected: list[dict[str, Any]]) -> None:
    assert frame.index.tolist() == list(range(1, len(expected) + 1))
    present = {k for row in expected for k, v in row.items() if v is not None}
    assert set(frame.columns) == present
    for key in present:
        want, got = expected_column(expected, key), column_of(frame, key, len(expected))
        assert all(same(w, g) for w, g in zip(want, got, strict=True)), (key, want, got)


CmfModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_cmf_against_its_model = CmfModel.TestCase
