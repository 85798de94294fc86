"""Finished spans as OTLP/HTTP's protobuf (``ExportTraceServiceRequest``), and the exporter
that posts them (the ``tracing`` extra).

The exporter is OpenTelemetry's own OTLP/HTTP span exporter (its transport, retries, TLS
and ``OTEL_EXPORTER_OTLP_*`` settings) with one step replaced: the request's bytes are
written here rather than by the library's encoder, which builds a protobuf object per span,
attribute and value and hashes each span's resource: about 30 µs a span, twice what making
the span costs, paid by the process that serves the calls. Written directly it is about a
fifth of that; tests/gateway/test_otlp.py checks the bytes decode to the very message the
library's encoder builds, span for span.

Imported only when tracing is on: it imports OpenTelemetry.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from eas_sdk.codecs.eas.wire import varint

_logger = logging.getLogger(__name__)

_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_fixed32 = struct.Struct("<I").pack

# Span.flags: the parent's is-remote bit is known, and whether it is set.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its bytes."""
    return tag + varint(len(payload)) + payload


def _text(tag: bytes, value: str) -> bytes:
    return _field(tag, value.encode())


def _any_value(value: Any) -> bytes:
    """An ``AnyValue``: the one field of its oneof that the value's type selects."""
    if isinstance(value, bool):  # before int: a bool is one
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, int):
        return b"\x18" + varint(value)  # int64: a negative one as two's complement
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(v)) for v in value]))
    if isinstance(value, Mapping):
        pairs = [_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]
        return _field(b"\x32", b"".join(pairs))
    raise TypeError(f"an attribute of type {type(value).__name__} has no OTLP value")


def _key_value(key: str, value: Any) -> bytes:
    return _text(b"\x0a", key) + _field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        try:
            out.append(_field(tag, _key_value(key, value)))
        except TypeError:  # the library's encoder logs and drops such an attribute too
            _logger.exception("span attribute %s not exported", key)
    return b"".join(out)


def _span(span: ReadableSpan) -> bytes:
    """One ``Span`` message (opentelemetry/proto/trace/v1/trace.proto's field numbers)."""
    context = span.context
    assert context is not None  # a finished span always has one
    parent = span.parent
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_text(b"\x1a", ",".join([f"{k}={v}" for k, v in context.trace_state.items()])))
    flags = _HAS_IS_REMOTE
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        if parent.is_remote:
            flags |= _IS_REMOTE
    parts += (
        _text(b"\x2a", span.name),
        b"\x30" + varint(span.kind.value + 1),  # the proto's kinds start at UNSPECIFIED
        b"\x39" + _fixed64(span.start_time or 0),
        b"\x41" + _fixed64(span.end_time or 0),
        _attributes(b"\x4a", span.attributes),
    )
    if span.dropped_attributes:
        parts.append(b"\x50" + varint(span.dropped_attributes))
    for event in span.events:
        body = b"\x09" + _fixed64(event.timestamp) + _text(b"\x12", event.name)
        body += _attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            body += b"\x20" + varint(event.dropped_attributes)
        parts.append(_field(b"\x5a", body))
    if span.dropped_events:
        parts.append(b"\x60" + varint(span.dropped_events))
    for link in span.links:
        linked = link.context
        body = (
            b"\x0a\x10"
            + linked.trace_id.to_bytes(16, "big")
            + b"\x12\x08"
            + linked.span_id.to_bytes(8, "big")
        )
        body += _attributes(b"\x22", link.attributes)
        if link.dropped_attributes:
            body += b"\x28" + varint(link.dropped_attributes)
        body += b"\x35" + _fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if linked.is_remote else 0))
        parts.append(_field(b"\x6a", body))
    if span.dropped_links:
        parts.append(b"\x70" + varint(span.dropped_links))
    status = span.status
    if status is not None:
        body = _text(b"\x12", status.description) if status.description else b""
        if status.status_code.value:
            body += b"\x18" + varint(status.status_code.value)
        parts.append(_field(b"\x7a", body))
    parts.append(b"\x85\x01" + _fixed32(flags))
    return b"".join(parts)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` carrying ``spans``, grouped by resource and, within
    each, by instrumentation scope."""
    # By identity: a process's spans share one resource object, and hashing a resource
    # serialises its attributes.
    resources: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        entry = resources.get(id(span.resource))
        if entry is None:
            entry = resources[id(span.resource)] = (span.resource, {})
        scope = span.instrumentation_scope
        group = entry[1].get(id(scope))
        if group is None:
            group = entry[1][id(scope)] = (scope, [])
        group[1].append(_field(b"\x12", _span(span)))
    out = []
    for resource, scopes in resources.values():
        body = _field(b"\x0a", _attributes(b"\x0a", resource.attributes))
        for scope, encoded in scopes.values():
            scope_body = b""
            if scope is not None:
                scope_body = _text(b"\x0a", scope.name)
                if scope.version:
                    scope_body += _text(b"\x12", scope.version)
                scope_body += _attributes(b"\x1a", scope.attributes)
            scope_spans = _field(b"\x0a", scope_body) + b"".join(encoded)
            if scope is not None and scope.schema_url:
                scope_spans += _text(b"\x1a", scope.schema_url)
            body += _field(b"\x12", scope_spans)
        if resource.schema_url:
            body += _text(b"\x1a", resource.schema_url)
        out.append(_field(b"\x0a", body))
    return b"".join(out)


class OtlpSpanExporter(OTLPSpanExporter):
    """OpenTelemetry's OTLP/HTTP span exporter, its request written by :func:`encode_spans`."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            data = encode_spans(spans)
        except Exception:  # a batch that cannot be encoded is dropped, never the process
            _logger.exception("a batch of %d spans could not be encoded", len(spans))
            return SpanExportResult.FAILURE
        # The library's client: its compression, retries with backoff, TLS and headers.
        result = self._client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE


def batch_processor(endpoint: str, interval_ms: int) -> BatchSpanProcessor:
    """Spans batched and posted to ``endpoint`` every ``interval_ms`` (or sooner, when a
    batch is full), from the processor's own thread."""
    return BatchSpanProcessor(OtlpSpanExporter(endpoint=endpoint), schedule_delay_millis=interval_ms)


__all__ = ["OtlpSpanExporter", "batch_processor", "encode_spans"]
