"""Cluster Serving on Redis as its users run it: the real bigdl-serving 2.4.0 client's
``InputQueue().enqueue(...)`` and ``OutputQueue().query(...)`` / ``dequeue()`` in Redis
mode, unchanged, against a gateway whose services read Cluster Serving's streams.

The client always uses Redis database 0 of ``host:port``; the streams here have names of
their own. One gateway serves two ONNX models: dense and sparse tensors (struct columns),
and words and an image (string columns), the two kinds one enqueue cannot mix.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bigdl_reference import run_bigdl
from tests.e2e.gateway_proc import GatewayProcess
from tests.redis_server import RedisServer

VOCAB = {"hello": 1, "world": 2}
CLIENT_PRELUDE = """
import json, sys, time
import numpy as np
from bigdl.serving.client import InputQueue, OutputQueue
port = int(sys.argv[1])
def wait(oq, uri, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = oq.query(uri)
        if not (isinstance(r, str) and r == "[]"):
            return r
        time.sleep(0.02)
    raise SystemExit(f"no result for {uri}")
def plain(r):
    if isinstance(r, list):
        return [plain(x) for x in r]
    if isinstance(r, str):
        return r
    return {"shape": list(r.shape), "data": r.reshape(-1).tolist()}
"""


def _tensor_model(path: Path) -> Path:
    from onnx import TensorProto, helper, save

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["tensor", "two"], ["tensor_x2"]),
            helper.make_node(
                "ConstantOfShape", ["sparse.shape"], ["zeros"], value=helper.make_tensor("z", f32, [1], [0.0])
            ),
            helper.make_node("ScatterND", ["zeros", "sparse.indices", "sparse.values"], ["sparse_dense"]),
        ],
        "tensors",
        [
            helper.make_tensor_value_info("tensor", f32, ["N", 2]),
            helper.make_tensor_value_info("sparse.indices", i64, ["nnz", 3]),
            helper.make_tensor_value_info("sparse.values", f32, ["nnz"]),
            helper.make_tensor_value_info("sparse.shape", i64, [3]),
        ],
        [
            helper.make_tensor_value_info("tensor_x2", f32, ["N", 2]),
            helper.make_tensor_value_info("sparse_dense", f32, ["N", 3, 4]),
        ],
        [helper.make_tensor("two", f32, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    save(model, str(path))
    return path


def _words_model(path: Path) -> Path:
    from onnx import TensorProto, helper, save

    f32, i64, u8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8
    keys = list(VOCAB)
    graph = helper.make_graph(
        [
            helper.make_node(
                "LabelEncoder",
                ["words"],
                ["word_ids"],
                domain="ai.onnx.ml",
                keys_strings=keys,
                values_int64s=[VOCAB[k] for k in keys],
                default_int64=0,
            ),
            helper.make_node("Cast", ["image"], ["image_f"], to=f32),
            helper.make_node("ReduceMean", ["image_f", "hw"], ["image_mean"], keepdims=0),
        ],
        "words",
        [
            helper.make_tensor_value_info("words", TensorProto.STRING, ["N", "K"]),
            helper.make_tensor_value_info("image", u8, ["N", "H", "W", 3]),
        ],
        [
            helper.make_tensor_value_info("word_ids", i64, ["N", "K"]),
            helper.make_tensor_value_info("image_mean", f32, ["N", 3]),
        ],
        [helper.make_tensor("hw", i64, [2], [1, 2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 2)]
    )
    model.ir_version = 8
    save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gateway(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    work = tmp_path_factory.mktemp("cs-redis")
    with redis_server.client(0) as c:
        c.delete("tensor_stream", "words_stream")
    url = redis_server.url(0)
    services = [
        {
            "name": "tensors",
            "processor": "onnx",
            "model": str(_tensor_model(work / "tensors.onnx")),
            "cluster_serving": {"redis": url, "stream": "tensor_stream", "claim_idle_s": 1.0},
        },
        {
            "name": "words",
            "processor": "onnx",
            "model": str(_words_model(work / "words.onnx")),
            "cluster_serving": {"redis": url, "stream": "words_stream"},
        },
    ]
    gw = GatewayProcess.start({"services": services}, work / "gw")
    try:
        gw.wait_workers_ready("tensors", 1)
        gw.wait_workers_ready("words", 1)
        yield redis_server
    finally:
        gw.kill()


def _array(r: dict[str, Any]) -> np.ndarray:
    return np.asarray(r["data"]).reshape(r["shape"])


def test_dense_and_sparse_tensors_round_trip(gateway: RedisServer) -> None:
    code = (
        CLIENT_PRELUDE
        + """
iq = InputQueue(host="127.0.0.1", port=port, name="tensor_stream")
oq = OutputQueue(host="127.0.0.1", port=port, name="tensor_stream")
sparse = [np.array([[0, 2], [1, 3]]), np.array([7.0, 9.0]), np.array([3, 4])]
for i in range(4):
    iq.enqueue(f"t{i}", tensor=np.array([1.0 + i, -2.5]), sparse=sparse)
out = {"t0": plain(wait(oq, "t0"))}
rest = {}
end = time.monotonic() + 20
while not {"t1", "t2", "t3"} <= set(rest) and time.monotonic() < end:  # all four answered
    rest.update(oq.dequeue())
    time.sleep(0.02)
out.update({k: plain(v) for k, v in rest.items()})
out["after"] = plain(oq.query("t0"))
print(json.dumps(out))
"""
    )
    out = run_bigdl(code, str(gateway.port))
    assert sorted(k for k in out if k != "after") == ["t0", "t1", "t2", "t3"]
    dense = np.zeros((3, 4), dtype=np.float32)
    dense[0, 1], dense[2, 3] = 7.0, 9.0
    for i in range(4):
        x2, sd = out[f"t{i}"]  # two outputs: a list of ndarrays, in the model's order
        np.testing.assert_array_equal(_array(x2), [2.0 + 2 * i, -5.0])
        np.testing.assert_array_equal(_array(sd), dense)
    assert out["after"] == "[]"  # query() without delete left it; dequeue() removed it
    with gateway.client(0) as c:
        assert c.xlen("tensor_stream") == 0  # answered records are acknowledged and removed
        assert c.xpending("tensor_stream", "serving")["pending"] == 0


def test_words_and_an_image_round_trip(gateway: RedisServer) -> None:
    from PIL import Image

    img = np.random.default_rng(7).integers(0, 255, (4, 6, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    code = (
        CLIENT_PRELUDE
        + """
iq = InputQueue(host="127.0.0.1", port=port, name="words_stream")
oq = OutputQueue(host="127.0.0.1", port=port, name="words_stream")
iq.enqueue("w1", words=["hello", "nope", "world"], image={"b64": sys.argv[2]})
print(json.dumps(plain(wait(oq, "w1"))))
"""
    )
    ids, mean = run_bigdl(code, str(gateway.port), b64)
    np.testing.assert_array_equal(_array(ids), [1, 0, 2])
    np.testing.assert_allclose(_array(mean), img.astype(np.float32).mean(axis=(0, 1)), rtol=1e-5)


def test_a_record_that_cannot_be_served_answers_nan(gateway: RedisServer) -> None:
    with gateway.client(0) as c:
        c.xadd("tensor_stream", {"uri": "bad", "data": "not base64 of anything"})
    code = (
        CLIENT_PRELUDE
        + """
oq = OutputQueue(host="127.0.0.1", port=port, name="tensor_stream")
print(json.dumps(plain(wait(oq, "bad"))))
"""
    )
    assert run_bigdl(code, str(gateway.port)) == "NaN"


def test_records_a_gone_reader_left_pending_are_taken_over(gateway: RedisServer) -> None:
    """A record read under another consumer that never answered (its gateway died) is served
    once it has been idle for claim_idle_s."""
    with gateway.client(0) as c:
        code = (
            CLIENT_PRELUDE
            + """
iq = InputQueue(host="127.0.0.1", port=port, name="tensor_stream")
sparse = [np.array([[0], [0]]), np.array([1.0]), np.array([3, 4])]
print(json.dumps(iq.data_to_b64(tensor=np.array([4.0, 5.0]), sparse=sparse)))  # the client's own encoding
"""
        )
        data = run_bigdl(code, str(gateway.port))
        # Read by a consumer of the group that then vanished, in the transaction that added
        # it (a reader blocked in XREADGROUP is served only after the EXEC).
        pipe = c.pipeline(transaction=True)
        pipe.xadd("tensor_stream", {"uri": "orphan", "data": data})
        pipe.xreadgroup("serving", "dead-gateway", {"tensor_stream": ">"}, count=100)
        entry, got = pipe.execute()
        assert entry in [eid for eid, _ in got[0][1]]
    code = (
        CLIENT_PRELUDE
        + """
oq = OutputQueue(host="127.0.0.1", port=port, name="tensor_stream")
print(json.dumps(plain(wait(oq, "orphan"))))
"""
    )
    x2, _sd = run_bigdl(code, str(gateway.port))
    np.testing.assert_array_equal(_array(x2), [8.0, 10.0])
