"""The read side (Sweep, the CLI, the report) on stores built through the real writer: what a user reads back
is exactly what was logged, whatever the data (several series per trial, non-finite values, odd configs)."""

from __future__ import annotations

import html
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_cmf import Cmf, InvalidArgumentError, MetricsNotFoundError, RayCmfError, Sweep
from ray_cmf._json import JsonText
from ray_cmf.cli import main, parse
from tests._stores import Trial, write_trials
from tests._values import INT64_MAX, INT64_MIN, column_of, floats, same


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
    [row] = sweep.trials(["cpu"]).to_dict(orient="records")  # summarised as Ray Train reads a run: rank 0's
    assert row["steps"] == 4 and row["cpu_best"] == 1.0 and row["cpu_final"] == 4.0
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


def test_an_exported_parquet_of_several_series_reads_back_in_pandas(tmp_path: Path) -> None:
    """``export -o x.parquet`` of a trial with two series (an execution reopened by name) wrote its ``series``
    column as an Arrow dictionary, whose pandas type pandas cannot read back: ``pd.read_parquet`` raised
    "data type 'dictionary<values=string, indices=int32, ordered=0>[pyarrow]' not understood" (a new user)."""
    series = {"aa11": [{"step": 1, "v": 1.5}, {"step": 2, "v": None}], "bb22": [{"step": 3, "v": -0.0}]}
    alone = {"": [{"step": 1, "v": 2.0}]}  # a trial of one series: its rows' series is null
    store = write_trials(tmp_path / "store", [Trial("t", {"lr": 0.1}, series), Trial("u", {"lr": 0.2}, alone)])
    out = tmp_path / "s.parquet"
    assert main(["export", "--store", str(store.root), "-o", str(out)]) == 0
    exported = pd.read_parquet(out)
    expected = Sweep(store).steps(exact=True)
    assert exported["series"].astype(object).tolist() == expected["series"].astype(object).tolist()
    assert [repr(v) for v in exported["v"].astype(object)] == [repr(v) for v in expected["v"].astype(object)]
    assert pa.types.is_dictionary(pq.read_table(out).column("series").type)  # pandas' category, as trial_id


@pytest.mark.filterwarnings("error::RuntimeWarning")  # log10 of its -inf config warned at the user
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
    with pytest.raises(MetricsNotFoundError, match=r"No series 'step' .*; did you mean 'steps'\?"):
        Sweep(store, metrics_name="step")
    assert main(["trials", "--store", str(store.root), "--metrics-name", "step"]) == 2  # was: 0, every trial 0 steps
    assert "did you mean 'steps'?" in capsys.readouterr().err
    with pytest.raises(MetricsNotFoundError, match=r"No series 'loss_curve' .*; it has \['steps'\]"):
        Sweep(store, metrics_name="loss_curve")  # nothing near: what exists


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


# -- generated stores ------------------------------------------------------------------------------------
TRIAL_IDS = ("t-0", "trial ü", "試行", "<b>&amp;", "t 4")
METRICS = ("loss", "ácc", "指标")
config_values = st.one_of(
    st.integers(-(2**40), 2**40), floats, st.booleans(), st.none(), st.text(max_size=6), st.just({"deep": 1})
)
metric_values = st.one_of(floats, st.none(), st.integers(-5, 5))
execution_values = st.one_of(floats, st.none(), st.integers(-(2**70), 2**70), st.booleans(), st.text(max_size=4))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@st.composite
def sweeps(draw: st.DrawFn) -> list[Trial]:
    """1-5 trials: ragged metrics (one only a single trial has), configs of mixed types, empty series,
    non-finite values, failed and running trials, unicode and HTML-looking ids."""
    count = draw(st.integers(1, 5))
    trials = []
    for index, trial_id in enumerate(TRIAL_IDS[:count]):
        names = draw(st.lists(st.sampled_from(METRICS), unique=True, max_size=3))
        if index == 0:
            names.append("only_once")
        length = draw(st.integers(0, 6))
        phase = draw(st.sampled_from([st.integers(0, 3), st.text(max_size=4), st.booleans()]))  # a kind per trial
        rows = [
            {"training_iteration": step + 1, "phase": draw(phase), **{m: draw(metric_values) for m in names}}
            for step in range(length)
        ]
        config = draw(st.dictionaries(st.sampled_from(["lr", "größe", "opt"]), config_values, max_size=3))
        status = draw(st.sampled_from(["COMPLETE", "COMPLETE", "FAILED", "RUNNING"]))
        ranks = draw(st.sampled_from([1, 1, 2]))  # a Train run's per-rank series, one name
        series = {"": rows} if ranks == 1 else {f"rank{r}": [{**row, "rank": r} for row in rows] for r in range(2)}
        final = draw(st.dictionaries(st.sampled_from(["acc", "größe", "n"]), execution_values, max_size=2))
        trials.append(Trial(trial_id, config, series, status, final=final))
    return trials


_ALL_NAN_RANKS = {  # a metric whose every value is a logged NaN (a plot of it draws nothing, and is no error)
    f"rank{r}": [{"training_iteration": 1, "loss": 0.0, "ácc": math.nan, "rank": r}] for r in range(2)
}
_LARGEST = 1.7976931348623157e308
_OVERFLOWING = [  # finite values whose span overflows a linear axis or colour bar (CI's hypothesis found it)
    Trial("huge", {"größe": -_LARGEST}, {"": [{"training_iteration": 1, "loss": _LARGEST}]}),
    Trial("tiny", {"größe": 0.01}, {"": [{"training_iteration": 1, "loss": -_LARGEST}, {"training_iteration": 2}]}),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trials=sweeps())
@example(trials=[Trial("t-0", {"größe": 0}, _ALL_NAN_RANKS)])
@example(trials=_OVERFLOWING)
def test_every_read_path_takes_any_sweep(
    trials: list[Trial], tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sweep, every ``ray-cmf`` command with ``--json`` (exit 0, strictly valid JSON) and the report (every
    trial on the page) on whatever a sweep leaves."""
    tmp = tmp_path_factory.mktemp("generated")
    store = write_trials(tmp / "store", trials)
    root = str(store.root)
    sweep = Sweep(store)
    table = sweep.trials()
    assert sorted(table["trial_id"]) == sorted(t.trial_id for t in trials)
    table_keys = {c.removeprefix("config/") for c in table.columns if c.startswith("config/")}
    committed = [row for t in trials if t.status != "RUNNING" for rows in t.series.values() for row in rows]
    logged = {m for row in committed for m, v in row.items() if v is not None} - {"training_iteration", "rank"}
    numbers = {m for m in logged if all(_number(r.get(m)) for r in committed if r.get(m) is not None)}
    for trial in trials:
        lead = next(iter(trial.series.values()), [])  # its only series, or its rank 0's: what is summarised
        rows = len(lead) if trial.status != "RUNNING" else 0
        assert table.set_index("trial_id").loc[trial.trial_id, "steps"] == rows
        final = sweep.execution_metrics(trial.trial_id)
        assert final.keys() == {f"final/{k}" for k in trial.final}
        assert all(same(v, final[f"final/{k}"]) or v != v for k, v in trial.final.items())  # NaN: any NaN
        assert isinstance(sweep.environment(trial.trial_id), dict)
    steps = sweep.steps(live=True)
    assert len(steps) == sum(len(rows) for t in trials for rows in t.series.values())
    commands = [["pipelines"], ["trials"], ["verify"], ["export", "--format", "csv", "-o", str(tmp / "s.csv")]]
    commands += [["show", t.trial_id] for t in trials]
    if len(trials) > 1:
        commands.append(["diff", trials[0].trial_id, trials[1].trial_id])
    for metric in sorted(numbers):
        assert len(sweep.best(metric, "min", n=len(trials))) == len(trials)
        commands.append(["compare", "--metric", metric, "--top", "3"])
        commands.append(["trials", "--metric", metric, "--mode", "max"])
        for status in {t.status for t in trials}:  # trials kept may all lack the metric: its columns stay
            where = f'status == "{status}"'
            kept = sweep.trials([metric], where=where)
            assert {f"{metric}_best", f"{metric}_final"} <= set(kept.columns)
            assert metric in sweep.only(kept["trial_id"]).steps([metric]).columns  # what export writes
            commands.append(["compare", "--metric", metric, "--where", where])
            commands.append(["report", "--metric", metric, "--where", where, "-o", str(tmp / "kept.html")])
        for key in sorted({k for t in trials for k in t.config if k in table_keys}):
            commands.append(["plot", "--metric", metric, "--color-by", key, "-o", str(tmp / "plot.png")])
    commands.append(["report", "-o", str(tmp / "report.html")])
    for command in commands:
        capsys.readouterr()
        code, out = _cli(capsys, *command, "--store", root)
        assert code == 0, (command, capsys.readouterr().err)
        assert out is not None
    page = (tmp / "report.html").read_text()
    for trial in trials:
        assert f"<td>{html.escape(trial.trial_id)}</td>" in page


def test_the_default_series_is_the_obvious_one_or_an_error_that_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store written by Cmf or by Train alone has no Tune results: the default used to be a silent empty
    answer (every trial with 0 steps, exit 0)."""
    one = write_trials(tmp_path / "one", [Trial("a", {}, {"": [{"step": 1, "loss": 0.5}]})], metrics_name="train")
    assert Sweep(one).metrics_name == "train" and Sweep(one).trials()["steps"].tolist() == [1]
    two = write_trials(tmp_path / "two", [Trial("a", {}, {"": [{"step": 1, "loss": 0.5}]})], metrics_name="x")
    write_trials(tmp_path / "two", [Trial("b", {}, {"": [{"step": 1}]})], metrics_name="y")
    with pytest.raises(MetricsNotFoundError, match=r"Tune results .*\['x', 'y'\]"):
        Sweep(two)
    assert main(["trials", "--store", str(two.root)]) == 2
    assert "['x', 'y']" in capsys.readouterr().err
    for held, shown in (
        (("train_steps", "train_reports", "system_metrics"), "train_steps"),  # StepLogger and CmfTrainCallback
        (("train_reports", "system_metrics"), "train_reports"),  # CmfTrainCallback alone
        (("train", "system_metrics"), "train"),  # Cmf with its sampler
    ):
        root = tmp_path / "-".join(held)
        for name in held:
            write_trials(root, [Trial("run", {}, {name: [{"step": 1, "loss": 0.5}]})], metrics_name=name)
        assert Sweep(root).metrics_name == shown
        assert main(["show", "run", "--store", str(root)]) == 0  # asked for --metrics-name
        assert "loss" in capsys.readouterr().out


def test_show_gives_the_last_rows_of_a_series_the_trial_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial that reported no Tune result but logged its own series (``get_cmf()``'s ``fine``): ``show``
    printed "last 5 rows: none" (a new user's), since the pipeline's default series is Tune's results. Without
    ``--metrics-name`` it now shows the rows of a series the trial holds, and says which on stderr."""
    root = tmp_path / "store"
    write_trials(root, [Trial("a", {}, {"": [{"training_iteration": 1, "loss": 0.5}]}), Trial("b")])
    write_trials(root, [Trial("b", {}, {"": [{"step": 0, "x": 1.5}, {"step": 1, "x": 2.5}]})], metrics_name="fine")
    code, shown = _cli(capsys, "show", "b", "--store", str(root))
    assert code == 0 and [row["x"] for row in shown["last_rows"]] == [1.5, 2.5]
    assert main(["show", "b", "--store", str(root)]) == 0
    assert "'fine'" in capsys.readouterr().err
    code, shown = _cli(capsys, "show", "a", "--store", str(root))
    assert code == 0 and [row["loss"] for row in shown["last_rows"]] == [0.5]
    code, shown = _cli(capsys, "show", "b", "--store", str(root), "--metrics-name", "tune_results")
    assert code == 0 and shown["last_rows"] == []  # asked for: Tune's results, which it has none of


def test_output_paths_and_counts_that_cannot_be_used_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {"": [{"training_iteration": 1, "loss": 0.5}]}
    store = str(write_trials(tmp_path / "store", [Trial("a", {"lr": 0.1}, rows)]).root)
    with pytest.raises(SystemExit) as usage:
        main(["compare", "--store", store, "--metric", "loss", "--top", "-1"])  # printed 'top -1' rows
    assert usage.value.code == 2
    with pytest.raises(InvalidArgumentError, match="n must be >= 1"):
        Sweep(store).best("loss", n=0)
    (tmp_path / "adir").mkdir()
    assert main(["report", "--store", store, "-o", str(tmp_path / "adir")]) == 2  # was a traceback
    assert "is a directory" in capsys.readouterr().err
    assert main(["plot", "--store", store, "--metric", "loss", "-o", str(tmp_path / "new" / "c.png")]) == 0
    assert (tmp_path / "new" / "c.png").stat().st_size > 0  # like report and export, it makes the directory
    capsys.readouterr()
    assert main(["plot", "--store", store, "--metric", "loss", "--metric", "lr", "-o", str(tmp_path / "d.png")]) == 2
    assert "one --metric" in capsys.readouterr().err and not (tmp_path / "d.png").exists()  # drew the first only


def test_the_cli_finds_what_the_user_means(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two pipelines in one store (the README's sections 1 and 2 make this): commands that take a trial id
    find its pipeline; the others list the pipelines; trials sort best first and filter by status."""

    def rows(*losses: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v, "time_total_s": 1.0} for i, v in enumerate(losses)]}

    store = write_trials(
        tmp_path / "store",
        [Trial("a1", {"lr": 0.1}, rows(0.5, 0.4)), Trial("a2", {"lr": 0.2}, rows(0.3), "FAILED")],
        pipeline="first",
    )
    write_trials(tmp_path / "store", [Trial("b1", {"lr": 0.3}, rows(0.9))], pipeline="second")
    root = str(store.root)
    code, listed = _cli(capsys, "pipelines", "--store", root)
    assert code == 0 and [(r["pipeline"], r["stages"], r["trials"]) for r in listed] == [
        ("first", ["exp"], 2),
        ("second", ["exp"], 1),
    ]
    assert main(["trials", "--store", root]) == 2
    err = capsys.readouterr().err
    assert "pass --pipeline NAME" in err and "first: 2 trials" in err and "pipeline=" not in err
    code, shown = _cli(capsys, "show", "b1", "--store", root)  # found in its pipeline without --pipeline
    assert code == 0 and shown["trial_id"] == "b1"
    code, table = _cli(capsys, "trials", "--store", root, "--pipeline", "first", "--metric", "loss")
    assert [r["trial_id"] for r in table] == ["a2", "a1"]  # best first
    code, table = _cli(capsys, "trials", "--store", root, "--pipeline", "first", "--status", "COMPLETE")
    assert [r["trial_id"] for r in table] == ["a1"]
    assert "time_total_s_final" not in table[0] and "training_iteration_best" not in table[0]
    code, table = _cli(capsys, "trials", "--store", root, "--pipeline", "first", "--all-columns")
    assert "time_total_s_final" in table[0]


def test_piping_into_head_ends_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys

    many = [Trial(f"t{i}", {"lr": i / 100}, {"": [{"step": 1, "loss": 0.1}]}) for i in range(60)]
    store = write_trials(tmp_path / "store", many)
    exe = Path(sys.executable).with_name("ray-cmf")
    done = subprocess.run(
        f"{exe} trials --store {store.root} | head -n 2", shell=True, capture_output=True, text=True, check=True
    )
    assert (
        len(done.stdout.splitlines()) == 2 and "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr
    )


@pytest.mark.parametrize("ranks", [1, 2], ids=["from the footers", "from a scan"])
def test_int_summaries_stay_exact_beside_trials_without_the_metric(tmp_path: Path, ranks: int) -> None:
    """``_best``/``_final`` of an int metric are the ints logged, also when another trial has no such metric
    (its blank must not turn the column into float64, which rounds 2**53 + 1)."""
    big = [{"training_iteration": 1, "big": 2**53 + 1}, {"training_iteration": 2, "big": 2**62 + 1}]
    other = [{"training_iteration": 1, "other": 0.5}]

    def series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        return {"": rows} if ranks == 1 else {f"rank{r}": [{**row, "rank": r} for row in rows] for r in range(2)}

    store = write_trials(tmp_path / "store", [Trial("big", series=series(big)), Trial("none", series=series(other))])
    table = Sweep(store).trials(["big"]).set_index("trial_id")
    exact = [
        table.loc["big", "big_best"],
        table.loc["big", "big_final"],
        Sweep(store).best("big", "max")["big_best"][0],
    ]
    assert all(isinstance(v, int | np.integer) for v in exact)  # a float64 would compare equal after rounding
    assert [int(v) for v in exact] == [2**53 + 1, 2**62 + 1, 2**62 + 1] and math.isnan(table.loc["none", "big_best"])


@pytest.mark.parametrize("ranks", [1, 2], ids=["from the footers", "from a scan"])
def test_a_metric_logged_as_ints_by_one_trial_and_floats_by_another_keeps_each_value(
    tmp_path: Path, ranks: int
) -> None:
    """Trial "ints" logs the metric as ints, "floats" as floats ending in -inf: the summary turned every value
    into an int, so -1.5 read back as -1, and -inf raised OverflowError out of ``Sweep.trials()``."""
    big = 2**53 + 1 if ranks == 1 else 7  # a scan merges int with float as float64, as Arrow does (see unify)
    rows = {
        "ints": [{"training_iteration": 1, "m": 4}, {"training_iteration": 2, "m": big}],
        "floats": [{"training_iteration": 1, "m": -1.5}, {"training_iteration": 2, "m": -math.inf}],
    }

    def series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        return {"": rows} if ranks == 1 else {f"rank{r}": [{**row, "rank": r} for row in rows] for r in range(2)}

    store = write_trials(tmp_path / "store", [Trial(t, series=series(r)) for t, r in rows.items()])
    table = Sweep(store).trials(["m"]).set_index("trial_id")
    assert table.loc["ints", "m_best"] == 4 and table.loc["ints", "m_final"] == big
    assert ranks == 2 or isinstance(table.loc["ints", "m_final"], int | np.integer)  # a float64 rounds 2**53 + 1
    assert table.loc["floats", "m_best"] == -1.5 and table.loc["floats", "m_final"] == -math.inf


def test_numpy_config_values_read_back_as_numbers(tmp_path: Path) -> None:
    """A grid over ``np.arange`` values gives trials np.int64 and np.float32 config values: they were recorded
    as their repr ("np.int64(3)"), so the config column was text and ``--where 'config/n > 0'`` matched none."""
    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    trials = [
        Trial(f"t{i}", {"n": np.int64(i), "lr": np.float32(0.5) * i, "x": {"deep": np.float64(i)}}, rows)
        for i in (0, 1)
    ]
    sweep = Sweep(write_trials(tmp_path / "store", trials))
    table = sweep.trials().set_index("trial_id")
    assert table["config/n"].tolist() == [0, 1] and table["config/lr"].tolist() == [0.0, 0.5]
    assert table["config/x.deep"].tolist() == [0.0, 1.0]
    assert sweep.trials(where="config/n > 0").index.size == 1


_ABSENT = object()  # a trial whose config lacks the key
_CONFIG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([2**53 + 1, -(2**53) - 1, 3]),
    floats,
    st.text(st.characters(exclude_categories=("Cs",)), max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
    st.just({}),
)


def _same_config(logged: Any, read: Any) -> bool:
    """Whether a config value reads back as recorded (JSON has one NaN: a NaN's sign and payload are not kept)."""
    if isinstance(logged, float) and math.isnan(logged):
        return isinstance(read, float) and math.isnan(read)
    return same(logged, read)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@example(values=[2**53 + 1, 0.5], key="k")  # a new user's: the int read back as 2**53, and --where could not find it
@example(values=[1, 2.5, _ABSENT], key="k")  # the int read back as the float 1.0
@example(values=[[1, 2], "[1, 2]"], key="k")  # a list, and the text of one
@example(values=[{}, _ABSENT, "{}"], key="k")  # a new user's: an empty dict read as no value, as the key absent
@given(
    values=st.lists(st.one_of(st.just(_ABSENT), _CONFIG_VALUES), min_size=1, max_size=4),
    key=st.sampled_from(["k", "学习率", "β 2"]),
)
def test_each_trials_config_value_reads_back_as_recorded_whatever_the_others_hold(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], values: list[Any], key: str
) -> None:
    """A trial's config value under a key other trials hold too, as ``trials()``, ``--json``, ``--where`` and
    ``Sweep.config`` read it. An int beside another trial's float read back as a float (2**53 + 1 as 2**53,
    which ``--where`` then could not find). The table holds a list as its JSON text, a cell to sort, group and
    query by, marked as one (a ``JsonText``) so that the text of a list is not read as a list; ``Sweep.config``
    gives the list itself, where it gave the same text as for a config of that text. An empty dict is a value
    too (a nested dict's keys are flattened: it has none), read as ``{}``, not as a key the trial lacks."""
    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    trials = [Trial(f"t{i}", {} if v is _ABSENT else {key: v}, rows) for i, v in enumerate(values)]
    store = write_trials(tmp_path_factory.mktemp("store"), trials)
    sweep = Sweep(store)
    table = sweep.trials().set_index("trial_id")
    column = table[f"config/{key}"].tolist() if f"config/{key}" in table else [None] * len(values)
    code, printed = _cli(capsys, "trials", "--store", str(store.root))
    by_id = {row["trial_id"]: row for row in printed}
    assert code == 0
    for trial, logged, read in zip(table.index, values, column, strict=True):
        own = sweep.config(trial)
        if logged is _ABSENT:
            assert read is None and key not in own, (trial, read, own)
            continue
        shown = JsonText(json.dumps(logged)) if isinstance(logged, list | dict) else logged  # a text: a plain str
        assert _same_config(shown, read) and _same_config(logged, own[key]), (trial, logged, read, own)
        if type(logged) is int:
            assert _same_config(logged, by_id[trial][f"config/{key}"]), by_id[trial]
            assert trial in set(sweep.trials(where=f"`config/{key}` == {logged}")["trial_id"]), logged


def test_config_keys_that_flatten_to_one_name_keep_one_value_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``{"a.b": 1, "a": {"b": 2}}`` flattens both keys to ``a.b``: the last one flattened replaced the other
    without a word, in the config's own order for the MLMD property and in sorted order for the table, so the
    two could disagree. The key written with fewer levels is kept everywhere (through ``Cmf``, MLMD holds it
    as the user wrote it), and recording the config warns, naming both."""
    from ray_cmf import Cmf
    from ray_cmf.lineage import config_properties, properties

    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    config = {"a": {"b": 2}, "a.b": 1, "c": 3}
    with caplog.at_level("WARNING"):
        props = config_properties(config)
    assert props["a.b"] == 1 and props["c"] == 3
    assert "config['a.b'] and config['a']['b'] both flatten to 'a.b'" in caplog.text
    sweep = Sweep(write_trials(tmp_path / "store", [Trial("t", config, rows)]))
    assert sweep.trials()["config/a.b"].tolist() == [1] and sweep.config("t")["a.b"] == 1

    caplog.clear()
    cmf = Cmf(pipeline_name="p", store=tmp_path / "cmf")
    with caplog.at_level("WARNING"):
        execution = cmf.create_execution("Train", config)
    assert "both flatten to 'a.b'" in caplog.text
    cmf.log_metric("m", {"x": 1.0})
    cmf.commit_metrics("m")
    assert properties(cmf.store.lineage.get_execution(execution.id))["a.b"] == 1
    sweep = Sweep(tmp_path / "cmf", metrics_name="m")
    assert sweep.config(execution.name)["a.b"] == 1 and sweep.trials()["config/a.b"].tolist() == [1]


def test_diff_tells_configs_apart_as_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``diff`` compared the table's cells: a list config and a config of its text were the same ('[1, 2]'),
    and so were True and 1 (``True == 1``), and "" and None; its text table showed ``[64]`` as ``64``, ``[]``
    as nothing, and ``"0.3"`` as ``0.3``, on rows that said they differ."""
    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    configs = (
        {"lst": [1, 2], "flag": True, "lr": 1, "same": 0.5, "layers": [64], "rate": 0.3, "drop": ""},
        {"lst": "[1, 2]", "flag": 1, "lr": 1.0, "same": 0.5, "layers": [], "rate": "0.3", "drop": None},
    )
    store = write_trials(tmp_path / "store", [Trial(t, c, rows) for t, c in zip("ab", configs, strict=True)])
    sweep = Sweep(store)
    differs = sweep.diff("a", "b")
    assert {"config/lst", "config/flag", "config/drop"} <= set(differs.index) and "config/same" not in differs.index
    assert differs.loc["config/lst", "a"] == [1, 2] and differs.loc["config/lst", "b"] == "[1, 2]"
    assert "config/lr" not in differs.index  # 1 and 1.0 are one number
    assert main(["--store", str(store.root), "diff", "a", "b"]) == 0
    shown = {line.split()[1]: line.split()[3:6:2] for line in capsys.readouterr().out.splitlines() if "config/" in line}
    assert shown["config/layers"] == ["[64]", "[]"] and shown["config/rate"] == ["0.3", '"0.3"']
    assert shown["config/drop"] == ['""', "null"]


def test_diff_shows_how_the_trials_ended_and_how_they_were_curated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``diff`` of a COMPLETE and a FAILED trial that were tagged apart showed neither the status, the error
    nor the tags: only config, environment and metrics."""
    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    trials = [Trial("a", {"lr": 0.1}, rows), Trial("b", {"lr": 0.1}, rows, "FAILED", "ValueError: diverged")]
    sweep = Sweep(write_trials(tmp_path / "store", trials))
    sweep.tag("a", kind="baseline")
    sweep.tag("b", kind="probe")
    sweep.note("b", "lr too high?")
    differs = sweep.diff("a", "b")
    assert differs.loc["status"].tolist() == ["COMPLETE", "FAILED"]
    assert differs.loc["error"].tolist() == [None, "ValueError: diverged"]
    assert differs.loc["tag/kind"].tolist() == ["baseline", "probe"]
    assert differs.loc["note"].tolist() == [None, "lr too high?"]
    assert "config/lr" not in differs.index and "loss_best" not in differs.index
    assert main(["--store", str(sweep.store.root), "diff", "a", "b"]) == 0
    table = [[cell.strip() for cell in line.split("│")[1:-1]] for line in capsys.readouterr().out.splitlines()]
    shown = {cells[0]: cells[1:] for cells in table if cells}
    assert shown["status"] == ['"COMPLETE"', '"FAILED"'] and shown["error"] == ["null", '"ValueError: diverged"']


def _drawn_pixels(png: Path) -> int:
    """Coloured pixels in a plot without legend or colour bar: what its curves drew (axes, text and grid are
    grey)."""
    import matplotlib.image

    rgb = matplotlib.image.imread(png)[..., :3]
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.15).sum())


def test_a_trial_with_one_value_is_drawn_as_a_dot(tmp_path: Path) -> None:
    """A trial that failed after one iteration has a single point: a line through it draws nothing, so the
    plot showed such trials as absent (the report already draws them as dots)."""
    many = [Trial(f"t{i}", {"lr": 0.1 * i}, {"": [{"training_iteration": 1, "loss": float(i)}]}) for i in range(13)]
    sweep = Sweep(write_trials(tmp_path / "store", many))
    assert _drawn_pixels(sweep.plot_curves("loss", tmp_path / "one.png")) > 13


def test_a_value_alone_between_two_breaks_is_drawn_as_a_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finite value between two NaNs has no neighbour to draw a line to: the PNG showed it as no value
    (the report draws such a point as a dot, and so does the PNG now)."""
    from ray_cmf import plots

    drawn: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    nan = float("nan")
    rows = [{"training_iteration": i + 1, "loss": v} for i, v in enumerate([0.0, 0.0, nan, 5.0, nan, 0.0, 0.0])]
    frame = Trial("frame", {"lr": 0.1}, {"": [{"training_iteration": i, "loss": 10.0} for i in (1, 7)]})
    Sweep(write_trials(tmp_path / "store", [frame, Trial("a", {"lr": 0.2}, {"": rows})])).plot_curves(
        "loss", tmp_path / "c.png"
    )
    [fig] = drawn
    [ax] = fig.axes
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    x, y = ax.transData.transform((4.0, 5.0))
    row, column = pixels.shape[0] - round(y), round(x)  # display y grows upwards, image rows downwards
    around = pixels[row - 2 : row + 3, column - 2 : column + 3]
    assert ((around.max(axis=-1) - around.min(axis=-1)) > 60).any(), "nothing coloured where step 4's value is"


def test_overflowing_values_plot_without_warnings(tmp_path: Path) -> None:
    """matplotlib's numpy arithmetic overflowed near the float limit and printed RuntimeWarnings at the user."""
    import warnings

    sweep = Sweep(write_trials(tmp_path / "store", _OVERFLOWING))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert sweep.plot_curves("loss", tmp_path / "c.png", color_by="größe").stat().st_size > 0
        assert sweep.plot_params("loss", tmp_path / "p.png").stat().st_size > 0


def test_a_diverged_trial_leaves_the_other_curves_readable_in_a_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PNG's axis stretched to a float32-diverged trial's 3e38 (beyond 1e300: a symmetric-log axis), and
    every learning curve lay flat at 0; its inf was a gap with no mark. The axis now spans the bulk of the
    values, and what lies beyond is marked at its edge in the trial's colour (as the report does)."""
    from ray_cmf import plots
    from tests.test_report import _diverged_sweep

    drawn: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    _diverged_sweep(tmp_path / "store").plot_curves("loss", tmp_path / "c.png")
    [ax] = drawn[0].axes
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "linear" and low < 0.3 and 2.3 < high < 20.0
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    assert np.isfinite(lines["a"].get_ydata()).sum() == np.isfinite(lines["b"].get_ydata()).sum() == 50
    marks = [line for line in ax.lines if line.get_label().startswith("_") and line.get_linestyle() == "None"]
    [mark] = marks
    assert mark.get_color() == lines["d"].get_color() and len(mark.get_ydata()) == 5  # each value off the plot
    assert all(10.0 < y < high for y in mark.get_ydata())


def test_a_png_marks_the_nan_values_as_the_report_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray-cmf plot`` drew no mark for a NaN (a NaN-only trial drew nothing at all), where the report marks
    each with an x: the plot read a logged NaN as a step without the metric."""
    from ray_cmf import plots

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [Trial("ok", {}, losses(1.0, 0.5, 0.25)), Trial("nan", {}, losses(math.nan, math.nan, math.nan))]
    gap = Trial("gap", {}, {"": [{"training_iteration": 1, "loss": 0.7}, {"training_iteration": 2}]})
    for store, kept in (("plain", trials), ("with_a_gap", [*trials, gap])):  # a column with a null, and without
        drawn: list[Any] = []
        monkeypatch.setattr(plots, "_save", lambda fig, path, drawn=drawn: drawn.append(fig) or path)
        Sweep(write_trials(tmp_path / store, kept)).plot_curves("loss", tmp_path / f"{store}.png")
        [ax] = drawn[0].axes
        colours = {line.get_label(): line.get_color() for line in ax.lines if not line.get_label().startswith("_")}
        marks = [line for line in ax.lines if line.get_linestyle() == "None" and line.get_marker() == "x"]
        assert [(m.get_color(), list(m.get_xdata())) for m in marks] == [(colours["nan"], [1.0, 2.0, 3.0])], store
        assert ax.get_title().endswith(f"({len(kept)} trials)")  # the gap is no NaN, and has no mark


def test_a_plot_counts_and_draws_only_the_trials_that_logged_its_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metric only one trial has: its title said "3 trials" and its legend listed trials with no curve."""
    from ray_cmf import plots

    rows = [{"training_iteration": s, "loss": 1.0 / s, "special": float(s)} for s in (1, 2, 3)]
    trials = [Trial("has", {"lr": 0.1}, {"": rows})]
    trials += [Trial(f"lacks{i}", {"lr": 1.0}, {"": [{"training_iteration": 1, "loss": 0.5}]}) for i in range(2)]
    drawn: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    Sweep(write_trials(tmp_path / "store", trials)).plot_curves("special", tmp_path / "s.png")
    [ax] = drawn[0].axes
    assert [line.get_label() for line in ax.lines] == ["has"]
    assert ax.get_title().endswith("(1 trials; 2 more without special)")  # the others are not left out unsaid


def test_a_plot_writes_dollar_signs_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric named ``cost $x^2$`` and a config value ``x$\\frac$y`` failed ``ray-cmf plot`` (matplotlib read
    each ``$...$`` as mathtext: "Expected \\frac{num}{den}"), and a ``$a$`` would have drawn as italic math."""
    from ray_cmf import plots

    rows = [{"training_iteration": s, "cost $x^2$": 1.0 / s} for s in (1, 2, 3)]
    trials = [
        Trial(f"t{i}", {"opt": opt, "lr": lr}, {"": rows})
        for i, (opt, lr) in enumerate([("a$b$c", 0.1), ("x$\\frac$y", 0.2)])
    ]
    sweep = Sweep(write_trials(tmp_path / "store", trials))
    assert sweep.plot_curves("cost $x^2$", tmp_path / "c.png", color_by="opt").stat().st_size > 0
    assert sweep.plot_params("cost $x^2$", tmp_path / "p.png").stat().st_size > 0
    drawn: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    sweep.plot_curves("cost $x^2$", tmp_path / "c.png", color_by="opt")
    [ax] = drawn[0].axes
    texts = [ax.yaxis.label, *ax.get_legend().get_texts()]
    assert [t._preprocess_math(t.get_text()) for t in texts] == [  # as drawn: no math
        ("cost $x^2$", False),
        ("a$b$c", False),
        ("x$\\frac$y", False),
    ]


def test_a_plot_coloured_by_a_key_keeps_an_int_and_its_text_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``depth`` 3 in one trial and ``"3"`` in another drew in one colour under one legend entry "3", where the
    trial table quotes the text and the report's axes name the types (a new user's)."""
    from ray_cmf import plots

    rows = [{"training_iteration": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    trials = [Trial(f"t{i}", {"depth": depth}, {"": rows}) for i, depth in enumerate([3, "3", 4, None])]
    drawn: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    Sweep(write_trials(tmp_path / "store", trials)).plot_curves("loss", tmp_path / "c.png", color_by="depth")
    [ax] = drawn[0].axes
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["3 (number)", "3 (str)", "4", "(none)"], labels
    colours = {tuple(line.get_color()) for line in ax.lines}
    assert len(colours) == 4


def test_show_prints_a_config_value_as_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``show`` printed a NaN config as the text ``'NaN'`` (and inf as ``'Infinity'``): the JSON spelling,
    which reads as a config of words, and gave a trial every key of the sweep (None for the ones it lacks).
    It now shows the trial's own config, each value as Python writes it."""
    rows = {"": [{"training_iteration": 1, "loss": 1.0}]}
    config = {"eps": math.nan, "lr": math.inf, "opt": "NaN", "layers": 3, "clip": None}
    store = write_trials(tmp_path / "store", [Trial("a", config, rows), Trial("b", {"wd": 0.1}, rows)])
    assert main(["show", "a", "--store", str(store.root)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("config:")]
    assert line == "config: clip=None  eps=nan  layers=3  lr=inf  opt='NaN'", line  # not b's wd
    code, shown = _cli(capsys, "show", "b", "--store", str(store.root))
    assert code == 0 and shown["config"] == {"wd": 0.1}  # a key only another trial has is not b's (it was None)


def test_the_global_options_go_before_the_command_or_after_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ray-cmf --store S trials`` is how git, dvc and docker users write it: it was refused ("unrecognized
    arguments"), and ``-v`` after the command was too."""
    rows = {"": [{"training_iteration": 1, "loss": 0.5}]}
    root = str(write_trials(tmp_path / "store", [Trial("a", {"lr": 0.1}, rows)]).root)
    for argv in (["--store", root, "--json", "trials"], ["trials", "--store", root, "--json"]):
        assert main(argv) == 0
        assert [r["trial_id"] for r in json.loads(capsys.readouterr().out)] == ["a"]
    assert main(["--store", root, "show", "a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == {"lr": 0.1}
    assert main(["--store", str(tmp_path / "nothing"), "trials"]) == 2  # the store before the command is used
    assert "nothing" in capsys.readouterr().err
    args = parse(["trials", "-v", "--store", root])
    assert args.verbose and args.store == root


def test_a_series_committed_while_the_sweep_lists_its_series_is_still_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit registers the new version in MLMD, then empties the spill. A reader that read MLMD first and
    the spill second could see the series in neither (the report of a sweep being written then failed with
    "No series 'system_metrics'"). Here the commit lands between the two reads."""
    from ray_cmf import Cmf

    store = tmp_path / "store"
    cmf = Cmf(pipeline_name="p", store=store)
    cmf.create_execution("train", {"lr": 0.1})
    cmf.log_metric("steps", {"step": 1, "loss": 1.0})
    cmf.commit_metrics("steps")
    cmf.log_metric("other", {"step": 1, "x": 1.0})
    cmf.metrics["other"].flush()  # spilled, not committed
    listing = Sweep._manifests

    def committed_first(self: Sweep) -> Any:
        if cmf.metrics["other"].rows and not getattr(cmf, "_other_done", False):
            cmf._other_done = True  # type: ignore[attr-defined]
            cmf.commit_metrics("other")
        return listing(self)

    monkeypatch.setattr(Sweep, "_manifests", committed_first)
    assert Sweep(store, metrics_name="steps").series_names() == ["other", "steps"]
    cmf.close()


@pytest.mark.parametrize("status", ["RUNNING", "COMPLETE"])
@pytest.mark.parametrize("instances", [["77781e41"], ["12345678", "nan"]], ids=["one", "two"])
def test_a_series_key_or_bookkeeping_column_is_never_read_as_a_metric(
    tmp_path: Path, status: str, instances: list[str]
) -> None:
    """Each plain ``Cmf`` names its series by 8 random hex digits, and some read as numbers (``77781e41`` is
    7.7781e45). A running script's one series was read with that key as a ``series`` column, and the report
    drew it as a metric and ranked the trial by it; so it drew a rank or a pid. A series is keyed only where
    a trial holds several, live or committed alike, and no key or bookkeeping column is a metric anywhere."""
    from ray_cmf.frames import SERIES_COLUMN
    from ray_cmf.report import content

    rows = [{"step": s, "rank": 0, "pid": 4242, "loss": 1.0 / (s + 1)} for s in range(20)]
    store = write_trials(
        tmp_path / "store", [Trial("run", {"lr": 0.1}, dict.fromkeys(instances, rows), status)], metrics_name="m"
    )
    sweep = Sweep(store, metrics_name="m")
    live = sweep.steps(live=True)
    assert (SERIES_COLUMN in live.columns) == (len(instances) > 1)
    assert set(live.columns) - {SERIES_COLUMN} == {"trial_id", "step", "rank", "loss", "pid"}  # read, not a metric
    if len(instances) > 1:
        assert sorted(set(live[SERIES_COLUMN])) == sorted(instances)  # kept as the text it is
    if status == "COMPLETE":
        with pytest.raises(InvalidArgumentError, match=r"\['rank'\] are steps, keys or bookkeeping, not metrics"):
            sweep.trials(["rank"])
    for options in ({"live": True}, {}) if status == "COMPLETE" else ({"live": True},):  # nothing committed
        parts = content(sweep, **options)
        assert [s["metric"] for s in parts["data"]["sections"]] == ["loss"], options
        assert parts["data"]["primary"] == "loss"
        assert not {"series_best", "rank_best", "pid_best"} & set(re.findall(r"<th[^>]*>([^<]+)</th>", parts["table"]))


@pytest.mark.parametrize("status", ["RUNNING", "COMPLETE"])
def test_steps_and_export_give_every_column_logged_not_only_the_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], status: str
) -> None:
    """A Train loop that reported its own ``pid``, ``wall_time`` and ``training_iteration`` beside its
    ``step`` got none of them back from ``steps()`` or ``ray-cmf export``: they were read only when named,
    as bookkeeping. What was logged comes back; it is still no metric of the trial table."""
    import pandas as pd

    from ray_cmf.constants import REPORTS_METRICS_NAME

    rows = [
        {"step": 10 * i, "training_iteration": i + 1, "pid": 4242, "wall_time": 1.7e9 + i, "loss": 1.0 / (i + 1)}
        for i in range(5)
    ]
    reports = [{**row, "rank": rank, "report": i} for i, row in enumerate(rows) for rank in (0, 1)]
    store = write_trials(
        tmp_path / "store", [Trial("run", {}, {"": reports}, status)], metrics_name=REPORTS_METRICS_NAME
    )
    sweep = Sweep(store, metrics_name=REPORTS_METRICS_NAME)
    steps = sweep.steps(live=status == "RUNNING")
    logged = ["training_iteration", "pid", "wall_time", "loss", "report"]
    assert set(steps.columns) == {"trial_id", "rank", "step", *logged}
    ordered = steps.sort_values(["step", "rank"])
    for column in logged:
        assert ordered[column].tolist() == [r[column] for r in reports], column
    if status == "COMPLETE":
        out = tmp_path / "all.csv"
        assert main(["export", "--store", str(store.root), "--metrics-name", REPORTS_METRICS_NAME, "-o", str(out)]) == 0
        exported = pd.read_csv(out).sort_values(["step", "rank"])
        for column in logged:
            assert exported[column].tolist() == [r[column] for r in reports], column
        assert {c for c in sweep.trials().columns if c.endswith("_final")} == {"loss_final"}


@pytest.mark.parametrize("status", ["RUNNING", "COMPLETE"])
def test_a_trials_final_value_is_its_last_series_last_value_whatever_the_series_are_called(
    tmp_path: Path, status: str
) -> None:
    """An execution reopened by name logs a second series (each Cmf its own, named by random hex digits):
    ``_final`` is the value the series that goes furthest logged last. It was the last row of the series
    whose name sorted last, so it changed from run to run for the same data; then of the series committed
    last, which is the crashed first run's when ``recover`` commits it after the second run."""
    first = [{"step": s, "v": float(s)} for s in range(3)]
    later = [{"step": s, "v": float(10 + s)} for s in range(3, 6)]
    series = {"0000ffff": later, "ffff0000": first}  # committed last: the crashed run's, by a later recover
    store = write_trials(tmp_path / "store", [Trial("run", {}, series, status)], metrics_name="m")
    sweep = Sweep(store, metrics_name="m")
    summaries = [sweep.trials()] if status == "COMPLETE" else []
    from ray_cmf.report import content

    table = content(sweep, live=True)["table"]
    cells = re.findall(r'data-v="([^"]+)"', table)
    assert cells == ["0.0", "15.0", "6"]  # v_best, v_final, steps (an int's sort key is exact)
    for summary in summaries:
        [row] = summary.to_dict(orient="records")
        assert (row["v_final"], row["v_best"], row["steps"]) == (15.0, 0.0, 6)


@pytest.mark.parametrize("longer_first", [True, False])
def test_a_trials_final_value_is_at_its_furthest_step_whichever_series_was_committed_last(
    tmp_path: Path, longer_first: bool
) -> None:
    """Two ``Cmf`` objects of one execution, each a series from step 0: one logs steps 0-3 (``x`` 0-3), the
    other 0-2 (``x`` 10-12). ``x_final`` was 12 or 3 by which was committed last: series that start at the
    same step were ordered as committed. It is the value at the furthest step, 3, either way."""
    longer = [{"step": s, "x": float(s)} for s in range(4)]
    shorter = [{"step": s, "x": float(10 + s)} for s in range(3)]
    series = {"aaaa": longer, "bbbb": shorter} if longer_first else {"bbbb": shorter, "aaaa": longer}
    store = write_trials(tmp_path / "store", [Trial("run", {}, series)], metrics_name="m")
    [row] = Sweep(store, metrics_name="m").trials().to_dict(orient="records")
    assert (row["x_final"], row["x_best"], row["steps"]) == (3.0, 0.0, 7)


@pytest.mark.parametrize("status", ["RUNNING", "COMPLETE"])
def test_only_a_trial_with_several_series_names_them(tmp_path: Path, status: str) -> None:
    """Beside a trial with two series, a trial with one had its series' random id in every row's ``series``;
    as the README says, a trial with one has none (null), running or committed."""
    rows = [{"step": s, "x": float(s)} for s in range(2)]
    trials = [Trial("two", {}, {"aaaa": rows, "bbbb": rows}, status), Trial("one", {}, {"cccc": rows}, status)]
    sweep = Sweep(write_trials(tmp_path / "store", trials, metrics_name="m"), metrics_name="m")
    steps = sweep.steps(live=True)
    series = {t: sorted(map(str, frame["series"].tolist())) for t, frame in steps.groupby("trial_id", observed=True)}
    assert series["two"] == ["aaaa", "aaaa", "bbbb", "bbbb"], series
    assert steps.loc[steps["trial_id"] == "one", "series"].isna().all(), series


@pytest.mark.parametrize("status", ["RUNNING", "COMPLETE"])
def test_a_trial_that_logged_no_step_is_read_at_its_row_numbers_beside_trials_that_did(
    tmp_path: Path, status: str
) -> None:
    """Read alone, a series without a ``step`` is read at its row numbers. Beside a trial that logged one,
    its steps were all null, and its curve drew nothing."""
    from ray_cmf.report import content

    with_step = [{"step": 10 * s, "loss": 2.0 / (s + 1)} for s in range(3)]
    no_step = [{"loss": 1.0 / (s + 1)} for s in range(3)]
    store = write_trials(
        tmp_path / "store",
        [Trial("with_step", {}, {"": with_step}, status), Trial("no_step", {}, {"": no_step}, status)],
        metrics_name="m",
    )
    sweep = Sweep(store, metrics_name="m")
    steps = sweep.steps(live=True).set_index("trial_id")
    assert steps.loc["with_step", "step"].tolist() == [0, 10, 20]
    assert steps.loc["no_step", "step"].tolist() == [1, 2, 3]  # its SequenceNumber, as when read alone
    assert "SequenceNumber" not in steps.columns
    [section] = content(sweep, live=True)["data"]["sections"]
    assert {trace["meta"]: trace["x"] for trace in section["traces"]} == {
        "with_step": [0.0, 10.0, 20.0],
        "no_step": [1.0, 2.0, 3.0],
    }


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=5), st.booleans())
@example([(1, 4), (1, 2)], False)  # a retry from scratch that stops short of where the failed attempt got
@example([(1, 5), (3, 4), (2, 1)], False)  # restores from ever earlier checkpoints
@example([(1, 5), (1, 0)], True)  # a retry from scratch that fails before its first row
def test_a_later_attempt_supersedes_what_earlier_ones_logged_from_its_first_step_on(
    attempts: list[tuple[int, int]], recorded: bool
) -> None:
    """Attempt ``a`` logs ``count`` steps from ``start`` (a restore resumes at its checkpoint, a retry at the
    start). What earlier attempts logged from ``start`` on is not in the run any more: the read is the
    timeline of the last attempt, as TensorBoard purges the steps a restarted run logs again. Where the
    attempts ``recorded`` where they resumed, that holds for an attempt that logged no row too."""
    import pandas as pd

    from ray_cmf.attempts import dedup_attempts

    rows, timeline = [], []
    for attempt, (start, count) in enumerate(attempts, start=1):
        mine = [{"trial_id": "t", "step": start + i, "attempt": attempt, "v": attempt * 100 + i} for i in range(count)]
        rows += mine
        if mine or recorded:
            timeline = [r for r in timeline if r["step"] < start] + mine
    frame = pd.DataFrame(rows, columns=["trial_id", "step", "attempt", "v"])
    resumed = {"t": {a: start - 1 for a, (start, _) in enumerate(attempts, start=1) if a > 1}} if recorded else None
    read = dedup_attempts(frame, "step", by=["trial_id"], resumed=resumed)
    assert read[["step", "v"]].values.tolist() == [[r["step"], r["v"]] for r in timeline]


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=5), st.integers(1, 3))
@example([(1, 5), (3, 4)], 1)  # workers restarted from the checkpoint of step 2
def test_a_restarted_worker_group_supersedes_what_the_earlier_one_reported_from_its_first_step_on(
    groups: list[tuple[int, int]], attempt: int
) -> None:
    """Ray Train restarts a run's failed workers from its last checkpoint, within one attempt of the run: the
    reports of the earlier group from the restart's first step on stayed beside the later group's, and a
    trial's ``_best`` read a replaced report (found by a new user). A later worker group supersedes them as a
    later attempt does."""
    import pandas as pd

    from ray_cmf.attempts import dedup_attempts

    rows, timeline = [], []
    for group, (start, count) in enumerate(groups, start=1):
        mine = [
            {
                "trial_id": "t",
                "rank": r,
                "step": start + i,
                "attempt": attempt,
                "worker_group": group,
                "v": group * 100 + i,
            }
            for i in range(count)
            for r in range(2)
        ]
        rows += mine
        if mine:
            timeline = [row for row in timeline if row["step"] < start] + mine
    frame = pd.DataFrame(rows, columns=["trial_id", "rank", "step", "attempt", "worker_group", "v"])
    read = dedup_attempts(frame, "step", by=["trial_id", "rank"])
    expected = sorted(timeline, key=lambda row: (row["rank"], row["step"]))
    assert read.sort_values(["rank", "step"])[["rank", "step", "v"]].values.tolist() == [
        [row["rank"], row["step"], row["v"]] for row in expected
    ]


def test_a_trial_reads_in_logged_order_beside_a_retried_one(tmp_path: Path) -> None:
    """A trial whose step restarts each epoch read as logged (0, 1, 2, 0, 1, 2) alone, but sorted by step (0, 0,
    1, 1, 2, 2: its epochs interleaved) once another trial of the view had been retried: resolving that trial's
    attempts sorted every trial's rows by step (a new user). Every trial now reads in logged order."""
    epochs = [{"step": s, "epoch": e, "loss": 10.0 * e + s} for e in range(2) for s in range(3)]
    retried = [{"step": s, "loss": -1.0} for s in range(1, 4)]
    store = write_trials(
        tmp_path / "store", [Trial("e", series={"": epochs}), Trial("r", series={"": retried})], sweep="s", start=True
    )
    write_trials(tmp_path / "store", [Trial("r", series={"": [{"step": 2, "loss": -2.0}]})], sweep="s", start=True)
    steps = Sweep(store).steps(["epoch", "loss"]).set_index("trial_id")
    assert steps.loc["e", ["step", "epoch", "loss"]].values.tolist() == [
        [r["step"], r["epoch"], r["loss"]] for r in epochs
    ]
    assert steps.loc["r", ["step", "loss"]].values.tolist() == [[1, -1.0], [2, -2.0]]  # the retry's timeline
    [read] = [t for t in Sweep(store).trials(["loss"]).to_dict("records") if t["trial_id"] == "e"]
    assert (read["loss_final"], read["steps"]) == (12.0, 6)


def test_a_retried_trials_neighbours_read_bit_for_bit_in_logged_order(tmp_path: Path) -> None:
    """As above, with what real trials log: a unicode metric of NaN, ±inf, -0.0 and a subnormal, a key only
    some rows carry, and several executions (a retried one among them), read in logged order bit for bit."""
    values = [math.nan, math.inf, -0.0, 5e-324, -math.inf, 1.5]
    odd = [{"step": i % 3, "λ_ü": v, **({"extra": i} if i % 2 else {})} for i, v in enumerate(values)]
    plain = [{"step": s, "λ_ü": float(s)} for s in range(3)]
    trials = [Trial("odd", series={"": odd}), Trial("plain", series={"": plain}), Trial("r", series={"": plain})]
    store = write_trials(tmp_path / "store", trials, sweep="s", start=True)
    write_trials(tmp_path / "store", [Trial("r", series={"": plain[1:]})], sweep="s", start=True)  # a retry
    steps = Sweep(store).steps(["λ_ü", "extra"], exact=True)
    rows = steps[steps["trial_id"] == "odd"]
    assert rows["step"].tolist() == [r["step"] for r in odd]
    assert all(same(r["λ_ü"], v) for r, v in zip(odd, rows["λ_ü"].tolist(), strict=True))
    assert [None if pd.isna(v) else v for v in rows["extra"]] == [r.get("extra") for r in odd]
    assert steps[steps["trial_id"] == "r"]["λ_ü"].tolist() == [0.0, 1.0, 2.0]  # the retry's from step 1 on


_ATTEMPT_ROWS = st.lists(  # each row: logged with a step?, the step past the attempt's start, its value
    st.tuples(st.booleans(), st.integers(0, 3), floats), max_size=5
)


@given(st.lists(st.tuples(st.integers(1, 6), _ATTEMPT_ROWS), min_size=1, max_size=4))
@example([(1, [(True, i, 0.0) for i in range(4)]), (1, [(True, i, 1.0) for i in range(2)])])  # a retry, shorter
@example([(1, [(True, i, 0.0) for i in range(3)]), (2, [(False, 0, 1.0), (True, 0, 2.0)])])  # a stepless first row
@example([(1, [(True, 0, 0.0), (True, 0, 1.0), (True, 1, 2.0)])])  # one attempt that logs a step twice
@example([(1, [(True, 0, 0.0)]), (1, [(True, 0, 1.0), (True, 0, 2.0)])])  # and a retry that does
def test_a_series_read_by_its_cmf_is_its_latest_attempts_timeline(attempts: list[tuple[int, list[Any]]]) -> None:
    """``latest_attempt`` (what ``Cmf.read_metrics`` reads) keeps what ``Sweep.steps`` keeps, in logged order
    and bit for bit: a later attempt supersedes what earlier ones logged from its first step on; a row without
    a step is kept (nothing tells it re-logged), and so is each row of a step that one attempt logged twice
    (for each batch of an epoch, say), as in a trial that was never retried."""
    from ray_cmf.attempts import latest_attempt

    rows = [
        {"step": start + offset if stepped else None, "v": value, "attempt": attempt}
        for attempt, (start, logged) in enumerate(attempts, start=1)
        for stepped, offset, value in logged
    ]
    firsts = [
        min((r["step"] for r in rows if r["attempt"] == a and r["step"] is not None), default=None)
        for a in range(1, len(attempts) + 1)
    ]
    kept = []
    for r in rows:
        cut = min((f for f in firsts[r["attempt"] :] if f is not None), default=None)  # later attempts' first step
        if r["step"] is None or cut is None or r["step"] < cut:
            kept.append(r)
    table = pa.table(
        {
            "SequenceNumber": pa.array(range(1, len(rows) + 1), pa.int64()),
            "step": pa.array([r["step"] for r in rows], pa.int64()),
            "v": pa.array([r["v"] for r in rows], pa.float64()),
            "attempt": pa.array([r["attempt"] for r in rows], pa.int64()),
        }
    )
    read = latest_attempt(table, "inner")
    assert read.column_names == ["SequenceNumber", "step", "v"]
    assert read.column("step").to_pylist() == [r["step"] for r in kept]
    assert all(same(r["v"], v) for r, v in zip(kept, read.column("v").to_pylist(), strict=True))


@pytest.mark.parametrize("scanned_for", ["a Train run's ranks", "a live read"])
def test_an_int_metric_keeps_its_ints_beside_a_trial_that_logged_it_as_floats(tmp_path: Path, scanned_for: str) -> None:
    """A trial that logged ``mix`` as ints read ``mix_best``/``mix_final`` as floats (2.0, and 2**53 + 1
    rounded) when another trial of the sweep logged it as floats and the table was read by a scan of every
    trial's rows (a trial Tune retried, a Train run's ranks, a live read: what the files' footers cannot
    summarise), though the same trials read from their footers kept 2 and 2**53 + 1 (a new user's, with a
    retried trial). Each trial's values are now read in its own types."""
    ranked = scanned_for == "a Train run's ranks"
    big = 2**53 + 1  # an int a float cannot hold
    ints = [{"training_iteration": i, "mix": v} for i, v in enumerate([2, 3, 4, big], start=1)]
    floats_ = [{"training_iteration": i, "mix": i * 0.5} for i in range(1, 4)]
    if ranked:
        ints, floats_ = ([{**row, "rank": rank} for row in rows for rank in (0, 1)] for rows in (ints, floats_))
    trials = [Trial("int", series={"tune_results": ints}), Trial("float", series={"tune_results": floats_})]
    store = write_trials(tmp_path / "store", trials)
    table = Sweep(store).trials(live=not ranked).set_index("trial_id")
    assert [(type(v), v) for v in table.loc["int", ["mix_best", "mix_final"]]] == [(int, 2), (int, big)]
    assert table.loc["float", ["mix_best", "mix_final"]].tolist() == [0.5, 1.5]


def test_a_running_series_that_logs_a_step_more_than_once_reads_live_as_it_reads_committed(tmp_path: Path) -> None:
    """A run that logs a row per batch under its epoch's ``step`` read live (``steps(live=True)``, the served
    report, ``trials(live=True)``) one row per step, 3 where it had logged 9 and its committed read gave 9:
    rows that its spill and its committed version both held were told apart by their step, not by the row."""
    cmf = Cmf(pipeline_name="p", store=str(tmp_path / "store"))
    cmf.create_execution("Train")
    for epoch in range(3):
        for batch in range(3):
            cmf.log_metric("s", {"step": epoch, "batch": batch, "loss": epoch + batch / 10})
        if epoch == 1:
            cmf.commit_metrics("s")  # epochs 0 and 1 committed, and epoch 2 only spilled
    cmf.flush()
    sweep = Sweep(tmp_path / "store", metrics_name="s")
    live = sweep.steps(live=True)
    assert live[["step", "batch", "loss"]].values.tolist() == [[e, b, e + b / 10] for e in range(3) for b in range(3)]
    assert list(live.columns) == ["trial_id", "step", "batch", "loss"]
    assert sweep.trials(live=True)["steps"].tolist() == [9]
    cmf.commit_metrics("s")
    assert Sweep(tmp_path / "store", metrics_name="s").steps().equals(live)


def test_two_running_runs_with_ragged_non_finite_unicode_rows_read_live_as_committed(tmp_path: Path) -> None:
    """The live read tells rows apart by run and row number: two executions of one series name, each logging
    several rows per step, a unicode metric of NaN, inf and -0.0, and a key only some rows carry, read live
    bit for bit as they read once committed."""
    logged: dict[str, list[dict[str, Any]]] = {}
    cmfs = []
    for run, values in (("a", [math.nan, math.inf, -0.0]), ("b", [-math.inf, 5e-324, 1.5])):
        cmf = Cmf(pipeline_name="p", store=str(tmp_path / "store"))
        cmf.create_execution("Train", execution_name=run, create_new_execution=False)
        rows = [
            {"step": epoch, "损失": values[batch], **({"lr": 0.1 * epoch} if batch == 0 else {})}
            for epoch in range(3)
            for batch in range(3)
        ]
        for i, row in enumerate(rows):
            cmf.log_metric("s", row)
            if i == 5:
                cmf.commit_metrics("s")
        cmf.flush()
        logged[run], cmfs = rows, [*cmfs, cmf]
    live = Sweep(tmp_path / "store", metrics_name="s").steps(live=True)
    for cmf in cmfs:
        cmf.commit_metrics("s")
    committed = Sweep(tmp_path / "store", metrics_name="s").steps()
    for frame in (live, committed):
        for run, rows in logged.items():
            mine = frame[frame["trial_id"] == run]
            assert mine["step"].tolist() == [r["step"] for r in rows]
            for key in ("损失", "lr"):
                assert all(same(r.get(key), v) for r, v in zip(rows, column_of(mine, key, 0), strict=True)), key


def test_a_trial_table_of_many_metrics_reads_without_warnings(tmp_path: Path) -> None:
    """``Sweep.trials()`` of trials with 60 metrics printed pandas' "DataFrame is highly fragmented"
    PerformanceWarning over and over (a new user's Train runs): it built the table a column at a time."""
    rows = [
        {"training_iteration": i, "rank": r, **{f"m{k}": k + i / 10 + r for k in range(60)}}
        for i in range(1, 4)
        for r in range(2)
    ]
    store = write_trials(tmp_path / "store", [Trial("a", series={"tune_results": rows})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [trial] = Sweep(store).trials().to_dict("records")
    assert (trial["m59_final"], trial["m0_best"], trial["steps"]) == (59.3, 0.1, 3)  # rank 0's, as Train reads


def test_plotting_a_metric_that_reads_as_text_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A metric one trial logged as floats and another as bools reads as text: ``plot`` failed with a
    traceback (could not convert string to float: 'true') where the other commands name the metric."""
    store = write_trials(
        tmp_path / "store",
        [
            Trial("floats", {}, {"": [{"step": s, "m": 0.5 * s, "loss": 1.0} for s in range(3)]}),
            Trial("bools", {}, {"": [{"step": s, "m": s % 2 == 0, "loss": 1.0} for s in range(3)]}),
        ],
        metrics_name="m_series",
    )
    with pytest.raises(InvalidArgumentError, match=r"'m' .*not numbers"):
        Sweep(store, metrics_name="m_series").plot_curves("m", tmp_path / "m.png")
    out = str(tmp_path / "m.png")
    code = main(["--store", str(store.root), "plot", "--metrics-name", "m_series", "--metric", "m", "-o", out])
    assert code == 2 and "'m'" in capsys.readouterr().err and not (tmp_path / "m.png").exists()


def test_every_trial_table_shows_an_error_as_its_exception_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compare`` printed a failed trial's whole traceback in its table (47 lines for 8 trials) where
    ``trials`` prints the exception's line; ``--json`` keeps the whole text in both."""
    trace = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    step()\n'
    error = trace + "RuntimeError: diverged at step 2"
    rows = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(3)]
    store = write_trials(
        tmp_path / "store", [Trial("ok", {}, {"": rows}), Trial("bad", {}, {"": rows}, "FAILED", error)]
    )
    root = str(store.root)
    for command in (["trials"], ["compare", "--metric", "loss", "--top", "2"]):
        assert main(["--store", root, *command]) == 0
        out = capsys.readouterr().out
        assert "RuntimeError: diverged at step 2" in out and "Traceback" not in out, command
        assert "NaN" not in out, out  # the trial without an error: a blank cell, as every other missing value
        code, rows_read = _cli(capsys, "--store", root, *command)
        assert code == 0 and {r["trial_id"]: r["error"] for r in rows_read}["bad"] == error, command


def test_each_trial_is_summarised_by_its_own_sweeps_mode_when_the_sweeps_of_a_pipeline_disagree(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sweeps of one pipeline rank ``score`` both ways: every trial's ``score_best`` was by the first
    sweep's mode, so the second sweep's best contradicted its own ranking. Each trial is now read by its own
    sweep's mode, and the reader is told that the two disagree."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY

    rows = [{"step": s, "score": v} for s, v in enumerate([1.0, 5.0, 3.0])]
    store_dir = tmp_path / "store"
    for stage, mode in (("sweep_min", "min"), ("sweep_max", "max")):
        ranked = {RANKED_BY_PROPERTY: "score", RANKED_MODE_PROPERTY: mode}
        write_trials(store_dir, [Trial(f"t_{mode}", {}, {"": rows}, props=ranked)], stage=stage)
    table = Sweep(store_dir).trials(["score"]).set_index("trial_id")
    assert table.loc["t_min", "score_best"] == 1.0 and table.loc["t_max", "score_best"] == 5.0
    assert "'score'" in caplog.text and "its own sweep" in caplog.text
    for stage, best in (("sweep_min", 1.0), ("sweep_max", 5.0)):  # one sweep alone: as before, no warning
        caplog.clear()
        [row] = Sweep(store_dir, stage=stage).trials(["score"]).to_dict(orient="records")
        assert row["score_best"] == best and "its own sweep" not in caplog.text
    explicit = Sweep(store_dir).trials(["score"], mode="max").set_index("trial_id")  # a mode asked for: for all
    assert explicit["score_best"].tolist() == [5.0, 5.0]
    best = Sweep(store_dir).best("score", n=2).set_index("trial_id")  # it read every trial by the first's mode
    assert best.loc["t_min", "score_best"] == 1.0 and best.loc["t_max", "score_best"] == 5.0
    assert Sweep(store_dir).best("score", "max", n=2)["score_best"].tolist() == [5.0, 5.0]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_train_runs_reports_summarise_as_ray_train_reads_them_from_rank_0(tmp_path: Path, mode: str) -> None:
    """Every rank's copy of a Train report sits in one series (``rank`` tells them apart); Ray Train's
    result is rank 0's, so the run's best, final and step count are rank 0's, whichever rank came last."""
    rows = [{"report": i, "rank": r, "worker_group": 1, "loss": float(10 * r + i)} for i in (1, 2, 3) for r in (0, 1)]
    store = write_trials(tmp_path / "store", [Trial("run", {}, {"": rows})], metrics_name="train_reports")
    sweep = Sweep(store, metrics_name="train_reports")
    [row] = sweep.trials(["loss"], mode=mode).to_dict(orient="records")
    assert (row["loss_best"], row["loss_final"], row["steps"]) == (1.0 if mode == "min" else 3.0, 3.0, 3)
    assert sorted(sweep.steps(["loss"])["rank"]) == [0, 0, 0, 1, 1, 1]  # every rank's rows are still read


def test_a_sweep_kept_while_its_trials_run_reads_them_as_they_are_now_with_live_or_refresh(tmp_path: Path) -> None:
    """A notebook keeps one Sweep and asks it again while the sweep runs: ``steps(live=True)`` returned the
    trials and versions that existed when the Sweep was made (a trial started later was missing, a later
    commit unseen), and ``trials()`` kept a finished trial RUNNING, and summarised no uncommitted row.
    ``live=True`` reads the store as it is now, and ``refresh()`` makes every read do so; a view of some
    trials stays that view."""

    def rows(*steps: int) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i, "loss": 1.0 / i} for i in steps]}

    write_trials(tmp_path / "store", [Trial("a", {"lr": 0.1}, rows(1, 2), status="RUNNING")])
    sweep = Sweep(tmp_path / "store")
    view = sweep.only(["a"])
    assert sweep.steps(live=True)["trial_id"].tolist() == ["a", "a"]
    assert sweep.trials()["status"].tolist() == ["RUNNING"]
    [running] = sweep.trials(["loss"], live=True).to_dict(orient="records")  # "Unknown metric": none committed
    assert (running["steps"], running["loss_best"]) == (2, 0.5)
    write_trials(
        tmp_path / "store", [Trial("a", {"lr": 0.1}, rows(3)), Trial("b", {"lr": 0.2}, rows(1), status="RUNNING")]
    )  # a continues (its spilled rows are adopted) and ends; b starts
    live = sweep.steps(live=True)
    assert sorted(live["trial_id"]) == ["a", "a", "a", "b"] and live.query("trial_id == 'a'")["step"].tolist() == [
        1,
        2,
        3,
    ]
    assert sorted(sweep.refresh().trials()["status"]) == ["COMPLETE", "RUNNING"]
    assert sweep.trials().set_index("trial_id")["steps"].to_dict() == {"a": 3, "b": 0}  # b's row is not committed
    now = sweep.trials(live=True).set_index("trial_id")  # summarised as steps(live=True) reads them
    assert now["steps"].to_dict() == {"a": 3, "b": 1} and now.loc["b", "loss_final"] == 1.0
    assert sweep.best("loss", n=2, live=True)["loss_best"].tolist() == [1 / 3, 1.0]  # b's uncommitted 1.0 counts
    assert set(view.steps(live=True)["trial_id"]) == {"a"} and view.refresh().trials()["trial_id"].tolist() == ["a"]
    write_trials(tmp_path / "store", [Trial("c", {"lr": 0.3}, rows(1))], stage="second")  # a sweep into a new stage
    assert sorted(sweep.refresh().trials()["trial_id"]) == ["a", "b", "c"]  # it stayed unseen (a new user's find)
    assert sorted(sweep.steps(live=True)["trial_id"].unique()) == ["a", "b", "c"]


def test_show_shows_a_trial_whatever_its_series_are_called(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ray-cmf show TRIAL`` of a store whose series are two of a script's own (no Tune results, no Train
    steps) failed with "name one of them": showing a trial needs no series, only its last rows do."""
    rows = {"": [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)]}
    write_trials(tmp_path / "store", [Trial("t", {"lr": 0.1}, rows)], metrics_name="train")
    write_trials(tmp_path / "store", [Trial("u", {"lr": 0.2}, rows)], metrics_name="eval")
    code, shown = _cli(capsys, "show", "t", "--store", str(tmp_path / "store"))
    assert code == 0 and shown["config"] == {"lr": 0.1} and [r["loss"] for r in shown["last_rows"]] == [1.0, 0.5, 1 / 3]
    assert main(["show", "t", "--store", str(tmp_path / "store"), "--metrics-name", "nope"]) != 0  # named: an error
    assert "'nope'" in capsys.readouterr().err


def test_trials_without_a_metric_rank_best_first_by_the_metric_the_sweep_ranked_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``CmfRayLogger(metric="val_loss", modes={"acc": "max"})``: ``ray-cmf trials`` listed the trials by
    ``acc`` (the first metric any logger declared), where the README says by the metric the sweep ranked by."""
    from ray_cmf.constants import MODE_PREFIX, RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY

    declared = {RANKED_BY_PROPERTY: "val_loss", RANKED_MODE_PROPERTY: "min", MODE_PREFIX + "acc": "max"}
    results = {"a": (0.3, 0.9), "b": (0.1, 0.5), "c": (0.2, 0.7)}  # val_loss ranks b, c, a; acc ranks a, c, b
    trials = [
        Trial(t, {}, {"": [{"training_iteration": 1, "val_loss": loss, "acc": acc}]}, props=declared)
        for t, (loss, acc) in results.items()
    ]
    store = write_trials(tmp_path / "store", trials)
    code, rows = _cli(capsys, "trials", "--store", str(store.root))
    assert code == 0 and [r["trial_id"] for r in rows] == ["b", "c", "a"]
    assert list(Sweep(store).modes()) == ["val_loss", "acc"]


def test_compare_and_plot_rank_by_the_sweeps_metric_when_none_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ray-cmf trials`` ranks best first by the metric the sweep's CmfRayLogger ranked by, but ``compare``
    and ``plot`` refused to run without ``--metric``; they now take that metric too, and say which metrics
    there are when no logger declared one."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY

    declared = {RANKED_BY_PROPERTY: "acc", RANKED_MODE_PROPERTY: "max"}
    results = {"a": (0.3, 0.9), "b": (0.1, 0.5), "c": (0.2, 0.7)}
    rows = {t: [{"training_iteration": 1, "val_loss": loss, "acc": acc}] for t, (loss, acc) in results.items()}
    ranked = write_trials(tmp_path / "ranked", [Trial(t, {}, {"": r}, props=declared) for t, r in rows.items()])
    code, top = _cli(capsys, "compare", "--store", str(ranked.root), "--top", "2")
    assert code == 0 and [r["trial_id"] for r in top] == ["a", "c"] and top[0]["acc_best"] == 0.9
    assert main(["compare", "--store", str(ranked.root), "--top", "2"]) == 0
    assert "top 2 by acc (max)" in capsys.readouterr().out
    code, [plotted] = _cli(capsys, "plot", "--store", str(ranked.root), "-o", str(tmp_path / "acc.png"))
    assert code == 0 and Path(plotted["plot"]).stat().st_size > 0
    plain = write_trials(tmp_path / "plain", [Trial(t, {}, {"": r}) for t, r in rows.items()])
    for command in (["compare"], ["plot", "-o", str(tmp_path / "x.png")]):
        assert main([*command, "--store", str(plain.root)]) == 2
        err = capsys.readouterr().err
        assert "--metric" in err and "'acc'" in err and "'val_loss'" in err, err
    assert not (tmp_path / "x.png").exists()


def test_the_metric_a_sweep_ranks_by_is_the_same_in_every_process(tmp_path: Path) -> None:
    """A StepLogger run whose collection holds three ``Accuracy`` metrics (each declares ``max``): ``trials`` ranked
    by ``acc`` in one process and ``acc_p`` in the next, since an execution's properties come back in an order
    that changes between processes (found by a new user). Of one execution's declarations, the first by name."""
    import subprocess
    import sys

    from ray_cmf.constants import MODE_PREFIX

    declared = {MODE_PREFIX + name: "max" for name in ("acc_p", "acc1", "acc", "samples_per_s")}
    rows = [{"step": 1, "acc": 0.5, "acc1": 0.7, "acc_p": 0.9, "samples_per_s": 10.0}]
    store = write_trials(tmp_path / "store", [Trial("run", {}, {"": rows}, props=declared)], metrics_name="steps")
    probe = (
        "import sys; from ray_cmf import Sweep; "
        "s = Sweep(sys.argv[1], metrics_name='steps'); print(s.ranked_metric(), list(s.modes()))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", probe, str(store.root)],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in range(6)
    }
    assert seen == {"acc ['acc', 'acc1', 'acc_p', 'samples_per_s']"}, seen


def test_a_sweep_whose_trials_have_no_result_yet_reads_its_declared_metric_as_blank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a sweep's first seconds (no result has reached the store), ``trials(["val_loss"], live=True)`` and
    ``best("val_loss", live=True)`` raised "Unknown metric(s) ['val_loss'] ... read with live=True" (passed
    already), and ``compare`` said no logger declared a metric, while ``modes()`` gave the logger's val_loss
    (found by a new user). A metric a logger declared is known before its first value: blank until then."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY

    declared = {RANKED_BY_PROPERTY: "val_loss", RANKED_MODE_PROPERTY: "min"}
    trials = [Trial(t, {"lr": lr}, {}, status="RUNNING", props=declared) for t, lr in (("a", 0.1), ("b", 0.2))]
    store = write_trials(tmp_path / "store", trials)
    sweep = Sweep(store)
    assert sweep.ranked_metric() == "val_loss"
    for live in (True, False):
        table = sweep.trials(["val_loss"], live=live)
        assert table["trial_id"].tolist() == ["a", "b"] and table["val_loss_best"].isna().all(), table
        assert len(sweep.best("val_loss", n=2, live=live)) == 2
        assert sweep.steps(["val_loss"], live=live).empty
    code, top = _cli(capsys, "compare", "--store", str(store.root))
    assert code == 0 and [row["trial_id"] for row in top] == ["a", "b"]
    assert main(["plot", "--store", str(store.root), "-o", str(tmp_path / "p.png")]) == 2  # "Unknown metric"
    assert "No trial of these 2 logged 'val_loss': there is no curve to plot" in capsys.readouterr().err
    with pytest.raises(RayCmfError, match=r"Unknown metric\(s\) \['val_acc'\]"):
        sweep.steps(["val_acc"])
    with pytest.raises(RayCmfError, match=r"Unknown metric\(s\) \['val_acc'\]"):
        sweep.trials(["val_acc"], live=True)  # what no logger declared is still unknown


def test_a_step_column_logged_beside_the_step_is_read_back_as_data(tmp_path: Path) -> None:
    """``training_iteration`` or ``report`` logged beside a ``step`` read back as all nulls (a step column
    that was not the row's step was dropped), and a Train loop's own ``training_iteration`` became its
    reports' step, at other steps on every rank. The step is the one logged, else the report index; the
    others are data, read when asked for."""
    logged = [{"step": s, "training_iteration": 100 + s, "report": 1000 + s, "loss": 1.0 / s} for s in (1, 2, 3)]
    store = write_trials(tmp_path / "store", [Trial("cmf", {}, {"": logged})], metrics_name="mine")
    steps = Sweep(store, metrics_name="mine").steps(["training_iteration", "report", "loss"])
    assert steps["step"].tolist() == [1, 2, 3] and steps["training_iteration"].tolist() == [101, 102, 103]
    assert steps["report"].tolist() == [1001, 1002, 1003]
    reports = [{"report": i, "rank": r, "training_iteration": 80_000 + 100 * r + i} for i in (1, 2) for r in (0, 1)]
    write_trials(tmp_path / "store", [Trial("run", {}, {"": reports})], metrics_name="train_reports")
    read = Sweep(store, metrics_name="train_reports").steps(["rank", "training_iteration"])
    assert sorted(read[["rank", "step", "training_iteration"]].values.tolist()) == [
        [r, i, 80_000 + 100 * r + i] for r in (0, 1) for i in (1, 2)
    ]


def test_runs_that_no_restart_made_are_never_replaced(tmp_path: Path) -> None:
    """Two scripts' ``Cmf`` runs of one pipeline (no Tune, no trial ids): the newer read as REPLACED by the
    older, since neither names a trial it replaced and "none" matched "none" (found by a new user)."""
    from ray_cmf import Cmf

    for lr in (0.1, 0.2):
        cmf = Cmf(pipeline_name="p", store=tmp_path / "store")
        cmf.create_execution("Train", {"lr": lr})
        cmf.log_metric("m", {"step": 1, "loss": lr})
        cmf.commit_metrics("m")
        cmf.close()
    table = Sweep(tmp_path / "store", metrics_name="m").trials()
    assert table["status"].tolist() == ["COMPLETE", "COMPLETE"] and "replaced_by" not in table.columns


def test_a_replaced_trial_is_ranked_after_every_other_in_each_best_first_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial that ``restart_errored`` replaced is never best, yet it headed ``ray-cmf trials`` and the
    report's table (best first) with its discarded best loss (found by a new user)."""
    from ray_cmf.constants import RANKED_BY_PROPERTY, RANKED_MODE_PROPERTY, RESTARTED_FROM_PROPERTY

    ranked = {RANKED_BY_PROPERTY: "loss", RANKED_MODE_PROPERTY: "min"}

    def losses(*values: float) -> dict[str, list[dict[str, Any]]]:
        return {"": [{"training_iteration": i + 1, "loss": v} for i, v in enumerate(values)]}

    trials = [
        Trial("old", {"x": 1}, losses(-1.0), status="FAILED", error="boom", props=ranked),
        Trial("new", {"x": 1}, losses(0.5), props={**ranked, RESTARTED_FROM_PROPERTY: "old"}),
        Trial("other", {"x": 2}, losses(0.7), props=ranked),
    ]
    store = write_trials(tmp_path / "store", trials)
    sweep = Sweep(store)
    assert sweep.trials(sort="loss_best")["trial_id"].tolist() == ["new", "other", "old"]
    code, rows = _cli(capsys, "trials", "--store", str(store.root))
    assert code == 0 and [r["trial_id"] for r in rows] == ["new", "other", "old"]
    assert [r["status"] for r in rows] == ["COMPLETE", "COMPLETE", "REPLACED"] and rows[2]["replaced_by"] == "new"
    groups = sweep.trials(group_by="config/x").set_index("config/x")  # its discarded results are no seed's
    assert groups.loc[1, "loss_best_mean"] == 0.5 and groups.loc[1, "trials"] == 1
    page = sweep.report(tmp_path / "r.html").read_text()
    assert [page.index(f'data-trial="{t}"') for t in ("new", "other", "old")] == sorted(
        page.index(f'data-trial="{t}"') for t in ("new", "other", "old")
    )
    data = json.loads(re.search(r"let DATA = (.*);\n", page).group(1))  # type: ignore[union-attr]
    [x] = [d for d in data["parcoords"]["dimensions"] if d["label"] == "x"]  # nor in what config does (a new user's)
    assert len(x["values"]) == 2 and [p["trace"]["text"] for p in data["params"]] == [["new", "other"]]


def test_the_reports_table_shows_a_logged_nan_apart_from_a_missing_value(tmp_path: Path) -> None:
    """A config value or execution metric that was NaN and one that was never recorded were both an empty cell
    of the report's table, where every other view tells them apart (found by a new user)."""
    rows = {"": [{"training_iteration": 1, "loss": 0.5}]}
    trials = [Trial("nan", {"eps": math.nan}, rows, final={"score": math.nan}), Trial("none", {"x": 1}, rows)]
    page = Sweep(write_trials(tmp_path / "store", trials)).report(tmp_path / "r.html").read_text()
    header = re.search(r'<table id="trials"><thead><tr>(.*?)</tr>', page)
    assert header is not None
    columns = re.findall(r"<th[^>]*>(.*?)</th>", header.group(1))

    def cells(trial: str) -> dict[str, str]:
        row = re.search(rf'<tr data-trial="{trial}"[^>]*>(.*?)</tr>', page)
        assert row is not None
        return dict(zip(columns, re.findall(r"<td[^>]*>(.*?)</td>", row.group(1)), strict=True))

    assert (cells("nan")["config/eps"], cells("none")["config/eps"]) == ("NaN", "")
    assert (cells("nan")["metrics/final/score"], cells("none")["metrics/final/score"]) == ("NaN", "")


def test_a_metric_of_ints_in_one_trial_and_floats_in_another_summarises_as_floats(tmp_path: Path) -> None:
    """``steps()`` read such a metric as floats, as the README says, but ``trials()`` gave its ``_best`` and
    ``_final`` an object column of ints and floats: ``describe()`` and ``select_dtypes`` left it out, and
    ``nlargest`` raised (a new user). Ints beyond float64's exact range still keep their column exact."""
    store = tmp_path / "store"
    logged = {"a": [1, 2, 3], "b": [1.5, 2.5, 3.5], "c": [2**60 + 1, 2**60 + 3, 2**60 + 5], "d": [7, 8, 9]}
    for name, values in logged.items():
        with Cmf(pipeline_name="p", store=store) as cmf:
            cmf.create_execution("trial", execution_name=name)
            for step, value in enumerate(values):
                key = "m" if name in ("a", "b") else "big" if name in ("b", "c") else "n"
                cmf.log_metric("s", {"step": step, key: value, **({"big": 0.5} if name == "b" else {})})
            cmf.commit_metrics("s")
    for live in (False, True):
        table = Sweep(store, metrics_name="s").trials(live=live).set_index("trial_id")
        assert table["m_best"].dtype == np.float64 and table["m_final"].dtype == np.float64, live
        assert table.loc[["a", "b"], "m_best"].tolist() == [1.0, 1.5] and table.loc[["a", "b"], "m_final"].tolist() == [
            3.0,
            3.5,
        ]
        assert table["m_final"].nlargest(1).index.tolist() == ["b"]
        assert table.loc["c", "big_best"] == 2**60 + 1 and type(table.loc["c", "big_best"]) is int  # exact
        assert table["n_final"].dtype == object and table.loc["d", "n_final"] == 9  # ints beside blanks stay ints


def test_a_spill_of_a_newer_version_is_named_not_skipped_unsaid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A team upgrades one machine at a time: a live read left out the rows of a spill whose manifest a newer
    ray_cmf wrote, without a word (its rows were missing, the trial read as shorter), and ``recover`` said the
    manifest "cannot be read" with a TypeError. Both name the spill and say a newer version wrote it; the spill
    is left for that version, which alone knows what its fields ask."""
    from ray_cmf import Store, recover
    from ray_cmf.constants import SPILL_DIR, SPILL_MANIFEST
    from ray_cmf.errors import RecoveryError

    rows = [{"training_iteration": i, "loss": 1.0 / i} for i in (1, 2, 3)]
    store = tmp_path / "store"
    write_trials(store, [Trial("done", {}, {"": rows}), Trial("live", {}, {"": rows}, "RUNNING")])
    [manifest] = (store / SPILL_DIR).glob(f"*/{SPILL_MANIFEST}")
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "checksum_kind": "xxh3"}))
    steps = Sweep(store).steps(live=True)
    assert set(steps["trial_id"]) == {"done"}
    said = [r.getMessage() for r in caplog.records if "newer" in r.getMessage()]
    assert said and manifest.parent.name in said[0] and "['checksum_kind']" in said[0], said
    with pytest.raises(RecoveryError, match=r"written by a newer ray_cmf: it holds \['checksum_kind'\]"):
        recover(Store(store))
    assert manifest.is_file()  # left for the version that wrote it


def test_steps_of_a_trial_the_sweep_lacks_is_an_error(tmp_path: Path) -> None:
    """``steps(trials=["trial_u0"])`` (the trial is ``trial_ü0``) gave an empty frame, and ``["run05", "qqq"]``
    run05's rows, without a word about the trial it lacks (a new user's); ``only`` refused both."""
    rows = [{"training_iteration": i, "loss": 1.0 / i} for i in (1, 2)]
    write_trials(tmp_path / "store", [Trial(name, {}, {"": rows}) for name in ("trial_ü0", "run05")])
    sweep = Sweep(tmp_path / "store")
    with pytest.raises(RayCmfError, match=r"Unknown trial\(s\) \['trial_u0'\] .*did you mean 'trial_ü0'"):
        sweep.steps(trials=["trial_u0"])
    with pytest.raises(RayCmfError, match=r"Unknown trial\(s\) \['qqq'\]"):
        sweep.steps(trials=["run05", "qqq"])
    assert len(sweep.steps(trials=["run05"])) == 2


@pytest.mark.parametrize("ranks", [(0,), (0, 1)])  # one rank: its trial's summary comes from the files' footers
def test_workers_restarted_within_one_attempt_read_as_the_restart_left_them(
    tmp_path: Path, ranks: tuple[int, ...]
) -> None:
    """Ray Train restarted a run's failed workers (``FailureConfig``) from its checkpoint at step 65, in the same
    attempt of the run: the restarted group's report of step 80 stayed beside the one the failed group made,
    since the reads resolved restarts only where some row's attempt was above 1 (a new user's run). A later
    worker group supersedes the earlier one's reports from its first step on, whatever the attempt."""
    from ray_cmf.attempts import latest_attempt

    def reports(group: int, steps: list[int]) -> list[dict[str, Any]]:
        loss = {1: lambda s: math.nan if s == 40 else 5000.0 + s, 2: lambda s: -math.inf if s == 100 else 2000.0 + s}
        return [
            {
                "step": s,
                "rank": r,
                "worker_group": group,
                "loss": loss[group](s),
                **({"acc": 0.5} if group == 2 else {}),
            }
            for s in steps
            for r in ranks
        ]

    rows = reports(1, [20, 40, 60, 80]) + reports(2, [80, 100])  # group 2's acc: a column group 1 lacks
    other = [{"step": s, "rank": 0, "worker_group": 1, "lös_ü": float(s)} for s in (1, 2)]  # never restarted
    trials = [Trial("run", {}, {"": rows}), Trial("ünï", {}, {"": other})]
    store = write_trials(tmp_path / "store", trials, metrics_name="train_reports", start=True)
    sweep = Sweep(store, metrics_name="train_reports")
    assert sweep.steps(["lös_ü"], trials=["ünï"])["lös_ü"].tolist() == [1.0, 2.0]
    read = sweep.only(["run"]).steps(["loss", "worker_group", "attempt"])
    assert set(read["attempt"]) == {1}
    assert read[read["rank"] == 0][["step", "worker_group"]].values.tolist() == [
        [20, 1],
        [40, 1],
        [60, 1],
        [80, 2],
        [100, 2],
    ]
    [row] = sweep.only(["run"]).trials(["loss"], mode="max").to_dict(orient="records")
    assert (row["loss_best"], row["loss_final"], row["steps"]) == (5060.0, -math.inf, 5)  # 5080 was superseded
    table = pa.Table.from_pylist([{**r, "attempt": 1} for r in rows])
    kept = latest_attempt(table, "train_reports").to_pylist()
    assert [(r["step"], r["worker_group"]) for r in kept if r["rank"] == 0] == [
        (20, 1),
        (40, 1),
        (60, 1),
        (80, 2),
        (100, 2),
    ]
