"""Render the tables of ``benchmarks/results/*.json`` into RESULTS.md, between its ``results:begin`` and
``results:end`` markers, so that no figure there is typed by hand. Each benchmark that saves its results
(``_common.save_results``) gets a section: its command, date and machine, a table of its figures (one row
per variant; lists of per-round values shown as they are), the tables it printed (``_common.Results.table``),
each under its title, and its verdicts against its targets.

Run: ``.venv/bin/python benchmarks/render_results.py`` (after the benchmarks it renders)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _common import markdown_table

HERE = Path(__file__).parent
BEGIN, END = "<!-- results:begin (benchmarks/render_results.py writes this part) -->", "<!-- results:end -->"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def render(record: dict[str, Any]) -> str:
    """One benchmark's section: where it came from, a table per kind of figure, the tables it printed, and its
    verdicts."""
    lines = [
        f"### {record['benchmark']}",
        "",
        f"`.venv/bin/python {record['command']}`, {record['date']}, {record['machine']}",
    ]
    tables: dict[tuple[str, ...], list[str]] = {}  # figures with the same keys share a table
    for name, figure in record["figures"].items():
        tables.setdefault(tuple(figure), []).append(name)
    for columns, names in tables.items():
        lines += ["", "| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for name in names:
            figure = record["figures"][name]
            lines.append(f"| {name} | " + " | ".join(_cell(figure[c]) for c in columns) + " |")
    for table in record.get("tables", []):
        lines += ["", f"**{table['title']}**", "", *markdown_table(table["headers"], table["rows"])]
    lines += [""] + [f"- target {t}: **{'met' if ok else 'not met'}**" for t, ok in record["verdicts"].items()]
    return "\n".join(lines)


def main() -> None:
    records = [json.loads(p.read_text()) for p in sorted((HERE / "results").glob("*.json"))]
    block = "\n\n".join([BEGIN, *(render(r) for r in records), END])
    results = HERE / "RESULTS.md"
    text = results.read_text()
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n## Rendered from benchmarks/results/\n\n" + block + "\n"
    results.write_text(text)
    print(f"rendered {len(records)} benchmark(s) into {results}")


if __name__ == "__main__":
    main()
