"""Spans of the gateway and its workers, made once they have ended and handed to
OpenTelemetry's SDK for export (the ``tracing`` extra; imported only when tracing is on).

A traced step is timed by the code that runs it; when it ends, its span is made in one go as
the SDK's :class:`ReadableSpan` and given to the span processor that batches and exports it.
The SDK's live spans (``Tracer.start_span``: a lock, attribute limits, the processors'
start hooks, a context switch to make one current) cost several times as much, and a traced
call makes several: the gateway keeps its own notion of the current span (a context
variable) and its own ids, and needs nothing of a span until it ends.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, TraceFlags, TraceState

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status()


def new_trace_id() -> int:
    """A random, valid (non-zero) 128-bit trace id."""
    while True:
        trace_id = random.getrandbits(128)
        if trace_id:
            return trace_id


def new_span_id() -> int:
    """A random, valid (non-zero) 64-bit span id."""
    while True:
        span_id = random.getrandbits(64)
        if span_id:
            return span_id


def remote_parent(parent: tuple[int, int, bool], state: str | None) -> SpanContext:
    """The caller's span as the parent of ours: a ``traceparent`` as ``read_traceparent``
    reads it, and the call's ``tracestate``, carried on as W3C Trace Context asks."""
    trace_state = TraceState.from_header([state]) if state else None
    return SpanContext(parent[0], parent[1], True, _SAMPLED, trace_state)


def traceparent(context: SpanContext) -> str:
    """The ``traceparent`` that makes a callee's spans children of ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


class SpanSink:
    """Where a process's finished spans go: the span processor that exports them, with the
    resource (``service.name``) and instrumentation scope every span of the process carries."""

    def __init__(self, processor: SpanProcessor, service_name: str, scope: str) -> None:
        self.processor = processor
        self.resource = Resource.create({"service.name": service_name})
        self.scope = InstrumentationScope(scope)

    def context(self, parent: SpanContext | None) -> SpanContext:
        """A new span's own context: in its parent's trace, or the first of a new one."""
        if parent is None:
            return SpanContext(new_trace_id(), new_span_id(), False, _SAMPLED)
        return SpanContext(parent.trace_id, new_span_id(), False, _SAMPLED, parent.trace_state)

    def emit(
        self,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        events: Sequence[Event] = (),
        status: Status = _UNSET,
    ) -> None:
        """Hand a span that has ended (times in ``time.time_ns()``) to the processor."""
        span = ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self.resource,
            attributes=attributes,
            events=events,
            links=(),
            kind=kind,
            instrumentation_scope=self.scope,
            status=status,
            start_time=start_ns,
            end_time=end_ns,
        )
        self.processor.on_end(span)

    def shutdown(self) -> None:
        """Export what is held, then stop."""
        self.processor.shutdown()


__all__ = ["SpanSink", "new_span_id", "new_trace_id", "remote_parent", "traceparent"]
