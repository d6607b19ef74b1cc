"""DVC's formats, checked against DVC itself: what the store writes and hashes is what `dvc add` would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dvc.utils.serialize import load_yaml

from ray_cmf.versioning import tree_md5


def _dvc_add(repo: Path, target: str) -> dict[str, object]:
    for args in (["init", "--no-scm", "-q"], ["add", "-q", target]):
        done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return load_yaml(repo / f"{target}.dvc")["outs"][0]


def test_a_directory_hashes_as_dvc_add_hashes_it(tmp_path: Path) -> None:
    """``a/`` beside ``a.txt`` and ``a-b``: DVC orders the listing by relpath string, not by path parts."""
    data = tmp_path / "data"
    (data / "a" / "deeper").mkdir(parents=True)
    for name, text in {"a.txt": "1\n", "a/b.txt": "2\n", "a-b": "3\n", "a/deeper/ü.bin": "4\n", "B": ""}.items():
        (data / name).write_text(text, encoding="utf-8")
    recorded = _dvc_add(tmp_path, "data")
    assert tree_md5(data) == (recorded["md5"], recorded["size"])


def test_a_file_hashes_as_dvc_add_hashes_it(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\r\nweights\x00" * 1000)  # CRLF: DVC 3 hashes the bytes as they are
    recorded = _dvc_add(tmp_path, "model.bin")
    assert tree_md5(tmp_path / "model.bin") == (recorded["md5"], recorded["size"])


def test_a_tracked_file_is_what_dvc_add_leaves_behind(tmp_path: Path) -> None:
    """The store bypasses `dvc add` for speed: its .dvc file and cache object must be DVC's, byte for byte."""
    from ray_cmf.versioning import DvcRepo, cache_path, file_md5

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for repo in (ours, theirs):
        repo.mkdir()
        (repo / "series.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 40)
    _dvc_add(theirs, "series.parquet")
    data = ours / "series.parquet"
    DvcRepo(ours).track(data, file_md5(data), data.stat().st_size)
    assert (ours / "series.parquet.dvc").read_text() == (theirs / "series.parquet.dvc").read_text()
    md5 = file_md5(data)
    assert cache_path(ours, md5).relative_to(ours) == cache_path(theirs, md5).relative_to(theirs)
    assert cache_path(theirs, md5).read_bytes() == data.read_bytes()  # where DVC itself put it


def test_the_object_layout_is_dvc_datas() -> None:
    """ray_cmf computes where DVC keeps an object (importing dvc_data would cost a run's first log_metric
    0.17 s): the place must be the one dvc_data's own object database names."""
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    from ray_cmf.versioning import object_path

    for md5 in ("d41d8cd98f00b204e9800998ecf8427e", "0123456789abcdef0123456789abcdef"):
        for root in ("/store/.dvc/cache", "/remote/"):
            expected = HashFileDB(LocalFileSystem(), f"{root.rstrip('/')}/files/md5").oid_to_path(md5)
            assert object_path(root, md5) == expected
