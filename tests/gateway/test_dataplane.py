"""The dataplane on its own: find, authenticate, admit, dispatch and the one error table."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from eas_sdk._core.auth import signed_headers
from eas_sdk.codecs.eas import encode_tf_response
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.calls import RESPONSE_FORMAT_HEADER, TensorResponse, WorkerRequest, WorkerResponse
from gateway.core.dataplane import DataPlane
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

    def observe_dispatch(self, service: str, seconds: float, compute_us: int) -> None:
        self.seen.append((service, seconds, compute_us))


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


def test_authentication_raw_token_and_refusals() -> None:
    plane, _ = _plane()
    svc = plane.find("m")
    plane.authenticate(svc, {"Authorization": TOKEN}, "/api/predict/m", b"x")
    plane.authenticate(svc, {"Authorization": f"Bearer {TOKEN}"}, "/api/predict/m", b"x")
    plane.authenticate(svc, {"Authorization": f"bearer {TOKEN}"}, "/api/predict/m", b"x")
    with pytest.raises(errors.Unauthorized):
        plane.authenticate(svc, {"Authorization": "Bearer wrong"}, "/api/predict/m", b"x")
    with pytest.raises(errors.Unauthorized):
        plane.authenticate(svc, {}, "/api/predict/m", b"x")
    with pytest.raises(errors.Unauthorized):
        plane.authenticate(svc, {"Authorization": "wrong"}, "/api/predict/m", b"x")
    # An open service asks nothing.
    plane.authenticate(plane.find("open"), {}, "/api/predict/open", b"x")
    # Before the body: no credentials or a wrong raw token are refused; a signature waits.
    assert plane.refused_early(svc, {})
    assert plane.refused_early(svc, {"Authorization": "wrong"})
    assert not plane.refused_early(svc, {"Authorization": TOKEN})
    assert not plane.refused_early(svc, {"Authorization": "EAS c2ln"})
    assert not plane.refused_early(plane.find("open"), {})


def test_signature_and_bad_digest() -> None:
    plane, _ = _plane()
    svc = plane.find("m")
    body = b"payload"
    plane.authenticate(svc, signed_headers(TOKEN, body, "m"), "/api/predict/m", body)
    with pytest.raises(errors.BadDigest):  # signed, but for another body
        plane.authenticate(svc, signed_headers(TOKEN, b"other", "m"), "/api/predict/m", body)
    with pytest.raises(errors.Unauthorized):  # signed for another service's path
        plane.authenticate(svc, signed_headers(TOKEN, body, "x"), "/api/predict/m", body)
    with pytest.raises(errors.Unauthorized):  # signed with another token
        plane.authenticate(svc, signed_headers("other", body, "m"), "/api/predict/m", body)


def test_deadline_and_budget() -> None:
    plane, _ = _plane()
    svc = plane.find("m")
    assert plane.caller_deadline({}) is None
    assert plane.caller_deadline({"X-Eas-Deadline-Ms": " 250 "}) == 0.25
    with pytest.raises(errors.BadRequest):
        plane.caller_deadline({"X-Eas-Deadline-Ms": "soon"})
    with pytest.raises(errors.DeadlineExceeded):
        plane.caller_deadline({"X-Eas-Deadline-Ms": "3"})
    now = time.monotonic()
    assert plane.budget(svc, None, now) == svc.timeout_ms / 1000.0
    left = plane.budget(svc, 0.25, now)
    spent = time.monotonic() - now  # since the call "arrived", however slow the machine
    assert 0.25 - spent <= left <= 0.25
    with pytest.raises(errors.DeadlineExceeded):  # the upload used up the caller's budget
        plane.budget(svc, 0.25, now - 1.0)


async def test_infer_builds_the_worker_request_and_observes() -> None:
    observer = Observer()
    plane, backend = _plane(observer=observer)
    headers = {
        "Authorization": TOKEN,
        "Content-Type": "text/plain",
        "X-Custom": "1",
        "Cookie": "c",
        "Date": "d",
    }
    resp = await plane.predict(
        plane.find("m"), headers, "/api/predict/m", b"in", subpath="sub", request_id="r1",
        arrived=0.0, deadline=None,
    )  # fmt: skip
    assert (resp.status, resp.body) == (200, b"out:in")
    req, timeout = backend.calls[0]
    # Credentials and hop-by-hop headers never reach a processor; the rest does.
    assert req.headers == {"Content-Type": "text/plain", "X-Custom": "1"}
    assert (req.subpath, req.request_id, req.content_type) == ("sub", "r1", "text/plain")
    assert req.deadline > 0 and timeout == pytest.approx(10.0, abs=60)
    assert observer.seen and observer.seen[0][0] == "m" and observer.seen[0][2] == 7


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
    plane, _ = _plane(Backend(fail=failure))
    with pytest.raises(errors.GatewayError) as info:
        await plane.infer(plane.find("m"), {}, b"x", timeout=1.0)
    assert (info.value.status, info.value.code) == (status, code)
    assert "secret" not in info.value.message


async def test_infer_json_returns_the_processors_message() -> None:
    class Failing(Backend):
        async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
            assert req.header("X-Eas-Request-Format") == "json"
            return WorkerResponse(
                400, errors.error_body("InvalidInput", "bad shape", "r"), "application/json"
            )

    plane, _ = _plane(Failing())
    assert await plane.infer_json(plane.find("m"), b"{}", request_id="r", timeout=1.0) == (400, b"bad shape")
    plane, _ = _plane()
    assert await plane.infer_json(plane.find("m"), b"{}", request_id="r", timeout=1.0) == (200, b"out:{}")


class Answering(Backend):
    """Answers each call with ``reply`` (checking the adapters' headers first)."""

    def __init__(self, reply: WorkerResponse) -> None:
        super().__init__()
        self.reply = reply

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        assert req.header("X-Eas-Request-Format") == "json"
        assert req.header(RESPONSE_FORMAT_HEADER) == "tf"  # asked for arrays
        return self.reply


async def test_infer_arrays_reads_a_tf_answer_in_place_and_a_json_one_within_bounds() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    plane, _ = _plane(Answering(WorkerResponse(200, encode_tf_response([("y", y)]))))
    out = await plane.infer_arrays(plane.find("m"), b"{}", request_id="r", timeout=1.0)
    np.testing.assert_array_equal(out["y"], y)
    assert not out["y"].flags.owndata  # a view of the reply, no copy per element
    # User code may answer the JSON form anyway: parsed when small enough.
    doc = b'{"outputs": {"y": {"dtype": "int64", "shape": [2], "data": [1, 2]}}}'
    plane, _ = _plane(Answering(WorkerResponse(200, doc, "application/json")))
    out = await plane.infer_arrays(plane.find("m"), b"{}", request_id="r", timeout=1.0)
    assert out["y"].tolist() == [1, 2] and out["y"].dtype == np.int64
    with pytest.raises(errors.ResponseTooLarge, match=r"more than 1 values.*gateway\.max_json_values"):
        await plane.infer_arrays(plane.find("m"), b"{}", request_id="r", timeout=1.0, max_values=1)
    plane, _ = _plane(Answering(WorkerResponse(200, b'{"not": "outputs"}', "application/json")))
    with pytest.raises(errors.ProcessorFailed) as failed:
        await plane.infer_arrays(plane.find("m"), b"{}", request_id="r", timeout=1.0)
    assert failed.value.status == 502
    plane, _ = _plane(Answering(WorkerResponse(400, errors.error_body("InvalidInput", "bad", "r"))))
    with pytest.raises(errors.ProcessorFailed, match="bad") as failed:
        await plane.infer_arrays(plane.find("m"), b"{}", request_id="r", timeout=1.0)
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
        await plane.infer(plane.find("m"), {}, b"x", timeout=1.0)
    plane, _ = _plane(Arrays(), max_response_bytes=400)
    assert isinstance(await plane.infer(plane.find("m"), {}, b"x", timeout=1.0), TensorResponse)
