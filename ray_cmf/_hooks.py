"""Callback hooks that never raise, and work they hand to a thread that still runs as Python ends: nothing
ray_cmf records may end the sweep or the training it records, nor be dropped as the driver ends."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")


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


def submit_or_run(executor: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``executor.submit(fn, *args)``, or ``fn`` run here, done, where the executor takes no more work: Python
    shuts every thread pool down before the exit hooks run, and a driver that ends before its sweep or run
    did (Ctrl-C pressed twice) commits them in an exit hook."""
    try:
        return executor.submit(fn, *args)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done
