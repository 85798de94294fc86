"""The worker's compute side: requests run on a compute thread fed by a queue.

So health pings are answered while a model runs, and a request cancelled (or past its
deadline) while still queued is dropped before the model runs; one cancelled while
running is interrupted when the processor can do that (onnx: ONNX Runtime's terminate
flag).

Health: a processor's BaseException (SystemExit, KeyboardInterrupt, ...) is answered like any
exception, so nothing a request does ends the compute thread. Should the thread die anyway,
or one run go on for longer than the service's ``stall_timeout_s`` while other requests wait
behind it, the health ping says so (``unhealthy``) and the pool restarts the worker: the
event loop alone, which answers pings, does not make a worker healthy.

Inline fast path: handing every request to the compute thread and back costs two thread
wake-ups and GIL hand-offs, more CPU than a small model run itself. So when the compute
thread is idle and the processor can interrupt a run (``Processor.interruptible``), the
request runs right in the event loop. A watchdog thread, polling every few ms, interrupts
an inline run that takes longer than ``INLINE_BUDGET_S``; that request then goes to the
compute thread from the start (a model run has no side effects) and inline runs pause for
``INLINE_BACKOFF_S``. So the loop is never blocked for long: pings, cancels and deadlines
work as before. A queue may also be given a softer bound (``inline_max_s``, the gateway's
own sessions: gateway.backends.threads): ``INLINE_SLOW_RUNS`` runs in a row that finished but
took longer than that also pause inline runs for ``INLINE_BACKOFF_S``, so only a small model
runs in the loop (one slow run alone may be the process preempted by another).

A processor that cannot interrupt a run but whose runs take a time its request's size
bounds (``Processor.runs_by_size``: the estimators, whose run grows with the rows) runs
inline too, but only a request no larger than one seen to run within ``SIZED_INLINE_S``
(on the compute thread or inline, so the first call always goes to the thread): nothing
could stop it in the loop, so it must be known to be short. A run over that time lowers the
size bound below its own request's size, so the next such request goes to the thread. Not
with batching: calls run in the loop as they come never queue, so they never share a run.

Dynamic batching (opt-in, ``batching.max_batch_size > 1``, for a processor that is
:class:`~gateway.worker.processors.base.Batchable` and whose loaded model supports it):
the compute thread takes every compatible queued request, up to ``max_batch_size`` rows,
and runs them as one model run. With ``max_latency_ms == 0`` it never waits (greedy:
whatever is queued now); otherwise it waits at most that long for more. Each request is
still dropped when cancelled or expired before its batch runs, and a running batch is
interrupted only when every request in it was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.codecs.ipc import RequestSink
from gateway.core.calls import TensorRequest, WorkerRequest, WorkerResponse
from gateway.worker.logs import REQUEST_ID
from gateway.worker.processors.base import Batchable, Processor, ProcessorError, error_response

log = logging.getLogger("gateway.worker")

# An inline run (in the event loop) longer than this is interrupted and re-run on the
# compute thread; inline runs then pause for INLINE_BACKOFF_S.
INLINE_BUDGET_S = 0.010
INLINE_BACKOFF_S = 1.0
# Consecutive inline runs over a queue's ``inline_max_s`` that pause inline runs.
INLINE_SLOW_RUNS = 2
# A processor that cannot be interrupted runs a request inline only when one as large ran
# within this (or the queue's ``inline_max_s``, when shorter): what a hand-off to the thread
# costs is a few tens of microseconds, so a longer run gains little by holding the loop.
SIZED_INLINE_S = 0.0005
# While more requests are queued and runs are short, the compute thread keeps finished
# answers for up to _HOLD_NS and then wakes the event loop once for all of them: on a busy
# core each wake-up is a switch between the two threads (measured on the digits model's
# direct calls at 16 in flight: 64 instead of 70-72 µs of CPU per request). Only after
# _SHORT_STREAK runs in a row shorter than _SHORT_RUN_NS: a held answer also waits for the run
# after it, so a model whose runs are long, or vary, gets each answer as its run ends.
_HOLD_NS = 500_000
_SHORT_RUN_NS = 250_000
_SHORT_STREAK = 4
_WATCHDOG_PERIOD_S = 0.004


class _Job:
    __slots__ = ("at", "cancelled", "done", "prep", "req")

    def __init__(
        self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None], at: int = 0
    ) -> None:
        self.req = req
        self.done = done
        self.cancelled = False
        self.prep: Any = None  # the processor's prepared request (batching only)
        self.at = at  # perf_counter_ns() when it was queued (0 unless the runs are traced)


# Told of each run when the worker traces (gateway.worker.tracing): the request, when it was
# queued, when its run started and ended (perf_counter_ns), its answer.
Traced = Callable[[WorkerRequest, int, int, int, WorkerResponse | None], None]


def _size(req: WorkerRequest) -> int:
    """A request's size in bytes: its body's, with its arrays' when they come decoded."""
    if isinstance(req, TensorRequest):
        return len(req.body) + sum(int(a.nbytes) for a in req.inputs.values())
    return len(req.body)


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
        inline_max_s: float = INLINE_BUDGET_S,
    ) -> None:
        self.loop = loop
        self.processor = processor
        # A run older than this while other requests wait makes the worker unhealthy (0: never).
        self.stall_s = stall_s
        self._run_started = 0  # perf_counter_ns() when the compute thread's run began (0: idle)
        # Batching needs a Batchable processor whose loaded model supports it (onnx: a
        # dynamic first dimension everywhere); one thread only.
        self._batcher: Batchable[Any] | None = None
        if threads == 1 and isinstance(processor, Batchable) and processor.supports_batching:
            self._batcher = processor
        self.max_batch = max_batch_size if self._batcher is not None else 0
        self.max_wait_s = max(0.0, max_latency_ms) / 1000.0
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._results: list[tuple[_Job, WorkerResponse | None]] = []
        self._scheduled = False  # a _deliver is scheduled on the loop and has not run yet
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
        # Inline fast path (see the module doc): for processors that can interrupt a run, and
        # for those whose runs the request's size bounds, up to the size seen to run fast.
        # Never with batching: calls answered in the loop as they come would never queue, so
        # they would never share a run (under load, the greedy batcher's whole gain).
        self.sized = self.max_batch <= 1 and not processor.interruptible and processor.runs_by_size
        self.inline = (self.max_batch <= 1 and processor.interruptible) or self.sized
        self._fast_size = -1  # sized: the largest request seen to run within _sized_ns
        self._sized_ns = int(min(inline_max_s, SIZED_INLINE_S) * 1e9)
        self.inlined = 0  # requests answered by inline runs
        self.preempted = 0  # inline runs interrupted and moved to the compute thread
        self._inline_since = 0.0  # monotonic start of the inline run in progress (0: none)
        self._inline_seq = 0
        self._preempt_seq = -1  # the inline run the watchdog interrupted
        self._inline_after = 0.0  # no inline runs before this monotonic time
        self._inline_max_ns = int(inline_max_s * 1e9)  # longer inline runs pause them
        self._inline_slow = 0  # consecutive inline runs longer than that
        self._stopping = threading.Event()
        self.traced: Traced | None = None  # set by the worker when it traces its calls
        if self.inline and not self.sized:
            threading.Thread(target=self._watchdog, name="inline-watchdog", daemon=True).start()

    # event loop side
    def submit(
        self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None], inline: bool = True
    ) -> _Job | None:
        """Queue ``req``; ``done`` gets its answer. None: already answered (ran inline)."""
        if inline:
            resp = self.run_inline(req)
            if resp is not None:
                done(resp)
                return None
        job = _Job(req, done, time.perf_counter_ns() if self.traced is not None else 0)
        self.outstanding += 1
        self.idle.clear()
        self._q.put(job)
        return job

    def run_inline(self, req: WorkerRequest) -> WorkerResponse | None:
        """Run ``req`` in the event loop and answer it; None when it must go to the compute
        thread instead (a queue that does not run inline, requests queued, inline runs
        paused, or this one interrupted)."""
        if not self.inline or self.outstanding:
            return None
        size = _size(req) if self.sized else 0
        if self.sized and size > self._fast_size:
            return None
        now = time.monotonic()
        if now < self._inline_after:
            return None
        if req.deadline and now >= req.deadline:
            self.dropped += 1
            msg = "the request's deadline passed while it was queued; it was not run"
            return error_response(504, "UpstreamTimeout", msg, req.request_id)
        self._inline_seq += 1
        seq = self._inline_seq
        t0 = time.perf_counter_ns()
        self._inline_since = now
        interrupted = False
        rid_token = REQUEST_ID.set(req.request_id)  # for the processor's log lines
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
            REQUEST_ID.reset(rid_token)
        if interrupted or self._preempt_seq == seq:
            # Too slow for the loop: run it again on the compute thread, where pings and
            # cancels are served while it runs.
            self.preempted += 1
            self._inline_after = time.monotonic() + INLINE_BACKOFF_S
            return None
        self.runs += 1
        self.inlined += 1
        took = time.perf_counter_ns() - t0
        if self.sized:
            self._learn(size, took)
        if took <= self._inline_max_ns:
            self._inline_slow = 0
        else:
            # Answered, but too slow to hold the loop for: the next calls go to the thread.
            # Twice in a row, since one slow run may only have been the process preempted.
            self._inline_slow += 1
            if self._inline_slow >= INLINE_SLOW_RUNS:
                self._inline_slow = 0
                self._inline_after = time.monotonic() + INLINE_BACKOFF_S
        resp.compute_us = took // 1000
        if self.traced is not None:
            self.traced(req, t0, t0, t0 + took, resp)
        return resp

    def _learn(self, size: int, took_ns: int) -> None:
        """A run of a request of ``size`` took ``took_ns``: what may run inline from now on."""
        if took_ns <= self._sized_ns:
            if size > self._fast_size:
                self._fast_size = size
        elif size <= self._fast_size:
            self._fast_size = size - 1  # as large a request may take as long again

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
        """``req`` on the compute thread, whatever is queued. The direct HTTP port's calls
        come here unless they come one at a time (gateway.worker.direct): measured under
        c=16, running every call inline cost more CPU per request (about 260 vs 220 µs),
        because while the thread computes, the loop gathers many HTTP requests and answers
        per wake-up. Frames on the RPC arrive batched anyway, so inline wins there
        (gateway.codecs.ipc)."""
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
            self._scheduled = False
        for job, resp in items:
            self.outstanding -= 1
            if not job.cancelled or resp is not None:
                job.done(resp)
        if self.outstanding == 0:
            self.idle.set()

    # compute thread side
    def _post(self, job: _Job, resp: WorkerResponse | None, hold: bool = False) -> None:
        """Hand a result to the event loop. ``hold``: more jobs are queued, so keep it until
        they ran too: the loop is woken once per run of queued jobs, not once per job."""
        with self._lock:
            self._results.append((job, resp))
            wake = not hold and not self._scheduled
            if wake:
                self._scheduled = True
        if wake:
            self._wake()  # one wake-up for every batch of results finished meanwhile

    def _flush(self) -> None:
        """Wake the loop for results still held (the compute thread is stopping)."""
        with self._lock:
            wake = bool(self._results) and not self._scheduled
            self._scheduled = self._scheduled or wake
        if wake:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed at exit
            self.loop.call_soon_threadsafe(self._deliver)

    def _work(self) -> None:
        held_since = 0  # perf_counter_ns() when the oldest answer not yet handed over finished
        short = 0  # runs in a row shorter than _SHORT_RUN_NS
        while True:
            job = self._q.get()
            if job is None:
                self._flush()
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
            REQUEST_ID.set(req.request_id)  # for the processor's log lines
            try:
                resp = self.processor.handle(req)
            except ProcessorError as exc:
                resp = error_response(exc.status, exc.code, exc.message, req.request_id)
            except BaseException as exc:  # a bug in a processor must not kill the compute thread
                resp = _failure(exc, f"request {req.request_id}", req.request_id)
            finally:
                self._running = ()
                self._run_started = 0
                REQUEST_ID.set("")
            end = time.perf_counter_ns()
            resp.compute_us = (end - t0) // 1000
            if self.sized:
                self._learn(_size(req), end - t0)
            if self.traced is not None:
                self.traced(req, job.at or t0, t0, end, resp)
            if not held_since:
                held_since = end
            short = short + 1 if end - t0 < _SHORT_RUN_NS else 0
            # More queued after short runs: keep this answer for a while (bounded) and wake the
            # loop once for all.
            hold = short >= _SHORT_STREAK and end - held_since < _HOLD_NS and not self._q.empty()
            self._post(job, resp, hold)
            if not hold:
                held_since = 0

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
            assert self._batcher is not None  # only the batched loop prepares
            job.prep = self._batcher.prepare(job.req)
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

    def _fill(
        self, key: Any, rows: int, batch: list[_Job], keep: deque[_Job], until: float | None
    ) -> tuple[int, bool]:
        """Take queued jobs until the batch is full: what is queued now, or (with ``until``) what
        arrives before that monotonic time. Returns the rows taken and whether the stop marker came."""
        while rows < self.max_batch:
            try:
                if until is None:
                    job = self._q.get_nowait()
                else:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    job = self._q.get(timeout=left)
            except queue.Empty:
                break
            if job is None:
                return rows, True
            rows = self._take(job, key, rows, batch, keep)
        return rows, False

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
                rows, stopping = self._fill(key, rows, batch, keep, None)
                if self.max_wait_s > 0 and not stopping:
                    until = time.monotonic() + self.max_wait_s
                    rows, stopping = self._fill(key, rows, batch, keep, until)
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
            assert self._batcher is not None
            results = self._batcher.process_batch([j.prep for j in batch])
        except BaseException as exc:  # a bug in a processor must not kill the compute thread
            _failure(exc, f"batch of {len(batch)}")  # logged (re-raised at interpreter shutdown)
            error = ProcessorError(f"processor error: {type(exc).__name__}", 500, "InternalError")
            results = [error] * len(batch)
        finally:
            self._running = ()
            self._run_started = 0
        end = time.perf_counter_ns()
        us = (end - t0) // 1000
        for job, res in zip(batch, results, strict=True):
            job.prep = None  # release the inputs
            if isinstance(res, ProcessorError):
                resp = error_response(res.status, res.code, res.message, job.req.request_id)
            else:
                resp = res
            resp.compute_us = us
            if self.traced is not None:
                self.traced(job.req, job.at or t0, t0, end, resp)
            self._post(job, resp)

    def shutdown(self) -> None:
        self._stopping.set()
        for _ in self._threads:
            self._q.put(None)

    def join(self, timeout: float) -> bool:
        """After shutdown: wait (blocking) until the compute threads have ended; False when
        one still runs after ``timeout``. A process that exits while a thread is inside the
        model aborts (the thread is torn down in the middle of native code)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)
