"""Helpers shared by the benchmarks: timing and table printing."""

from __future__ import annotations

import time
from collections.abc import Callable


def per_call(fn: Callable[[int], None], calls: int) -> float:
    """Mean seconds per call of ``fn(i)`` over ``calls`` calls."""
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def fmt_time(seconds: float) -> str:
    """A duration with a sensible unit."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """A plain Markdown table (pastes straight into RESULTS.md)."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")
