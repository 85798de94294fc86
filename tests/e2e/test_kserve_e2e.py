"""KServe V2 / V1 REST against the real gateway and real ONNX Runtime workers; results are
compared with ONNX Runtime run in this process."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from eas_sdk._core.auth import content_md5, eas_authorization, http_date
from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess

TOKEN = "kserve-token-3b9d1e7a0c5f4e21"
MULTI = ROOT / "samples" / "models" / "multi.onnx"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    config = {
        "services": [
            {"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN, "workers": 1},
            {"name": "multi", "processor": "onnx", "model": str(MULTI), "workers": 1},
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1},
        ]
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("kserve"))
    try:
        for svc in ("digits", "multi"):
            proc.wait_workers_ready(svc, 1)
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    from sklearn.datasets import load_digits

    return (load_digits().data[:4] / 16.0).astype(np.float32)


def call(
    gw: GatewayProcess,
    path: str,
    doc: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any, dict[str, str]]:
    data = raw if raw is not None else (None if doc is None else json.dumps(doc).encode())
    req = urllib.request.Request(gw.url + path, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


AUTH = {"Authorization": TOKEN}


def test_health_and_server_metadata(gw: GatewayProcess) -> None:
    assert call(gw, "/v2/health/live")[:2] == (200, {"live": True})
    assert call(gw, "/v2/health/ready")[:2] == (200, {"ready": True})
    status, meta, _ = call(gw, "/v2")
    assert status == 200 and meta["name"] and meta["version"]
    assert {"binary_tensor_data", "classification", "statistics"} <= set(meta["extensions"])
    assert call(gw, "/v2/models")[1] == {"models": ["digits", "multi"]}  # onnx services only
    assert call(gw, "/v1/models")[1] == {"models": ["digits", "multi"]}


def test_model_metadata_is_what_onnx_runtime_reports(gw: GatewayProcess, digits_model: Path) -> None:
    sess = ort.InferenceSession(str(MULTI))
    status, meta, _ = call(gw, "/v2/models/multi")
    assert status == 200 and meta["name"] == "multi" and meta["platform"] == "onnxruntime_onnx"
    assert [i["name"] for i in meta["inputs"]] == [i.name for i in sess.get_inputs()]
    assert [(i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("FP32", [-1, 4]),
        ("INT64", [-1, 4]),
        ("FP64", [-1, 4]),
    ]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [
        ("sum", "FP32"),
        ("yy", "INT64"),
        ("zneg", "FP64"),
        ("mask", "UINT8"),
    ]
    assert call(gw, "/v2/models/multi/versions/1")[1] == meta
    assert call(gw, "/v2/models/multi/ready")[:2] == (200, {"name": "multi", "ready": True})
    # A token-protected model answers its metadata to its token only.
    assert call(gw, "/v2/models/digits")[0] == 401
    status, meta, _ = call(gw, "/v2/models/digits", headers=AUTH)
    assert status == 200 and meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]


def test_v2_infer_matches_onnx_runtime(gw: GatewayProcess, digits_model: Path, rows: np.ndarray) -> None:
    label, probs = ort.InferenceSession(str(digits_model)).run(None, {"input": rows})
    doc = {"id": "req-42", "inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                                       "data": rows.ravel().tolist()}]}  # fmt: skip
    status, body, headers = call(gw, "/v2/models/digits/infer", doc, AUTH)
    assert status == 200, body
    assert body["model_name"] == "digits" and body["id"] == "req-42"
    assert headers.get("X-Request-Id")
    out = {o["name"]: o for o in body["outputs"]}
    assert out["label"]["datatype"] == "INT64" and out["label"]["shape"] == [4]
    assert out["label"]["data"] == label.tolist()
    assert out["probabilities"]["shape"] == [4, 10]
    np.testing.assert_allclose(np.array(out["probabilities"]["data"]).reshape(4, 10), probs, rtol=1e-6)
    # Selected outputs, nested data, the versioned path.
    doc = {"inputs": [{"name": "input", "shape": [4, 64], "datatype": "FP32", "data": rows.tolist()}],
           "outputs": [{"name": "label"}]}  # fmt: skip
    status, body, _ = call(gw, "/v2/models/digits/versions/1/infer", doc, AUTH)
    assert status == 200, body
    assert [o["name"] for o in body["outputs"]] == ["label"] and body["outputs"][0]["data"] == label.tolist()


def test_a_large_v2_answer_is_whole(gw: GatewayProcess, digits_model: Path, rows: np.ndarray) -> None:
    # 2,000 rows: 20,000 probabilities, an answer the gateway writes off its event loop.
    many = np.tile(rows, (500, 1))
    label, probs = ort.InferenceSession(str(digits_model)).run(None, {"input": many})
    doc = {"inputs": [{"name": "input", "shape": list(many.shape), "datatype": "FP32",
                       "data": many.ravel().tolist()}]}  # fmt: skip
    status, body, _ = call(gw, "/v2/models/digits/infer", doc, AUTH)
    assert status == 200, body
    out = {o["name"]: o for o in body["outputs"]}
    assert out["probabilities"]["shape"] == [2000, 10] and out["label"]["data"] == label.tolist()
    np.testing.assert_allclose(np.array(out["probabilities"]["data"]).reshape(2000, 10), probs, rtol=1e-6)


def test_v2_infer_with_several_dtypes(gw: GatewayProcess) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 4
    y = np.array([[1, -2, 0, 3], [4, 0, -1, 2]], dtype=np.int64)
    z = np.linspace(-1, 1, 8).reshape(2, 4)
    expected = dict(
        zip(
            ["sum", "yy", "zneg", "mask"],
            ort.InferenceSession(str(MULTI)).run(None, {"x": x, "y": y, "z": z}),
            strict=True,
        )
    )
    doc = {"inputs": [
        {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()},
        {"name": "y", "shape": [2, 4], "datatype": "INT64", "data": y.ravel().tolist()},
        {"name": "z", "shape": [2, 4], "datatype": "FP64", "data": z.ravel().tolist()},
    ]}  # fmt: skip
    status, body, _ = call(gw, "/v2/models/multi/infer", doc)
    assert status == 200, body
    got = {o["name"]: o for o in body["outputs"]}
    assert {n: o["datatype"] for n, o in got.items()} == {
        "sum": "FP32",
        "yy": "INT64",
        "zneg": "FP64",
        "mask": "UINT8",
    }
    for name, want in expected.items():
        np.testing.assert_allclose(np.array(got[name]["data"]).reshape(want.shape), want, rtol=1e-6)


def test_v1_predict_matches_onnx_runtime(gw: GatewayProcess, digits_model: Path, rows: np.ndarray) -> None:
    label, probs = ort.InferenceSession(str(digits_model)).run(None, {"input": rows})
    status, body, _ = call(gw, "/v1/models/digits:predict", {"instances": rows.tolist()}, AUTH)
    assert status == 200, body
    preds = body["predictions"]
    assert [p["label"] for p in preds] == label.tolist()
    np.testing.assert_allclose(np.array([p["probabilities"] for p in preds]), probs, rtol=1e-6)
    assert call(gw, "/v1/models/digits", headers=AUTH)[1] == {"name": "digits", "ready": True}


def test_v1_column_inputs_and_root_liveness(gw: GatewayProcess, rows: np.ndarray) -> None:
    by_rows = call(gw, "/v1/models/digits:predict", {"instances": rows.tolist()}, AUTH)
    by_columns = call(gw, "/v1/models/digits:predict", {"inputs": {"input": rows.tolist()}}, AUTH)
    as_list = call(gw, "/v1/models/digits:predict", {"inputs": rows.tolist()}, AUTH)
    assert by_rows[0] == by_columns[0] == as_list[0] == 200
    assert by_rows[1] == by_columns[1] == as_list[1]
    assert call(gw, "/")[:2] == (200, {"status": "alive"})


def test_triton_model_config(gw: GatewayProcess) -> None:
    status, cfg, _ = call(gw, "/v2/models/digits/config", headers=AUTH)
    assert status == 200, cfg
    assert cfg["name"] == "digits" and cfg["platform"] == "onnxruntime_onnx"
    assert cfg["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1, 64]}]
    assert {o["name"]: o["data_type"] for o in cfg["output"]} == {
        "label": "TYPE_INT64",
        "probabilities": "TYPE_FP32",
    }
    assert call(gw, "/v2/models/digits/versions/1/config", headers=AUTH)[:2] == (200, cfg)
    assert call(gw, "/v2/models/digits/config")[0] == 401


def test_v1_named_instances(gw: GatewayProcess) -> None:
    inst = [{"x": [0.5, 1, 2, 3], "y": [1, 2, 3, 4], "z": [1.0, 2, 3, 4]}] * 2
    status, body, _ = call(gw, "/v1/models/multi:predict", {"instances": inst})
    assert status == 200, body
    assert body["predictions"][1] == {"sum": [1.5, 3, 5, 7], "yy": [2, 4, 6, 8], "zneg": [-1, -2, -3, -4],
                                      "mask": [1, 1, 1, 1]}  # fmt: skip


def test_the_eas_signature_works_on_the_infer_path(gw: GatewayProcess, rows: np.ndarray) -> None:
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                   "data": rows[0].tolist()}]}).encode()  # fmt: skip
    path = "/v2/models/digits/infer"
    md5, date, ctype = content_md5(body), http_date(), "application/json"
    headers = {"Content-MD5": md5, "Date": date, "Content-Type": ctype,
               "Authorization": eas_authorization(TOKEN.encode(), md5, ctype, date, path)}  # fmt: skip
    status, doc, _ = call(gw, path, headers=headers, raw=body)
    assert status == 200, doc
    headers["Authorization"] = headers["Authorization"][:-4] + "AAA="
    assert call(gw, path, headers=headers, raw=body)[0] == 401


def _digits(datatype: str = "FP32", shape: tuple[int, ...] = (1, 64), n: int = 64, **extra: Any) -> Any:
    data = [1 if datatype == "INT64" else 0.0] * n
    return {"inputs": [{"name": "input", "shape": list(shape), "datatype": datatype, "data": data}], **extra}


DIGITS = "/v2/models/digits/infer"
BAD_REQUESTS = [
    ("/v2/models/nope/infer", {"inputs": []}, {}, 404, "model 'nope' not found"),
    ("/v2/models/echo/infer", {"inputs": []}, {}, 404, "'echo' is not served over V2: declare"),
    (DIGITS, {"inputs": []}, {}, 401, "invalid or missing token"),
    (DIGITS, {"inputs": []}, {"Authorization": "wrong"}, 401, "invalid or missing token"),
    ("/v2/models/digits/versions/2/infer", {"inputs": []}, AUTH, 404, "no version '2'"),
    (DIGITS, _digits("INT64"), AUTH, 400, "input 'input': expected float32[N,64], got int64[1,64]"),
    (DIGITS, _digits(shape=(1, 63), n=63), AUTH, 400, "expected float32[N,64]"),
    (DIGITS, {"inputs": [{"name": "pixels", "shape": [1], "datatype": "FP32", "data": [0.0]}]}, AUTH, 400,
     "pixels"),
    (DIGITS, _digits(outputs=[{"name": "nope"}]), AUTH, 400, "nope"),
    (DIGITS, _digits(n=60), AUTH, 400, "needs 64 values, got 60"),
    (DIGITS, _digits(), {**AUTH, "Inference-Header-Content-Length": "10"}, 400,
     "the JSON header (Inference-Header-Content-Length: 10): body is not valid JSON"),
    (DIGITS, _digits(), {**AUTH, "Inference-Header-Content-Length": "x"}, 400, "must be an integer"),
    (DIGITS, {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                          "parameters": {"binary_data_size": 256}}]}, AUTH, 400,
     "binary_data_size needs the Inference-Header-Content-Length header"),
    (DIGITS, _digits(outputs=[{"name": "label", "parameters": {"classification": 0}}]), AUTH, 400,
     "classification extension"),
    (DIGITS, _digits(outputs=[{"name": "label", "parameters": {"shared_memory_region": "r"}}]), AUTH, 400,
     "shared memory extension is not supported"),
    ("/v1/models/multi:predict", {"instances": [[1, 2, 3, 4]]}, {}, 400, "each instance must be an object"),
    ("/v2/models/bad%2Fname/infer", {"inputs": []}, {}, 400, "invalid model name"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "doc", "headers", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_a_clear_error_and_the_gateway_stays_up(
    gw: GatewayProcess, path: str, doc: Any, headers: dict[str, str], status: int, message: str
) -> None:
    got, body, resp_headers = call(gw, path, doc, {"Content-Type": "application/json", **headers})
    assert got == status, body
    assert message in body["error"], body
    assert resp_headers.get("X-Request-Id")
    assert call(gw, "/v2/models/multi/ready")[0] == 200


def test_malformed_json_is_400(gw: GatewayProcess) -> None:
    status, body, _ = call(gw, "/v2/models/multi/infer", raw=b'{"inputs": [')
    assert status == 400 and "not valid JSON" in body["error"]
    status, body, _ = call(gw, "/v2/models/multi/infer", raw=b"[" * 50_000 + b"]" * 50_000)
    assert status == 400, body


def test_inference_calls_are_counted_in_metrics(gw: GatewayProcess) -> None:
    call(gw, "/v2/models/multi/infer", raw=b"{}")
    with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    counted = [line for line in text.splitlines() if line.startswith("easgw_requests_total{")]
    assert any('service="multi"' in line and 'status="400"' in line for line in counted), counted


def test_kserve_paths_answer_every_error_in_the_error_shape(gw: GatewayProcess) -> None:
    for method, path, status in (
        ("GET", "/v2/models/digits/nope", 404),
        ("GET", "/v2/nope", 404),
        ("GET", "/v1/models/digits:predict", 405),
        ("PUT", "/v2/models/digits/infer", 405),
    ):
        req = urllib.request.Request(gw.url + path, method=method, headers=AUTH)
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as err:
            assert err.code == status, (method, path)
            assert set(json.loads(err.read())) == {"error"}, (method, path)
        else:
            raise AssertionError(f"{method} {path} succeeded")


def test_compressed_requests_and_answers(gw: GatewayProcess, rows: np.ndarray) -> None:
    doc = {
        "inputs": [
            {"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
        ]
    }
    plain = json.dumps(doc).encode()
    want = call(gw, "/v2/models/digits/infer", raw=plain, headers=AUTH)
    assert want[0] == 200
    deflated = zlib.compress(plain)
    for encoding, data in (
        ("gzip", gzip.compress(plain)),
        ("deflate", deflated),
        ("deflate", deflated[2:-4]),
    ):
        got = call(gw, "/v2/models/digits/infer", raw=data, headers={**AUTH, "Content-Encoding": encoding})
        assert got[:2] == want[:2], encoding
    # An answer (of more than a few rows) compressed when the client accepts gzip.
    many = np.repeat(rows, 20, axis=0)
    doc = {
        "inputs": [
            {"name": "input", "shape": list(many.shape), "datatype": "FP32", "data": many.ravel().tolist()}
        ]
    }
    big = json.dumps(doc).encode()
    req = urllib.request.Request(
        gw.url + "/v2/models/digits/infer", data=big, headers={**AUTH, "Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert (
            json.loads(gzip.decompress(r.read()))
            == call(gw, "/v2/models/digits/infer", raw=big, headers=AUTH)[1]
        )
    # A compression bomb: 200 MB of zeros in a few hundred kilobytes is refused, not inflated.
    bomb = gzip.compress(b"\0" * (200 << 20), compresslevel=9)
    status, body, _ = call(
        gw, "/v2/models/digits/infer", raw=bomb, headers={**AUTH, "Content-Encoding": "gzip"}
    )
    assert status == 413 and "decompressed" in body["error"]
    status, body, _ = call(
        gw, "/v2/models/digits/infer", raw=b"not gzip", headers={**AUTH, "Content-Encoding": "gzip"}
    )
    assert status == 400 and "gzip" in body["error"]
    status, body, _ = call(
        gw, "/v2/models/digits/infer", raw=plain, headers={**AUTH, "Content-Encoding": "br"}
    )
    assert status == 415 and set(body) == {"error"}
    # Without credentials: 401 before anything is inflated.
    status, _b, _h = call(gw, "/v2/models/digits/infer", raw=bomb, headers={"Content-Encoding": "gzip"})
    assert status == 401


def test_triton_statistics_count_calls(gw: GatewayProcess, rows: np.ndarray) -> None:
    def stats(path: str, headers: dict[str, str]) -> dict[str, Any]:
        status, body, _ = call(gw, path, headers=headers)
        assert status == 200, body
        return {m["name"]: m for m in body["model_stats"]}

    before = stats("/v2/models/digits/stats", AUTH)["digits"]
    doc = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": rows[0].tolist()}]}
    assert call(gw, "/v2/models/digits/infer", doc, AUTH)[0] == 200
    # A shape the model's signature refuses is refused by the gateway before the model sees
    # it: not a call of the model's. An input the model does not have is refused by the
    # model itself: a failed call.
    bad = {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    assert call(gw, "/v2/models/digits/infer", bad, AUTH)[0] == 400
    unknown = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": rows[0].tolist()}]}
    assert call(gw, "/v2/models/digits/infer", unknown, AUTH)[0] == 400
    after = stats("/v2/models/digits/stats", AUTH)["digits"]
    got, was = after["inference_stats"], before["inference_stats"]
    assert got["success"]["count"] == was["success"]["count"] + 1
    assert got["fail"]["count"] == was["fail"]["count"] + 1
    assert got["success"]["ns"] > was["success"]["ns"] and got["compute_infer"]["ns"] > 0
    assert after["inference_count"] == before["inference_count"] + 1 and after["last_inference"] > 0
    # Every model: only those the caller may see (multi is open, digits needs the token).
    assert set(stats("/v2/models/stats", {})) == {"multi"}
    assert set(stats("/v2/models/stats", AUTH)) == {"digits", "multi"}
    assert call(gw, "/v2/models/digits/stats")[0] == 401


def test_triton_repository_index(gw: GatewayProcess) -> None:
    want = [
        {"name": "digits", "version": "1", "state": "READY"},
        {"name": "multi", "version": "1", "state": "READY"},
    ]
    assert call(gw, "/v2/repository/index", raw=b"")[:2] == (200, want)
    assert call(gw, "/v2/repository/index", {"ready": True})[:2] == (200, want)
    status, body, _ = call(gw, "/v2/repository/index", raw=b"{not json")
    assert status == 400 and set(body) == {"error"}


def test_binary_tensors_both_ways_match_onnx_runtime(gw: GatewayProcess) -> None:
    """The binary tensor data extension: FP32 and FP64 inputs binary, INT64 as JSON in the same
    request; two outputs binary, one as JSON, with gzip on both ways."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 4
    y = np.array([[1, -2, 0, 3], [4, 0, -1, 2]], dtype=np.int64)
    z = np.linspace(-1, 1, 8).reshape(2, 4)
    ran = ort.InferenceSession(str(MULTI)).run(None, {"x": x, "y": y, "z": z})
    want = dict(zip(["sum", "yy", "zneg", "mask"], ran, strict=True))
    header = json.dumps({
        "inputs": [
            {"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
            {"name": "y", "shape": [2, 4], "datatype": "INT64", "data": y.tolist()},
            {"name": "z", "shape": [2, 4], "datatype": "FP64", "parameters": {"binary_data_size": z.nbytes}},
        ],
        "outputs": [{"name": "mask", "parameters": {"binary_data": True}}, {"name": "yy"},
                    {"name": "zneg", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    body = gzip.compress(header + x.tobytes() + z.tobytes())
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Encoding": "gzip",
               "Accept-Encoding": "gzip", "Content-Type": "application/octet-stream"}  # fmt: skip
    req = urllib.request.Request(gw.url + "/v2/models/multi/infer", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        data = gzip.decompress(r.read()) if r.headers.get("Content-Encoding") == "gzip" else r.read()
        hlen = int(r.headers["Inference-Header-Content-Length"])
    doc = json.loads(data[:hlen])
    outs = {o["name"]: o for o in doc["outputs"]}
    assert list(outs) == ["mask", "yy", "zneg"]
    assert outs["yy"]["data"] == want["yy"].ravel().tolist() and outs["yy"]["datatype"] == "INT64"
    pos = hlen
    for name in ("mask", "zneg"):
        size = outs[name]["parameters"]["binary_data_size"]
        dtype = {"UINT8": np.uint8, "FP64": "<f8"}[outs[name]["datatype"]]
        got = np.frombuffer(data[pos : pos + size], dtype=dtype).reshape(outs[name]["shape"])
        np.testing.assert_array_equal(got, want[name])
        pos += size
    assert pos == len(data)


def test_classification_extension(gw: GatewayProcess, digits_model: Path, rows: np.ndarray) -> None:
    _, probs = ort.InferenceSession(str(digits_model)).run(None, {"input": rows})
    doc = {"inputs": [{"name": "input", "shape": [4, 64], "datatype": "FP32", "data": rows.tolist()}],
           "outputs": [{"name": "probabilities", "parameters": {"classification": 2}}]}  # fmt: skip
    status, body, _ = call(gw, "/v2/models/digits/infer", doc, AUTH)
    assert status == 200, body
    (out,) = body["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [4, 2]
    top = np.argsort(-probs, axis=1, kind="stable")[:, :2]
    want = [[f"{probs[r, i]:f}:{i}" for i in top[r]] for r in range(4)]
    assert np.array(out["data"]).reshape(4, 2).tolist() == want
