"""The vectorized path (metrics of one kind updated and computed as one group) against the per-metric path
(each metric alone, a group of one) and a float64 reference: random updates of random members, shapes,
NaN and inf, syncs in between."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_cmf import RayCmfError
from ray_cmf.metrics import Accuracy, Histogram, Max, Mean, Metric, MetricCollection, Min, Sum

KINDS: dict[str, Any] = {
    "sum": Sum,
    "mean": Mean,
    "wmean": Mean,
    "max": Max,
    "min": Min,
    "raw": lambda: Sum(nan_policy="propagate"),
    "acc": Accuracy,
    "topk": lambda: Accuracy(top_k=2),
    "hist": lambda: Histogram(6, -1.0, 1.0),
    "wide": lambda: Histogram(3, -5.0, 5.0),
}
MEMBERS = [f"{kind}_{i}" for kind in KINDS for i in range(3)]
SHAPES = [(), (3,), (2, 4)]
SPECIAL = [math.nan, math.inf, -math.inf]


def _build() -> dict[str, Metric]:
    return {name: KINDS[name.split("_")[0]]() for name in MEMBERS}


def _inputs(name: str, shape: tuple[int, ...], seed: int, special: int | None) -> tuple[Any, ...]:
    """One update's inputs for the member ``name``, with one non-finite entry when ``special`` is set."""
    rng = np.random.default_rng(seed)
    kind = name.split("_")[0]
    if kind in ("acc", "topk"):
        logits = torch.from_numpy(rng.normal(size=(4, 3)))
        if special is not None:
            logits[0, 1] = SPECIAL[special]
        return logits, torch.from_numpy(rng.integers(0, 3, size=4))
    x = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    if special is not None:
        x.reshape(-1)[0] = SPECIAL[special]
    value: Any = float(x) if not shape and seed % 3 == 0 else x  # Python numbers too
    if kind == "wmean":
        return value, torch.from_numpy(rng.uniform(size=shape[-1:]))
    return (value,)


updates = st.lists(
    st.tuples(
        st.sampled_from(MEMBERS),
        st.sampled_from(SHAPES),
        st.integers(0, 2**16),
        st.one_of(st.none(), st.integers(0, len(SPECIAL) - 1)),
        st.booleans(),  # sync after this update
    ),
    min_size=1,
    max_size=120,
)


def _same(got: dict[str, float], expected: dict[str, float]) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(updates)
def test_a_group_computes_what_each_metric_alone_computes(steps: list[tuple[Any, ...]]) -> None:
    collection = MetricCollection(_build())
    alone = _build()
    for name, shape, seed, special, sync in steps:
        inputs = _inputs(name, shape, seed, special)
        collection[name].update(*inputs)
        alone[name].update(*inputs)
        if sync:
            synced = collection.to_row(collection.sync().wait())
            expected = {}
            for member, metric in alone.items():
                for output, value in metric.sync().wait().items():
                    if value.numel() == 1:
                        expected[member if output == "value" else f"{member}_{output}"] = value.item()
            _same(synced, expected)
    for member, metric in alone.items():  # each member's own view: synced until its next update, else local
        got, expected = collection[member].compute(), metric.compute()
        assert got.keys() == expected.keys()
        for output, value in expected.items():
            torch.testing.assert_close(got[output], value, equal_nan=True, rtol=1e-12, atol=1e-12, msg=member)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from(SPECIAL)), min_size=0, max_size=5),
        ),
        max_size=60,
    )
)
def test_a_group_matches_a_float64_reference(updates: list[tuple[int, list[float]]]) -> None:
    """Four members per kind, updated unevenly (masked rows), against numpy in float64. A Max or Min that saw
    no value (or only non-finite ones, which it leaves out) is NaN, as a Mean is: it read as -inf or +inf, a
    divergence to every reader (found by a new user)."""
    names = [f"{kind}{i}" for kind in ("sum", "mean", "max", "min") for i in range(4)]
    metrics = MetricCollection({name: KINDS[name[:-1]]() for name in names})
    seen: dict[int, list[float]] = {i: [] for i in range(4)}
    for member, values in updates:
        x = torch.tensor(values, dtype=torch.float64)
        for kind in ("sum", "mean", "max", "min"):
            metrics[f"{kind}{member}"].update(x)
        seen[member].extend(values)
    row = metrics.to_row()
    for member, values in seen.items():
        data = np.asarray(values, dtype=np.float64)
        finite = data[np.isfinite(data)]
        assert row[f"sum{member}"] == pytest.approx(finite.sum(), rel=1e-12, abs=1e-9)
        assert row[f"sum{member}_nonfinite"] == len(data) - len(finite)
        assert row[f"mean{member}"] == pytest.approx(finite.mean() if len(finite) else math.nan, nan_ok=True)
        for kind, extremum in (("max", np.max), ("min", np.min)):  # no value seen: none (it read as -inf, +inf)
            assert row[f"{kind}{member}"] == pytest.approx(extremum(finite) if len(finite) else math.nan, nan_ok=True)


@pytest.mark.parametrize(
    ("metrics", "clash"),
    [
        ({"loss": Mean(), "loss_nonfinite": Max()}, "'loss_nonfinite' is output 'nonfinite' of 'loss' and metric"),
        ({"h": Histogram(4, 0.0, 1.0), "h_p50": Sum()}, "'h_p50' is output 'p50' of 'h' and metric 'h_p50'"),
    ],
)
def test_a_metric_named_like_another_metrics_output_is_refused(metrics: dict[str, Metric], clash: str) -> None:
    """A metric named ``loss_nonfinite`` beside a ``Mean`` named ``loss``, or ``h_p50`` beside a ``Histogram``
    named ``h``, replaced the other's output in every row without a word."""
    collection = MetricCollection(metrics)
    for name in collection:
        collection[name].update(torch.tensor([0.25, 0.5]))
    with pytest.raises(RayCmfError, match=re.escape(clash)):
        collection.to_row(collection.sync().wait())


def test_kinds_group_by_class_policy_and_settings() -> None:
    metrics = MetricCollection(
        {
            "a": Sum(),
            "b": Sum(),
            "raw": Sum(nan_policy="propagate"),
            "h1": Histogram(4, 0.0, 1.0),
            "h2": Histogram(4, 0.0, 2.0),
            "h3": Histogram(4, 0.0, 1.0),
        }
    )
    sizes = sorted(group.size for group in metrics._groups.groups)
    assert sizes == [1, 1, 2, 2]  # a+b, raw, h1+h3, h2


class CountAbove(Metric):
    """A metric of a user's own, as the README describes one: a setting kept as an attribute, no ``_config``."""

    count: torch.Tensor
    _stage_dtype = torch.float64

    def __init__(self, threshold: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threshold = threshold
        self.add_state("count", 0.0, "sum")

    def update(self, value: Any) -> None:
        self._stage(value)

    def _apply(self, states: Any, inputs: list[torch.Tensor], valid: torch.Tensor | None) -> None:
        above = inputs[0] > self.threshold
        if valid is not None:
            above &= valid.view(*valid.shape, *[1] * (above.dim() - 2))
        states["count"].add_(above.sum(tuple(range(1, above.dim()))))

    def _compute(self, states: Any) -> dict[str, torch.Tensor]:
        return {"value": states["count"]}


def test_a_checkpoint_of_ones_own_metric_compares_its_settings_by_value() -> None:
    """A threshold saved as 0.5 and given back as NumPy's 0.5 was refused ("threshold=np.float64(0.5)"), and a
    tensor threshold changed from 0.5 to 0.9 loaded silently (only its shape and dtype were recorded): a new
    user's checkpoints."""
    saved = MetricCollection({"above": CountAbove(0.5), "cut": CountAbove(torch.tensor([0.5]))})  # type: ignore[arg-type]
    saved.update(above=torch.tensor([0.25, 1.0]), cut=torch.tensor([1.0, 2.0]))
    state = saved.state_dict()
    for same in (np.float64(0.5), np.float32(0.5), 0.5):
        again = MetricCollection({"above": CountAbove(same), "cut": CountAbove(torch.tensor([0.5]))})  # type: ignore[arg-type]
        again.load_state_dict(state)
        assert again.to_row()["above"] == 1.0 and again.to_row()["cut"] == 2.0
    moved = MetricCollection({"above": CountAbove(0.5), "cut": CountAbove(torch.tensor([0.9]))})  # type: ignore[arg-type]
    with pytest.raises(RayCmfError, match=r"metric 'cut' was saved as CountAbove\(threshold=tensor\(\[0.5\]"):
        moved.load_state_dict(state)
    wide = torch.linspace(0, 1, 100)
    big = MetricCollection({"above": CountAbove(0.5), "cut": CountAbove(wide)})  # type: ignore[arg-type]
    shifted = MetricCollection({"above": CountAbove(0.5), "cut": CountAbove(wide + 1e-6)})  # type: ignore[arg-type]
    with pytest.raises(RayCmfError, match=r"sha256=\w+\)\) and is CountAbove\(threshold=tensor\(shape=\(100,\)"):
        shifted.load_state_dict(big.state_dict())


def _cut_at(value: float) -> float:
    return value


@pytest.mark.parametrize(
    ("saved", "loaded"),
    [
        (1, 1.0),
        (True, 1),
        ((1, 2), [1, 2]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1.0}),
        (-0.0, 0.0),
        (_cut_at, _cut_at),
        ({"alpha", "beta", "gamma"}, frozenset({"gamma", "beta", "alpha"})),
    ],
)
def test_equal_settings_written_differently_restore(saved: Any, loaded: Any) -> None:
    """A threshold saved as 1 and given back as 1.0 was refused, and so were (1, 2) against [1, 2], a dict in
    another order, -0.0 against 0.0 (a Histogram's low too); a function setting was refused in any new process
    (its repr holds its address), and a set against its frozenset (or in another process, whose hashes order
    it otherwise). Equal settings read alike, as the re-checks of a new user found."""
    state = MetricCollection({"m": CountAbove(saved)}).state_dict()
    MetricCollection({"m": CountAbove(loaded)}).load_state_dict(state)
    histogram = MetricCollection({"h": Histogram(4, -0.0, 1.0)}).state_dict()
    MetricCollection({"h": Histogram(4, 0.0, 1.0)}).load_state_dict(histogram)


def test_a_function_setting_restores_in_another_process(tmp_path: Any) -> None:
    """Saved in one process and loaded in another, ``threshold=<function g at 0x...>`` read unlike itself."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent.parent)!r})
        from tests.test_metric_groups import CountAbove, _cut_at
        from ray_cmf.metrics import MetricCollection
        metrics = MetricCollection({{"m": CountAbove(_cut_at)}})
        if sys.argv[1] == "save":
            torch.save(metrics.state_dict(), sys.argv[2])
        else:
            metrics.load_state_dict(torch.load(sys.argv[2], weights_only=True))
        """
    )
    path = str(tmp_path / "state.pt")
    for step in ("save", "load"):
        done = subprocess.run([sys.executable, "-c", script, step, path], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]


def test_an_array_setting_is_recorded_by_its_values() -> None:
    """Two NumPy arrays of 5000 values that differ in one printed alike (their reprs elide the middle), and a
    checkpoint of one loaded into the other silently."""
    values = np.linspace(0.0, 1.0, 5000)
    changed = values.copy()
    changed[2500] += 1e-3
    state = MetricCollection({"m": CountAbove(values)}).state_dict()  # type: ignore[arg-type]
    with pytest.raises(RayCmfError, match=r"metric 'm' was saved as CountAbove\(threshold=tensor\(shape=\(5000,\)"):
        MetricCollection({"m": CountAbove(changed)}).load_state_dict(state)  # type: ignore[arg-type]


def test_a_metric_of_ones_own_is_grouped_by_the_settings_it_keeps() -> None:
    """Two instances of a user's metric with different thresholds were one group, computed with the first
    one's threshold (3 and 3 where 3 and 1 are right, or 1 and 1 in the other order): a setting kept as a
    public attribute counts, as ``_config``'s do, also in the layout that ranks compare at their first sync."""
    x = torch.tensor([0.25, 1.0, -1.0, 2.0], dtype=torch.float64)
    for names in (["a0", "a15", "b0"], ["a15", "a0", "b0"]):
        made = {"a0": CountAbove(0.0), "a15": CountAbove(1.5), "b0": CountAbove(0.0)}
        metrics = MetricCollection({name: made[name] for name in names})
        metrics.update(**{name: x for name in names})
        assert {k: v.item() for k, v in metrics.compute().items()} == {"a0": 3.0, "a15": 1.0, "b0": 3.0}
        assert sorted(group.size for group in metrics._groups.groups) == [1, 2]  # a0 + b0, a15
    assert repr(CountAbove(0.5)) == "CountAbove(threshold=0.5, nan_policy='exclude', cumulative=False)"
    assert repr(CountAbove(0.5)) != repr(CountAbove(0.0))  # what the first sync compares across ranks
    weights = CountAbove(torch.tensor([0.5, 1.0]))  # a tensor: each rank holds its own, on its own device
    assert (
        repr(weights)
        == "CountAbove(threshold=tensor(shape=(2,), dtype=torch.float32), nan_policy='exclude', cumulative=False)"
    )
