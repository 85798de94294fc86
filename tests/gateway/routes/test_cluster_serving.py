"""The Cluster Serving REST path (/predict) with the request examples of the BigDL Cluster
Serving programming guide, in process."""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import parse_config
from tests.eas_reference import ROOT
from tests.gateway.routes.inproc import InProcPool

sys.path.insert(0, str(ROOT / "samples"))
from build_cluster_serving_model import SPARSE_SHAPE, build, reference

PROCESSORS = Path(__file__).resolve().parents[2] / "processors"  # python processors loaded by path
TOKEN = "cs-token-1"


def jpeg_b64(seed: int, size: tuple[int, int] = (6, 4)) -> tuple[str, np.ndarray]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")  # lossless: exact pixels to compare
    return base64.b64encode(buf.getvalue()).decode(), arr


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build(tmp_path_factory.mktemp("models")))


@pytest.fixture
async def client(model_path: str, tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    config = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path), "cluster_serving_service": "inspect"},
            "services": [
                {"name": "cs", "processor": "onnx", "model": model_path, "async": True, "token": TOKEN},
                {
                    "name": "inspect",
                    "processor": "python",
                    "entry": f"{PROCESSORS / 'inspect_processor.py'}:InspectProcessor",
                    "public": True,
                },
            ],
        }
    )
    app = create_app(config, pool_factory=InProcPool, cluster_serving=True)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as c:
        yield c


async def _post(
    client: TestClient[Any, Any], path: str, doc: Any, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": token} if token else {}
    body = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
    resp = await client.post(path, data=body, headers=headers)
    return resp.status, json.loads(await resp.read())


# --- the request examples of the BigDL Cluster Serving programming guide -----------------


async def test_bigdl_example_images(client: TestClient[Any, Any]) -> None:
    (b1, a1), (b2, a2) = jpeg_b64(1), jpeg_b64(2)
    status, doc = await _post(client, "/predict", {"instances": [{"image": b1}, {"image": b2}]})
    assert status == 200, doc
    preds = doc["predictions"]
    assert len(preds) == 2
    assert np.array_equal(np.asarray(preds[0]["image"]), a1)
    assert np.array_equal(np.asarray(preds[1]["image"]), a2)


async def test_bigdl_example_tensor(client: TestClient[Any, Any]) -> None:
    req = '{"instances" : [ {"ids" : [ 100.0, 88.0 ]}, {"ids" : [ 100.0, 88.0 ]} ]}'
    status, doc = await _post(client, "/api/cluster-serving/inspect/predict", req)
    assert status == 200, doc
    assert [p["ids"] for p in doc["predictions"]] == [[100.0, 88.0], [100.0, 88.0]]
    assert doc["predictions"][0]["ids:dtype"] == "loose-f"  # cast to the model's dtype by the processor


BIGDL_SCALARS = {
    "intScalar": 12345,
    "floatScalar": 3.14159,
    "stringScalar": "hello, world. hello, arrow.",
    "intTensor": [7756, 9549, 1094, 9808, 4959, 3831, 3926, 6578, 1870, 1741],
    "floatTensor": [0.6804766, 0.30136853, 0.17394465, 0.44770062, 0.20275897,
                    0.32762378, 0.45966738, 0.30405098, 0.62053126, 0.7037923],
    "stringTensor": ["come", "on", "united"],
    "intTensor2": [[1, 2], [3, 4], [5, 6]],
    "floatTensor2": [[[0.2, 0.3], [0.5, 0.6]], [[0.2, 0.3], [0.5, 0.6]]],
    "stringTensor2": [[[["come", "on", "united"]] * 4] * 2] * 2,
}  # fmt: skip


async def test_bigdl_example_scalars_and_tensors(client: TestClient[Any, Any]) -> None:
    status, doc = await _post(client, "/predict", {"instances": [BIGDL_SCALARS]})
    assert status == 200, doc
    (pred,) = doc["predictions"]
    for name, value in BIGDL_SCALARS.items():
        assert pred[name] == value, name
    assert pred["intScalar:dtype"] == "loose-i"
    assert pred["floatTensor:dtype"] == "loose-f"
    assert pred["stringTensor2:dtype"] == "string"


async def test_bigdl_example_sparse_and_dense(client: TestClient[Any, Any]) -> None:
    inst = {
        "sparseTensor": {
            "shape": [100, 10000, 10],
            "data": [0.2, 0.5, 3.45, 6.78],
            "indices": [[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]],
        },
        "intTensor2": [[1, 2], [3, 4], [5, 6]],
    }
    status, doc = await _post(client, "/predict", {"instances": [inst, inst]})
    assert status == 200, doc
    p0 = doc["predictions"][0]
    assert p0["intTensor2"] == inst["intTensor2"]
    # A sparse tensor is passed as COO inputs of a [N, *shape] tensor: never densified.
    assert p0["sparseTensor.shape"] == [2, 100, 10000, 10]
    assert p0["sparseTensor.values"] == [0.2, 0.5, 3.45, 6.78] * 2
    assert p0["sparseTensor.indices"] == [[b, i, i, i] for b in (0, 1) for i in (1, 2, 3, 4)]


# --- a real ONNX model ---------------------------------------------------------------


async def test_onnx_model_numbers_match_onnxruntime(client: TestClient[Any, Any]) -> None:
    b1, a1 = jpeg_b64(3)
    b2, a2 = jpeg_b64(4)
    instances = [
        {
            "words": ["hello", "world", "nope"],
            "image": b1,
            "tensor": [1, 2],  # ints: cast to the model's float32
            "sparse": {"shape": list(SPARSE_SHAPE), "data": [1.5, 2.5], "indices": [[0, 0], [4, 9]]},
        },
        {
            "words": ["come", "on", "united"],
            "image": {"b64": b2},
            "tensor": [0.25, -3.5],
            "sparse": {"shape": list(SPARSE_SHAPE), "data": [7.0], "indices": [[2, 3]]},
        },
    ]
    status, doc = await _post(client, "/api/cluster-serving/cs/predict", {"instances": instances}, TOKEN)
    assert status == 200, doc
    idx = np.array([[0, 0, 0], [0, 4, 9], [1, 2, 3]])
    ref = reference(
        np.array([i["words"] for i in instances]),
        np.stack([a1, a2]),
        np.array([[1, 2], [0.25, -3.5]], dtype=np.float32),
        (idx, np.array([1.5, 2.5, 7.0], dtype=np.float32), np.array([2, *SPARSE_SHAPE])),
    )
    for i, pred in enumerate(doc["predictions"]):
        assert set(pred) == set(ref)
        for name, want in ref.items():
            np.testing.assert_allclose(np.asarray(pred[name]), want[i], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ("{not json", 400, "not valid JSON"),
        ({"instances": []}, 400, "empty"),
        ({"inputs": {}}, 400, '"instances"'),
        ({"instances": [{"a": [1, 2]}, {"b": [1, 2]}]}, 400, "differ"),
        ({"instances": [{"a": [1, 2]}, {"a": [1, 2, 3]}]}, 400, "shape"),
        ({"instances": [{"a": [[1, 2], [3]]}]}, 400, "rectangular"),
        ({"instances": [{"a": {"path": "/etc/passwd"}}]}, 400, "paths"),
        ({"instances": [{"a": None}]}, 400, "null"),
        ({"instances": [{"s": {"shape": [3], "data": [1.0], "indices": [[5]]}}]}, 400, "out of bounds"),
        ({"instances": [{"s": {"shape": [3, 3], "data": [1.0, 2.0], "indices": [[1, 1]]}}]}, 400, "indices"),
        ({"instances": [{"a": {"b64": "not base64!"}}]}, 400, "base64"),
    ],
)
async def test_bad_input_is_a_4xx_error(
    client: TestClient[Any, Any], body: Any, status: int, fragment: str
) -> None:
    got, doc = await _post(client, "/predict", body)
    assert got == status
    assert set(doc) == {"error"} and fragment in doc["error"], doc


async def test_model_rejection_and_routing_errors(client: TestClient[Any, Any]) -> None:
    # The model needs all of its inputs: the processor's refusal comes back as {"error"}.
    got, doc = await _post(
        client, "/api/cluster-serving/cs/predict", {"instances": [{"tensor": [1, 2]}]}, TOKEN
    )
    assert got == 400 and "error" in doc and doc["error"]
    got, doc = await _post(client, "/api/cluster-serving/cs/predict", {"instances": [{"tensor": [1, 2]}]})
    assert got == 401 and set(doc) == {"error"}
    got, doc = await _post(client, "/api/cluster-serving/nope/predict", {"instances": [{"a": 1}]})
    assert got == 404 and set(doc) == {"error"}
    got, doc = await _post(client, "/api/cluster-serving/bad%2Fname/predict", {"instances": [{"a": 1}]})
    assert got in (400, 404) and set(doc) == {"error"}
    resp = await client.get("/predict")
    assert resp.status == 405 and resp.headers["Allow"] == "POST"


async def test_input_queue_sync_predict(client: TestClient[Any, Any]) -> None:
    import asyncio

    from eas_sdk.cluster_serving import InputQueue

    url = f"http://127.0.0.1:{client.port}"
    example = '{\n  "instances" : [ {\n    "ids" : [ 100.0, 88.0 ]\n  }]\n}'
    # Bare /predict: the configured default service (gateway.cluster_serving_service).
    with InputQueue(sync=True, frontend_url=url) as iq:
        resp = await asyncio.to_thread(iq.predict, example)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"predictions": [{"ids": [100.0, 88.0], "ids:dtype": "loose-f"}]}
    # A named service, with its token; the response text is JSON as in Cluster Serving.
    inst = {"words": ["on"], "image": jpeg_b64(5)[0], "tensor": [1.0, 1.5], "sparse": _SPARSE_ONE}
    with InputQueue(sync=True, frontend_url=url, name="cs", token=TOKEN) as iq:
        resp = await asyncio.to_thread(iq.predict, json.dumps({"instances": [inst]}))
        assert resp.status_code == 200, resp.text
        assert json.loads(resp.text)["predictions"][0]["tensor_x2"] == [2.0, 3.0]
        bad = await asyncio.to_thread(iq.predict, {"instances": []})
    assert bad.status_code == 400 and "error" in bad.json()


_SPARSE_ONE = {"shape": list(SPARSE_SHAPE), "data": [1.0], "indices": [[0, 0]]}
