"""A team store against the embedded one: MLMD on PostgreSQL, files on an S3-compatible server.

Side by side, 500 trials (2 000 steps each by default):
* the embedded store (SQLite MLMD, files on local disk);
* the team store as another machine sees it: MLMD on PostgreSQL 15, files pushed to moto's S3 server,
  none of them on local disk, fetched by md5 into the local DVC cache on first use ("cold"), then read
  from it ("warm").
Measured: ``Sweep.trials()`` and ``ray-cmf compare --top 5``, best of 3 each (target: team <= 2x embedded,
warm); the footers and the loss column of every file with no local copy, read from S3 directly against
ray_cmf's lazy pull into the local DVC cache, each timed as its first query and the best of 3 later ones;
and the push of every file (``store.dvc.push()``, what ``ray-cmf push`` runs; files/s, MB/s). Both servers
run on 127.0.0.1, started here (as root, with Debian's postgresql installed), like the tests' servers.

Run: ``.venv/bin/python benchmarks/bench_team_store.py [--trials 500 --steps 2000]``
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from _common import Results, command_line, sweep_size, timed
from bench_sweep_scale import compare_cli, generate

from ray_cmf import Store, Sweep
from tests._servers import free_port, postgres


def read_directly(md5s: list[str], endpoint: str) -> None:
    """What a compare would read with no local copy: each file on S3 by its md5 (pyarrow's S3 filesystem,
    DVC's remote layout), every footer and then the columns ``Sweep.steps(['loss'])`` reads of every file."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    s3 = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1")
    paths = [f"bench/cmf/files/md5/{md5[:2]}/{md5[2:]}" for md5 in md5s]
    for path in paths:
        pq.read_metadata(path, filesystem=s3)
    pads.dataset(paths, format="parquet", filesystem=s3).to_table(columns=["training_iteration", "attempt", "loss"])


def read_lazily(store: Path) -> None:
    """The same through ray_cmf (every footer, then the loss column): files fetched into the local DVC cache on
    first use, then read there."""
    sweep = Sweep(store, pipeline="scale")
    sweep.trials(["loss"])
    sweep.steps(["loss"])


def first_and_later(fn: Callable[[], object]) -> tuple[float, float]:
    """The seconds of the first call of ``fn``, and the best of 3 later calls."""
    return timed(fn, repeat=1)[0], timed(fn)[0]


def warm_table(results: Results, embedded: dict[str, float], team: dict[str, float]) -> None:
    """The target's table: each task best of 3 on the embedded store and on the warm team store."""
    rows = []
    for task in embedded:
        ratio = team[task] / embedded[task]
        results.figure(task, {"embedded_s": embedded[task], "team_s": team[task], "team_over_embedded": ratio})
        rows.append([task, f"{embedded[task]:.2f} s", f"{team[task]:.2f} s", f"{ratio:.2f}x"])
    print()
    results.table(
        "The team store against the embedded one (warm)",
        ["task", "embedded (SQLite + local files)", "team (PostgreSQL + S3, files fetched)", "ratio"],
        rows,
    )
    met = all(team[task] <= 2 * embedded[task] for task in embedded)
    results.verdict("team <= 2x embedded (warm)", met)


def no_copy_table(results: Results, reads: dict[str, tuple[float, float]]) -> None:
    """Footers and the loss column of every file, with no local copy at the start: each way's first query and
    the best of 3 later ones."""
    for way, (first, later) in reads.items():
        results.figure(way, {"first_s": first, "later_best_of_3_s": later})
    title = "footers + the loss column of every file, no local copy at the start"
    print()
    results.table(
        title,
        ["how", "first query", "later queries (best of 3)"],
        [[way, f"{first:.2f} s", f"{later:.2f} s"] for way, (first, later) in reads.items()],
    )


def main() -> None:
    args = sweep_size(steps=2_000)
    results = Results("team_store", command_line(__file__, args))
    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request

    tmp = Path(tempfile.mkdtemp())
    embedded, team, elsewhere = tmp / "embedded", tmp / "team", tmp / "elsewhere"
    generate(embedded, None, args.trials, args.steps)
    port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
    with postgres() as pg:
        pg.sql("CREATE ROLE team LOGIN PASSWORD 'team' CREATEDB")
        url = pg.url("team", "team", "bench")
        generated = generate(team, None, args.trials, args.steps, mlmd=url)
        results.figure("generated", {"seconds": generated})
        print(f"generated {args.trials} trials x {args.steps} steps into PostgreSQL + local files in {generated:.1f} s")
        store = Store(team, mlmd=url)
        store.set_remote("s3://bench/cmf", endpoint)
        files = [p for p in (team / "artifacts").rglob("*.parquet")]
        megabytes = sum(p.stat().st_size for p in files) / 2**20
        start = time.perf_counter()
        store.dvc.push()
        pushed = time.perf_counter() - start

        os.environ["PGPASSWORD"] = "team"  # the other machine's password, from its environment
        Store(elsewhere, mlmd=pg.url("team", None, "bench")).set_remote("s3://bench/cmf", endpoint)
        md5s = [f.md5 for f in Sweep(embedded, pipeline="scale").files()]  # the same content in both stores
        direct = first_and_later(lambda: read_directly(md5s, endpoint))
        lazy = first_and_later(lambda: read_lazily(elsewhere))  # the first query fetches every file
        trials_task, compare_task = (
            "Sweep.trials(['loss']), best of 3",
            "ray-cmf compare --metric loss --top 5, best of 3",
        )
        embedded_s = {
            trials_task: timed(lambda: Sweep(embedded, pipeline="scale").trials(["loss"]))[0],
            compare_task: timed(lambda: compare_cli(embedded))[0],
        }
        t_team, table = timed(lambda: Sweep(elsewhere, pipeline="scale").trials(["loss"]))
        assert len(table) == args.trials
        team_s = {trials_task: t_team, compare_task: timed(lambda: compare_cli(elsewhere))[0]}
    s3.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    warm_table(results, embedded_s, team_s)
    no_copy_table(
        results,
        {
            "read from S3 directly (pyarrow S3FileSystem, by md5)": direct,
            "lazy pull (ray_cmf: Sweep.trials + Sweep.steps, files fetched into the local DVC cache once)": lazy,
        },
    )
    results.figure(
        "push",
        {
            "files": len(files),
            "mb": megabytes,
            "seconds": pushed,
            "files_per_s": len(files) / pushed,
            "mb_per_s": megabytes / pushed,
        },
    )
    print(
        f"\npush: {len(files)} Parquet files ({megabytes:.0f} MB, + the package list) in {pushed:.1f} s: "
        f"{len(files) / pushed:.0f} files/s, {megabytes / pushed:.1f} MB/s"
    )
    results.save()


if __name__ == "__main__":
    main()
