"""Shared fixtures: a fresh store per test; one Ray instance per session for the integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ray_cmf import Store
from tests._browser import CHROMIUM, CHROMIUM_ARGS
from tests._require import require
from tests._servers import FAKE_AWS

# Before anything imports ray (the sweep fixture's module below does): ray reads these when it loads, and a
# one-node Ray then stays on 127.0.0.1, as under `make test`, which exports them too.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> Store:
    return Store(store_dir)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray instance for the whole test session (4 logical CPUs, no dashboard)."""
    import ray

    os.environ.update(FAKE_AWS)  # before Ray starts, so that the writer actor can reach moto's S3 too
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


from tests.test_tune import sweep  # noqa: E402,F401  (one real sweep per session, shared with the compare tests)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium (the report tests'); CI fails where it is missing."""
    require(None if CHROMIUM is not None else "no chromium on this machine (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
