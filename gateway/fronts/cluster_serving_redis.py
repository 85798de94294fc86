"""Cluster Serving's Redis stream as an entry point, so bigdl-serving clients run unchanged.

A service with ``cluster_serving: {redis: redis://host:port/db, stream: serving_stream}``
reads the stream that ``InputQueue(host, port, name=stream).enqueue(uri, ...)`` appends
to, serves each record through the dataplane (the service's worker pool, like a
synchronous Cluster Serving REST call), and writes the result where
``OutputQueue(...).query(uri)`` / ``dequeue()`` read it. The data layout is in
``gateway/codecs/cluster_serving_arrow.py``.

Delivery uses the stream's consumer group (``serving``, as Cluster Serving's own job):
every gateway reads with ``XREADGROUP`` under a consumer name of its own, so several
gateways share the stream; a result is written, and its record acknowledged (``XACK``)
and removed from the stream (``XDEL``), in one transaction. Records a gateway read but
never answered (it died) stay pending in the group and are taken over by another with
``XAUTOCLAIM`` once idle for ``claim_idle_s``. A record the service cannot take now
(no ready worker, overloaded) stays pending and is retried; one it cannot serve at all
(bad data, a processor error) gets the result ``NaN``, which the client returns as is.
Records read together whose inputs agree are inferred as one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError, ResponseError

from gateway.codecs.cluster_serving import ClusterServingRequestError, batch_instances, split_outputs
from gateway.codecs.cluster_serving_arrow import (
    FAILED,
    decode_record,
    encode_result,
    result_key,
    top_n_result,
)
from gateway.config import ClusterServingConfig, ServiceConfig
from gateway.core import errors, json_answer
from gateway.core.dataplane import DataPlane
from gateway.fronts.state import GATEWAY_KEY

log = logging.getLogger(__name__)

BLOCK_MS = 1000  # one XREADGROUP waits this long for new records
RETRY_S = 0.5  # after the service could not take records (they stay pending)
ERROR_PAUSE_S = 1.0  # after Redis failed
# Refusals that say "not now": the records stay pending and are retried.
_RETRY_STATUSES = frozenset((429, 450, 503))


def _signature(inst: dict[str, tuple[str, Any]]) -> tuple[Any, ...]:
    """Records with equal signatures can be stacked into one batch."""
    out = []
    for name in sorted(inst):
        kind, value = inst[name]
        if kind == "sparse":
            out.append((name, kind, tuple(value[2].tolist())))
        else:
            out.append((name, kind, value.shape, value.dtype.kind))
    return tuple(out)


class StreamReader:
    """Serves one service's Cluster Serving stream until stopped."""

    def __init__(self, svc: ServiceConfig, cfg: ClusterServingConfig, plane: DataPlane) -> None:
        self.svc = svc
        self.cfg = cfg
        self.plane = plane
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.client: aioredis.Redis = aioredis.Redis.from_url(cfg.redis, socket_connect_timeout=5.0)
        self._task: asyncio.Task[None] | None = None
        self._own_pending = True  # first read what this consumer left pending
        self._claim_from = "0-0"
        self.served_total = 0
        self.failed_total = 0
        self.claimed_total = 0

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.client.aclose()

    async def _ensure_group(self) -> None:
        try:
            # From the stream's start: records enqueued before the first gateway came are served.
            await self.client.xgroup_create(self.cfg.stream, self.cfg.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _run(self) -> None:
        ready = False
        while True:
            try:
                if not ready:
                    await self._ensure_group()
                    ready = True
                entries = await self._next()
                if entries and not await self._serve(entries):
                    self._own_pending = True
                    await asyncio.sleep(RETRY_S)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("cluster serving stream %s: %s; retrying", self.cfg.stream, exc)
                ready = False
                await asyncio.sleep(ERROR_PAUSE_S)

    async def _next(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        c, cfg = self.client, self.cfg
        if self._own_pending:
            resp = await c.xreadgroup(cfg.group, self.consumer, {cfg.stream: "0"}, count=cfg.max_batch)
            entries = [e for e in (resp[0][1] if resp else []) if e[1]]
            if entries:
                return entries
            self._own_pending = False
        claimed = await c.xautoclaim(
            cfg.stream,
            cfg.group,
            self.consumer,
            int(cfg.claim_idle_s * 1000),
            self._claim_from,
            count=cfg.max_batch,
        )
        self._claim_from = claimed[0].decode() if isinstance(claimed[0], bytes) else str(claimed[0])
        entries = [e for e in claimed[1] if e[1]]
        if entries:
            self.claimed_total += len(entries)
            log.info("cluster serving stream %s: took over %d record(s)", cfg.stream, len(entries))
            return entries
        resp = await c.xreadgroup(
            cfg.group, self.consumer, {cfg.stream: ">"}, count=cfg.max_batch, block=BLOCK_MS
        )
        return list(resp[0][1]) if resp else []

    async def _serve(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> bool:
        """Serve what can be served now; False when some records must wait (still pending)."""
        done: list[tuple[bytes, str | None, str]] = []  # (entry id, uri, result value)
        groups: dict[tuple[Any, ...], list[tuple[bytes, str, dict[str, tuple[str, Any]]]]] = {}
        for entry_id, fields in entries:
            try:
                uri, inst = decode_record(fields)
            except ClusterServingRequestError as exc:
                log.warning("cluster serving stream %s: refused a record: %s", self.cfg.stream, exc)
                raw = fields.get(b"uri")
                done.append((entry_id, raw.decode("utf-8", "replace") if raw else None, FAILED))
                continue
            groups.setdefault(_signature(inst), []).append((entry_id, uri, inst))
        waiting = False
        for items in groups.values():
            results = await self._infer(items)
            if results is None:
                waiting = True
                continue
            done.extend(results)
        if done:
            await self._answer(done)
        return not waiting

    async def _infer(
        self, items: list[tuple[bytes, str, dict[str, tuple[str, Any]]]]
    ) -> list[tuple[bytes, str | None, str]] | None:
        """One batched call for records whose inputs agree; None: not now (retry later)."""
        try:
            batch = batch_instances([inst for _, _, inst in items])
            # Arrays read over the reply's bytes: no Python object per element.
            outputs = await self.plane.record_arrays_call(
                self.svc, batch.body, request_id=f"cs-{items[0][1]}"[:128]
            )
        except ClusterServingRequestError as exc:
            log.warning("cluster serving stream %s: %s", self.cfg.stream, exc)
            return [(eid, uri, FAILED) for eid, uri, _ in items]
        except errors.GatewayError as exc:
            if exc.status in _RETRY_STATUSES:
                return None
            log.warning("cluster serving stream %s: %d %s", self.cfg.stream, exc.status, exc.message)
            return [(eid, uri, FAILED) for eid, uri, _ in items]
        out: list[tuple[bytes, str | None, str]] = []
        limit = self.plane.max_response_bytes
        for (eid, uri, _), mine in zip(items, split_outputs(outputs, len(items)), strict=True):
            try:
                # A result's size follows the client's shapes: refused before it is encoded.
                json_answer.check(sum(map(json_answer.raw_size, mine.values())), limit)
                if self.cfg.top_n:
                    mine = top_n_result(mine, self.cfg.top_n, self.cfg.top_n_output)
                out.append((eid, uri, encode_result(mine)))
            except ValueError as exc:
                log.warning("cluster serving stream %s: %s: %s", self.cfg.stream, uri, exc)
                out.append((eid, uri, FAILED))
        return out

    async def _answer(self, done: list[tuple[bytes, str | None, str]]) -> None:
        """Results, acknowledgements and removals in one transaction: a record is answered
        and gone, or still pending (and served again)."""
        cfg = self.cfg
        pipe = self.client.pipeline(transaction=True)
        for _eid, uri, value in done:
            if uri is not None:
                pipe.hset(result_key(cfg.stream, uri), "value", value)
        ids = [eid for eid, _, _ in done]
        pipe.xack(cfg.stream, cfg.group, *ids)
        pipe.xdel(cfg.stream, *ids)
        await pipe.execute()
        failed = sum(1 for _, _, v in done if v == FAILED)
        self.failed_total += failed
        self.served_total += len(done) - failed

    def snapshot(self) -> dict[str, Any]:
        return {
            "stream": self.cfg.stream,
            "consumer": self.consumer,
            "served_total": self.served_total,
            "failed_total": self.failed_total,
            "claimed_total": self.claimed_total,
        }


READERS_KEY = web.AppKey("cluster_serving_readers", dict)  # service name -> StreamReader


def setup(app: web.Application) -> None:
    """Read every configured service's stream while the app runs (after the pools start)."""
    app[READERS_KEY] = {}

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        parts = app[GATEWAY_KEY]
        readers: dict[str, StreamReader] = app[READERS_KEY]
        for svc in parts.config.services:
            if svc.cluster_serving is None or svc.name not in parts.backends:
                continue
            reader = StreamReader(svc, svc.cluster_serving, parts.dataplane)
            await reader.start()
            readers[svc.name] = reader
        yield
        await asyncio.gather(*(r.stop() for r in readers.values()), return_exceptions=True)
        readers.clear()

    app.cleanup_ctx.append(ctx)


__all__ = ["READERS_KEY", "StreamReader", "setup"]
