"""Headless Chromium (Debian's) for the report tests (the ``browser`` fixture is in conftest): pages opened
with their console errors and requests recorded, and screenshots kept in ``test-artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [  # the flags that keep Chromium off the network on a closed machine
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"  # the screenshots, kept after the run


def open_report(browser: Any, url: str, *, offline: bool) -> tuple[Any, list[str], list[str]]:
    """The report at ``url`` once its first curve is drawn; and the requests and errors it makes."""
    context = browser.new_context(offline=offline, viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    errors: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = context.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#curve-0 .scatterlayer .trace').length > 0")
    return page, requests, errors


def screenshot(page: Any, name: str) -> None:
    """Keep what the user saw (``test-artifacts/<name>``, kept after the run)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    assert (ARTIFACTS / name).stat().st_size > 10_000
