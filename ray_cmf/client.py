"""The one way to reach the store's writer: :class:`WriterClient` (requests and their :class:`Reply`), and
:class:`WriterSink`, which sends a buffer's sealed chunks to it with a bound on the bytes in flight."""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from ray_cmf.binding import Binding, SeriesKey
from ray_cmf.errors import RayCmfError, StoreError
from ray_cmf.exits import signals_held
from ray_cmf.writer import StoreWriter, Tail, chunk_start

if TYPE_CHECKING:
    from ray_cmf.buffer import MetricBuffer
    from ray_cmf.lineage import Artifact

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_INFLIGHT_BYTES = 64 << 20  # per sink: sending waits beyond this (back-pressure)
MAX_RETAINED_BYTES = 256 << 20  # per sink: rows kept in memory while the writer cannot be reached
_RETRY_SECONDS = (0.2, 1.0, 5.0)


class Reply:
    """A request in flight (or, in-process, done): ``result()`` waits and raises the writer's error here."""

    def __init__(self, ref: Any = None, value: Any = None, error: BaseException | None = None) -> None:
        self._ref, self._value, self._error = ref, value, error

    @property
    def ref(self) -> Any:
        """The Ray object of the reply (an actor call's), for a request that depends on it."""
        return self._ref

    def done(self) -> bool:
        if self._ref is None:
            return True
        import ray

        return bool(ray.wait([self._ref], timeout=0)[0])

    def result(self, timeout: float | None = None) -> Any:
        """The writer's result; its error raised as it raised it, not as Ray's wrapper of it: ray_cmf's own
        errors alone, others with the wrapper (the actor's traceback) chained."""
        if self._ref is not None:
            import ray

            try:
                return ray.get(self._ref, timeout=timeout)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, RayCmfError):
                    raise exc.cause from None
                if isinstance(exc.cause, Exception):
                    raise exc.cause from exc
                raise
        if self._error is not None:
            raise self._error
        return self._value


class WriterClient:
    """The one way to reach the writer: an in-process :class:`StoreWriter`, or the job's writer actor.

    Requests are :class:`StoreWriter` methods with keyword arguments, e.g.
    ``client.call(StoreWriter.bind, kind="trial", name=trial_id, ...)``.
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self._local = isinstance(target, StoreWriter)

    def send(self, request: Callable[..., T], **kwargs: Any) -> Reply:
        """Start a request without waiting; it never raises here (see :meth:`Reply.result`).

        An argument may be the :class:`Reply` of an earlier request: the request then runs once that one is
        done, with its result (and fails with its error), and the caller never waits for it.
        """
        if self._local:
            try:
                resolved = {k: v.result() if isinstance(v, Reply) else v for k, v in kwargs.items()}
                return Reply(value=request(self._target, **resolved))
            except Exception as exc:
                return Reply(error=exc)
        refs = {k: v.ref if isinstance(v, Reply) else v for k, v in kwargs.items()}
        return Reply(ref=self._target.request.remote(request.__name__, **refs))  # see actor.WriterActor

    def call(self, request: Callable[..., T], **kwargs: Any) -> T:
        """Run a request and return its result (its error is raised here)."""
        return self.send(request, **kwargs).result()

    def wait_binding(self, kind: str, name: str, timeout: float, token: str | None = None) -> Binding | None:
        """The binding of a trial or run (of the start ``token`` names, see :meth:`StoreWriter.binding`),
        waiting up to ``timeout`` seconds for another process to make it."""
        return self.wait_for(StoreWriter.binding, timeout, kind=kind, name=name, token=token)

    def wait_for_trial(self, request: Callable[..., T | None], trial_id: str, timeout: float, **kwargs: Any) -> T:
        """:meth:`wait_for` a request about Tune trial ``trial_id``, which the driver's CmfRayLogger registers
        (maybe a moment after the trial started), but not while no CmfRayLogger's sweep runs: nothing would
        ever register it.

        Raises:
            RayCmfError: The trial is not registered, saying why.
        """

        def no_sweep() -> bool:
            return not self.call(StoreWriter.sweeps_running)

        found = self.wait_for(request, timeout, give_up=no_sweep, kind="trial", name=trial_id, **kwargs)
        if found is None:
            why = (
                "no CmfRayLogger runs a sweep in this Ray job"
                if no_sweep()
                else f"none was registered in {timeout:g} s"
            )
            raise RayCmfError(
                f"Tune trial {trial_id!r} is not registered with ray_cmf ({why}); add CmfRayLogger(...) to "
                "tune.RunConfig(callbacks=[...]) of the Tuner that runs it"
            )
        return found

    def wait_for(
        self,
        request: Callable[..., T | None],
        timeout: float,
        *,
        give_up: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> T | None:
        """Run a request until it returns something other than None (another process has made what it
        reads), for up to ``timeout`` seconds, or until ``give_up()`` says it never will; None if it never did."""
        deadline, pause = time.monotonic() + timeout, 0.05
        while (found := self.call(request, **kwargs)) is None:
            if time.monotonic() > deadline:
                return None
            if give_up is not None and give_up():
                return self.call(request, **kwargs)  # made while give_up was asked, or never
            time.sleep(pause)
            pause = min(pause * 2, 0.5)  # a long wait asks the writer twice a second, not twenty times
        return found

    def sink(self, key: SeriesKey | Callable[[], SeriesKey]) -> WriterSink:
        """A buffer sink that sends the series' sealed chunks here (``key`` may be resolved on first use)."""
        return WriterSink(self, key)


class WriterSink:
    """Sends a buffer's sealed chunks to the writer (runs on the buffer's spill thread).

    At most :data:`MAX_INFLIGHT_BYTES` are in flight: beyond that, sending waits for the writer. A chunk
    the writer could not take is kept (up to :data:`MAX_RETAINED_BYTES`, then the oldest are dropped with
    a warning) and sent again later; a failure never reaches the training loop.
    """

    def __init__(self, client: WriterClient, key: SeriesKey | Callable[[], SeriesKey]) -> None:
        self.client = client
        self._key = key
        self.session = uuid.uuid4().hex
        self._inflight: collections.deque[tuple[Reply, int, Any, int, int]] = collections.deque()
        self._inflight_bytes = 0
        self._skipped: list[tuple[int, int]] = []  # dropped chunks the writer has not been told of yet
        self._retained: collections.deque[tuple[int, Any, int]] = collections.deque()
        self._retained_bytes = 0
        self.dropped_rows = 0

    @property
    def key(self) -> SeriesKey:
        """The series, resolved on first use (e.g. once the trial's registration has completed)."""
        if not isinstance(self._key, SeriesKey):
            self._key = self._key()
        return self._key

    def __repr__(self) -> str:
        return "the ray_cmf writer"

    def write(self, batch: pa.RecordBatch) -> None:
        self._retry()
        self._send(chunk_start(batch), batch, batch.nbytes)
        while self._inflight and (self._inflight_bytes > MAX_INFLIGHT_BYTES or self._inflight[0][0].done()):
            self._settle_oldest()  # wait while too much is in flight; drop what the writer has taken

    def _send(self, first_row: int, batch: pa.RecordBatch, nbytes: int) -> None:
        skipped = tuple(self._skipped)
        reply = self.client.send(
            StoreWriter.append, key=self.key, session=self.session, first_row=first_row, batch=batch, skipped=skipped
        )
        self._inflight.append((reply, first_row, batch, nbytes, len(skipped)))
        self._inflight_bytes += nbytes

    def _settle_oldest(self) -> None:
        reply, first_row, payload, nbytes, told = self._inflight.popleft()
        self._inflight_bytes -= nbytes
        try:
            reply.result()
        except Exception as exc:
            self._retain(first_row, payload, nbytes, exc)
        else:
            del self._skipped[:told]  # the writer knows of those holes now

    def _retain(self, first_row: int, payload: Any, nbytes: int, exc: BaseException) -> None:
        if not self._retained:
            why = f"{type(exc).__name__}: {exc}"
            log.warning("ray_cmf: could not send rows to the writer (%s); keeping them in memory and retrying", why)
        self._retained.append((first_row, payload, nbytes))
        self._retained_bytes += nbytes
        while self._retained_bytes > MAX_RETAINED_BYTES and len(self._retained) > 1:
            first, dropped, size = self._retained.popleft()
            self._retained_bytes -= size
            rows = dropped.num_rows
            self.dropped_rows += rows
            self._skipped.append((first, rows))
            log.warning("ray_cmf: dropped %d unsent rows of %s (the writer is unreachable)", rows, self.key.spill_name)

    def _retry(self) -> None:
        """Send the kept chunks again, oldest first."""
        while self._retained:
            first_row, payload, nbytes = self._retained.popleft()
            self._retained_bytes -= nbytes
            self._send(first_row, payload, nbytes)

    def flush(self, retries: tuple[float, ...] | None = None) -> None:
        """Wait until the writer has every chunk; send kept ones again at once, and after each pause of
        ``retries`` (by default :data:`_RETRY_SECONDS`); raise if some still failed."""
        with signals_held():
            self._flush(retries)

    def _flush(self, retries: tuple[float, ...] | None) -> None:
        self._retry()
        for pause in (*(_RETRY_SECONDS if retries is None else retries), None):
            while self._inflight:
                self._settle_oldest()
            if not self._retained or pause is None:
                break
            time.sleep(pause)
            self._retry()
        if self._retained:
            raise StoreError(
                f"The ray_cmf writer did not take {len(self._retained)} chunks of {self.key.spill_name}; "
                "they stay in memory and are sent again at the next flush"
            )

    def commit(self, buffer: MetricBuffer, **request: Any) -> Artifact | None:
        """Commit the series (``request``: :meth:`StoreWriter.commit`'s options) with the rows ``buffer`` has
        not sealed riding on the request: one round trip to the writer, where a flush and then a commit make
        two. Rows the request could not deliver are kept, and sent again by the next flush."""
        with signals_held():
            batch = buffer.take()
            try:
                self._flush(None)  # the chunks sealed before go first: the writer puts a session's chunks in order
                told = len(self._skipped)
                tail = Tail(self.session, batch, tuple(self._skipped)) if batch is not None else None
                artifact = self.client.call(StoreWriter.commit, key=self.key, tail=tail, **request)
            except BaseException as exc:  # a second Ctrl-C too: the rows taken stay
                if batch is not None:
                    self._retain(chunk_start(batch), batch, batch.nbytes, exc)
                raise
            if tail is not None:
                del self._skipped[:told]
            return artifact

    def close(self) -> None:
        """Hand every chunk to the writer, trying kept ones once more (at exit there is no time to wait);
        what still fails is warned about and dropped."""
        try:
            self.flush(retries=())
        except StoreError as exc:
            log.warning("ray_cmf: %s; closing drops them", exc)
