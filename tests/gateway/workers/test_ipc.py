"""The framed RPC on a real unix socket, in one process: framing, pipelining, cancel, loss."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.codecs.ipc import (
    HEADER,
    LARGE,
    REQUEST,
    RESPONSE,
    FramedProtocol,
    IPCClient,
    IPCServerProtocol,
    IPCTimeout,
    RequestSink,
    WorkerConnectionError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from gateway.core.calls import WorkerRequest, WorkerResponse
from tests.waiting import async_wait_until


class ManualSink(RequestSink):
    """Holds requests until the test answers them; records cancels."""

    def __init__(self) -> None:
        self.jobs: list[tuple[WorkerRequest, Callable[[WorkerResponse | None], None]]] = []
        self.cancelled: list[WorkerRequest] = []

    def submit(self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None]) -> Any:
        self.jobs.append((req, done))
        return req

    def cancel(self, job: Any) -> None:
        self.cancelled.append(job)

    def stats(self) -> dict[str, Any]:
        return {"held": len(self.jobs)}


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, ManualSink, list[IPCServerProtocol]]]:
    sink = ManualSink()
    protos: list[IPCServerProtocol] = []

    def factory() -> IPCServerProtocol:
        p = IPCServerProtocol(sink)
        protos.append(p)
        return p

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        srv = await asyncio.get_running_loop().create_unix_server(factory, path=path)
        yield path, sink, protos
        srv.close()
        for p in protos:
            p.abort()
        await srv.wait_closed()


def test_codec_round_trip() -> None:
    req = WorkerRequest(b"\x00body", "sub/path", "application/x", "rid-1", {"X-A": "b"}, 12.5)
    assert decode_request(b"".join(encode_request(req))) == req
    resp = WorkerResponse(418, b"teapot", "text/plain; charset=utf-8", 1234)
    assert decode_response(b"".join(encode_response(resp))) == resp
    assert req.header("x-a") == "b" and req.header("missing", "d") == "d"


def test_a_header_is_found_whatever_the_case_of_its_name() -> None:
    req = WorkerRequest(b"", headers={"X-Eas-Request-Format": "tf", "x-other-formats": "-", "X-Trace": "t"})
    assert req.header("x-eas-request-format") == "tf" and req.header("X-EAS-REQUEST-FORMAT") == "tf"
    assert req.header("x-trace") == "t" and req.header("X-Trace") == "t"
    assert req.header("X-Eas-Request-Formax") is None  # the same length, another name
    assert req.header("X-Tra", "none") == "none"


async def test_pipelined_out_of_order_answers(server: Any) -> None:
    path, sink, _ = server
    client = IPCClient(path, connections=2)
    await client.connect()
    try:
        calls = [asyncio.create_task(client.call(WorkerRequest(str(i).encode()), 5)) for i in range(20)]
        await async_wait_until(lambda: len(sink.jobs) >= 20, 10, "the request(s) to reach the sink")
        # Answer in reverse order: each caller still gets its own answer.
        for req, done in reversed(sink.jobs):
            done(WorkerResponse(200, b"echo:" + req.body))
        results = await asyncio.gather(*calls)
        assert [r.body for r in results] == [b"echo:%d" % i for i in range(20)]
        assert (await client.ping(5)) == {"held": 20}
    finally:
        client.close()


async def test_timeout_sends_cancel_and_late_answer_is_dropped(server: Any) -> None:
    path, sink, _ = server
    client = IPCClient(path, connections=1)
    await client.connect()
    try:
        with pytest.raises(IPCTimeout):
            await client.call(WorkerRequest(b"slow"), 0.1)
        await async_wait_until(lambda: sink.cancelled, 10, "the cancel to reach the sink")
        assert sink.cancelled[0].body == b"slow"
        sink.jobs[0][1](WorkerResponse(200, b"too late"))  # nobody waits: ignored
        task = asyncio.create_task(client.call(WorkerRequest(b"next"), 5))
        await async_wait_until(lambda: len(sink.jobs) >= 2, 10, "the request(s) to reach the sink")
        sink.jobs[1][1](WorkerResponse(200, b"ok"))
        assert (await task).body == b"ok"
    finally:
        client.close()


async def test_connection_loss_fails_pending_calls(server: Any) -> None:
    path, sink, protos = server
    lost: list[bool] = []
    client = IPCClient(path, connections=2, on_lost=lambda: lost.append(True))
    await client.connect()
    calls = [asyncio.create_task(client.call(WorkerRequest(b"x"), 5)) for _ in range(4)]
    await async_wait_until(lambda: len(sink.jobs) >= 4, 10, "the request(s) to reach the sink")
    for p in protos:
        p.abort()  # the worker dies
    for c in calls:
        with pytest.raises(WorkerConnectionError):
            await c
    assert lost == [True] and not client.alive
    with pytest.raises(WorkerConnectionError):
        await client.call(WorkerRequest(b"y"), 1)


async def test_a_retired_client_finishes_its_calls_then_closes_quietly(server: Any) -> None:
    """Connections replaced by newer ones (a TLS reload): the calls they carry are answered,
    then they close, and their close is no loss of the worker."""
    path, sink, _ = server
    lost: list[bool] = []
    client = IPCClient(path, connections=2, on_lost=lambda: lost.append(True))
    await client.connect()
    calls = [asyncio.create_task(client.call(WorkerRequest(b"%d" % i), 5)) for i in range(3)]
    await async_wait_until(lambda: len(sink.jobs) >= 3, 10, "the request(s) to reach the sink")
    retired = asyncio.create_task(client.retire())
    await asyncio.sleep(0)  # the retirement waits for the calls: nothing is closed yet
    assert client.alive and not retired.done()
    for req, done in sink.jobs:
        done(WorkerResponse(200, b"echo:" + req.body))
    assert [r.body for r in await asyncio.gather(*calls)] == [b"echo:0", b"echo:1", b"echo:2"]
    await retired
    await async_wait_until(lambda: not client.alive, 10, "the retired connections to close")
    assert lost == []


async def test_frames_split_across_reads(server: Any) -> None:
    path, sink, _ = server
    reader, writer = await asyncio.open_unix_connection(path)
    payload = b"".join(encode_request(WorkerRequest(b"B" * 100_000, request_id="big")))
    frame = HEADER.pack(len(payload), 7, REQUEST) + payload
    for i in range(0, len(frame), 4093):  # dribble it in odd-sized pieces
        writer.write(frame[i : i + 4093])
        await writer.drain()
    await async_wait_until(lambda: sink.jobs, 10, "the request(s) to reach the sink")
    req, done = sink.jobs[0]
    assert req.request_id == "big" and len(req.body) == 100_000
    done(WorkerResponse(201, b"created"))
    head = await reader.readexactly(HEADER.size)
    length, rid, kind = HEADER.unpack(head)
    assert kind == RESPONSE
    body = await reader.readexactly(length)
    assert rid == 7 and decode_response(body).status == 201
    writer.close()
    await writer.wait_closed()


async def test_an_answer_over_the_limit_never_crosses_to_the_gateway() -> None:
    sink = ManualSink()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        srv = await asyncio.get_running_loop().create_unix_server(
            lambda: IPCServerProtocol(sink, 1000), path=path
        )
        client = IPCClient(path, connections=1)
        await client.connect()
        try:
            calls = [asyncio.create_task(client.call(WorkerRequest(b"x"), 5)) for _ in range(2)]
            await async_wait_until(lambda: len(sink.jobs) >= 2, 10, "the request(s) to reach the sink")
            sink.jobs[0][1](WorkerResponse(200, b"y" * 1001, "application/octet-stream", 7))
            sink.jobs[1][1](WorkerResponse(200, b"y" * 1000))
            big, small = await asyncio.gather(*calls)
            assert (big.status, big.content_type, big.compute_us) == (413, "application/json", 7)
            assert json.loads(big.body) == {
                "code": "ResponseTooLarge",
                "message": "the answer would be 1001 bytes (0.0 MiB), over the limit of 1000 bytes (0.0 MiB) "
                "set by gateway.max_response_bytes",
            }
            assert (small.status, len(small.body)) == (200, 1000)
        finally:
            client.close()
            srv.close()
            await srv.wait_closed()


class _Frames(FramedProtocol):
    """Records the frames a byte stream holds, as a receiver hands them on."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[int, int, Any]] = []

    def frame_received(self, rid: int, kind: int, payload: bytes, body: bytes | None = None) -> None:
        if kind == REQUEST:
            self.frames.append((rid, kind, decode_request(payload, body)))
        else:
            self.frames.append((rid, kind, decode_response(payload, body)))


@pytest.mark.parametrize("chunk", [3, 1000, 65_536, 1 << 20])
def test_large_frames_are_gathered_between_small_ones(chunk: int) -> None:
    """A large request and response (over LARGE) between small frames, split at every chunk
    size: what precedes the body may span chunks, a chunk may end one frame and start the
    next; every frame comes out whole, in order, its body as bytes."""
    big = os.urandom(LARGE + 12_345)
    frames = [
        (1, REQUEST, WorkerRequest(b"small", request_id="a")),
        (2, REQUEST, WorkerRequest(big, "sub", "application/x", "big", {"K": "v"}, 1.5)),
        (3, RESPONSE, WorkerResponse(200, big[::-1], "application/y", 42)),
        (4, RESPONSE, WorkerResponse(201, b"tail")),
    ]
    stream = b""
    for rid, kind, msg in frames:
        payload = b"".join(encode_request(msg) if kind == REQUEST else encode_response(msg))
        stream += HEADER.pack(len(payload), rid, kind) + payload
    proto = _Frames()
    for i in range(0, len(stream), chunk):
        proto.data_received(stream[i : i + chunk])
    assert proto.frames == frames
    assert all(type(m.body) is bytes for _, _, m in proto.frames)
    assert not proto._buf and proto._gathering is None


async def test_a_large_body_round_trips_on_a_real_socket(server: Any) -> None:
    path, sink, _ = server
    client = IPCClient(path, connections=1)
    await client.connect()
    body = os.urandom(3 * LARGE + 7)
    call = asyncio.ensure_future(client.call(WorkerRequest(body, request_id="big"), 10))
    small = asyncio.ensure_future(client.call(WorkerRequest(b"s", request_id="small"), 10))
    await async_wait_until(lambda: len(sink.jobs) >= 2, 10, "the request(s) to reach the sink")
    got = {req.request_id: (req, done) for req, done in sink.jobs}
    assert got["big"][0].body == body
    got["big"][1](WorkerResponse(200, body[::-1]))
    got["small"][1](WorkerResponse(200, b"t"))
    assert (await call).body == body[::-1] and (await small).body == b"t"
    client.close()
