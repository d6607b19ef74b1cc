"""The sweep report: built from a real Tune sweep, opened in a real headless Chromium (Debian's), offline."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ray_cmf import Cmf, Sweep
from ray_cmf.cli import main
from ray_cmf.report import ReportServer, downsample, importance
from tests._require import require
from tests._sweeps import run_grid

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [  # the flags that keep Chromium off the network on a closed machine
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LRS = [0.01, 0.03, 0.1, 0.3]
ITERATIONS = 12


def _data(page_html: str) -> dict[str, Any]:
    return json.loads(re.search(r"const DATA = (.*);\n", page_html).group(1))  # type: ignore[union-attr]


# -- downsampling and importance -----------------------------------------------------------------------
def test_downsample_keeps_first_last_best_and_each_buckets_extremes() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=10_000)
    y[7_777] = -100.0  # the best point, in the middle of a bucket
    y[123] = np.nan
    x = np.arange(len(y), dtype=float)
    keep = downsample(x, y, 200, "min")
    assert len(keep) <= 200 and list(keep) == sorted(set(keep))
    assert {0, len(y) - 1, 7_777} <= set(keep) and 123 not in keep
    assert y[keep].max() == np.nanmax(y)  # each bucket's maximum too
    short = np.array([1.0, np.nan, 3.0])
    assert list(downsample(np.arange(3.0), short, 200)) == [0, 2]


def test_importance_is_absolute_spearman_and_skips_constant_keys() -> None:
    import pandas as pd

    trials = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d"],
            "config/lr": [0.1, 0.2, 0.3, 0.4],
            "config/wd": [4.0, 1.0, 3.0, 2.0],
            "config/fixed": [1, 1, 1, 1],
            "loss_best": [0.9, 0.5, 0.3, 0.1],  # falls as lr grows: rank correlation -1
        }
    )
    scores = importance(trials, "loss")
    assert list(scores) == ["lr", "wd"] and scores["lr"] == pytest.approx(1.0) and scores["wd"] == pytest.approx(0.4)


# -- a real sweep --------------------------------------------------------------------------------------
def _trainable(config: dict[str, Any]) -> None:
    from ray import tune

    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=None)
    for it in range(ITERATIONS):
        loss = config["lr"] * 10 / (it + 1) + (0.05 if config["optimizer"] == "sgd" else 0.0)
        for step in range(it * 4, it * 4 + 4):  # per-step device metrics, as a TorchTrainer run links them
            cmf.log_metric("train_steps", {"step": step, "grad_norm": 1.0 / (step + 1)})
        tune.report({"loss": loss, "acc": 1 - loss / 10})
    cmf.commit_metrics("train_steps")


@pytest.fixture(scope="module")
def sweep_store(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ray_cmf import CmfRayLogger

    tmp = tmp_path_factory.mktemp("report")
    logger = CmfRayLogger("rep", store=str(tmp / "store"))
    run_grid(_trainable, {"lr": LRS, "optimizer": ["adam", "sgd"]}, tmp / "results", logger)
    return tmp / "store"


def test_report_holds_every_part(sweep_store: Path, tmp_path: Path) -> None:
    path = Sweep(sweep_store).report(tmp_path / "sweep.html", metrics=["loss", "acc"])
    page = path.read_text()
    data = _data(page)
    assert not re.search(r"<(script|link)[^>]*(src|href)=\"https?:", page)  # plotly.js is inside the file
    titles = [s["title"] for s in data["sections"]]
    assert titles == ["loss", "acc", "grad_norm (Train device metrics)"]
    assert all(len(s["traces"]) == len(LRS) * 2 for s in data["sections"])  # one trace per trial
    assert "optimizer=adam" in data["sections"][0]["traces"][0]["hovertemplate"]
    assert [d["label"] for d in data["parcoords"]["dimensions"]] == ["lr", "optimizer", "best loss"]
    assert [p["key"] for p in data["params"]] == ["lr"]  # the only numeric hyperparameter
    assert page.count("<details>") == len(LRS) * 2  # one lineage block per trial
    assert "Spearman" in page and "at most 200 points" in page


def test_cli_report_and_its_errors(sweep_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", "--store", str(sweep_store), "-o", str(out), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["trials"] == len(LRS) * 2 and out.stat().st_size > 1_000_000
    assert main(["report", "--store", str(sweep_store), "-o", str(out), "--metric", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.fixture
def browser() -> Iterator[Any]:
    require(None if CHROMIUM is not None else "no chromium on this machine (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _open(browser: Any, url: str, *, offline: bool) -> tuple[Any, list[str], list[str]]:
    context = browser.new_context(offline=offline, viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    errors: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#curve-0 .scatterlayer .trace').length > 0")
    return page, requests, errors


def test_report_renders_in_chromium_offline(sweep_store: Path, tmp_path: Path, browser: Any) -> None:
    path = Sweep(sweep_store).report(tmp_path / "sweep.html", metrics=["loss", "acc"])
    page, requests, errors = _open(browser, path.as_uri(), offline=True)
    trials = len(LRS) * 2
    assert page.locator("#curve-0 .scatterlayer .trace").count() == trials  # SVG: one trace per trial
    assert page.locator("#device-0 .scatterlayer .trace").count() == trials  # the device metrics
    assert page.locator("#parcoords svg").count() > 0 and page.locator("#params .main-svg").count() > 0
    assert page.locator("#trials tbody tr").count() == trials
    page.locator("#trials th", has_text="loss_best").click()  # sorting: the best trial first
    first = page.locator("#trials tbody tr").first.locator("td").first.inner_text()
    assert first == Sweep(sweep_store).best("loss", "min")["trial_id"].iloc[0]
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []  # nothing off the page


# -- the live server -----------------------------------------------------------------------------------
@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[ReportServer, Callable[[int, int], None]]]:
    """A report server over a run whose rows are spilled, never committed; and a way to log more."""
    store = tmp_path / "store"
    cmf = Cmf(pipeline_name="live", store=store, flush_rows=10)
    cmf.create_execution("train", {"config_json": json.dumps({"lr": 0.1})}, execution_name="run")

    def log(start: int, stop: int) -> None:
        for step in range(start, stop):
            cmf.log_metric("m", {"step": step, "loss": 1.0 / (step + 1)})
        cmf.metrics["m"].flush()  # spilled, never committed

    log(0, 20)
    server = ReportServer(lambda: Sweep(store, metrics_name="m"), port=0, refresh_seconds=1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, log
    finally:
        server.shutdown()
        server.server_close()
        cmf.close()


def test_serve_follows_a_running_series_from_its_spill(live_server: tuple[ReportServer, Any]) -> None:
    """Over HTTP alone: no browser needed."""
    server, log = live_server
    assert server.server_address[0] == "127.0.0.1"
    first = _data(urllib.request.urlopen(server.url).read().decode())
    assert len(first["sections"][0]["traces"][0]["x"]) == 20
    log(20, 50)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the page is rebuilt once it is older than refresh_seconds
        points = len(_data(urllib.request.urlopen(server.url).read().decode())["sections"][0]["traces"][0]["x"])
        if points == 50:
            break
        time.sleep(0.3)
    assert points == 50


def test_the_served_page_renders_in_chromium(live_server: tuple[ReportServer, Any], browser: Any) -> None:
    server, _ = live_server
    page, _, errors = _open(browser, server.url, offline=False)
    assert page.locator("#trials tbody tr").count() == 1 and errors == []
    assert page.locator("#trials tbody td").nth(3).inner_text() == "0.05"  # loss_best of the 20 rows so far
