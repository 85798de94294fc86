"""Busy polling on the lean front: after an answer its loop polls for the next request until
the window ends, never while a call waits for something, and not at all when it is off."""

from __future__ import annotations

import asyncio

from gateway.lean_http import FastRequest, Hooks, Limits, Query, Reply, protocol_factory
from gateway.lean_http.spin import BusyPoll
from tests.gateway.front.test_cork import _connect, _req
from tests.waiting import async_wait_until


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _spin_of(proto: object) -> BusyPoll | None:
    return proto._spin  # type: ignore[attr-defined,no-any-return]


async def _echo(req: FastRequest, query: Query) -> Reply:
    return Reply(200, req.body)


async def test_an_answer_polls_until_its_window_ends() -> None:
    limits = Limits(1 << 20, busy_poll_s=30.0)  # far longer than the turns below, however slow
    proto, t = _connect(protocol_factory(Hooks(_echo), asyncio.Protocol, set(), limits))
    spin = _spin_of(proto)
    assert spin is not None and not spin.polling
    proto.data_received(_req(b"a"))  # type: ignore[attr-defined]
    assert spin.polling
    await _turns(20)  # each turn the tick schedules the next: still polling within the window
    assert spin.polling and t.answers() == 1
    # A later answer opens a new window from its own time: a short one ends.
    spin.window = 0.01
    proto.data_received(_req(b"b"))  # type: ignore[attr-defined]
    await async_wait_until(lambda: not spin.polling, 10, "the window to end")
    assert t.answers() == 2 and spin.waiting == 0
    proto.data_received(_req(b"c"))  # type: ignore[attr-defined]
    assert spin.polling  # and the next answer polls again


async def test_no_polling_while_a_call_waits_and_its_answer_polls_again() -> None:
    release = asyncio.get_running_loop().create_future()

    async def serve(req: FastRequest, query: Query) -> Reply:
        if req.body == b"wait":
            await release  # a worker's answer, a batch, a commit
        return Reply(200, req.body)

    factory = protocol_factory(Hooks(serve), asyncio.Protocol, set(), Limits(1 << 20, busy_poll_s=30.0))
    quick, tq = _connect(factory)
    slow, ts = _connect(factory)
    spin = _spin_of(quick)
    assert spin is not None and spin is _spin_of(slow)  # one window per listener
    quick.data_received(_req(b"now"))  # type: ignore[attr-defined]
    assert spin.polling
    slow.data_received(_req(b"wait"))  # type: ignore[attr-defined]
    assert spin.waiting == 1
    await async_wait_until(lambda: not spin.polling, 10, "polling to stop while a call waits")
    # A call answered at once meanwhile does not start it again for as long as one waits.
    quick.data_received(_req(b"again"))  # type: ignore[attr-defined]
    await _turns(3)
    assert not spin.polling and tq.answers() == 2 and ts.answers() == 0
    release.set_result(None)
    await async_wait_until(lambda: ts.answers() == 1, 10, "the waiting call's answer")
    assert spin.waiting == 0 and spin.polling


async def test_a_client_that_leaves_mid_call_does_not_stop_polling_for_good() -> None:
    never = asyncio.get_running_loop().create_future()

    async def serve(req: FastRequest, query: Query) -> Reply:
        if req.body == b"wait":
            await never
        return Reply(200, req.body)

    limits = Limits(1 << 20, cancel_on_lost=True, busy_poll_s=30.0)
    factory = protocol_factory(Hooks(serve), asyncio.Protocol, set(), limits)
    gone, _ = _connect(factory)
    gone.data_received(_req(b"wait"))  # type: ignore[attr-defined]
    spin = _spin_of(gone)
    assert spin is not None and spin.waiting == 1
    gone.connection_lost(None)  # type: ignore[attr-defined]  # its call is cancelled
    await async_wait_until(lambda: spin.waiting == 0, 10, "the cancelled call to stop counting")
    other, t = _connect(factory)
    other.data_received(_req(b"next"))  # type: ignore[attr-defined]
    await _turns(3)
    assert spin.polling and t.answers() == 1


async def test_off_means_no_poller() -> None:
    proto, _ = _connect(protocol_factory(Hooks(_echo), asyncio.Protocol, set(), Limits(1 << 20)))
    assert _spin_of(proto) is None
