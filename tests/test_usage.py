"""How people really use it, end to end: a notebook that runs sweeps and Train runs one after another and
restarts Ray between them, two pipelines in one store, and a store read (Sweep, ``ray-cmf serve``) while
another process's sweep is writing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from ray_cmf import StoreError, Sweep
from ray_cmf.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}

NOTEBOOK = textwrap.dedent(
    """
    import sys
    import ray, torch
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    import ray_cmf
    from ray_cmf import CmfRayLogger, CmfTrainCallback
    from ray_cmf.metrics import Mean, MetricCollection
    from ray_cmf.train import StepLogger

    store, results = sys.argv[1], sys.argv[2]

    def trainable(config):
        cmf = ray_cmf.tune.get_cmf(system_metrics=None)
        for it in range(3):
            cmf.log_metric("steps", {"it": it, "lr": config["lr"]})
            tune.report({"loss": config["lr"] / (it + 1)})
        cmf.commit_metrics("steps")

    def loop(config):
        metrics = MetricCollection({"loss": Mean()})
        steps = StepLogger(metrics, sync_every=2, pipeline_name="nb_train", system_metrics=None)
        for step in range(6):
            metrics.update(loss=torch.tensor(float(step)))
            steps.step()
        steps.finish()

    for cell in range(2):  # a notebook: each cell starts Ray, runs, and shuts it down
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        name = f"nb{cell}"
        tune.Tuner(
            trainable,
            param_space={"lr": tune.grid_search([0.1, 0.2])},
            run_config=tune.RunConfig(
                name=name, storage_path=results, verbose=0, callbacks=[CmfRayLogger(name, metric="loss", store=store)]
            ),
        ).fit()
        TorchTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(
                name=f"run{cell}", storage_path=results, callbacks=[CmfTrainCallback("nb_train", store=store)]
            ),
        ).fit()
        ray.shutdown()
    print("done", flush=True)
    """
)


def test_a_notebook_that_restarts_ray_between_sweeps_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second Ray of the process got the first one's writer, which was gone: its trials failed."""
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, str(store), str(tmp_path / "results")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
    assert "the sweep goes on" not in done.stderr, done.stderr[-3000:]  # no hook failed
    for pipeline in ("nb0", "nb1"):  # two sweeps' pipelines (and the Train runs') in one store
        table = Sweep(store, pipeline=pipeline).trials(["loss"])
        assert table["status"].tolist() == ["COMPLETE", "COMPLETE"] and table["steps"].tolist() == [3, 3]
        assert Sweep(store, pipeline=pipeline, metrics_name="steps").trials()["steps"].tolist() == [3, 3]
    runs = Sweep(store, pipeline="nb_train", metrics_name="train_steps").trials()
    assert sorted(runs["trial_id"]) == ["run0", "run1"] and runs["steps"].tolist() == [3, 3]
    with pytest.raises(StoreError, match="3 pipelines"):
        Sweep(store)  # which one is meant is the user's to say
    capsys.readouterr()
    assert main(["pipelines", "--store", str(store), "--json"]) == 0
    assert [row["pipeline"] for row in json.loads(capsys.readouterr().out)] == ["nb0", "nb_train", "nb1"]
    assert main(["trials", "--store", str(store), "--pipeline", "nb1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


WRITING = textwrap.dedent(
    """
    import sys, time
    import ray
    from ray import tune
    import ray_cmf
    from ray_cmf import CmfRayLogger

    def trainable(config):
        cmf = ray_cmf.tune.get_cmf(system_metrics=None, flush_rows=5)
        for it in range(40):
            cmf.log_metric("steps", {"it": it, "loss": config["lr"] / (it + 1)})
            time.sleep(0.1)
            if it % 5 == 4:
                tune.report({"loss": config["lr"] / (it + 1)})
        cmf.commit_metrics("steps")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(
            name="live", storage_path=sys.argv[2], verbose=0,
            callbacks=[CmfRayLogger("live", metric="loss", store=sys.argv[1], flush_rows=2)],
        ),
    ).fit()
    """
)


def test_a_store_is_read_while_another_process_writes_it(tmp_path: Path) -> None:
    """Sweep and the ``serve`` page (over HTTP, no browser) read a store while a sweep writes it."""
    from ray_cmf.report import ReportServer

    store = tmp_path / "store"
    writer = subprocess.Popen([sys.executable, "-c", WRITING, str(store), str(tmp_path / "results")], env=ENV)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((store / "spill").glob("*/seg-*.arrows")):
            time.sleep(0.2)
        seen = 0
        server = ReportServer(lambda: Sweep(store, metrics_name="steps"), port=0, refresh_seconds=0)
        try:
            import threading

            threading.Thread(target=server.serve_forever, daemon=True).start()
            while writer.poll() is None:
                live = Sweep(store, metrics_name="steps").steps(["loss"], live=True)
                seen = max(seen, len(live))
                with urllib.request.urlopen(server.url, timeout=30) as response:
                    page = response.read().decode()
                assert response.status == 200 and 'id="trials"' in page
                time.sleep(0.5)
        finally:
            server.shutdown()
            server.server_close()
        assert writer.wait(timeout=300) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    assert 0 < seen <= 80  # rows were read while they were being written
    final = Sweep(store, metrics_name="steps").steps(["loss"])
    assert len(final) == 80 and final.groupby("trial_id", observed=True).size().tolist() == [40, 40]
