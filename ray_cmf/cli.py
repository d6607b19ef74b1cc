"""The ``ray-cmf`` command line. Every command takes ``--store`` (or $RAY_CMF_STORE) and ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ray_cmf.errors import RayCmfError
from ray_cmf.lineage import Lineage, properties
from ray_cmf.recovery import recover
from ray_cmf.store import Store

EXIT_USAGE = 2


def _emit(args: argparse.Namespace, payload: Any, render: Callable[[Any], None]) -> None:
    if args.json:
        json.dump(payload, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        render(payload)


def _table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0] if rows else ["(empty)"]:
        table.add_column(str(column))
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)


def _reader(args: argparse.Namespace) -> Lineage:
    store = Store(args.store)
    return Lineage(store.mlmd, readonly=True)


def cmd_pipelines(args: argparse.Namespace) -> int:
    lineage = _reader(args)
    rows = [
        {"pipeline": p.name, "stages": len(lineage.stages(p)), **properties(p)} for p in lineage.pipelines()
    ]
    _emit(args, rows, lambda r: _table(r, f"pipelines in {args.store or 'store'}"))
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    artifacts = recover(args.store, force=args.force)
    rows = [{"metrics_name": properties(a)["metrics_name"], "rows": properties(a)["rows"], "url": properties(a)["url"]}
            for a in artifacts]
    _emit(args, rows, lambda r: _table(r, "recovered metrics"))
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "pipelines": (cmd_pipelines, "list the pipelines in the store"),
    "recover": (cmd_recover, "commit the spilled rows of runs that crashed before commit_metrics"),
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", default=None, help="store directory (default: $RAY_CMF_STORE or ./cmf_store)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser = argparse.ArgumentParser(prog="ray-cmf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, parents=[common])
        if name == "recover":
            command.add_argument("--force", action="store_true", help="also recover spills of live processes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ray-cmf``; returns the exit code (2 for usage errors and empty stores)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][0](args)
    except RayCmfError as exc:
        print(f"ray-cmf {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
