"""Asynchronous inference: feed an async service's input queue to its workers, results to its sink.

One ``Dispatcher`` per predict service with ``async: true``. It is a consumer of the input
queue ``<svc>`` (group ``eas``, uid ``gateway-dispatcher``) holding at most ``window``
records, the service's worker capacity (see ``worker_capacity``), and for each record:

1. sends the record's data to a worker as a synchronous predict of that body would be
   sent (through the dataplane, gateway/dataplane.py), the record's tags as its headers (``requestId`` and
   ``status`` excepted; only tags that are valid header names and values), so a
   ``Content-Type`` or ``X-Eas-Request-Format`` tag acts as the header of a sync call;
2. writes the worker's reply to the sink ``<svc>/sink`` under the input's request id
   (the store dedupes puts by request id, so a redelivered record never yields a second
   result), with the input's tags copied and ``status`` = the reply's status code;
3. waits until that put is durable, and only then commits the input record.

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
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web

from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, TAG_REQUEST_ID, TAG_STATUS
from gateway import errors
from gateway.config import ServiceConfig
from gateway.dataplane import DataPlane
from gateway.queue.records import QueueError, Record
from gateway.queue.store import Queue
from gateway.state import CONFIG_KEY, DATAPLANE_KEY, POOLS_KEY, QUEUES_KEY

log = logging.getLogger("gateway.dispatcher")

DISPATCH_GROUP = "eas"
DISPATCH_UID = "gateway-dispatcher"
# In flight per worker: one computing and one waiting on its socket, so a worker never idles
# between replies.
PER_WORKER_INFLIGHT = 2
SINK_FULL_POLL_S = 0.05
READY_POLL_S = 0.25


def worker_capacity(service: ServiceConfig) -> int:
    """The dispatcher's window: what the service's workers can hold at once.

    Per worker one request computing and one waiting; with dynamic batching one full batch
    computing and the next one filling (``2 x max_batch_size``), so batches can fill. Never
    more than ``max_pending`` (the pool refuses beyond it) or the queue's ``max_window``."""
    per_worker = PER_WORKER_INFLIGHT
    if service.batching.max_batch_size > 1:
        per_worker = max(per_worker, 2 * service.batching.max_batch_size)
    return max(1, min(service.workers * per_worker, service.max_pending, service.queue.max_window))


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
        pool: Any,
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
        self.window = window or worker_capacity(service)
        self.retry_for_s = retry_for_s
        self.timeout_attempts = timeout_attempts
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._consumer: Any = None
        self._stopping = False
        self.results_total = 0
        self.errors_total = 0
        self.empty_total = 0
        self.retries_total = 0
        self.sink_full_waits = 0
        self.ready_waits = 0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        c, dur = self.input_q.connect(DISPATCH_GROUP, DISPATCH_UID, 0, self.window, False, {})
        await _durable(dur)
        c.wake = self._wake.set
        self._consumer = c
        self._task = asyncio.create_task(self._run(), name=f"dispatcher:{self.service.name}")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop taking input; let in-flight records finish (up to ``timeout``), then leave.

        Records still in flight at the deadline are cancelled uncommitted: the queue
        redelivers them to the next dispatcher (after a restart).
        """
        self._stopping = True
        self._wake.set()
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
        if self._consumer is not None:
            self.input_q.disconnect(self._consumer)
            self._consumer = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "inflight": len(self._inflight),
            "results_total": self.results_total,
            "errors_total": self.errors_total,
            "empty_total": self.empty_total,
            "retries_total": self.retries_total,
            "sink_full_waits": self.sink_full_waits,
            "ready_waits": self.ready_waits,
        }

    # ---------------------------------------------------------------- readiness
    def _ready(self) -> bool:
        """Whether the pool has a ready worker (a pool that cannot tell counts as ready); a
        backend running in the gateway (a pipeline) says so itself with ``is_ready``."""
        probe = getattr(self.pool, "is_ready", None) or getattr(self.pool, "ready_endpoints", None)
        if probe is None:
            return True
        try:
            return bool(probe())
        except Exception:
            return True

    async def _wait_ready(self) -> None:
        """Until a worker is ready (workers booting after a restart, a slow model loading)."""
        self.ready_waits += 1
        wait = getattr(self.pool, "wait_ready", None)
        while not self._ready():
            if wait is not None:
                with contextlib.suppress(Exception):
                    if await wait(READY_POLL_S):
                        continue
            await asyncio.sleep(READY_POLL_S)

    # ---------------------------------------------------------------- main loop
    def _sink_full(self) -> bool:
        q = self.sink_q
        return len(q.records) + q.inflight >= q.cfg.max_length or 0 < q.max_bytes <= q.bytes

    async def _run(self) -> None:
        c = self._consumer
        while not self._stopping:
            if not self._ready():
                # No worker to run anything: leave the input in the queue until one is up.
                await self._wait_ready()
                continue
            if self._sink_full():
                # Backpressure: hold the input until consumers drain the sink.
                # (The store has no drain notification: poll.)
                self.sink_full_waits += 1
                await asyncio.sleep(SINK_FULL_POLL_S)
                continue
            self._wake.clear()
            recs, dur = self.input_q.take(c)
            await _durable(dur)
            for rec, _count in recs:
                t = asyncio.create_task(self._handle_safe(rec))
                self._inflight.add(t)
                t.add_done_callback(self._done)
            if not recs:
                await self._wake.wait()

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
                resp = await self.plane.infer(
                    svc, headers, data, content_type=ctype, request_id=rid, timeout=timeout
                )
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

    async def _handle_safe(self, rec: Record) -> None:
        """``_handle`` until it succeeds: a store failure (disk error) must not strand the record
        at this consumer, where nothing would ever deliver it again."""
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
            await self._put_sink(rid, out_tags, body, status)
        else:  # a 200 with an empty body: no result (EAS)
            self.empty_total += 1
        await _durable(self.input_q.commit(DISPATCH_GROUP, [idx]))

    async def _put_sink(self, rid: str, tags: dict[str, str], body: bytes, status: int) -> None:
        while True:
            try:
                _i, _r, dur = self.sink_q.put(body, tags, rid)
            except QueueError as exc:
                if exc.status == 429:  # sink full: wait for room, keep the input uncommitted
                    self.sink_full_waits += 1
                    await asyncio.sleep(SINK_FULL_POLL_S)
                    continue
                # The reply itself cannot be stored (too large): store why instead.
                status = exc.status
                tags = {**tags, TAG_STATUS: str(status)}
                body = json.dumps({"error": exc.message}).encode()
                continue
            await _durable(dur)
            break
        if status >= 400:
            self.errors_total += 1
        self.results_total += 1


# ---------------------------------------------------------------- wiring into the app
def setup(app: Any) -> None:
    """Run one dispatcher per async service while the app runs (after pools and queues start,
    stopped before them)."""
    running: dict[str, Dispatcher] = {}
    app[DISPATCHERS_KEY] = running

    async def ctx(app: Any) -> AsyncIterator[None]:
        config = app[CONFIG_KEY]
        qm = app[QUEUES_KEY]
        registry = getattr(qm, "dispatchers", None)  # the queue manager's snapshot (/api/services, /metrics)
        lock = asyncio.Lock()

        async def sync() -> None:
            """A dispatcher runs where the service's queues are served: started for every async
            service whose input and sink queues are here, stopped for one whose queues left
            (several gateways on one Redis: they follow the owner lease)."""
            async with lock:
                for svc in config.services:
                    if not svc.async_ or qm is None:
                        continue
                    local = getattr(qm, "queues", {})
                    input_q, sink_q = local.get(svc.name), local.get(f"{svc.name}/sink")
                    d = running.get(svc.name)
                    if d is not None and (d.input_q is not input_q or d.sink_q is not sink_q):
                        running.pop(svc.name)
                        if isinstance(registry, dict):
                            registry.pop(svc.name, None)
                        await d.stop(config.gateway.shutdown_timeout_s)
                        d = None
                    if d is None and input_q is not None and sink_q is not None:
                        d = Dispatcher(
                            svc,
                            app[POOLS_KEY][svc.name],
                            input_q,
                            sink_q,
                            app[DATAPLANE_KEY].make_request,
                            plane=app[DATAPLANE_KEY],
                        )
                        await d.start()
                        running[svc.name] = d
                        if isinstance(registry, dict):
                            registry[svc.name] = d

        await sync()
        listeners = getattr(qm, "listeners", None)
        if isinstance(listeners, list):
            listeners.append(sync)
        yield
        if isinstance(listeners, list):
            listeners.remove(sync)
        async with lock:
            if isinstance(registry, dict):
                for name in running:
                    registry.pop(name, None)
            await asyncio.gather(
                *(d.stop(config.gateway.shutdown_timeout_s) for d in running.values()), return_exceptions=True
            )
            running.clear()

    app.cleanup_ctx.append(ctx)


DISPATCHERS_KEY = web.AppKey("dispatchers", dict)  # service name -> Dispatcher

__all__ = ["DISPATCHERS_KEY", "DISPATCH_GROUP", "DISPATCH_UID", "Dispatcher", "setup", "worker_capacity"]
