"""How a table's cells read, so that no two different values read alike: a float gets few significant digits
unless it needs more to be told apart from the values beside it, and a text that reads as a number beside
numbers is quoted."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from numbers import Number
from typing import Any

MOST = 17  # significant digits that tell any two float64 values apart


def number_text(value: float | int, digits: int) -> str:
    """A number as a table shows it: a float to ``digits`` significant digits, an int whole."""
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def cell_digits(values: Sequence[Sequence[Any]], least: int) -> list[list[int]]:
    """The significant digits of each cell of a table of plain values: at least ``least``, and as many more
    as tell its value apart from every other number of its row and of its column, so that a table never
    shows two different values as one."""
    by_row = [_digits(line, least) for line in values]
    by_column = [_digits(line, least) for line in zip(*values, strict=True)]
    return [[max(by_row[i], by_column[j]) for j in range(len(line))] for i, line in enumerate(values)]


def _digits(values: Iterable[Any], least: int) -> int:
    """The fewest significant digits, ``least`` or more, that give the distinct finite numbers among ``values``
    distinct texts."""
    numbers = {v for v in values if type(v) is int or (type(v) is float and math.isfinite(v))}
    if not any(type(v) is float for v in numbers):
        return least
    return next((d for d in range(least, MOST) if len({number_text(v, d) for v in numbers}) == len(numbers)), MOST)


def quoted_cells(values: Sequence[Sequence[Any]], texts: Sequence[Sequence[str]]) -> list[list[bool]]:
    """Which cells of a table (its ``values`` and how they read, ``texts``) hold a text to show quoted: one
    that reads as a number or a bool of its row or its column reads, so that the text "0.1" and the number 0.1
    never read alike."""
    cells = [list(zip(line, shown, strict=True)) for line, shown in zip(values, texts, strict=True)]
    by_row = [{t for v, t in line if isinstance(v, Number)} for line in cells]
    by_column = [{t for v, t in line if isinstance(v, Number)} for line in zip(*cells, strict=True)]
    return [
        [isinstance(v, str) and (t in by_row[i] or t in by_column[j]) for j, (v, t) in enumerate(line)]
        for i, line in enumerate(cells)
    ]
