"""The lean front writes the answers of one loop turn together, after the turn, in order,
and never leaves one unwritten when the connection closes or changes hands."""

from __future__ import annotations

import asyncio

from gateway.lean_http import FastRequest, Hooks, Limits, Query, Reply, protocol_factory
from gateway.lean_http.cork import MAX_KEPT
from tests.gateway.front.test_lean_http import _Transport


def _req(body: bytes) -> bytes:
    return b"POST /api/predict/q HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _echo(req: FastRequest, query: Query) -> Reply:
    return Reply(200, req.body)


class _Switchable(_Transport):
    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol


def _connect(factory: object) -> tuple[object, _Switchable]:
    proto = factory()  # type: ignore[operator]
    t = _Switchable()
    proto.connection_made(t)
    return proto, t


async def test_answers_of_one_turn_are_written_after_it_in_order() -> None:
    factory = protocol_factory(Hooks(_echo), asyncio.Protocol, set(), Limits(1 << 20))
    a, ta = _connect(factory)
    b, tb = _connect(factory)
    a.data_received(_req(b"a1") + _req(b"a2"))  # type: ignore[attr-defined]
    b.data_received(_req(b"b1"))  # type: ignore[attr-defined]
    assert not ta.written and not tb.written  # answered, kept until the turn ends
    await asyncio.sleep(0)
    assert len(ta.written) == 1 and len(tb.written) == 1  # one write per connection
    assert ta.answers() == 2 and ta.written[0].index(b"a1") < ta.written[0].index(b"a2")
    assert tb.written[0].endswith(b"b1")


async def test_a_kept_answer_is_written_before_the_connection_closes() -> None:
    factory = protocol_factory(Hooks(_echo), asyncio.Protocol, set(), Limits(1 << 20))
    proto, t = _connect(factory)
    proto.data_received(_req(b"last"))  # type: ignore[attr-defined]
    proto.close_when_idle()  # type: ignore[attr-defined]  # shutdown, in the same turn
    assert t.closed and t.answers() == 1 and t.written[0].endswith(b"last")


async def test_a_kept_answer_goes_before_the_hand_over() -> None:
    got: list[bytes] = []

    class Fallback(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.append(data)

    factory = protocol_factory(Hooks(_echo), Fallback, set(), Limits(1 << 20))
    proto, t = _connect(factory)
    # A simple request, then one the lean front hands to aiohttp (HTTP/1.0), in one read.
    proto.data_received(_req(b"first") + b"GET /api/predict/q HTTP/1.0\r\n\r\n")  # type: ignore[attr-defined]
    assert t.answers() == 1 and t.written[0].endswith(b"first")  # before the new protocol answers
    assert got == [b"GET /api/predict/q HTTP/1.0\r\n\r\n"]


async def test_a_client_far_behind_is_written_to_at_once() -> None:
    factory = protocol_factory(Hooks(_echo), asyncio.Protocol, set(), Limits(1 << 20))
    proto, t = _connect(factory)
    body = b"x" * 4096
    n = MAX_KEPT // len(body) + 2
    proto.data_received(_req(body) * n)  # type: ignore[attr-defined]
    # More than MAX_KEPT answered in one turn: written now, so the transport's flow control
    # sees a client that does not read.
    assert t.written and t.answers() < n
    await asyncio.sleep(0)
    assert t.answers() == n


async def test_an_answer_that_waited_is_written_at_once() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def waits(req: FastRequest, query: Query) -> Reply:
        await gate  # as for a worker's reply
        return Reply(200, req.body)

    factory = protocol_factory(Hooks(waits), asyncio.Protocol, set(), Limits(1 << 20))
    proto, t = _connect(factory)
    proto.data_received(_req(b"w"))  # type: ignore[attr-defined]
    gate.set_result(None)
    await asyncio.sleep(0)  # the handler resumes, ahead of this test, and answers
    assert t.answers() == 1
