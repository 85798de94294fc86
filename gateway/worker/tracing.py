"""A worker's part of a trace (``gateway.trace_endpoint``; the module doc of
``gateway.observability.tracing`` shows the whole tree).

A call the gateway traces arrives with a ``traceparent`` whose sampled flag is set. Once it
has run, the compute queue hands :meth:`WorkerTracing.record` its times: when it was queued,
when the processor started, when it ended. Two spans are made after the fact, children of
the gateway's hop to this worker: ``worker queue`` and ``model run``, exported by this process
to the same endpoint. A call without a sampled ``traceparent`` costs one header lookup.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gateway.config import GatewayConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.tracing import TRACEPARENT, TRACESTATE, read_traceparent


class WorkerTracing:
    def __init__(self, gw: GatewayConfig, service: str) -> None:
        # OpenTelemetry loads only in a worker that traces.
        from opentelemetry.trace import SpanKind, Status, StatusCode

        from gateway.codecs.otlp import batch_processor
        from gateway.core.spans import SpanSink, remote_parent

        assert gw.trace_endpoint is not None  # see worker_tracing
        self.sink = SpanSink(
            batch_processor(gw.trace_endpoint, gw.trace_export_interval_ms), "easkit-worker", "easkit.worker"
        )
        self.remote_parent = remote_parent
        self.internal = SpanKind.INTERNAL
        self.error = Status(StatusCode.ERROR)
        self.unset = Status()
        self.attributes = {"easkit.service": service, "easkit.worker_pid": os.getpid()}
        # perf_counter_ns -> the wall clock spans are stamped with.
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def record(self, req: WorkerRequest, queued_ns: int, started_ns: int, ended_ns: int, resp: Any) -> None:
        """``req`` waited from ``queued_ns`` and ran from ``started_ns`` to ``ended_ns``
        (perf_counter_ns); ``resp``: its answer (a WorkerResponse), None when it was dropped."""
        # The gateway writes it in lower case into every call it traces.
        value = req.headers.get(TRACEPARENT)
        if value is None:
            return
        read = read_traceparent(value)
        if read is None or not read[2]:
            return
        parent = self.remote_parent(read, req.headers.get(TRACESTATE))
        sink, off = self.sink, self.offset_ns
        attributes = {**self.attributes, "easkit.request_id": req.request_id}
        sink.emit("worker queue", self.internal, sink.context(parent), parent, queued_ns + off,
                  started_ns + off, attributes)  # fmt: skip
        run, status = dict(attributes), self.unset
        if isinstance(resp, WorkerResponse):
            run["easkit.status"] = int(resp.status)
            if resp.status >= 500:
                status = self.error
        sink.emit("model run", self.internal, sink.context(parent), parent, started_ns + off,
                  ended_ns + off, run, (), status)  # fmt: skip

    def shutdown(self) -> None:
        self.sink.shutdown()


def worker_tracing(gw: GatewayConfig, service: str) -> WorkerTracing | None:
    """The worker's tracing, or None when the gateway traces nothing."""
    if gw.trace_endpoint is None:
        return None
    return WorkerTracing(gw, service)


__all__ = ["WorkerTracing", "worker_tracing"]
