"""The benchmarks' own set-up runs on the current code: a benchmark whose generator breaks records nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from ray_cmf import Sweep

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _benchmark(name: str) -> ModuleType:
    """A benchmark script as a module (it finds its own helpers)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_sweep_reads_as_a_tune_sweep(tmp_path: Path) -> None:
    """bench_sweep_scale's sweep (also bench_report's, bench_lifecycle's, bench_scale's and bench_team_store's)
    logged its own ``attempt`` column, which ray_cmf fills itself and refuses: all five stopped at once."""
    _benchmark("bench_sweep_scale").generate(tmp_path / "store", None, trials=3, steps=10)
    sweep = Sweep(tmp_path / "store")
    table = sweep.trials(["loss"])
    assert len(table) == 3 and list(table["steps"]) == [10, 10, 10]
    assert set(sweep.steps(["attempt"])["attempt"]) == {1}
