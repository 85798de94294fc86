"""The Lua script that writes one fenced batch of queue journal commands.

A batch is a list of raw Redis commands (``("XADD", key, "5-0", "r", rid, ...)``). With an
owner lease (lease.py) the whole batch is sent as one ``EVALSHA`` of ``SOURCE``: the script
reads the lease key, and only when its value still starts with this gateway's token does
it run the commands, each with ``redis.pcall``, answering one result per command (a refused
command is an error inside the array, so only the op that sent it fails). A script runs
atomically, as ``MULTI``/``EXEC`` does, so nothing can take the lease between the check and
the writes: one round trip instead of ``WATCH`` + ``GET`` + ``MULTI``/``EXEC``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

# Lua's unpack() puts every argument of a command on its stack, which holds a few thousand
# values: commands naming many ids (XDEL, SADD, SREM) are split into commands of at most
# this many.
CHUNK = 1000

# What the script answers when the lease is not (or no longer) this gateway's.
FENCED = "EASQ_FENCED"

# KEYS[1]: the lease key. ARGV[1]: the holder's value prefix ("<token> "); then per command
# its argument count followed by its arguments. The commands' own keys travel in ARGV: the
# store is one Redis server (a batch spans queues, as a MULTI/EXEC of them did), not a cluster.
SOURCE = f"""
if redis.replicate_commands then redis.replicate_commands() end
local holder = redis.call('GET', KEYS[1])
local prefix = ARGV[1]
if not holder or string.sub(holder, 1, string.len(prefix)) ~= prefix then
  return redis.error_reply('{FENCED} the owner lease is not held')
end
local out, n, i, last = {{}}, 0, 2, #ARGV
while i <= last do
  local argc = tonumber(ARGV[i])
  n = n + 1
  out[n] = redis.pcall(unpack(ARGV, i + 1, i + argc))
  i = i + argc + 1
end
return out
"""

Arg = str | bytes | int | float
Cmd = tuple[Arg, ...]
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for at in range(0, len(items), size):
        yield items[at : at + size]


def pack(prefix: str, cmds: list[Cmd]) -> list[Arg]:
    """The script's ARGV for ``cmds``, written only while the lease value starts with ``prefix``."""
    args: list[Arg] = [prefix]
    for cmd in cmds:
        args.append(len(cmd))
        args.extend(cmd)
    return args
