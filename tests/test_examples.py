"""The examples run as a user runs them (small, through their command line), so that none can rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_cmf import Sweep

EXAMPLES = Path(__file__).parents[1] / "examples"
ENV = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


def _run(tmp_path: Path, example: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example), *args],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("example", ["cmf_basic.py", "tune_sweep.py", "torch_trainer.py", "tune_torch_trainer.py"])
def test_every_example_says_how_to_run_it(tmp_path: Path, example: str) -> None:
    shown = _run(tmp_path, example, "--help")
    assert "--store" in shown and "--size" in shown
    assert not list(tmp_path.iterdir())  # --help runs nothing


def test_cmf_basic(tmp_path: Path) -> None:
    out = _run(tmp_path, "cmf_basic.py", "--size", "2", "--store", "s")
    assert "committed 32 rows" in out
    assert Sweep(tmp_path / "s", metrics_name="train_steps").trials()["steps"].tolist() == [32]


@pytest.mark.integration
@pytest.mark.slow
def test_tune_sweep(tmp_path: Path) -> None:
    out = _run(tmp_path, "tune_sweep.py", "--size", "1", "--store", "s")
    assert "Trial comparison" in out and (tmp_path / "demo_report.html").is_file()
    table = Sweep(tmp_path / "s", pipeline="lr_sweep").trials(["val_loss"])
    assert len(table) == 4 and set(table["status"]) == {"COMPLETE"} and set(table["steps"]) == {1}


@pytest.mark.integration
@pytest.mark.slow
def test_torch_trainer_and_tune_torch_trainer(tmp_path: Path) -> None:
    _run(tmp_path, "torch_trainer.py", "--size", "1", "--store", "s")
    _run(tmp_path, "tune_torch_trainer.py", "--size", "1", "--store", "s")
    runs = Sweep(tmp_path / "s", pipeline="torch_trainer_demo", metrics_name="train_steps").trials(["loss"])
    assert len(runs) == 3 and set(runs["status"]) == {"COMPLETE"}  # one plain run, two inside trials
    trials = Sweep(tmp_path / "s", pipeline="torch_trainer_demo", stage="nested_sweep").trials()
    assert len(trials) == 2 and not trials["stopped"].any()  # they ended on their own ("done" was reported)
