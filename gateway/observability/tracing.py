"""The gateway's OpenTelemetry spans (the ``tracing`` extra; ``gateway.trace_endpoint``).

When tracing is on the application builds a :class:`TracedDataPlane` instead of the plain
``DataPlane``: the same core, with spans around its steps. When it is off nothing of this
module runs: the plain dataplane has no hook to check.

A call is traced when it brings a ``traceparent`` whose sampled flag is set, or, without
one, when a draw falls under ``trace_sample_ratio`` (OpenTelemetry's parent-based ratio
sampler). A call not traced costs a header lookup and that draw; its own ``traceparent``,
if any, still reaches the worker unchanged. A traced call gives::

    predict <service>            SERVER  (tensors, arrays, queue, record: the entry call's kind)
    │   event admission                  a body still arriving held against the gateway's budget
    ├── auth                             the token or EAS signature checked (a raw token is
    │                                    checked once: a call whose token was seen before, or
    │                                    checked as its headers came, ahead of the body, has none)
    └── worker <service>         CLIENT  the hop to the backend; its traceparent goes with the call
        │   event admission              the call counted against the service's calls in flight
        ├── worker queue                 in the worker process: waiting for the compute thread
        └── model run                    in the worker process: the processor's run
    (an admission takes no time: it is an event, with ``easkit.status`` 429 when it refused,
    on the span it happened in; a span of its own would cost a traced call a sixth more)
    (a pipeline's steps: ``step <name>`` under the pipeline's hop; a step that calls another
    service has a ``call <service>`` under it, with that service's hop and worker spans)

The worker's two spans are made by the worker process (gateway.worker.tracing), exported by
it to the same endpoint, and joined to the trace by the ``traceparent`` in the call.

A span is timed here while its step runs and made when the step ends, as the SDK's finished
span (``gateway.core.spans``): the current span is this module's own context variable, not
OpenTelemetry's context, which nothing else in the gateway reads.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict
from opentelemetry.sdk.trace import Event, SpanProcessor
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, Status, StatusCode

from gateway.codecs.otlp import batch_processor
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core import errors
from gateway.core.admission import Admission, AdmissionLimits, BodyHold
from gateway.core.calls import WorkerResponse
from gateway.core.dataplane import DataPlane
from gateway.core.spans import SpanSink, remote_parent, traceparent
from gateway.core.tracing import TRACEPARENT, TRACESTATE, read_traceparent


@dataclass(slots=True)
class _Span:
    """A span while its step runs: what it will be made of when the step ends."""

    context: SpanContext
    parent: SpanContext | None
    attributes: dict[str, Any]
    events: list[Event] | None = None
    status: Status | None = None

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def add_event(self, name: str, attributes: dict[str, Any]) -> None:
        if self.events is None:
            self.events = []
        self.events.append(Event(name, attributes))


# The span of the step running in this task, while a traced call runs; None otherwise. The
# steps look here: a context variable's lookup is all an untraced call pays for it.
_CURRENT: ContextVar[_Span | None] = ContextVar("easkit_span", default=None)


def _recording() -> bool:
    return _CURRENT.get() is not None


@dataclass(slots=True)
class _Scope:
    """One span for the length of a ``with`` block: under ``root`` (an entry call's: the
    caller's span, or the invalid context for a new trace) or else under the current span;
    made current while the block runs when ``current``; a GatewayError sets its
    ``easkit.status`` and ``easkit.error`` (and its status from 500 on), another exception
    its status and an ``exception`` event."""

    sink: SpanSink
    name: str
    kind: SpanKind
    root: SpanContext | None
    attributes: dict[str, Any]
    current: bool
    span: _Span | None = None
    start: int = 0
    token: Token[_Span | None] | None = None

    def __enter__(self) -> _Span:
        if self.root is None:
            under = _CURRENT.get()
            parent = under.context if under is not None else None
        else:
            parent = self.root if self.root.is_valid else None
        span = self.span = _Span(self.sink.context(parent), parent, self.attributes)
        if self.current:
            self.token = _CURRENT.set(span)
        self.start = time.time_ns()
        return span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        end = time.time_ns()
        span = self.span
        assert span is not None  # set by __enter__
        if self.token is not None:
            _CURRENT.reset(self.token)
        if isinstance(exc, errors.GatewayError):
            span.attributes["easkit.status"] = exc.status
            span.attributes["easkit.error"] = exc.code
            if exc.status >= 500:
                span.status = Status(StatusCode.ERROR, exc.message[:200])
        elif isinstance(exc, Exception):
            span.add_event("exception", {
                "exception.type": type(exc).__qualname__,
                "exception.message": str(exc),
                "exception.stacktrace": "".join(traceback.format_exception(exc)),
            })  # fmt: skip
            span.status = Status(StatusCode.ERROR, type(exc).__name__)
        self.sink.emit(
            self.name, self.kind, span.context, span.parent, self.start, end, span.attributes,
            span.events or (), span.status or Status(),
        )  # fmt: skip


@dataclass(slots=True)
class _Event:
    """A decision that takes no time (admission: in, or 429), as an event on the span it
    happened in rather than a span of its own: its attributes, and the status it refused with."""

    span: _Span
    name: str
    attributes: dict[str, Any]

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, errors.GatewayError):
            self.attributes["easkit.status"] = exc.status
        self.span.add_event(self.name, self.attributes)


def _current() -> _Span:
    span = _CURRENT.get()
    assert span is not None  # only asked while a traced call runs
    return span


class Tracing:
    """The gateway's sampling decision, and where its spans go (``processor``: the batch
    processor exporting over OTLP/HTTP to ``gateway.trace_endpoint`` unless given)."""

    def __init__(
        self,
        gw: GatewayConfig,
        draw: Callable[[], float] = random.random,
        processor: SpanProcessor | None = None,
    ) -> None:
        if processor is None:
            assert gw.trace_endpoint is not None  # tracing is on
            processor = batch_processor(gw.trace_endpoint, gw.trace_export_interval_ms)
        self.sink = SpanSink(processor, "easkit-gateway", "easkit.gateway")
        self.ratio = gw.trace_sample_ratio
        self.draw = draw

    def decide(self, headers: Mapping[str, str]) -> SpanContext | None:
        """The parent of a traced call's first span (the invalid context: a new trace), or
        None when the call is not traced."""
        parent = read_traceparent(headers.get(TRACEPARENT))
        if parent is None:
            if self.ratio <= 0.0 or (self.ratio < 1.0 and self.draw() >= self.ratio):
                return None
            return INVALID_SPAN_CONTEXT
        if not parent[2]:
            return None
        return remote_parent(parent, headers.get(TRACESTATE))

    def span(
        self,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        root: SpanContext | None = None,
        **attributes: Any,
    ) -> _Scope:
        """A span, current while the block runs (under ``root`` for an entry call's)."""
        return _Scope(self.sink, name, kind, root, attributes, True)

    def leaf(self, name: str, **attributes: Any) -> _Scope:
        """A span with no children (made under the current one, and never current itself:
        a step that calls nothing traced spares the context's switch)."""
        return _Scope(self.sink, name, SpanKind.INTERNAL, None, attributes, False)

    def shutdown(self) -> None:
        """Send what is held, then stop."""
        self.sink.shutdown()


class TracedAdmission(Admission):
    """The gateway's admission, with an ``admission`` event for the in-flight check of a
    traced call (429 past ``max_inflight_per_service``)."""

    def __init__(self, limits: AdmissionLimits, tracing: Tracing) -> None:
        super().__init__(limits)
        self.tracing = tracing

    def enter(self, service: str) -> None:
        if not _recording():
            return super().enter(service)
        with _Event(_current(), "admission", {"easkit.inflight": self.inflight[service]}):
            return super().enter(service)


def _name(service: str | ServiceConfig) -> str:
    return service.name if isinstance(service, ServiceConfig) else service


class TracedDataPlane(DataPlane):
    """The dataplane with spans around its entry calls and steps (see the module doc).

    Each entry call decides first, from the headers alone. A call not traced runs on
    ``plain``: the same dataplane (one state, the very same attributes) seen as the plain
    class, so none of its steps passes through a span's check; the entry call hands back the
    plain one's coroutine itself, so the decision is all the call pays."""

    def __init__(self, *args: Any, tracing: Tracing, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tracing = tracing
        plain = object.__new__(DataPlane)
        plain.__dict__ = self.__dict__  # shared, not copied: a service set on one is on both
        self.plain = plain

    async def _traced(
        self, kind: str, service: str | ServiceConfig, root: SpanContext, request_id: str, call: Any
    ) -> Any:
        """Run an entry call's coroutine as the root span of its part of the trace."""
        name = _name(service)
        attributes = {"easkit.service": name, "easkit.request_id": request_id}
        with self.tracing.span(f"{kind} {name}", SpanKind.SERVER, root, **attributes):
            return await call

    # ------------------------------------------------------------------ entry calls
    # Not coroutine functions: each returns the coroutine the caller awaits, the plain one's
    # for a call not traced.
    def predict_call(self, service: Any, headers: Any, raw_path: str, body: Any, **kw: Any) -> Any:  # type: ignore[override]
        context = self.tracing.decide(headers)
        if context is None:
            return self.plain.predict_call(service, headers, raw_path, body, **kw)
        call = super().predict_call(service, headers, raw_path, body, **kw)
        return self._traced("predict", service, context, kw.get("request_id", ""), call)

    def queue_call(self, service: Any, queue: str, headers: Any, raw_path: str, body: Any, **kw: Any) -> Any:  # type: ignore[override]
        context = self.tracing.decide(headers)
        if context is None:
            return self.plain.queue_call(service, queue, headers, raw_path, body, **kw)
        call = super().queue_call(service, queue, headers, raw_path, body, **kw)
        return self._traced("queue", queue, context, "", call)

    def tensors_call(
        self, service: Any, headers: Any, raw_path: str, body: Any, decode: Any, **kw: Any
    ) -> Any:  # type: ignore[override]
        context = self.tracing.decide(headers)
        if context is None:
            return self.plain.tensors_call(service, headers, raw_path, body, decode, **kw)
        call = super().tensors_call(service, headers, raw_path, body, decode, **kw)
        return self._traced("tensors", service, context, kw.get("request_id", ""), call)

    def arrays_call(
        self, service: Any, headers: Any, raw_path: str, body: Any, decode: Any, **kw: Any
    ) -> Any:  # type: ignore[override]
        context = self.tracing.decide(headers)
        if context is None:
            return self.plain.arrays_call(service, headers, raw_path, body, decode, **kw)
        call = super().arrays_call(service, headers, raw_path, body, decode, **kw)
        return self._traced("arrays", service, context, kw.get("request_id", ""), call)

    def record_call(self, svc: ServiceConfig, headers: Any, body: bytes, **kw: Any) -> Any:  # type: ignore[override]
        if _recording():  # a pipeline's step, within the pipeline's traced call
            return self._step(svc, super().record_call(svc, headers, body, **kw))
        context = self.tracing.decide(headers)
        if context is None:
            return self.plain.record_call(svc, headers, body, **kw)
        call = super().record_call(svc, headers, body, **kw)
        return self._traced("record", svc, context, kw.get("request_id", ""), call)

    def record_arrays_call(self, svc: ServiceConfig, body: bytes, **kw: Any) -> Any:  # type: ignore[override]
        context = self.tracing.decide({})
        if context is None:
            return self.plain.record_arrays_call(svc, body, **kw)
        call = super().record_arrays_call(svc, body, **kw)
        return self._traced("record", svc, context, kw.get("request_id", ""), call)

    def step_span(self, pipeline: str, step: str) -> AbstractContextManager[Any]:
        if not _recording():
            return nullcontext()
        return self.tracing.span(f"step {step}", **{"easkit.pipeline": pipeline, "easkit.step": step})

    async def _step(self, svc: ServiceConfig, call: Any) -> Any:
        with self.tracing.span(f"call {svc.name}", **{"easkit.service": svc.name}):
            return await call

    # ------------------------------------------------------------------ steps
    def _hold_body(self, svc: ServiceConfig, headers: Mapping[str, str], nbytes: int) -> BodyHold:
        if not _recording():
            return super()._hold_body(svc, headers, nbytes)
        with _Event(_current(), "admission", {"easkit.body_bytes": nbytes}):
            return super()._hold_body(svc, headers, nbytes)

    def _authenticate(
        self, svc: ServiceConfig, headers: Mapping[str, str], raw_path: str, body: bytes | None, key: str = ""
    ) -> None:
        if not svc.tokens or not _recording():
            return super()._authenticate(svc, headers, raw_path, body, key)
        with self.tracing.leaf("auth"):
            return super()._authenticate(svc, headers, raw_path, body, key)

    def _verify_token(self, svc: ServiceConfig, headers: Mapping[str, str], auth: str, key: str) -> None:
        # A token checked while the body still arrives is remembered, so _authenticate
        # never runs for that call: this check is the call's auth span then.
        if not _recording():
            return super()._verify_token(svc, headers, auth, key)
        with self.tracing.leaf("auth"):
            return super()._verify_token(svc, headers, auth, key)

    async def _dispatch(
        self, svc: ServiceConfig, headers: Mapping[str, str], body: bytes, **kw: Any
    ) -> WorkerResponse:
        if not _recording():
            return await super()._dispatch(svc, headers, body, **kw)
        with self.tracing.span(f"worker {svc.name}", SpanKind.CLIENT, **{"easkit.service": svc.name}) as span:
            sent: CIMultiDict[str] = CIMultiDict(headers)
            sent[TRACEPARENT] = traceparent(span.context)  # the worker's spans join this one
            if span.context.trace_state:
                sent[TRACESTATE] = span.context.trace_state.to_header()
            resp = await super()._dispatch(svc, sent, body, **kw)
            span.set_attribute("easkit.status", int(resp.status))
            span.set_attribute("easkit.compute_us", int(resp.compute_us))
            return resp


__all__ = ["TracedAdmission", "TracedDataPlane", "Tracing"]
