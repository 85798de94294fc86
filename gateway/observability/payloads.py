"""The payload log: a sample of each service's calls, request and answer, as CloudEvents.

A service with ``payload_log:`` (gateway.config.payload_log) has that share of its calls
recorded by the dataplane's one hook (``PayloadObserver``, told by every entry call, so
every front is covered). Per recorded call two CloudEvents 1.0 (structured JSON) are
written to the service's sink, sharing the call's request id::

    {"specversion": "1.0", "type": "io.easkit.inference.request", "id": "<request id>",
     "source": "/easkit/gateway/services/<service>", "time": "...", "subject": "<service>",
     "datacontenttype": "application/json", "service": "<service>", "modelversion": "2",
     "requestid": "<request id>",
     "data": {"headers": {...}, "content_type": "...", "size": 123, "truncated": false,
              "body": <JSON, or text>  |  "body_base64": "..."  |  "inputs": [...]}}

and ``io.easkit.inference.response`` with ``status`` and the answer's body (or ``outputs``,
the arrays a V2, V1, Paddle or Cluster Serving call answered, or ``error``). Bodies are cut
to ``max_body_bytes``; headers that carry credentials are never written.

The call only pays for the sampling draw and a copy of at most ``max_body_bytes`` of each
body: the events are held in one bounded buffer (``gateway.payload_log_buffer`` events,
all sinks together) and encoded and written by a task per sink, the encoding in a thread.
A full buffer, a sink that fails or refuses: the events are dropped and counted
(``easgw_payload_log_dropped_total{sink}``), never retried at the call's expense.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import random
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import numpy as np
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import ServiceConfig
from gateway.config.payload_log import PayloadLogConfig
from gateway.core import errors
from gateway.core.calls import WorkerResponse
from gateway.observability.metrics import version_of

log = logging.getLogger("gateway.payload_log")

REQUEST_TYPE = "io.easkit.inference.request"
RESPONSE_TYPE = "io.easkit.inference.response"
CONTENT_TYPE = "application/cloudevents+json"
# Header names that carry credentials, in any service's convention: never written.
_SECRET = re.compile(
    r"authorization|cookie|token|secret|password|api-?key|signature|credential|session", re.I
)
HTTP_TIMEOUT_S = 5.0
# At most one warning a minute per sink about events it dropped.
_WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class _Body:
    """At most ``max_body_bytes`` of a body, or the head of each array."""

    data: bytes | None
    size: int
    truncated: bool
    content_type: str | None = None
    arrays: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class _Call:
    """What one recorded call keeps until its sink writes it."""

    at: float
    service: str
    version: str
    request_id: str
    headers: tuple[tuple[str, str], ...]
    request: _Body | None
    status: int
    answer: _Body | None
    error: tuple[str, str] | None  # (code, message)


def _bytes_body(body: bytes | bytearray | memoryview, limit: int, content_type: str | None) -> _Body:
    size = len(body)
    return _Body(bytes(body[:limit]), size, size > limit, content_type)


def _arrays_body(arrays: Mapping[str, np.ndarray], limit: int) -> _Body:
    """Each array's name, shape and type, and as many of its first values as ``limit``
    bytes hold (8 bytes a value)."""
    room = max(0, limit // 8)
    out = []
    size = 0
    truncated = False
    for name, value in arrays.items():
        a = np.asarray(value)
        size += a.nbytes
        flat = a.reshape(-1)
        take = flat[:room]
        truncated = truncated or take.size < flat.size
        room -= take.size
        data = take.tolist() if a.dtype.kind != "V" else []
        if a.dtype.kind in "SaO":
            data = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in data]
        out.append({"name": str(name), "shape": list(a.shape), "datatype": str(a.dtype), "data": data})
    return _Body(None, size, truncated, None, tuple(out))


def _clean_headers(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in headers.items() if not _SECRET.search(str(k)))


def sink_label(cfg: PayloadLogConfig) -> str:
    """The sink as ``/metrics`` and the logs name it: never a query string."""
    if cfg.kind == "http":
        parts = urllib.parse.urlsplit(cfg.sink)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return f"{cfg.kind}:{cfg.target}"


# ---------------------------------------------------------------------- encoding (a thread)
def _iso(at: float) -> str:
    return (
        datetime.datetime.fromtimestamp(at, datetime.UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


def _body_fields(body: _Body) -> dict[str, Any]:
    out: dict[str, Any] = {"size": body.size, "truncated": body.truncated}
    if body.content_type:
        out["content_type"] = body.content_type
    if body.arrays is not None:
        out["tensors"] = list(body.arrays)
        return out
    data = body.data or b""
    ctype = (body.content_type or "").lower()
    if not body.truncated and "json" in ctype:
        try:
            out["body"] = orjson.loads(data)
            return out
        except orjson.JSONDecodeError:
            pass
    if ctype.startswith("text/") or "json" in ctype:
        try:
            out["body"] = data.decode("utf-8")
            return out
        except UnicodeDecodeError:
            pass
    out["body_base64"] = base64.b64encode(data).decode("ascii")
    return out


def events(call: _Call) -> list[dict[str, Any]]:
    """The call's two CloudEvents (see the module doc)."""
    common = {
        "specversion": "1.0",
        "id": call.request_id,
        "source": f"/easkit/gateway/services/{call.service}",
        "time": _iso(call.at),
        "subject": call.service,
        "datacontenttype": "application/json",
        "service": call.service,
        "modelversion": call.version,
        "requestid": call.request_id,
    }
    request: dict[str, Any] = {"headers": dict(call.headers)}
    if call.request is not None:
        request.update(_body_fields(call.request))
    response: dict[str, Any] = {"status": call.status}
    if call.answer is not None:
        response.update(_body_fields(call.answer))
    if call.error is not None:
        response["error"] = {"code": call.error[0], "message": call.error[1]}
    return [
        {**common, "type": REQUEST_TYPE, "data": request},
        {**common, "type": RESPONSE_TYPE, "status": call.status, "data": response},
    ]


def encode(calls: Iterable[_Call]) -> list[bytes]:
    """One JSON document per event."""
    return [orjson.dumps(event) for call in calls for event in events(call)]


# ---------------------------------------------------------------------- sinks
@dataclass(eq=False)
class _Sink:
    cfg: PayloadLogConfig
    label: str
    pending: deque[_Call] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    file: BinaryIO | None = None
    warned_at: float = 0.0


class PayloadLog:
    """The gateway's payload log (see the module doc); implements the dataplane's
    ``PayloadObserver``. ``queues``: the queues served here now, by name, for queue sinks."""

    def __init__(
        self,
        registry: CollectorRegistry,
        buffer: int,
        queues: Callable[[], Mapping[str, Any] | None],
        *,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.capacity = buffer
        self.queues = queues
        self.draw = draw
        self.held = 0  # events waiting for their sinks
        self.sinks: dict[str, _Sink] = {}
        self.written: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None  # made for the first HTTP sink
        self.closed = False
        registry.register(_PayloadCollector(self))

    # ------------------------------------------------------------------ the call's side
    def payload(
        self,
        svc: ServiceConfig,
        request_id: str,
        headers: Mapping[str, str],
        request: bytes | Mapping[str, np.ndarray] | None,
        answer: WorkerResponse | Mapping[str, np.ndarray] | None,
        error: errors.GatewayError | None,
    ) -> None:
        cfg = svc.payload_log
        if cfg is None or self.closed:
            return
        if cfg.sample_rate < 1.0 and self.draw() >= cfg.sample_rate:
            return
        sink = self.sinks.get(cfg.sink)
        if sink is None:
            sink = self.sinks[cfg.sink] = _Sink(cfg, sink_label(cfg))
            self.written.setdefault(sink.label, 0)
            self.dropped.setdefault(sink.label, 0)
        if self.held + 2 > self.capacity:
            self.dropped[sink.label] += 2
            return
        limit = cfg.max_body_bytes
        service, version = version_of(svc)
        ctype = next((v for k, v in headers.items() if str(k).lower() == "content-type"), None)
        req: _Body | None = None
        if isinstance(request, (bytes, bytearray, memoryview)):
            req = _bytes_body(request, limit, ctype)
        elif request is not None:
            req = _arrays_body(request, limit)
        ans: _Body | None = None
        status = 200
        if isinstance(answer, WorkerResponse):
            status = int(answer.status)
            ans = _bytes_body(answer.body, limit, answer.content_type)
        elif answer is not None:
            ans = _arrays_body(answer, limit)
        if error is not None:
            status = error.status
        call = _Call(
            time.time(),
            service,
            version,
            request_id,
            _clean_headers(headers),
            req,
            status,
            ans,
            None if error is None else (error.code, error.message),
        )
        sink.pending.append(call)
        self.held += 2
        if sink.task is None:
            sink.task = asyncio.get_running_loop().create_task(
                self._drain(sink), name=f"payload-log {sink.label}"
            )
        sink.wake.set()

    # ------------------------------------------------------------------ the writers
    async def _drain(self, sink: _Sink) -> None:
        while True:
            if not sink.pending:
                if self.closed:
                    return  # all written: aclose waits for this
                await sink.wake.wait()
                sink.wake.clear()
                continue
            batch = list(sink.pending)
            sink.pending.clear()
            n = 2 * len(batch)
            try:
                failed = await self._write(sink, batch)
            except asyncio.CancelledError:
                self.dropped[sink.label] += n
                raise
            except Exception as exc:
                failed = n
                self._warn(sink, exc)
            finally:
                self.held -= n
            self.written[sink.label] += n - failed
            self.dropped[sink.label] += failed

    async def _write(self, sink: _Sink, batch: list[_Call]) -> int:
        """Write a batch's events; -> how many of them the sink did not take."""
        kind = sink.cfg.kind
        if kind == "file":
            await asyncio.to_thread(self._append, sink, batch)
            return 0
        lines = await asyncio.to_thread(encode, batch)
        if kind == "http":
            return await self._post(sink, lines)
        return await self._put(sink, lines)

    def _append(self, sink: _Sink, batch: list[_Call]) -> None:
        data = b"".join(line + b"\n" for line in encode(batch))
        if sink.file is None:
            path = Path(sink.cfg.target)
            path.parent.mkdir(parents=True, exist_ok=True)
            sink.file = path.open("ab")
        sink.file.write(data)
        sink.file.flush()

    async def _post(self, sink: _Sink, lines: list[bytes]) -> int:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        failed = 0
        for line in lines:
            try:
                async with self._session.post(
                    sink.cfg.target, data=line, headers={"Content-Type": CONTENT_TYPE}
                ) as resp:
                    await resp.read()
                    if resp.status >= 300:
                        raise OSError(f"the sink answered {resp.status}")
            except (OSError, aiohttp.ClientError, TimeoutError) as exc:
                failed += 1
                self._warn(sink, exc)
        return failed

    async def _put(self, sink: _Sink, lines: list[bytes]) -> int:
        queue = (self.queues() or {}).get(sink.cfg.target)
        if queue is None:
            raise OSError(f"the queue {sink.cfg.target!r} is not served by this gateway")
        failed = 0
        for line in lines:
            try:
                _, _, durable = queue.put(line, {"content-type": CONTENT_TYPE}, None)
                if durable is not None:
                    await durable
            except Exception as exc:  # full, too large, the store failing: the event is dropped
                failed += 1
                self._warn(sink, exc)
        return failed

    def _warn(self, sink: _Sink, exc: BaseException) -> None:
        now = time.monotonic()
        if now - sink.warned_at >= _WARN_EVERY_S:
            sink.warned_at = now
            log.warning("payload log %s: events dropped (%s)", sink.label, exc)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Write what is held (for at most ``timeout`` seconds), then stop the writers."""
        self.closed = True
        tasks = [sink.task for sink in self.sinks.values() if sink.task is not None]
        for sink in self.sinks.values():
            sink.wake.set()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for sink in self.sinks.values():
            if sink.file is not None:
                sink.file.close()
        if self._session is not None:
            await self._session.close()


class _PayloadCollector(Collector):
    def __init__(self, plog: PayloadLog) -> None:
        self.plog = plog

    def collect(self) -> Iterable[Metric]:
        written = CounterMetricFamily(
            "easgw_payload_log_events", "Payload log events written to their sink", labels=["sink"]
        )
        dropped = CounterMetricFamily(
            "easgw_payload_log_dropped",
            "Payload log events dropped: the buffer was full, or the sink failed or refused them",
            labels=["sink"],
        )
        for label in sorted(self.plog.written):
            written.add_metric([label], float(self.plog.written[label]))
            dropped.add_metric([label], float(self.plog.dropped[label]))
        yield written
        yield dropped
        yield GaugeMetricFamily(
            "easgw_payload_log_buffered", "Payload log events waiting for their sink", value=self.plog.held
        )


__all__ = ["CONTENT_TYPE", "REQUEST_TYPE", "RESPONSE_TYPE", "PayloadLog", "encode", "events", "sink_label"]
