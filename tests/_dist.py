"""Run a function on N real gloo ranks (torch.multiprocessing) and collect each rank's return value."""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "reduce",
    "barrier",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "all_to_all",
    "gather",
    "scatter",
)


def count_collectives() -> dict[str, int]:
    """Wrap torch.distributed's collectives in this process; the returned dict counts calls by name."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:  # not in this torch version
            continue

        def wrapped(*args: Any, __name: str = name, __orig: Any = original, **kwargs: Any) -> Any:
            counts[__name] = counts.get(__name, 0) + 1
            return __orig(*args, **kwargs)

        setattr(dist, name, wrapped)
    return counts


def _entry(rank: int, world: int, init_file: str, out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result: Any = ("ok", fn(rank, world, *args))
    except BaseException as exc:  # the parent re-raises with the rank's traceback
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    if dist.is_initialized():  # unless ``fn`` destroyed it
        dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Spawn ``world`` gloo ranks running ``fn(rank, world, *args)``; return results ordered by rank.

    A rank's exception comes back as ``("error", text)`` in its slot so tests can assert on it.
    """
    with tempfile.TemporaryDirectory() as tmp:
        init_file = str(Path(tmp) / "init")
        mp.spawn(_entry, args=(world, init_file, tmp, fn, args), nprocs=world, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]
