"""Which gateway serves the queues of one Redis store: an owner lease with fencing.

The queue's state between writes (who holds which record, windows, tag filters) lives
in the serving gateway's memory, so the queues of a store are served by one gateway at a
time, the lease holder; the others forward their calls to it (``proxy.py``). The lease is
one key, ``<prefix>:owner`` = ``"<token> <host:port>"``, set with a time to live and
renewed at a third of it. A gateway that stops renewing (killed, hung, cut off) loses it
once it expires, and the first other gateway that tries takes it over and loads the
queues from Redis: whatever was delivered but not committed is delivered again. A holder
that finds the key gone (a Redis restart without its data) gives the queues up and loads
them again as a new holder would, instead of writing on from a state the store lost.

Fencing: every batch of journal writes is one Lua script that reads the key and runs
the batch's commands only while the value is still this gateway's (redis_script.py); a
script runs atomically, so a gateway that lost the lease while paused can never write
after its successor loaded the queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

# Acquire or renew: set the value (with a new expiry) when the key is ours (1: renewed) or
# free (2: acquired); otherwise answer the holder's value.
_CLAIM = """
local v = redis.call('GET', KEYS[1])
if v ~= false and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == false then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
return v
"""
_RENEWED, _ACQUIRED = 1, 2
# Take over from a holder known to be dead: only if the key still holds its value.
_TAKE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v ~= false and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    """One gateway's view of a store's owner lease; ``on_gain``/``on_lose`` run on changes."""

    def __init__(
        self,
        client: aioredis.Redis,
        key: str,
        ttl_s: float,
        on_gain: Callable[[], Awaitable[None]],
        on_lose: Callable[[], Awaitable[None]],
    ) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = max(100, int(ttl_s * 1000))
        self.token = uuid.uuid4().hex
        self.address = "-"  # host:port other gateways forward to, once listening
        self.owner_address: str | None = None  # the holder's, when it is another gateway
        self.owned = False
        self._on_gain = on_gain
        self._on_lose = on_lose
        self._renewed = 0.0  # monotonic time of the last successful claim
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def value(self) -> str:
        return f"{self.token} {self.address}"

    @property
    def interval_s(self) -> float:
        return self.ttl_ms / 3000.0

    @property
    def prefix(self) -> str:
        """How the key's value starts while this gateway holds the lease."""
        return self.token + " "

    async def claim(self) -> bool:
        """One acquire-or-renew round; True while this gateway holds the lease. Rounds never
        overlap (the periodic one and one woken by ``advertise`` or called directly)."""
        async with self._lock:
            return await self._claim()

    async def _claim(self) -> bool:
        try:
            got = await self.client.eval(_CLAIM, 1, self.key, self.prefix, self.value, self.ttl_ms)
        except (RedisError, OSError) as exc:
            # Unreachable: still ours until it would have expired, then assume it is gone.
            if self.owned and time.monotonic() - self._renewed > self.ttl_ms / 1000.0:
                log.warning("queue owner lease %s expired while Redis was unreachable: %s", self.key, exc)
                await self._lose()
            return self.owned
        if got == _ACQUIRED and self.owned:
            # The key was gone while this gateway held it: the Redis server restarted without
            # its data (no append-only file) or the lease expired unnoticed. What this gateway
            # holds in memory no longer matches the store: give it up and load the queues
            # again, from what the store still has (docs/queue.md, "Durability").
            log.warning(
                "queue owner lease %s vanished while this gateway held it (a Redis restart without "
                "its data, or an expiry): serving the queues again from what Redis holds now; records "
                "it no longer has are gone",
                self.key,
            )
            await self._lose()
        if got in (_RENEWED, _ACQUIRED):
            self._renewed = time.monotonic()
            self.owner_address = None
            if not self.owned:
                self.owned = True
                log.info("this gateway now serves the queues of %s", self.key)
                try:
                    await self._on_gain()
                except Exception:
                    log.exception("loading the queues of %s failed; giving the lease back", self.key)
                    self.owned = False
                    await self.release()
            return self.owned
        holder = got.decode() if isinstance(got, bytes) else str(got)
        self.owner_address = holder.partition(" ")[2] or None
        if self.address != "-" and self.owner_address == self.address and not self.owned:
            # The holder published the address this gateway listens on now: it is a previous
            # run of this gateway that died (two listeners cannot share it). Take over at once
            # instead of waiting for its lease to expire.
            try:
                took = await self.client.eval(_TAKE, 1, self.key, holder, self.value, self.ttl_ms)
            except (RedisError, OSError):
                took = 0
            if took == 1:
                log.info(
                    "queue owner lease %s: taking over from a previous run at %s", self.key, self.address
                )
                return await self._claim()
            return False
        if self.owned:
            log.warning("queue owner lease %s was taken over by %s", self.key, self.owner_address)
            await self._lose()
        return False

    async def _lose(self) -> None:
        self.owned = False
        try:
            await self._on_lose()
        except Exception:
            log.exception("giving up the queues of %s failed", self.key)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def advertise(self, address: str) -> None:
        """Where other gateways reach this one; published at the next round (at once)."""
        self.address = address
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            await self.claim()

    async def pause(self) -> None:
        """No more rounds (a stop begins); the lease stays held until ``stop``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def stop(self) -> None:
        await self.pause()
        if self.owned:
            self.owned = False
            await self.release()
        await self.client.aclose()

    async def release(self) -> None:
        """Give the lease back at once (a clean stop): another gateway takes over now."""
        with contextlib.suppress(RedisError, OSError):
            await self.client.eval(_RELEASE, 1, self.key, self.prefix)
