"""Redis backend: every queue's journal in Redis Streams, written with group commit.

The queue's semantics stay in ``store.Queue`` (the same code over SQLite and Redis);
this backend makes its changes durable in Redis instead of a local file, so the data
outlives the gateway's host. Key layout, per queue ``<q>`` under a prefix (``easq``):

* ``easq:<q>:records`` - a Stream, one entry per live record; the entry id is
  ``<index>-0`` (so ``XRANGE`` reads records in index order and ``XADD`` refuses an
  index that is not above every earlier one), fields ``r`` (request id), ``t`` (tags,
  JSON) and ``d`` (data). A removal is an ``XDEL``, or one ``XTRIM MINID`` when nothing is
  kept below the removed records.
* ``easq:<q>:removed`` - a Stream of tombstones, one entry per removal (``n``: how many,
  ``p``: JSON ``[[index, request id], ...]``): one command whatever a commit removes. Once
  they hold ``PRUNE_SLACK`` records more than ``RECENT_LIMIT``, the entries wholly beyond
  the newest ``RECENT_LIMIT`` records are trimmed (``XTRIM MINID``).
* ``easq:<q>:groups`` - a Hash, gid -> JSON ``[start, tags]``.
* ``easq:<q>:acks:<gid>`` - a Set of indexes the group committed while another group
  still needs them.
* ``easq:<q>:next`` - the next index, written on a clean stop.

Everything submitted during one event-loop iteration is written as one batch, in one
round trip: with an owner lease (lease.py, always the case when the gateway serves the
queues) one ``EVALSHA`` of a Lua script that checks the lease is still this gateway's and
only then runs the batch's commands (redis_script.py); without one (a backend used
directly) one ``MULTI``/``EXEC`` transaction. Either runs atomically on the server. One
batch is in flight at a time, so handles complete in order (``records.last_durable``
relies on it) and the writes that arrive meanwhile form the next batch. A handle
completes once Redis answered the batch: what that survives depends on the server's
persistence settings (docs/queue.md, "Durability").
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from gateway.queue.backend import StorageError
from gateway.queue.durable import Write, Written
from gateway.queue.records import RECENT_LIMIT, Record
from gateway.queue.redis_script import FENCED, SOURCE, Cmd, chunks, pack

log = logging.getLogger(__name__)

PREFIX = "easq"
PAGE = 1000  # entries per XRANGE page on recovery
PRUNE_SLACK = 4096  # tombstones kept beyond RECENT_LIMIT before the oldest entries are trimmed

# A queued write: it appends its raw Redis commands to the batch and says how many it added.
_Op = Callable[[list[Cmd]], int]
# Told the results of its op's commands once Redis answered the batch.
_Done = Callable[[list[Any]], None] | None


class Fence(Protocol):
    key: str

    @property
    def prefix(self) -> str:
        """How the lease key's value starts while this gateway holds it."""
        ...


def redacted(url: str) -> str:
    """The URL without its credentials (``redis://user:password@host``), for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _seq(entry_id: bytes | str) -> int:
    """The index of a records-stream entry id ``<index>-0``."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.split("-", 1)[0])


class RedisBackend:
    name = "redis"
    shared = True
    # Payloads stay in the store's memory as well as in Redis: nothing is read back.
    reads_back = False

    def __init__(self, url: str, fsync: str = "normal", prefix: str = PREFIX) -> None:
        if fsync not in ("normal", "always"):
            raise ValueError("fsync must be 'normal' or 'always'")
        self.url = url
        self.where = redacted(url)  # what logs and errors name: never the password
        self.fsync = fsync
        self.prefix = prefix
        # Connections are opened lazily, on the loop that first uses them.
        self.client: aioredis.Redis = aioredis.Redis.from_url(url, socket_connect_timeout=5.0)
        self._fenced_write = self.client.register_script(SOURCE)  # loaded on first use
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[_Op, Write, _Done]] = []
        self._writer: asyncio.Task[None] | None = None
        self._groups: dict[str, set[str]] = {}  # queue -> gids with an acks set
        # Per queue, the tombstone entries known (entry id, records), oldest first, and their sum.
        self._stones: dict[str, deque[tuple[bytes, int]]] = {}
        self._stone_total: dict[str, int] = {}
        # The owner lease every write checks (lease.py); None: writes are not fenced.
        self.fence: Fence | None = None
        self.batches = 0
        self.ops = 0
        # Why the last write failed, until one succeeds again (/readyz reports it).
        self.failure: str | None = None
        self.errors = 0

    # ------------------------------------------------------------------ keys
    def key(self, queue: str, part: str) -> str:
        return f"{self.prefix}:{queue}:{part}"

    def lease_client(self, ttl_s: float) -> aioredis.Redis:
        """A connection pool of its own for the owner lease: renewals never wait behind a batch."""
        return aioredis.Redis.from_url(self.url, socket_connect_timeout=2.0, socket_timeout=ttl_s)

    def key_prefix_key(self, part: str) -> str:
        """A key of the whole store (not of one queue), e.g. the owner lease."""
        return f"{self.prefix}:{part}"

    # ------------------------------------------------------------------ lifecycle
    def recover(self) -> dict[str, dict[str, Any]]:
        raise RuntimeError("RedisBackend recovers with 'await recover_async(queues)'")

    async def check_persistence(self) -> None:
        """Refuse ``fsync: always`` on a server that does not fsync every write, and warn
        when the server keeps nothing across its own restart (see docs/queue.md)."""
        try:
            conf = await self.client.config_get("append*")
        except RedisError as exc:  # managed services often disable CONFIG
            log.warning("queue backend %s: cannot read its persistence settings (%s)", self.where, exc)
            return
        aof = conf.get("appendonly", "no")
        every = conf.get("appendfsync", "everysec")
        if self.fsync == "always" and (aof != "yes" or every != "always"):
            raise StorageError(
                f"queue fsync 'always' needs the Redis server at {self.where} to run with "
                f"'appendonly yes' and 'appendfsync always' (it has appendonly {aof}, appendfsync {every})"
            )
        if aof != "yes":
            log.warning(
                "queue backend %s runs without 'appendonly yes': acknowledged records do not "
                "survive a restart of the Redis server",
                self.where,
            )

    async def recover_async(self, queues: list[str]) -> dict[str, dict[str, Any]]:
        """The state of each named queue, in the shape of ``Backend.recover``."""
        out: dict[str, dict[str, Any]] = {}
        try:
            for queue in queues:
                state = await self._recover_queue(queue)
                if state is not None:
                    out[queue] = state
        except RedisError as exc:
            raise StorageError(f"cannot read the queues from {self.where}: {exc}") from exc
        return out

    async def _recover_queue(self, queue: str) -> dict[str, Any] | None:
        c = self.client
        state: dict[str, Any] = {"next_idx": 1, "records": [], "groups": [], "acks": [], "removed": []}
        found = False
        records = state["records"]
        lo = "-"
        while True:
            page = await c.xrange(self.key(queue, "records"), min=lo, max="+", count=PAGE)
            for entry_id, fields in page:
                idx = _seq(entry_id)
                tags = json.loads(fields[b"t"])
                records.append((idx, fields[b"r"].decode(), tags, bytes(fields[b"d"])))
            if len(page) < PAGE:
                break
            lo = f"({page[-1][0].decode()}"
        nxt = 1
        if records:
            found = True
            nxt = records[-1][0] + 1
        try:
            info = await c.xinfo_stream(self.key(queue, "records"))
            found = True
            nxt = max(nxt, _seq(info["last-generated-id"]) + 1)
        except RedisError:
            pass  # no stream yet: nothing was ever put
        stored = await c.get(self.key(queue, "next"))
        if stored is not None:
            found = True
            nxt = max(nxt, int(stored))
        pairs, stones = await self._recent_tombstones(queue)
        if stones:
            found = True
            state["removed"] = pairs
            self._stones[queue] = stones
            self._stone_total[queue] = sum(n for _, n in stones)
            if pairs:
                nxt = max(nxt, max(i for i, _ in pairs) + 1)
        groups = await c.hgetall(self.key(queue, "groups"))
        for gid_b, raw in groups.items():
            found = True
            gid = gid_b.decode()
            start, tags = json.loads(raw)
            state["groups"].append((gid, int(start), dict(tags)))
            acked = await c.smembers(self.key(queue, f"acks:{gid}"))
            self._groups.setdefault(queue, set()).add(gid)
            state["acks"].extend((gid, int(i)) for i in acked)
        state["next_idx"] = nxt
        return state if found else None

    async def _recent_tombstones(self, queue: str) -> tuple[list[tuple[int, str]], deque[tuple[bytes, int]]]:
        """The newest RECENT_LIMIT removed (index, request id), oldest first, and the entries
        holding them."""
        key, hi = self.key(queue, "removed"), "+"
        newest_first: list[tuple[bytes, list[list[Any]]]] = []
        count = 0
        while count < RECENT_LIMIT:
            page = await self.client.xrevrange(key, max=hi, min="-", count=PAGE)
            for entry_id, f in page:
                items = json.loads(f[b"p"])
                newest_first.append((entry_id, items))
                count += len(items)
                if count >= RECENT_LIMIT:
                    break
            if len(page) < PAGE:
                break
            hi = f"({page[-1][0].decode()}"
        stones: deque[tuple[bytes, int]] = deque((eid, len(items)) for eid, items in reversed(newest_first))
        flat = [(int(i), str(r)) for _eid, items in reversed(newest_first) for i, r in items]
        return flat[-RECENT_LIMIT:], stones

    def _stoned(self, queue: str, entry_id: Any, n: int) -> None:
        """A removal's tombstone entry is written: count it, and trim the entries wholly beyond
        the newest RECENT_LIMIT records once PRUNE_SLACK more have gathered."""
        stones = self._stones.setdefault(queue, deque())
        stones.append((entry_id if isinstance(entry_id, bytes) else str(entry_id).encode(), n))
        total = self._stone_total.get(queue, 0) + n
        if total > RECENT_LIMIT + PRUNE_SLACK:
            while stones and total - stones[0][1] >= RECENT_LIMIT:
                total -= stones.popleft()[1]
            key, keep_from = self.key(queue, "removed"), stones[0][0].decode()

            self._submit(_adding([("XTRIM", key, "MINID", "=", keep_from)]))  # exact, not "~"
        self._stone_total[queue] = total

    def read(self, queue: str, idx: int) -> bytes | None:
        return None  # never called: reads_back is False

    def free_bytes(self) -> int | None:
        return None  # Redis's memory is its own to bound (maxmemory)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        raise RuntimeError("RedisBackend stops with 'await aclose(next_idx)'")

    async def aclose(self, next_idx: dict[str, int] | None = None) -> None:
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        try:
            if next_idx:
                pipe = self.client.pipeline(transaction=True)
                for queue, nxt in next_idx.items():
                    pipe.set(self.key(queue, "next"), nxt)
                await pipe.execute()
        except RedisError as exc:
            log.warning("queue backend %s: could not record the next indexes: %s", self.where, exc)
        finally:
            await self.client.aclose()

    # ------------------------------------------------------------------ group commit
    def _submit(self, op: _Op, done: _Done = None) -> Written:
        loop = self._loop
        if loop is None:
            raise RuntimeError("RedisBackend.start(loop) was not called")
        # A Write: no caller can cancel it (durable.py), so ``_write`` answers every op it
        # sends, with the undos of a refused one run first.
        fut = Write(loop=loop)
        fut.add_done_callback(_retrieve)
        self._pending.append((op, fut, done))
        if self._writer is None or self._writer.done():
            # A task runs from the next loop iteration: everything submitted until then joins.
            self._writer = loop.create_task(self._write())
        return fut

    async def _write(self) -> None:
        """The writer task: the backend's own, so no caller's cancellation reaches a batch.
        Every write it takes is answered: a batch that fails in any way fails its writes,
        and if the task itself is cancelled (the loop is closing) the writes it holds and
        those still waiting fail too, so that nobody awaits one forever."""
        batch: list[tuple[_Op, Write, _Done]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results, spans = await self._execute(batch)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # RedisError, OSError, StorageError, or a bug
                    self.errors += 1
                    self.failure = f"redis: {exc}"
                    log.error("queue storage write failed: %s", exc)
                    _fail([f for _, f, _ in batch], exc)
                    continue
                self._answer(batch, results, spans)
            batch = []
        except asyncio.CancelledError as exc:
            left, self._pending = [*batch, *self._pending], []
            _fail([f for _, f, _ in left], exc)
            raise

    def _answer(self, batch: list[tuple[_Op, Write, _Done]], results: list[Any], spans: list[int]) -> None:
        """A batch went through: each write is answered by its own commands' results."""
        self.batches += 1
        self.ops += len(batch)
        self.failure = None
        # Redis applies the other commands of a batch (script or transaction) when one
        # fails: each op is answered by its own commands' results.
        at = 0
        for (_, fut, done), n in zip(batch, spans, strict=True):
            mine = results[at : at + n]
            errs = [r for r in mine if isinstance(r, Exception)]
            at += n
            if done is not None and not errs:
                done(mine)
            if errs:
                self.errors += 1
                self.failure = f"redis: {errs[0]}"
                log.error("queue storage write failed: %s", errs[0])
                # A refused write's changes are undone in memory before its callers resume.
                fut.finish(StorageError(f"queue storage write failed: {errs[0]}"))
            else:
                fut.finish(None)

    async def _execute(self, batch: list[tuple[_Op, Write, _Done]]) -> tuple[list[Any], list[int]]:
        """One round trip; with a fence, written only while the owner lease is this gateway's."""
        cmds: list[Cmd] = []
        spans = [op(cmds) for op, _, _ in batch]
        fence = self.fence
        if fence is None:
            pipe = self.client.pipeline(transaction=True)
            for cmd in cmds:
                pipe.execute_command(*cmd)
            return await pipe.execute(raise_on_error=False), spans
        try:
            results = await self._fenced_write(keys=[fence.key], args=pack(fence.prefix, cmds))
        except ResponseError as exc:
            if str(exc).startswith(FENCED):
                raise StorageError(f"this gateway no longer serves the queues of {self.where}") from None
            raise
        return list(results), spans

    # ------------------------------------------------------------------ journal ops
    def put(self, queue: str, records: list[Record], next_idx: int) -> Written:
        key = self.key(queue, "records")
        cmds: list[Cmd] = [
            ("XADD", key, f"{r.idx}-0", "r", r.rid, "t", json.dumps(r.tags), "d", r.data) for r in records
        ]
        return self._submit(_adding(cmds))

    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Written:
        """Remove records and leave their tombstones in the same batch. Records taken from
        the front of the queue (nothing kept below ``floor``) go in one trim of the stream,
        a third of what deleting 100 entries one by one costs Redis."""
        key, removed_key = self.key(queue, "records"), self.key(queue, "removed")
        cmds: list[Cmd]
        if idxs and floor > max(idxs):
            cmds = [("XTRIM", key, "MINID", "=", f"{floor}-0")]
        else:
            cmds = [("XDEL", key, *part) for part in chunks([f"{i}-0" for i in idxs])]
        stone_at = len(cmds)  # where the tombstone's XADD answers its entry id
        stones = list(zip(idxs, rids, strict=True)) if rids else []
        if stones:
            cmds.append(("XADD", removed_key, "*", "n", len(stones), "p", json.dumps(stones)))
        for gid in sorted(self._groups.get(queue, ())):
            ack_key = self.key(queue, f"acks:{gid}")
            cmds.extend(("SREM", ack_key, *part) for part in chunks(idxs))

        def done(results: list[Any]) -> None:
            if stones:
                self._stoned(queue, results[stone_at], len(stones))

        return self._submit(_adding(cmds), done)

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Written:
        key = self.key(queue, f"acks:{gid}")
        self._groups.setdefault(queue, set()).add(gid)
        return self._submit(_adding([("SADD", key, *part) for part in chunks(idxs)]))

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Written:
        """Register a group, or record its new tag filter (its start never changes)."""
        return self._submit(_adding([("HSET", self.key(queue, "groups"), gid, json.dumps([start, tags]))]))

    def drop_group(self, queue: str, gid: str) -> Written:
        """Forget a group: its registration and what it committed."""
        groups, acks = self.key(queue, "groups"), self.key(queue, f"acks:{gid}")
        self._groups.get(queue, set()).discard(gid)
        return self._submit(_adding([("HDEL", groups, gid), ("DEL", acks)]))


def _adding(mine: list[Cmd]) -> _Op:
    """The op that adds these commands to a batch."""

    def op(cmds: list[Cmd]) -> int:
        cmds.extend(mine)
        return len(mine)

    return op


def _retrieve(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()


def _fail(futs: list[Write], err: BaseException) -> None:
    for f in futs:  # each write's changes are undone in memory before its callers resume
        f.finish(StorageError(f"queue storage write failed: {err}"))
