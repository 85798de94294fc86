"""The V2 gRPC endpoint against the real gateway, real ONNX Runtime workers and the real
clients with their default settings: ``tritonclient.grpc`` and KServe's
``InferenceGRPCClient`` (each in .venv-clients, in its own process: both register the
``inference`` protobuf package). Every answer is compared with ONNX Runtime's own."""

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

from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess
from tests.redis_server import free_port

TOKEN = "grpc-token-5c1f0e9a7b3d4e62"
MULTI = ROOT / "samples" / "models" / "multi.onnx"
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
DRIVER = Path(__file__).with_name("grpc_client_driver.py")


def build_strings_model(path: Path) -> Path:
    """``strings.onnx``: BYTES in; out the same strings, and them reversed with one more."""
    from onnx import TensorProto, helper

    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None])
    same = helper.make_tensor_value_info("same", TensorProto.STRING, [None])
    more = helper.make_tensor_value_info("more", TensorProto.STRING, [None])
    tail = helper.make_tensor("tail", TensorProto.STRING, [1], [b"end"])
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["text"], ["same"]),
            helper.make_node("Concat", ["text", "tail"], ["more"], axis=0),
        ],
        "strings",
        [text],
        [same, more],
        [tail],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> dict[str, Path]:
    strings = build_strings_model(tmp_path_factory.mktemp("models") / "strings.onnx")
    return {"digits": digits_model, "multi": MULTI, "strings": strings}


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]
) -> Iterator[tuple[GatewayProcess, int]]:
    port = free_port()
    config = {
        "gateway": {"grpc_port": port},
        "services": [
            {"name": "digits", "processor": "onnx", "model": str(models["digits"]), "token": TOKEN},
            {"name": "multi", "processor": "onnx", "model": str(models["multi"])},
            {"name": "strings", "processor": "onnx", "model": str(models["strings"])},
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY},
        ],
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("grpc"))
    try:
        for svc in ("digits", "multi", "strings"):
            proc.wait_workers_ready(svc, 1)
        yield proc, port
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def inputs() -> dict[str, dict[str, np.ndarray]]:
    from sklearn.datasets import load_digits

    return {
        "digits": {"input": (load_digits().data[:3] / 16.0).astype(np.float32)},
        "multi": {
            "x": np.arange(8, dtype=np.float32).reshape(2, 4) / 4,
            "y": np.array([[1, -2, 0, 3], [4, 0, -1, 2]], dtype=np.int64),
            "z": np.linspace(-1, 1, 8).reshape(2, 4),
        },
        "strings": {"text": np.array([b"hello", b"gRPC", "caf\u00e9".encode()], dtype=object)},
    }


def expected(models: dict[str, Path], model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(models[model]))
    feed = {k: _text(v) if v.dtype == object else v for k, v in arrays.items()}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feed), strict=True))


def _text(arr: np.ndarray) -> np.ndarray:
    return np.array([v.decode() for v in arr.ravel()], dtype=object).reshape(arr.shape)


def enc(arr: np.ndarray) -> dict[str, Any]:
    data = [v.decode() if isinstance(v, bytes) else v for v in arr.ravel().tolist()]
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}


def clients_python() -> str:
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{CLIENTS_PYTHON} is missing: run scripts/setup.sh")
        pytest.skip("the inference clients' environment (.venv-clients) is not built")
    return str(CLIENTS_PYTHON)


def run_clients(argv: list[str], stdin: bytes = b"") -> bytes:
    """Run the clients' interpreter isolated (-I: neither our PYTHONPATH nor tests/e2e/queue
    shadowing the stdlib's queue); -> its stdout, or fail with its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [clients_python(), "-I", *argv], input=stdin, capture_output=True, timeout=60, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    return proc.stdout


def drive(client: str, port: int, inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    doc = {
        "url": f"127.0.0.1:{port}",
        "token": TOKEN,
        "inputs": {m: {n: enc(a) for n, a in arrays.items()} for m, arrays in inputs.items()},
    }
    return json.loads(run_clients([str(DRIVER), client], json.dumps(doc).encode()))


def check(got: dict[str, Any], want: dict[str, np.ndarray], order: list[str]) -> None:
    """The client's outputs, in ``order``, equal ONNX Runtime's in dtype, shape and value."""
    assert got["order"] == order
    for name in order:
        out, ref = got["outputs"][name], want[name]
        if ref.dtype.kind in "OU":
            assert out["dtype"] == "object" and out["data"] == [str(v) for v in ref.ravel()], name
            continue
        assert (out["dtype"], out["shape"]) == (str(ref.dtype), list(ref.shape)), name
        np.testing.assert_allclose(np.array(out["data"], dtype=ref.dtype).reshape(ref.shape), ref, rtol=1e-6)


@pytest.fixture(scope="module")
def triton(gw: tuple[GatewayProcess, int], inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    return drive("triton", gw[1], inputs)


def test_tritonclient_health_metadata_config_and_index(triton: dict[str, Any]) -> None:
    assert triton["live"] is True and triton["ready"] is True and triton["model_ready"] is True
    assert triton["server_metadata"]["name"] == "easkit-gateway"
    meta = triton["model_metadata"]
    assert (meta["name"], meta["versions"], meta["platform"]) == ("multi", ["1"], "onnxruntime_onnx")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", ["-1", "4"]),
        ("y", "INT64", ["-1", "4"]),
        ("z", "FP64", ["-1", "4"]),
    ]  # fmt: skip  (int64 fields are strings in protobuf's JSON form)
    config = triton["model_config"]["config"]
    assert (config["name"], config["platform"], config["backend"]) == (
        "digits",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [("input", "TYPE_FP32")]
    assert {t["name"]: t["data_type"] for t in config["output"]} == {
        "label": "TYPE_INT64", "probabilities": "TYPE_FP32",
    }  # fmt: skip
    assert config["instance_group"] == [{"name": "digits", "count": 1, "kind": "KIND_CPU"}]
    index = {m["name"]: (m["version"], m["state"]) for m in triton["index"]["models"]}
    assert index == {"digits": ("1", "READY"), "multi": ("1", "READY"), "strings": ("1", "READY")}


def test_tritonclient_inference_matches_onnx_runtime(
    triton: dict[str, Any], models: dict[str, Path], inputs: dict[str, dict[str, np.ndarray]]
) -> None:
    check(triton["digits"], expected(models, "digits", inputs["digits"]), ["label", "probabilities"])
    multi = expected(models, "multi", inputs["multi"])
    check(triton["multi_subset"], multi, ["yy", "sum"])  # FP32 and INT64, in the requested order
    check(triton["multi_gzip"], multi, ["sum", "yy", "zneg", "mask"])  # every output, the model's order
    check(triton["strings"], expected(models, "strings", inputs["strings"]), ["same", "more"])  # BYTES


def test_tritonclient_stream(
    triton: dict[str, Any], models: dict[str, Path], inputs: dict[str, dict[str, np.ndarray]]
) -> None:
    first, failed, last = triton["stream"]
    assert first["id"] == "s-1"
    check(first, expected(models, "multi", inputs["multi"]), ["sum", "yy", "zneg", "mask"])
    assert "model 'nosuch' not found" in failed["error"]
    assert last["id"] == "s-3"
    check(last, expected(models, "strings", inputs["strings"]), ["same", "more"])


def test_tritonclient_statistics_and_errors(triton: dict[str, Any]) -> None:
    (stats,) = triton["stats"]["model_stats"]
    assert (stats["name"], stats["version"]) == ("digits", "1")
    assert int(stats["inference_count"]) >= 1 and int(stats["inference_stats"]["success"]["count"]) >= 1
    assert int(stats["inference_stats"]["compute_infer"]["ns"]) > 0
    assert triton["errors"] == {
        "no_token": "StatusCode.UNAUTHENTICATED",
        "wrong_token": "StatusCode.UNAUTHENTICATED",
        "unknown_model": "StatusCode.NOT_FOUND",
        "bad_shape": "StatusCode.INVALID_ARGUMENT",
        "unknown_output": "StatusCode.INVALID_ARGUMENT",
        "load": "StatusCode.PERMISSION_DENIED",  # model control is off without an admin token
    }


def test_kserve_grpc_client(
    gw: tuple[GatewayProcess, int], models: dict[str, Path], inputs: dict[str, dict[str, np.ndarray]]
) -> None:
    got = drive("kserve", gw[1], inputs)
    assert got["live"] is True and got["ready"] is True and got["model_ready"] is True
    digits = expected(models, "digits", inputs["digits"])
    assert got["digits"]["id"] == "k-1"
    check(got["digits"], digits, ["label", "probabilities"])  # raw tensors
    check(got["digits_typed"], digits, ["label", "probabilities"])  # typed contents
    multi = expected(models, "multi", inputs["multi"])
    check(got["multi_subset"], multi, ["zneg", "mask"])
    check(got["multi_raw"], multi, ["sum", "yy", "zneg", "mask"])
    check(got["strings"], expected(models, "strings", inputs["strings"]), ["same", "more"])
    assert got["wrong_token"] == "StatusCode.UNAUTHENTICATED"


@pytest.mark.parametrize("which", ["tritonclient", "kserve"])
def test_the_documented_examples_run_as_written(
    gw: tuple[GatewayProcess, int], models: dict[str, Path], which: str
) -> None:
    """docs/grpc.md's client examples, with this gateway's port and token."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "grpc.md").read_text(), re.S)
    # The digits example (the page also calls the scorer sample, which this gateway has not).
    (code,) = [b for b in blocks if (f"import {which}" in b or f"from {which}" in b) and '"digits"' in b]
    code = code.replace("127.0.0.1:8001", f"127.0.0.1:{gw[1]}").replace("secret-token", TOKEN)
    out = run_clients(["-c", code]).decode()
    (label,) = expected(models, "digits", {"input": np.zeros((1, 64), np.float32)})["label"]
    assert f"[{label}]" in out


def test_large_typed_and_bytes_tensors_with_a_plain_stub(
    gw: tuple[GatewayProcess, int], models: dict[str, Path]
) -> None:
    """Typed contents in, typed contents out; BYTES both ways; sizes past the point where the
    gateway converts them off its event loop."""
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    rng = np.random.default_rng(3)
    arrays = {
        "x": rng.random((20_000, 4), dtype=np.float32),
        "y": rng.integers(-5, 5, (20_000, 4)),
        "z": rng.random((20_000, 4)),
    }
    text = np.array([f"t{i}".encode() for i in range(70_000)], dtype=object)
    with grpc.insecure_channel(f"127.0.0.1:{gw[1]}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="multi", id="typed")
        for (name, arr), field in zip(
            arrays.items(), ("fp32_contents", "int64_contents", "fp64_contents"), strict=True
        ):
            t = req.inputs.add(
                name=name, datatype={"x": "FP32", "y": "INT64", "z": "FP64"}[name], shape=arr.shape
            )
            getattr(t.contents, field).extend(arr.ravel().tolist())
        resp = stub.ModelInfer(req, timeout=30)
        assert resp.id == "typed" and not resp.raw_output_contents
        want = expected(models, "multi", arrays)
        fields = {
            "FP32": "fp32_contents",
            "INT64": "int64_contents",
            "FP64": "fp64_contents",
            "UINT8": "uint_contents",
        }
        for out in resp.outputs:
            ref = want[out.name]
            got = np.array(getattr(out.contents, fields[out.datatype]), dtype=ref.dtype).reshape(
                tuple(out.shape)
            )
            np.testing.assert_allclose(got, ref, rtol=1e-6, err_msg=out.name)
        req = pb.ModelInferRequest(model_name="strings")
        req.inputs.add(name="text", datatype="BYTES", shape=text.shape)
        req.raw_input_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in text))
        resp = stub.ModelInfer(req, timeout=30)
        assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
            ("same", "BYTES", [70_000]), ("more", "BYTES", [70_001]),
        ]  # fmt: skip
        raw = resp.raw_output_contents[1]
        assert raw.endswith(b"\x03\x00\x00\x00end") and raw.startswith(b"\x02\x00\x00\x00t0")
        assert raw == resp.raw_output_contents[0] + b"\x03\x00\x00\x00end"
