"""Clients that hang up at random moments neither undo nor double what the queue stores.

A real gateway process over a real store (SQLite in its data directory, or a real
redis-server), with the lean front on (the default) and off (``queue_fast_path: false``),
takes puts, deletes, commits and watches from clients that hang up at a random moment
(HTTP/1.0 and HTTP/1.1, a plain close or a reset), among ordinary calls with request ids.
Every call that was cut is made again with the same request id (or the same indexes), then
the gateway is killed and started again on the same data. Then:

* what the gateway showed before the kill is what the store holds after it;
* every acknowledged put is there exactly once, under the index it was answered with;
* no request id is stored twice;
* nothing is gone that no delete or commit asked for, and everything they asked for is;
* every ordinary call got its answer, whatever the cut calls beside it did.

The moments are random (seeded) and every wait is bounded by a deadline; nothing here
measures time.
"""

from __future__ import annotations

import base64
import http.client
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from eas_sdk._core import constants as C
from eas_sdk._proto.queue_pb2 import DataFrameListProto, DataFrameProto

from .server_proc import TOKEN, GatewayServer, wait_serving

pytestmark = pytest.mark.fault

SEED = 20240611
NAME = "cuts"
PATH = f"/api/predict/{NAME}"
REDIS_DB = 8
THREADS = 8
ANSWER_DEADLINE_S = 10.0  # an ordinary call not answered by then counts as unanswered
# What each run does: records put first for the deletes, commits and watches to work on,
# then the mixed calls (counts of each kind).
POOL = 40
CUT_PUTS = 160
PAIRS = 40
PLAIN_PUTS = 120
WATCHES = 24


# ---------------------------------------------------------------------- the wire


@dataclass(frozen=True)
class Cut:
    """How a client hangs up: its HTTP version, a reset or a plain close, and how long it
    waits for the answer first (0: it hangs up as soon as the request is sent)."""

    version: str
    rst: bool
    wait_s: float

    @classmethod
    def draw(cls, rng: random.Random, version: str | None = None) -> Cut:
        wait = 0.0 if rng.random() < 0.5 else rng.uniform(0.0, 0.003)
        return cls(version or rng.choice(("1.0", "1.1")), rng.random() < 0.5, wait)


def raw_request(method: str, target: str, version: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [
        f"{method} {target} HTTP/{version}",
        "Host: 127.0.0.1",
        f"Authorization: {TOKEN}",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def hang_up(s: socket.socket, rst: bool) -> None:
    if rst:  # SO_LINGER 0: close() sends a reset instead of a FIN
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def read_answer(s: socket.socket, wait_s: float) -> tuple[int, dict[str, str], bytes] | None:
    """The whole answer if it arrives within ``wait_s``, else None."""
    deadline = time.monotonic() + wait_s
    buf = b""
    while True:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep:
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
            length = int(headers.get("content-length", "0"))
            if len(rest) >= length:
                return int(status_line.split()[1]), headers, rest[:length]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        s.settimeout(remaining)
        try:
            chunk = s.recv(65536)
        except OSError:  # the deadline passed (a timeout is an OSError), or the server left
            return None
        if not chunk:
            return None
        buf += chunk


def cut_call(port: int, raw: bytes, cut: Cut) -> tuple[int, dict[str, str], bytes] | None:
    """Send a whole request, wait for its answer at most ``cut.wait_s``, hang up -> the
    answer if it came whole in time."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(raw)
        return read_answer(s, cut.wait_s) if cut.wait_s > 0 else None
    finally:
        hang_up(s, cut.rst)


def call(
    port: int, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """An ordinary call -> (status, headers, body); status 0 when no answer came."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_DEADLINE_S)
    try:
        conn.request(method, target, body=body, headers={"Authorization": TOKEN, **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (OSError, http.client.HTTPException) as exc:
        return 0, {}, repr(exc).encode()
    finally:
        conn.close()


def ws_frames(s: socket.socket, buf: bytearray) -> Iterator[tuple[int, bytes]]:
    """The whole server frames (opcode, payload) at the front of ``buf``, taken out of it."""
    while len(buf) >= 2:
        n, at = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return
            n, at = struct.unpack(">H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                return
            n, at = struct.unpack(">Q", buf[2:10])[0], 10
        if len(buf) < at + n:
            return
        yield buf[0] & 0x0F, bytes(buf[at : at + n])
        del buf[: at + n]


# ---------------------------------------------------------------------- the run


@dataclass
class Ledger:
    """What the clients were told and asked for."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[str, int] = field(default_factory=dict)  # request id -> the index an answer named
    removed: set[int] = field(default_factory=set)  # indexes a delete or commit asked to remove
    retries: list[Callable[[], None]] = field(default_factory=list)  # the cut calls, made again
    problems: list[str] = field(default_factory=list)  # ordinary calls not answered as due
    cuts: Counter[str] = field(default_factory=Counter)
    how: dict[str, str] = field(default_factory=dict)  # request id -> how its put was cut

    def ack(self, rid: str, idx: int, how: str) -> None:
        with self.lock:
            known = self.acked.setdefault(rid, idx)
        if known != idx:
            self.problem(f"{how}: request id {rid} answered {idx}, earlier {known}")

    def problem(self, what: str) -> None:
        with self.lock:
            self.problems.append(what)


class Run:
    def __init__(self, port: int, rng: random.Random) -> None:
        self.port = port
        self.rng = rng
        self.ledger = Ledger()
        self._rid = 0

    def rid(self) -> str:
        self._rid += 1
        return f"rid-{self._rid:05d}"

    # ---------------------------------------------------------------- calls
    def put(self, rid: str, tags: str = "", how: str = "put") -> int | None:
        status, headers, body = call(
            self.port, "POST", PATH + tags, {C.HEADER_REQUEST_ID: rid}, b"x" + rid.encode()
        )
        if status != 200 or headers.get(C.HEADER_QUEUE_REQUEST_ID.lower()) != rid:
            self.ledger.problem(f"{how} {rid}: {status} {body[:120]!r}")
            return None
        idx = int(body)
        self.ledger.ack(rid, idx, how)
        return idx

    def ok(self, method: str, query: str, gid: str, how: str) -> None:
        status, _, body = call(self.port, method, f"{PATH}?{query}", {C.HEADER_QUEUE_GID: gid})
        if status != 200:
            self.ledger.problem(f"{how} {query}: {status} {body[:120]!r}")

    def put_cut(self, rid: str, cut: Cut) -> None:
        raw = raw_request("POST", PATH, cut.version, {C.HEADER_REQUEST_ID: rid}, b"x" + rid.encode())
        answer = cut_call(self.port, raw, cut)
        self._count("put", cut, rid)
        if answer is not None and answer[0] == 200:
            self.ledger.ack(rid, int(answer[2]), "cut put")
        self._retry(lambda: self.put(rid, how="retried put"))

    def pair(self, rid: str, cut: Cut) -> None:
        """A put that is cut and an ordinary put with the same request id, sent while the
        first may still be in flight: the ordinary one is answered whatever the first did."""
        raw = raw_request("POST", PATH, cut.version, {C.HEADER_REQUEST_ID: rid}, b"x" + rid.encode())
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ANSWER_DEADLINE_S)
        try:
            s.sendall(raw)
            conn.request(
                "POST",
                PATH,
                body=b"x" + rid.encode(),
                headers={"Authorization": TOKEN, C.HEADER_REQUEST_ID: rid},
            )
            if cut.wait_s > 0:
                read_answer(s, cut.wait_s)
            hang_up(s, cut.rst)
            self._count("pair", cut, rid)
            try:
                r = conn.getresponse()
                status, body = r.status, r.read()
            except (OSError, http.client.HTTPException) as exc:
                status, body = 0, repr(exc).encode()
        finally:
            s.close()
            conn.close()
        if status == 200:
            self.ledger.ack(rid, int(body), "put beside a cut one")
        else:
            self.ledger.problem(f"put beside a cut one {rid}: {status} {body[:120]!r}")
        self._retry(lambda: self.put(rid, how="retried put"))

    def remove_cut(self, method: str, idx: int, gid: str, cut: Cut) -> None:
        """A delete (DELETE) or commit (PUT) of one index, cut."""
        query = f"{C.Q_INDEXES}={idx}"
        raw = raw_request(method, f"{PATH}?{query}", cut.version, {C.HEADER_QUEUE_GID: gid})
        with self.ledger.lock:
            self.ledger.removed.add(idx)
        cut_call(self.port, raw, cut)
        self._count("delete" if method == "DELETE" else "commit", cut)
        self._retry(lambda: self.ok(method, query, gid, f"retried {method}"))

    def watch(self, uid: str, rng: random.Random) -> None:
        """A watcher of group ``w`` (records tagged w=1) with a window of 1 to 4 that reads
        what arrives within a random time (or hangs up right after its handshake is sent)
        and commits up to two of those records (some by calls that are cut), before or
        after it hangs up."""
        window, rst, commits = rng.randint(1, 4), rng.random() < 0.5, rng.randint(0, 2)
        wait_s = 0.0 if rng.random() < 0.25 else rng.uniform(0.0, 0.05)
        commit_first = rng.random() < 0.5
        key = base64.b64encode(os.urandom(16)).decode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        delivered: list[int] = []
        try:
            s.sendall(
                (
                    f"GET {PATH}?{C.Q_WATCH}=true&{C.Q_WINDOW}={window}&w=1 HTTP/1.1\r\n"
                    "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                    f"Authorization: {TOKEN}\r\n"
                    f"{C.HEADER_QUEUE_UID}: {uid}\r\n{C.HEADER_QUEUE_GID}: w\r\n\r\n"
                ).encode()
            )
            deadline = time.monotonic() + wait_s
            buf = bytearray()
            upgraded = False
            while len(delivered) < window and (remaining := deadline - time.monotonic()) > 0:
                s.settimeout(remaining)
                try:
                    chunk = s.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
                if not upgraded:
                    head, sep, rest = bytes(buf).partition(b"\r\n\r\n")
                    if not sep:
                        continue
                    assert head.startswith(b"HTTP/1.1 101"), head[:200]
                    upgraded, buf = True, bytearray(rest)
                for opcode, payload in ws_frames(s, buf):
                    if opcode == 0x2:
                        df = DataFrameProto()
                        df.ParseFromString(payload)
                        delivered.append(df.index)
            chosen = rng.sample(delivered, min(commits, len(delivered)))
            if commit_first:
                self._commit_some(chosen, rng)
        finally:
            hang_up(s, rst)
        self._count("watch", Cut("1.1", rst, wait_s))
        if not commit_first:
            self._commit_some(chosen, rng)

    def _commit_some(self, idxs: list[int], rng: random.Random) -> None:
        for idx in idxs:
            if rng.random() < 0.5:
                self.remove_cut("PUT", idx, "w", Cut.draw(rng))
            else:
                with self.ledger.lock:
                    self.ledger.removed.add(idx)
                self.ok("PUT", f"{C.Q_INDEXES}={idx}", "w", "commit")

    def _retry(self, again: Callable[[], None]) -> None:
        with self.ledger.lock:
            self.ledger.retries.append(again)

    def _count(self, kind: str, cut: Cut, rid: str | None = None) -> None:
        label = f"{kind} HTTP/{cut.version} {'reset' if cut.rst else 'close'}"
        with self.ledger.lock:
            self.ledger.cuts[label] += 1
            if rid is not None:
                self.ledger.how[rid] = label

    # ---------------------------------------------------------------- phases
    def records(self) -> list[tuple[int, str]]:
        """Every record the gateway shows: (index, request id), in index order."""
        status, _, body = call(
            self.port, "GET", f"{PATH}?{C.Q_INDEX}=0&{C.Q_LENGTH}=10000&{C.Q_AUTO_DELETE}=false"
        )
        assert status == 200, body[:300]
        out = DataFrameListProto()
        out.ParseFromString(body)
        return [(df.index, df.tags[C.TAG_REQUEST_ID]) for df in out.index]

    def run(self) -> None:
        rng = self.rng
        # Records the deletes, the commits (read first: a commit outside any group removes
        # a record a get returned) and the watchers work on.
        doomed = [i for _ in range(POOL) if (i := self.put(self.rid(), "?kind=del")) is not None]
        read = [i for _ in range(POOL) if (i := self.put(self.rid(), "?kind=com")) is not None]
        for _ in range(POOL):
            self.put(self.rid(), "?w=1")
        status, _, _ = call(
            self.port, "GET", f"{PATH}?{C.Q_INDEX}=0&{C.Q_LENGTH}=1000&{C.Q_AUTO_DELETE}=false&kind=com"
        )
        assert status == 200
        ops: list[Callable[[], None]] = []
        ops += [partial(self.put_cut, self.rid(), Cut.draw(rng)) for _ in range(CUT_PUTS)]
        ops += [partial(self.pair, self.rid(), Cut.draw(rng)) for _ in range(PAIRS)]
        ops += [partial(self.put, self.rid()) for _ in range(PLAIN_PUTS)]
        ops += [partial(self.remove_cut, "DELETE", i, "", Cut.draw(rng)) for i in doomed]
        ops += [partial(self.remove_cut, "PUT", i, "c", Cut.draw(rng)) for i in read]
        # Each watcher draws its moments from a generator of its own: the threads run in any order.
        ops += [partial(self.watch, f"u{n}", random.Random(rng.random())) for n in range(WATCHES)]
        rng.shuffle(ops)
        with ThreadPoolExecutor(THREADS) as pool:
            for f in [pool.submit(op) for op in ops]:
                f.result()
            for f in [pool.submit(again) for again in self.ledger.retries]:
                f.result()


def compare(shown: list[tuple[int, str]], stored: list[tuple[int, str]], ledger: Ledger) -> list[str]:
    """What is wrong, one line per kind of fault with its count and a few examples."""
    faults: list[str] = []

    def fault(what: str, items: list[Any]) -> None:
        if items:
            faults.append(f"{len(items)} {what}: {sorted(items)[:8]}")

    fault("records shown before the restart differ from the store after it", sorted(set(shown) ^ set(stored)))
    twice = [rid for rid, n in Counter(rid for _, rid in stored).items() if n > 1]
    fault("request ids stored more than once", twice)
    if twice:
        faults.append(f"  of them cut: {dict(Counter(ledger.how.get(rid, '-') for rid in twice))}")
    have = dict(stored)  # index -> request id
    at = {rid: idx for idx, rid in stored}
    fault(
        "acknowledged puts missing (or under another index)",
        [rid for rid, idx in ledger.acked.items() if idx not in ledger.removed and at.get(rid) != idx],
    )
    fault("records present that a delete or commit removed", [i for i in ledger.removed if i in have])
    fault("records present that no put was answered for", [rid for rid in at if rid not in ledger.acked])
    fault("ordinary calls not answered as due", ledger.problems)
    return faults


def _config(data: Path, queue: dict[str, Any], fast: bool) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0, "data_dir": str(data), "queue_fast_path": fast},
        "services": [{"name": NAME, "processor": "queue", "token": TOKEN, "queue": queue}],
    }


@pytest.mark.parametrize("fast", [True, False], ids=["lean-front", "aiohttp-only"])
@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_clients_hanging_up_at_random_moments_change_nothing_they_should_not(
    tmp_path: Path, request: pytest.FixtureRequest, store: str, fast: bool
) -> None:
    queue: dict[str, Any] = {}
    if store == "redis":
        redis_server = request.getfixturevalue("redis_server")
        with redis_server.client(REDIS_DB) as c:
            c.flushdb()
        # A short owner lease: the gateway started after the kill serves the queue soon.
        queue = {"backend": redis_server.url(REDIS_DB), "owner_lease_s": 1.0}
    server = GatewayServer.start(_config(tmp_path / "data", queue, fast), tmp_path)
    try:
        wait_serving(server.port, NAME)
        run = Run(server.port, random.Random(f"{SEED}-{store}-{fast}"))
        run.run()
        shown = run.records()
        server.kill()
        server = server.restart()
        wait_serving(server.port, NAME)
        stored = Run(server.port, random.Random(0)).records()
    finally:
        server.kill()
    faults = compare(shown, stored, run.ledger)
    cuts = ", ".join(f"{k}: {n}" for k, n in sorted(run.ledger.cuts.items()))
    assert not faults, f"{len(run.ledger.acked)} puts acknowledged; cut calls: {cuts}\n" + "\n".join(faults)
