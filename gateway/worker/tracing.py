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
from gateway.core.tracing import TRACEPARENT, make_provider, parent_sampled


class WorkerTracing:
    def __init__(self, gw: GatewayConfig, service: str) -> None:
        from opentelemetry.trace import Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = make_provider(gw, "easkit-worker")
        self.tracer = self.provider.get_tracer("easkit.worker")
        self.propagator = TraceContextTextMapPropagator()
        self.error = Status(StatusCode.ERROR)
        self.attributes = {"easkit.service": service, "easkit.worker_pid": os.getpid()}
        # perf_counter_ns -> the wall clock spans are stamped with.
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def record(self, req: WorkerRequest, queued_ns: int, started_ns: int, ended_ns: int, resp: Any) -> None:
        """``req`` waited from ``queued_ns`` and ran from ``started_ns`` to ``ended_ns``
        (perf_counter_ns); ``resp``: its answer (a WorkerResponse), None when it was dropped."""
        # The gateway writes it in lower case into every call it traces.
        parent = req.headers.get(TRACEPARENT)
        if parent is None or not parent_sampled({TRACEPARENT: parent}):
            return
        context = self.propagator.extract({TRACEPARENT: parent})
        off = self.offset_ns
        attributes = {**self.attributes, "easkit.request_id": req.request_id}
        wait = self.tracer.start_span(
            "worker queue", context=context, start_time=queued_ns + off, attributes=attributes
        )
        wait.end(end_time=started_ns + off)
        run = self.tracer.start_span(
            "model run", context=context, start_time=started_ns + off, attributes=attributes
        )
        if isinstance(resp, WorkerResponse):
            run.set_attribute("easkit.status", int(resp.status))
            if resp.status >= 500:
                run.set_status(self.error)
        run.end(end_time=ended_ns + off)

    def shutdown(self) -> None:
        self.provider.shutdown()


def worker_tracing(gw: GatewayConfig, service: str) -> WorkerTracing | None:
    """The worker's tracing, or None when the gateway traces nothing."""
    if gw.trace_endpoint is None:
        return None
    return WorkerTracing(gw, service)


__all__ = ["WorkerTracing", "worker_tracing"]
