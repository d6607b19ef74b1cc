"""The README's first two examples run as written (the cmflib API, then a Tune sweep, into one store), and
its comparison commands work on what they leave: the README cannot drift from the code."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ray_cmf import Sweep
from ray_cmf.cli import main

README = Path(__file__).parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.integration
@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmflib_api, tune_sweep = _python_blocks()[:2]
    env = {k: v for k, v in os.environ.items() if k != "RAY_CMF_STORE"} | {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    for block in (cmflib_api, tune_sweep.replace("loguniform(1e-4, 1e-1)", "grid_search([0.01, 0.1])")):
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    store = tmp_path / "cmf_store"  # the default store, where both examples put their pipelines
    assert Sweep(store, pipeline="mnist", metrics_name="train_steps").trials()["steps"].tolist() == [100_000]
    table = Sweep(store, pipeline="lr_sweep").trials(["val_loss"])
    assert len(table) == 2 and set(table["status"]) == {"COMPLETE"}
    assert Sweep(store, pipeline="lr_sweep", metrics_name="steps").trials()["steps"].tolist() == [10_000] * 2
    capsys.readouterr()
    for line in ("ray-cmf compare --pipeline lr_sweep --metric val_loss --mode min --top 5", "ray-cmf pipelines"):
        assert line in README.read_text()
        assert main([*line.split()[1:], "--store", str(store), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)
    for line, trials in (  # the curation examples, on the sweep's two trials (lr 0.01 and 0.1)
        # none: lr is 0.01 or 0.1
        ("""ray-cmf trials --where 'config/lr < 0.01 and status == "COMPLETE"' --sort val_loss_best --limit 10""", 0),
        ("""ray-cmf delete --where 'status in ["FAILED", "CRASHED"]' --dry-run""", 0),
    ):
        assert line in README.read_text()
        assert main([*shlex.split(line)[1:], "--pipeline", "lr_sweep", "--store", str(store), "--json"]) == 0
        assert len(json.loads(capsys.readouterr().out)) == trials


def test_import_ray_cmf_reaches_its_integrations_as_the_readme_writes_them() -> None:
    """The README writes ``import ray_cmf`` and then ``ray_cmf.tune.get_cmf()``: in a trainable that lives in
    its own module, where nothing had imported ``ray_cmf.tune``, that raised "module 'ray_cmf' has no
    attribute 'tune'" and every trial failed."""
    probe = "import ray_cmf, sys; print(ray_cmf.tune.get_cmf.__name__, ray_cmf.train.StepLogger.__name__, "
    probe += "ray_cmf.metrics.Mean.__name__, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["get_cmf", "StepLogger", "Mean", "True"], done.stderr
    done = subprocess.run([sys.executable, "-c", "import ray_cmf; ray_cmf.nope"], capture_output=True, text=True)
    assert "module 'ray_cmf' has no attribute 'nope'" in done.stderr
