"""What the gateway and its workers share about tracing (OpenTelemetry, the ``tracing``
extra): reading a W3C ``traceparent``. The spans are made by ``gateway.core.spans`` (for
the gateway in ``gateway.observability.tracing``, for a worker in ``gateway.worker.tracing``)
and exported over OTLP/HTTP by ``gateway.codecs.otlp``; the gateway's and its worker's join
one trace through the ``traceparent`` header the gateway writes into the call it sends.

Tracing is off unless ``gateway.trace_endpoint`` is set; this module imports no part of
OpenTelemetry, whose modules load only when tracing is on.
"""

from __future__ import annotations

import re

from gateway.config import ConfigError

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# version-traceid-parentid-flags, lower-case hex (W3C Trace Context); an all-zero id is invalid.
_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})")
EXTRA_HINT = 'pip install "easkit[tracing]"'


def read_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """A valid ``traceparent``'s trace id, parent span id and sampled flag; None for a
    missing or malformed one (which W3C Trace Context says to ignore)."""
    if value is None:
        return None
    match = _TRACEPARENT_RE.match(value.strip())
    if match is None:
        return None
    return int(match.group(1), 16), int(match.group(2), 16), bool(int(match.group(3), 16) & 1)


def require_tracing() -> None:
    """Raise a ConfigError naming the extra when OpenTelemetry is not installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"gateway.trace_endpoint: tracing needs the tracing extra ({EXTRA_HINT})") from exc


__all__ = ["EXTRA_HINT", "TRACEPARENT", "TRACESTATE", "read_traceparent", "require_tracing"]
