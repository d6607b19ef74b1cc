"""Faults injected for real: a locked MLMD database, damaged files, a read-only store, a full disk.

For each: training goes on, the message says what happened, nothing committed before is lost, and
``ray-cmf verify`` is clean or names exactly the damaged file.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_cmf import Cmf, Store, recover
from ray_cmf.cli import main
from ray_cmf.constants import MLMD_FILE, SPILL_DIR
from ray_cmf.lineage import properties
from ray_cmf.series_format import read_segments
from tests._cluster import unshare_skip_reason
from tests._require import require


def _verify(store: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str]]:
    capsys.readouterr()
    code = main(["verify", "--store", str(store), "--json"])
    return code, {row["url"]: row["status"] for row in json.loads(capsys.readouterr().out)}


def test_mlmd_locked_by_another_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    cmf = Cmf(pipeline_name="p", store=store)
    cmf.log_metric("a", {"x": 1})
    first = cmf.commit_metrics("a")
    holder = subprocess.Popen(  # a second process holds a write transaction on the SQLite file
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(120)",
            str(store / MLMD_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        cmf.log_metric("a", {"x": 2})  # training goes on
        with caplog.at_level(logging.WARNING):
            assert cmf.commit_metrics("a") is None
        assert "could not commit 'a'" in caplog.text and "Concurrent writes aborted" in caplog.text
        assert list((store / SPILL_DIR).iterdir())  # the rows stay spilled
    finally:
        holder.kill()
        holder.wait()
    assert cmf.commit_metrics("a") is not None  # commit again once the lock is gone: nothing lost
    assert cmf.read_metrics("a")["x"].tolist() == [1, 2]
    assert cmf.read_metrics("a", commit=properties(first)["Commit"])["x"].tolist() == [1]
    code, statuses = _verify(store, capsys)
    assert code == 0 and set(statuses.values()) == {"ok"}


def test_truncated_parquet_and_deleted_cache_object_are_named_by_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    cmf = Cmf(pipeline_name="p", store=store)
    urls = {}
    md5s = {}
    for name in ("torn", "uncached", "intact"):
        cmf.log_metric(name, {name: 1.5})  # different contents: one cache object each
        props = properties(cmf.commit_metrics(name))
        urls[name], md5s[name] = props["url"], props["Commit"]
    torn = Store(store).resolve(urls["torn"])
    torn.write_bytes(torn.read_bytes()[:-100])
    Store(store).dvc.cache_path(md5s["uncached"]).unlink()
    code, statuses = _verify(store, capsys)
    assert code == 1
    assert statuses[urls["torn"]] == "modified" and statuses[urls["uncached"]] == "cache-missing"
    assert statuses[urls["intact"]] == "ok"


def test_torn_spill_segment_keeps_its_complete_batches(tmp_path: Path) -> None:
    store = tmp_path / "store"
    child = textwrap.dedent(
        """
        import os, sys
        from ray_cmf import Cmf
        cmf = Cmf(pipeline_name="p", store=sys.argv[1], flush_rows=100)
        for i in range(1000):
            cmf.log_metric("s", {"i": i})
        cmf.flush()
        os._exit(0)  # dies with its exit hooks unrun, as under SIGKILL
        """
    )
    subprocess.run([sys.executable, "-c", child, str(store)], check=True)  # dies: all 1000 rows spilled
    [segment] = (store / SPILL_DIR).glob("*/seg-*.arrows")
    segment.write_bytes(segment.read_bytes()[:-50])  # the last batch is torn
    [artifact] = recover(Store(store))
    assert properties(artifact)["rows"] == 900  # every complete batch, in order
    assert sum(b.num_rows for b in read_segments(segment.parent)) == 0  # the spill was consumed


NAMESPACE_CHILD = textwrap.dedent(
    """
    import json, logging, subprocess, sys
    from ray_cmf import Cmf
    from ray_cmf.audit import audit
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store, rows, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cmf = Cmf(pipeline_name="p", store=store, flush_rows=1000)
    cmf.log_metric("after", {"i": -1.0})
    if fault:  # the fault strikes mid-run
        subprocess.run(fault, shell=True, check=True)
    for i in range(rows):
        cmf.log_metric("after", {"i": float(i), "pad": "x" * 50})
    artifact = cmf.commit_metrics("after")
    cmf.log_metric("after", {"i": -2.0})  # training still goes on
    print(json.dumps({"committed": artifact is not None, "verify": [f.status for f in audit(cmf.store)]}))
    """
)


def _in_namespace(setup: str, store: Path, rows: int, fault: str = "") -> subprocess.CompletedProcess[str]:
    """Run the child in a private mount namespace (as root), after ``setup``; ``fault`` strikes mid-run."""
    require(unshare_skip_reason())
    command = f'{setup} && exec {sys.executable} -c "$CHILD" {store} {rows} "$FAULT"'
    return subprocess.run(
        ["unshare", "-m", "bash", "-c", command],
        env={**os.environ, "CHILD": NAMESPACE_CHILD, "FAULT": fault},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _committed_before(store: Path) -> str:
    cmf = Cmf(pipeline_name="p", store=store)
    cmf.log_metric("before", {"x": 1})
    return properties(cmf.commit_metrics("before"))["url"]


def test_read_only_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    before = _committed_before(store)
    # mid-run, the store's file directories become read-only (the open MLMD file keeps the store's own
    # mount busy, so each directory gets a read-only bind mount of its own)
    fault = " && ".join(
        f"mkdir -p {store / d} && mount --bind {store / d} {store / d} && mount -o remount,bind,ro {store / d}"
        for d in ("spill", "artifacts")
    )
    done = _in_namespace("true", store, 3000, fault=fault)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["committed"] is False and set(result["verify"]) == {"ok"}  # training went on; old files intact
    assert "Read-only file system" in done.stderr and "could not commit 'after'" in done.stderr
    code, statuses = _verify(store, capsys)
    assert code == 0 and statuses[before] == "ok" and set(statuses.values()) == {"ok"}


def _on_read_only(store: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a private mount namespace (as root) where ``store`` is mounted read-only."""
    require(unshare_skip_reason())
    script = f'mount --bind {store} {store} && mount -o remount,bind,ro {store} && exec "$@"'
    return subprocess.run(["unshare", "-m", "bash", "-c", script, "-", *command], capture_output=True, text=True)


def test_a_store_read_only_from_the_start_is_a_clear_error_and_still_readable(tmp_path: Path) -> None:
    store = tmp_path / "store"
    before = _committed_before(store)
    opened = _on_read_only(
        store, sys.executable, "-c", f"from ray_cmf import Cmf; Cmf(pipeline_name='p', store='{store}')"
    )
    assert opened.returncode == 1
    assert f"StoreError: Store directory {store} is not writable" in opened.stderr
    assert "Read-only file system" in opened.stderr and "Name a writable store" in opened.stderr
    cli = str(Path(sys.executable).parent / "ray-cmf")
    verified = _on_read_only(store, cli, "verify", "--store", str(store), "--json")
    assert verified.returncode == 0, verified.stderr
    statuses = {row["url"]: row["status"] for row in json.loads(verified.stdout)}
    assert statuses[before] == "ok" and set(statuses.values()) == {"ok"}
    listed = _on_read_only(store, cli, "pipelines", "--store", str(store), "--json")
    assert [row["pipeline"] for row in json.loads(listed.stdout)] == ["p"]


def test_disk_full_during_spill_and_commit(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    store = disk / "store"
    first = f"import pathlib, tests.test_faults as t; t._committed_before(pathlib.Path('{store}'))"
    script = f'mount -t tmpfs -o size=3m none {disk} && {sys.executable} -c "{first}"'
    done = _in_namespace(script, store, 60_000)  # about 4 MB of rows for a 3 MB disk
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["committed"] is False and set(result["verify"]) == {"ok"}  # the earlier commits survive
    assert "No space left on device" in done.stderr
