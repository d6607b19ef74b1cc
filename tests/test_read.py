"""The read side (Sweep, the CLI, the report) on stores built through the real writer: what a user reads back
is exactly what was logged, whatever the data (several series per trial, non-finite values, odd configs)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ray_cmf import MetricsNotFoundError, Sweep
from ray_cmf.cli import main
from tests._stores import Trial, write_trials


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """Run ``ray-cmf ... --json``; the exit code and the output parsed by a strict JSON parser."""
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out, parse_constant=_refuse) if out.strip() else None


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _ranks(rows: int) -> dict[str, list[dict[str, Any]]]:
    return {
        f"rank{r}": [{"step": s, "rank": r, "cpu": float(10 * r + s)} for s in range(1, rows + 1)] for r in range(2)
    }


def test_every_rank_of_a_run_is_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Train run's per-rank series (one name, two instances) are all readable, told apart by rank."""
    store = write_trials(tmp_path / "store", [Trial("run", {"lr": 0.1}, _ranks(4))], metrics_name="system_metrics")
    sweep = Sweep(store, metrics_name="system_metrics")
    steps = sweep.steps(["cpu"])
    assert sorted(zip(steps["rank"], steps["step"], steps["cpu"], strict=True)) == [
        (r, s, float(10 * r + s)) for r in range(2) for s in range(1, 5)
    ]
    [row] = sweep.trials(["cpu"]).to_dict(orient="records")
    assert row["steps"] == 8 and row["cpu_best"] == 1.0 and row["cpu_final"] == 14.0
    code, exported = _cli(
        capsys,
        "export",
        "--store",
        str(store.root),
        "--metrics-name",
        "system_metrics",
        "--format",
        "csv",
        "-o",
        str(tmp_path / "s.csv"),
    )
    assert code == 0 and exported[0]["rows"] == 8
    page = (sweep.report(tmp_path / "r.html", metrics=["cpu"])).read_text()
    assert "run (rank0)" in page and "run (rank1)" in page


def test_a_diverged_trial_is_shown_never_best_and_written_as_strict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial whose loss becomes inf (and one that becomes NaN, and one with -inf) beside a healthy one."""

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [
        Trial("good", {"lr": 0.1}, losses(0.7, 0.5, 0.25)),
        Trial("inf", {"lr": math.inf}, losses(1.0, math.inf, math.inf)),
        Trial("nan", {"lr": 10.0}, losses(0.9, math.nan)),
        Trial("neg", {"lr": -math.inf}, losses(0.8, -math.inf)),
    ]
    store = write_trials(tmp_path / "store", trials)
    sweep = Sweep(store)
    table = sweep.trials(["loss"]).set_index("trial_id")
    assert table.loc["good", "loss_best"] == 0.25 and table.loc["inf", "loss_best"] == 1.0
    assert table.loc["neg", "loss_best"] == 0.8  # -inf is a divergence, not the best loss
    assert table.loc["inf", "loss_final"] == math.inf and math.isnan(table.loc["nan", "loss_final"])
    assert sweep.best("loss", "min", n=4)["trial_id"].tolist()[0] == "good"
    assert sweep.best("loss", "max", n=1)["trial_id"].tolist() == ["inf"]  # its best finite value, 1.0
    steps = sweep.steps(["loss"])
    assert steps.loc[steps["trial_id"] == "inf", "loss"].tolist() == [1.0, math.inf, math.inf]
    for command in (
        ["trials"],
        ["compare", "--metric", "loss", "--top", "4"],
        ["show", "inf"],
        ["diff", "good", "inf"],
    ):
        code, out = _cli(capsys, *command, "--store", str(store.root))
        assert code == 0 and out
    code, shown = _cli(capsys, "show", "inf", "--store", str(store.root))
    assert [r["loss"] for r in shown["last_rows"]] == [1.0, "Infinity", "Infinity"]
    assert shown["config"]["lr"] == "Infinity"
    page = sweep.report(tmp_path / "r.html").read_text()
    assert 'id="trials"' in page and page.count("<tr>") >= 5
    assert main(["report", "--store", str(store.root), "-o", str(tmp_path / "cli.html")]) == 0
    plotted = sweep.plot_curves("loss", tmp_path / "c.png", color_by="lr")
    assert plotted.stat().st_size > 0 and sweep.plot_params("loss", tmp_path / "p.png").stat().st_size > 0


def test_a_series_name_that_matches_nothing_is_an_error_that_lists_what_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {"": [{"step": 1, "loss": 1.0}]}
    store = write_trials(tmp_path / "store", [Trial("a", {}, rows)], metrics_name="steps")
    with pytest.raises(MetricsNotFoundError, match=r"No series 'step' .*\['steps'\]"):
        Sweep(store, metrics_name="step")
    assert main(["trials", "--store", str(store.root), "--metrics-name", "step"]) == 2  # was: 0, every trial 0 steps
    assert "['steps']" in capsys.readouterr().err


def test_the_cli_shows_a_bug_as_a_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 is for what the user typed; an internal error keeps its traceback (the console script exits 1)."""
    store = write_trials(tmp_path / "store", [Trial("a", {}, {"": [{"step": 1, "loss": 1.0}]})])
    assert main(["trials", "--store", str(store.root), "--mode", "max", "--metric", "nope"]) == 2
    assert "Unknown metric" in capsys.readouterr().err

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("an internal bug")

    monkeypatch.setattr(Sweep, "trials", broken)
    with pytest.raises(KeyError, match="an internal bug"):
        main(["trials", "--store", str(store.root)])
