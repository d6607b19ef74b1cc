"""A team store against the embedded one: MLMD on PostgreSQL, files on an S3-compatible server.

Side by side, 500 trials (2 000 steps each by default):
* the embedded store (SQLite MLMD, files on local disk);
* the team store as another machine sees it: MLMD on PostgreSQL 15, files pushed to moto's S3 server,
  none of them on local disk, fetched by md5 into the local DVC cache on first use ("cold"), then read
  from it ("warm").
Measured: ``Sweep.trials()`` and ``ray-cmf compare --top 5`` (target: team <= 2x embedded), and
``ray-cmf push`` of every file (files/s, MB/s). Both servers run on 127.0.0.1, started here (as root,
with Debian's postgresql installed), like the tests' servers.

Run: ``.venv/bin/python benchmarks/bench_team_store.py [--trials 500 --steps 2000]``
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from _common import print_table, sweep_size, timed
from bench_sweep_scale import generate

from ray_cmf import Store, Sweep
from tests._servers import free_port, postgres


def compare(store: Path) -> None:
    cli = str(Path(sys.executable).with_name("ray-cmf"))
    subprocess.run(
        [cli, "compare", "--store", str(store), "--metric", "loss", "--top", "5"], check=True, capture_output=True
    )


def read_directly(md5s: list[str], endpoint: str) -> None:
    """What a compare would read with no local copy: each file on S3 by its md5 (pyarrow's S3 filesystem,
    DVC's remote layout), every footer and then the loss column of every file."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    s3 = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1")
    paths = [f"bench/cmf/files/md5/{md5[:2]}/{md5[2:]}" for md5 in md5s]
    for path in paths:
        pq.read_metadata(path, filesystem=s3)
    pads.dataset(paths, format="parquet", filesystem=s3).to_table(columns=["training_iteration", "loss"])


def read_lazily(store: Path) -> None:
    """The same through ray_cmf: files fetched into the local DVC cache once, then read there."""
    sweep = Sweep(store, pipeline="scale")
    sweep.trials(["loss"])
    sweep.steps(["loss"])


def main() -> None:
    args = sweep_size(steps=2_000)
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
        direct, _ = timed(lambda: read_directly(md5s, endpoint))
        start = time.perf_counter()
        assert len(Sweep(elsewhere, pipeline="scale").trials(["loss"])) == args.trials
        cold = time.perf_counter() - start
        lazy, _ = timed(lambda: read_lazily(elsewhere))
        t_embedded, _ = timed(lambda: Sweep(embedded, pipeline="scale").trials(["loss"]))
        t_team, _ = timed(lambda: Sweep(elsewhere, pipeline="scale").trials(["loss"]))
        c_embedded, _ = timed(lambda: compare(embedded))
        c_team, _ = timed(lambda: compare(elsewhere))
    s3.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print()
    print_table(
        ["task", "embedded (SQLite + local files)", "team (PostgreSQL + S3, files fetched)", "ratio"],
        [
            ["Sweep.trials(['loss']), first, fetching every file", "", f"{cold:.2f} s", ""],
            [
                "Sweep.trials(['loss']), best of 3",
                f"{t_embedded:.2f} s",
                f"{t_team:.2f} s",
                f"{t_team / t_embedded:.2f}x",
            ],
            [
                "ray-cmf compare --metric loss --top 5",
                f"{c_embedded:.2f} s",
                f"{c_team:.2f} s",
                f"{c_team / c_embedded:.2f}x",
            ],
        ],
    )
    print()
    print_table(
        ["footers + the loss column of every file, no local copy", "time"],
        [
            ["read from S3 directly (pyarrow S3FileSystem, by md5), every query", f"{direct:.2f} s"],
            ["lazy pull: the first query (fetches every file once)", f"{cold:.2f} s"],
            ["lazy pull: every later query (local DVC cache)", f"{lazy:.2f} s"],
        ],
    )
    print(
        f"\npush: {len(files)} Parquet files ({megabytes:.0f} MB, + the package list) in {pushed:.1f} s: "
        f"{len(files) / pushed:.0f} files/s, {megabytes / pushed:.1f} MB/s"
    )
    verdict = "met" if t_team <= 2 * t_embedded and c_team <= 2 * c_embedded else "NOT met"
    print(f"team <= 2x embedded (warm): {verdict}")


if __name__ == "__main__":
    main()
