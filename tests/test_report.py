"""The sweep report: built from a real Tune sweep, opened in a real headless Chromium (Debian's), offline."""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ray_cmf import Cmf, Sweep
from ray_cmf.cli import main
from ray_cmf.frames import Span, drawable
from ray_cmf.frames import floats as floats_of
from ray_cmf.report import ReportServer, build, downsample, importance
from tests._browser import open_report, screenshot
from tests._sweeps import run_grid
from tests._values import floats

LRS = [0.001, 0.01, 0.1, 0.3]  # spread over 2+ decades: a log axis
ITERATIONS = 12
DIVERGES = {"lr": 0.3, "optimizer": "sgd"}  # its loss turns NaN, then the trial fails


def _data(page_html: str) -> dict[str, Any]:
    return json.loads(re.search(r"let DATA = (.*);\n", page_html).group(1))  # type: ignore[union-attr]


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


def test_importance_ranks_only_the_trials_with_both_values() -> None:
    """A trial without a best (failed before its first result) or without the key took a rank among the key's
    values, and Pearson on those ranks then read 0.206 where the trials that have both give |Spearman| 0.273
    (a new user's hand computation)."""
    import pandas as pd

    def spearman(x: list[Any], y: list[float]) -> float:  # without ties: 1 - 6 sum(d^2) / (n (n^2 - 1))
        ranks = [[sorted(v).index(e) for e in v] for v in (x, y)]
        n = len(x)
        return 1 - 6 * sum((a - b) ** 2 for a, b in zip(*ranks, strict=True)) / (n * (n * n - 1))

    lr = [0.1, 0.5, 0.2, 0.9, 0.05, 0.3, 0.7, 0.4, 0.6, 0.8, 0.01]
    best = [0.5, 0.2, 0.4, 0.9, 0.6, 0.1, 0.3, 0.8, 0.7, 1.0, float("nan")]
    depth = [None, 3, 1, 7, 2, 9, 5, 4, 6, 8, 16]
    trials = pd.DataFrame({"config/lr": lr, "config/depth": depth, "loss_best": best})
    scores = importance(trials, "loss")
    assert scores["lr"] == pytest.approx(abs(spearman(lr[:10], best[:10])))  # 0.2727, where it read 0.206
    assert scores["depth"] == pytest.approx(abs(spearman(depth[1:10], best[1:10])))
    one = trials.assign(loss_best=[0.5] + [float("nan")] * 10)  # one trial with both: nothing to rank
    assert importance(one, "loss") == {}


# -- a real sweep --------------------------------------------------------------------------------------
def _trainable(config: dict[str, Any]) -> None:
    from ray import tune

    import ray_cmf.tune

    cmf = ray_cmf.tune.get_cmf(system_metrics=None)
    diverges = config == DIVERGES
    for it in range(ITERATIONS):
        loss = config["lr"] * 10 / (it + 1) + (0.05 if config["optimizer"] == "sgd" else 0.0)
        if diverges and it >= 5:
            loss = float("nan")
        if diverges and it == 8:
            cmf.commit_metrics("train_steps")
            raise RuntimeError("diverged")
        for step in range(it * 4, it * 4 + 4):  # per-step device metrics, as a TorchTrainer run links them
            cmf.log_metric("train_steps", {"step": step, "grad_norm": 1.0 / (step + 1)})
        tune.report({"loss": loss, "acc": 1 - loss / 10})
    cmf.commit_metrics("train_steps")


@pytest.fixture(scope="module")
def sweep_store(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ray_cmf import CmfRayLogger

    tmp = tmp_path_factory.mktemp("report")
    logger = CmfRayLogger("rep", store=str(tmp / "store"), system_metrics=None)  # the series asserted below only
    run_grid(_trainable, {"lr": LRS, "optimizer": ["adam", "sgd"]}, tmp / "results", logger)
    return tmp / "store"


def test_report_holds_every_part(sweep_store: Path, tmp_path: Path) -> None:
    path = Sweep(sweep_store).report(tmp_path / "sweep.html", metrics=["loss", "acc"])
    page = path.read_text()
    data = _data(page)
    assert not re.search(r"<(script|link)[^>]*(src|href)=\"https?:", page)  # plotly.js is inside the file
    titles = [s["title"] for s in data["sections"]]  # every series, each metric under its series' name
    assert titles == ["loss · tune_results", "acc · tune_results", "grad_norm · train_steps"]
    trials = len(LRS) * 2
    for section in data["sections"]:  # a curve per trial, and the diverged one's non-finite markers
        lines = [t for t in section["traces"] if t["mode"] == "lines"]
        assert len(lines) == trials and {t["meta"] for t in lines} == set(data["status"])
    assert "optimizer=adam" in data["sections"][0]["traces"][0]["hovertemplate"]
    assert [d["label"] for d in data["parcoords"]["dimensions"]] == ["log10(lr)", "optimizer", "best loss"]
    assert [(p["key"], p["log"]) for p in data["params"]] == [("lr", True)]  # one numeric key: no bar chart
    assert "Importance: |Spearman" not in page  # the note goes with the chart
    assert page.count("<details>") == trials  # one lineage block per trial
    assert "Every logged point is drawn" in page and "equal step buckets" not in page  # 12 points per curve
    assert sorted(data["status"].values()).count("FAILED") == 1
    [failed] = [trial for trial, status in data["status"].items() if status == "FAILED"]  # its detail says why
    assert re.search(rf"<summary>{failed} [^<]*</summary><pre class=error>[^<]*RuntimeError: diverged</pre>", page)
    table = Sweep(sweep_store).trials(["loss"])
    best_first = table.sort_values("loss_best", kind="stable")["trial_id"].tolist()
    assert re.findall(r'<tr data-trial="([^"]+)"', page) == best_first


def test_cli_report_and_its_errors(sweep_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", "--store", str(sweep_store), "-o", str(out), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["trials"] == len(LRS) * 2 and out.stat().st_size > 1_000_000
    assert main(["report", "--store", str(sweep_store), "-o", str(out), "--metric", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_report_renders_in_chromium_offline(sweep_store: Path, tmp_path: Path, browser: Any) -> None:
    path = Sweep(sweep_store).report(tmp_path / "sweep.html", metrics=["loss", "acc"])
    page, requests, errors = open_report(browser, path.as_uri(), offline=True)
    trials = len(LRS) * 2
    best = Sweep(sweep_store).best("loss", "min")["trial_id"].iloc[0]
    titles = page.locator(".plot .gtitle").all_text_contents()  # what the user reads above each plot
    assert titles[:3] == ["loss · tune_results", "acc · tune_results", "grad_norm · train_steps"]
    assert page.locator("#curve-0 .scatterlayer .trace").count() == trials + 1  # + the NaN markers
    assert page.locator("#curve-2 .scatterlayer .trace").count() == trials  # the in-trial series
    assert page.locator("#parcoords svg").count() > 0 and page.locator("#params .js-plotly-plot").count() == 1
    assert "One numeric hyperparameter varies" in page.locator("#importance").inner_text()
    rows = page.locator("#trials tbody tr")
    assert rows.count() == trials
    assert rows.first.get_attribute("data-trial") == best  # best first, before any click
    screenshot(page, "report-sweep.png")
    rows.first.click()  # the picker: that trial's curves stand out in every plot
    opacity = page.evaluate("document.getElementById('curve-2').data.map(t => [t.meta, t.opacity])")
    assert {meta: value for meta, value in opacity} == {m: 1 if m == best else 0.12 for m, _ in opacity}
    assert "picked" in (rows.first.get_attribute("class") or "")
    screenshot(page, "report-picked.png")
    page.locator("#complete-only").check()  # the failed, diverged trial leaves the table and the plots
    assert page.locator("#trials tbody tr:not(.hidden)").count() == trials - 1
    visible = page.evaluate("document.getElementById('curve-0').data.filter(t => t.visible !== false).length")
    assert visible == trials - 1
    screenshot(page, "report-completed-only.png")
    page.locator("#trials th", has_text="loss_best").click()  # a click on the sorted column reverses it
    assert rows.first.get_attribute("data-trial") != best
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []  # nothing off the page


def test_a_click_sorts_ints_beyond_2_53_exactly(tmp_path: Path, browser: Any) -> None:
    """Ints that float64 rounds to one value (2**70 + 0..3) sorted as equals: each cell's sort key was the
    float (found by a new user)."""
    from tests._stores import Trial, write_trials

    rows = {"": [{"training_iteration": 1, "loss": 0.5}]}
    order = [2, 0, 3, 1]
    trials = [Trial(f"t{k}", {}, rows, final={"big": 2**70 + k}) for k in order]
    path = Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html")
    page, _, errors = open_report(browser, path.as_uri(), offline=True)
    page.locator("#trials th", has_text="metrics/final/big").click()
    shown = page.locator("#trials tbody tr").evaluate_all("rows => rows.map(r => r.dataset.trial)")
    assert shown == ["t0", "t1", "t2", "t3"] and errors == []


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


def test_the_served_page_updates_in_place_in_chromium(live_server: tuple[ReportServer, Any], browser: Any) -> None:
    """The open page fetches only its content (JSON) and redraws: no reload of the whole page, and the
    user's zoom stays."""
    server, log = live_server
    page, requests, errors = open_report(browser, server.url, offline=False)
    assert page.locator("#trials tbody tr").count() == 1 and errors == []
    assert page.locator("#trials tbody td").nth(3).inner_text() == "0.05"  # loss_best of the 20 rows so far
    page.evaluate("window.notReloaded = true")
    page.evaluate("Plotly.relayout('curve-0', {'xaxis.range': [5, 15]})")  # the user zooms in
    log(20, 50)
    page.wait_for_function("document.getElementById('curve-0').data[0].x.length === 50", timeout=30_000, polling=200)
    assert page.evaluate("window.notReloaded === true")
    assert page.evaluate("document.getElementById('curve-0').layout.xaxis.range") == [5, 15]
    assert page.locator("#trials tbody td").nth(3).inner_text() == "0.02"  # 1 / 50
    assert any(url.endswith("/data.json") for url in requests)
    assert [url for url in requests if url == server.url] == [server.url]  # the page itself: once
    screenshot(page, "report-live.png")
    assert errors == []


def test_the_served_page_follows_new_columns_trials_and_hyperparameters_in_chromium(
    tmp_path: Path, browser: Any
) -> None:
    """Served live, a metric that appeared after the page opened brought its cells but not their headers (a
    trial's ``steps`` read another column's number), a trial that started later reached neither the
    hyperparameter scatter nor the lineage, and the plot beside a new one kept its old width, cut off (a new
    user)."""
    store = tmp_path / "store"
    first = Cmf(pipeline_name="live", store=store)
    first.create_execution("train", {"lr": 0.1}, execution_name="a")
    for step in range(10):
        first.log_metric("m", {"step": step, "loss": 1.0 / (step + 1)})
    first.flush()
    server = ReportServer(lambda: Sweep(store, metrics_name="m"), port=0, refresh_seconds=1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    second = Cmf(pipeline_name="live", store=store)
    try:
        page, _, errors = open_report(browser, server.url, offline=False)
        assert page.locator("#params .js-plotly-plot").count() == 0  # one trial: nothing varies yet
        assert page.locator("#parcoords").is_hidden()  # not an empty box
        second.create_execution("train", {"lr": 0.001}, execution_name="b")
        for step in range(5):
            second.log_metric("m", {"step": step, "loss": 2.0, "extra": float(step)})
        second.flush()
        page.wait_for_function(
            "document.querySelectorAll('#trials tbody tr').length === 2"
            " && document.querySelectorAll('#params .js-plotly-plot').length === 1",
            timeout=30_000,
            polling=200,
        )
        headers = page.locator("#trials th").all_text_contents()
        cells = page.locator("#trials tbody tr").evaluate_all(
            "rows => rows.map(r => [r.dataset.trial, Array.from(r.cells, c => c.textContent)])"
        )
        table = {trial: dict(zip(headers, texts, strict=True)) for trial, texts in cells}
        assert (table["a"]["steps"], table["b"]["steps"], table["b"]["extra_final"]) == ("10", "5", "4"), table
        assert page.evaluate("document.querySelector('#params .js-plotly-plot').data[0].x") == [0.1, 0.001]
        assert "b (" in " ".join(page.locator("#lineage summary").all_text_contents())
        assert page.locator("#parcoords.js-plotly-plot").is_visible()
        widths = page.evaluate(
            "Array.from(document.querySelectorAll('#curves .plot'), d => [d._fullLayout.width, d.clientWidth])"
        )
        assert len(widths) == 2 and all(abs(drawn - room) <= 2 for drawn, room in widths), widths
        screenshot(page, "report-live-new-columns.png")
        assert errors == []
    finally:
        server.shutdown()
        server.server_close()
        second.close()
        first.close()


def test_the_server_sends_the_content_as_json(live_server: tuple[ReportServer, Any]) -> None:
    server, _ = live_server
    parts = json.loads(urllib.request.urlopen(server.url + "data.json").read())
    assert set(parts) == {"data", "table", "title", "note", "importance_note", "lineage"}
    assert parts["title"] == "live: 1 trial" and len(parts["data"]["sections"][0]["traces"][0]["x"]) == 20
    head = urllib.request.urlopen(urllib.request.Request(server.url, method="HEAD"))  # it answered 501 (a new user)
    assert head.status == 200 and head.headers["Content-Type"].startswith("text/html") and head.read() == b""


def test_a_client_that_leaves_mid_page_is_no_error(
    live_server: tuple[ReportServer, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    """Each client that left before the page was sent (a reload, ``curl | head``) printed a BrokenPipeError or
    ConnectionResetError traceback on serve's terminal (a new user)."""
    import socket
    import struct

    server, _ = live_server
    host, port = server.server_address[:2]
    threads = threading.active_count()
    for _ in range(3):
        client = socket.create_connection((str(host), port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.recv(100)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not a close
        client.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > threads and time.monotonic() < deadline:  # the handlers' threads end
        time.sleep(0.05)
    assert urllib.request.urlopen(server.url + "data.json").status == 200  # it goes on serving
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Broken pipe" not in err and "Connection reset" not in err, err


def test_the_report_never_shows_two_different_values_as_one(tmp_path: Path) -> None:
    """Lr 0.1 and 0.10000001 both read 0.1 in the report's table, its hover and a grouped table's keys (4
    significant digits): two trials that differ looked alike. A value now gets the digits that tell it apart
    from the other values of its column and row."""
    store = tmp_path / "store"
    for name, lr in (("a", 0.1), ("b", 0.10000001), ("c", 0.123456), ("s", "0.1"), ("t", "a\tb"), ("u", "a b")):
        with Cmf(pipeline_name="p", store=store) as cmf:
            cmf.create_execution("train", {"lr": lr, "wd": 1 / 3}, execution_name=name)
            for step in range(3):
                cmf.log_metric("steps", {"step": step, "loss": (lr if isinstance(lr, float) else 2.0) + 1 / (step + 1)})
            cmf.commit_metrics("steps")
    page = Sweep(store, metrics_name="steps").report(tmp_path / "r.html").read_text()
    rows = {
        m.group(1): re.findall(r"<td[^>]*>([^<]*)</td>", m.group(2))
        for m in re.finditer(r'<tr data-trial="(\w)"[^>]*>(.*?)</tr>', page)
    }
    assert rows["a"][2:5] == ["0.1", "0.3333", "0.43333333"], rows  # wd: as short as before, nothing needs more
    assert rows["b"][2:5] == ["0.10000001", "0.3333", "0.43333334"], rows
    assert rows["s"][2] == "&quot;0.1&quot;", rows  # the text "0.1" is no number 0.1
    assert rows["t"][2] == "&quot;a\\tb&quot;" and rows["u"][2] == "a b", rows  # a tab read as a space
    hovers = {t["meta"]: t["hovertemplate"] for t in _data(page)["sections"][0]["traces"]}
    assert "lr=0.1, " in hovers["a"] and "lr=0.10000001, " in hovers["b"], hovers
    grouped = Sweep(store, metrics_name="steps").report(tmp_path / "g.html", group_by="config/lr").read_text()
    assert ">0.10000001</td>" in grouped and ">0.1</td>" in grouped


def test_parallel_coordinates_keep_true_1_and_text_1_apart(tmp_path: Path) -> None:
    """A config key of ``True``, ``False`` and ``1`` (an int) across trials: the parallel coordinates drew the
    ``1`` as missing (pandas counts ``True`` and ``1`` as one value), and a key of only ``True`` and ``1`` did
    not vary at all. Each recorded value is its own category, its type named where two read alike; an int
    and a float of one value are one number."""
    from tests._stores import Trial, write_trials

    flags = {"t": True, "f": False, "one": 1, "text": "1", "two": 2, "two.0": 2.0}
    trials = [Trial(name, {"flag": flag}, _losses(i + 1.0)) for i, (name, flag) in enumerate(flags.items())]
    trials += [Trial(f"same-{flag!r}", {"same": flag}, _losses(5.0)) for flag in (True, 1)]
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    dims = {d["label"]: d for d in data["parcoords"]["dimensions"]}
    flag = dims["flag"]
    ticks = dict(zip(flag["tickvals"], flag["ticktext"], strict=True))
    picked = {t: ticks[code] for t, code in zip(data["status"], flag["values"], strict=True)}
    expected = {"t": "True", "f": "False", "one": "1 (number)", "text": "1 (str)", "same-True": "(none)"}
    # 2 and 2.0 are one value, as the tables, groups and diffs read them (they were two ticks, "2" and "2.0")
    assert picked == {**expected, "two": "2", "two.0": "2", "same-1": "(none)"}, flag
    assert "same" in dims  # True and 1 differ
    lists = [
        Trial(name, {"width": width}, _losses(i + 1.0)) for i, (name, width) in enumerate((("l", [32]), ("s", "[32]")))
    ]
    data = _data(Sweep(write_trials(tmp_path / "lists", lists)).report(tmp_path / "l.html").read_text())
    [width] = [d for d in data["parcoords"]["dimensions"] if d["label"] == "width"]
    assert sorted(width["ticktext"]) == ["[32] (JSON)", "[32] (str)"]  # not the class name JsonText


def test_parallel_coordinates_draw_a_missing_config_value_at_a_none_tick(tmp_path: Path) -> None:
    """A trial whose config lacks a key (a conditional search space: momentum for sgd only) or holds None was
    drawn at the axis's first category, or at 0, as if it held that value. It goes to a ``(none)`` tick below
    the values, on categorical and numeric axes alike."""
    from tests._stores import Trial, write_trials

    configs = {
        "a": {"opt": "sgd", "momentum": 0.9, "lr": 0.01},
        "b": {"opt": "sgd", "momentum": 0.5, "lr": 0.1},
        "c": {"opt": "adam", "lr": 1.0},
        "d": {"opt": None, "momentum": None, "lr": 0.001},
    }
    trials = [Trial(name, config, _losses(i + 1.0)) for i, (name, config) in enumerate(configs.items())]
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    dims = {d["label"]: d for d in data["parcoords"]["dimensions"]}
    trial_ids = list(data["status"])

    def drawn(dim: dict[str, Any]) -> dict[str, str]:
        ticks = dict(zip(dim["tickvals"], dim["ticktext"], strict=True))
        return {t: ticks.get(v, str(v)) for t, v in zip(trial_ids, dim["values"], strict=True)}

    assert drawn(dims["opt"]) == {"a": "sgd", "b": "sgd", "c": "adam", "d": "(none)"}
    momentum = drawn(dims["momentum"])
    assert (momentum["c"], momentum["d"]) == ("(none)", "(none)") and {momentum["a"], momentum["b"]} == {"0.9", "0.5"}
    ticks = zip(dims["momentum"]["tickvals"], dims["momentum"]["ticktext"], strict=True)
    low = min(v for v, text in ticks if text != "(none)")
    assert dims["momentum"]["values"][trial_ids.index("c")] < low <= 0.5  # below every value, not at one
    assert None not in dims["log10(lr)"]["values"] and "tickvals" not in dims["log10(lr)"]  # none missing: as before


def test_the_table_shows_a_count_by_its_final_value_only(tmp_path: Path) -> None:
    """The report's table had a ``loss_nonfinite_best`` of 0 beside a ``loss_nonfinite_final`` of 8: the
    "best" of a count is its first row's, which means nothing. A count (``<metric>_nonfinite``, an epoch)
    shows its final value only, as ``trials`` does."""
    from tests._stores import Trial, write_trials

    rows = [{"training_iteration": i + 1, "loss": 1.0 / (i + 1), "loss_nonfinite": 2 * i} for i in range(5)]
    page = Sweep(write_trials(tmp_path / "store", [Trial("a", {}, {"": rows})])).report(tmp_path / "r.html")
    head = re.findall(r"<th[^>]*>([^<]*)</th>", page.read_text().split('<table id="trials">')[1].split("</thead>")[0])
    assert "loss_nonfinite_final" in head and "loss_nonfinite_best" not in head and "loss_best" in head, head


def test_the_curves_caption_names_the_metrics_without_a_curve(tmp_path: Path) -> None:
    """A metric of bools or words has no curve and, as the README says, is named in the curves' caption: the
    live page (``serve``) named it, the report file did not."""
    from ray_cmf.report import content
    from tests._stores import Trial, write_trials

    def rows(lr: float) -> dict[str, list[dict[str, Any]]]:
        big = [2**60 + s if lr == 0.1 else 0.5 * s for s in range(4)]  # exact text: drawn as numbers
        return {
            "": [
                {"step": s, "loss": lr / (s + 1), "improved": s % 2 == 0, "phase": "warm", "big": big[s]}
                for s in range(4)
            ]
        }

    store = write_trials(tmp_path / "store", [Trial(f"lr{lr}", {"lr": lr}, rows(lr)) for lr in (0.1, 0.2)])
    sweep = Sweep(store)
    for live in (False, True):
        parts = content(sweep, live=live)
        note = parts["note"]
        assert "No curve for tune_results/improved, tune_results/phase: text or bools" in note, (live, note)
        assert [s["metric"] for s in parts["data"]["sections"]] == ["loss", "big"]
    assert "No curve for tune_results/improved, tune_results/phase" in sweep.report(tmp_path / "r.html").read_text()


def test_the_hover_names_only_a_trials_own_config_keys(tmp_path: Path) -> None:
    """A trial's hover read ``nested.c=None`` for a key only another trial's config has, the same as a config
    that sets it to None: it names only the trial's own keys now, a None as None."""
    from tests._stores import Trial, write_trials

    trials = [
        Trial("own", {"a": 1, "nested": {"c": None}, "lr": 0.5}, _losses(1.0)),
        Trial("other", {"a": 2, "lr": math.nan, "tag": ""}, _losses(2.0)),
    ]
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    hovers = {t["meta"]: t["hovertemplate"].split("<br>")[1] for t in data["sections"][0]["traces"]}
    assert hovers == {"own": "a=1, lr=0.5, nested.c=None", "other": 'a=2, lr=NaN, tag=""'}, hovers


def test_a_name_holding_a_hover_placeholder_is_shown_as_written(tmp_path: Path) -> None:
    """A trial named ``p%{y}q`` hovered as ``p0.125q``: plotly filled the ``%{y}`` of its name in the curve's
    hovertemplate (a new user). A ``%{`` of a name or value no longer reads as a placeholder."""
    from tests._stores import Trial, write_trials

    trials = [Trial("p%{y}q", {"opt": "%{x}"}, {"": [{"training_iteration": 1, "l%{y}": 0.125}]})]
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    [trace] = data["sections"][0]["traces"]
    placeholders = re.findall(r"%\{[^}]*\}", trace["hovertemplate"])
    assert placeholders == ["%{x}", "%{y:.5g}"], trace["hovertemplate"]  # the step and the value: plotly's own


def _losses(scale: float) -> dict[str, list[dict[str, Any]]]:
    return {"": [{"training_iteration": i + 1, "loss": scale / (i + 1)} for i in range(3)]}


def test_long_texts_and_markup_read_in_the_report_as_logged(tmp_path: Path, browser: Any) -> None:
    """Three trials' ``data`` paths, which differ after their 40th character, read alike in the table (cut
    with no mark), a value holding ``<img`` was cut inside its escape, plotly drew a metric ``a<b>&amp;c`` as
    a bold ``a&c`` and a config key ``<b>key</b>`` as a bold ``key``, and a hyperparameter over decades that
    holds a 0 was drawn on a linear axis unsaid (a new user)."""
    from tests._stores import Trial, write_trials

    root = "/mnt/datasets/imagenet/2012/train_shards_version_"
    trials = [
        Trial(
            f"t{i}",
            {"data": root + version, "<b>key</b>": i, "wd": wd, "html": "<img src=x onerror=alert('cfg')>"},
            {"": [{"training_iteration": s, "a<b>&amp;c": float(i + s)} for s in range(1, 4)]},
        )
        for i, (version, wd) in enumerate(zip("ABCD", [1e-5, 1e-3, 0.0, 10.0], strict=True))
    ]
    path = Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html")
    page, _, errors = open_report(browser, path.as_uri(), offline=True)
    cells = page.locator("#trials td").evaluate_all("cells => cells.map(c => [c.textContent, c.title])")
    paths = [(text, title) for text, title in cells if title.startswith(root)]
    assert sorted(title for _, title in paths) == [root + v for v in "ABCD"]
    assert len({text for text, _ in paths}) == 4 and all("…" in text and len(text) == 40 for text, _ in paths)
    assert [text for text, _ in cells if "img" in text] == ["<img src=x onerror=alert('cfg')>"] * 4  # all of it
    assert page.locator("#curve-0 .gtitle").text_content() == "a<b>&amp;c · tune_results"
    labels = page.locator("#parcoords .axis-title").all_text_contents()
    assert "<b>key</b>" in labels and "best a<b>&amp;c" in labels, labels
    titles = page.locator("#params .xtitle").all_text_contents()
    assert "wd (linear: it holds values <= 0)" in titles and "<b>key</b>" in titles, titles
    assert errors == []


def test_a_clean_sweep_reads_as_a_dashboard_in_chromium(tmp_path: Path, browser: Any) -> None:
    """Three runs that all finish: the table best first, every run's curve, and a picked run's row and curve."""
    store = tmp_path / "store"
    cmf = Cmf(pipeline_name="clean", store=store)
    for lr in (0.1, 0.01, 0.001):
        cmf.create_execution("train", {"lr": lr, "width": int(1 / lr)}, execution_name=f"lr{lr}")
        for step in range(30):
            cmf.log_metric("steps", {"step": step, "loss": lr * 10 / (step + 1), "epoch": step // 10})
        cmf.commit_metrics("steps")
    cmf.close()
    path = Sweep(store, metrics_name="steps").report(tmp_path / "clean.html")
    page, _, errors = open_report(browser, path.as_uri(), offline=True)
    order = [row.get_attribute("data-trial") for row in page.locator("#trials tbody tr").all()]
    assert order == ["lr0.001", "lr0.01", "lr0.1"]  # the best loss first
    assert page.locator(".plot .gtitle").all_text_contents()[0] == "loss · steps"  # epoch is an axis, not a curve
    assert page.locator("#curve-0 .scatterlayer .trace").count() == 3
    assert page.locator("#importance.js-plotly-plot").count() == 1  # two hyperparameters: their importance
    page.locator("#trials tbody tr").nth(1).click()
    assert "picked" in (page.locator("#trials tbody tr").nth(1).get_attribute("class") or "")
    screenshot(page, "report-clean-sweep.png")
    assert errors == []


@given(st.lists(floats, max_size=60))
@example([0.5 + i / 20 for i in range(30)] + [3e38, math.inf, math.nan])  # an inf right after a far-off value
def test_a_plots_span_shows_its_bulk_and_marks_the_rest_on_the_right_side(values: list[float]) -> None:
    """Whatever a sweep logged: the axis span is finite and drawable, the values between the 5% and 95%
    quantiles are always on the plot, and each value off it is marked on its side, every run of them seen:
    a run of one kind (NaN, inf, -inf, or finite values beyond one side), so an inf that follows far-off finite
    values is marked too (it was not)."""
    y = np.array(values, dtype=float)
    span = Span.of(y)
    assert math.isfinite(span.low) and span.low <= span.high and abs(span.low) <= 1e300 >= abs(span.high)
    shown = y[drawable(y)]
    if shown.size:
        low, high = np.quantile(shown, (0.05, 0.95))
        assert span.holds(shown[(shown >= low) & (shown <= high)]).all()
    marks = span.marks(y, 200)
    off = np.flatnonzero(~span.holds(y))
    assert set(marks) <= set(off) and (not len(off) or off[-1] in marks)
    edges, previous = span.edges(), None
    for i in off:
        side = span.side(float(y[i]))
        assert side == ("NaN" if math.isnan(y[i]) else "Infinity" if y[i] > span.high else "-Infinity")
        assert not span.holds(np.array([edges[side]])).any()  # the mark sits outside what is drawn
        kind = (side, bool(np.isinf(y[i])))
        if previous != (i - 1, kind):
            assert i in marks  # where a run of one kind starts
        previous = (i, kind)


def _diverged_sweep(store: Path) -> Any:
    """Two trials that learn and one that diverges in float32: its loss climbs to 3e38, then inf."""
    from tests._stores import Trial, write_trials

    def losses(values: list[float]) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    curves = {"a": 0.1, "b": 0.2}
    learning = [Trial(t, {"lr": lr}, losses([2.3 / (1 + lr * s) for s in range(50)])) for t, lr in curves.items()]
    diverged = Trial("d", {"lr": 9.0}, losses([1.0, 10.0, 1e5, 1e20, 3e38, math.inf, math.inf]))
    return Sweep(write_trials(store, [*learning, diverged]))


def test_a_diverged_trial_leaves_the_other_curves_readable(tmp_path: Path) -> None:
    """A trial whose float32 loss climbed to 3e38 stretched the axis so far that every other curve was a flat
    line at 0. Values far outside the bulk of the sweep's values are now marked at the plot's edge, each with
    its value on hover, and the axis spans the rest: the learning curves are whole and readable."""
    data = _data(_diverged_sweep(tmp_path / "store").report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    lines = {t["meta"]: t["y"] for t in section["traces"] if not t["name"].endswith("(off the plot)")}
    assert len(lines["a"]) == len(lines["b"]) == 50  # every point of the learning curves drawn
    assert lines["d"] == [1.0, 10.0]  # the diverged trial up to where it left the plot
    marked = {t["meta"]: (t["text"], t["y"]) for t in section["traces"] if t["name"].endswith("(off the plot)")}
    texts, ys = marked["d"]
    assert texts == [1e5, 1e20, 3e38, "Infinity", "Infinity"]  # each value off the plot: its peak on hover too
    assert min(ys) > 10.0 and max(ys) < 20.0  # at the edge, just above the highest value drawn


def test_a_curve_breaks_where_its_values_leave_the_plot_and_goes_on_where_they_return(tmp_path: Path) -> None:
    """A loss that went NaN, inf and -inf for a few steps, then finite again: the report joined the last point
    before them to the first after with a straight line, as if those steps had held values in between
    (``ray-cmf plot`` broke it; found by a new user). The line now breaks there, as it does at a trial's steps
    without the metric, and the points off the plot are marked."""
    from tests._stores import Trial, write_trials

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [Trial("ok", {"lr": 0.1}, losses(1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2))]
    trials.append(Trial("gap", {"lr": 1.0}, losses(1.0, 2.0, math.nan, math.inf, -math.inf, 1.5, 1.7)))
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    [line] = [t for t in section["traces"] if t["meta"] == "gap" and not t["name"].endswith("(off the plot)")]
    assert (line["x"], line["y"]) == ([1.0, 2.0, None, 6.0, 7.0], [1.0, 2.0, None, 1.5, 1.7])
    [ok] = [t for t in section["traces"] if t["meta"] == "ok" and not t["name"].endswith("(off the plot)")]
    assert None not in ok["y"] and len(ok["y"]) == 7
    [marked] = [t for t in section["traces"] if t["meta"] == "gap" and t["name"].endswith("(off the plot)")]
    assert (marked["x"], marked["text"]) == ([3.0, 4.0, 5.0], ["NaN", "Infinity", "-Infinity"])
    assert line["mode"] == ok["mode"] == "lines" and not any(line["marker"]["size"])  # no point alone: no dots


def test_a_point_alone_between_two_breaks_is_drawn_as_a_dot(tmp_path: Path) -> None:
    """A finite value between two NaN runs is a line of one point, which plotly does not draw: the report
    showed nothing there, as if the step held no value. Such a point is a dot; the others stay a line."""
    from tests._stores import Trial, write_trials

    losses = [1.0, 1.1, math.nan, 1.2, math.nan, 1.3, 1.4]
    rows = [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(losses)]
    data = _data(
        Sweep(write_trials(tmp_path / "store", [Trial("t", {"lr": 1.0}, {"": rows})]))
        .report(tmp_path / "r.html")
        .read_text()
    )
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    [line] = [t for t in section["traces"] if not t["name"].endswith("(off the plot)")]
    assert line["y"] == [1.0, 1.1, None, 1.2, None, 1.3, 1.4] and line["mode"] == "lines+markers"
    sizes = line["marker"]["size"]
    assert [size > 0 for size in sizes] == [False, False, False, True, False, False, False]


def test_a_thinned_curve_is_drawn_up_to_its_break_on_both_sides(tmp_path: Path) -> None:
    """1 000 steps, NaN at 400-419, thinned to 50 points: the line broke at the NaN run, but the points kept on
    either side were the buckets' extremes, 393 and 449, so the finite values of 394-399 and 420-448 were never
    drawn and the gap looked three times as wide as the run (found by a new user). The last point before a
    break and the first after it are now always drawn."""
    from tests._stores import Trial, write_trials

    values = [1.0 + 0.001 * ((s * 7919) % 101) for s in range(1, 1001)]
    values[399:419] = [math.nan] * 20  # steps 400-419
    trial = Trial("gap", {"lr": 1.0}, {"": [{"training_iteration": s, "loss": v} for s, v in enumerate(values, 1)]})
    sweep = Sweep(write_trials(tmp_path / "store", [trial]))
    data = _data(sweep.report(tmp_path / "r.html", max_points=50).read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    [line] = [t for t in section["traces"] if not t["name"].endswith("(off the plot)")]
    at = line["x"].index(None)
    assert line["x"][at - 1 : at + 2] == [399.0, None, 420.0]
    assert line["y"][at - 1] == values[398] and line["y"][at + 1] == values[419]
    assert len(line["x"]) <= 50 + 3  # the budget, the two points beside the break and the break itself


def test_a_slowly_diverging_trial_leaves_the_other_curves_readable(tmp_path: Path) -> None:
    """A trial whose loss climbed over 40 steps (1 to 1e40, a third of the sweep's points) held more than the 5%
    of all values the axis left out, so the axis still ran to 1e40 and the three learning curves were flat at
    0, in the report and in ``plot``. The axis now fits the bulk of most curves: the learning curves are whole,
    the climb is drawn while it is near them and marked beyond."""
    from tests._stores import Trial, write_trials

    def losses(values: list[float]) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    learning = [Trial(f"t{lr}", {"lr": lr}, losses([2.3 / (1 + lr * s) for s in range(25)])) for lr in (0.1, 0.2, 0.3)]
    climbing = Trial("up", {"lr": 9.0}, losses([10.0**k for k in range(40)]))
    sweep = Sweep(write_trials(tmp_path / "store", [*learning, climbing]))
    data = _data(sweep.report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    lines = {t["meta"]: t["y"] for t in section["traces"] if not t["name"].endswith("(off the plot)")}
    assert all(len(lines[f"t{lr}"]) == 25 for lr in (0.1, 0.2, 0.3)), lines
    assert lines["up"] == [1.0, 10.0], lines["up"]  # near the others' values: drawn; beyond: marked
    marked = {t["meta"]: t["text"] for t in section["traces"] if t["name"].endswith("(off the plot)")}
    assert marked["up"][0] == 100.0 and marked["up"][-1] == 1e39
    steps = sweep.steps(["loss"], exact=True)
    span = Span.of(floats_of(steps["loss"]), curves=[floats_of(f["loss"]) for _, f in steps.groupby("trial_id")])
    assert span.high < 100.0 and span.holds(np.array([2.3, 10.0])).all()


def test_a_trial_of_several_series_beside_one_of_one(tmp_path: Path) -> None:
    """One execution holds two series of a name (two Cmf objects of it; a restored trial's kept samples) and
    another holds one: the report raised ``'float' object has no attribute 'isdigit'`` (a new user's, after
    most restores), since the second execution's series column is missing, which pandas keeps as NaN."""
    store = tmp_path / "store"
    loggers = [Cmf(pipeline_name="rep", store=store) for _ in range(3)]
    for cmf, name in zip(loggers, ("run1", "run1", "run2"), strict=True):
        cmf.create_execution("Train", {"lr": 0.1}, execution_name=name)
    for step in range(5):
        for i, cmf in enumerate(loggers):
            cmf.log_metric("m", {"step": step, "loss": (i + 1.0) / (step + 1)})
    for cmf in loggers:
        cmf.commit_metrics("m")
        cmf.close()
    data = _data(Sweep(store, metrics_name="m").report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    curves = sorted((t["meta"], t["name"]) for t in section["traces"])
    assert [meta for meta, _ in curves] == ["run1", "run1", "run2"] and curves[2][1] == "run2", curves
    assert curves[0][1] != curves[1][1] and all(name.startswith("run1 (") for _, name in curves[:2]), curves


def test_a_diverged_group_leaves_the_other_groups_curves_readable(tmp_path: Path) -> None:
    """Grouped, a group whose trials climbed to 1e240 drew its mean, and its band, up there: the axis ran to
    1e240 and every other group's mean was a flat line at 0 (a new user's). The groups' curves now take the
    span the trial curves take: the others are drawn whole, the climb is marked at the edge beyond it."""
    from tests._stores import Trial, write_trials

    def losses(values: list[float]) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    learning = [
        Trial(f"{kind}{seed}", {"kind": kind, "seed": seed}, losses([scale / (1 + s + seed) for s in range(6)]))
        for kind, scale in (("a", 1.0), ("b", 1.5))
        for seed in (0, 1)
    ]
    climbing = [Trial(f"up{seed}", {"kind": "up", "seed": seed}, losses([1.0, 10.0**80, 10.0**240])) for seed in (0, 1)]
    sweep = Sweep(write_trials(tmp_path / "store", [*learning, *climbing]))
    data = _data(sweep.report(tmp_path / "g.html", group_by="config/kind").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    drawn = [y for t in section["traces"] if "(off the plot)" not in t.get("name", "") for y in t["y"] if y is not None]
    assert max(drawn) < 10.0, max(drawn)  # every band and mean within the learning groups' reach
    means = {t["name"]: t["y"] for t in section["traces"] if "name" in t and "(off the plot)" not in t["name"]}
    assert len(means["kind=a"]) == 6 and len(means["kind=b"]) == 6, means
    marked = {t["meta"]: t["text"] for t in section["traces"] if t.get("name", "").endswith("(off the plot)")}
    assert marked["kind=up"] == [1e80, 1e240], marked


def test_a_group_mean_breaks_where_it_left_the_plot(tmp_path: Path) -> None:
    """A group whose mean climbed off the plot for a while, then came back: its mean line and its bands were
    drawn straight across the climb, a smooth decline through values of 1e80 and more (a new user's); broken
    with a gap, the bands were still filled across it (plotly fills "tonexty" over gaps). They break there, as
    a trial's curve does, and the climb is marked."""
    from tests._stores import Trial, write_trials

    def losses(values: list[float]) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    steady = [
        Trial(f"{kind}{seed}", {"kind": kind, "seed": seed}, losses([scale * v for v in (1.0, 0.8, 0.6, 0.5, 0.4)]))
        for kind, scale in (("a", 1.0), ("b", 1.2), ("c", 1.5))
        for seed in (0, 1)
    ]
    back = [Trial(f"up{seed}", {"kind": "up", "seed": seed}, losses([2.0, 1e80, 1e240, 0.5, 0.3])) for seed in (0, 1)]
    sweep = Sweep(write_trials(tmp_path / "store", [*steady, *back]))
    data = _data(sweep.report(tmp_path / "g.html", group_by="config/kind").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    up = [t for t in section["traces"] if t.get("meta") == "kind=up" and "(off the plot)" not in t.get("name", "")]
    [mean] = [t for t in up if t.get("name") == "kind=up"]
    assert mean["x"] == [1, None, 4, 5] and mean["y"] == [2.0, None, 0.5, 0.3], mean
    bands = [(t["x"], t["fill"]) for t in up if t.get("legendgroup") == "band-minmax"]
    assert bands == [([1], "none"), ([1], "tonexty"), ([4, 5], "none"), ([4, 5], "tonexty")], bands  # no fill across
    [marked] = [t for t in section["traces"] if t.get("name") == "kind=up (off the plot)"]
    assert marked["x"] == [2, 3]
    steady_mean = next(t for t in section["traces"] if t.get("name") == "kind=a")
    assert None not in steady_mean["x"]


def test_flat_curves_at_different_levels_are_all_drawn(tmp_path: Path) -> None:
    """Five trials whose memory stays flat at 1000 to 1400 MB: the axis fitted the median curve's 0.04 MB
    of width, and four healthy trials were marked "off the plot", as if they had diverged, in the report and
    in ``plot`` (found by a new user). How far apart the curves lie counts as the bulk's width too."""
    from tests._stores import Trial, write_trials

    levels = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0]
    trials = [
        Trial(f"t{i}", {"i": i}, {"": [{"training_iteration": s + 1, "mem_mb": v + 0.01 * s} for s in range(5)]})
        for i, v in enumerate(levels)
    ]
    sweep = Sweep(write_trials(tmp_path / "store", trials))
    data = _data(sweep.report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "mem_mb"]
    assert not [t for t in section["traces"] if t["name"].endswith("(off the plot)")]
    lines = {t["meta"]: t["y"] for t in section["traces"]}
    assert all(len(lines[f"t{i}"]) == 5 for i in range(5))


@given(st.lists(st.lists(floats, max_size=30), min_size=1, max_size=6))
@example([[0.5 + i / 20 for i in range(20)], [0.4 + i / 30 for i in range(20)], [10.0**k for k in range(30)]])
@example([[-10.0, 5.0], [10.0**k for k in range(30)]])  # a wide curve and a climb: the wide one, whole
def test_a_plots_span_holds_the_bulk_of_most_curves(curves: list[list[float]]) -> None:
    """However many curves diverge, the axis is finite and drawable and holds the 5%-95% bulk of a curve at
    least, and of two curves of three that are alike; with one curve it is that curve's own span."""
    arrays = [np.array(c, dtype=float) for c in curves]
    pooled = np.concatenate(arrays)
    span = Span.of(pooled, curves=arrays)
    assert math.isfinite(span.low) and span.low <= span.high and abs(span.low) <= 1e300 >= abs(span.high)
    drawn = [a[drawable(a)] for a in arrays if drawable(a).any()]
    if len(drawn) == 1:
        assert span == Span.of(pooled)
    bulks = [np.quantile(a, (0.05, 0.95)) for a in drawn]
    held = [span.holds(a[(a >= low) & (a <= high)]).all() for a, (low, high) in zip(drawn, bulks, strict=True)]
    assert not drawn or any(held)
    twice = Span.of(np.concatenate([pooled, arrays[0]]), curves=[*arrays, arrays[0]])  # the first curve, twice
    if len(drawn) == 2 and drawable(arrays[0]).any():
        shown = arrays[0][drawable(arrays[0])]
        low, high = np.quantile(shown, (0.05, 0.95))
        assert twice.holds(shown[(shown >= low) & (shown <= high)]).all()


def test_values_beyond_what_a_plot_can_draw_are_marked_at_its_edge(tmp_path: Path) -> None:
    """A diverged trial's finite 1e308 is beyond what plotly draws (its axis arithmetic overflows): it was
    left out without a mark. It is now marked at the plot's edge like inf, with its value on hover."""
    from tests._stores import Trial, write_trials

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [Trial("ok", {"lr": 0.1}, losses(0.5, 0.4)), Trial("up", {"lr": 1.0}, losses(1.0, 1e308))]
    trials.append(Trial("down", {"lr": 10.0}, losses(1.0, -1e308)))
    data = _data(Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text())
    [section] = [s for s in data["sections"] if s["metric"] == "loss"]
    drawn = [y for t in section["traces"] for y in t["y"]]
    assert all(isinstance(y, float) and abs(y) < 1e301 for y in drawn)
    marked = {t["meta"]: t["text"] for t in section["traces"] if t["name"].endswith("(off the plot)")}
    assert marked == {"up": [1e308], "down": [-1e308]}
    assert data["notes"]["parcoords"] == "1 trial(s) without a finite best loss are left out."  # down's -1e308


def test_config_that_varies_is_never_said_not_to_when_trials_are_left_out(tmp_path: Path) -> None:
    """With at most one trial left that has a finite best (a NaN-only and a diverged trial beside one that
    trained), the page said "No config key varies across trials." and "No numeric hyperparameter varies.":
    the lr and optimizer it listed do vary. It now says why nothing is drawn."""
    from tests._stores import Trial, write_trials

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [
        Trial("ok", {"lr": 0.1, "opt": "adam"}, losses(0.5, 0.4)),
        Trial("nan", {"lr": 0.2, "opt": "sgd"}, losses(math.nan, math.nan)),
        Trial("div", {"lr": 0.3, "opt": "sgd"}, losses(math.inf, math.nan)),
    ]
    store = write_trials(tmp_path / "store", trials)
    data = _data(Sweep(store).report(tmp_path / "r.html").read_text())
    assert data["parcoords"] is None and data["params"] == []
    assert data["notes"]["parcoords"] == "2 of 3 trials have no finite best loss: fewer than two are left to draw."
    assert data["notes"]["params"] == "Fewer than two trials have a finite best loss: no importance to measure."
    same = write_trials(tmp_path / "same", [Trial(t.trial_id, {"lr": 0.1}, t.series) for t in trials])
    data = _data(Sweep(same).report(tmp_path / "s.html").read_text())
    assert data["notes"]["parcoords"] == "No config key varies across trials."
    assert data["notes"]["params"] == "No numeric hyperparameter varies."
    more = write_trials(tmp_path / "more", [*trials, Trial("ok2", {"lr": 0.5, "opt": "adam"}, losses(0.3, 0.2))])
    data = _data(Sweep(more).report(tmp_path / "m.html").read_text())
    assert data["parcoords"] is not None and len(data["params"]) == 1
    assert data["notes"]["parcoords"] == "2 trial(s) without a finite best loss are left out."


def test_a_series_whose_values_read_as_text_is_drawn_or_named(tmp_path: Path) -> None:
    """A ``get_cmf()`` series whose metric is an int beyond 2**53 in one trial and a float in another reads
    as exact text: the report left it out without a word, even with ``series`` naming it. Numbers held as
    text are now drawn (a plot needs no 19 digits), and a metric of words is named in the caption."""
    from tests._stores import Trial, write_trials

    def rows(*xs: Any) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"step": i, "x": x, "phase": "warmup" if i == 0 else "main"} for i, x in enumerate(xs)]}

    store = tmp_path / "store"
    tune = [{"training_iteration": 1, "loss": 0.5}]
    write_trials(store, [Trial("a", {"lr": 0.1}, {"": tune}), Trial("b", {"lr": 0.2}, {"": tune})])
    mine = [Trial("a", {}, rows(2**60, 2**60 + 2)), Trial("b", {}, rows(0.5, math.nan))]
    write_trials(store, mine, metrics_name="mine")
    for options in ({}, {"series": ["mine"]}, {"live": True}):
        page = build(Sweep(store), **options)  # live: the page `ray-cmf serve` sends
        data = _data(page)
        [section] = [s for s in data["sections"] if s["series"] == "mine"]
        assert section["metric"] == "x"
        lines = {t["meta"]: t["y"] for t in section["traces"] if not t["name"].endswith("(off the plot)")}
        assert lines["a"] == [float(2**60), float(2**60 + 2)] and lines["b"][0] == 0.5, options
        note = re.search(r'id="curves-note">([^<]*)<', page).group(1)  # type: ignore[union-attr]
        assert "mine/phase" in note and "text" in note, note


def test_the_report_ranks_by_the_metric_the_sweep_ranks_by(tmp_path: Path) -> None:
    """``CmfRayLogger(metric="val", mode="min")`` over trials that report ``aux`` first: ``trials``, ``compare``
    and ``ranked_metric()`` rank by val, and the report (and ``serve``) ranked by aux, the first metric
    reported: its table put the worst trial by val first, and its plots coloured the trials by aux (a new
    user's). It ranks by val, shown first, unless ``metrics`` names others."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY
    from tests._stores import Trial, write_trials

    ranked = {RANKED_BY_PROPERTY: "val", RANKED_MODE_PROPERTY: "min"}
    trials = [
        Trial(f"t{x}", {"x": x}, {"": [{"training_iteration": 1, "aux": x, "val": -x}]}, props=ranked)
        for x in (1.0, 2.0, 3.0)
    ]
    store = write_trials(tmp_path / "store", trials)
    sweep = Sweep(store.root)
    assert sweep.ranked_metric() == "val"
    page = sweep.report(tmp_path / "r.html").read_text()
    data = _data(page)
    assert data["primary"] == "val" and data["mode"] == "min", (data["primary"], data["mode"])
    assert re.findall(r'<tr data-trial="([^"]+)"', page) == ["t3.0", "t2.0", "t1.0"]
    assert [s["title"] for s in data["sections"]] == ["val · tune_results", "aux · tune_results"]
    assert data["parcoords"]["dimensions"][-1]["label"] == "best val"
    asked = _data(sweep.report(tmp_path / "aux.html", metrics=["aux"]).read_text())
    assert asked["primary"] == "aux"


def test_a_report_of_no_trial_yet_is_a_page_not_a_key_error(tmp_path: Path) -> None:
    """A pipeline whose trials have not started (what ``ray-cmf serve`` follows as a sweep begins), or
    ``sweep.only([])``, crashed the report with ``KeyError: "['md5'] not in index"`` (found by a new user)."""
    cmf = Cmf(pipeline_name="sweep", store=tmp_path / "empty")
    cmf.close()
    page = Sweep(tmp_path / "empty").report(tmp_path / "empty.html").read_text()
    assert '<table id="trials">' in page and "<th>trial_id</th>" in page
    cmf = Cmf(pipeline_name="sweep", store=tmp_path / "store")
    cmf.create_execution("Train", {"lr": 0.1})
    cmf.log_metric("tune_results", {"training_iteration": 1, "loss": 0.5})
    cmf.close()
    page = Sweep(tmp_path / "store").only([]).report(tmp_path / "none.html").read_text()
    assert "<tbody></tbody>" in page


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
@example([5e-324, -0.0, 0.0])  # a diverged series whose finite values are all (about) zero
@example([3.0])
@example([1e-20, 1e-20 * (1 + 1e-15)])
def test_a_plots_marks_sit_beyond_the_values_however_close_together_they_are(values: list[float]) -> None:
    """A series of inf, -inf and NaN beside finite values of about zero (5e-324 and -0.0): the marks sat 1e-300
    above and below them, while the axis, which no plot can make narrower than its values' magnitude allows,
    showed -0.05 to 0.05, so inf and -inf were drawn on the line at 0, like values (a new user). The marks
    now sit beyond where a plot shows the values (matplotlib's limits for them), and the plot's limits hold
    the marks."""
    from matplotlib.transforms import nonsingular

    from ray_cmf.plots import _limits

    y = np.array(values, dtype=float)
    span = Span.of(y)
    shown_low, shown_high = nonsingular(span.low, span.high)
    edges = span.edges()
    assert edges["Infinity"] >= shown_high and edges["-Infinity"] <= shown_low, (span, edges)
    low, high = _limits(span)
    assert low < edges["-Infinity"] and edges["Infinity"] < high
