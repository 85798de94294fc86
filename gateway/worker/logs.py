"""Logging inside a worker process: the gateway's format, every line tagged.

A worker writes its log to the stderr it shares with the gateway, in the gateway's
format (``text`` or ``json``), and every line carries the service, the worker's
index and, while a request runs, its request id. What a processor prints is
captured into that log too, never onto the gateway's stdout (which carries only the
start-up announcement scripts wait for):

* ``print(...)`` (``sys.stdout``) becomes INFO lines of the ``gateway.processor``
  logger, ``sys.stderr`` writes WARNING lines, one per line of text;
* file descriptor 1 becomes a pipe read by a thread that logs each line the same way,
  so native code writing to stdout is captured too (descriptor 2 stays the real
  stderr, so that a crash report always gets out).
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from contextvars import ContextVar

from gateway.core.logs import JsonFormatter, TextFormatter

PROCESSOR_LOGGER = "gateway.processor"
# The request the current thread (or event loop task) is running, for its log lines.
REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="")


class _WorkerFields(logging.Filter):
    """Adds ``service``, ``worker`` and the running request's id to every record."""

    def __init__(self, service: str, index: int) -> None:
        super().__init__()
        self.service = service
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.worker = self.index
        if not getattr(record, "request_id", None):
            rid = REQUEST_ID.get()
            if rid:
                record.request_id = rid
        return True


class LogStream(io.TextIOBase):
    """A text stream whose every complete line becomes one log record (``print`` target)."""

    def __init__(self, logger: logging.Logger, level: int) -> None:
        super().__init__()
        self._logger = logger
        self._level = level
        self._lock = threading.Lock()
        self._partial: dict[int, str] = {}  # per thread: a line may be printed in pieces
        self._busy = threading.local()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if getattr(self._busy, "on", False):
            # Logging itself failed and reported to sys.stderr (this stream): drop it
            # rather than loop.
            return len(text)
        tid = threading.get_ident()
        with self._lock:
            pending = self._partial.pop(tid, "") + text
            *lines, rest = pending.split("\n")
            if rest:
                self._partial[tid] = rest
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest = self._partial.pop(threading.get_ident(), "")
        if rest:
            self._emit(rest)

    def _emit(self, line: str) -> None:
        self._busy.on = True
        try:
            self._logger.log(self._level, "%s", line.rstrip("\r"))
        finally:
            self._busy.on = False


def setup_worker_logging(service: str, index: int, level: str, fmt: str) -> None:
    """Configure a worker's logging and capture its processor's output (see the module doc)."""
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    sys.stdout.flush()
    handler = logging.StreamHandler(stream)
    tag = f"worker[{service}/{index}]"
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(tag=tag))
    handler.addFilter(_WorkerFields(service, index))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    processor_log = logging.getLogger(PROCESSOR_LOGGER)
    sys.stdout = LogStream(processor_log, logging.INFO)
    sys.stderr = LogStream(processor_log, logging.WARNING)
    _capture_fd1(processor_log)


def _capture_fd1(logger: logging.Logger) -> None:
    """Point descriptor 1 at a pipe whose lines a daemon thread logs (native stdout writes)."""
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.close(write_fd)
    os.set_inheritable(read_fd, False)

    def pump() -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                logger.info("%s", line.decode("utf-8", "replace").rstrip("\r"))

    threading.Thread(target=pump, name="stdout-capture", daemon=True).start()


__all__ = ["PROCESSOR_LOGGER", "REQUEST_ID", "LogStream", "setup_worker_logging"]
