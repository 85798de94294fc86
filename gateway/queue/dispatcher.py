"""Asynchronous inference: feed an async service's input queue to its workers, results to its sink.

One ``Dispatcher`` per predict service with ``async: true``. It is a consumer of the input
queue ``<svc>`` (group ``eas``, uid ``gateway-dispatcher``) with at most ``window`` records
at the workers, the service's worker capacity (see ``worker_capacity``), and for each record:

1. sends the record's data to a worker as a synchronous predict of that body would be
   sent (the dataplane's ``record_call``, gateway/core/dataplane.py), the record's tags
   as its headers (``requestId`` and ``status`` excepted; only tags that are valid header
   names and values), so a ``Content-Type`` or ``X-Eas-Request-Format`` tag acts as the
   header of a sync call;
2. writes the worker's reply to the sink ``<svc>/sink`` under the input's request id
   (the store dedupes puts by request id, so a redelivered record never yields a second
   result), with the input's tags copied and ``status`` = the reply's status code;
3. waits until that put is durable, and only then commits the input record.

Steps 2 and 3 are the finisher's (finisher.py): a record leaves its worker slot as soon as
the worker answered, and the results that finished meanwhile are written in one sink put and
their inputs committed in one commit. So the workers are fed while results are written.

A crash anywhere before 3 leaves the input uncommitted, so it is delivered again after a
restart (work may repeat, results are never lost or doubled). A processor error (any
reply status) is a result like any other, an empty error reply too (with a message as
its data); only a 200 with an empty body writes nothing (EAS: the way to bypass the
sink). While the service has no ready worker (booting after a restart, a slow model)
the dispatcher takes no input and in-flight records wait for one, without spending their
retry budget. Pool trouble while workers are up (overload, a dead connection) is retried
with backoff for ``retry_for_s`` before an error result is written; a timeout is retried
``timeout_attempts`` times. When the sink is full the dispatcher takes no new input until
it has room again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol

from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, TAG_REQUEST_ID, TAG_STATUS
from gateway.config import Config, ServiceConfig
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.dataplane import DataPlane
from gateway.queue.finisher import DISPATCH_GROUP, SINK_FULL_POLL_S, Finished, Finisher, FinishStats
from gateway.queue.records import Record
from gateway.queue.store import Queue

log = logging.getLogger("gateway.dispatcher")

DISPATCH_UID = "gateway-dispatcher"
# In flight per worker: one computing and one waiting on its socket, so a worker never idles
# between replies.
PER_WORKER_INFLIGHT = 2
# More for a quick model: as many as a worker computes in QUEUED_S, up to FAST_PER_WORKER.
# Under load a turn of the gateway's event loop (answering puts, writing results) takes
# longer than a small model's inference, and a worker holding a single request besides the
# one it computes idles until the gateway sends it the next. A record waits about QUEUED_S
# more at most, so a slow model's records never get near their timeout from waiting.
FAST_PER_WORKER = 8
QUEUED_S = 0.002
READY_POLL_S = 0.25
# Records the dispatcher's consumer holds on top of its window: finished ones whose results
# are being written (the next records go to the workers meanwhile).
FINISH_ROOM = 64


def worker_capacity(service: ServiceConfig, compute_s: float = 0.0) -> int:
    """The dispatcher's window: what the service's workers can hold at once.

    Per worker one request computing and one waiting, or with inferences that take
    ``compute_s`` (0: not known) as many as a worker computes in ``QUEUED_S`` (up to
    ``FAST_PER_WORKER``); with dynamic batching at least one full batch computing and the next
    one filling (``2 x max_batch_size``), so batches can fill. Never more than ``max_pending``
    (the pool refuses beyond it) or the queue's ``max_window``."""
    per_worker = PER_WORKER_INFLIGHT
    if compute_s > 0:
        per_worker = max(per_worker, min(FAST_PER_WORKER, int(QUEUED_S / compute_s)))
    if service.batching.max_batch_size > 1:
        per_worker = max(per_worker, 2 * service.batching.max_batch_size)
    # An autoscaled service's workers come and go: the window is that of the most it may run.
    workers = service.workers if service.autoscale is None else service.autoscale.max_workers
    return max(1, min(workers * per_worker, service.max_pending, service.queue.max_window))


# Input tags that are not handed to the worker as headers: the reserved queue tags (the
# request id travels as the request's own id) and what the predict route drops too.
_NOT_HEADERS = frozenset(
    h.lower()
    for h in (
        TAG_REQUEST_ID, TAG_STATUS, "Authorization", "Content-MD5", "Date", "Host", "Connection",
        "Content-Length", "Transfer-Encoding", "Keep-Alive", "Cookie", "Upgrade", "Proxy-Authorization",
    )
)  # fmt: skip
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def tag_headers(tags: Mapping[str, str]) -> dict[str, str]:
    """An input record's tags as the headers of the worker request (a sync predict's view)."""
    return {
        k: v
        for k, v in tags.items()
        if k.lower() not in _NOT_HEADERS and _HEADER_NAME.fullmatch(k) and not _BAD_VALUE.search(v)
    }


async def _durable(d: Any) -> None:
    if d is not None:
        await d


class Dispatcher:
    """Moves records of one async service from its input queue through its pool to its sink."""

    def __init__(
        self,
        service: ServiceConfig,
        pool: ServiceBackend,
        input_q: Queue,
        sink_q: Queue,
        make_request: Callable[..., Any],
        *,
        window: int | None = None,
        retry_for_s: float = 60.0,
        timeout_attempts: int = 2,
        plane: DataPlane | None = None,
    ) -> None:
        self.service = service
        self.pool = pool
        # The same dispatch and error table as a synchronous predict of this service: the
        # gateway's own dataplane (so its figures count these calls), or one of its own.
        self.plane = plane or DataPlane([service], {service.name: pool}, make_request=make_request)
        self.input_q = input_q
        self.sink_q = sink_q
        # The records at the workers at once: worker_capacity, as the workers' compute time
        # measured so far allows (``window`` given: that, fixed).
        self.window = window or worker_capacity(service)
        self._fixed = window is not None
        self._compute_s = 0.0  # a moving mean of the workers' compute time per record
        self.retry_for_s = retry_for_s
        self.timeout_attempts = timeout_attempts
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()  # records at the workers
        self._backlog: deque[Record] = deque()  # taken, waiting for a worker slot
        self._consumer: Any = None
        self._stopping = False
        self.stats = FinishStats()
        self.finisher = Finisher(service.name, input_q, sink_q, self.stats)
        self._finishing: asyncio.Task[None] | None = None
        self.retries_total = 0
        self.ready_waits = 0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        # Room for the largest window the workers' compute time can open, and for finishing.
        most = self.window if self._fixed else worker_capacity(self.service, QUEUED_S / FAST_PER_WORKER)
        held = most + max(most, FINISH_ROOM)
        c, dur = self.input_q.connect(DISPATCH_GROUP, DISPATCH_UID, 0, held, False, {})
        await _durable(dur)
        c.wake = self._wake.set
        self._consumer = c
        name = self.service.name
        self._finishing = asyncio.create_task(self.finisher.run(), name=f"dispatcher-finisher:{name}")
        self._task = asyncio.create_task(self._run(), name=f"dispatcher:{name}")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop taking input; let in-flight records finish (up to ``timeout``), then leave.

        Records still in flight at the deadline (at a worker, or their result not written
        yet) are cancelled uncommitted: the queue redelivers them to the next dispatcher
        (after a restart).
        """
        self._stopping = True
        self._wake.set()
        deadline = time.monotonic() + timeout
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._inflight:
            _done, pending = await asyncio.wait(set(self._inflight), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if self._finishing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.finisher.drained(), max(0.0, deadline - time.monotonic()))
            self._finishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._finishing
        if self._consumer is not None:
            self.input_q.disconnect(self._consumer)
            self._consumer = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "inflight": len(self._inflight) + len(self._backlog) + self.finisher.busy,
            "results_total": self.stats.results_total,
            "errors_total": self.stats.errors_total,
            "empty_total": self.stats.empty_total,
            "retries_total": self.retries_total,
            "sink_full_waits": self.stats.sink_full_waits,
            "ready_waits": self.ready_waits,
        }

    # ---------------------------------------------------------------- readiness
    def _ready(self) -> bool:
        """Whether the service's backend takes calls (one that cannot tell counts as ready:
        its dispatch then says what is wrong)."""
        try:
            return self.pool.is_ready()
        except Exception:
            return True

    async def _wait_ready(self) -> None:
        """Until a worker is ready (workers booting after a restart, a slow model loading)."""
        self.ready_waits += 1
        while not self._ready():
            with contextlib.suppress(Exception):
                # A wait that ends at once without readiness (a pool served by remote
                # workers only does not wait for them) must not spin the event loop.
                if await self.pool.wait_ready(READY_POLL_S) and self._ready():
                    break
            await asyncio.sleep(READY_POLL_S)

    # ---------------------------------------------------------------- main loop
    def _sink_full(self) -> bool:
        """No room in the sink for one more result (counting those being finished)."""
        q = self.sink_q
        held = len(q.records) + q.inflight + self.finisher.unwritten
        return held >= q.cfg.max_length or 0 < q.max_bytes <= q.bytes

    async def _run(self) -> None:
        while not self._stopping:
            if not self._ready():
                # No worker to run anything: leave the input in the queue until one is up.
                await self._wait_ready()
                continue
            if self._sink_full():
                # Backpressure: hold the input until consumers drain the sink.
                # (The store has no drain notification: poll.)
                self.stats.sink_full_waits += 1
                await asyncio.sleep(SINK_FULL_POLL_S)
                continue
            # Woken when records arrive, a worker slot frees or the consumer has room again
            # (inputs committed): whatever happens while feeding sets it again.
            self._wake.clear()
            self._feed()
            await self._wake.wait()

    def _feed(self) -> None:
        """Fill the free worker slots."""
        room = self.window - len(self._inflight)
        if room <= 0:
            return
        self._refill(room)
        while self._backlog and len(self._inflight) < self.window:
            t = asyncio.create_task(self._slot(self._backlog.popleft()))
            self._inflight.add(t)
            t.add_done_callback(self._done)

    async def _slot(self, rec: Record) -> None:
        """One worker slot: its record, then the next one at once while there is one, so the
        worker gets its next request as soon as it answered (not a few loop turns later,
        through the feeder: with small models that is longer than an inference)."""
        while True:
            await self._handle_safe(rec)
            nxt = self._next_record()
            if nxt is None:
                return
            rec = nxt

    def _next_record(self) -> Record | None:
        """The next record for a slot that just finished one; None ends the slot (also when the
        window shrank below the slots running)."""
        if self._stopping or len(self._inflight) > self.window or self._sink_full() or not self._ready():
            return None
        if not self._backlog:
            self._refill(self.window - len(self._inflight) + 1)  # this slot's, and any free one's
            if len(self._backlog) > 1 and len(self._inflight) < self.window:
                self._wake.set()  # the feeder starts the free slots
        return self._backlog.popleft() if self._backlog else None

    def _refill(self, want: int) -> None:
        """At least ``want`` records in the backlog if the queue has them: read a window's
        worth at once, so that slots rarely read the queue for one record each."""
        have = len(self._backlog)
        if have < want:
            recs, _dur = self.input_q.take(self._consumer, max(want, self.window) - have)
            self._backlog.extend(rec for rec, _count in recs)  # (not auto-commit: no write to wait for)

    def _done(self, t: asyncio.Task[None]) -> None:
        self._inflight.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("dispatcher %s: record failed: %r", self.service.name, t.exception())
        self._wake.set()

    # ---------------------------------------------------------------- one record
    async def _infer(self, rid: str, data: bytes, tags: Mapping[str, str]) -> tuple[int, bytes]:
        timeout = self.service.timeout_ms / 1000.0
        deadline = time.monotonic() + self.retry_for_s
        timeouts = 0
        delay = 0.05
        svc = self.service
        headers = tag_headers(tags)
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), DEFAULT_CONTENT_TYPE)
        while True:
            try:
                resp = await self.plane.record_call(
                    svc, headers, data, content_type=ctype, request_id=rid, timeout=timeout
                )
                if resp.compute_us > 0 and not self._fixed:
                    self._computed(resp.compute_us / 1e6)
                return int(resp.status), bytes(resp.body)
            except errors.GatewayError as exc:
                if 400 <= exc.status < 500 and exc.status not in (429, 450):
                    # The call itself is refused (an answer too large): retrying cannot help.
                    return exc.status, exc.message.encode()
                if exc.status == errors.UpstreamTimeout.status:
                    timeouts += 1
                    if timeouts >= self.timeout_attempts:
                        return 504, f"inference timed out after {timeouts} attempts".encode()
                elif not self._ready():
                    # No worker is up: wait for one; the retry budget starts again after.
                    await self._wait_ready()
                    deadline = time.monotonic() + self.retry_for_s
                    delay = 0.05
                    continue
                elif time.monotonic() >= deadline:
                    return exc.status, f"no worker could take the request: {exc.message}".encode()
                self.retries_total += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _computed(self, seconds: float) -> None:
        """A worker reported how long it computed a record: follow the window to it."""
        mean = self._compute_s
        self._compute_s = seconds if mean <= 0 else mean + (seconds - mean) * 0.1
        window = worker_capacity(self.service, self._compute_s)
        if window > self.window:
            self._wake.set()  # room for more at once
        self.window = window

    async def _handle_safe(self, rec: Record) -> None:
        """``_handle`` until it succeeds: a store failure (disk error) must not strand the record
        at this consumer, where nothing would ever deliver it again. It ends once the worker
        answered; the finisher writes the result and commits the input."""
        delay = 0.1
        idx, rid, tags = rec.idx, rec.rid, dict(rec.tags)
        while True:
            try:
                # The payload is read back from disk here if it left memory: at most a window
                # of payloads is held, those of the records being worked on.
                data = self.input_q.payload(rec)
                if data is None:
                    return  # removed from the queue meanwhile: nothing to do
                await self._handle(idx, rid, tags, data)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    raise
                log.error("dispatcher %s: record %d failed (%r); retrying", self.service.name, idx, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _handle(self, idx: int, rid: str, tags: Mapping[str, str], data: bytes) -> None:
        status, body = await self._infer(rid, data, tags)
        if body or status != 200:
            if not body and status >= 400:
                body = f"the processor answered {status} with an empty body".encode()
            out_tags = {k: v for k, v in tags.items() if k not in (TAG_REQUEST_ID, TAG_STATUS)}
            out_tags[TAG_STATUS] = str(status)
            self.finisher.add(Finished(idx, rid, out_tags, body, status))
        else:  # a 200 with an empty body: no result (EAS), the input is committed all the same
            self.finisher.add(Finished(idx, rid, None, b"", status))


# ---------------------------------------------------------------- wiring into the app
class DispatchHost(Protocol):
    """What the dispatchers need of the queue manager (``QueueManager``)."""

    @property
    def queues(self) -> Mapping[str, Queue]:
        """The queues served here now: a dispatcher runs where its service's queues are."""
        ...

    @property
    def dispatchers(self) -> MutableMapping[str, Any]:
        """Where the running dispatchers are listed (the manager's snapshot shows them)."""
        ...

    @property
    def listeners(self) -> list[Callable[[], Awaitable[None]]]:
        """Called after queues arrived or left: the dispatchers follow them."""
        ...


def dispatchers(
    config: Config, qm: DispatchHost | None, backends: Mapping[str, ServiceBackend], plane: DataPlane
) -> Callable[[Any], AsyncIterator[None]]:
    """A cleanup context that runs one dispatcher per async service while the app runs
    (after pools and queues start, stopped before them)."""
    running: dict[str, Dispatcher] = {}

    async def ctx(_app: Any) -> AsyncIterator[None]:
        lock = asyncio.Lock()

        async def sync() -> None:
            """A dispatcher runs where the service's queues are served: started for every async
            service whose input and sink queues are here, stopped for one whose queues left
            (several gateways on one Redis: they follow the owner lease)."""
            async with lock:
                for svc in config.services:
                    if not svc.async_ or qm is None:
                        continue
                    local = qm.queues
                    input_q, sink_q = local.get(svc.name), local.get(f"{svc.name}/sink")
                    d = running.get(svc.name)
                    if d is not None and (d.input_q is not input_q or d.sink_q is not sink_q):
                        running.pop(svc.name)
                        qm.dispatchers.pop(svc.name, None)
                        await d.stop(config.gateway.shutdown_timeout_s)
                        d = None
                    if d is None and input_q is not None and sink_q is not None:
                        d = Dispatcher(
                            svc,
                            backends[svc.name],
                            input_q,
                            sink_q,
                            plane.make_request,
                            plane=plane,
                        )
                        await d.start()
                        running[svc.name] = d
                        qm.dispatchers[svc.name] = d

        await sync()
        if qm is not None:
            qm.listeners.append(sync)
        yield
        if qm is not None:
            qm.listeners.remove(sync)
        async with lock:
            if qm is not None:
                for name in running:
                    qm.dispatchers.pop(name, None)
            await asyncio.gather(
                *(d.stop(config.gateway.shutdown_timeout_s) for d in running.values()), return_exceptions=True
            )
            running.clear()

    return ctx


__all__ = ["DISPATCH_GROUP", "DISPATCH_UID", "DispatchHost", "Dispatcher", "dispatchers", "worker_capacity"]
