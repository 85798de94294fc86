"""Logging set-up for the gateway process (libraries never configure logging; the CLI does).

Two formats: ``text`` (one line per record, control characters escaped so a
client-chosen value can never forge a log line) and ``json`` (one object per
line). The access log records method, path, status, size, duration and the
request id; it never records headers, so ``Authorization`` cannot leak.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import re
import sys
import threading
import time
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from eas_sdk._core.constants import HEADER_REQUEST_ID
from gateway.core.traffic import VERSION_HEADER

ACCESS_LOGGER = "gateway.access"
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f\\]")
# Extra attributes a record may carry (logger.info(..., extra={...})) that the JSON format emits.
_EXTRA_FIELDS = (
    "request_id", "service", "worker", "method", "path", "status", "bytes", "duration_ms", "remote",
)  # fmt: skip


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
    def __init__(self, tag: str = "") -> None:
        """``tag``: written before the logger's name on every line (a worker's ``worker[svc/0]``)."""
        super().__init__()
        self._prefix = f"{escape(tag)} " if tag else ""

    def format(self, record: logging.LogRecord) -> str:
        message = escape(record.getMessage())
        line = f"{_timestamp(record)} {record.levelname:<7} {self._prefix}{record.name}: {message}"
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


ACCESS_FLUSH_S = 0.1
ACCESS_BUFFER_BYTES = 64 * 1024


class BufferedAccessHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that batches access lines: one write and flush per 64 KiB or
    ``ACCESS_FLUSH_S`` instead of one per request (measured: the per-line write and flush
    cost the gateway about 40 µs per request, a third of its throughput). Any other record
    first flushes the batch, then is written at once, so the order of lines is kept and
    warnings and errors are never delayed. At most ``ACCESS_FLUSH_S`` of access lines are
    lost if the process is killed."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._size = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="access-log-flush", daemon=True)
        self._thread.start()

    @property
    def json(self) -> bool:
        return isinstance(self.formatter, JsonFormatter)

    def add_access_line(self, line: str) -> None:
        """A formatted access line (log_access's direct path), batched like ``emit``'s."""
        with self.lock if self.lock is not None else contextlib.nullcontext():
            self._pending.append(line + self.terminator)
            self._size += len(line) + 1
            if self._size >= ACCESS_BUFFER_BYTES:
                self._write_pending()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        # Called with the handler's lock held (Handler.handle).
        if record.name == ACCESS_LOGGER and record.levelno < logging.WARNING:
            self._pending.append(line)
            self._size += len(line)
            if self._size >= ACCESS_BUFFER_BYTES:
                self._write_pending()
            return
        self._write_pending(line)

    def _write_pending(self, extra: str = "") -> None:
        text = "".join(self._pending) + extra
        self._pending, self._size = [], 0
        if text:
            with contextlib.suppress(Exception):  # a closed or broken stream: nowhere to report
                self.stream.write(text)
                self.stream.flush()

    def flush(self) -> None:
        with self.lock if self.lock is not None else contextlib.nullcontext():
            self._write_pending()

    def _flusher(self) -> None:
        while not self._stop.wait(ACCESS_FLUSH_S):
            if self._pending:
                self.flush()

    def close(self) -> None:
        self._stop.set()
        self.flush()
        super().close()


def setup_logging(level: str = "INFO", fmt: str = "text", stream: Any = None) -> None:
    """Configure the root logger of the gateway process (called by the CLI only)."""
    handler = BufferedAccessHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's own access logger is replaced by ours (GatewayAccessLogger).
    logging.getLogger("aiohttp.access").propagate = False


_ACCESS_FORMAT = "%s %s %s %d %dB %.1fms rid=%s"
_ts_cache: list[Any] = [-1, ""]


def _fast_timestamp(now: float) -> str:
    """``_timestamp`` for the current time, the date and seconds formatted once a second."""
    sec = int(now)
    if _ts_cache[0] != sec:
        full = _dt.datetime.fromtimestamp(sec, tz=_dt.timezone.utc).isoformat(timespec="seconds")
        _ts_cache[0], _ts_cache[1] = sec, (full[:-6], full[-6:])  # ("...T12:00:00", "+00:00")
    head, tz = _ts_cache[1]
    return f"{head}.{int((now - sec) * 1000):03d}{tz}"


def log_access(
    logger: logging.Logger,
    remote: str,
    method: str,
    path: str,
    status: int,
    size: int,
    ms: float,
    rid: str,
    version: str | None = None,
) -> None:
    """One access line, as ``logger.info(...)`` with the access fields would write it.

    When the gateway's own handler (BufferedAccessHandler, set up by the CLI) is the only
    one that sees the line, the line is formatted here and handed to it directly: the same
    text, without a LogRecord and the logging call chain, which cost the gateway about a
    third of its throughput at full load. Anything else (other handlers, filters: tests,
    embedding applications) goes through ``logger.info``. ``version``: the model version that
    answered (a service with versions), last on the line.
    """
    handler = _direct_handler(logger)
    if handler is None:
        fmt = _ACCESS_FORMAT if version is None else _ACCESS_FORMAT + " version=%s"
        args = (remote, method, path, status, size, ms, rid) if version is None else (
            remote, method, path, status, size, ms, rid, version
        )  # fmt: skip
        extra = {
            "request_id": rid, "method": method, "path": path, "status": status,
            "bytes": size, "duration_ms": round(ms, 3), "remote": remote,
        }  # fmt: skip
        if version is not None:
            extra["version"] = version
        logger.info(fmt, *args, extra=extra)
        return
    msg = _ACCESS_FORMAT % (remote, method, path, status, size, ms, rid)
    if version is not None:
        msg += f" version={version}"
    ts = _fast_timestamp(time.time())
    if handler.json:
        fields = {
            "ts": ts, "level": "INFO", "logger": logger.name, "msg": msg, "request_id": rid,
            "method": method, "path": path, "status": status, "bytes": size,
            "duration_ms": round(ms, 3), "remote": remote,
        }  # fmt: skip
        if version is not None:
            fields["version"] = version
        line = json.dumps(fields, ensure_ascii=True, default=str)
    else:
        line = f"{ts} INFO    {logger.name}: {escape(msg)}"
    handler.add_access_line(line)


def _direct_handler(logger: logging.Logger) -> BufferedAccessHandler | None:
    if logger.handlers or logger.filters or not logger.propagate or not logger.isEnabledFor(logging.INFO):
        return None
    root = logger.root
    parent = logger.parent
    while parent is not None and parent is not root:
        if parent.handlers or parent.filters or not parent.propagate:
            return None
        parent = parent.parent
    if len(root.handlers) != 1 or root.filters:
        return None
    handler = root.handlers[0]
    if type(handler) is not BufferedAccessHandler or handler.filters or handler.level > logging.INFO:
        return None
    return handler


class GatewayAccessLogger(AbstractAccessLogger):
    """One line per request: no headers, path without query (the formatter escapes values)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        rid = response.headers.get(HEADER_REQUEST_ID, "-")
        log_access(
            self.logger, request.remote or "-", request.method, request.rel_url.raw_path,
            response.status, response.body_length, time * 1000.0, rid, response.headers.get(VERSION_HEADER),
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
