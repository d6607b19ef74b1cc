"""The command line every example shares: where the store is, and how big a run to make."""

from __future__ import annotations

import argparse
import os


def arguments(description: str, size_help: str, size: int) -> argparse.Namespace:
    """Parse ``--store`` (default ``$RAY_CMF_STORE`` or ./demo_store) and ``--size``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--store",
        default=os.environ.get("RAY_CMF_STORE", "demo_store"),
        help="the ray_cmf store directory (default: $RAY_CMF_STORE or ./demo_store)",
    )
    parser.add_argument("--size", type=int, default=size, help=f"{size_help} (default: {size})")
    args = parser.parse_args()
    if args.size < 1:
        parser.error(f"--size must be >= 1, got {args.size}")
    args.store = os.path.abspath(args.store)
    return args
