"""Helpers shared by the benchmarks: timing, the sweep-size arguments, table printing and saving results."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def per_call(fn: Callable[[int], None], calls: int, repeats: int = 1) -> float:
    """Mean seconds per call of ``fn(i)`` over ``calls`` calls; with ``repeats``, the least of that many such
    windows, one after another (as ``timeit`` advises: the others measure the machine's interference)."""
    means = []
    for r in range(repeats):
        start = time.perf_counter()
        for i in range(r * calls, (r + 1) * calls):
            fn(i)
        means.append((time.perf_counter() - start) / calls)
    return min(means)


TUNE_HOOKS = ("on_trial_start", "on_trial_result", "on_trial_complete", "on_trial_error", "on_experiment_end")


def timed_hooks(callback: T, record: Callable[[str, float], None], hooks: tuple[str, ...] = TUNE_HOOKS) -> T:
    """Wrap a Tune callback's ``hooks`` so that each call reports its hook's name and duration to ``record``
    (after the hook returned)."""
    for name in hooks:
        hook = getattr(callback, name)

        def wrapped(*args: Any, __hook: Any = hook, __name: str = name, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return __hook(*args, **kwargs)
            finally:
                record(__name, time.perf_counter() - start)

        setattr(callback, name, wrapped)
    return callback


def fmt_time(seconds: float) -> str:
    """A duration with a sensible unit."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a plain Markdown table."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [line(headers), "|" + "---|" * len(headers), *map(line, rows)]


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """A plain Markdown table (pastes straight into RESULTS.md)."""
    print("\n".join(markdown_table(headers, rows)))


def timed(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    """The best wall time of ``repeat`` calls of ``fn``, and what the last call returned."""
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def sweep_size(steps: int, trials: int = 500) -> argparse.Namespace:
    """``--trials`` (default ``trials``) and ``--steps`` (default ``steps``) from the command line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--steps", type=int, default=steps)
    return parser.parse_args()


def command_line(script: str, args: argparse.Namespace | None = None) -> str:
    """The command that reproduces a run: the benchmark's script, then each argument with the value it had
    (an empty or unset one left out)."""
    given = {name: value for name, value in vars(args).items() if value not in ("", None)} if args else {}
    flags = [f"--{name.replace('_', '-')} {value}" for name, value in given.items()]
    return " ".join([f"benchmarks/{Path(script).name}", *flags])


def save_results(
    name: str,
    command: str,
    figures: dict[str, Any],
    verdicts: dict[str, bool],
    tables: list[dict[str, Any]] | None = None,
) -> Path:
    """Write a benchmark's figures, its verdicts against its targets and the tables it printed (each a title,
    headers and rows) to ``benchmarks/results/<name>.json`` (what ``render_results.py`` turns into RESULTS.md's
    tables)."""
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    record = {
        "benchmark": name,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "figures": figures,
        "verdicts": verdicts,
        **({"tables": tables} if tables else {}),
    }
    out.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return out


class Results:
    """What one run of a benchmark saves: the tables it prints, its figures and its verdicts against its targets.

    ``table`` prints as ``print_table`` does and keeps the table; ``figure`` keeps raw numbers (seconds, ratios)
    beside the formatted tables; ``save`` prints the verdicts and writes everything through ``save_results``."""

    def __init__(self, name: str, command: str) -> None:
        self.name, self.command = name, command
        self.figures: dict[str, Any] = {}
        self.verdicts: dict[str, bool] = {}
        self.tables: list[dict[str, Any]] = []

    def table(self, title: str, headers: list[str], rows: list[list[str]]) -> None:
        """Print a Markdown table and keep it under ``title``."""
        print_table(headers, rows)
        self.tables.append({"title": title, "headers": headers, "rows": rows})

    def figure(self, name: str, values: dict[str, Any]) -> None:
        """Keep one row of figures, ``name`` and its values by column."""
        self.figures[name] = values

    def verdict(self, target: str, met: bool) -> None:
        """Keep whether ``target`` was met."""
        self.verdicts[target] = bool(met)

    def save(self) -> Path:
        """Print the verdicts, then write the results to ``benchmarks/results/<name>.json``."""
        for target, met in self.verdicts.items():
            print(f"target {target}: {'met' if met else 'NOT met'}")
        out = save_results(self.name, self.command, self.figures, self.verdicts, self.tables)
        print(f"results: {out}")
        return out
