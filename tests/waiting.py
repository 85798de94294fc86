"""Waiting for a condition instead of sleeping a guessed time.

A fixed ``sleep`` either wastes time on an idle machine or is too short on a loaded one; a
polled predicate with a deadline returns as soon as the condition holds and fails with a
message naming what never happened. The poll interval only bounds how late the wait notices
the condition, never whether the test passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# How often a predicate is asked again: short enough that a wait adds little to a test,
# long enough that polling does not compete with the code under test for the CPU.
POLL_S = 0.01


def wait_until(predicate: Callable[[], T], timeout: float, what: str, poll_s: float = POLL_S) -> T:
    """Ask ``predicate`` until it returns something truthy and return that; fail after
    ``timeout`` seconds with ``what`` in the message."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)


async def async_wait_until(
    predicate: Callable[[], T | Awaitable[T]], timeout: float, what: str, poll_s: float = POLL_S
) -> T:
    """:func:`wait_until` for the event loop: the loop goes on running between polls, and
    ``predicate`` may be a coroutine function (asked again after each answer)."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if isinstance(got, Awaitable):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(poll_s)
