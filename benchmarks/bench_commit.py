"""commit_metrics on 1M rows, split into its phases, against cmflib's commit path; DVC cost vs tracked files.

cmflib's path, re-created faithfully: ``pd.DataFrame.from_dict(metrics, orient="index").to_parquet(path)``
then a ``dvc add`` subprocess (cmflib's ``commit_output``), then reading the md5 back from the .dvc file.
ray_cmf's path: the buffer finishes its Parquet (md5 computed while writing), the store copies it into the
DVC cache and writes the .dvc file, and one MLMD ``put_execution`` records the artifact.

Run: ``.venv/bin/python benchmarks/bench_commit.py``
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))

from _common import fmt_time, print_table, save_results

from ray_cmf import Cmf, MetricBuffer, Store
from ray_cmf.versioning import file_md5

ROWS = 1_000_000


def row(i: int) -> dict[str, float]:
    return {"step": i, "loss": 1.0 / (i + 1), "acc": 0.5, "lr": 0.1}


def public_commit(root: Path) -> float:
    """``Cmf.commit_metrics`` as a user calls it, after ``log_metric`` of every row: the buffer's flush to
    the writer, the writer's Parquet, DVC and MLMD, all included."""
    cmf = Cmf(pipeline_name="bench", store=Store(root))
    cmf.create_execution("Train")
    _ = cmf.store.dvc  # the one-off repo init is not part of a commit
    for i in range(ROWS):
        cmf.log_metric("train", row(i))
    start = time.perf_counter()
    cmf.commit_metrics("train")
    return time.perf_counter() - start


def ray_cmf_commit(root: Path) -> dict[str, float]:
    """The writer's commit, phase by phase: the spill finished as Parquet, DVC, one MLMD transaction."""
    store = Store(root)
    cmf = Cmf(pipeline_name="bench", store=store)
    execution = cmf.create_execution("Train")
    _ = store.dvc  # the one-off repo init is not part of a commit
    buffer = MetricBuffer(root / "spill", flush_rows=10_000)
    for i in range(ROWS):
        buffer.append(row(i))
    buffer.flush()
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    finished = buffer.finish(store.series_path("bench", "Train", execution.name, "train"))
    t1 = time.perf_counter()
    store.dvc.track(finished.path, finished.md5, finished.size)
    t2 = time.perf_counter()
    store.lineage.put_artifact(
        execution.id,
        "Step_Metrics",
        f"train:{finished.md5}",
        str(finished.path),
        {
            "Commit": finished.md5,
            "url": store.url(finished.path),
            "metrics_name": "train",
            "rows": finished.rows,
            "size": finished.size,
        },
    )
    t3 = time.perf_counter()
    data = finished.path.read_bytes()
    h0 = time.perf_counter()
    hashlib.md5(data).hexdigest()
    h1 = time.perf_counter()
    phases["Parquet write (md5 streamed in)"] = t1 - t0
    phases["  of which md5 (for reference)"] = h1 - h0
    phases["DVC (cache copy + .dvc file)"] = t2 - t1
    phases["MLMD (one put_execution)"] = t3 - t2
    phases["total"] = t3 - t0
    return phases


def cmflib_commit(root: Path) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    metrics = {"train": {}}
    for i in range(ROWS):
        metrics["train"][i + 1] = row(i)
    path = root / "metrics" / "train.parquet"
    path.parent.mkdir(parents=True)
    t0 = time.perf_counter()
    pd.DataFrame.from_dict(metrics["train"], orient="index").to_parquet(path)
    t1 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", str(path)], cwd=root, check=True)
    file_md5(path)  # cmflib reads the hash back (dvc hashed the file once more)
    t2 = time.perf_counter()
    return {"DataFrame.from_dict + to_parquet": t1 - t0, "dvc add subprocess (+ md5)": t2 - t1, "total": t2 - t0}


def dvc_scaling(root: Path) -> dict[int, tuple[float, float]]:
    """Per-file tracking cost (median of 5) with few vs many files already tracked: ours vs dvc's Repo.add."""
    from dvc.repo import Repo

    store = Store(root / "ours")
    repo_dir = root / "theirs"
    repo_dir.mkdir(parents=True)
    (store.root / "artifacts").mkdir(parents=True)
    Repo.init(str(repo_dir), no_scm=True)
    repo = Repo(str(repo_dir))
    out = {}
    tracked = 0
    for target in (10, 200):
        while tracked < target:
            p = store.root / "artifacts" / f"f{tracked}.bin"
            p.write_bytes(f"x{tracked}".encode())
            store.dvc.track(p, file_md5(p), p.stat().st_size)
            q = repo_dir / f"f{tracked}.bin"
            q.write_bytes(f"x{tracked}".encode())
            repo.add(str(q))
            tracked += 1
        ours, theirs = [], []
        for k in range(5):
            p = store.root / "artifacts" / f"probe{target}-{k}.bin"
            p.write_bytes(f"probe{target}{k}".encode())
            t0 = time.perf_counter()
            store.dvc.track(p, file_md5(p), p.stat().st_size)
            ours.append(time.perf_counter() - t0)
            q = repo_dir / f"probe{target}-{k}.bin"
            q.write_bytes(f"probe{target}{k}".encode())
            t0 = time.perf_counter()
            repo.add(str(q))
            theirs.append(time.perf_counter() - t0)
        out[target] = sorted(ours)[2], sorted(theirs)[2]
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    public = public_commit(tmp / "public")
    ours = ray_cmf_commit(tmp / "ray_cmf")
    (tmp / "cmflib").mkdir()
    theirs = cmflib_commit(tmp / "cmflib")
    print(f"## commit_metrics of {ROWS:,} rows x 4 columns\n")
    print_table(
        ["ray_cmf", "time"],
        [["Cmf.commit_metrics (public API: flush + writer)", fmt_time(public)]]
        + [[f"phase: {k}", fmt_time(v)] for k, v in ours.items()],
    )
    print()
    print_table(["cmflib path", "time"], [[k, fmt_time(v)] for k, v in theirs.items()])
    print(f"\ncmflib total / ray_cmf commit_metrics: {theirs['total'] / public:.1f}x\n")
    print("## DVC tracking cost per file, by files already tracked (median of 5)\n")
    scaling = dvc_scaling(tmp / "dvc")
    print_table(
        ["files already tracked", "ray_cmf track", "dvc Repo.add", "ratio"],
        [[f"{n}", fmt_time(o), fmt_time(t), f"{t / o:,.0f}x"] for n, (o, t) in scaling.items()],
    )
    figures = {
        "ray_cmf": {"commit_metrics_s": public, **{f"phase: {k}": v for k, v in ours.items()}},
        "cmflib path": theirs,
        **{
            f"track with {n} files tracked": {"ray_cmf_s": o, "dvc_repo_add_s": t, "ratio": t / o}
            for n, (o, t) in scaling.items()
        },
    }
    save_results("commit", "benchmarks/bench_commit.py", figures, {"cmflib / ray_cmf >= 1": theirs["total"] >= public})


if __name__ == "__main__":
    main()
