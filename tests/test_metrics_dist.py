"""Device metrics over real gloo process groups (2 and 3 ranks, different data per rank)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ray_cmf.metrics import (
    Accuracy,
    CollectiveTimeoutError,
    Histogram,
    LayoutMismatchError,
    Max,
    Mean,
    MetricCollection,
    Min,
    Sum,
    packing,
)
from tests._dist import count_collectives, run_distributed

pytestmark = pytest.mark.distributed


def make_collection(extra: bool = False) -> MetricCollection:
    """20 metrics of every kind (21 with ``extra``)."""
    metrics: dict[str, Any] = {}
    for i in range(4):
        metrics[f"sum{i}"] = Sum()
        metrics[f"mean{i}"] = Mean()
        metrics[f"max{i}"] = Max()
        metrics[f"min{i}"] = Min()
    metrics["wmean"] = Mean()
    metrics["acc"] = Accuracy()
    metrics["acc_top2"] = Accuracy(top_k=2)
    metrics["hist"] = Histogram(bins=16, low=-3.0, high=3.0)
    if extra:
        metrics["extra"] = Sum()
    return MetricCollection(metrics)


def batch(rank: int, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    values = torch.randn(8, generator=g) * (rank + 1)
    if step == 1 and rank == 1:
        values[0] = float("nan")
        values[1] = float("inf")
    return {
        "values": values,
        "weights": torch.rand(8, generator=g),
        "logits": torch.randn(8, 5, generator=g),
        "target": torch.randint(0, 5, (8,), generator=g),
    }


def feed(metrics: MetricCollection, data: dict[str, torch.Tensor]) -> None:
    for i in range(4):
        for kind in ("sum", "mean", "max", "min"):
            metrics[f"{kind}{i}"].update(data["values"] + i)
    metrics["wmean"].update(data["values"], weight=data["weights"])
    metrics["acc"].update(data["logits"], data["target"])
    metrics["acc_top2"].update(data["logits"], data["target"])
    metrics["hist"].update(data["values"])


def single_process(ranks: list[int], steps: range) -> dict[str, float]:
    metrics = make_collection()
    for rank in ranks:
        for step in steps:
            feed(metrics, batch(rank, step))
    return metrics.to_row()


def _sync_scenario(rank: int, world: int, gather_max_elements: int) -> dict[str, Any]:
    packing.GATHER_MAX_ELEMENTS = gather_max_elements
    counts = count_collectives()
    metrics = make_collection()
    for step in range(3):
        feed(metrics, batch(rank, step))
    first = metrics.to_row(metrics.sync().wait())
    first_calls = sum(counts.values())
    counts.clear()
    for step in range(3, 5):
        feed(metrics, batch(rank, step))
    second = metrics.to_row(metrics.sync(async_op=True).wait())
    second_calls = dict(counts)
    # async and blocking give the same values
    counts.clear()
    for step in range(3, 5):
        feed(metrics, batch(rank, step))
    blocking = metrics.to_row(metrics.sync().wait())
    return {
        "first": first,
        "second": second,
        "blocking": blocking,
        "first_calls": first_calls,
        "second_calls": second_calls,
        "local_after_sync": metrics["sum0"].total.item(),
    }


@pytest.fixture(scope="module", params=["all_gather", "all_reduce"])
def two_rank_sync(request: pytest.FixtureRequest) -> tuple[str, list[Any]]:
    """The sync scenario on 2 ranks, with the state small enough for one all_gather, or as if too large."""
    limit = packing.GATHER_MAX_ELEMENTS if request.param == "all_gather" else 0
    return request.param, run_distributed(_sync_scenario, 2, limit)


def _ok(results: list[Any]) -> list[Any]:
    for status, payload in results:
        assert status == "ok", payload
    return [payload for _, payload in results]


def assert_rows_close(actual: dict[str, float], expected: dict[str, float]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        a, e = actual[key], expected[key]
        assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e, rel=1e-9, abs=1e-9), key


def test_synced_values_equal_single_process_over_all_data(two_rank_sync: tuple[str, list[Any]]) -> None:
    ranks = _ok(two_rank_sync[1])
    assert_rows_close(ranks[0]["first"], single_process([0, 1], range(3)))
    assert ranks[0]["first"] == ranks[1]["first"] or all(
        math.isnan(v) for k, v in ranks[0]["first"].items() if v != ranks[1]["first"][k]
    )
    assert ranks[0]["first"]["sum0_nonfinite"] == 2  # the NaN and the inf of rank 1, step 1


def test_one_sync_covers_the_interval_then_resets(two_rank_sync: tuple[str, list[Any]]) -> None:
    ranks = _ok(two_rank_sync[1])
    assert_rows_close(ranks[0]["second"], single_process([0, 1], range(3, 5)))
    assert ranks[0]["local_after_sync"] == 0.0


def test_one_or_two_collectives_per_sync_with_20_metrics(two_rank_sync: tuple[str, list[Any]]) -> None:
    mode, results = two_rank_sync
    assert len(make_collection()) == 20
    # small state: one all_gather, reduced locally; otherwise SUM, and MAX with the min region negated
    expected = {"all_gather_single": 1} if hasattr(dist, "all_gather_single") else {"all_gather_into_tensor": 1}
    if mode == "all_reduce":
        expected = {"all_reduce": 2}
    for r in _ok(results):
        assert {name: n for name, n in r["second_calls"].items() if n} == expected
        assert r["first_calls"] == sum(expected.values()) + 1  # + the one-time layout check


def test_async_equals_blocking(two_rank_sync: tuple[str, list[Any]]) -> None:
    ranks = _ok(two_rank_sync[1])
    assert_rows_close(ranks[0]["second"], ranks[0]["blocking"])


def _idle_rank_and_cumulative(rank: int, world: int) -> dict[str, Any]:
    metrics = make_collection()
    total = MetricCollection({"running": Sum(cumulative=True), "interval": Sum()})
    if rank != 2:  # rank 2 never updates
        for step in range(3):
            feed(metrics, batch(rank, step))
    for _ in range(2):
        total["running"].update(torch.tensor(float(rank + 1)))
        total["interval"].update(torch.tensor(float(rank + 1)))
        total.sync()
    return {"row": metrics.to_row(metrics.sync().wait()), "totals": total.to_row()}


def test_rank_without_updates_and_cumulative_metrics() -> None:
    ranks = _ok(run_distributed(_idle_rank_and_cumulative, 3))
    assert_rows_close(ranks[2]["row"], single_process([0, 1], range(3)))
    assert ranks[0]["totals"]["running"] == 2 * (1 + 2 + 3)
    assert ranks[0]["totals"]["interval"] == 1 + 2 + 3


def _save(rank: int, world: int, path: str) -> None:
    metrics = make_collection()
    for step in range(3):
        feed(metrics, batch(rank, step))
    state = metrics.state_dict()  # global: the same on every rank
    if rank == 0:
        torch.save(state, path)


def _restore(rank: int, world: int, path: str) -> dict[str, float]:
    metrics = make_collection()
    metrics.load_state_dict(torch.load(path))
    feed(metrics, batch(rank + 10, 0))
    return metrics.to_row(metrics.sync().wait())


def test_checkpoint_saved_on_2_ranks_restores_on_3(tmp_path: Any) -> None:
    path = str(tmp_path / "metrics.pt")
    _ok(run_distributed(_save, 2, path))
    restored = _ok(run_distributed(_restore, 3, path))
    expected = make_collection()
    for r in (0, 1):
        for step in range(3):
            feed(expected, batch(r, step))
    for r in (10, 11, 12):
        feed(expected, batch(r, 0))
    assert_rows_close(restored[1], expected.to_row())


def _mismatch(rank: int, world: int) -> None:
    metrics = make_collection(extra=rank == 1)
    metrics.sync()


def test_layout_mismatch_raises_naming_the_difference_instead_of_hanging() -> None:
    results = run_distributed(_mismatch, 2)
    for status, text in results:
        assert status == "error"
        assert "LayoutMismatchError" in text and "extra" in text and "extra.total" in text


def _settings_differ(rank: int, world: int) -> None:
    high = 4.0 if rank == 0 else 8.0
    metrics = MetricCollection({"loss": Mean(), "h": Histogram(4, 0.0, high), "acc": Accuracy(top_k=1 + rank)})
    metrics["h"].update(torch.tensor([0.5, 1.5]))
    metrics.sync()


def test_metrics_whose_settings_differ_across_ranks_raise_naming_them() -> None:
    """Histograms of another range, or a top-k of another k, pack the same states: the ranks reduced counts of
    different bins and each read its own "global" values. The settings are part of the layout."""
    for status, text in run_distributed(_settings_differ, 2):
        assert status == "error" and "LayoutMismatchError" in text
        assert "metric 'h' is Histogram(4, 0.0, 4.0, " in text and "Histogram(4, 0.0, 8.0, " in text
        assert "metric 'acc' is Accuracy(1, None, " in text and "Accuracy(2, None, " in text


class _Scaled(Sum):
    """A metric of a user's, whose setting is a function: its repr holds the function's address."""

    def __init__(self, scale: Any) -> None:
        super().__init__()
        self.scale = scale

    def _config(self) -> tuple[Any, ...]:
        return (self.scale,)


def test_a_setting_whose_repr_holds_an_address_packs_one_layout_in_every_process() -> None:
    """Each process holds the function at another address: the layout check must not read that as another
    setting (here: two functions of one process at two addresses)."""
    functions = [lambda x: x, lambda x: x]  # both alive: two addresses
    layouts = [packing.StatePack([[("s.", _Scaled(f))]], torch.device("cpu")).layout for f in functions]
    assert layouts[0] == layouts[1] and "function" in layouts[0][0][4]


def _reordered(rank: int, world: int) -> None:
    named = {"a": Mean(), "b": Max()}
    metrics = MetricCollection(named if rank == 0 else dict(reversed(named.items())))
    metrics.sync()


def test_metrics_built_in_another_order_on_one_rank_raise_saying_so() -> None:
    """The same metrics in another order pack another layout: the error named no difference."""
    for status, text in run_distributed(_reordered, 2):
        assert status == "error" and "LayoutMismatchError" in text
        assert "rank 1 builds the metrics in another order" in text and "['b', 'a']" in text


def test_layout_error_type_is_public() -> None:
    assert issubclass(LayoutMismatchError, Exception)


def _state_dict_on_rank_0_only(rank: int, world: int) -> str:
    import time

    metrics = make_collection()
    feed(metrics, batch(rank, 0))
    metrics.sync()  # both ranks: the layout is checked
    if rank == 0:
        try:
            metrics.state_dict(timeout=2.0)  # a collective that rank 1 never joins
        except CollectiveTimeoutError as exc:
            return str(exc)
        return "no error"
    time.sleep(6.0)  # alive, and busy elsewhere, while rank 0 waits
    return "rank 1"


def test_state_dict_on_one_rank_says_what_happened_instead_of_hanging() -> None:
    results = _ok(run_distributed(_state_dict_on_rank_0_only, 2))
    assert "every rank must call it" in results[0] and "waited 2 s" in results[0]


def _group_destroyed_during_a_sync(rank: int, world: int, marker: str) -> str:
    import threading
    import time
    from pathlib import Path

    metrics = make_collection()  # synced over the default group, as StepLogger's are: only torch holds it
    feed(metrics, batch(rank, 0))
    metrics.sync()  # both ranks: the layout is checked
    if rank == 1:  # alive, but never joins the next sync (its loop raised), until rank 0 is done
        while not Path(marker).exists():
            time.sleep(0.05)
        return "rank 1"
    feed(metrics, batch(rank, 1))
    metrics.sync(async_op=True)  # in flight, as StepLogger leaves each sync while the next step runs
    destroyed = threading.Event()

    def destroy() -> None:  # as Ray Train does to every worker's process group as it stops a failed run
        dist.destroy_process_group()
        destroyed.set()

    threading.Thread(target=destroy, daemon=True).start()
    finished = destroyed.wait(60)  # a liveness bound, not a timing: it either returns at once or hangs
    Path(marker).touch()
    return "destroyed" if finished else "destroy_process_group hung"


def test_a_sync_in_flight_does_not_hold_up_destroying_its_process_group(tmp_path: Any) -> None:
    """Ray Train destroys every worker's process group as it stops a run whose other rank raised. A rank
    whose StepLogger sync was in flight held that up until Ray Train gave up 30 s later (its warning "Torch
    process group shutdown timed out"): the pending asynchronous work was the group's last user, so
    destroying the group waited for it, where a rank blocked in a synchronous collective of its own loop
    does not. A sync in flight now holds its group, as a synchronous collective does."""
    results = _ok(run_distributed(_group_destroyed_during_a_sync, 2, str(tmp_path / "done")))
    assert results == ["destroyed", "rank 1"]
