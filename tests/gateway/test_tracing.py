"""The gateway's tracing decisions and spans, in process: which calls are traced, the tree a
traced call gives, the traceparent the backend receives, and a refusal's attributes. (The
spans of a real gateway and worker, exported over OTLP/HTTP: tests/e2e/test_tracing.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.config import GatewayConfig, ServiceConfig
from gateway.core import errors
from gateway.core.admission import AdmissionLimits
from gateway.core.tracing import read_traceparent
from gateway.observability.tracing import TracedAdmission, TracedDataPlane, Tracing
from tests.gateway.test_dataplane import Backend, Reader

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


def _tracing(ratio: float, draws: list[float] | None = None) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    gw = GatewayConfig(trace_endpoint="http://127.0.0.1:1/v1/traces", trace_sample_ratio=ratio)
    it = iter(draws or [])
    return Tracing(gw, draw=lambda: next(it), processor=SimpleSpanProcessor(exporter)), exporter


def test_the_traceparent_is_read_as_w3c_trace_context_says() -> None:
    assert read_traceparent(f"00-{TRACE}-{PARENT}-01") == (int(TRACE, 16), int(PARENT, 16), True)
    assert read_traceparent(f"00-{TRACE}-{PARENT}-00") == (int(TRACE, 16), int(PARENT, 16), False)
    for bad in (
        f"00-{'0' * 32}-{PARENT}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        "00-xyz",
        f"00-{TRACE.upper()}-{PARENT}-01",
    ):
        assert read_traceparent(bad) is None
    assert read_traceparent(None) is None


def test_which_calls_are_traced() -> None:
    tracing, _ = _tracing(0.25, [0.1, 0.9])
    assert tracing.decide({}) is not None  # drawn under the ratio: a new trace
    assert tracing.decide({}) is None  # over it
    # The caller's decision wins, whatever the ratio (no draw is taken).
    assert tracing.decide({"traceparent": f"00-{TRACE}-{PARENT}-00"}) is None
    assert tracing.decide({"traceparent": f"00-{TRACE}-{PARENT}-01"}) is not None
    off, _ = _tracing(0.0)
    assert off.decide({}) is None


async def test_a_traced_call_gives_one_tree_and_the_backend_its_traceparent() -> None:
    tracing, exporter = _tracing(0.0)
    svc = ServiceConfig(name="m", processor="python", entry="x.py:X", token="tok", extra_tokens=("tok2",))
    backend = Backend()
    plane = TracedDataPlane(
        [svc], {"m": backend}, admission=TracedAdmission(AdmissionLimits(), tracing), tracing=tracing
    )
    headers = {"Authorization": "tok", "traceparent": f"00-{TRACE}-{PARENT}-01"}
    resp = await plane.predict_call("m", headers, "/api/predict/m", b"in", request_id="r1", arrived=0.0)
    assert resp.status == 200
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"predict m", "auth", "worker m"}
    server, hop = spans["predict m"], spans["worker m"]
    assert server.kind is SpanKind.SERVER and hop.kind is SpanKind.CLIENT
    assert f"{server.context.trace_id:032x}" == TRACE and f"{server.parent.span_id:016x}" == PARENT
    assert spans["auth"].parent.span_id == server.context.span_id == hop.parent.span_id
    # Admission takes no time: an event of the span it happened in.
    ((admitted),) = [e for e in hop.events if e.name == "admission"]
    assert admitted.attributes["easkit.inflight"] == 0 and not server.events
    assert server.attributes["easkit.request_id"] == "r1" and hop.attributes["easkit.status"] == 200
    # The worker's spans will be children of the hop.
    ((req, _),) = backend.calls
    assert req.header("traceparent") == f"00-{TRACE}-{hop.context.span_id:016x}-01"

    # A token checked while the body still arrives (then remembered, so checked only then)
    # is the call's auth span.
    exporter.clear()
    arriving = {"Authorization": "tok2", "traceparent": f"00-{TRACE}-{PARENT}-01"}
    await plane.predict_call("m", arriving, "/api/predict/m", Reader(), request_id="r1b", arrived=0.0)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"predict m", "auth", "worker m"}
    assert spans["auth"].parent.span_id == spans["predict m"].context.span_id
    # The body held against the gateway's budget while it arrived: the entry span's event.
    assert [e.name for e in spans["predict m"].events] == ["admission"]

    # Not traced: no span, and the caller's own traceparent goes on unchanged.
    exporter.clear()
    quiet = {"Authorization": "tok", "traceparent": f"00-{TRACE}-{PARENT}-00"}
    await plane.predict_call("m", quiet, "/api/predict/m", b"in", request_id="r2", arrived=0.0)
    assert (
        not exporter.get_finished_spans()
        and backend.calls[-1][0].header("traceparent") == quiet["traceparent"]
    )

    # A refused call's span says why; a backend failure from 500 on marks it an error.
    with pytest.raises(errors.Unauthorized):
        await plane.predict_call(
            "m", {**headers, "Authorization": "no"}, "/", b"in", request_id="r3", arrived=0.0
        )
    backend.fail = errors.ServiceNotReady("no worker")
    with pytest.raises(errors.ServiceNotReady):
        await plane.predict_call("m", headers, "/", b"in", request_id="r4", arrived=0.0)
    by_request = {
        s.attributes["easkit.request_id"]: s for s in exporter.get_finished_spans() if s.name == "predict m"
    }
    assert by_request["r3"].attributes["easkit.error"] == "Unauthorized" and by_request["r3"].status.is_ok
    assert by_request["r4"].attributes["easkit.status"] == 503 and not by_request["r4"].status.is_ok
