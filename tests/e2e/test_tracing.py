"""Tracing on a running gateway: the spans it and its worker export over OTLP/HTTP arrive at
a local collector (a small aiohttp server decoding them with opentelemetry-proto) as one
tree under the caller's ``traceparent``; a call not sampled exports nothing."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.waiting import wait_until

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    resource: str
    attributes: dict[str, Any]
    events: tuple[str, ...] = ()


class Collector:
    """An OTLP/HTTP trace endpoint on 127.0.0.1, in a thread of its own."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        from aiohttp import web

        async def traces(request: web.Request) -> web.Response:
            message = ExportTraceServiceRequest.FromString(await request.read())
            for resource_spans in message.resource_spans:
                names = [
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ]
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        attributes = {a.key: _value(a.value) for a in s.attributes}
                        self.spans.append(
                            Span(
                                s.name,
                                s.trace_id.hex(),
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                names[0],
                                attributes,
                                tuple(e.name for e in s.events),
                            )
                        )
            return web.Response(body=b"", content_type="application/x-protobuf")

        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/traces", traces)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.started.set()

        self.loop.run_until_complete(main())
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def start(self) -> str:
        self.thread.start()
        assert self.started.wait(10)
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


@pytest.fixture
def collector() -> Iterator[tuple[str, Collector]]:
    c = Collector()
    url = c.start()
    try:
        yield url, c
    finally:
        c.stop()


def _post(url: str, headers: dict[str, str]) -> int:
    """POST ``hello`` with its headers in one write. A body that comes after its headers is
    met by the token check as the headers arrive, before the call (and its span) starts: the
    spans this test expects would then depend on how the loopback split the request."""
    parts = urllib.parse.urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Length: 5", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\nhello").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_a_traced_call_is_one_tree_across_the_gateway_and_its_worker(
    gateway_factory: Any, collector: tuple[str, Collector], digits_model: Path
) -> None:
    endpoint, spans = collector
    config = {
        "gateway": {"trace_endpoint": endpoint, "trace_sample_ratio": 0.0, "trace_export_interval_ms": 100},
        "services": [
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "token": "tok"},
            {"name": "digits", "processor": "onnx", "placement": "process", "model": str(digits_model),
             "public": True},
            {"name": "pipe", "processor": "pipeline", "public": True, "pipeline": {
                "inputs": {"pixels": {"dtype": "float32", "shape": [-1, 64]}},
                "steps": [{"name": "classify", "service": "digits", "inputs": {"input": "request.pixels"},
                           "outputs": ["label"]}],
                "outputs": {"label": "classify.label"}}},
        ],
    }  # fmt: skip
    gw: GatewayProcess = gateway_factory(config)
    gw.wait_workers_ready("echo", 1)
    url = gw.url + "/api/predict/echo"
    # Sampled by its caller: honoured whatever the ratio (first: a raw token is checked once).
    assert _post(url, {"Authorization": "tok", "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) == 200
    # Not sampled: no traceparent at a ratio of 0, and a traceparent whose sampled flag is off.
    assert _post(url, {"Authorization": "tok"}) == 200
    assert _post(url, {"Authorization": "tok", "traceparent": f"00-{'1' * 32}-{PARENT_ID}-00"}) == 200

    def tree() -> dict[str, Span] | None:
        got = {s.name: s for s in spans.spans}
        return (
            got if {"predict echo", "auth", "worker echo", "worker queue", "model run"} <= set(got) else None
        )

    got = wait_until(tree, 30, "the gateway's and the worker's spans at the collector")
    assert {s.trace_id for s in spans.spans} == {TRACE_ID}  # the unsampled calls exported nothing
    server, hop = got["predict echo"], got["worker echo"]
    assert server.parent_id == PARENT_ID and server.resource == "easkit-gateway"
    assert server.attributes["easkit.service"] == "echo"
    assert got["auth"].parent_id == server.span_id and hop.parent_id == server.span_id
    assert "admission" in hop.events and "admission" not in got  # an event of the hop
    for name in ("worker queue", "model run"):
        assert got[name].parent_id == hop.span_id and got[name].resource == "easkit-worker"
    assert got["model run"].attributes["easkit.status"] == 200
    assert hop.attributes["easkit.status"] == 200

    # A refused call's span says why.
    assert _post(url, {"Authorization": "wrong", "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) == 401
    refused = wait_until(
        lambda: [
            s for s in spans.spans if s.name == "predict echo" and s.attributes.get("easkit.status") == 401
        ],
        30,
        "the refused call's span",
    )
    assert refused[0].attributes["easkit.error"] == "Unauthorized"

    # A pipeline: its step is a span under the pipeline's hop, the service it calls under the step.
    gw.wait_workers_ready("digits", 1)
    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    v2 = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    req = urllib.request.Request(
        gw.url + "/v2/models/pipe/infer", data=json.dumps(v2).encode(), method="POST",
        headers={"Content-Type": "application/json", "traceparent": f"00-{other}-{PARENT_ID}-01"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200

    def pipeline() -> dict[str, Span] | None:
        got = {s.name: s for s in spans.spans if s.trace_id == other}
        names = {"tensors pipe", "worker pipe", "step classify", "call digits", "worker digits", "model run"}
        return got if names <= set(got) else None

    got = wait_until(pipeline, 30, "the pipeline's spans")
    assert got["worker pipe"].parent_id == got["tensors pipe"].span_id
    assert got["step classify"].parent_id == got["worker pipe"].span_id
    assert got["call digits"].parent_id == got["step classify"].span_id
    assert got["worker digits"].parent_id == got["call digits"].span_id
    assert got["model run"].parent_id == got["worker digits"].span_id
