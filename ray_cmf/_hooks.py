"""Callback hooks that never raise: nothing ray_cmf records may end the sweep or the training it records."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any


def never_raises(goes_on: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Make a hook's failure a warning that names the hook, and says that ``goes_on`` ("the sweep") goes on."""

    def wrap(hook: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(hook)
        def guarded(*args: Any, **kwargs: Any) -> None:
            try:
                hook(*args, **kwargs)
            except Exception as exc:
                logging.getLogger(hook.__module__).warning(
                    "ray_cmf: %s failed, %s goes on: %s: %s", hook.__name__, goes_on, type(exc).__name__, exc
                )

        return guarded

    return wrap
