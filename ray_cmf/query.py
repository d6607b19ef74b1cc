"""``--where`` expressions: a small grammar of our own over the trial table, parsed once and evaluated per column.

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | "(" expr ")" | test
    test    := operand OP operand | operand ["not"] "in" "[" literal ("," literal)* "]"
    operand := NAME | literal                OP: < <= == != >= >
    literal := number | "text" | 'text' | true | false | null

A NAME is a trial-table column (``config/lr``, ``val_loss_best``, ``tag/team``, ``started_at``); one with
other characters is written in backticks. Nothing is ever passed to ``eval``.

Values compare as recorded: numbers with numbers, text with text. A comparison of a missing value (None,
another missing value included) or of values of different kinds (a number against text) is false, except
``!=`` and ``not in``, which are true: the rule pandas and IEEE 754 follow for NaN. ``x == null`` (and
``x in [null]``) is what tests for a missing value. A NaN is a value (a config of NaN was recorded): it
orders against nothing, and only ``nan`` (or another NaN) equals it, as PostgreSQL has it. A float summary
column (``loss_final``) cannot tell a NaN from a trial without the metric, so there a NaN is also
``null``. A column whose name ends in ``_at`` holds UTC times as ISO 8601 text; a date or time compared
with it is read as UTC.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ray_cmf.errors import InvalidArgumentError

if TYPE_CHECKING:
    import pandas as pd

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)(?![\w./]))
    | (?P<text>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<quoted>`[^`]+`)
    | (?P<op><=|>=|==|!=|<|>|\(|\)|\[|\]|,)
    | (?P<name>[^\W\d][\w./:-]*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}
_MISSING = object()
_NAN = object()  # a NaN as it compares: equal to NaN only, ordered against nothing
_NULL = object()  # the literal null, which a missing value equals
_NULL_NAN = object()  # a NaN where it may also stand for a missing value: a NaN that null equals too


class QueryError(InvalidArgumentError):
    """An expression that cannot be parsed, or that names a column the table lacks; the message shows where."""

    def __init__(self, text: str, column: int, why: str, detail: str = "") -> None:
        super().__init__(f"where: {why} at column {column + 1}{detail}\n  {text}\n  {' ' * column}^")
        self.column = column


@dataclass(frozen=True)
class _Token:
    kind: str  # number | text | name | op | keyword | end
    value: Any
    at: int
    end: int


def _tokens(text: str) -> list[_Token]:
    out, at, end = [], 0, len(text.rstrip())
    while at < end:
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            start = len(text) - len(text[at:].lstrip())
            raise QueryError(text, start, _unexpected(text[start:]))
        kind = match.lastgroup or ""
        raw = match.group(kind)
        start, at = match.start(kind), match.end()
        if kind == "name" and raw.lower() in _KEYWORDS:
            out.append(_Token("keyword", raw.lower(), start, at))
        elif kind == "quoted":
            out.append(_Token("name", raw[1:-1], start, at))
        elif kind == "text":
            out.append(_Token("text", re.sub(r"\\([\\\"'])", r"\1", raw[1:-1]), start, at))  # \\ \" \' only
        elif kind == "number":
            value: float | int = float(raw) if re.search(r"[.eEna]", raw) else int(raw)
            out.append(_Token("number", value, start, at))
        else:
            out.append(_Token(kind, raw, start, at))
    out.append(_Token("end", None, len(text), len(text)))
    return out


def _unexpected(rest: str) -> str:
    """What is wrong where no token starts: an unclosed quote, a lone '=', or a word that is none of ours."""
    if rest[0] in "\"'`":
        return f"unclosed {rest[0]} (text is written in quotes, names with other characters in backticks)"
    if rest[0] == "=":
        return "unexpected '=' (compare with '==')"
    word = re.match(r"[^\s()\[\],]+", rest)
    return f"unexpected {word.group(0) if word else rest[0]!r}"


# -- the parsed expression ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Name:
    name: str
    at: int


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class Compare:
    op: str
    left: Name | Literal
    right: Name | Literal


@dataclass(frozen=True)
class Member:
    operand: Name | Literal
    values: tuple[Any, ...]
    negated: bool


@dataclass(frozen=True)
class Logic:
    op: str  # and | or | not
    parts: tuple[Node, ...]


Node = Compare | Member | Logic


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self, kind: str, value: Any = None) -> _Token | None:
        token = self.peek()
        if token.kind == kind and (value is None or token.value == value):
            self.i += 1
            return token
        return None

    def expect(self, kind: str, value: Any, what: str) -> _Token:
        token = self.take(kind, value)
        if token is None:
            raise self.error(f"expected {what}")
        return token

    def error(self, why: str, detail: str = "") -> QueryError:
        token = self.peek()
        found = "the end" if token.kind == "end" else repr(self.text[token.at : token.end])
        return QueryError(self.text, token.at, f"{why}, found {found}", detail)

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise QueryError(self.text, 0, "the expression is empty")
        node = self.disjunction()
        if self.peek().kind != "end":
            raise self.error("expected 'and', 'or' or the end")
        return node

    def disjunction(self) -> Node:
        parts = [self.conjunction()]
        while self.take("keyword", "or"):
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Logic("or", tuple(parts))

    def conjunction(self) -> Node:
        parts = [self.negation()]
        while self.take("keyword", "and"):
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else Logic("and", tuple(parts))

    def negation(self) -> Node:
        if self.take("keyword", "not"):
            return Logic("not", (self.negation(),))
        if self.take("op", "("):
            node = self.disjunction()
            self.expect("op", ")", "')'")
            return node
        return self.test()

    def test(self) -> Node:
        first = self.peek()
        left = self.operand()
        token = self.peek()
        if token.kind == "op" and token.value in _COMPARE:
            self.i += 1
            second = self.peek()
            right = self.operand()
            for operand, other, at in ((left, right, first), (right, left, second)):
                if isinstance(operand, Literal) and isinstance(other, Name):
                    self.check_time(operand.value, _time(other), at)
            return Compare(token.value, left, right)
        negated = bool(self.take("keyword", "not"))
        if self.take("keyword", "in"):
            return Member(left, self.values(isinstance(left, Name) and _time(left)), negated)
        raise self.error("expected a comparison (< <= == != >= >) or 'in'" if not negated else "expected 'in'")

    def values(self, timed: bool) -> tuple[Any, ...]:
        self.expect("op", "[", "'[' to open a list")
        values = [self.timed_literal(timed)]
        while self.take("op", ","):
            values.append(self.timed_literal(timed))
        self.expect("op", "]", "',' or ']'")
        return tuple(values)

    def timed_literal(self, timed: bool) -> Any:
        token = self.peek()
        value = self.literal()
        self.check_time(value, timed, token)
        return value

    def check_time(self, value: Any, timed: bool, token: _Token) -> None:
        """A text compared with a time column (``started_at``) must read as a time: raise at the text if not."""
        if timed and isinstance(value, str) and _utc(value) is None:
            raise QueryError(
                self.text, token.at, f"{value!r} is not a UTC date or time", " (ISO 8601: 2026-11-01, 2026-11-01T12:30)"
            )

    def operand(self) -> Name | Literal:
        token = self.peek()
        if token.kind == "name":
            self.i += 1
            return Name(token.value, token.at)
        return Literal(self.literal())

    def literal(self) -> Any:
        token = self.peek()
        if token.kind in ("number", "text"):
            self.i += 1
            return token.value
        if token.kind == "keyword" and token.value in ("true", "false", "null"):
            self.i += 1
            return {"true": True, "false": False, "null": None}[token.value]
        listed = token.kind == "op" and token.value == "["  # a list config's cell holds its JSON text
        hint = f" (a list is compared as its JSON text in quotes: {self._bracketed(token.at)!r})" if listed else ""
        raise self.error("expected a column name, a number, text in quotes, true, false or null", hint)

    def _bracketed(self, at: int) -> str:
        """The text of the list that opens at ``at``, to its matching ``]`` (or to the end)."""
        depth = 0
        for end, char in enumerate(self.text[at:], start=at):
            depth += {"[": 1, "]": -1}.get(char, 0)
            if not depth:
                return self.text[at : end + 1]
        return self.text[at:].strip()


@dataclass(frozen=True)
class Query:
    """A parsed ``--where`` expression: :meth:`names` it reads, and :meth:`mask` over a table."""

    text: str
    root: Node

    def names(self) -> list[str]:
        """The columns the expression reads, in order of appearance."""
        return list(dict.fromkeys(name.name for name in _names(self.root)))

    def check(self, columns: Sequence[str]) -> None:
        """Raise :class:`QueryError` at the first name that is not one of ``columns`` (listing them)."""
        known = set(columns)
        for name in _names(self.root):
            if name.name not in known:
                quote = f'; text goes in quotes: "{name.name}"' if _against_a_column(self.root, name, known) else ""
                raise QueryError(
                    self.text, name.at, f"no column {name.name!r}", f"{quote}; the trials have {sorted(known)}"
                )

    def mask(self, table: pd.DataFrame, nan_is_null: Collection[str] = ()) -> pd.Series:
        """Which rows of ``table`` the expression holds for (a boolean Series on its index); in the columns
        ``nan_is_null`` (float summaries, where pandas writes a missing value as NaN) a NaN is also null."""
        import pandas as pd

        self.check(list(table.columns))
        return pd.Series(_evaluate(self.root, _Table(table, frozenset(nan_is_null))), index=table.index, dtype=bool)


def parse(text: str) -> Query:
    """Parse a ``--where`` expression; a bad one raises :class:`QueryError` pointing at the column of the error."""
    return Query(text, _Parser(text).parse())


def _against_a_column(node: Node, name: Name, columns: set[str]) -> bool:
    """Whether ``name`` is compared with a column of ``columns`` (``status == COMPLETE``: text without quotes)."""
    if isinstance(node, Logic):
        return any(_against_a_column(part, name, columns) for part in node.parts)
    if not isinstance(node, Compare) or name not in (node.left, node.right):
        return False
    other = node.right if node.left is name else node.left
    return isinstance(other, Name) and other.name in columns


def _names(node: Node) -> list[Name]:
    if isinstance(node, Logic):
        return [name for part in node.parts for name in _names(part)]
    operands = (node.left, node.right) if isinstance(node, Compare) else (node.operand,)
    return [o for o in operands if isinstance(o, Name)]


@dataclass(frozen=True)
class _Table:
    frame: pd.DataFrame
    nan_is_null: frozenset[str]


def _evaluate(node: Node, table: _Table) -> list[bool]:
    if isinstance(node, Logic):
        parts = [_evaluate(part, table) for part in node.parts]
        if node.op == "not":
            return [not value for value in parts[0]]
        combine = all if node.op == "and" else any
        return [combine(row) for row in zip(*parts, strict=True)]
    if isinstance(node, Member):
        values = _column(node.operand, table)
        hits = [any(_holds("==", v, _literal(member, False)) for member in node.values) for v in values]
        return [not hit for hit in hits] if node.negated else hits
    left, right = _column(node.left, table, _time(node.right)), _column(node.right, table, _time(node.left))
    return [_holds(node.op, a, b) for a, b in zip(left, right, strict=True)]


def _time(operand: Name | Literal) -> bool:
    return isinstance(operand, Name) and operand.name.endswith("_at")


def _column(operand: Name | Literal, table: _Table, timed: bool = False) -> list[Any]:
    """An operand's values as they compare (see :func:`_comparable`); a literal compared with a time column
    is read as a time."""
    if isinstance(operand, Literal):
        return [_literal(operand.value, timed)] * len(table.frame)
    values = table.frame[operand.name].tolist()
    nan_is_null = operand.name in table.nan_is_null
    return [_comparable(v, _time(operand), nan_is_null) for v in values]


def _holds(op: str, a: Any, b: Any) -> bool:
    """One comparison of two comparable values: a missing or unlike value compares false, except under
    ``!=``; ``null`` equals a missing value only; a NaN equals a NaN only and orders against nothing."""
    if a is _NULL or b is _NULL:
        missing = all(side is _NULL or side is _MISSING or side is _NULL_NAN for side in (a, b))
        return missing if op == "==" else (not missing if op == "!=" else False)
    if a is _NULL_NAN and b is _NULL_NAN:  # two summaries that may each be missing compare as missing ones
        return op == "!="
    a, b = (_NAN if side is _NULL_NAN else side for side in (a, b))
    if a is _MISSING or b is _MISSING:
        return op == "!="
    if a is _NAN or b is _NAN:
        return (a is b) == (op == "==") if op in ("==", "!=") else False
    if _kind(a) != _kind(b):
        return op == "!="
    return bool(_COMPARE[op](a, b))


def _literal(value: Any, timed: bool) -> Any:
    """A literal as it compares: ``null`` as itself, any other as a recorded value would."""
    return _NULL if value is None else _comparable(value, timed)


def _comparable(value: Any, timed: bool, nan_is_null: bool = False) -> Any:
    """A value as it compares: a number (bools are numbers), text (a time as UTC ISO text), NaN, or missing."""
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # numpy scalars
    if value is None or _kind(value) in ("NAType", "NaTType"):
        return _MISSING
    if isinstance(value, float) and math.isnan(value):
        return _NULL_NAN if nan_is_null else _NAN
    if timed and isinstance(value, str):
        return _utc(value) or value
    return value


def _utc(text: str) -> str | None:
    """An ISO 8601 date or time as UTC ISO text (one without a zone is UTC); None when it is not one."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _kind(value: Any) -> str:
    """What a value compares as: a number, a text (a list's JSON text is one), else its own type."""
    if isinstance(value, int | float):
        return "number"
    return "str" if isinstance(value, str) else type(value).__name__
