"""A worker's log: the gateway's format (JSON lines when JSON logging is on), every line
tagged with service and worker (and the request id while one runs), and everything a
processor writes captured into it; the gateway's stdout carries only its announcement."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.core.logs import TextFormatter
from gateway.worker.logs import LogStream
from tests.e2e.gateway_proc import gateway_factory

__all__ = ["gateway_factory"]

ROOT = Path(__file__).resolve().parents[3]
PRINTING = f"{ROOT / 'tests' / 'processors' / 'printing.py'}:Printing"
CONFIG = {
    "gateway": {"shutdown_timeout_s": 5},
    "services": [{"name": "p", "processor": "python", "entry": PRINTING, "workers": 1}],
}


def _call(url: str) -> bytes:
    req = urllib.request.Request(
        url + "/api/predict/p", data=b"abc", method="POST", headers={"X-Request-Id": "rid-123"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


def _wait_for(path: Path, text: str) -> str:
    """The file once it holds ``text`` (the native write goes through a pipe and a thread)."""
    deadline = time.monotonic() + 10
    while True:
        content = path.read_text()
        if text in content or time.monotonic() > deadline:
            return content
        time.sleep(0.05)


def test_json_worker_logs_capture_what_a_processor_writes(gateway_factory: Any) -> None:
    gw = gateway_factory(CONFIG, extra_args=("--log-format", "json"))
    assert _call(gw.url) == b"ok"
    _wait_for(gw.workdir / "stderr.log", "native abc")
    assert gw.stop() == 0

    stdout = (gw.workdir / "stdout.log").read_text().splitlines()
    assert stdout == [f"gateway listening on {gw.url}"], stdout
    records = [json.loads(line) for line in (gw.workdir / "stderr.log").read_text().splitlines()]
    by_msg = {r["msg"]: r for r in records}
    expected = {
        "printed while loading": ("INFO", "gateway.processor", None),
        "printed abc in pieces and ended": ("INFO", "gateway.processor", "rid-123"),
        "to stderr abc": ("WARNING", "gateway.processor", "rid-123"),
        "logged abc": ("WARNING", "my.processor", "rid-123"),
        "native abc": ("INFO", "gateway.processor", None),  # no Python context to read it from
    }
    for msg, (level, logger, rid) in expected.items():
        rec = by_msg.get(msg)
        assert rec is not None, (msg, records)
        assert (rec["level"], rec["logger"], rec.get("request_id")) == (level, logger, rid), rec
        assert (rec["service"], rec["worker"]) == ("p", 0), rec
    worker_lines = [r for r in records if r.get("service") == "p"]
    assert all(r["worker"] == 0 for r in worker_lines)


def test_text_worker_logs_are_tagged(gateway_factory: Any) -> None:
    gw = gateway_factory(CONFIG)
    assert _call(gw.url) == b"ok"
    assert gw.stop() == 0
    stderr = (gw.workdir / "stderr.log").read_text()
    assert "worker[p/0] gateway.processor: printed abc in pieces and ended rid=rid-123" in stderr
    assert "printed" not in (gw.workdir / "stdout.log").read_text()


def test_a_log_stream_makes_one_record_per_line_per_thread() -> None:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("tests.logstream")
    logger.propagate = False
    logger.addHandler(Collect())
    stream = LogStream(logger, logging.WARNING)
    stream.write("a")
    worker = threading.Thread(target=lambda: stream.write("other\n"))
    worker.start()
    worker.join()
    stream.write("b\nc\r\nd")
    stream.flush()
    assert records == ["other", "ab", "c", "d"]


def test_text_formatter_tag_is_escaped() -> None:
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    line = TextFormatter(tag="worker[a\nb/0]").format(rec)
    assert "\n" not in line and line.endswith("INFO    worker[a\\nb/0] x: m")


@pytest.fixture(autouse=True)
def _no_leftover_handlers() -> Any:
    yield
    logging.getLogger("tests.logstream").handlers.clear()
