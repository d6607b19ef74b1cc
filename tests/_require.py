"""What a test needs from the machine: without it the test skips and says why, except in CI (``$CI`` set),
where a missing component is a failure that names it, so that CI can never pass by skipping."""

from __future__ import annotations

import os

import pytest


def require(missing: str | None) -> None:
    """Skip (or, in CI, fail) with ``missing`` as the reason; do nothing when it is None."""
    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI needs this component, and it is missing: {missing}", pytrace=False)
    pytest.skip(missing)
