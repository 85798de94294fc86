"""The payload log's own rules: the sampling draw, the bounded buffer and its counted drops,
what an event holds for each kind of body, and the sink's configuration."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from gateway.config import ConfigError, ServiceConfig
from gateway.config.payload_log import PayloadLogConfig, parse_payload_log
from gateway.core import errors
from gateway.core.calls import WorkerResponse
from gateway.manage.spec import parse_spec, spec_of
from gateway.observability.payloads import PayloadLog, sink_label


def _svc(sink: str, rate: float = 1.0, limit: int = 8) -> ServiceConfig:
    return ServiceConfig(
        name="m", processor="python", public=True, payload_log=PayloadLogConfig(sink, rate, limit)
    )


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_buffer_is_bounded_and_its_drops_counted(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    draws = iter([0.1, 0.9, 0.1, 0.1, 0.1, 0.1])
    plog = PayloadLog(registry, buffer=4, queues=lambda: None, draw=lambda: next(draws))
    svc = _svc(f"file://{tmp_path}/p.jsonl", rate=0.5)
    answer = WorkerResponse(200, b"out", "text/plain")
    # Six calls before the writer runs: the second is not drawn, two fit (four events), three are dropped.
    for i in range(6):
        plog.payload(svc, f"r{i}", {"Content-Type": "text/plain"}, b"in", answer, None)
    assert plog.held == 4 and plog.dropped[sink_label(svc.payload_log)] == 6
    await plog.aclose()
    assert plog.held == 0
    events = _read(tmp_path / "p.jsonl")
    assert [e["id"] for e in events] == ["r0", "r0", "r2", "r2"]
    text = registry.get_sample_value("easgw_payload_log_dropped_total", {"sink": f"file:{tmp_path}/p.jsonl"})
    assert text == 6.0
    assert (
        registry.get_sample_value("easgw_payload_log_events_total", {"sink": f"file:{tmp_path}/p.jsonl"})
        == 4.0
    )


async def test_what_an_event_holds_for_each_kind_of_body(tmp_path: Path) -> None:
    plog = PayloadLog(CollectorRegistry(), buffer=100, queues=lambda: None)
    svc = _svc(f"file://{tmp_path}/p.jsonl", limit=64)
    headers = {"Content-Type": "application/json", "Authorization": "t", "X-Auth-Token": "t", "X-Trace": "1"}
    plog.payload(
        svc,
        "json",
        headers,
        b'{"a": [1, 2]}',
        WorkerResponse(200, b"\xff\x00", "application/octet-stream"),
        None,
    )
    arrays = {"x": np.arange(20, dtype=np.float32).reshape(2, 10), "s": np.array([b"hi"], dtype=object)}
    plog.payload(svc, "arrays", {}, arrays, {"y": np.array([[1, 2]], dtype=np.int64)}, None)
    plog.payload(
        svc, "failed", {}, b"x" * 100, None, errors.UpstreamTimeout("the worker did not answer in time")
    )
    await plog.aclose()
    e = {(ev["id"], ev["type"].rsplit(".", 1)[1]): ev for ev in _read(tmp_path / "p.jsonl")}
    req = e[("json", "request")]["data"]
    assert req["body"] == {"a": [1, 2]} and req["headers"] == {
        "Content-Type": "application/json",
        "X-Trace": "1",
    }
    resp = e[("json", "response")]
    assert resp["status"] == 200 and base64.b64decode(resp["data"]["body_base64"]) == b"\xff\x00"
    tensors = e[("arrays", "request")]["data"]["tensors"]
    assert tensors[0] == {"name": "x", "shape": [2, 10], "datatype": "float32", "data": list(range(8))}
    assert e[("arrays", "request")]["data"]["truncated"] is True  # 64 bytes: 8 values
    assert tensors[1] == {"name": "s", "shape": [1], "datatype": "object", "data": []}  # no room left
    assert e[("arrays", "response")]["data"]["tensors"][0]["data"] == [[1, 2]][0]  # the answer's own bound
    failed = e[("failed", "response")]
    assert failed["status"] == 504 and failed["data"]["error"]["code"] == "UpstreamTimeout"
    assert e[("failed", "request")]["data"]["size"] == 100 and e[("failed", "request")]["data"]["truncated"]


async def test_a_sink_that_fails_drops_and_the_call_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    plog = PayloadLog(CollectorRegistry(), buffer=100, queues=lambda: {})
    bad_file = _svc(f"file://{blocker}/under/a/file.jsonl")
    no_queue = _svc("queue:gone")
    for svc in (bad_file, no_queue):
        plog.payload(svc, "r", {}, b"x", WorkerResponse(200, b"y", "text/plain"), None)
    await asyncio.sleep(0)
    await plog.aclose()
    assert plog.dropped == {sink_label(bad_file.payload_log): 2, "queue:gone": 2}
    assert plog.held == 0


def test_the_sink_is_checked_when_the_config_is_read() -> None:
    ok = parse_payload_log({"sink": "https://collector.example/events?x=1", "sample_rate": 0.25}, "p")
    assert ok is not None and ok.kind == "http" and ok.sample_rate == 0.25
    assert sink_label(ok) == "https://collector.example/events"
    assert parse_payload_log({"sink": "file:///var/log/p.jsonl"}, "p").target == "/var/log/p.jsonl"  # type: ignore[union-attr]
    for bad, message in [
        ({"sink": "s3://bucket/key"}, "expected file:///PATH"),
        ({"sink": "file://relative/p"}, "ABSOLUTE"),
        ({"sink": "http://user:pw@host/x"}, "credentials"),
        ({"sink": "queue:"}, "queue:NAME"),
        ({"sink": "file:///p", "sample_rate": 1.5}, "from 0 to 1"),
        ({"sink": "file:///p", "max_body_bytes": -1}, "max_body_bytes"),
        ({}, "required"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_payload_log(bad, "p")


def test_the_admin_api_describes_and_takes_back_a_payload_log() -> None:
    svc = _svc("queue:events", rate=0.25, limit=128)
    spec = spec_of(svc)
    assert json.loads(json.dumps(spec))["payload_log"] == {
        "sink": "queue:events",
        "sample_rate": 0.25,
        "max_body_bytes": 128,
    }
    assert (
        parse_spec(
            {**spec_of(svc, redact=False), "entry": "samples/processors/echo.py:EchoProcessor"}
        ).payload_log
        == svc.payload_log
    )
