"""The writer under load: ingest from 16 concurrent senders, and 100 trials committing at once.

Ingest: 16 Ray actors each log 4-float rows with ``MetricBuffer.append`` as fast as they can for 10 s;
every sealed chunk (``flush_rows``) travels to the driver's writer actor as an Arrow record batch and is
appended to the store's spill. Reported: rows/s that reached the spill (counted from the spill files),
and the writer process's peak RSS, sampled every 50 ms. Side by side, in alternating rounds: the same
senders spilling to local files in their own processes (the single-machine design, which needs a shared
filesystem on a cluster), and the same senders discarding their sealed chunks (what the senders' own
``append`` calls cost on this machine). The order of the three paths rotates from round to round, and
each round's written pages are synced before the next starts.

Commit rate: 100 series of 10 000 rows are in the writer's spill; 100 commit requests are sent at once
(Parquet + DVC + one MLMD transaction each, SQLite MLMD). Side by side, the same 100 commits in-process
with no Ray, one after another.

Targets (issue 12): >= 2M rows/s reaching the spill through the writer, and >= 50 commits/s on SQLite MLMD
through the writer actor.

Run: ``.venv/bin/python benchmarks/bench_writer.py [--seconds 10 --senders 16]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import ray

sys.path.insert(0, str(Path(__file__).parent))

from _common import Results, command_line

from ray_cmf import MetricBuffer, Store
from ray_cmf.actor import connect, start_writer
from ray_cmf.binding import SeriesKey
from ray_cmf.client import WriterClient
from ray_cmf.constants import RUN_EXECUTION_TYPE, SPILL_DIR
from ray_cmf.series_format import read_segments
from ray_cmf.writer import StoreWriter

FLUSH_ROWS = 10_000


class Discard:
    """A sink that drops sealed chunks: what remains is the cost of logging itself."""

    def write(self, batch: object) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


@ray.remote(num_cpus=0)
class Sender:
    """Logs rows as fast as it can into a buffer whose sink is the writer, a local spill, or nothing."""

    def run(self, key: SeriesKey | None, spill_dir: str | None, seconds: float, start_at: float) -> int:
        sink = connect().sink(key) if key is not None else None if spill_dir else Discard()
        buffer = MetricBuffer(spill_dir, sink=sink, flush_rows=FLUSH_ROWS)
        while time.time() < start_at:
            time.sleep(0.001)
        deadline = time.perf_counter() + seconds
        rows = 0
        while time.perf_counter() < deadline:
            for i in range(1000):
                buffer.append({"a": 0.5, "b": 1.5, "c": 2.5, "d": float(i)})
            rows += 1000
        buffer.close()  # every row handed over: spilled, or acknowledged by the writer
        return rows


def spilled_rows(spills: Path) -> int:
    return sum(b.num_rows for d in spills.iterdir() for b in read_segments(d))


def watch_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        time.sleep(0.05)


def ingest(writer: WriterClient, root: Path, senders: int, seconds: float, path: str, tag: str) -> tuple[float, int]:
    """Rows/s that reached the spill (``path``: writer, local or discard), and the writer's peak RSS."""
    actors = [Sender.remote() for _ in range(senders)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    spills = root / tag
    keys: list[SeriesKey | None] = [None] * senders
    dirs: list[str | None] = [None] * senders
    for i in range(senders):
        if path == "writer":
            binding = writer.call(
                StoreWriter.bind,
                kind="run",
                name=f"{tag}-{i}",
                pipeline="bench",
                stage="ingest",
                type_name=RUN_EXECUTION_TYPE,
            )
            keys[i] = SeriesKey(binding, "rows")
        elif path == "local":
            dirs[i] = str(spills / f"s{i}")
    stop, peak = threading.Event(), [0]
    writer_process = psutil.Process(writer.call(StoreWriter.pid))
    cpu_before = sum(writer_process.cpu_times()[:2])
    watcher = threading.Thread(target=watch_rss, args=(writer_process.pid, stop, peak))
    watcher.start()
    start_at = time.time() + 1.0
    logged = sum(ray.get([a.run.remote(keys[i], dirs[i], seconds, start_at) for i, a in enumerate(actors)]))
    elapsed = time.time() - start_at
    writer_cpu = sum(writer_process.cpu_times()[:2]) - cpu_before
    stop.set()
    watcher.join()
    if path == "writer":
        spill = root / "store" / SPILL_DIR
        landed = sum(b.num_rows for key in keys if key for b in read_segments(spill / key.spill_name))
        assert landed == logged, (landed, logged)
    elif path == "local":
        assert spilled_rows(spills) == logged
    for a in actors:
        ray.kill(a)
    shutil.rmtree(spills, ignore_errors=True)
    os.sync()  # the next round must not pay for writing back this round's pages
    print(f"  {tag}: {logged / 1e6:.2f}M rows in {elapsed:.1f} s, writer CPU {writer_cpu:.2f} s", flush=True)
    return logged / elapsed, peak[0]


def fill(writer: WriterClient, name: str, rows: int) -> SeriesKey:
    """A trial whose series of ``rows`` rows is in the writer's spill, ready to commit."""
    binding = writer.call(
        StoreWriter.bind, kind="trial", name=name, pipeline="bench", stage="commit", type_name=RUN_EXECUTION_TYPE
    )
    key = SeriesKey(binding, "tune_results")
    buffer = MetricBuffer(sink=writer.sink(key), flush_rows=rows)
    for step in range(rows):
        buffer.append({"step": step, "loss": 1.0 / (step + 1), "acc": 0.5, "lr": 0.1})
    buffer.close()
    return key


def commits(writer: WriterClient, series: int, rows: int, tag: str) -> float:
    """Commits/s for ``series`` series of ``rows`` rows, all commit requests sent at once."""
    writer.call(StoreWriter.commit, key=fill(writer, f"{tag}-warm-up", 10))  # creates the DVC repo: not timed
    keys = [fill(writer, f"{tag}-{i}", rows) for i in range(series)]
    start = time.perf_counter()
    replies = [writer.send(StoreWriter.commit, key=key) for key in keys]
    artifacts = [reply.result() for reply in replies]
    elapsed = time.perf_counter() - start
    assert all(a is not None for a in artifacts)
    return series / elapsed


LABELS = {
    "writer": "ray_cmf writer (record batches through Ray)",
    "local": "local spill in each sender's process",
    "discard": "no spill (the senders' own logging cost)",
}


def ingest_rounds(results: Results, writer: WriterClient, tmp: Path, args: argparse.Namespace) -> None:
    """Rows/s of the three paths over rotating rounds, and the writer's peak RSS: table, figures, verdict."""
    title = f"Writer ingest: {args.senders} senders x {args.seconds:g} s, 4-float rows, flush_rows={FLUSH_ROWS}"
    print(f"## {title}\n")
    rates: dict[str, list[float]] = {path: [] for path in LABELS}
    peaks: list[int] = []
    for round_ in range(args.rounds):
        order = list(LABELS)[round_ % 3 :] + list(LABELS)[: round_ % 3]  # each path runs first, second and last
        for path in order:
            rate, peak = ingest(writer, tmp, args.senders, args.seconds, path, f"{path}{round_}")
            rates[path].append(rate)
            if path == "writer":
                peaks.append(peak)
            print(f"round {round_}: {path} {rate / 1e6:.2f}M rows/s", flush=True)
    medians = {path: statistics.median(values) for path, values in rates.items()}
    for path, label in LABELS.items():
        share = medians[path] / medians["discard"]
        results.figure(label, {"rows_per_s": medians[path], "per_round_rows_per_s": rates[path], "vs_no_spill": share})
    print()
    results.table(
        title,
        ["path", "rows/s (median)", "vs no spill"],
        [[LABELS[p], f"{medians[p] / 1e6:.2f}M", f"{medians[p] / medians['discard']:.0%}"] for p in LABELS],
    )
    results.figure("writer peak RSS", {"max_mib": max(peaks) / 2**20, "per_round_mib": [p / 2**20 for p in peaks]})
    print(f"\nwriter peak RSS over the writer rounds: {max(peaks) / 2**20:.0f} MiB ({[p >> 20 for p in peaks]} MiB)")
    results.verdict("writer ingest >= 2M rows/s reaching the spill", medians["writer"] >= 2e6)


def commit_rate(results: Results, writer: WriterClient, tmp: Path, args: argparse.Namespace) -> None:
    """Commits/s through the writer actor, all at once, against in-process one after another."""
    title = f"Commit rate: {args.trials} trials x {args.rows:,} rows committing at once (SQLite MLMD)"
    print(f"\n## {title}\n")
    through = commits(writer, args.trials, args.rows, "actor")
    in_process = commits(WriterClient(StoreWriter(Store(tmp / "local_store"))), args.trials, args.rows, "local")
    results.figure(
        "commit rate",
        {
            "actor_commits_per_s": through,
            "in_process_commits_per_s": in_process,
            "actor_over_in_process": through / in_process,
        },
    )
    results.table(
        title,
        ["path", "commits/s"],
        [
            [f"ray_cmf writer actor, {args.trials} requests at once", f"{through:.0f}"],
            ["in-process, sequential", f"{in_process:.0f}"],
        ],
    )
    print(f"\nwriter actor / in-process: {through / in_process:.2f}x")
    results.verdict(">= 50 commits/s through the writer actor (SQLite MLMD)", through >= 50)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp())
    writer = start_writer(tmp / "store")
    writer.call(StoreWriter.context, pipeline="bench", store=None)  # the store exists before timing
    results = Results("writer", command_line(__file__, args))
    ingest_rounds(results, writer, tmp, args)
    commit_rate(results, writer, tmp, args)
    results.save()


if __name__ == "__main__":
    main()
