"""Log formatting: escaped control characters, JSON lines, an access log without headers."""

from __future__ import annotations

import io
import json
import logging

import aiohttp
import pytest

from gateway.core.logs import JsonFormatter, TextFormatter, escape, setup_logging
from tests.gateway.front.fakes import TOKEN, live_gateway, raw_request

pytestmark = pytest.mark.usefixtures("front")  # both listeners: see conftest.py


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("gateway.test", logging.INFO, __file__, 1, msg, args, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_escape() -> None:
    assert escape("a\r\nX-Injected: 1") == "a\\r\\nX-Injected: 1"
    assert escape("tab\there\x00\x7f\\") == "tab\\there\\x00\\x7f\\\\"
    assert escape("café") == "café"


def test_text_formatter_is_one_line() -> None:
    line = TextFormatter().format(_record("path %s", "/api/predict/x\r\nforged line", request_id="r1"))
    assert "\n" not in line and "\r" not in line
    assert line.endswith("path /api/predict/x\\r\\nforged line rid=r1")


def test_json_formatter() -> None:
    out = json.loads(JsonFormatter().format(_record("hello %s", "w\n", request_id="abc", status=200)))
    assert out["msg"] == "hello w\n"
    assert out["request_id"] == "abc"
    assert out["status"] == 200
    assert out["level"] == "INFO"


async def test_access_log_has_request_id_and_no_credentials() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    setup_logging("DEBUG", "text", stream=stream)
    try:
        async with live_gateway() as gw, aiohttp.ClientSession() as s:
            async with s.post(
                gw.url + "/api/predict/digits?token=" + TOKEN,
                data=b"x",
                headers={"Authorization": TOKEN, "X-Request-Id": "trace-1"},
            ) as r:
                assert r.status == 200
            async with s.post(
                gw.url + "/api/predict/digits", data=b"x", headers={"Authorization": "EAS bad"}
            ) as r:
                assert r.status == 401
            await raw_request(
                gw.port,
                b"POST /api/predict/x%0d%0aforged HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n",
            )
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()  # ours: writes the batched access lines
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    text = stream.getvalue()
    assert "rid=trace-1" in text
    assert " 200 " in text and " 401 " in text
    assert TOKEN not in text
    assert "EAS bad" not in text
    assert all(
        "forged" not in line or "%0d%0aforged" in line or "\\r\\nforged" in line for line in text.splitlines()
    )


def test_access_lines_are_batched_and_other_records_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import time

    import gateway.core.logs as gl

    monkeypatch.setattr(gl, "ACCESS_FLUSH_S", 0.05)
    stream = io.StringIO()
    handler = gl.BufferedAccessHandler(stream)
    handler.setFormatter(gl.TextFormatter())
    try:
        rec = lambda name, level, msg: logging.LogRecord(name, level, __file__, 1, msg, (), None)  # noqa: E731
        handler.handle(rec(gl.ACCESS_LOGGER, logging.INFO, "first access"))
        handler.handle(rec(gl.ACCESS_LOGGER, logging.INFO, "second access"))
        assert stream.getvalue() == ""  # batched
        handler.handle(rec("gateway", logging.WARNING, "a warning"))
        lines = stream.getvalue().splitlines()
        assert [line.split(": ", 1)[1] for line in lines] == ["first access", "second access", "a warning"]
        handler.handle(rec(gl.ACCESS_LOGGER, logging.INFO, "third access"))
        deadline = time.monotonic() + 5
        while "third access" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "third access" in stream.getvalue()  # the timer wrote it
        big = "x" * (gl.ACCESS_BUFFER_BYTES + 1)
        monkeypatch.setattr(gl, "ACCESS_FLUSH_S", 60)
        handler.handle(rec(gl.ACCESS_LOGGER, logging.INFO, big))
        assert big in stream.getvalue()  # over the size limit: written at once
    finally:
        handler.close()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_direct_access_lines_equal_the_logging_path(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.core.logs as gl

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    direct, slow = io.StringIO(), io.StringIO()
    now = 1_700_000_000.4567
    monkeypatch.setattr(gl.time, "time", lambda: now)
    monkeypatch.setattr(logging.time, "time", lambda: now)  # LogRecord.created
    monkeypatch.setattr(logging.time, "time_ns", lambda: int(now * 1e9))
    args = ("127.0.0.1", "POST", "/api/predict/x%0d%0aforged\n", 200, 62, 1.2345, "rid-1")
    try:
        setup_logging("INFO", fmt, stream=direct)
        assert gl._direct_handler(logging.getLogger(gl.ACCESS_LOGGER)) is not None
        gl.log_access(logging.getLogger(gl.ACCESS_LOGGER), *args)
        root.handlers[0].close()
        setup_logging("INFO", fmt, stream=slow)
        root.handlers[0].addFilter(lambda r: True)  # any filter: the logging path
        assert gl._direct_handler(logging.getLogger(gl.ACCESS_LOGGER)) is None
        gl.log_access(logging.getLogger(gl.ACCESS_LOGGER), *args)
        root.handlers[0].close()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    assert direct.getvalue() == slow.getvalue() != ""
    assert "\n" not in direct.getvalue().rstrip("\n")  # the forged line break stays escaped


async def test_idle_connection_closes_are_not_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """Thousands of idle connections must not flood the log; a half-sent head still shows."""
    caplog.set_level(logging.DEBUG, logger="gateway.lean_http")
    caplog.set_level(logging.DEBUG, logger="gateway.server")
    async with live_gateway(header_timeout_s=0.2) as gw:
        idle = await raw_request(gw.port, b"", timeout=2.0)
        partial = await raw_request(gw.port, b"POST /api/predict/digits HTTP/1.1\r\nHost", timeout=2.0)
    assert idle == b"" and partial == b""
    closes = [r for r in caplog.records if "no request head within" in r.getMessage()]
    assert [r.levelno for r in closes] == [logging.DEBUG, logging.INFO], closes
