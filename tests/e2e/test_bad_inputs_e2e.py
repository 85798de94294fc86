"""Bad inputs and hostile clients against the real gateway and workers.

Each case gets its documented status with a JSON error and no traceback; afterwards the
gateway and worker pids are unchanged and the next valid call succeeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from eas_sdk._core.auth import signed_headers
from eas_sdk._proto import tf_predict_pb2 as tfpb
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess

TOKEN = "e2e-bad-input-token-81d0c6a2b94f"
DT_FLOAT, DT_INT64 = 1, 9


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    config = {
        "gateway": {"max_body_bytes": 1 << 20, "body_timeout_s": 2.0, "header_timeout_s": 2.0},
        "services": [
            {"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN, "workers": 2},
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1},
        ],
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("gw-bad"))
    try:
        proc.wait_workers_ready("digits", 2)
        yield proc
    finally:
        proc.kill()


def tf_body(
    shape: list[int], values: list[float] | list[int], dtype: int = DT_FLOAT, name: str = "input"
) -> bytes:
    req = tfpb.PredictRequest(signature_name="serving_default")
    arr = req.inputs[name]
    arr.dtype = dtype
    arr.array_shape.dim.extend(shape)
    if dtype == DT_INT64:
        arr.int64_val.extend(int(v) for v in values)
    else:
        arr.float_val.extend(float(v) for v in values)
    return req.SerializeToString()


VALID = tf_body([1, 64], [0.5] * 64)


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def post(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, bytes]:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    raw = raw_exchange(port, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    status_line, _, rest = raw.partition(b"\r\n")
    headers_raw, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), payload, headers_raw


def signed(body: bytes, service: str = "digits") -> dict[str, str]:
    return signed_headers(TOKEN, body, service)


def pids(gw: GatewayProcess) -> dict[str, list[int]]:
    services = gw.services()
    return {name: sorted(w["pid"] for w in s["workers"]) for name, s in services.items()}


def assert_healthy(gw: GatewayProcess, before: dict[str, list[int]]) -> None:
    assert gw.proc.poll() is None, "gateway died"
    assert gw.get_json("/api/services")[1]["gateway"]["pid"] == gw.pid
    assert pids(gw) == before, "a worker was replaced"
    status, _, _ = post(gw.port, "/api/predict/digits", VALID, signed(VALID))
    assert status == 200
    status, body, _ = post(gw.port, "/api/predict/echo", b"ok")
    assert (status, body) == (200, b"ok")


def assert_json_error(body: bytes, code: str | None = None) -> dict[str, str]:
    assert b"Traceback" not in body
    err = json.loads(body)
    assert set(err) == {"code", "message", "request_id"}
    if code is not None:
        assert err["code"] == code
    return err


CASES = [
    ("random bytes", os.urandom(256), 400),
    ("truncated protobuf", VALID[: len(VALID) // 2], 400),
    ("wrong dtype", tf_body([1, 64], [1] * 64, DT_INT64), 400),
    ("wrong rank", tf_body([64], [0.5] * 64), 400),
    ("wrong width", tf_body([1, 63], [0.5] * 63), 400),
    ("shape/values mismatch", tf_body([2, 64], [0.5] * 10), 400),
    ("overflowing shape", tf_body([1 << 31, 1 << 31], [0.5] * 4), 400),
    ("unknown input", tf_body([1, 64], [0.5] * 64, name="nope"), 400),
    ("empty body", b"", 400),
]


@pytest.mark.parametrize(("label", "body", "status"), CASES, ids=[c[0] for c in CASES])
def test_bad_tensor_bodies(gw: GatewayProcess, label: str, body: bytes, status: int) -> None:
    before = pids(gw)
    got, payload, _ = post(gw.port, "/api/predict/digits", body, signed(body))
    assert got == status, (label, payload[:200])
    assert_json_error(payload)
    assert_healthy(gw, before)


def test_processor_that_raises_keeps_its_worker(gw: GatewayProcess) -> None:
    before = pids(gw)
    for _ in range(3):
        status, payload, _ = post(gw.port, "/api/predict/echo", b"raise:model exploded")
        assert status == 400
        assert "model exploded" in assert_json_error(payload)["message"]
    assert_healthy(gw, before)


def test_oversize_body_is_413_before_reading(gw: GatewayProcess) -> None:
    before = pids(gw)
    head = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"
    raw = raw_exchange(gw.port, head + b"x" * 1024)
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
    assert_json_error(raw.partition(b"\r\n\r\n")[2], "PayloadTooLarge")
    assert_healthy(gw, before)


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/predict/nope", 404, "ServiceNotFound"),
        ("/api/predict/..%2F..%2Fetc%2Fpasswd", 400, "InvalidServiceName"),
        ("/api/predict/%2e%2e", 400, "InvalidServiceName"),
        ("/api/predict/echo%00", 400, "InvalidServiceName"),
        ("/api/predict/echo%0d%0aX-Injected:%201", 400, "InvalidServiceName"),
        ("/api/predict/" + "e" * 65, 400, "InvalidServiceName"),
        ("/api/predict/%C3%A9cho", 400, "InvalidServiceName"),
    ],
)
def test_unknown_and_hostile_service_names(gw: GatewayProcess, path: str, status: int, code: str) -> None:
    before = pids(gw)
    got, payload, headers = post(gw.port, path, b"x")
    assert got == status
    assert_json_error(payload, code)
    assert b"X-Injected" not in headers
    assert_healthy(gw, before)


@pytest.mark.parametrize(
    "auth",
    [b"", b"EAS", b"EAS ", b"EAS  x", b"EAS !!!", b"EAS " + b"A" * 28, b"\xff\xfe\xc3\xa9",
     b"EAS \xc3\xa9\xff", b"x" * 8000, TOKEN.encode() + b"x", b" " + TOKEN.encode()[:-1]],
)  # fmt: skip
def test_garbage_authorization_headers(gw: GatewayProcess, auth: bytes) -> None:
    before = pids(gw)
    data = (
        b"POST /api/predict/digits HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Authorization: " + auth + b"\r\nContent-Length: %d\r\n\r\n" % len(VALID) + VALID
    )  # fmt: skip
    raw = raw_exchange(gw.port, data)
    assert raw.startswith(b"HTTP/1.1 401"), raw[:200]
    assert_json_error(raw.partition(b"\r\n\r\n")[2], "Unauthorized")
    assert_healthy(gw, before)


def test_signed_then_tampered_body_is_bad_digest(gw: GatewayProcess) -> None:
    before = pids(gw)
    status, payload, _ = post(gw.port, "/api/predict/digits", tf_body([1, 64], [0.1] * 64), signed(VALID))
    assert status == 400
    assert_json_error(payload, "BadDigest")
    assert_healthy(gw, before)


def test_wrong_method(gw: GatewayProcess) -> None:
    raw = raw_exchange(gw.port, b"GET /api/predict/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 405")
    assert b"\r\nAllow: POST\r\n" in raw


async def test_slowloris_is_cut_and_others_served(gw: GatewayProcess) -> None:
    before = pids(gw)
    conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]
    for _, w in conns:
        w.write(b"POST /api/predict/ec")
        await w.drain()
    # While they hang, normal calls work.
    status, _, _ = await asyncio.to_thread(post, gw.port, "/api/predict/echo", b"live")
    assert status == 200
    for r, w in conns:
        assert await asyncio.wait_for(r.read(), 10.0) == b""  # closed by the header deadline
        w.close()
    assert_healthy(gw, before)


async def test_slow_body_is_408_within_the_body_timeout_on_gateway_and_worker(gw: GatewayProcess) -> None:
    """A body that trickles in, with body_timeout_s = 2: the 408 comes one body timeout after the head, on the
    gateway's port and on a worker's direct port alike, and the connection closes."""
    before = pids(gw)
    worker_port = gw.services()["echo"]["workers"][0]["http_port"]

    async def slow(port: int) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            t0 = asyncio.get_running_loop().time()
            writer.write(b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            line = await asyncio.wait_for(reader.readline(), 10.0)
            elapsed = asyncio.get_running_loop().time() - t0
            rest = await asyncio.wait_for(reader.read(), 10.0)  # until it closes
        finally:
            writer.close()
        assert line.startswith(b"HTTP/1.1 408"), line
        assert_json_error(rest.partition(b"\r\n\r\n")[2], "RequestTimeout")
        return elapsed

    for elapsed in await asyncio.gather(slow(gw.port), slow(worker_port)):
        # After one body timeout (a timer never fires early), and before a second one would
        # have run out: a whole body timeout of slack for a loaded machine.
        assert 1.9 < elapsed < 4.0, elapsed
    assert_healthy(gw, before)
