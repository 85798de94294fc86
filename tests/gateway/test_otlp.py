"""The OTLP/HTTP request the gateway's exporter writes decodes to the very message
OpenTelemetry's own encoder builds for the same spans: every field a span can carry
(attributes of each value type, events, links, status, trace state, dropped counts,
remote and local parents, every kind) and the grouping by resource and scope."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from gateway.codecs.otlp import encode_spans
from gateway.core.spans import SpanSink, remote_parent, traceparent
from gateway.core.tracing import read_traceparent

REMOTE = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
)


def _sdk_spans(resource: Resource, limits: SpanLimits | None = None) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, span_limits=limits or SpanLimits())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("easkit.test", "1.2", schema_url="https://example.com/schema")
    plain = provider.get_tracer("plain")
    attributes = {
        "text": "héllo ✓",
        "yes": True,
        "no": False,
        "count": 42,
        "negative": -7,
        "big": 2**62,
        "ratio": 0.25,
        "strings": ("a", "b"),
        "ints": [1, -2, 3],
        "floats": [1.5],
        "bools": [True, False],
        "empty": "",
    }
    for kind in SpanKind:
        with tracer.start_as_current_span(f"span {kind.name}", kind=kind, attributes=attributes) as span:
            span.add_event("an event", {"n": 1, "what": "x"}, timestamp=1_700_000_000_000_000_001)
            span.add_event("bare")
            with plain.start_as_current_span("child", links=[Link(REMOTE, {"why": "batch"}), Link(REMOTE)]):
                pass
    remote = set_span_in_context(NonRecordingSpan(REMOTE))
    with tracer.start_as_current_span("under a remote parent", context=remote) as span:
        span.set_status(Status(StatusCode.ERROR, "it failed: ✗"))
    with tracer.start_as_current_span("ok", context=remote) as span:
        span.set_status(Status(StatusCode.OK))
    with tracer.start_as_current_span("raises", record_exception=True, set_status_on_exception=True):
        try:
            raise ValueError("bad value")
        except ValueError as exc:
            trace_span = provider.get_tracer("x")  # a third scope, with an exception event
            with trace_span.start_as_current_span("caught") as inner:
                inner.record_exception(exc)
    return list(exporter.get_finished_spans())


def _same(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == library_encode(spans)


def test_every_field_of_a_span_as_the_library_encodes_it() -> None:
    spans = _sdk_spans(Resource.create({"service.name": "easkit-test", "host.cores": 2}))
    assert len(spans) > 10
    _same(spans)
    _same(spans[:1])
    _same([])


def test_dropped_attributes_events_and_links_are_counted() -> None:
    limits = SpanLimits(max_span_attributes=3, max_events=1, max_links=1, max_event_attributes=1)
    spans = _sdk_spans(Resource.create({"service.name": "limited"}), limits)
    assert any(s.dropped_attributes for s in spans) and any(s.dropped_events for s in spans)
    assert any(s.dropped_links for s in spans)
    _same(spans)


def test_spans_of_two_resources_are_grouped_apart() -> None:
    first = _sdk_spans(Resource.create({"service.name": "one"}))
    second = _sdk_spans(Resource({"service.name": "two"}, schema_url="https://example.com/r"))
    _same(first + second)


def test_a_sink_makes_finished_spans_that_encode_as_the_library_would() -> None:
    exporter = InMemorySpanExporter()
    sink = SpanSink(SimpleSpanProcessor(exporter), "easkit-gateway", "easkit.gateway")
    read = read_traceparent(traceparent(REMOTE))
    assert read is not None
    parent = remote_parent(read, "vendor=v1,other=x")
    assert parent.trace_state == REMOTE.trace_state and parent.is_remote
    root = sink.context(parent)
    assert root.trace_id == REMOTE.trace_id and root.trace_state == REMOTE.trace_state
    sink.emit("predict m", SpanKind.SERVER, root, parent, 10, 20, {"easkit.service": "m"})
    error = Status(StatusCode.ERROR)
    sink.emit("auth", SpanKind.INTERNAL, sink.context(root), root, 11, 12, {}, status=error)
    new = sink.context(None)
    assert new.trace_id != REMOTE.trace_id and new.is_valid
    sink.emit("predict n", SpanKind.SERVER, new, None, 30, 40, {"easkit.status": 503})
    spans = list(exporter.get_finished_spans())
    assert [s.name for s in spans] == ["predict m", "auth", "predict n"]
    _same(spans)
    # Our own traceparent reads back as the span it names, sampled.
    assert read == (REMOTE.trace_id, REMOTE.span_id, True)
