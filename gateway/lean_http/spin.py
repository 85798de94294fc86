"""Busy polling: after an answer, the event loop polls for the next request for a while
instead of sleeping until it arrives.

A loop with nothing to do blocks in ``epoll_wait``, and its core idles; the next request
then has to wake it (an interrupt, the scheduler, and in a virtual machine an exit to the
host and back). On the benchmark machine (a 2-core VM) that wake-up is most of a loopback
round trip: a bare asyncio responder answers one connection in 56 µs at the median, and
in 21 µs when its loop polls instead of sleeping; a model that runs in the loop also runs
warmer when its core never idled. For a client that calls one at a time, the time between
an answer and its next call is that client's own turnaround, so polling for a window a
little longer than it answers the next call without a wake-up.

The price is CPU: after every answer the loop keeps its core busy for up to the window
(calls coming faster than it keep the core busy all the time). Off by default
(``busy_poll_us: 0``); a latency-bound deployment with cores to spare turns it on, as
ONNX Runtime spins its own threads between runs.

The window is polled by a callback that reschedules itself with ``call_soon``: while a
callback is ready, asyncio's and uvloop's loops poll their sockets without blocking, so
the request is read on the loop's next turn. No poll while any call of this listener's
lean front waits for something (a worker's answer, a batch, a commit, a queue's long poll):
the work it waits for may need this core (a worker on the same core is then slowed by the
gateway it answers), and that call's answer re-arms the window. Calls handed over to
aiohttp, and gRPC's, are not counted: they neither poll nor stop the polling.
"""

from __future__ import annotations

import asyncio
import time


class BusyPoll:
    """One listener's polling window. ``waiting`` counts its calls that wait for something;
    :meth:`arm` after each answer."""

    __slots__ = ("_loop", "_until", "polling", "waiting", "window")

    def __init__(self, window_s: float) -> None:
        self.window = window_s
        self.waiting = 0
        self.polling = False  # a tick is scheduled
        self._until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self) -> None:
        """An answer was given: poll for the next request until the window from now ends."""
        self._until = time.monotonic() + self.window
        if not self.polling:
            self.polling = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        if self.waiting or time.monotonic() >= self._until:
            self.polling = False
            return
        assert self._loop is not None  # set by the arm that scheduled the first tick
        self._loop.call_soon(self._tick)


__all__ = ["BusyPoll"]
