"""How a table's cells read, so that no two different values read alike: a float gets few significant digits
unless it needs more to be told apart from the values beside it, and a text that could read as another
value (a number-like text, an empty one, one with a space at an end) is quoted."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ray_cmf._json import JsonText

MOST = 17  # significant digits that tell any two float64 values apart


def number_text(value: float | int, digits: int) -> str:
    """A number as a table shows it: a float to ``digits`` significant digits (no more than its shortest
    exact text has: 0.1 reads 0.1 at any), an int whole."""
    if not isinstance(value, float) or not math.isfinite(value) or value == 0:
        return f"{value:g}" if isinstance(value, float) else str(value)
    mantissa, exponent, _ = repr(abs(float(value))).partition("e")  # NumPy's float64 reprs as np.float64(...)
    significant = len(mantissa.replace(".", "").strip("0")) or 1
    # a round number's digits before the point (100, not 1e+02), where its shortest text has them too
    places = 0 if exponent else math.floor(math.log10(abs(value))) + 1
    return f"{value:.{min(digits, max(significant, places))}g}"


def cell_texts(
    values: Sequence[Sequence[Any]],
    least: int,
    text: Callable[[Any, int], str],
    quote: Callable[[str], str],
    logged: Sequence[Sequence[Any]] | None = None,
) -> list[list[str]]:
    """The texts of a table's cells: ``text(value, digits)``, with the digits :func:`cell_digits` gives it,
    or ``quote(value)`` for a text that could read as another value (:func:`quoted_cells`, judged on the
    values as ``logged`` where ``values`` are not those)."""
    logged = values if logged is None else logged
    rows = zip(values, logged, cell_digits(values, least), quoted_cells(logged), strict=True)
    return [
        [quote(raw) if q else text(v, d) for v, raw, d, q in zip(line, as_logged, places, quoted, strict=True)]
        for line, as_logged, places, quoted in rows
    ]


def quoted(text: str) -> str:
    """A text as a literal in quotes, its tabs and line breaks written as ``\\t`` and ``\\n``."""
    return json.dumps(text, ensure_ascii=False)


def shown_text(text: str, *, beside_values: bool = False) -> str:
    """A text as a line shows it: quoted where it could read as no value or as another text (see
    :func:`needs_quotes`), or, ``beside_values`` (numbers or bools), as one of those."""
    return quoted(text) if needs_quotes(text) or (beside_values and _reads_as_value(text)) else text


def cell_digits(values: Sequence[Sequence[Any]], least: int) -> list[list[int]]:
    """The significant digits of each cell of a table of plain values: at least ``least``, and as many more
    as tell its value apart from every other number of its row and of its column, so that a table never
    shows two different values as one (and only the values that need more digits get them)."""
    by_row = [_digits(line, least) for line in values]
    by_column = [_digits(line, least) for line in zip(*values, strict=True)]
    return [
        [
            max(by_row[i].get(v, least), by_column[j].get(v, least)) if _finite_float(v) else least
            for j, v in enumerate(line)
        ]
        for i, line in enumerate(values)
    ]


def _finite_float(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


def _digits(values: Iterable[Any], least: int) -> dict[float, int]:
    """The fewest significant digits, ``least`` or more, of each finite float among ``values`` that give it a
    text no other number among them has."""
    values = list(values)
    taken = {str(v) for v in values if type(v) is int}  # an int reads whole
    crowd, digits = {v for v in values if _finite_float(v)}, {}
    for d in range(least, MOST):
        texts: dict[str, set[float]] = {}
        for v in crowd:
            texts.setdefault(number_text(v, d), set()).add(v)
        crowd = set()
        for text, alike in texts.items():
            if len(alike) > 1 or text in taken:
                crowd |= alike
            else:
                digits[next(iter(alike))] = d
                taken.add(text)
        if not crowd:
            break
    return {**digits, **dict.fromkeys(crowd, MOST)}


def quoted_cells(values: Sequence[Sequence[Any]]) -> list[list[bool]]:
    """Which cells of a table hold a text to show quoted: one that reads as a number, a bool, a list or a
    mapping (the text "0.1", in every table: a filter that leaves no number beside it must not change how it
    reads), and one that could read as no value or as another text (see :func:`needs_quotes`)."""
    return [[isinstance(v, str) and (needs_quotes(v) or _reads_as_value(v)) for v in line] for line in values]


def needs_quotes(text: str) -> bool:
    """Whether a text shown as it is could read as no value or as another text: an empty one, one that begins
    or ends with a space, one with a tab, a line break or another character that does not print."""
    return not text or text != text.strip() or not text.isprintable()


def _reads_as_value(text: str) -> bool:
    """Whether a text reads as a number, a bool or no value does, or as a list or a mapping does (a
    :class:`JsonText`). Not one with an ``_``, which Python's ``float`` takes (``98145_00000``, a Tune trial
    id) and no table shows in a number."""
    if isinstance(text, JsonText):
        return False
    if text in ("True", "False", "true", "false", "null", "None"):  # null: what --where calls no value
        return True
    if text.startswith(("[", "{")):
        try:
            return isinstance(json.loads(text), list | dict)
        except ValueError:
            return False
    if "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True
