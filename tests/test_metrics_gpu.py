"""CUDA-only paths: the side-stream sync and zero host syncs per step. Skipped without CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ray_cmf.metrics import Accuracy, Histogram, Max, Mean, MetricCollection, Min, Sum
from tests._dist import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _collection() -> MetricCollection:
    return MetricCollection(
        {
            "loss": Mean(),
            "sum": Sum(),
            "max": Max(),
            "min": Min(),
            "acc": Accuracy(top_k=2),
            "hist": Histogram(32, -4.0, 4.0),
        },
        device="cuda",
    )


def _step(metrics: MetricCollection, step: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(step)
    values = torch.randn(256, device="cuda", generator=g)
    logits = torch.randn(256, 10, device="cuda", generator=g)
    target = torch.randint(0, 10, (256,), device="cuda", generator=g)
    metrics.update(loss=(values, torch.rand(256, device="cuda", generator=g)), acc=(logits, target))  # joint
    for name in ("sum", "max", "min", "hist"):
        metrics[name].update(values)


def test_1000_updates_make_no_host_sync() -> None:
    metrics = _collection()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1000):
            _step(metrics, step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert metrics.to_row()["hist_count"] == 256_000


def test_to_row_moves_results_in_one_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = _collection()
    _step(metrics, 0)
    calls = []
    original = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    row = metrics.to_row()
    assert len(calls) == 1 and row["hist_count"] == 256


def _side_stream(rank: int, world: int) -> dict[str, Any]:
    metrics = _collection()
    for step in range(10):
        _step(metrics, step + 100 * rank)
    handle = metrics.sync(async_op=True)
    for step in range(10, 20):  # updates continue while the side stream reduces
        _step(metrics, step + 100 * rank)
    synced = metrics.to_row(handle.wait())
    blocking = metrics.to_row(metrics.sync().wait())
    return {"synced": synced, "second": blocking}


def test_side_stream_sync_matches_single_process() -> None:
    results = run_distributed(_side_stream, 2)
    for status, payload in results:
        assert status == "ok", payload
    expected_first, expected_second = _collection(), _collection()
    for rank in (0, 1):
        for step in range(10):
            _step(expected_first, step + 100 * rank)
        for step in range(10, 20):
            _step(expected_second, step + 100 * rank)
    for key, value in expected_first.to_row().items():
        assert results[0][1]["synced"][key] == pytest.approx(value, rel=1e-9)
    for key, value in expected_second.to_row().items():
        assert results[1][1]["second"][key] == pytest.approx(value, rel=1e-9)


def test_a_training_loop_with_syncs_and_uneven_groups_makes_no_host_sync() -> None:
    """1,000 steps of updates, an asynchronous sync every 50 and a group whose members are updated unevenly
    (its rows are masked): not one host sync. The rows are read after the loop."""
    metrics = _collection()
    metrics.add("rare", Sum())  # a second Sum: one group with "sum", updated one step in ten
    handles = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1000):
            _step(metrics, step)
            if step % 10 == 0:
                metrics["rare"].update(torch.ones(3, device="cuda"))
            if step % 50 == 49:
                handles.append(metrics.sync(async_op=True))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rows = [metrics.to_row(handle.wait()) for handle in handles]
    assert len(rows) == 20 and all(row["hist_count"] == 256 * 50 and row["rare"] == 15.0 for row in rows)
