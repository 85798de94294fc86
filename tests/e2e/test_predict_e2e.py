"""The real gateway (subprocess) with real workers: every request format, both auth schemes,
direct mode, our SDK (sync and async) and the reference eas-prediction 0.36 client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import (
    ENDPOINT_TYPE_DIRECT,
    AsyncPredictClient,
    BladeRequest,
    PredictClient,
    StringRequest,
    TFRequest,
    TorchRequest,
)
from eas_sdk.errors import AuthenticationError, NotFoundError
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess, digits_on_workers
from tests.eas_reference import run_reference

TOKEN = "e2e-digits-token-5f1c2a9e7d3b4c60"


def e2e_config(model: Path) -> dict[str, Any]:
    return {
        "gateway": {"shutdown_timeout_s": 10},
        "services": [
            digits_on_workers(model, TOKEN),
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1},
        ],
    }


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    proc = GatewayProcess.start(e2e_config(digits_model), tmp_path_factory.mktemp("gw"))
    try:
        proc.wait_workers_ready("digits", 2)
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    from sklearn.datasets import load_digits

    return (load_digits().data[:5] / 16.0).astype(np.float32)


@pytest.fixture(scope="module")
def expected(digits_model: Path, images: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(digits_model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"input": images}), strict=True))


def _check(got_label: np.ndarray, got_prob: np.ndarray, expected: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(got_label, expected["label"])
    np.testing.assert_allclose(got_prob, expected["probabilities"], rtol=1e-5, atol=1e-6)


def _tf(images: np.ndarray) -> TFRequest:
    req = TFRequest("serving_default")
    req.add_feed("input", list(images.shape), TFRequest.DT_FLOAT, images)
    return req


def test_string_request_echo(gw: GatewayProcess) -> None:
    with PredictClient(gw.url, "echo") as client:
        resp = client.predict(StringRequest(b"\x00binary\xffhello"))
    assert resp.response_data == b"\x00binary\xffhello"


def test_string_request_json_on_digits(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    body = json.dumps({"inputs": {"input": images.tolist()}})
    with PredictClient(gw.url, "digits", token=TOKEN) as client:
        resp = client.predict(StringRequest(body))
    out = json.loads(resp.response_data)["outputs"]
    _check(
        np.array(out["label"]["data"]),
        np.array(out["probabilities"]["data"], dtype=np.float32).reshape(expected["probabilities"].shape),
        expected,
    )


def test_tf_request_matches_onnxruntime(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    with PredictClient(gw.url, "digits", token=TOKEN) as client:
        resp = client.predict(_tf(images))
    _check(resp.to_numpy("label"), resp.to_numpy("probabilities"), expected)


def test_torch_request_matches_onnxruntime(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    req = TorchRequest()
    req.add_feed(0, list(images.shape), TorchRequest.DT_FLOAT, images)
    with PredictClient(gw.url, "digits", token=TOKEN) as client:
        resp = client.predict(req)
    _check(resp.to_numpy(0), resp.to_numpy(1), expected)


def test_blade_request_matches_onnxruntime(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    req = BladeRequest("serving_default")
    req.add_feed("input", images.shape[0], list(images.shape), BladeRequest.DT_FLOAT, images.ravel().tolist())
    req.add_fetch("probabilities", BladeRequest.DT_FLOAT)
    with PredictClient(gw.url, "digits", token=TOKEN) as client:
        resp = client.predict(req)
    prob = resp.to_numpy("probabilities").reshape(expected["probabilities"].shape)
    np.testing.assert_allclose(prob, expected["probabilities"], rtol=1e-5, atol=1e-6)


def test_plain_token_and_wrong_tokens(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    body = _tf(images).to_string()

    def post(headers: dict[str, str]) -> tuple[int, bytes]:
        req = urllib.request.Request(
            gw.url + "/api/predict/digits", data=body, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    status, out = post({"Authorization": TOKEN})
    assert status == 200
    from eas_sdk.requests.tf import TFResponse

    resp = TFResponse(out)
    _check(resp.to_numpy("label"), resp.to_numpy("probabilities"), expected)
    for bad in ({}, {"Authorization": "nope"}, {"Authorization": "EAS  x"}, {"Authorization": TOKEN + "x"}):
        status, out = post(bad)
        assert status == 401, bad
        assert json.loads(out)["code"] == "Unauthorized"
    with PredictClient(gw.url, "digits", token="wrong-token") as client, pytest.raises(AuthenticationError):
        client.predict(_tf(images))
    with PredictClient(gw.url, "nope") as client, pytest.raises(NotFoundError):
        client.predict(StringRequest(b"x"))


def test_direct_mode_with_our_sdk(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    client = PredictClient(gw.endpoint, "digits")
    client.set_endpoint_type(ENDPOINT_TYPE_DIRECT)
    client.set_token(TOKEN)
    client.init()
    try:
        for _ in range(4):
            resp = client.predict(_tf(images))
            _check(resp.to_numpy("label"), resp.to_numpy("probabilities"), expected)
    finally:
        client.destroy()
    # A worker address without a token: direct mode is no auth bypass.
    status, body = gw.get_json("/api/v1/servicediscovery/upstreams/digits")
    items = body["endpoints"]["items"]
    assert status == 200 and len(items) == 2
    worker = f"http://{items[0]['ip']}:{items[0]['port']}/api/predict/digits"
    req = urllib.request.Request(worker, data=_tf(images).to_string(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 401
    exc.value.close()


async def test_async_sdk(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    import asyncio

    async with AsyncPredictClient(gw.url, "digits", token=TOKEN) as client:
        results = await asyncio.gather(*(client.predict(_tf(images)) for _ in range(16)))
        for resp in results:
            _check(resp.to_numpy("label"), resp.to_numpy("probabilities"), expected)
    async with AsyncPredictClient(gw.url, "echo") as client:
        assert (await client.predict(StringRequest(b"hi"))).response_data == b"hi"


REFERENCE_CODE = r"""
import json, sys
from eas_prediction import BladeRequest, PredictClient, StringRequest, TFRequest, TorchRequest
endpoint, token, mode, values = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
client = PredictClient(endpoint, "digits")
client.set_token(token)
if mode == "direct":
    client.set_endpoint_type("DIRECT")
client.init()
out = []
flat, n = [v for row in values for v in row], len(values)
for _ in range(3):
    req = TFRequest("serving_default")
    req.add_feed("input", [n, 64], TFRequest.DT_FLOAT, flat)
    resp = client.predict(req)
    out.append({"label": list(resp.get_values("label")),
                "probabilities": list(resp.get_values("probabilities"))})
# The other request types against the same model: Torch (by position; flag=True sends the
# body snappy-compressed), Blade (by name, outputs fetched with their types), and JSON text.
formats = {}
for name, flag in (("torch", False), ("torch_snappy", True)):
    treq = TorchRequest(flag)
    treq.add_feed(0, [n, 64], TorchRequest.DT_FLOAT, flat)
    tresp = client.predict(treq)
    formats[name] = {"label": list(tresp.get_values(0)), "probabilities": list(tresp.get_values(1))}
breq = BladeRequest("serving_default")
breq.add_feed("input", n, [n, 64], BladeRequest.DT_FLOAT, flat)
breq.add_fetch("label", BladeRequest.DT_INT64)
breq.add_fetch("probabilities", BladeRequest.DT_FLOAT)
bresp = client.predict(breq)
formats["blade"] = {"label": list(bresp.get_values("label", BladeRequest.DT_INT64)),
                    "probabilities": list(bresp.get_values("probabilities", BladeRequest.DT_FLOAT))}
jresp = client.predict(StringRequest(json.dumps({"inputs": {"input": values}})))
jout = json.loads(jresp.response_data)["outputs"]
formats["json"] = {"label": jout["label"]["data"], "probabilities": jout["probabilities"]["data"]}
echo = PredictClient(endpoint, "echo")
if mode == "direct":
    echo.set_endpoint_type("DIRECT")
echo.init()
text = echo.predict(StringRequest("hello reference")).response_data
extra = {}
if mode == "gateway":
    from eas_prediction import PredictException
    # custom_url mode sends the raw token (plain scheme).
    cu = PredictClient(endpoint, "digits", custom_url="http://" + endpoint + "/api/predict/digits")
    cu.set_token(token)
    cu.init()
    extra["custom_url_label"] = list(cu.predict(req).get_values("label"))
    bad = PredictClient(endpoint, "digits")
    bad.set_token("wrong-" + token)
    bad.init()
    try:
        bad.predict(req)
    except PredictException as exc:
        extra["wrong_token_code"] = exc.code
    cu.destroy(); bad.destroy()
print(json.dumps({"runs": out, "formats": formats,
                  "echo": text.decode() if isinstance(text, bytes) else text, **extra}))
client.destroy(); echo.destroy()
"""


@pytest.mark.compat
@pytest.mark.parametrize("mode", ["gateway", "direct"])
def test_reference_client(gw: GatewayProcess, images: np.ndarray, expected: dict, mode: str) -> None:
    proc = run_reference(REFERENCE_CODE, gw.endpoint, TOKEN, mode, json.dumps(images.tolist()), timeout=60)
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert result["echo"] == "hello reference"
    if mode == "gateway":
        assert result["custom_url_label"] == expected["label"].tolist()
        assert result["wrong_token_code"] == 401
    runs = [*result["runs"], *result["formats"].values()]
    assert sorted(result["formats"]) == ["blade", "json", "torch", "torch_snappy"]
    for run in runs:  # every request type: the numbers of in-process ONNX Runtime
        np.testing.assert_array_equal(np.array(run["label"]), expected["label"])
        prob = np.array(run["probabilities"], dtype=np.float32).reshape(expected["probabilities"].shape)
        np.testing.assert_allclose(prob, expected["probabilities"], rtol=1e-5, atol=1e-6)


def test_cluster_serving_rest_path(gw: GatewayProcess, images: np.ndarray, expected: dict) -> None:
    doc = {"instances": [{"input": row.tolist()} for row in images]}
    req = urllib.request.Request(
        gw.url + "/api/cluster-serving/digits/predict",
        data=json.dumps(doc).encode(),
        headers={"Authorization": TOKEN, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        preds = json.loads(r.read())["predictions"]
    assert len(preds) == len(images)
    _check(
        np.array([p["label"] for p in preds]).reshape(expected["label"].shape),
        np.array([p["probabilities"] for p in preds], dtype=np.float32),
        expected,
    )


def test_services_listing_and_metrics(gw: GatewayProcess) -> None:
    services = gw.services()
    assert [w["state"] for w in services["digits"]["workers"]] == ["ready", "ready"]
    with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'easgw_ready_workers{service="digits"} 2.0' in text
    assert TOKEN not in text
