"""Queue clients against tiny scripted servers: retry rules, get(auto_delete) safety, watchers.

* ``get(auto_delete=True)`` deletes what it reads on the server, so it is never repeated
  once the request may have arrived (a read timeout, a dropped or cut-off response):
  a retry would lose those records. A failure to connect is still retried.
* AsyncQueueClient retries 5xx and never a 4xx, like QueueClient.
* A watch frame that does not decode reconnects like any broken stream; each client runs
  one watcher at a time, and closing it lets the next one start.
* A watcher gets what it needs from its client as values (its settings, a claim on the
  client's one watcher slot), never by reaching into the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from eas_sdk._core.retry import RetryPolicy, UnlimitedBudget
from eas_sdk._proto.queue_pb2 import DataFrameListProto, DataFrameProto
from eas_sdk.errors import ConnectError, NotFoundError, PredictException, TimeoutError
from eas_sdk.queue import AsyncQueueClient, QueueClient
from eas_sdk.watcher import AsyncWatcher, Watcher, WatchSettings
from tests.waiting import async_wait_until

pytestmark = pytest.mark.timeout(30)

FAST = RetryPolicy(retries=3, backoff_base=0.001, backoff_cap=0.005)


def _records(*indexes: int) -> bytes:
    lst = DataFrameListProto()
    for i in indexes:
        lst.index.add(index=i, data=b"d%d" % i)
    return lst.SerializeToString()


class ScriptedHTTP:
    """HTTP/1.1 keep-alive server on 127.0.0.1 answering from a script, one action per request.

    Actions: an int status (with ``body``), ``"hang"`` (read the request, never answer),
    ``"cut"`` (``Content-Length: 10``, 3 bytes, close), ``"drop"`` (close, no answer),
    ``"close-after"`` (answer 200 with ``body``, then close the idle connection).
    """

    def __init__(self, body: bytes = b"") -> None:
        self.body = body
        self.script: list[Any] = []
        self.hits: list[str] = []
        self.connections = 0
        self.closed = 0  # connections this server has closed
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> ScriptedHTTP:
        self.sock.listen()
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.hits.append(head.split(b" ")[0].decode())
                action = self.script.pop(0) if self.script else 200
                if action == "hang":
                    while conn.recv(65536):
                        pass
                    return
                if action == "drop":
                    return
                if action == "cut":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
                    time.sleep(0.05)
                    return
                status = 200 if action == "close-after" else int(action)
                body = self.body if status == 200 else b"nope"
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
                if action == "close-after":
                    time.sleep(0.05)
                    return
        except OSError:
            return
        finally:
            conn.close()
            self.closed += 1

    def stop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(5)


@pytest.fixture
def http_server() -> Iterator[Callable[..., ScriptedHTTP]]:
    made: list[ScriptedHTTP] = []

    def make(body: bytes = b"", listen: bool = True) -> ScriptedHTTP:
        s = ScriptedHTTP(body)
        if listen:
            s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


class Queue:
    """QueueClient or AsyncQueueClient behind one awaitable interface."""

    def __init__(self, kind: str, port: int) -> None:
        cls = QueueClient if kind == "sync" else AsyncQueueClient
        self.kind = kind
        self.client: Any = cls(f"127.0.0.1:{port}", "q")
        self.client.init()
        self.client.retry_policy = FAST
        self.client.budget = UnlimitedBudget()
        self.client.set_timeout(300)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.client, name)
        if self.kind == "sync":
            return await asyncio.to_thread(method, *args, **kwargs)
        return await method(*args, **kwargs)

    async def close(self) -> None:
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.close()


@pytest.fixture(params=["sync", "async"])
async def queue(request: pytest.FixtureRequest) -> Any:
    made: list[Queue] = []

    def make(port: int) -> Queue:
        q = Queue(str(request.param), port)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


# --- get(auto_delete=True) is not repeated once it may have reached the server ---------------------


@pytest.mark.parametrize(
    ("action", "error"), [("hang", TimeoutError), ("cut", ConnectError), ("drop", ConnectError)]
)
async def test_deleting_get_is_not_retried_after_it_was_sent(
    http_server: Any, queue: Any, action: str, error: type[Exception]
) -> None:
    s = http_server(_records(1))
    s.script[:] = [action]
    q = queue(s.port)
    # "hang" ends with the attempt's read timeout: max(0.3 s, 0 s + 1 s), as
    # test_mock_transport.py checks on the request itself.
    with pytest.raises(error) as info:
        await q.call("get", timeout="0s", auto_delete=True)
    assert s.hits == ["GET"]  # one attempt: the records it may have deleted are not lost twice
    assert "not retried" in str(info.value)


@pytest.mark.parametrize("action", ["hang", "cut", "drop"])
async def test_non_deleting_get_is_retried(http_server: Any, queue: Any, action: str) -> None:
    s = http_server(_records(1))
    s.script[:] = [action]
    q = queue(s.port)
    frames = await q.call("get", timeout="0s", auto_delete=False)
    assert [f.index for f in frames] == [1]
    assert s.hits == ["GET", "GET"]


async def test_deleting_get_is_retried_when_connecting_failed(http_server: Any, queue: Any) -> None:
    s = http_server(_records(4), listen=False)  # bound, not listening: connections are refused
    q = queue(s.port)
    q.client.retry_policy = RetryPolicy(retries=200, backoff_base=0.01, backoff_cap=0.02)
    threading.Timer(0.3, s.start).start()
    frames = await q.call("get", timeout="0s", auto_delete=True)
    assert [f.index for f in frames] == [4]
    assert s.hits == ["GET"]


async def test_deleting_get_on_a_connection_the_server_closed_while_idle(
    http_server: Any, queue: Any
) -> None:
    # The idle pooled connection was closed by the server: noticed before sending (sync)
    # or by aiohttp's pool, so the get goes out once on a new connection and succeeds.
    s = http_server(_records(5))
    s.script[:] = ["close-after"]
    q = queue(s.port)
    assert [f.index for f in await q.call("get", timeout="0s", auto_delete=True)] == [5]
    await async_wait_until(lambda: s.closed == 1, 10, "the server to close the idle connection")
    assert [f.index for f in await q.call("get", timeout="0s", auto_delete=True)] == [5]
    assert s.hits == ["GET", "GET"] and s.connections == 2


# --- retry rules of both clients --------------------------------------------------------------


async def test_5xx_retried_and_4xx_never(http_server: Any, queue: Any) -> None:
    s = http_server(b"7")
    q = queue(s.port)
    s.script[:] = [503, 502]
    index, _ = await q.call("put", b"x")
    assert index == "7" and s.hits == ["POST"] * 3
    s.hits.clear()
    s.script[:] = [404]
    with pytest.raises(NotFoundError):
        await q.call("commit", 1)
    assert s.hits == ["PUT"]
    s.hits.clear()
    s.script[:] = [400]
    with pytest.raises(PredictException) as info:
        await q.call("delete", [1, 2])
    assert info.value.code == 400 and s.hits == ["DELETE"]
    s.hits.clear()
    s.script[:] = [500, 500, 500, 500]
    with pytest.raises(PredictException) as info:
        await q.call("truncate", 3)
    assert info.value.code == 500 and s.hits == ["DELETE"] * 4  # 1 + retries=3


# --- watchers -----------------------------------------------------------------------------------


class WatchServer:
    """A WebSocket server sending scripted binary frames per connection, then holding it open."""

    def __init__(self, frames_per_connection: list[list[bytes]]) -> None:
        from websockets.sync.server import serve

        self.plan = list(frames_per_connection)
        self.connections = 0
        self.server = serve(self._handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, ws: Any) -> None:
        self.connections += 1
        frames = self.plan.pop(0) if self.plan else []
        for f in frames:
            ws.send(f)
        with contextlib.suppress(Exception):  # the client went away
            for _ in ws:
                pass

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def watch_server() -> Iterator[Callable[..., WatchServer]]:
    made: list[WatchServer] = []

    def make(plan: list[list[bytes]]) -> WatchServer:
        w = WatchServer(plan)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


def _frame(index: int) -> bytes:
    return DataFrameProto(index=index, data=b"x").SerializeToString()


def test_sync_watcher_reconnects_after_an_undecodable_frame(watch_server: Any) -> None:
    w = watch_server([[b"\xff\xff\xff"], [_frame(7)]])
    q = QueueClient(f"127.0.0.1:{w.port}", "q")
    q.init()
    watcher = q.watch(0, 1)
    got = []
    for df in watcher.run():
        got.append(df.index)
        break
    watcher.close()
    q.close()
    assert got == [7] and watcher.reconnects == 1 and w.connections == 2


async def test_async_watcher_reconnects_after_an_undecodable_frame(watch_server: Any) -> None:
    w = watch_server([[b"\xff\xff\xff"], [_frame(7)]])
    q = AsyncQueueClient(f"127.0.0.1:{w.port}", "q")
    q.init()
    watcher = q.watch(0, 1)
    gen = watcher.run()
    df = await asyncio.wait_for(gen.__anext__(), 10)
    await gen.aclose()
    await q.close()
    assert df.index == 7 and watcher.reconnects == 1 and w.connections == 2


def test_sync_client_runs_one_watcher_at_a_time(watch_server: Any) -> None:
    w = watch_server([[_frame(1)], [_frame(2)], [_frame(3)]])
    q = QueueClient(f"127.0.0.1:{w.port}", "q")
    q.init()
    first = q.watch(0, 1)
    gen = first.run()
    assert next(gen).index == 1
    second = q.watch(0, 1)
    with pytest.raises(PredictException) as info:
        next(second.run())
    assert info.value.code == 400 and "Another watcher is already running" in str(info.value)
    with pytest.raises(PredictException):
        next(first.run())  # the same watcher twice at once
    first.close()  # closing is enough: its run() need not have wound down yet
    third = q.watch(0, 1)
    gen3 = third.run()
    assert next(gen3).index == 2
    gen.close()  # the first watcher's late clean-up leaves the third one's claim alone
    with pytest.raises(PredictException):
        next(q.watch(0, 1).run())
    gen3.close()  # a run that ends frees the client too
    gen4 = q.watch(0, 1).run()
    assert next(gen4).index == 3
    gen4.close()
    q.close()
    assert w.connections == 3  # a refused watcher never connects


async def test_async_client_runs_one_watcher_at_a_time(watch_server: Any) -> None:
    w = watch_server([[_frame(1)], [_frame(2)], [_frame(3)]])
    q = AsyncQueueClient(f"127.0.0.1:{w.port}", "q")
    q.init()
    first = q.watch(0, 1)
    gen = first.run()
    assert (await asyncio.wait_for(gen.__anext__(), 10)).index == 1
    second = q.watch(0, 1)
    with pytest.raises(PredictException) as info:
        await second.run().__anext__()
    assert info.value.code == 400 and "Another watcher is already running" in str(info.value)
    with pytest.raises(PredictException):
        await first.run().__anext__()  # the same watcher twice at once
    await first.close()  # closing is enough: its run() need not have wound down yet
    third = q.watch(0, 1)
    gen3 = third.run()
    assert (await asyncio.wait_for(gen3.__anext__(), 10)).index == 2
    await gen.aclose()  # the first watcher's late clean-up leaves the third one's claim alone
    with pytest.raises(PredictException):
        await q.watch(0, 1).run().__anext__()
    await gen3.aclose()  # a run that ends frees the client too
    gen4 = q.watch(0, 1).run()
    assert (await asyncio.wait_for(gen4.__anext__(), 10)).index == 3
    await gen4.aclose()
    await q.close()
    assert w.connections == 3  # a refused watcher never connects


class RecordingClaim:
    """A client's watcher slot as a watcher sees it: asked to claim, told to release."""

    def __init__(self, grant: bool) -> None:
        self.grant = grant
        self.calls: list[tuple[str, object]] = []

    def claim(self, watcher: object) -> bool:
        self.calls.append(("claim", watcher))
        return self.grant

    def release(self, watcher: object) -> None:
        self.calls.append(("release", watcher))


_SETTINGS = WatchSettings(open_timeout=5.0, ping_interval=None, ping_timeout=None)


def _ws_url(w: WatchServer) -> str:
    return f"ws://127.0.0.1:{w.port}/"


def test_a_watcher_needs_no_client_only_settings_and_a_claim(watch_server: Any) -> None:
    w = watch_server([[_frame(4)]])
    claim = RecordingClaim(grant=True)
    watcher = Watcher(_ws_url(w), {}, settings=_SETTINGS, claim=claim)
    gen = watcher.run()
    assert next(gen).index == 4
    watcher.close()
    assert claim.calls == [("claim", watcher), ("release", watcher)]
    gen.close()
    refused = Watcher(_ws_url(w), {}, settings=_SETTINGS, claim=RecordingClaim(grant=False))
    with pytest.raises(PredictException) as info:
        next(refused.run())
    assert info.value.code == 400 and w.connections == 1


async def test_an_async_watcher_needs_no_client_only_settings_and_a_claim(watch_server: Any) -> None:
    w = watch_server([[_frame(4)]])
    claim = RecordingClaim(grant=True)
    watcher = AsyncWatcher(_ws_url(w), {}, settings=_SETTINGS, claim=claim)
    gen = watcher.run()
    assert (await asyncio.wait_for(gen.__anext__(), 10)).index == 4
    await watcher.close()
    assert claim.calls == [("claim", watcher), ("release", watcher)]
    await gen.aclose()
    refused = AsyncWatcher(_ws_url(w), {}, settings=_SETTINGS, claim=RecordingClaim(grant=False))
    with pytest.raises(PredictException) as info:
        await refused.run().__anext__()
    assert info.value.code == 400 and w.connections == 1


@pytest.mark.parametrize("kind", [QueueClient, AsyncQueueClient])
async def test_a_watch_takes_the_clients_settings_when_it_is_made(kind: type[Any]) -> None:
    logger = logging.getLogger("test.watch")
    q = kind("127.0.0.1:1", "q", ca_certs="/ca.pem")
    q.set_timeout(200)
    q.set_logger(logger)
    q.ping_interval, q.ping_timeout = 0.5, 0.25
    watcher = q.watch(0, 1)
    q.ping_interval = 9.0  # a later change is for the next watch
    assert watcher.settings == WatchSettings(
        open_timeout=1.0,  # the handshake gets at least 1 s, however short the call timeout
        ping_interval=0.5,
        ping_timeout=0.25,
        ca_certs="/ca.pem",
        logger=logger,
    )
    closed = q.close()
    if asyncio.iscoroutine(closed):
        await closed
