"""Real inference clients, with their defaults, against the real gateway: Triton's
``tritonclient.http``, KServe's ``InferenceRESTClient`` (each run under .venv-clients in a
subprocess), MLServer's V2 types and codecs (under .venv-mlserver), and the ``curl``
examples of docs/kserve.md as written. Every inference result is compared with ONNX
Runtime's own answer on the same model version.

One gateway serves ``mixed`` (FP32, INT64 and BYTES inputs; versions 1 and 2, token) and
``digits`` (the docs' examples, with their token).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.kserve_models import build_mixed
from tests.redis_server import free_port

TOKEN = "kserve-clients-token-7d41c9e2"
DOCS_TOKEN = "secret-token"  # the token docs/kserve.md's examples send
CLIENTS = Path(__file__).resolve().parent / "clients"
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
N = np.array([[1, -2, 3, 1 << 40], [0, 5, -7, 9]], dtype=np.int64)
S = np.array([["héllo"], ["wörld"]], dtype=object)
SCALES = {"1": 2, "2": 3}  # version -> the scale its model multiplies by


def venv_python(name: str) -> str:
    python = ROOT / name / "bin" / "python"
    if not python.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{python} is missing; run scripts/setup.sh")
        pytest.skip(f"{name} is not built (scripts/setup.sh)")
    return str(python)


def run_client(venv: str, script: str, *args: str, timeout: float = 60.0) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [venv_python(venv), str(CLIENTS / script), *args],
        capture_output=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("mixed-models")
    return {v: build_mixed(base / f"mixed_v{v}.onnx", scale) for v, scale in SCALES.items()}


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, versions: dict[str, Path], digits_model: Path
) -> Iterator[GatewayProcess]:
    config = {
        "gateway": {"grpc_port": free_port()},
        "services": [
            {"name": "mixed", "processor": "onnx", "versions": {int(v): str(p) for v, p in versions.items()},
             "token": TOKEN, "workers": 1},
            {"name": "digits", "processor": "onnx", "model": str(digits_model), "token": DOCS_TOKEN,
             "workers": 1},
        ]
    }  # fmt: skip
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("kserve-clients"))
    try:
        yield proc
    finally:
        proc.kill()


def expected(versions: dict[str, Path], version: str = "2") -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(versions[version]))
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"x": X, "n": N, "s": S}), strict=True))


def call(gw: GatewayProcess, path: str, doc: Any = None, token: str = TOKEN) -> tuple[int, Any]:
    return gw.call_json(path, doc, {"Authorization": f"Bearer {token}"})


# ----------------------------------------------------------------------------- versions


def test_versions_route_metadata_and_index(gw: GatewayProcess, versions: dict[str, Path]) -> None:
    status, meta = call(gw, "/v2/models/mixed")
    assert status == 200 and meta["versions"] == ["1", "2"]
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [
        ("x", "FP32"),
        ("n", "INT64"),
        ("s", "BYTES"),
    ]
    assert call(gw, "/v2/models/mixed/versions/1")[1] == meta
    for version in ("1", "2"):
        assert call(gw, f"/v2/models/mixed/versions/{version}/ready") == (
            200,
            {"name": "mixed", "ready": True},
        )
        doc = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()},
                          {"name": "n", "shape": [2, 4], "datatype": "INT64", "data": N.ravel().tolist()},
                          {"name": "s", "shape": [2, 1], "datatype": "BYTES", "data": ["héllo", "wörld"]}]
               }  # fmt: skip
        status, body = call(gw, f"/v2/models/mixed/versions/{version}/infer", doc)
        assert status == 200 and body["model_version"] == version, body
        want = expected(versions, version)
        outs = {o["name"]: o for o in body["outputs"]}
        np.testing.assert_array_equal(
            np.array(outs["scores"]["data"], np.float32).reshape(2, 4), want["scores"]
        )
        assert outs["count"]["data"] == want["count"].ravel().tolist()
        assert outs["echo"]["data"] == ["héllo", "wörld"]
    status, body = call(gw, "/v2/models/mixed/infer", {"inputs": doc["inputs"]})
    assert body["model_version"] == "2"  # the default: the latest
    assert call(gw, "/v2/models/mixed/versions/3/ready")[0] == 404
    status, index = call(gw, "/v2/repository/index", {})
    assert {(m["name"], m["version"], m["state"]) for m in index} >= {
        ("mixed", "1", "READY"),
        ("mixed", "2", "READY"),
    }
    status, cfg = call(gw, "/v2/models/mixed/versions/1/config")
    assert status == 200 and cfg["version_policy"] == {"all": {}}
    status, stats = call(gw, "/v2/models/mixed/stats")
    assert [(m["name"], m["version"]) for m in stats["model_stats"]] == [("mixed", "1"), ("mixed", "2")]
    assert all(m["inference_stats"]["success"]["count"] >= 1 for m in stats["model_stats"])
    status, stats = call(gw, "/v2/models/mixed/versions/1/stats")
    assert [(m["name"], m["version"]) for m in stats["model_stats"]] == [("mixed", "1")]


# ----------------------------------------------------------------------------- tritonclient.http


@pytest.fixture(scope="module")
def triton(gw: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    out = tmp_path_factory.mktemp("triton")
    run_client(".venv-clients", "triton_http.py", f"127.0.0.1:{gw.port}", TOKEN, str(out))
    results = json.loads((out / "results.json").read_text())
    with np.load(out / "arrays.npz") as arrays:
        return results, dict(arrays)


def test_triton_health_metadata_config_and_index(triton: tuple[dict[str, Any], Any]) -> None:
    res, _ = triton
    assert res["live"] is res["ready"] is res["model_ready"] is res["model_ready_v1"] is True
    assert "binary_tensor_data" in res["server_metadata"]["extensions"]
    assert res["model_metadata"]["versions"] == ["1", "2"] and res["model_metadata"]["name"] == "mixed"
    assert res["model_metadata_v1"]["inputs"] == res["model_metadata"]["inputs"]
    cfg = res["model_config"]
    assert [(t["name"], t["data_type"]) for t in cfg["input"]] == [("x", "TYPE_FP32"), ("n", "TYPE_INT64"),
                                                                    ("s", "TYPE_STRING")]  # fmt: skip
    index = {(m["name"], m["version"]): m["state"] for m in res["repository_index"]}
    assert index[("mixed", "1")] == index[("mixed", "2")] == "READY"


def test_triton_inference_matches_onnx_runtime(
    triton: tuple[dict[str, Any], Any], versions: dict[str, Path]
) -> None:
    res, arrays = triton
    latest = expected(versions)
    for call_name in ("binary", "json", "gzip", "v2"):
        np.testing.assert_array_equal(arrays[f"{call_name}.scores"], latest["scores"], err_msg=call_name)
        np.testing.assert_array_equal(arrays[f"{call_name}.count"], latest["count"], err_msg=call_name)
        assert res["bytes"][f"{call_name}.echo"] == [[2, 1], ["héllo", "wörld"]], call_name
        assert res[f"{call_name}_response"]["model_version"] == "2"
    old = expected(versions, "1")
    np.testing.assert_array_equal(arrays["v1.scores"], old["scores"])
    np.testing.assert_array_equal(arrays["v1.count"], old["count"])
    assert res["v1_response"]["model_version"] == "1"
    # Binary by default, JSON when asked.
    assert all("binary_data_size" in o["parameters"] for o in res["binary_response"]["outputs"])
    assert all("data" in o for o in res["json_response"]["outputs"])
    # A subset, in the order asked.
    assert [o["name"] for o in res["subset_response"]["outputs"]] == ["echo", "count"]
    np.testing.assert_array_equal(arrays["subset.count"], latest["count"])
    # Classification: the top 2 of each row of scores.
    top = np.argsort(-latest["scores"], axis=1, kind="stable")[:, :2]
    want = [f"{latest['scores'][r, i]:f}:{i}" for r in range(2) for i in top[r]]
    assert res["bytes"]["classes.scores"] == [[2, 2], want]


def test_triton_statistics_and_errors(triton: tuple[dict[str, Any], Any]) -> None:
    res, _ = triton
    stats = {m["version"]: m for m in res["statistics"]["model_stats"]}
    assert set(stats) == {"1", "2"} and stats["2"]["inference_stats"]["success"]["count"] >= 5
    assert [m["version"] for m in res["statistics_v1"]["model_stats"]] == ["1"]
    errors = res["errors"]
    assert errors["no_token"].startswith("401") and "token" in errors["no_token"]
    assert errors["unknown_model"].startswith("404") and "nope" in errors["unknown_model"]
    assert errors["unknown_version"].startswith("404") and "no version '9'" in errors["unknown_version"]


# ----------------------------------------------------------------------------- kserve


@pytest.fixture(scope="module")
def kserve_results(gw: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("kserve")
    run_client(".venv-clients", "kserve_rest.py", gw.url, TOKEN, str(out))
    return json.loads((out / "results.json").read_text())


def _check_outputs(got: dict[str, Any], want: dict[str, np.ndarray], names: tuple[str, ...]) -> None:
    for name in names:
        arr = want[name]
        assert got[name]["shape"] == list(arr.shape), name
        if arr.dtype == object:
            assert got[name]["data"] == arr.ravel().tolist(), name
        else:
            np.testing.assert_array_equal(
                np.array(got[name]["data"], dtype=arr.dtype).reshape(arr.shape), arr
            )


def test_kserve_v2_client(kserve_results: dict[str, Any], versions: dict[str, Path]) -> None:
    res = kserve_results["v2"]
    assert res["live"] is res["ready"] is res["model_ready"] is True
    want = expected(versions)
    for call_name in ("binary", "json"):
        _check_outputs(res[call_name], want, ("scores", "count", "echo"))
    assert list(res["subset"])[1:] == ["count", "echo"]
    _check_outputs(res["subset"], want, ("count", "echo"))
    assert res["no_token"].startswith("401")


def test_kserve_v1_client(kserve_results: dict[str, Any], versions: dict[str, Path]) -> None:
    res = kserve_results["v1"]
    assert res["live"] is res["model_ready"] is True
    want = expected(versions)
    preds = res["predict"]["predictions"]
    assert [p["scores"] for p in preds] == want["scores"].tolist()
    assert [p["count"] for p in preds] == want["count"].tolist()
    assert [p["echo"] for p in preds] == [["héllo"], ["wörld"]]


# ----------------------------------------------------------------------------- MLServer


def test_mlserver_types_and_codecs(
    gw: GatewayProcess, versions: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("mlserver")
    run_client(".venv-mlserver", "mlserver_types.py", gw.url, TOKEN, str(out))
    res = json.loads((out / "results.json").read_text())
    want = expected(versions)
    assert (res["id"], res["model_name"], res["model_version"]) == ("mlserver-1", "mixed", "2")
    np.testing.assert_array_equal(np.array(res["scores"], dtype=np.float32), want["scores"])
    assert res["count"] == want["count"].tolist()
    assert res["echo"] == ["héllo", "wörld"]


# ----------------------------------------------------------------------------- docs


def test_the_curl_examples_in_the_docs_run_as_written(
    gw: GatewayProcess, digits_model: Path, tmp_path: Path
) -> None:
    """Every ``bash`` block of docs/kserve.md, run as written against this gateway (only the
    address changes); each answer is checked, the V2 one against ONNX Runtime."""
    text = (ROOT / "docs" / "kserve.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    sess = ort.InferenceSession(str(digits_model))
    for block in blocks:
        if "explain" in block:  # the scorer sample's and its 404: tests/docs runs them against it
            continue
        script = block.replace("http://127.0.0.1:8080", gw.url)
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            capture_output=True,
            timeout=30,
            check=False,
        )
        out = proc.stdout.decode()
        assert proc.returncode == 0, (block, proc.stderr.decode())
        if "answer.bin" in block:  # the binary example: headers on stdout, the body in a file
            assert out.startswith("HTTP/1.1 200"), out
            hlen = int(re.search(r"Inference-Header-Content-Length: (\d+)", out, flags=re.I).group(1))
            body = (tmp_path / "answer.bin").read_bytes()
            head = json.loads(body[:hlen])
            assert [o["name"] for o in head["outputs"]] == ["label", "probabilities"]
            label = np.frombuffer(body[hlen : hlen + 8], dtype="<i8")
            np.testing.assert_array_equal(label, sess.run(None, {"input": np.zeros((1, 64), np.float32)})[0])
            continue
        answer = json.loads(out)
        assert "error" not in answer, answer
        sent = json.loads(re.search(r"-d '(.*)'", block, flags=re.S).group(1))
        if "/v2/" in block:
            rows = np.array(sent["inputs"][0]["data"], dtype=np.float32).reshape(1, 64)
            assert answer["outputs"][0]["data"] == sess.run(None, {"input": rows})[0].tolist()
        else:
            rows = np.array(sent["instances"], dtype=np.float32)
            assert [p["label"] for p in answer["predictions"]] == sess.run(None, {"input": rows})[0].tolist()


def test_grpc_routes_versions_as_rest_does(gw: GatewayProcess, versions: dict[str, Path]) -> None:
    """Over V2 gRPC too: a version's metadata, readiness, config and inference, the latest for
    an empty version, NOT_FOUND for a version the model does not have, one index entry each."""
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc
    from gateway.codecs.v2_tensors import to_raw

    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    auth = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="mixed", version="1"), metadata=auth)
        assert list(meta.versions) == ["1", "2"]
        for version in ("1", "2", ""):
            ready = stub.ModelReady(pb.ModelReadyRequest(name="mixed", version=version), metadata=auth)
            assert ready.ready
            req = pb.ModelInferRequest(model_name="mixed", model_version=version)
            for name, arr, datatype in (("x", X, "FP32"), ("n", N, "INT64"), ("s", S, "BYTES")):
                req.inputs.add(name=name, datatype=datatype, shape=arr.shape)
                req.raw_input_contents.append(bytes(to_raw(arr)))
            resp = stub.ModelInfer(req, metadata=auth, timeout=30)
            assert resp.model_version == (version or "2")
            want = expected(versions, version or "2")
            for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
                if out.datatype != "BYTES":
                    got = np.frombuffer(raw, dtype=want[out.name].dtype).reshape(out.shape)
                    np.testing.assert_allclose(got, want[out.name], rtol=1e-6)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="mixed", version="3"), metadata=auth)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=auth)
        assert [(m.name, m.version) for m in index.models if m.name == "mixed"] == [
            ("mixed", "1"),
            ("mixed", "2"),
        ]


def test_tritonclient_grpc_calls_each_version(
    gw: GatewayProcess, versions: dict[str, Path], tmp_path: Path
) -> None:
    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    run_client(".venv-clients", "triton_grpc_versions.py", f"127.0.0.1:{port}", TOKEN, str(tmp_path))
    res = json.loads((tmp_path / "versions.json").read_text())
    assert res["versions"] == ["1", "2"] and all(res["ready"].values())
    assert [tuple(m) for m in res["index"] if m[0] == "mixed"] == [
        ("mixed", "1", "READY"),
        ("mixed", "2", "READY"),
    ]
    assert res["unknown_version"] == "StatusCode.NOT_FOUND"
    with np.load(tmp_path / "versions.npz") as got:
        for version, label in (("1", "1"), ("2", "2"), ("2", "default")):
            want = expected(versions, version)
            for name in ("scores", "count"):
                np.testing.assert_allclose(got[f"{label}/{name}"], want[name], rtol=1e-6)
