"""Worker process entry: load one processor and serve it two ways.

* the framed RPC (gateway.workers.ipc) on a unix socket: what the gateway uses;
* HTTP on ``gateway.worker_host`` (default 127.0.0.1), port 0:
  ``POST /api/predict/<service>[/<subpath>]`` with the
  gateway's auth (gateway.auth.verify), for direct-mode clients, and ``GET /healthz``.

Started by the pool as a fresh interpreter, ``python -m gateway.workers.main <fd>``
(spawn semantics), where ``fd`` is one end of a socketpair. The pool sends
``(ServiceConfig, GatewayConfig, index, socket_path)`` over it; the worker answers once
with its readiness (pid, http port, socket path) or its load error. EOF on that
socket means the gateway is gone and the worker exits; the worker's own exit is EOF
for the gateway.
SIGTERM drains: stop accepting, finish what is queued (bounded), exit. SIGINT is
ignored so a Ctrl-C to the process group lets the gateway stop workers in order.

Requests run on one compute thread fed by a queue, so health pings are answered
while a model runs, and a request cancelled (or past its deadline) while still
queued is dropped before the model runs (F16/F17); one cancelled while running is
interrupted when the processor can do that (onnx: ONNX Runtime's terminate flag).

Health: a processor's BaseException (SystemExit, KeyboardInterrupt, ...) is answered like any
exception, so nothing a request does ends the compute thread. Should the thread die anyway,
or one run go on for longer than the service's ``stall_timeout_s`` while other requests wait
behind it, the health ping says so (``unhealthy``) and the pool restarts the worker: the
event loop alone, which answers pings, does not make a worker healthy.

Inline fast path: handing every request to the compute thread and back costs two thread
wake-ups and GIL hand-offs, more CPU than a small model run itself. So when the compute
thread is idle and the processor can interrupt a run (onnx), the request runs right in
the event loop. A watchdog thread, polling every few ms, interrupts an inline run that
takes longer than ``INLINE_BUDGET_S``; that request then goes to the compute thread from
the start (a model run has no side effects) and inline runs pause for ``INLINE_BACKOFF_S``.
So the loop is never blocked for long: pings, cancels and deadlines work as before.

Dynamic batching (opt-in, ``batching.max_batch_size > 1``, onnx only): the compute
thread takes every compatible queued request, up to ``max_batch_size`` rows, and runs
them as one model run (see gateway.workers.processors.onnx). With ``max_latency_ms == 0``
it never waits (greedy: whatever is queued now); otherwise it waits at most that long
for more. Each request is still dropped when cancelled or expired before its batch runs,
and a running batch is interrupted only when every request in it was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, HEADER_DEADLINE_MS, HEADER_REQUEST_ID
from gateway.auth import AuthStatus, verify
from gateway.config import GatewayConfig, ServiceConfig
from gateway.lean_http import LINGER_S, FastProtocol, FastRequest, Limits, Reply, close_all, protocol_factory
from gateway.middleware import pick_request_id
from gateway.workers.ipc import IPCServerProtocol, RequestSink, WorkerRequest, WorkerResponse
from gateway.workers.processors.base import Processor, ProcessorError, create_processor, error_response

log = logging.getLogger("gateway.worker")

# An inline run (in the event loop) longer than this is interrupted and re-run on the
# compute thread; inline runs then pause for INLINE_BACKOFF_S.
INLINE_BUDGET_S = 0.010
INLINE_BACKOFF_S = 1.0
_WATCHDOG_PERIOD_S = 0.004


class _Job:
    __slots__ = ("cancelled", "done", "prep", "req")

    def __init__(self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None]) -> None:
        self.req = req
        self.done = done
        self.cancelled = False
        self.prep: Any = None  # the processor's prepared request (batching only)


def _failure(exc: BaseException, what: str, request_id: str = "") -> WorkerResponse:
    """The answer to a processor that raised something unexpected (a bug): 500, logged with
    its traceback. BaseExceptions too (SystemExit, KeyboardInterrupt, GeneratorExit): they
    must not end the compute thread. Only a real interpreter shutdown goes on up."""
    if not isinstance(exc, Exception) and sys.is_finalizing():
        raise exc
    log.error("processor failed (%s)", what, exc_info=exc)
    return error_response(500, "InternalError", f"processor error: {type(exc).__name__}", request_id)


class ComputeQueue(RequestSink):
    """Runs requests on a compute thread; results come back to the event loop in batches."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        processor: Processor,
        threads: int = 1,
        max_batch_size: int = 0,
        max_latency_ms: float = 0.0,
        stall_s: float = 0.0,
    ) -> None:
        self.loop = loop
        self.processor = processor
        # A run older than this while other requests wait makes the worker unhealthy (0: never).
        self.stall_s = stall_s
        self._run_started = 0  # perf_counter_ns() when the compute thread's run began (0: idle)
        # Batching needs a processor that can prepare and run batches (onnx) and a model
        # with a dynamic first dimension (the processor's ``batchable``); one thread only.
        self.max_batch = max_batch_size if getattr(processor, "batchable", False) and threads == 1 else 0
        self.max_wait_s = max(0.0, max_latency_ms) / 1000.0
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._results: list[tuple[_Job, WorkerResponse | None]] = []
        self._lock = threading.Lock()
        self.runs = 0  # processor invocations (written by compute threads only)
        self.dropped = 0  # cancelled or expired before running
        self.batches = 0  # model runs that served more than one request
        self.batched = 0  # requests served by those runs
        self.outstanding = 0  # submitted, not yet answered (event loop only)
        self._running: tuple[_Job, ...] = ()
        self.idle = asyncio.Event()
        self.idle.set()
        target = self._work_batched if self.max_batch > 1 else self._work
        self._threads = [
            threading.Thread(target=target, name=f"compute-{i}", daemon=True) for i in range(threads)
        ]
        for t in self._threads:
            t.start()
        # Inline fast path (see the module doc): only for processors that can interrupt a run.
        self.inline = self.max_batch <= 1 and bool(getattr(processor, "interruptible", False))
        self.inlined = 0  # requests answered by inline runs
        self.preempted = 0  # inline runs interrupted and moved to the compute thread
        self._inline_since = 0.0  # monotonic start of the inline run in progress (0: none)
        self._inline_seq = 0
        self._preempt_seq = -1  # the inline run the watchdog interrupted
        self._inline_after = 0.0  # no inline runs before this monotonic time
        self._stopping = threading.Event()
        if self.inline:
            threading.Thread(target=self._watchdog, name="inline-watchdog", daemon=True).start()

    # event loop side
    def submit(
        self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None], inline: bool = True
    ) -> _Job | None:
        """Queue ``req``; ``done`` gets its answer. None: already answered (ran inline)."""
        job = _Job(req, done)
        if inline and self.inline and self.outstanding == 0 and self._run_inline(job):
            return None
        self.outstanding += 1
        self.idle.clear()
        self._q.put(job)
        return job

    def _run_inline(self, job: _Job) -> bool:
        """Run ``job`` in the event loop; False when it must go to the compute thread instead."""
        now = time.monotonic()
        if now < self._inline_after:
            return False
        req = job.req
        if req.deadline and now >= req.deadline:
            self.dropped += 1
            msg = "the request's deadline passed while it was queued; it was not run"
            job.done(error_response(504, "UpstreamTimeout", msg, req.request_id))
            return True
        self._inline_seq += 1
        seq = self._inline_seq
        t0 = time.perf_counter_ns()
        self._inline_since = now
        interrupted = False
        try:
            resp = self.processor.handle(req)
        except ProcessorError as exc:
            # Nothing can cancel an inline run but the watchdog (the loop is busy with it).
            interrupted = exc.code == "UpstreamTimeout"
            resp = error_response(exc.status, exc.code, exc.message, req.request_id)
        except BaseException as exc:  # a bug in a processor must not kill the worker
            resp = _failure(exc, f"request {req.request_id}", req.request_id)
        finally:
            self._inline_since = 0.0
        if interrupted or self._preempt_seq == seq:
            # Too slow for the loop: run it again on the compute thread, where pings and
            # cancels are served while it runs.
            self.preempted += 1
            self._inline_after = time.monotonic() + INLINE_BACKOFF_S
            return False
        self.runs += 1
        self.inlined += 1
        resp.compute_us = (time.perf_counter_ns() - t0) // 1000
        job.done(resp)
        return True

    def _watchdog(self) -> None:
        while not self._stopping.wait(_WATCHDOG_PERIOD_S):
            since, seq = self._inline_since, self._inline_seq
            if since and time.monotonic() - since > INLINE_BUDGET_S and self._inline_since == since:
                self._preempt_seq = seq
                self.processor.cancel_running()

    def cancel(self, job: _Job) -> None:
        job.cancelled = True
        running = self._running
        if job in running and all(j.cancelled for j in running):
            # Already running (alone, or in a batch whose every request is now cancelled):
            # let the processor interrupt it if it can (onnx can).
            self.processor.cancel_running()

    async def run(self, req: WorkerRequest) -> WorkerResponse:
        """The direct HTTP path. It stays on the compute thread: measured under c=16, the
        inline path cost more CPU per request here (about 260 vs 220 µs), because while the
        thread computes, the loop gathers many HTTP requests and answers per wake-up. Frames
        on the RPC arrive batched anyway, so inline wins there (gateway.workers.ipc)."""
        fut: asyncio.Future[WorkerResponse | None] = self.loop.create_future()

        def done(resp: WorkerResponse | None) -> None:
            if not fut.done():
                fut.set_result(resp)

        job = self.submit(req, done, inline=False)
        assert job is not None
        try:
            resp = await fut
        except asyncio.CancelledError:
            self.cancel(job)
            raise
        return resp or error_response(504, "UpstreamTimeout", "request expired before it ran", req.request_id)

    def health(self) -> str | None:
        """None while the compute side works; else what is wrong (the health ping carries it,
        and the pool restarts a worker that reports a problem)."""
        if self._stopping.is_set():
            return None
        if not all(t.is_alive() for t in self._threads):
            return "the compute thread died"
        started = self._run_started
        if started and self.stall_s > 0 and self.outstanding > len(self._running):
            busy_s = (time.perf_counter_ns() - started) / 1e9
            if busy_s > self.stall_s:
                waiting = self.outstanding - len(self._running)
                return f"one run has taken {busy_s:.1f} s while {waiting} request(s) wait"
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "unhealthy": self.health(),
            "runs": self.runs,
            "dropped": self.dropped,
            "batches": self.batches,
            "batched": self.batched,
            "inlined": self.inlined,
            "preempted": self.preempted,
            "outstanding": self.outstanding,
            "pid": os.getpid(),
        }

    def _deliver(self) -> None:
        with self._lock:
            items, self._results = self._results, []
        for job, resp in items:
            self.outstanding -= 1
            if not job.cancelled or resp is not None:
                job.done(resp)
        if self.outstanding == 0:
            self.idle.set()

    # compute thread side
    def _post(self, job: _Job, resp: WorkerResponse | None) -> None:
        with self._lock:
            self._results.append((job, resp))
            first = len(self._results) == 1
        if first:
            # One wake-up for every batch of results finished while the loop was busy.
            with contextlib.suppress(RuntimeError):  # loop closed at exit
                self.loop.call_soon_threadsafe(self._deliver)

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            req = job.req
            if job.cancelled:
                self.dropped += 1
                self._post(job, None)
                continue
            if req.deadline and time.monotonic() >= req.deadline:
                self.dropped += 1
                msg = "the request's deadline passed while it was queued; it was not run"
                self._post(job, error_response(504, "UpstreamTimeout", msg, req.request_id))
                continue
            self.runs += 1
            t0 = time.perf_counter_ns()
            self._running = (job,)
            self._run_started = t0
            try:
                resp = self.processor.handle(req)
            except ProcessorError as exc:
                resp = error_response(exc.status, exc.code, exc.message, req.request_id)
            except BaseException as exc:  # a bug in a processor must not kill the compute thread
                resp = _failure(exc, f"request {req.request_id}", req.request_id)
            finally:
                self._running = ()
                self._run_started = 0
            resp.compute_us = (time.perf_counter_ns() - t0) // 1000
            self._post(job, resp)

    # batching (compute thread side)
    def _admit(self, job: _Job) -> bool:
        """False (and answered) when the job was cancelled or its deadline passed."""
        if job.cancelled:
            self.dropped += 1
            self._post(job, None)
            return False
        req = job.req
        if req.deadline and time.monotonic() >= req.deadline:
            self.dropped += 1
            msg = "the request's deadline passed while it was queued; it was not run"
            self._post(job, error_response(504, "UpstreamTimeout", msg, req.request_id))
            return False
        return True

    def _prepare(self, job: _Job) -> bool:
        """Decode and check the job once (kept on the job); False when it was answered
        with its own error, which never affects the requests batched around it."""
        if job.prep is not None:
            return True
        try:
            job.prep = self.processor.prepare(job.req)  # type: ignore[attr-defined]
        except ProcessorError as exc:
            self._post(job, error_response(exc.status, exc.code, exc.message, job.req.request_id))
            return False
        except BaseException as exc:
            self._post(job, _failure(exc, f"request {job.req.request_id}", job.req.request_id))
            return False
        return True

    def _take(self, job: _Job, key: Any, rows: int, batch: list[_Job], keep: deque[_Job]) -> int:
        """Add ``job`` to ``batch`` when compatible and it fits; else keep it for later."""
        if not self._admit(job) or not self._prepare(job):
            return rows
        prep = job.prep
        if prep.key == key and rows + prep.rows <= self.max_batch:
            batch.append(job)
            return rows + int(prep.rows)
        keep.append(job)
        return rows

    def _work_batched(self) -> None:
        pending: deque[_Job] = deque()  # taken off the queue, in arrival order
        stopping = False
        while True:
            if not pending:
                if stopping:
                    return
                first = self._q.get()
                if first is None:
                    return
                pending.append(first)
            head = pending.popleft()
            if not self._admit(head) or not self._prepare(head):
                continue
            key = head.prep.key
            batch = [head]
            if key is not None and head.prep.rows < self.max_batch:
                rows = int(head.prep.rows)
                keep: deque[_Job] = deque()
                # Greedy: whatever is queued now (already taken, then still in the queue).
                while pending and rows < self.max_batch:
                    rows = self._take(pending.popleft(), key, rows, batch, keep)
                while rows < self.max_batch:
                    try:
                        job = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stopping = True
                        break
                    rows = self._take(job, key, rows, batch, keep)
                if self.max_wait_s > 0 and not stopping:
                    until = time.monotonic() + self.max_wait_s
                    while rows < self.max_batch and (left := until - time.monotonic()) > 0:
                        try:
                            job = self._q.get(timeout=left)
                        except queue.Empty:
                            break
                        if job is None:
                            stopping = True
                            break
                        rows = self._take(job, key, rows, batch, keep)
                keep.extend(pending)
                pending = keep
                # Cancelled (or expired) while the batch was gathered: drop those now.
                batch = [j for j in batch if self._admit(j)]
                if not batch:
                    continue
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        self.runs += len(batch)
        if len(batch) > 1:
            self.batches += 1
            self.batched += len(batch)
        t0 = time.perf_counter_ns()
        self._running = tuple(batch)
        self._run_started = t0
        try:
            results = self.processor.run_batch([j.prep for j in batch])  # type: ignore[attr-defined]
        except BaseException as exc:  # a bug in a processor must not kill the compute thread
            _failure(exc, f"batch of {len(batch)}")  # logged (re-raised at interpreter shutdown)
            error = ProcessorError(f"processor error: {type(exc).__name__}", 500, "InternalError")
            results = [error] * len(batch)
        finally:
            self._running = ()
            self._run_started = 0
        us = (time.perf_counter_ns() - t0) // 1000
        for job, res in zip(batch, results, strict=True):
            job.prep = None  # release the inputs
            if isinstance(res, ProcessorError):
                resp = error_response(res.status, res.code, res.message, job.req.request_id)
            else:
                resp = res
            resp.compute_us = us
            self._post(job, resp)

    def shutdown(self) -> None:
        self._stopping.set()
        for _ in self._threads:
            self._q.put(None)


class _DirectHTTP:
    """The worker's direct-mode predict: the gateway's auth and deadline checks, then the
    compute queue. Served by the lean protocol (gateway/lean_http.py) for plain calls and
    by aiohttp (``app``) for everything else, both through :meth:`answer`. Every reply
    carries ``X-Request-Id`` (the caller's when well-formed, else a fresh one), as the
    gateway's do."""

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig, compute: ComputeQueue) -> None:
        self.service = service
        self.gateway = gateway
        self.compute = compute
        self.prefix = f"/api/predict/{service.name}"
        self.tokens = service.tokens
        # Raw tokens that verified (tokens come from the config, so a success stays one; a
        # signature covers one call only and is always checked). Successes only, bounded.
        self._verified: set[str] = set()

    def _remember(self, auth: str) -> None:
        if len(self._verified) >= 1024:
            self._verified.clear()
        self._verified.add(auth)

    async def answer(self, headers: Any, raw_path: str, tail: str, body: bytes, rid: str) -> WorkerResponse:
        service = self.service
        # Same checks and messages as the gateway's predict route.
        if self.tokens and headers.get("Authorization") not in self._verified:
            result = verify(self.tokens, headers, raw_path, body)
            if not result.ok:
                if result.status is AuthStatus.BAD_DIGEST:
                    return error_response(400, "BadDigest", "Content-MD5 does not match the body", rid)
                return error_response(401, "Unauthorized", "invalid or missing token", rid)
            auth = headers.get("Authorization", "")
            if not auth.startswith("EAS "):
                self._remember(auth)
        budget_s = service.timeout_ms / 1000.0
        raw = headers.get(HEADER_DEADLINE_MS)
        if raw is not None:
            # The caller's remaining budget (our SDK sends it): never run past it.
            try:
                deadline_ms = int(raw.strip())
            except ValueError:
                return error_response(400, "BadRequest", f"{HEADER_DEADLINE_MS} must be an integer", rid)
            if deadline_ms < 10:
                msg = "the caller's deadline has already passed"
                return error_response(408, "DeadlineExceeded", msg, rid)
            budget_s = min(budget_s, deadline_ms / 1000.0)
        req = WorkerRequest(
            body=body,
            subpath=tail,
            content_type=headers.get("Content-Type", DEFAULT_CONTENT_TYPE),
            request_id=rid,
            headers={k: v for k, v in headers.items() if k.lower().startswith("x-")},
            deadline=time.monotonic() + max(0.0, budget_s),
        )
        return await self.compute.run(req)

    def refused_before_body(self, headers: Any) -> bool:
        """A token is required and none is sent, or a raw token is wrong: 401 whatever the
        body holds, so it is answered before the body is read. (An ``EAS`` signature covers
        the body's MD5: it waits for the body.)"""
        auth = headers.get("Authorization")
        if not auth:
            return True
        if auth.startswith("EAS ") or auth in self._verified:
            return False
        if verify(self.tokens, headers, "", None).ok:
            self._remember(auth)
            return False
        return True

    # the lean protocol's hooks
    def accept(self, method: str, path: str, headers: Any, clen: int) -> bool:
        if method != "POST" or clen > self.gateway.max_body_bytes:
            return False  # aiohttp's 405 / 413
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            return False
        encoding = headers.get("Content-Encoding")
        return encoding is None or encoding.strip().lower() in ("", "identity")

    async def serve(self, req: FastRequest, query: Any) -> Reply:
        rid = pick_request_id(req.headers.get(HEADER_REQUEST_ID))
        tail = req.path[len(self.prefix) + 1 :]
        resp = await self.answer(req.headers, req.path, tail, req.body, rid)
        return Reply(resp.status, resp.body, resp.content_type, {HEADER_REQUEST_ID: rid})

    def early(self, req: FastRequest) -> Reply | None:
        """The lean protocol's ``early``: the 401 due before the body (still arriving)."""
        if not self.tokens or not self.refused_before_body(req.headers):
            return None
        return self._error(req.headers, 401, "Unauthorized", "invalid or missing token")

    def late(self, req: FastRequest) -> Reply:
        """The lean protocol's ``late``: a body not complete within body_timeout_s."""
        return self._error(req.headers, 408, "RequestTimeout", self._late_message())

    def _late_message(self) -> str:
        return f"request body not received within {self.gateway.body_timeout_s:g} s"

    def _error(self, headers: Any, status: int, code: str, message: str) -> Reply:
        rid = pick_request_id(headers.get(HEADER_REQUEST_ID))
        err = error_response(status, code, message, rid)
        return Reply(status, err.body, err.content_type, {HEADER_REQUEST_ID: rid})

    def app(self) -> Any:
        from aiohttp import web
        from aiohttp.web_protocol import RequestPayloadError

        def reply(resp: WorkerResponse, rid: str, close: bool = False) -> web.Response:
            out = web.Response(
                status=resp.status,
                body=resp.body,
                headers={"Content-Type": resp.content_type, HEADER_REQUEST_ID: rid},
            )
            if close:
                out.force_close()
            return out

        async def predict(request: web.Request) -> web.StreamResponse:
            rid = pick_request_id(request.headers.get(HEADER_REQUEST_ID))
            encoding = request.headers.get("Content-Encoding", "").strip().lower()
            if encoding not in ("", "identity"):
                # As the gateway: no compressed bodies (aiohttp would inflate them unasked).
                msg = f"Content-Encoding {encoding[:32]!r} is not supported"
                return reply(error_response(415, "UnsupportedMediaType", msg, rid), rid)
            if self.tokens and not request.content.is_eof() and self.refused_before_body(request.headers):
                return reply(error_response(401, "Unauthorized", "invalid or missing token", rid), rid)
            try:
                if request.content.is_eof():
                    body = await request.read()
                else:
                    # The gateway's body deadline (a chunked body, or one the lean protocol
                    # handed over): 408, and the connection closes.
                    body = await asyncio.wait_for(request.read(), self.gateway.body_timeout_s)
            except asyncio.TimeoutError:
                err = error_response(408, "RequestTimeout", self._late_message(), rid)
                return reply(err, rid, close=True)
            except RequestPayloadError:
                err = error_response(400, "BadRequest", "malformed request body", rid)
                return reply(err, rid, close=True)
            except ConnectionError:
                # The client left mid-body: nobody to answer, nothing worth a traceback.
                log.debug("client left before its body was complete (request %s)", rid)
                return reply(error_response(400, "BadRequest", "incomplete body", rid), rid, close=True)
            tail = request.match_info.get("tail", "")
            resp = await self.answer(request.headers, request.rel_url.raw_path, tail, body, rid)
            return reply(resp, rid)

        async def healthz(request: web.Request) -> web.StreamResponse:
            stats = self.compute.stats()
            if stats["unhealthy"]:
                return web.json_response({"status": "unhealthy", **stats}, status=503)
            return web.json_response({"status": "ok", **stats})

        app = web.Application(
            client_max_size=self.gateway.max_body_bytes,
            # As the gateway: an answer given before the body was read (401, 408) drains the
            # rest for this long, then the connection closes (aiohttp's default is 10 s).
            handler_args={"lingering_time": LINGER_S},
        )
        app.router.add_post(self.prefix, predict)
        app.router.add_post(self.prefix + "/{tail:.*}", predict)
        app.router.add_get("/healthz", healthz)
        return app


async def _serve(
    service: ServiceConfig, gateway: GatewayConfig, socket_path: str, conn: Any, drain_s: float
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    processor = create_processor(service)
    try:
        processor.load()
    except BaseException as exc:
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        log.error("service %s: processor failed to load: %s", service.name, msg)
        conn.send({"ok": False, "error": msg})
        return 3

    compute = ComputeQueue(
        loop,
        processor,
        max_batch_size=service.batching.max_batch_size,
        max_latency_ms=service.batching.max_latency_ms,
        stall_s=service.stall_timeout_s,
    )
    server = await loop.create_unix_server(lambda: IPCServerProtocol(compute), path=socket_path)
    os.chmod(socket_path, 0o600)

    from aiohttp import web

    # Direct mode's HTTP port: plain predict calls on the lean protocol, the rest on aiohttp.
    direct = _DirectHTTP(service, gateway, compute)
    runner = web.AppRunner(direct.app(), access_log=None)
    await runner.setup()
    fallback = runner.server
    assert fallback is not None
    conns: set[FastProtocol] = set()

    # The gateway's connection limits apply on the worker's port too.
    http_protocol = protocol_factory(direct, fallback, conns, Limits.of(gateway, gateway.max_body_bytes))
    http_server = await loop.create_server(http_protocol, gateway.worker_host, 0, backlog=1024)
    port = http_server.sockets[0].getsockname()[1]

    # The pipe to the gateway: EOF means the gateway died, so stop too.
    def _parent_event() -> None:
        try:
            if conn.poll():
                conn.recv()
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            stop.set()

    loop.add_reader(conn.fileno(), _parent_event)
    conn.send({"ok": True, "pid": os.getpid(), "http_port": port, "socket": socket_path})
    log.info(
        "service %s: worker ready (pid %d, http %s:%d)", service.name, os.getpid(), gateway.worker_host, port
    )

    await stop.wait()
    # Drain: no new connections, finish what is queued, then leave.
    server.close()
    http_server.close()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(compute.idle.wait(), drain_s)
    await close_all(conns, timeout=1.0)
    await runner.cleanup()  # the connections handed to aiohttp
    compute.shutdown()
    with contextlib.suppress(Exception):
        processor.close()
    return 0


def run_worker(
    service: ServiceConfig, gateway: GatewayConfig, index: int, socket_path: str, conn: Any
) -> None:
    """Serve one worker until SIGTERM or the gateway goes away; never returns."""
    os.environ.update(service.env)
    # The event loop and the compute thread share the GIL: a shorter switch interval than
    # the default 5 ms keeps one from stalling the other (about +10% req/s measured).
    sys.setswitchinterval(0.0005)
    logging.basicConfig(
        level=getattr(logging, gateway.log_level.upper(), logging.INFO),
        format=f"%(asctime)s worker[{service.name}/{index}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    code = 1
    try:
        main = _serve(service, gateway, socket_path, conn, gateway.shutdown_timeout_s)
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is optional
            code = asyncio.run(main)
        else:
            code = uvloop.run(main)
    except BaseException:
        log.exception("service %s: worker %d failed", service.name, index)
        code = 1
    finally:
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
        # Skip interpreter teardown: daemon compute threads may be inside native code.
        logging.shutdown()
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    from multiprocessing.connection import Connection

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.exit("usage: python -m gateway.workers.main <fd>  (started by the gateway's worker pool)")
    fd = int(args[0])
    os.set_inheritable(fd, False)  # processes the user's code starts must not hold it
    conn = Connection(fd)
    try:
        service, gateway, index, socket_path = conn.recv()
    except (EOFError, OSError):
        sys.exit(2)
    run_worker(service, gateway, index, socket_path, conn)


if __name__ == "__main__":
    main()
