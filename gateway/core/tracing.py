"""What the gateway and its workers share about tracing (OpenTelemetry, the ``tracing``
extra): reading a W3C ``traceparent``, and the tracer provider that exports spans over
OTLP/HTTP. The gateway's spans are made in ``gateway.observability.tracing``, a worker's in
``gateway.worker.tracing``; both join one trace through the ``traceparent`` header the
gateway writes into the call it sends to the worker.

Tracing is off unless ``gateway.trace_endpoint`` is set, and nothing here is imported by
the call path then: OpenTelemetry is imported only when a provider is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.config import ConfigError, GatewayConfig

TRACEPARENT = "traceparent"
# version-traceid-parentid-flags, lower-case hex (W3C Trace Context); an all-zero id is invalid.
_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-([0-9a-f]{2})")
EXTRA_HINT = 'pip install "easkit[tracing]"'


def parent_sampled(headers: Mapping[str, str]) -> bool | None:
    """The ``sampled`` flag of a valid ``traceparent`` among ``headers``; None without one."""
    value = headers.get(TRACEPARENT)
    if value is None:
        return None
    match = _TRACEPARENT_RE.match(value.strip())
    if match is None:
        return None
    return bool(int(match.group(1), 16) & 1)


def require_tracing() -> None:
    """Raise a ConfigError naming the extra when OpenTelemetry is not installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"gateway.trace_endpoint: tracing needs the tracing extra ({EXTRA_HINT})") from exc


def make_provider(gw: GatewayConfig, service_name: str) -> Any:
    """A TracerProvider exporting every span it is given over OTLP/HTTP to
    ``gw.trace_endpoint`` (the sampling is decided before a span is made), batched and sent
    every ``gw.trace_export_interval_ms``."""
    require_tracing()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}), sampler=ALWAYS_ON, shutdown_on_exit=False
    )
    exporter = OTLPSpanExporter(endpoint=gw.trace_endpoint)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=gw.trace_export_interval_ms)
    )
    return provider


__all__ = ["EXTRA_HINT", "TRACEPARENT", "make_provider", "parent_sampled", "require_tracing"]
