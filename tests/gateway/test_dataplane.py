"""The dataplane on its own: its entry calls, each refusal in the core's order, and the one
error table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from eas_sdk._core.auth import signed_headers
from eas_sdk._core.constants import HEADER_QUEUE_UID
from eas_sdk.codecs.eas import encode_tf_response
from gateway.codecs.errors import eas_body
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.admission import Admission, AdmissionLimits
from gateway.core.calls import (
    RESPONSE_FORMAT_HEADER,
    TensorRequest,
    TensorResponse,
    WorkerRequest,
    WorkerResponse,
)
from gateway.core.dataplane import JSON_FORM_HEADERS, DataPlane
from tests.gateway.doubles import BackendDouble, double_service

TOKEN = "dataplane-token"


@dataclass
class Backend(BackendDouble):
    fail: BaseException | None = None
    calls: list[tuple[WorkerRequest, float]] = field(default_factory=list)
    service: ServiceConfig = field(default_factory=double_service)

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        self.calls.append((req, timeout))
        if self.fail is not None:
            raise self.fail
        return WorkerResponse(200, b"out:" + req.body, "text/plain", compute_us=7)


@dataclass
class Observer:
    seen: list[tuple[str, float, int]] = field(default_factory=list)
    failed: list[tuple[str, int]] = field(default_factory=list)

    def observe_dispatch(
        self, svc: ServiceConfig, status: int, seconds: float, compute_us: int, body: bytes
    ) -> None:
        self.seen.append((svc.name, seconds, compute_us))

    def observe_failure(self, svc: ServiceConfig, error: errors.GatewayError, seconds: float) -> None:
        self.failed.append((svc.name, error.status))


def _svc(name: str = "m", token: str | None = TOKEN) -> ServiceConfig:
    return ServiceConfig(name=name, processor="python", entry="x.py:X", token=token)


def _plane(backend: Backend | None = None, **kw: Any) -> tuple[DataPlane, Backend]:
    backend = backend or Backend()
    svcs = [_svc(), _svc("open", token=None), _svc("queue_only")]
    return DataPlane(svcs, {"m": backend, "open": backend}, **kw), backend


def test_find_checks_the_raw_name_then_existence() -> None:
    plane, _ = _plane()
    assert plane.find("m").name == "m"
    for bad in ("..%2Fm", "m%00", "", "a b", "é"):
        with pytest.raises(errors.InvalidServiceName):
            plane.find(bad)
    with pytest.raises(errors.ServiceNotFound):
        plane.find("nope")
    # A service without workers (a plain queue) is not a model.
    assert plane.find("queue_only").name == "queue_only"
    with pytest.raises(errors.ServiceNotFound):
        plane.find_model("queue_only")


def test_authorize_raw_token_and_refusals() -> None:
    plane, _ = _plane()
    svc = plane.find("m")
    plane.authorize(svc, {"Authorization": TOKEN}, "/api/predict/m", b"x")
    plane.authorize(svc, {"Authorization": f"Bearer {TOKEN}"}, "/api/predict/m", b"x")
    plane.authorize(svc, {"Authorization": f"bearer {TOKEN}"}, "/api/predict/m", b"x")
    for headers in ({"Authorization": "Bearer wrong"}, {}, {"Authorization": "wrong"}):
        with pytest.raises(errors.Unauthorized, match="invalid or missing token"):
            plane.authorize(svc, headers, "/api/predict/m", b"x")
    # An open service asks nothing.
    plane.authorize(plane.find("open"), {}, "/api/predict/open")


def test_signature_and_bad_digest() -> None:
    plane, _ = _plane()
    svc = plane.find("m")
    body = b"payload"
    plane.authorize(svc, signed_headers(TOKEN, body, "m"), "/api/predict/m", body)
    with pytest.raises(errors.BadDigest):  # signed, but for another body
        plane.authorize(svc, signed_headers(TOKEN, b"other", "m"), "/api/predict/m", body)
    with pytest.raises(errors.Unauthorized):  # signed for another service's path
        plane.authorize(svc, signed_headers(TOKEN, body, "x"), "/api/predict/m", body)
    with pytest.raises(errors.Unauthorized):  # signed with another token
        plane.authorize(svc, signed_headers("other", body, "m"), "/api/predict/m", body)


@dataclass
class Reader:
    """A body the transport still receives (the dataplane's BodyReader), counting reads."""

    body: bytes = b"in"
    arriving: bool = True
    hold_bytes: int = 10
    empty: bool = False
    fail: errors.GatewayError | None = None
    reads: int = 0

    async def read(self) -> bytes:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.body


@dataclass
class Call:
    """A predict call that every step refuses until the test repairs it, step by step."""

    service: str = "bad name"
    headers: dict[str, str] = field(
        default_factory=lambda: {HEADER_QUEUE_UID: "u", "X-Eas-Deadline-Ms": "soon"}
    )
    method: str = "GET"
    subpath: str = "a\tb"
    reader: Reader = field(
        default_factory=lambda: Reader(hold_bytes=1000, fail=errors.RequestTimeout("body late"))
    )
    arrived: float = 0.0


async def test_predict_call_refuses_in_the_cores_order() -> None:
    """Every step of an EAS predict refuses a call broken in every way, in the core's one
    order; repairing each lets the next one speak. The body is never read before the early
    refusal, the hold and the deadline; a held body is always given back."""
    admission = Admission(AdmissionLimits(max_buffered_bytes=100))
    backend = Backend(fail=errors.ServiceNotReady("no worker"))
    svcs = [_svc(), _svc("open", token=None)]
    plane = DataPlane(svcs, {"m": backend, "open": backend}, admission=admission, max_response_bytes=5)
    call = Call()

    async def refused() -> errors.GatewayError:
        with pytest.raises(errors.GatewayError) as info:
            await plane.predict_call(
                call.service, call.headers, "/api/predict/m", call.reader, method=call.method,
                subpath=call.subpath, request_id="r", arrived=call.arrived or time.monotonic(),
            )  # fmt: skip
        assert admission.buffered == 0  # nothing stays held, whichever step refused
        return info.value

    def repair(step: str) -> None:
        if step == "name":
            call.service = "nope"
        elif step == "service":
            call.service = "m"
        elif step == "kind":
            del call.headers[HEADER_QUEUE_UID]
        elif step == "method":
            call.method = "POST"
        elif step == "subpath":
            call.subpath = "sub"
        elif step == "no token":
            call.headers["Authorization"] = "wrong"
        elif step == "wrong token while arriving":
            call.reader.arriving = False  # the body is in: the token is looked at once, after it
        elif step == "deadline header":
            call.headers["X-Eas-Deadline-Ms"] = "3"
        elif step == "deadline passed":
            call.headers["X-Eas-Deadline-Ms"] = "50"
        elif step == "read":
            call.reader.fail = None
        elif step == "token":
            call.headers["Authorization"] = TOKEN
            call.arrived = time.monotonic() - 1.0  # the upload took longer than the deadline
        elif step == "budget":
            del call.headers["X-Eas-Deadline-Ms"]
            call.arrived = 0.0
        elif step == "dispatch":
            backend.fail = None  # answers b"out:in": 6 bytes, over the 5 allowed

    order = [
        ("name", errors.InvalidServiceName, 0),
        ("service", errors.ServiceNotFound, 0),
        ("kind", errors.WrongServiceKind, 0),
        ("method", errors.MethodNotAllowed, 0),
        ("subpath", errors.BadRequest, 0),
        ("no token", errors.Unauthorized, 0),
        ("wrong token while arriving", errors.Unauthorized, 0),
    ]
    for step, expected, reads in order:
        err = await refused()
        assert type(err) is expected, (step, err)
        assert call.reader.reads == reads, step
        repair(step)
    # The body is in: nothing to hold, the deadline header speaks next.
    err = await refused()
    assert type(err) is errors.BadRequest and "X-Eas-Deadline-Ms" in err.message
    repair("deadline header")
    assert type(await refused()) is errors.DeadlineExceeded and call.reader.reads == 0
    repair("deadline passed")
    assert type(await refused()) is errors.RequestTimeout and call.reader.reads == 1
    repair("read")
    assert type(await refused()) is errors.Unauthorized and call.reader.reads == 2
    repair("token")
    err = await refused()
    assert type(err) is errors.DeadlineExceeded and "while the body was read" in err.message
    repair("budget")
    assert type(await refused()) is errors.ServiceNotReady
    repair("dispatch")
    assert type(await refused()) is errors.ResponseTooLarge
    plane.max_response_bytes = 0
    resp = await plane.predict_call(
        "m", call.headers, "/api/predict/m", call.reader, request_id="r", arrived=0.0
    )
    assert (resp.status, resp.body) == (200, b"out:in")


async def test_a_body_still_arriving_is_refused_early_and_held() -> None:
    """While a body arrives, a wrong raw token is refused unread, and the body's bytes are
    held against the admission budget (429 past it) until read."""
    admission = Admission(AdmissionLimits(max_buffered_bytes=100))
    plane = DataPlane([_svc()], {"m": Backend()}, admission=admission)

    async def call(headers: dict[str, str], reader: Reader) -> None:
        await plane.predict_call("m", headers, "/api/predict/m", reader, request_id="r", arrived=0.0)

    wrong = Reader()
    with pytest.raises(errors.Unauthorized):
        await call({"Authorization": "wrong"}, wrong)
    assert wrong.reads == 0
    too_big = Reader(hold_bytes=101)
    with pytest.raises(errors.TooManyRequests) as info:
        await call({"Authorization": TOKEN}, too_big)
    assert too_big.reads == 0 and info.value.close and info.value.headers == {"Retry-After": "1"}

    class Watching(Reader):
        async def read(self) -> bytes:
            assert admission.buffered == 60  # held while it is read
            return await super().read()

    await call({"Authorization": TOKEN}, Watching(hold_bytes=60))
    assert admission.buffered == 0
    # A signature covers the body: it waits for it, and counts as unverified meanwhile.
    with pytest.raises(errors.Unauthorized):
        await call({"Authorization": "EAS c2ln"}, Watching(hold_bytes=60))


def test_body_arriving_refuses_early_then_holds() -> None:
    """The lean transport's hook: 401 before the body (no token, a wrong raw token; a
    signature waits for the body), 429 past the admission budget, else a hold."""
    admission = Admission(AdmissionLimits(max_buffered_bytes=100))
    plane = DataPlane([_svc(), _svc("open", token=None)], {}, admission=admission)
    svc = plane.find("m")
    for headers in ({}, {"Authorization": "wrong"}):
        with pytest.raises(errors.Unauthorized):
            plane.body_arriving(svc, headers, 10)
    hold = plane.body_arriving(svc, {"Authorization": TOKEN}, 60)
    signed = plane.body_arriving(svc, {"Authorization": "EAS c2ln"}, 30)
    assert admission.buffered == 90 and admission.unverified == 30
    with pytest.raises(errors.TooManyRequests):
        plane.body_arriving(plane.find("open"), {}, 20)
    hold.release()
    signed.release()
    assert admission.buffered == admission.unverified == 0


async def test_predict_call_with_the_body_in() -> None:
    """The lean front's call: the bytes are in, so nothing is held; no token at all is
    refused before the deadline header is read."""
    observer = Observer()
    plane, backend = _plane(observer=observer)
    headers = {
        "Authorization": TOKEN,
        "Content-Type": "text/plain",
        "X-Custom": "1",
        "Cookie": "c",
        "Date": "d",
    }
    resp = await plane.predict_call(
        plane.find("m"), headers, "/api/predict/m", b"in", subpath="sub", request_id="r1", arrived=0.0
    )
    assert (resp.status, resp.body) == (200, b"out:in")
    req, timeout = backend.calls[0]
    # Credentials and hop-by-hop headers never reach a processor; the rest does.
    assert req.headers == {"Content-Type": "text/plain", "X-Custom": "1"}
    assert (req.subpath, req.request_id, req.content_type) == ("sub", "r1", "text/plain")
    assert req.deadline > 0 and timeout == plane.find("m").timeout_ms / 1000.0  # no caller deadline
    assert observer.seen and observer.seen[0][0] == "m" and observer.seen[0][2] == 7
    with pytest.raises(errors.Unauthorized):
        await plane.predict_call("m", {"X-Eas-Deadline-Ms": "soon"}, "/", b"in", arrived=0.0)
    # The caller's deadline, less what the upload took since the call arrived.
    arrived = time.monotonic()
    headers = {"Authorization": TOKEN, "X-Eas-Deadline-Ms": " 250 "}
    await plane.predict_call("m", headers, "/api/predict/m", b"in", arrived=arrived)
    spent = time.monotonic() - arrived
    assert 0.25 - spent <= backend.calls[-1][1] <= 0.25


async def test_queue_call_checks_the_front_door() -> None:
    """A queue put or get: a PredictClient's call to a plain queue is refused, credentials are
    checked against the queue (the raw token remembered per queue), only a POST's body is read."""
    queue_svc = ServiceConfig(name="q", processor="queue", token=TOKEN)
    plane = DataPlane([queue_svc], {})
    auth = {"Authorization": TOKEN}
    with pytest.raises(errors.WrongServiceKind):
        await plane.queue_call(
            "q", "q", {**auth, "X-Eas-Deadline-Ms": "100"}, "/api/predict/q", b"x", method="POST"
        )
    # On its sink a put is what the dispatcher does: no PredictClient to warn.
    assert await plane.queue_call("q", "q/sink", auth, "/", b"x", method="POST") == b"x"
    with pytest.raises(errors.Unauthorized):
        await plane.queue_call("q", "q", {}, "/api/predict/q", Reader(), method="POST")
    put = Reader(body=b"record", arriving=False)
    assert await plane.queue_call("q", "q", auth, "/api/predict/q", put, method="POST") == b"record"
    get = Reader(arriving=False)
    assert await plane.queue_call("q", "q", auth, "/api/predict/q", get, method="GET") is None
    assert get.reads == 0
    assert ("q", TOKEN) in plane._verified and ("q/sink", TOKEN) in plane._verified


@dataclass
class Tensors(Backend):
    """A backend in the gateway's threads: takes the arrays as they are."""

    takes_tensors: bool = True

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        self.calls.append((req, timeout))
        assert isinstance(req, TensorRequest)
        return TensorResponse(200, b"", arrays={"y": req.inputs["x"] * 2})


async def test_tensors_call_decodes_once_authenticated_and_budgeted() -> None:
    backend = Tensors()
    svcs = [_svc(), _svc("m_v1")]
    plane = DataPlane(svcs, {"m": backend, "m_v1": backend})
    decoded: list[bytes] = []

    async def decode(body: bytes) -> tuple[str, Mapping[str, np.ndarray], Sequence[str]]:
        decoded.append(body)
        return "call", {"x": np.arange(3)}, ["y"]

    with pytest.raises(errors.Unauthorized):
        await plane.tensors_call(
            "m", {"Authorization": "wrong"}, "/", b"{}", decode, request_id="r", arrived=0.0
        )
    with pytest.raises(errors.DeadlineExceeded):  # the transport's own deadline (gRPC)
        await plane.tensors_call(
            "m", {"Authorization": TOKEN}, "", None, decode, request_id="r", arrived=0.0, deadline=0.001
        )
    assert decoded == []
    call, arrays = await plane.tensors_call(
        plane.find("m"), {"Authorization": TOKEN}, "", None, decode, runs=plane.find("m_v1"),
        request_id="r", arrived=time.monotonic(), deadline=2.0,
    )  # fmt: skip
    assert call == "call" and arrays["y"].tolist() == [0, 2, 4] and decoded == [b""]
    req, timeout = backend.calls[0]
    assert req.outputs == ["y"] and timeout <= 2.0


async def test_arrays_call_runs_the_models_json_form() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    plane, _ = _plane(Answering(WorkerResponse(200, encode_tf_response([("y", y)]))))

    async def decode(body: bytes) -> tuple[int, bytes]:
        return len(body), b"{}"

    with pytest.raises(errors.ServiceNotFound):  # not a model: no backend
        await plane.arrays_call("queue_only", {}, "/", b"in", decode, request_id="r", arrived=0.0)
    with pytest.raises(errors.Unauthorized):
        await plane.arrays_call("m", {}, "/", b"in", decode, request_id="r", arrived=0.0)
    call, out = await plane.arrays_call(
        "m", {"Authorization": TOKEN}, "/", Reader(body=b"four", arriving=False), decode,
        request_id="r", arrived=0.0,
    )  # fmt: skip
    assert call == 4
    np.testing.assert_array_equal(out["y"], y)


async def test_record_calls_carry_no_credentials() -> None:
    """A stored record (an async put, a Cluster Serving stream) was admitted when it came in:
    its call only dispatches, within the service's timeout unless told less."""
    plane, backend = _plane()
    resp = await plane.record_call(plane.find("m"), {"Content-Type": "text/plain"}, b"rec", request_id="r")
    assert resp.body == b"out:rec" and backend.calls[-1][1] == plane.find("m").timeout_ms / 1000.0
    await plane.record_call(plane.find("m"), {}, b"rec", timeout=0.5)
    assert backend.calls[-1][1] == 0.5
    y = np.arange(2, dtype=np.float32)
    plane, _ = _plane(Answering(WorkerResponse(200, encode_tf_response([("y", y)]))))
    out = await plane.record_arrays_call(plane.find("m"), b"{}", request_id="r")
    np.testing.assert_array_equal(out["y"], y)


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (errors.TooManyPending("busy"), 450, "TooManyPending"),
        (errors.ServiceNotReady("none"), 503, "ServiceNotReady"),
        (asyncio.TimeoutError(), 504, "UpstreamTimeout"),
        (TimeoutError(), 504, "UpstreamTimeout"),
        (RuntimeError("secret internal detail"), 500, "InternalError"),
    ],
)
async def test_one_error_table(failure: BaseException, status: int, code: str) -> None:
    observer = Observer()
    plane, _ = _plane(Backend(fail=failure), observer=observer)
    with pytest.raises(errors.GatewayError) as info:
        await plane.record_call(plane.find("m"), {}, b"x")
    assert (info.value.status, info.value.code) == (status, code)
    assert "secret" not in info.value.message
    # The observer hears of the failure with the status the client gets (the status page's last error).
    assert observer.failed == [("m", status)] and not observer.seen


async def test_a_processors_error_answer_passes_through_a_record_call() -> None:
    class Failing(Backend):
        async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
            assert req.header("X-Eas-Request-Format") == "json"
            return WorkerResponse(400, eas_body("InvalidInput", "bad shape", "r"), "application/json")

    plane, _ = _plane(Failing())
    resp = await plane.record_call(plane.find("m"), JSON_FORM_HEADERS, b"{}", request_id="r")
    assert resp.status == 400 and errors.message_of(resp.body) == "bad shape"


class Answering(Backend):
    """Answers each call with ``reply`` (checking the adapters' headers first)."""

    def __init__(self, reply: WorkerResponse) -> None:
        super().__init__()
        self.reply = reply

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        assert req.header("X-Eas-Request-Format") == "json"
        assert req.header(RESPONSE_FORMAT_HEADER) == "tf"  # asked for arrays
        return self.reply


async def test_arrays_read_a_tf_answer_in_place_and_a_json_one_within_bounds() -> None:
    async def decode(body: bytes) -> tuple[None, bytes]:
        return None, body

    async def arrays(plane: DataPlane, max_values: int = 0) -> dict[str, np.ndarray]:
        _, out = await plane.arrays_call(
            "m",
            {"Authorization": TOKEN},
            "/",
            b"{}",
            decode,
            request_id="r",
            arrived=0.0,
            max_values=max_values,
        )
        return out

    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    plane, _ = _plane(Answering(WorkerResponse(200, encode_tf_response([("y", y)]))))
    out = await arrays(plane)
    np.testing.assert_array_equal(out["y"], y)
    assert not out["y"].flags.owndata  # a view of the reply, no copy per element
    # User code may answer the JSON form anyway: parsed when small enough.
    doc = b'{"outputs": {"y": {"dtype": "int64", "shape": [2], "data": [1, 2]}}}'
    plane, _ = _plane(Answering(WorkerResponse(200, doc, "application/json")))
    out = await arrays(plane)
    assert out["y"].tolist() == [1, 2] and out["y"].dtype == np.int64
    with pytest.raises(errors.ResponseTooLarge, match=r"more than 1 values.*gateway\.max_json_values"):
        await arrays(plane, max_values=1)
    plane, _ = _plane(Answering(WorkerResponse(200, b'{"not": "outputs"}', "application/json")))
    with pytest.raises(errors.ProcessorFailed) as failed:
        await arrays(plane)
    assert failed.value.status == 502
    plane, _ = _plane(Answering(WorkerResponse(400, eas_body("InvalidInput", "bad", "r"))))
    with pytest.raises(errors.ProcessorFailed, match="bad") as failed:
        await arrays(plane)
    assert failed.value.status == 400


async def test_an_answer_of_arrays_counts_against_the_response_limit() -> None:
    """A backend in the gateway's threads answers arrays and no body: their bytes count."""

    class Arrays(Backend):
        async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
            return TensorResponse(200, b"", arrays={"y": np.zeros((10, 10), dtype=np.float32)})

    plane, _ = _plane(Arrays(), max_response_bytes=399)
    with pytest.raises(
        errors.ResponseTooLarge, match=r"would be 400 bytes .* set by gateway.max_response_bytes"
    ):
        await plane.record_call(plane.find("m"), {}, b"x")
    plane, _ = _plane(Arrays(), max_response_bytes=400)
    assert isinstance(await plane.record_call(plane.find("m"), {}, b"x"), TensorResponse)
