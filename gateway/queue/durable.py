"""Durability handles: what a change to a queue hands its caller to await before answering.

A change is applied in memory at once and journalled; the backend hands back a ``Write``
that completes once the change is durable, or fails when the store refuses it (disk full,
read-only, Redis refusing writes).

A write's outcome belongs to the queue, not to whoever awaits it. A client that hangs up
cancels its own handler (aiohttp's ``handler_cancellation``, the lean front), and if that
cancelled the write's future, the queue would forget in memory a change the store commits
anyway: a put would reappear after a restart, and a put retried with the same request id
would be stored twice. So a ``Write`` cannot be cancelled: ``cancel()`` refuses, and a task
cancelled while it awaits one gets its ``CancelledError`` once the write has completed and
the queue's memory holds its outcome (a write is one transaction of the group commit: the
wait is as long as the store takes to answer it). Any number of callers may await the
same write (a put retried while the first put of its request id is in flight awaits the
first one's write): none of them can end it for the others.

What a change must undo in memory when its write is refused is registered on the write
itself (``on_failure``), by the part of the queue that made the change; the backend runs
those undos (``Write.finish``) before anyone awaiting the write resumes, so nothing lives in
a registry beside the write and nothing is left behind when nobody awaits it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any

# What a caller awaits before answering: one write, several (``every_durable``), or None
# when the change needed no write.
Durable = Awaitable[Any] | None


class Write(asyncio.Future[None]):
    """One journal write's outcome, completed by its backend with ``finish``; see the module."""

    # Set on the first ``on_failure`` (most writes never get one: a single-group commit's
    # removal does, a put does not), so a write costs no more to make than a plain future.
    _undos: list[Callable[[], None]] | None = None

    def cancel(self, msg: Any | None = None) -> bool:
        """Refused: a waiter that is cancelled stops waiting, the write goes on."""
        return False

    def on_failure(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` if the store refuses this write, before any waiter resumes."""
        if self._undos is None:
            self._undos = [undo]
        else:
            self._undos.append(undo)

    def finish(self, error: BaseException | None) -> None:
        """The backend's end of the write: done, or refused with ``error`` (the undos run
        first, in the order they were registered, so the memory matches the store again)."""
        if self.done():
            return
        undos, self._undos = self._undos, None
        if error is None:
            self.set_result(None)
            return
        for undo in undos or ():
            undo()
        self.set_exception(error)


# What a storage engine hands back for one write: the write, or None when it was written
# at once (a store not started, offline use).
Written = Write | None


def on_failure(dur: Durable, undo: Callable[[], None]) -> None:
    """Run ``undo`` if the write behind ``dur`` is refused (None, already durable, never is)."""
    if isinstance(dur, Write):
        dur.on_failure(undo)


def last_durable(durs: Iterable[Durable]) -> Durable:
    """The backend completes its writes in order: the last handle covers all before it."""
    real = [d for d in durs if d is not None]
    return real[-1] if real else None


class _Every:
    """Awaits several write handles in turn: done when all are, failing as the first failure."""

    __slots__ = ("durs",)

    def __init__(self, durs: list[Awaitable[Any]]) -> None:
        self.durs = durs

    def __await__(self) -> Generator[Any, None, None]:
        for d in self.durs:
            yield from d.__await__()


def every_durable(durs: Iterable[Durable]) -> Durable:
    """One handle for writes that need not complete in the order they are listed (puts of
    other calls that a batch found in flight): each distinct one is awaited."""
    real: list[Awaitable[Any]] = []
    for d in durs:
        if d is not None and all(d is not r for r in real):
            real.append(d)
    if len(real) <= 1:
        return real[0] if real else None
    return _Every(real)


__all__ = ["Durable", "Write", "Written", "every_durable", "last_durable", "on_failure"]
