"""Device metrics in one process: values, NaN policy, no value reads on accelerators, checkpoints, errors."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ray_cmf import RayCmfError
from ray_cmf.metrics import Accuracy, Histogram, Max, Mean, Metric, MetricCollection, Min, Sum, SyncHandle
from ray_cmf.metrics.staging import STAGE_BYTES


def all_metrics() -> dict[str, Metric]:
    return {
        "sum": Sum(),
        "mean": Mean(),
        "max": Max(),
        "min": Min(),
        "acc": Accuracy(),
        "acc3": Accuracy(top_k=3),
        "hist": Histogram(bins=8, low=0.0, high=1.0),
        "raw": Sum(nan_policy="propagate"),
    }


def feed(metrics: dict[str, Metric], values: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
    for name in ("sum", "max", "min", "hist", "raw"):
        metrics[name].update(values)
    metrics["mean"].update(values, weight=torch.ones_like(values) * 2)
    metrics["acc"].update(logits, target)
    metrics["acc3"].update(logits, target)


def test_accelerator_path_never_reads_a_value() -> None:
    """On an accelerator, reading a value waits for the device. The ``meta`` device takes the same code path
    (everything that is not a CPU) and has no values at all: any read, ``item()``, ``bool()``, indexing by a
    tensor or a copy to the host, raises. Updates (enough to fill blocks), compute and sync must all pass."""
    meta = torch.device("meta")
    metrics = {name: m.to(meta) for name, m in all_metrics().items()}
    collection = MetricCollection(all_metrics(), device=meta)
    values = torch.rand(4, device=meta)
    logits, target = torch.randn(4, 5, device=meta), torch.zeros(4, dtype=torch.long, device=meta)
    for _ in range(150):
        feed(metrics, values, logits, target)
        collection.update(sum=values[0], max=2.0, mean=(values, values), acc=(logits, target), hist=values)
    for out in [*(m.compute() for m in metrics.values()), collection.compute(), collection.sync().wait()]:
        assert out and all(t.device == meta for t in out.values())
    assert collection.compute()["hist_p90"].shape == ()


def test_values_match_numpy() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=200)
    weights = rng.uniform(size=200)
    mean, total, high, low = Mean(), Sum(), Max(), Min()
    for chunk, w in zip(np.split(data, 4), np.split(weights, 4), strict=True):
        mean.update(torch.from_numpy(chunk), weight=torch.from_numpy(w))
        total.update(torch.from_numpy(chunk))
        high.update(torch.from_numpy(chunk))
        low.update(torch.from_numpy(chunk))
    assert mean.compute()["value"].item() == pytest.approx(np.average(data, weights=weights))
    assert total.compute()["value"].item() == pytest.approx(data.sum())
    assert high.compute()["value"].item() == data.max() and low.compute()["value"].item() == data.min()


def test_nan_policy_exclude_counts_and_propagate_flows() -> None:
    values = torch.tensor([1.0, float("nan"), 2.0, float("-inf")])
    excluded, propagated = Sum(), Sum(nan_policy="propagate")
    excluded.update(values)
    propagated.update(values)
    assert excluded.compute()["value"].item() == 3.0 and excluded.compute()["nonfinite"].item() == 2
    assert math.isnan(propagated.compute()["value"].item()) and "nonfinite" not in propagated.compute()
    top = Max(nan_policy="exclude")
    top.update(torch.tensor([1.0, float("inf")]))
    assert top.compute()["value"].item() == 1.0


@pytest.mark.parametrize("top_k", [1, 2])
def test_accuracy_under_propagate_is_nan_once_a_score_or_label_is_nan(top_k: int) -> None:
    """A NaN score ranks as torch ranks NaN (argmax takes it): the sample counted as a hit, and the accuracy
    read 1.0 under ``nan_policy="propagate"``, whose NaN must flow into the value. An infinite score still
    ranks (it is a value); a NaN among padding (``ignore_index``) rows is no sample and changes nothing."""
    scores = torch.tensor([[0.1, 0.9, 0.0], [float("nan"), 0.2, 0.1], [0.3, float("inf"), 0.0]])
    accuracy = Accuracy(top_k=top_k, nan_policy="propagate")
    accuracy.update(scores, torch.tensor([1, 0, 1]))
    assert math.isnan(accuracy.compute()["value"].item())
    padded = Accuracy(top_k=top_k, ignore_index=-100, nan_policy="propagate")
    padded.update(scores, torch.tensor([1, -100, 1]))
    assert padded.compute()["value"].item() == 1.0
    labels = Accuracy(nan_policy="propagate")
    labels.update(torch.tensor([1.0, float("nan"), float("inf")]), torch.tensor([1.0, 2.0, 3.0]))
    assert math.isnan(labels.compute()["value"].item())
    with pytest.raises(ValueError, match="nan_policy"):
        Sum(nan_policy="ignore")


def test_finite_values_whose_sum_overflows_are_not_excluded() -> None:
    """On CPU a finite block sum skips the NaN masking; a sum that overflows must still count nothing."""
    top, mean, acc = Max(), Mean(), Accuracy()
    top.update(torch.tensor([1e308, 1e308], dtype=torch.float64))
    mean.update(torch.tensor([1e308, 1e308], dtype=torch.float64))
    acc.update(torch.tensor([[3e38, 3e38, -1.0]]), torch.tensor([0]))  # float32 scores
    assert top.compute()["value"].item() == 1e308 and top.compute()["nonfinite"].item() == 0
    assert mean.compute()["nonfinite"].item() == 0  # (its value overflows: the sum of the values is inf)
    assert acc.compute()["value"].item() == 1.0 and acc.compute()["nonfinite"].item() == 0


def test_mean_with_zero_weight_is_nan() -> None:
    m = Mean()
    assert math.isnan(m.compute()["value"].item())
    m.update(torch.tensor([5.0]), weight=torch.tensor([0.0]))
    assert math.isnan(m.compute()["value"].item())


def test_accuracy_top_k_and_labels() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.6, 0.3, 0.1], [0.2, 0.3, 0.5]])
    target = torch.tensor([2, 0, 0])
    top1, top2, labels = Accuracy(), Accuracy(top_k=2), Accuracy()
    top1.update(logits, target)
    top2.update(logits, target)
    labels.update(torch.tensor([2, 0, 1]), target)
    assert top1.compute()["value"].item() == pytest.approx(1 / 3)
    assert top2.compute()["value"].item() == pytest.approx(2 / 3)
    assert labels.compute()["value"].item() == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="top_k=2 needs class scores"):
        Accuracy(top_k=2).update(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"top_k=3 needs scores of at least 3 classes, got 2 \(shape \(1, 2\)\)"):
        Accuracy(top_k=3).update(torch.tensor([[0.2, 0.8]]), torch.tensor([1]))  # read 1.0 (found by a new user)
    # shape errors are raised by update itself, naming both shapes, not later when the block is applied
    with pytest.raises(ValueError, match=r"scores of shape \(3, 3\) do not match targets of shape \(2,\)"):
        top1.update(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"predictions of shape \(3,\) fit targets of shape \(2,\) neither"):
        labels.update(torch.tensor([2, 0, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"weight of shape \(3,\) does not broadcast to the value's \(2,\)"):
        Mean().update(torch.ones(2), weight=torch.ones(3))


def test_histogram_quantiles_and_out_of_range() -> None:
    data = torch.linspace(0, 1, 10_001)[:-1]
    h = Histogram(bins=100, low=0.0, high=1.0, quantiles=(0.1, 0.5, 0.9))
    h.update(data)
    h.update(torch.tensor([-5.0, 7.0, float("nan")]))
    out = h.compute()
    assert out["p10"].item() == pytest.approx(0.1, abs=0.01)
    assert out["p50"].item() == pytest.approx(0.5, abs=0.01)
    assert out["counts"][0].item() == 1 and out["counts"][-1].item() == 1
    assert out["count"].item() == 10_002 and out["nonfinite"].item() == 1
    with pytest.raises(ValueError, match="high > low"):
        Histogram(bins=4, low=1.0, high=1.0)


@settings(max_examples=200, deadline=None)
@example(data=[5.0 + i / 100 for i in range(100)])  # a new user's: p0 read 0.0, the empty underflow bin's edge
@given(data=st.lists(st.floats(0.0, 10.0, exclude_max=True), min_size=1, max_size=40))
def test_each_histogram_quantile_lies_in_the_bin_of_the_value_it_estimates(data: list[float]) -> None:
    """A quantile is estimated inside the bin that holds the value it stands for (numpy's inverted CDF: the
    smallest value with at least that share of the data at or below it), so it is off by a bin at most. p0
    came out as 0.0 when the low bins were empty: it stood in the empty underflow bin, not the lowest value's."""
    quantiles = (0.0, 0.1, 0.5, 0.9, 1.0)
    h = Histogram(bins=10, low=0.0, high=10.0, quantiles=quantiles)
    h.update(torch.tensor(data, dtype=torch.float64))
    out = h.compute()
    for q in quantiles:
        truth = float(np.quantile(data, q, method="inverted_cdf"))
        assert abs(out[f"p{q * 100:g}"].item() - truth) <= 1.0 + 1e-9, (q, truth, out[f"p{q * 100:g}"].item())


@settings(max_examples=300, deadline=None)
@example(data=[-1.0] * 5)  # a new user's: p99 read -0.766, above every value seen (bin [-1, -0.75) interpolated)
@example(data=[-5.0, -6.0])  # every value below ``low``: each quantile read 0.0 (``low``), a value never seen
@example(data=[12.0])  # one value above ``high``: each quantile read 10.0 (``high``)
@given(
    data=st.lists(
        st.floats(-20.0, 30.0) | st.sampled_from([-1.0, 0.0, 2.5, 10.0]) | st.floats(0.0, 10.0, exclude_max=True),
        min_size=1,
        max_size=40,
    )
)
def test_every_histogram_quantile_lies_within_the_values_seen(data: list[float]) -> None:
    """A quantile is one of the values or between two of them: interpolating inside a bin must not carry it
    past the largest or below the smallest value seen, nor pin it at ``low``/``high`` when every value lies
    outside them. Values inside ``[low, high)`` keep the one-bin accuracy."""
    quantiles = (0.0, 0.01, 0.5, 0.99, 1.0)
    h = Histogram(bins=10, low=0.0, high=10.0, quantiles=quantiles)
    h.update(torch.tensor(data, dtype=torch.float64))
    out = h.compute()
    for q in quantiles:
        estimate, truth = out[f"p{q * 100:g}"].item(), float(np.quantile(data, q, method="inverted_cdf"))
        assert min(data) <= estimate <= max(data), (q, estimate, min(data), max(data))
        if 0.0 <= truth < 10.0:
            assert abs(estimate - truth) <= 1.0 + 1e-9, (q, truth, estimate)
    assert out["p0"].item() == min(data) and out["p100"].item() == max(data)


@settings(max_examples=300, deadline=None)
@example(bins=10, low=0.0, width=1.0, data=[0.3])  # a new user's: bin 3, where numpy and exact arithmetic say 2
@example(bins=10, low=0.0, width=1.0, data=[0.7, 0.6, 0.9])
@given(
    bins=st.integers(1, 50),
    low=st.floats(-100, 100, allow_subnormal=False),
    width=st.floats(1e-3, 1e3),
    data=st.lists(st.floats(-1e3, 1e3, allow_subnormal=False), max_size=30),
)
def test_histogram_counts_are_numpys(bins: int, low: float, width: float, data: list[float]) -> None:
    """A value lies in the bin whose edges (numpy's, ``linspace(low, high, bins + 1)``) hold it: counts equal
    ``numpy.histogram``'s, also for a value on an edge that ``(x - low) / width * bins`` rounds past. Values
    at ``high`` or above are the overflow bin's (numpy's last bin is closed on the right)."""
    high = low + width
    edges = np.linspace(low, high, bins + 1)
    h = Histogram(bins=bins, low=low, high=high)
    h.update(torch.tensor(data, dtype=torch.float64))
    counts = h.compute()["counts"].tolist()
    inside = [x for x in data if low <= x < edges[-1]]
    assert counts[1:-1] == np.histogram(inside, bins=edges)[0].tolist()
    assert (counts[0], counts[-1]) == (sum(x < low for x in data), sum(x >= edges[-1] for x in data))


@settings(max_examples=200, deadline=None)
@example(data=[0.1, math.nan])  # a new user's: the NaN was counted in the overflow bin
@given(data=st.lists(st.sampled_from([math.inf, -math.inf, math.nan]) | st.floats(-5.0, 15.0), max_size=20))
def test_a_propagating_histogram_counts_infinities_in_the_end_bins_and_no_nan(data: list[float]) -> None:
    """Under ``nan_policy="propagate"`` the bins are ``numpy.histogram``'s, -inf counts below ``low`` and inf at
    or above ``high``, as they compare; a NaN lies in no bin (NumPy drops it too), and ``count`` is the bins'
    total."""
    h = Histogram(bins=5, low=0.0, high=10.0, nan_policy="propagate")
    h.update(torch.tensor(data, dtype=torch.float64))
    out = h.compute()
    counts = out["counts"].tolist()
    inside = [x for x in data if 0.0 <= x < 10.0]
    assert counts[1:-1] == np.histogram(inside, bins=np.linspace(0.0, 10.0, 6))[0].tolist()
    assert (counts[0], counts[-1]) == (sum(x < 0.0 for x in data), sum(x >= 10.0 for x in data))
    assert out["count"].item() == sum(counts) == sum(not math.isnan(x) for x in data)


@example(low=-1.7, high=-0.7, data=[-1.2, 3.39])  # a new user's: p100 read 3.3899999999999997, an ulp low
@settings(max_examples=200, deadline=None)
@given(
    low=st.floats(-10, 0),
    high=st.floats(0.5, 10),
    data=st.lists(st.floats(-1e6, 1e6, allow_subnormal=False), min_size=1, max_size=20),
)
def test_histogram_p0_and_p100_are_the_smallest_and_largest_value_exactly(
    low: float, high: float, data: list[float]
) -> None:
    h = Histogram(bins=4, low=low, high=high, quantiles=(0.0, 1.0))
    h.update(torch.tensor(data, dtype=torch.float64))
    out = h.compute()
    assert (out["p0"].item(), out["p100"].item()) == (min(data), max(data))


def test_a_nan_predicted_label_is_left_out_and_counted_as_a_nan_score_is() -> None:
    """With scores, a row holding NaN is left out and counted; a NaN predicted label was counted as wrong."""
    m = Accuracy()
    m.update(torch.tensor([1.0, math.nan, 2.0]), torch.tensor([1, 0, 0]))
    assert {k: v.item() for k, v in m.compute().items()} == {"value": 0.5, "nonfinite": 1.0}


def test_a_mean_whose_weights_sum_to_zero_is_nan() -> None:
    """Weights 1 and -1 gave -inf (and all-zero weights NaN): a weighted mean with no net weight is undefined."""
    for weights in ([1.0, -1.0], [0.0, 0.0]):
        m = Mean()
        m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor(weights))
        assert math.isnan(m.compute()["value"].item()), weights


@settings(max_examples=200, deadline=None)
@example(data=[math.inf, -math.inf])  # a new user's: p0 0.0 and p100 1.0 (low and high), values never seen
@example(data=[0.1, math.inf, -math.inf, 0.6])
@given(data=st.lists(st.sampled_from([math.inf, -math.inf]) | st.floats(-5.0, 15.0), min_size=1, max_size=20))
def test_a_propagating_histograms_quantiles_are_infinite_where_the_data_is(data: list[float]) -> None:
    """Under ``nan_policy="propagate"`` infinities are values: a quantile that falls among them is -inf or
    inf, as NumPy's is, and the others are estimated from the finite values (within one bin, and never
    outside them). Any NaN makes every quantile NaN, as it makes NumPy's."""
    quantiles = (0.0, 0.25, 0.5, 0.75, 1.0)
    h = Histogram(bins=10, low=0.0, high=10.0, quantiles=quantiles, nan_policy="propagate")
    h.update(torch.tensor(data, dtype=torch.float64))
    out = h.compute()
    finite = [v for v in data if math.isfinite(v)]
    assert out["count"].item() == len(data)
    for q in quantiles:
        estimate, truth = out[f"p{q * 100:g}"].item(), float(np.quantile(data, q, method="inverted_cdf"))
        if math.isinf(truth):
            assert estimate == truth, (q, estimate, truth)
            continue
        assert min(finite) <= estimate <= max(finite), (q, estimate, finite)
        if 0.0 <= truth < 10.0:
            assert abs(estimate - truth) <= 1.0 + 1e-9, (q, estimate, truth)
    h.update(torch.tensor([math.nan], dtype=torch.float64))
    assert all(math.isnan(h.compute()[f"p{q * 100:g}"].item()) for q in quantiles)


def test_a_histogram_refuses_bins_it_cannot_compute() -> None:
    """``high=inf`` (or a range whose width overflows) made every quantile NaN, and a quantile asked for twice
    failed inside ``update`` with an IndexError."""
    for low, high in ((0.0, math.inf), (-1e308, 1e308), (-math.inf, 0.0)):
        with pytest.raises(ValueError, match="finite"):
            Histogram(bins=4, low=low, high=high)
    with pytest.raises(ValueError, match=r"quantiles must differ, got \[0.5, 0.5\]"):
        Histogram(bins=4, low=0.0, high=1.0, quantiles=(0.5, 0.5))
    for bins in (2.5, "8", True):  # 2.5 failed inside torch: "zeros(): argument 'size' ... not float"
        with pytest.raises(TypeError, match=rf"Histogram needs an int number of bins, got bins={bins!r}"):
            Histogram(bins=bins, low=0.0, high=1.0)  # type: ignore[arg-type]


def test_a_histogram_checkpoint_without_the_range_seen_restores() -> None:
    """A Histogram's checkpoint from before it kept the range of its values (ray_cmf <= 0.22) still loads:
    its quantiles are then interpolated as they were, and the range is kept from the next update on."""
    h = Histogram(bins=4, low=0.0, high=1.0, quantiles=(0.0, 1.0))
    h.update(torch.tensor([0.3, 0.6]))
    old = {k: v for k, v in h.state_dict().items() if k in ("counts", "nonfinite")}
    fresh = Histogram(bins=4, low=0.0, high=1.0, quantiles=(0.0, 1.0))
    fresh.load_state_dict(old)
    fresh.update(torch.tensor([0.9]))
    out = fresh.compute()
    assert out["count"].item() == 3
    assert (out["p0"].item(), out["p100"].item()) == (0.25, 1.0)  # bin edges: the range is not known
    fresh.reset()
    fresh.update(torch.tensor([0.3, 0.9], dtype=torch.float64))
    out = fresh.compute()
    assert (out["p0"].item(), out["p100"].item()) == (0.3, 0.9)
    with pytest.raises(RayCmfError, match=r"missing \['counts'\]"):
        fresh.load_state_dict({"nonfinite": torch.tensor(0.0)})


@pytest.mark.parametrize("quantiles", [(0.9,), (0.0, 0.25, 0.999, 1.0), (0.5, 0.9), ()])
def test_a_histograms_value_is_its_median_whatever_quantiles_it_reports(quantiles: tuple[float, ...]) -> None:
    metrics = MetricCollection({"h": Histogram(100, 0.0, 1.0, quantiles=quantiles)})
    metrics.update(h=torch.linspace(0, 0.99, 100, dtype=torch.float64))
    row = metrics.to_row(metrics.sync().wait())
    assert row["h"] == pytest.approx(0.5, abs=0.011)
    assert sorted(k for k in row if k.startswith("h_p")) == sorted(f"h_p{q * 100:g}" for q in quantiles)
    assert row.get("h_p90", 0.9) == pytest.approx(0.9, abs=0.011)


def test_syncs_waited_for_out_of_order_leave_the_latest_ones_values() -> None:
    """The values of the sync whose wait ended last stood, so an earlier interval's replaced the latest's."""
    metrics = MetricCollection({"s": Sum()})
    metrics["s"].update(1.0)
    first = metrics.sync(async_op=True)
    metrics["s"].update(10.0)
    second = metrics.sync(async_op=True)
    assert float(second.wait()["s"]) == 10.0 and float(first.wait()["s"]) == 1.0
    assert float(metrics.compute()["s"]) == 10.0


def test_sync_without_process_group_is_local_and_resets() -> None:
    metrics = MetricCollection({"loss": Mean(), "n": Sum(cumulative=True)})
    metrics["loss"].update(torch.tensor([1.0, 3.0]))
    metrics["n"].update(torch.tensor(2.0))
    values = metrics.sync().wait()
    assert values["loss"].item() == 2.0 and values["n"].item() == 2.0
    assert metrics.to_row() == {"loss": 2.0, "loss_nonfinite": 0.0, "n": 2.0, "n_nonfinite": 0.0}
    metrics["n"].update(torch.tensor(1.0))
    second = metrics.sync().wait()
    assert math.isnan(second["loss"].item())  # interval with no loss updates
    assert second["n"].item() == 3.0  # cumulative


def test_to_row_on_cpu_reads_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = MetricCollection({f"m{i}": Sum() for i in range(10)})
    for i, name in enumerate(metrics):
        metrics[name].update(torch.tensor(float(i)))
    calls = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    row = metrics.to_row()
    assert not calls and row["m3"] == 3.0 and row["m3_nonfinite"] == 0.0 and len(row) == 20
    assert all(type(v) is float for v in row.values())


def test_sync_handle_evaluates_each_result_once() -> None:
    calls: list[str] = []
    parent = SyncHandle(lambda: calls.append("parent") or 1)
    child = parent.then(lambda value: calls.append("child") or value + 1)
    assert child.wait() == 2 and child.wait() == 2 and parent.wait() == 1
    assert calls == ["parent", "child"]


@settings(max_examples=150, deadline=None)
@example(scores=[[0.5, 0.5, 0.5, 0.1]], targets=[0])  # a new user's: top-1 1.0, top-2 0.0, top-3 1.0
@given(
    scores=st.integers(1, 6).flatmap(
        lambda c: st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=c, max_size=c), min_size=1, max_size=8)
    ),
    targets=st.lists(st.integers(0, 5), min_size=8, max_size=8),
)
def test_top_k_accuracy_ranks_tied_scores_as_top_1_does(scores: list[list[float]], targets: list[int]) -> None:
    """Tied scores (common with low-precision logits) are ranked by class index, as top-1's argmax ranks them,
    so a target among the top k stays among the top k + 1: top-2 read 0.0 where top-1 read 1.0, since topk
    orders ties as it likes. A target that is no class is never a hit."""
    preds = torch.tensor(scores, dtype=torch.float64)
    target = torch.tensor(targets[: len(scores)])
    classes = preds.shape[1]
    previous = -1.0
    with pytest.raises(ValueError, match=f"top_k={classes + 1} needs scores of at least"):  # all would be hits
        Accuracy(top_k=classes + 1).update(preds, target)
    for k in range(1, classes + 1):
        m = Accuracy(top_k=k)
        m.update(preds, target)
        got = m.compute()["value"].item()
        order = [sorted(range(classes), key=lambda c, row=row: (-row[c], c)) for row in scores]
        truth = np.mean([t in o[:k] for t, o in zip(target.tolist(), order, strict=True)])
        assert got == pytest.approx(truth) and got >= previous, (k, got, truth)
        previous = got


@settings(max_examples=60, deadline=None)
@example(shape=(2, 3, 1), top_k=2, updates=1, seed=0)  # a new user's: scores (N, C, 1) read 0.0 for 1.0
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(2, 5), st.integers(1, 3), st.integers(1, 2)).map(
        lambda s: s[:3] if s[3] == 1 else s
    ),
    top_k=st.integers(1, 2),
    updates=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_top_k_accuracy_of_scores_with_extra_dimensions_is_that_of_each_position(
    shape: tuple[int, ...], top_k: int, updates: int, seed: int
) -> None:
    """Scores ``(N, C, ...)`` against targets ``(N, ...)`` (a sequence model's): each position is a sample.
    Top-k over such scores ranked along the last dimension instead of the classes': (N, C, 1) read 0.0 where
    every target was in the top 2, and (N, C, L > 1) raised at the first read, losing the staged updates."""
    generator = torch.Generator().manual_seed(seed)
    classes = shape[1]
    extra, flat = Accuracy(top_k=top_k), Accuracy(top_k=top_k)
    for _ in range(updates):
        scores = torch.randint(0, 3, shape, generator=generator).double()  # ties, ranked by class index
        target = torch.randint(0, classes, shape[:1] + shape[2:], generator=generator)
        extra.update(scores, target)
        flat.update(scores.movedim(1, -1).reshape(-1, classes), target.reshape(-1))
    assert extra.compute()["value"].item() == flat.compute()["value"].item()


@given(
    scores=st.lists(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, math.nan]), min_size=3, max_size=3), min_size=1, max_size=8
    ),
    targets=st.lists(st.sampled_from([0, 1, 2, -100]), min_size=8, max_size=8),
    top_k=st.integers(1, 2),
    updates=st.integers(1, 3),
)
def test_accuracy_leaves_out_targets_at_ignore_index(
    scores: list[list[float]], targets: list[int], top_k: int, updates: int
) -> None:
    """A language model pads its targets with -100, the index ``cross_entropy`` ignores: each padded position
    counted as a wrong prediction, so a batch padded to twice its length read half its accuracy. Under
    ``ignore_index`` such a target counts neither as a sample nor as non-finite, whatever its scores."""
    preds = torch.tensor(scores, dtype=torch.float64)
    target = torch.tensor(targets[: len(scores)])
    scored, labels = Accuracy(top_k=top_k, ignore_index=-100), Accuracy(ignore_index=-100)
    for _ in range(updates):
        scored.update(preds, target)
        labels.update(preds.nan_to_num(-1.0).argmax(dim=1).double(), target)
    hits, bad, label_hits, kept = 0, 0, 0, 0
    for row, t in zip(scores, target.tolist(), strict=False):
        if t == -100:
            continue
        kept += 1
        label_hits += t == max(range(3), key=lambda c, row=row: (np.nan_to_num(row[c], nan=-1.0), -c))
        if any(math.isnan(v) for v in row):
            bad += 1
            continue
        order = sorted(range(3), key=lambda c, row=row: (-row[c], c))
        hits += t in order[:top_k]
    got, nonfinite = scored.compute()["value"].item(), scored.compute()["nonfinite"].item()
    assert nonfinite == bad * updates
    assert got == pytest.approx(hits / (kept - bad)) if kept > bad else math.isnan(got)
    by_label = labels.compute()["value"].item()
    assert by_label == pytest.approx(label_hits / kept) if kept else math.isnan(by_label)


def test_compute_after_an_asynchronous_sync_gives_its_values() -> None:
    """``StepLogger.step()`` starts each interval's sync asynchronously: ``compute()`` right after it gave the
    new, empty interval (NaN and 0) instead of the synced values, until something else completed the sync."""
    metrics = MetricCollection({"loss": Mean(), "top": Max(), "total": Sum()})
    metrics.update(loss=torch.tensor(1.0), top=torch.tensor(1.0), total=torch.tensor(1.0))
    metrics.update(loss=torch.tensor(3.0), top=torch.tensor(3.0), total=torch.tensor(3.0))
    metrics.sync(async_op=True)
    assert {k: v.item() for k, v in metrics.compute().items() if not k.endswith("_nonfinite")} == {
        "loss": 2.0,
        "top": 3.0,
        "total": 4.0,
    }
    assert metrics["top"].compute()["value"].item() == 3.0
    metrics.update(top=torch.tensor(0.5))  # from its own next update on, a metric reads its new interval
    assert metrics.to_row()["top"] == 0.5 and metrics.to_row()["loss"] == 2.0
    metrics.sync(async_op=True)
    metrics.reset()  # a sync in flight at a reset gives nothing back
    assert math.isnan(metrics.compute()["loss"].item()) and metrics.compute()["total"].item() == 0.0


def test_a_collection_computes_each_metric_as_the_metric_itself_does() -> None:
    """After a sync, an update of one metric switched the whole collection back to local values: ``compute()``
    gave ``a`` as NaN (its interval, empty) where ``metrics["a"].compute()`` gave the synced 5. Each metric is
    read from the sync until its own next update, however it is asked for."""
    metrics = MetricCollection({"a": Max(), "b": Max(), "h": Histogram(4, 0.0, 1.0)})
    metrics.update(a=5.0, b=1.0, h=torch.tensor([0.25]))
    metrics.sync().wait()
    metrics.update(b=torch.tensor(7.0))
    together = metrics.compute()
    for name in ("a", "b", "h"):
        alone = metrics[name].compute()
        assert {k: together[name if k == "value" else f"{name}_{k}"].tolist() for k in alone} == {
            k: v.tolist() for k, v in alone.items()
        }, name
    assert metrics.to_row()["a"] == 5.0 and metrics.to_row()["b"] == 7.0


def test_state_dict_round_trip_single_process() -> None:
    metrics = MetricCollection({"loss": Mean(), "top": Max(), "h": Histogram(4, 0.0, 1.0)})
    metrics["loss"].update(torch.tensor([1.0, 2.0]))
    metrics["top"].update(torch.tensor([7.0]))
    metrics["h"].update(torch.tensor([0.3]))
    state = metrics.state_dict()
    assert "loss.weighted_sum" in state and "top.extremum" in state
    fresh = MetricCollection({"loss": Mean(), "top": Max(), "h": Histogram(4, 0.0, 1.0)})
    fresh.load_state_dict(state)
    assert fresh.to_row() == metrics.to_row()
    with pytest.raises(RayCmfError, match="missing"):
        fresh.load_state_dict({"loss.weight": torch.tensor(1.0)})
    finer = MetricCollection({"loss": Mean(), "top": Max(), "h": Histogram(8, 0.0, 1.0)})
    finer.update(loss=torch.tensor(5.0))
    with pytest.raises(RayCmfError, match=r"metric 'h' was saved as Histogram\(4, 0, 1\) and is Histogram\(8, "):
        finer.load_state_dict(state)
    older = {k: v for k, v in state.items() if not k.endswith("__metric__")}  # from before the settings were kept
    shape = r"'h.counts' holds \(6,\) values where this metric's state is \(10,\)"  # was torch's "invalid for input"
    with pytest.raises(RayCmfError, match=rf"Metric state_dict does not match: {shape}"):
        finer.load_state_dict(older)
    assert finer.to_row()["loss"] == 5.0  # refused before anything was loaded or reset
    single = Sum()
    single.update(torch.tensor(4.0))
    clone = Sum()
    clone.load_state_dict(single.state_dict())
    assert clone.compute()["value"].item() == 4.0


def test_members_are_driven_by_their_collection() -> None:
    loss = Mean()
    metrics = MetricCollection({"loss": loss})
    with pytest.raises(RayCmfError, match="belongs to a MetricCollection"):
        loss.sync()
    with pytest.raises(ValueError, match="already belongs"):
        MetricCollection({"again": loss})
    with pytest.raises(TypeError, match="'bad'"):
        MetricCollection({"bad": object()})  # type: ignore[dict-item]
    assert metrics.to("cpu") is metrics


def test_standalone_metric_sync_then_compute() -> None:
    m = Sum()
    m.update(torch.tensor([1.0, 2.0]))
    handle = m.sync(async_op=True)
    assert handle.wait()["value"].item() == 3.0 and handle.is_completed()
    assert m.compute()["value"].item() == 3.0  # the synced value until the next update
    m.update(torch.tensor(1.0))
    assert m.compute()["value"].item() == 1.0  # the local interval


def test_staged_updates_match_a_direct_reference() -> None:
    """Updates of changing shapes (more signatures than blocks kept, blocks filling, Python numbers, NaN,
    inputs too large to stage, inputs that require grad) give what one pass over all the data gives."""
    rng = np.random.default_rng(1)
    metrics = {
        "sum": Sum(),
        "max": Max(),
        "mean": Mean(),
        "wmean": Mean(),
        "acc": Accuracy(),
        "hist": Histogram(8, -2, 2),
    }
    seen, weighted, hits = [], [], []
    for i in range(300):
        shape = (STAGE_BYTES // 4,) if i % 50 == 0 else [(), (3,), (2, 5)][i % 3]
        x = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
        if i % 37 == 0:
            x.reshape(-1)[0] = float("nan")
        w = torch.rand(shape[-1:])
        value = float(x.reshape(-1)[-1]) if i % 7 == 0 else x.requires_grad_(i % 11 == 0)
        for name in ("sum", "max", "mean", "hist"):
            metrics[name].update(value)
        metrics["wmean"].update(x, weight=w)
        logits, target = torch.randn(6, 4), torch.randint(0, 4, (6,))
        metrics["acc"].update(logits, target)
        seen.append(np.atleast_1d(np.asarray(value if isinstance(value, float) else x.detach().numpy(), np.float64)))
        weighted.append((x.detach().numpy().reshape(-1), np.broadcast_to(w.numpy(), x.shape).reshape(-1)))
        hits.append((logits.argmax(1) == target).numpy())
    data = np.concatenate([v.reshape(-1) for v in seen])
    ok = np.isfinite(data)
    xs, ws = (np.concatenate(part).astype(np.float64) for part in zip(*weighted, strict=True))
    wok = np.isfinite(xs)
    out = {name: m.compute() for name, m in metrics.items()}
    assert out["sum"]["value"].item() == pytest.approx(data[ok].sum())
    assert out["sum"]["nonfinite"].item() == (~ok).sum() > 0
    assert out["max"]["value"].item() == data[ok].max()
    assert out["mean"]["value"].item() == pytest.approx(data[ok].mean())
    assert out["wmean"]["value"].item() == pytest.approx(np.average(xs[wok], weights=ws[wok]))
    assert out["acc"]["value"].item() == pytest.approx(np.concatenate(hits).mean())
    assert out["hist"]["count"].item() == ok.sum()
    assert not any(t.requires_grad for m in metrics.values() for t in m.compute().values())


def _members() -> dict[str, Metric]:
    return {"loss": Mean(), "acc": Accuracy(), "top": Max(), "hist": Histogram(8, -2, 2)}


def test_joint_update_matches_one_update_per_metric() -> None:
    """``MetricCollection.update`` stages a call's inputs together; the results are those of separate updates,
    across changing shapes and call patterns (with and without a weight), NaN, inputs too large to stage,
    and per-metric updates in between."""
    rng = np.random.default_rng(2)
    joint, separate = MetricCollection(_members()), MetricCollection(_members())
    for i in range(200):
        shape = (STAGE_BYTES // 8,) if i % 40 == 0 else [(), (3,), (2, 5)][i % 3]
        x = torch.from_numpy(rng.normal(size=shape))
        if i % 17 == 0:
            x.reshape(-1)[0] = float("inf")
        logits, target = torch.randn(5, 3), torch.randint(0, 3, (5,))
        loss = (x, torch.rand(shape)) if i % 4 == 0 else x
        joint.update(loss=loss, acc=(logits, target), top=x)
        for name, inputs in (("loss", loss), ("acc", (logits, target)), ("top", x)):
            separate[name].update(*inputs) if isinstance(inputs, tuple) else separate[name].update(inputs)
        if i % 9 == 0:  # the same metric updated on its own, between joint calls
            joint["hist"].update(x)
            separate["hist"].update(x)
    expected = separate.compute()
    got = joint.compute()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, equal_nan=True, msg=key)
    assert got["loss_nonfinite"].item() > 0 and got["hist_count"].item() > 0


def test_joint_update_with_many_call_patterns() -> None:
    """More call patterns than are staged at once: older patterns' blocks are applied, not lost."""
    joint, separate = MetricCollection(_members()), MetricCollection(_members())
    subsets = [[n for k, n in enumerate(("loss", "top", "hist")) if mask >> k & 1] for mask in range(1, 8)]
    for i in range(60):
        x = torch.full((2,), float(i))
        names = subsets[i % len(subsets)] + (["acc"] if i % 2 else [])
        inputs = {n: (torch.randn(2, 3), torch.tensor([0, 1])) if n == "acc" else x for n in names}
        joint.update(**inputs)
        for name, value in inputs.items():
            separate[name].update(*value) if isinstance(value, tuple) else separate[name].update(value)
    expected, got = separate.compute(), joint.compute()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, equal_nan=True, msg=key)


def test_joint_update_errors_and_synced_values() -> None:
    metrics = MetricCollection(_members())
    with pytest.raises(KeyError, match="no metric named 'lost'"):
        metrics.update(lost=torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"scores of shape \(3, 4\) do not match targets of shape \(2,\)"):
        metrics.update(loss=torch.tensor(1.0), acc=(torch.randn(3, 4), torch.tensor([0, 1])))
    for bad in ({"top": "oops"}, {"acc": (torch.randn(2, 4), [0, 1])}):  # neither tensors nor numbers
        name = next(iter(bad))
        with pytest.raises(TypeError, match=rf"metric '{name}' .*(str|list).* a tensor or a number"):
            metrics.update(loss=torch.tensor(3.0), **bad)
        with pytest.raises(TypeError, match=rf"metric '{name}' .*(str|list).* a tensor or a number"):
            metrics[name].update(*(bad[name] if isinstance(bad[name], tuple) else (bad[name],)))
    metrics.update(loss=torch.tensor(2.0), top=torch.tensor(5.0))
    assert metrics["loss"].compute()["value"].item() == 2.0  # a member sees the collection's staged updates
    assert metrics.sync().wait()["loss"].item() == 2.0
    metrics.update(loss=torch.tensor(4.0), top=torch.tensor(1.0))
    assert metrics.compute()["loss"].item() == 4.0  # local values again after an update, not the synced ones
    assert metrics["top"].compute()["value"].item() == 1.0
    metrics.update(loss=torch.tensor(8.0))  # staged, not yet applied
    metrics.reset()
    assert math.isnan(metrics.compute()["loss"].item())  # reset drops staged joint updates too


@pytest.mark.parametrize("top_k", [1, 2])
def test_float_targets_count_as_the_class_they_name_and_a_non_integer_one_as_wrong(top_k: int) -> None:
    """Top-2 over float targets raised a bare ``gather(): Expected dtype int32/int64`` at the first read,
    losing the staged updates; top-1 took them (found by a new user)."""
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0], [0.2, 0.3, 0.5], [0.5, 0.3, 0.2]])
    m = Accuracy(top_k=top_k)
    m.update(scores, torch.tensor([0.0, 1.0, 0.5, math.nan]))  # two hits, then no class, then no target
    assert m.compute()["value"].item() == 0.5


def test_a_predicted_label_equal_to_a_target_that_names_no_class_is_wrong() -> None:
    """With labels, a prediction of -1 against a target of -1 (or 0.5 against 0.5) counted as a hit; a target
    that names no class counts as a wrong prediction, as with scores (found by a new user)."""
    for preds, target in (([-1, 1], [-1, 1]), ([0.5, 1.0], [0.5, 1.0]), ([0.0, 1.0], [math.nan, 1.0])):
        m = Accuracy()
        m.update(torch.tensor(preds), torch.tensor(target))
        assert m.compute()["value"].item() == 0.5, (preds, target)


def test_scores_whose_shape_fits_the_targets_neither_way_say_both() -> None:
    with pytest.raises(ValueError, match=r"predictions of shape \(2, 3, 1\) fit targets of shape \(2,\) neither"):
        Accuracy().update(torch.zeros(2, 3, 1), torch.zeros(2))


def test_a_collection_reads_like_a_dict_of_its_metrics() -> None:
    """It had ``items()`` and ``[]`` but no ``keys()`` (found by a new user)."""
    loss, acc = Mean(), Accuracy()
    metrics = MetricCollection({"loss": loss, "acc": acc})
    assert list(metrics.keys()) == list(metrics) == ["loss", "acc"] and len(metrics) == 2
    assert list(metrics.values()) == [loss, acc] and dict(metrics.items()) == {"loss": loss, "acc": acc}


def test_a_complex_input_is_refused_naming_the_metric() -> None:
    """A complex tensor was taken, its imaginary part dropped with only torch's warning."""
    metrics = MetricCollection({"loss": Mean(), "total": Sum()})
    with pytest.raises(TypeError, match=r"^metric 'total' \(Sum\): input 0 is a complex64 tensor .*real values"):
        metrics["total"].update(torch.tensor([1 + 2j]))
    with pytest.raises(TypeError, match=r"^metric 'total' \(Sum\): input 0 is a complex64 tensor"):
        metrics.update(loss=torch.ones(1), total=torch.tensor([1 + 2j]))
    with pytest.raises(TypeError, match=r"^Sum: input 0 is a complex128 tensor"):
        Sum().update(torch.tensor([1 + 2j], dtype=torch.complex128))
    assert math.isnan(metrics.compute()["loss"].item()) and metrics.compute()["total"].item() == 0.0


def test_an_error_in_a_collection_names_the_metric_by_its_key() -> None:
    """Two Means in one collection: a weight that does not broadcast said ``Mean: ...``, naming neither; an
    Accuracy given its scores without a tuple said ``Accuracy._check() missing 1 required positional
    argument``, a private method."""
    metrics = MetricCollection({"train": Mean(), "val": Mean(), "acc": Accuracy()})
    value, bad_weight = torch.ones(2), torch.ones(3)
    with pytest.raises(ValueError, match=r"^metric 'val' \(Mean\): weight of shape \(3,\) does not broadcast"):
        metrics.update(train=value, val=(value, bad_weight))
    with pytest.raises(ValueError, match=r"^metric 'val' \(Mean\): weight of shape \(3,\) does not broadcast"):
        metrics["val"].update(value, weight=bad_weight)
    with pytest.raises(ValueError, match=r"^Mean: weight of shape \(3,\) does not broadcast"):  # alone: its class
        Mean().update(value, weight=bad_weight)
    with pytest.raises(TypeError, match=r"^metric 'acc' \(Accuracy\): .*'target'.*acc=\(a, b\)"):
        metrics.update(train=value, acc=torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"^metric 'train' \(Mean\): .*too many.*"):
        metrics.update(train=(value, value, value))
    assert math.isnan(metrics.compute()["train"].item())  # none of those calls updated anything


@pytest.mark.parametrize(
    ("imports", "loaded"),
    [
        ("import ray_cmf", []),
        ("import ray_cmf.metrics, ray_cmf.system, ray_cmf.environment", ["torch"]),
        ("from ray_cmf import Cmf", ["ml_metadata"]),
    ],
)
def test_what_an_import_loads(imports: str, loaded: list[str]) -> None:
    """``import ray_cmf`` stays light, and a training worker's metrics and sampler load neither ray nor the
    store's ML-Metadata (the GPU checks run where neither is installed); the store loads on first use."""
    heavy = ("ray", "torch", "ml_metadata", "dvc")
    script = f"import sys\n{imports}\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(sorted(loaded))


def test_a_state_saved_from_other_settings_is_refused_by_name(caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint names each metric's class and the settings that give its states their meaning: loaded into a
    metric of another class (a Min's ``extremum`` read as a Max's) or range (a Histogram's counts read against
    other bins), it is refused, naming the metric, before anything is loaded. Settings that only shape the
    outputs (a Histogram's quantiles) and the sync's (``cumulative``) are free to change."""
    saved = MetricCollection({"mx": Max(), "h": Histogram(6, -3.0, 3.0), "acc": Accuracy(top_k=1)})
    saved["mx"].update(torch.tensor([4.5, -2.0]))
    saved["h"].update(torch.tensor([0.5, 2.5]))
    state = saved.state_dict()
    cases = {
        "mx": (Min(), r"metric 'mx' was saved as Max\(\) and is Min\(\) here"),
        "h": (Histogram(6, -30.0, 30.0), r"metric 'h' was saved as Histogram\(6, -3, 3\) and is "),
        "acc": (Accuracy(top_k=3), r"metric 'acc' was saved as Accuracy\(1, None\) and is Accuracy\(3, None\)"),
    }
    for key, (other, said) in cases.items():
        metrics = {"mx": Max(), "h": Histogram(6, -3.0, 3.0), "acc": Accuracy(top_k=1), key: other}
        target = MetricCollection(metrics)
        target["mx"].update(torch.tensor(1.0))
        with pytest.raises(RayCmfError, match=rf"Metric state_dict does not match: {said}"):
            target.load_state_dict(state)
        assert target.to_row()["mx"] == 1.0, key  # refused before anything was loaded or reset
    single = Max()
    single.update(torch.tensor(4.5))
    with pytest.raises(RayCmfError, match=r"the metric was saved as Max\(\) and is Min\(\) here"):
        Min().load_state_dict(single.state_dict())
    free = MetricCollection(
        {"mx": Max(cumulative=True), "h": Histogram(6, -3.0, 3.0, quantiles=(0.1,)), "acc": Accuracy(top_k=1)}
    )
    free.load_state_dict(state)
    assert free.to_row()["mx"] == 4.5 and free.to_row()["h_count"] == 2
    assert "not checked" not in caplog.text
    older = {k: v for k, v in state.items() if not k.endswith("__metric__")}  # saved before settings were kept
    MetricCollection({"mx": Max(), "h": Histogram(6, -3.0, 3.0), "acc": Accuracy(top_k=1)}).load_state_dict(older)
    assert "holds no metric's class and settings (it predates their recording): they are not checked" in caplog.text
    caplog.clear()
    with pytest.raises(RayCmfError, match=r"missing \['mx.extremum', 'mx.nonfinite'\], unexpected \['extremum'"):
        MetricCollection({"mx": Max()}).load_state_dict(single.state_dict())  # a metric's own, into a collection
    assert "not checked" not in caplog.text  # it said the state predated the records
    with pytest.raises(RayCmfError, match=r"'mx.__metric__' holds tensor\(1.\), not what a metric was saved as"):
        MetricCollection({"mx": Max()}).load_state_dict({"mx.__metric__": torch.tensor(1.0), "mx.extremum": 1.0})


def test_accuracy_takes_a_numpy_int_as_the_int_it_is() -> None:
    """``Accuracy(top_k=np.int64(1))`` was refused ("top_k must be an int >= 1, got np.int64(1)"), where a
    Histogram's NumPy bins were taken."""
    numpy_k = Accuracy(top_k=np.int64(2), ignore_index=np.int32(-100))  # type: ignore[arg-type]
    assert (numpy_k.top_k, numpy_k.ignore_index) == (2, -100) and numpy_k.saved_as() == Accuracy(2, -100).saved_as()
    for bad in (2.0, True, "2"):
        with pytest.raises(ValueError, match="top_k must be an int >= 1"):
            Accuracy(top_k=bad)  # type: ignore[arg-type]


def _copied(obj: Any, how: str) -> Any:
    import copy
    import io

    from ray import cloudpickle

    if how == "deepcopy":
        return copy.deepcopy(obj)
    if how == "cloudpickle":  # as Ray passes an object on
        return cloudpickle.loads(cloudpickle.dumps(obj))
    saved = io.BytesIO()
    torch.save(obj, saved)  # keeps the views of one storage as views, where plain pickle copies each
    saved.seek(0)
    return torch.load(saved, weights_only=False)


def _close(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str) -> None:
    assert got.keys() == expected.keys(), what
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, equal_nan=True, msg=f"{what}: {key}")


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=90),
    st.integers(0, 90),
    st.sampled_from(["deepcopy", "cloudpickle", "torch.save"]),
    st.booleans(),
)
def test_a_copied_metric_holds_what_the_original_held_and_goes_its_own_way(
    values: list[float], synced_after: int, how: str, joint: bool
) -> None:
    """``copy.deepcopy`` of a metric that had updates staged shared their blocks with the original: updating
    the copy changed the original's values (a validation copy of the training metrics, say), and pickling it
    (``torch.save``, Ray passing it on) failed ("Can't pickle local object"); then a pickled collection's
    sync read memory no state was in (pickle copies each view of the packed buffer apart; a re-check by a
    new user). A copy holds the original's values, staged updates and last sync included, and each then
    counts and syncs only its own updates."""
    original, twin = MetricCollection(_members()), MetricCollection(_members())
    for i, v in enumerate(values):
        for metrics in (original, twin):
            x, logits, target = torch.tensor([v, v / 2]), torch.eye(3)[i % 3 : i % 3 + 1] * v, torch.tensor([i % 2])
            if joint:
                metrics.update(loss=x, acc=(logits, target), top=x, hist=x)
            else:
                for name, args in (("loss", (x,)), ("acc", (logits, target)), ("top", (x,)), ("hist", (x,))):
                    metrics[name].update(*args)
            if i == synced_after:
                metrics.sync()
    copied = _copied(original, how)
    _close(copied.compute(), twin.compute(), "the copy")
    more = torch.tensor([1000.0, -1000.0])
    copied.update(loss=more, top=more, hist=more)
    _close(original.compute(), twin.compute(), "the original after the copy was updated")
    twin.update(loss=more, top=more, hist=more)
    _close(copied.compute(), twin.compute(), "the copy after its own update")
    _close(copied.sync().wait(), twin.sync().wait(), "the copy's sync")
    again = _copied(original, how)  # of a collection that synced before
    _close(again.sync().wait(), original.sync().wait(), "a copy of a synced collection, synced")
    single = Mean()
    single.update(torch.tensor(values[:5]))
    alone = _copied(single, how)
    single.update(torch.tensor([7.0]))
    reference = Mean()
    reference.update(torch.tensor(values[:5]))
    _close(alone.compute(), reference.compute(), "a standalone metric's copy")
    _close(alone.sync().wait(), reference.sync().wait(), "a standalone metric's copy, synced")


def test_a_collection_of_unnamed_metrics_is_refused_saying_how_to_name_them() -> None:
    """``MetricCollection([Mean(), Max()])`` raised ``AttributeError: 'list' object has no attribute 'items'``
    from inside the package (a new user's). It is a TypeError that says what it takes; a collection's repr
    names its metrics, as each metric's does."""
    with pytest.raises(TypeError, match=r"MetricCollection takes a \{name: metric\} dict, got a list"):
        MetricCollection([Mean(), Max()])  # type: ignore[arg-type]
    assert (
        repr(MetricCollection({"loss": Mean(), "top": Max()}))
        == f"MetricCollection({{'loss': {Mean()!r}, 'top': {Max()!r}}})"
    )
