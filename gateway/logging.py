"""Logging set-up for the gateway process (libraries never configure logging; the CLI does).

Two formats: ``text`` (one line per record, control characters escaped so a
client-chosen value can never forge a log line) and ``json`` (one object per
line). The access log records method, path, status, size, duration and the
request id; it never records headers, so ``Authorization`` cannot leak.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import sys
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from eas_sdk._core.constants import HEADER_REQUEST_ID

ACCESS_LOGGER = "gateway.access"
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f\\]")
# Extra attributes a record may carry (logger.info(..., extra={...})) that the JSON format emits.
_EXTRA_FIELDS = ("request_id", "service", "method", "path", "status", "bytes", "duration_ms", "remote")


def escape(value: object) -> str:
    """Escape control characters and backslashes: CR/LF become the text ``\\r``/``\\n``."""
    text = str(value)

    def repl(m: re.Match[str]) -> str:
        ch = m.group(0)
        if ch == "\\":
            return "\\\\"
        if ch == "\r":
            return "\\r"
        if ch == "\n":
            return "\\n"
        if ch == "\t":
            return "\\t"
        return f"\\x{ord(ch):02x}"

    return _CTRL_RE.sub(repl, text)


def _timestamp(record: logging.LogRecord) -> str:
    return _dt.datetime.fromtimestamp(record.created, tz=_dt.timezone.utc).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {escape(record.getMessage())}"
        rid = getattr(record, "request_id", None)
        if rid and "rid=" not in line:
            line += f" rid={escape(rid)}"
        if record.exc_info:
            # The traceback is ours (never client data) and stays multi-line for readability.
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _EXTRA_FIELDS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        # ensure_ascii escapes CR/LF and every non-ASCII character.
        return json.dumps(out, ensure_ascii=True, default=str)


def setup_logging(level: str = "INFO", fmt: str = "text", stream: Any = None) -> None:
    """Configure the root logger of the gateway process (called by the CLI only)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's own access logger is replaced by ours (GatewayAccessLogger).
    logging.getLogger("aiohttp.access").propagate = False


class GatewayAccessLogger(AbstractAccessLogger):
    """One line per request: no headers, path without query (the formatter escapes values)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        rid = response.headers.get(HEADER_REQUEST_ID, "-")
        path = request.rel_url.raw_path
        remote = request.remote or "-"
        size = response.body_length
        self.logger.info(
            "%s %s %s %d %dB %.1fms rid=%s",
            remote,
            request.method,
            path,
            response.status,
            size,
            time * 1000.0,
            rid,
            extra={
                "request_id": rid,
                "method": request.method,
                "path": path,
                "status": response.status,
                "bytes": size,
                "duration_ms": round(time * 1000.0, 3),
                "remote": remote,
            },
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
