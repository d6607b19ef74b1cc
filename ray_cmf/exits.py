"""Exit hooks: every way a process or a training thread ends hands the live buffers' rows over first.

Two kinds of end:
- the process: ``atexit`` (normal exit, an uncaught exception, SIGINT) and a SIGTERM handler that chains
  to the one it replaces (Ray stops workers with SIGTERM). Only SIGKILL escapes them.
- a training thread: Ray runs a Tune trainable and a Train loop in a thread of their own and reports the
  trial's or run's end only once that thread is gone. :func:`on_thread_end` runs while the thread is
  still alive (CPython frees a thread's locals before ``join`` and ``is_alive`` see it end), so its
  actions finish before Ray can stop the process.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Protocol

from ray_cmf.constants import ERROR_PROPERTY, HOLDER_HOST, HOLDER_PID
from ray_cmf.errors import recorded_error

ENDED_STATES = ("COMPLETE", "FAILED", "CANCELED")  # the states an execution ends in (what close(state=...) takes)

log = logging.getLogger(__name__)


class Closeable(Protocol):
    def close(self) -> None: ...


_LIVE: dict[int, weakref.ref[Any]] = {}  # what track() was given, in order, while it lives
_installed = {"atexit": False, "signals": False}
# what a signal that arrived while the main thread handed rows over or committed (see signals_held) does once it
# is done: run by the outermost such section as it ends
_held: dict[str, Any] = {"depth": 0, "action": None, "closing": False}
_ending: dict[str, str | None] = {"state": "COMPLETE", "error": None}  # how the process ends (see outcome())
# how the last sys.exit would end the process: applied at exit, forgotten once ray_cmf tracks anything after it
# (the SystemExit was caught: argparse's, in a test or a notebook, say)
_exit_called: dict[str, tuple[str, str | None] | None] = {"by": None}


def outcome() -> tuple[str, str | None]:
    """How this process is ending, as the state of an execution it ran: ``COMPLETE``, ``FAILED`` (an
    uncaught exception) or ``CANCELED`` (SIGTERM, or Ctrl-C); and the uncaught exception's text, if any."""
    return _ending["state"] or "COMPLETE", _ending["error"]


def error_properties(state: str | None, error: str | None) -> dict[str, str]:
    """What an execution that ends as ``state`` records of ``error``: the error where it FAILED with one."""
    return {ERROR_PROPERTY: error} if state == "FAILED" and error else {}


def error_text(error: BaseException) -> str:
    """An exception as an execution records it: its type and message (``ValueError: bad batch``)."""
    return recorded_error("".join(traceback.format_exception_only(type(error), error)))


def track(closeable: Closeable) -> None:
    """Close ``closeable`` on every exit path of the process (see :func:`close_all`).

    The SIGTERM handler (and one that holds Ctrl-C during a commit, see :func:`signals_held`) is installed the
    first time this runs on the main thread (Python lets no other thread install one): in a script or a driver,
    as soon as it logs there. A Tune trainable or a Train loop runs on a thread of its own and hands its rows
    over as that thread ends instead.
    """
    _exit_called["by"] = None
    key = id(closeable)
    _LIVE.pop(key, None)  # tracked again: it closes as if tracked now
    _LIVE[key] = weakref.ref(closeable, lambda _: _LIVE.pop(key, None))
    if not _installed["atexit"]:
        _installed["atexit"] = True
        atexit.register(close_all)
        sys.excepthook = functools.partial(_note_uncaught, sys.excepthook)
        sys.exit = _noting_exit(sys.exit)
    if not _installed["signals"] and threading.current_thread() is threading.main_thread():
        _installed["signals"] = True
        signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, signal.getsignal(signal.SIGTERM)))
        _hold_ctrl_c()


def _hold_ctrl_c() -> None:
    """Put ray_cmf's Ctrl-C handler (see :func:`signals_held`) in place of Python's own, from the main thread:
    at the first track, and again wherever Python's came back since (Tune's ``fit()`` puts it back at the first
    Ctrl-C, over buffers it opened while its own handler was in place). Another handler is left as it is."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Python's own: a KeyboardInterrupt
        signal.signal(signal.SIGINT, _on_sigint)


class _SignalsHeld:
    """See :func:`signals_held` (one object, entered and left by the main thread only: a signal handler runs
    there)."""

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            if not _held["depth"]:
                _hold_ctrl_c()
            _held["depth"] += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        _held["depth"] -= 1
        action = _held["action"] if not _held["depth"] else None
        if action is not None:
            _held["action"] = None
            action()


_SIGNALS_HELD = _SignalsHeld()


def signals_held() -> contextlib.AbstractContextManager[None]:
    """Hold SIGTERM and Ctrl-C off while the main thread holds a lock that closing the runs takes (a buffer's
    hand-over, a commit): SIGTERM's handler, closing every run from inside, waited for that lock (the process
    hung), and a KeyboardInterrupt in a commit dropped the rows it had taken from its buffer. Each acts as the
    outermost such section ends; a second one while held acts at once (Ctrl-C raises there, SIGTERM ends the
    process without closing: ``recover`` commits its rows). Cheap: a buffer's hand-over takes it."""
    return _SIGNALS_HELD


def _hold(action: Callable[[], None]) -> bool | None:
    """Keep ``action`` for the end of the section (True), where a section runs and holds none yet; None where
    one is held already (this is the second signal); False where no section runs."""
    if not _held["depth"]:
        return False
    if _held["action"] is not None:
        return None
    _held["action"] = action
    return True


def _on_sigint(signum: int, frame: Any) -> None:
    """Python's Ctrl-C (a KeyboardInterrupt), raised as a commit ends where one runs (see :func:`signals_held`);
    none while the process's end commits the runs' last rows: it ends anyway, and they would be left behind."""
    if _held["closing"]:
        log.warning("ray_cmf: Ctrl-C: committing the runs' last rows first (SIGTERM or SIGKILL stops that)")
        return
    if not _hold(functools.partial(signal.default_int_handler, signum, None)):
        signal.default_int_handler(signum, frame)


def close_all() -> None:
    """Close every live tracked object, the last tracked first (as ``atexit`` runs its functions): what
    was built on a buffer (a Cmf, a StepLogger) closes before the buffer does. One that fails is warned
    about, and the others still close. A ``sys.exit`` that ends the process decides how they end."""
    if _exit_called["by"] is not None:
        _ending["state"], _ending["error"] = _exit_called["by"]
    if threading.current_thread() is threading.main_thread():
        _hold_ctrl_c()
    _held["closing"] = True  # a Ctrl-C now waits for the last commits (see _on_sigint)
    try:
        for ref in reversed(list(_LIVE.values())):
            closeable = ref()
            if closeable is not None:
                _close_quietly(closeable.close, closeable)
    finally:
        _held["closing"] = False


def ended_by(error: BaseException | None) -> tuple[str, str | None]:
    """The state of an execution that ended with ``error`` (None: none), and the error it records: a
    ``SystemExit`` of code 0 or None is a success, of any other code a failure."""
    if error is None or (isinstance(error, SystemExit) and error.code in (0, None)):
        return "COMPLETE", None
    return "CANCELED" if isinstance(error, KeyboardInterrupt) else "FAILED", error_text(error)


def _note_uncaught(previous: Any, kind: type[BaseException], error: BaseException, trace: Any) -> None:
    """Remember that an uncaught exception ends the process (then report it as before); at an interactive
    prompt, which shows the error of a statement this way and goes on, it ends nothing."""
    if not _interactive():
        _ending["state"], _ending["error"] = ended_by(error)
    previous(kind, error, trace)


def _interactive() -> bool:
    """Whether an interactive prompt runs this process (``python -i``, the plain REPL)."""
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


def _noting_exit(previous: Callable[..., NoReturn]) -> Callable[..., NoReturn]:
    """``sys.exit`` that remembers how its code ends the process (Python shows no hook a ``SystemExit``)."""

    def exit(code: Any = None) -> NoReturn:
        _exit_called["by"] = ended_by(SystemExit(code))
        previous(code)

    return exit


def _on_sigterm(previous: Any, signum: int, frame: Any) -> None:
    """Do what SIGTERM did before ray_cmf, closing everything (``CANCELED``) where that ends the process: the
    default exit, or a previous handler that raises (``sys.exit``, as Ray's does). A handler that returns, or
    SIG_IGN, lets the process go on (a graceful stop that finishes its step first), and its runs with it.
    During a commit, it acts as the commit ends (see :func:`signals_held`)."""
    held = _hold(functools.partial(_on_sigterm, previous, signum, None))
    if held:
        return
    if held is None:  # a second SIGTERM during the commit: end now, the rows stay spilled for ``recover``
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if callable(previous):
        try:
            previous(signum, frame)
        except BaseException:
            _cancel_all()
            raise
    elif previous != signal.SIG_IGN:
        _cancel_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _cancel_all() -> None:
    """Close everything as ended by a signal: ``CANCELED``, whatever exit code a handler's ``sys.exit`` gave."""
    _ending["state"], _exit_called["by"] = "CANCELED", None
    close_all()


class _ThreadEnd:
    """Held only by one thread's locals, so it is freed, and runs its actions, as that thread ends."""

    def __init__(self) -> None:
        self.actions: list[Callable[[], None]] = []

    def __del__(self) -> None:
        for action in self.actions:
            _close_quietly(action, action)


_THREAD = threading.local()


def on_thread_end(action: Callable[[], None]) -> None:
    """Run ``action`` when the current thread ends, in that thread, however it ends (return or raise)."""
    if not hasattr(_THREAD, "end"):
        _THREAD.end = _ThreadEnd()
    _THREAD.end.actions.append(action)


def _close_quietly(action: Callable[[], None], what: object) -> None:
    """Run a closing ``action``; one that fails is warned about, so that the others still run. One that a Ctrl-C
    interrupts (a second one, during the commit the first one's exit makes) runs once more: its rows are kept."""
    for attempt in range(2):
        try:
            action()
            return
        except KeyboardInterrupt:
            if attempt:
                log.warning("ray_cmf: at exit, Ctrl-C stopped handing over the rows of %s twice", what)
        except Exception as exc:  # one broken sink must not keep the others' rows
            log.warning("ray_cmf: at exit, could not hand over the rows of %s: %s", what, exc)
            return


# -- who holds a running execution ---------------------------------------------------------------------
CRASHED = "CRASHED"  # the status of an execution whose holder died without ending it


def holder() -> dict[str, Any]:
    """This process, as the holder of the executions it marks RUNNING: only it will end them."""
    return {HOLDER_HOST: socket.gethostname(), HOLDER_PID: os.getpid()}


def process_alive(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` of ``host`` runs; None when ``host`` is another machine (unknown from here)."""
    if host != socket.gethostname():
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits only to be reaped (a killed driver's writer, for a while): it will
    never run again, though signalling it still succeeds."""
    import psutil  # here: every process that logs imports this module, few ever ask this

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def running_holder(state: str, props: Mapping[str, Any]) -> tuple[str, int] | None:
    """The (host, pid) that holds a RUNNING execution; None when it is not running or names no holder."""
    if state != "RUNNING" or HOLDER_PID not in props:
        return None
    return str(props.get(HOLDER_HOST)), int(props[HOLDER_PID])


def shown_status(state: str, props: Mapping[str, Any]) -> str:
    """A run's status from its MLMD ``state`` and properties: the one recorded, except ``CRASHED`` for one still
    RUNNING whose process is gone."""
    status = str(props.get("status") or state)
    return CRASHED if status == "RUNNING" and abandoned(state, props) else status


def abandoned(state: str, props: Mapping[str, Any]) -> bool:
    """Whether a RUNNING execution will never be ended: its holder, on this machine, is gone."""
    held = running_holder(state, props)
    return held is not None and process_alive(*held) is False
