"""Paddle Serving's pipeline gRPC service as its users call it: the real ``PipelineClient``
of paddle-serving-server 0.9.0, unchanged, against a service's ``rpc_port``.

The model stands in for Paddle's UCI housing example (13 features -> a price) and also
answers the features doubled, so an answer holds two outputs of different shapes. Every
form the client packs is driven: key/value with an array, a list and the caller's own text,
``Tensor`` messages with typed data and with ``np.save``'s bytes; then what must be refused
in Paddle's own ``err_no``/``err_msg``, with the gateway answering the next call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.gateway_proc import GatewayProcess
from tests.paddle_reference import run_paddle
from tests.redis_server import free_port

OPS = Path(__file__).resolve().parents[1] / "processors" / "paddle_ops.py"

WEIGHTS = np.linspace(-1.0, 1.0, 13, dtype=np.float32).reshape(13, 1)
BIAS = np.float32(20.0)
FEATURES = np.array(
    [
        [
            0.0137,
            -0.1136,
            0.2553,
            -0.0692,
            0.0582,
            -0.0727,
            -0.1583,
            -0.0584,
            0.6283,
            0.4919,
            0.1856,
            0.0795,
            -0.0332,
        ]
    ],
    dtype=np.float32,
)
# The client's module namespace holds numpy's names (its own ``from numpy import *``), so a
# user's ``eval`` of an answer's repr runs there, as Paddle's examples do.
CLIENT = """
import json, sys
import numpy as np
from numpy import *
from paddle_serving_server.pipeline import PipelineClient
client = PipelineClient()
client.connect(["127.0.0.1:" + sys.argv[1]])
results = []
def call(**kw):
    r = client.predict(**kw)
    values = {}
    for k, v in zip(r.key, r.value):
        values[k] = np.asarray(eval(v)).tolist()
    results.append({"err_no": r.err_no, "err_msg": r.err_msg, "values": values})
"""


def _model(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper, save

    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["price"]),
            helper.make_node("Mul", ["x", "two"], ["scaled"]),
        ],
        "uci",
        [helper.make_tensor_value_info("x", f32, ["N", 13])],
        [
            helper.make_tensor_value_info("price", f32, ["N", 1]),
            helper.make_tensor_value_info("scaled", f32, ["N", 13]),
        ],
        [
            numpy_helper.from_array(WEIGHTS, "w"),
            numpy_helper.from_array(np.array([BIAS]), "b"),
            helper.make_tensor("two", f32, [], [2.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    save(model, str(path))
    return path


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """Each service's rpc_port: the model's own, and a pipeline's whose step is a Paddle op."""
    work = tmp_path_factory.mktemp("paddle-pipeline")
    port, op_port = free_port(), free_port()
    services = [
        {"name": "uci", "processor": "onnx", "model": str(_model(work / "uci.onnx")), "rpc_port": port},
        {
            "name": "uci-op",
            "processor": "pipeline",
            "rpc_port": op_port,
            "pipeline": {
                "inputs": {"x": {"dtype": "float32"}, "mode": {"dtype": "bytes"}},
                "steps": [
                    {
                        "name": "uci", "op": f"{OPS}:UciOp", "service": "uci",
                        "inputs": {"x": "request.x", "mode": "request.mode"}, "outputs": {"price": "float32"},
                    }
                ],
                "outputs": {"price": "uci.price"},
            },
        },
    ]  # fmt: skip
    gw = GatewayProcess.start({"services": services}, work / "gw")
    try:
        gw.wait_workers_ready("uci", 1)
        yield {"uci": port, "uci-op": op_port}
    finally:
        gw.stop()


def _price(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) @ WEIGHTS + BIAS


def test_key_value_and_tensor_forms_answer_as_paddle_does(ports: dict[str, int]) -> None:
    feats = json.dumps(FEATURES.tolist())
    code = (
        CLIENT
        + f"""
x = np.array({feats}, dtype="float32")
call(feed_dict={{"x": x}}, fetch=["price"])                        # an array: its repr
call(feed_dict={{"x": x.tolist()}}, fetch=["price"])               # a list: np.array's repr
call(feed_dict={{"x": ", ".join(str(v) for v in x[0])}})           # the caller's own text
call(feed_dict={{"x": np.vstack([x, x * 2])}}, pack_tensor_format=True)
call(feed_dict={{"x": x}}, pack_tensor_format=True, use_tensor_bytes=True)
print(json.dumps(results))
"""
    )
    results = run_paddle(code, str(ports["uci"]))
    expected = _price(FEATURES)
    for r in results:
        assert r["err_no"] == 0, r
        assert r["err_msg"] == ""
        assert sorted(r["values"]) == ["price", "scaled"]
    for r in (results[0], results[1], results[2], results[4]):
        np.testing.assert_allclose(r["values"]["price"], expected, rtol=1e-5)
        np.testing.assert_allclose(r["values"]["scaled"], FEATURES * 2, rtol=1e-6)
    both = np.vstack([FEATURES, FEATURES * 2])
    np.testing.assert_allclose(results[3]["values"]["price"], _price(both), rtol=1e-5)


def test_refusals_are_paddle_errors_and_the_service_answers_on(ports: dict[str, int]) -> None:
    code = (
        CLIENT
        + """
x = np.ones((1, 13), dtype="float32")
call(feed_dict={"x": "array([[1.0, 2.0]]); __import__('os').getcwd()"})
call(feed_dict={"x": "array(__import__('os').getcwd())"})
call(feed_dict={"x": "array([[1.0, 2.0], [3.0]])"})
call(feed_dict={"x": np.ones((1, 5), dtype="float32")})
call(feed_dict={"y": x})
call(feed_dict={"x": x})
print(json.dumps(results))
"""
    )
    *refused, last = run_paddle(code, str(ports["uci"]))
    for r in refused:
        assert r["err_no"] == 5000, r  # Paddle's INPUT_PARAMS_ERROR
        assert r["err_msg"].startswith("[400] "), r
        assert r["values"] == {}
    assert "'x'" in refused[0]["err_msg"] and "not a" in refused[0]["err_msg"]
    assert "'x'" in refused[1]["err_msg"]
    assert "rectangular" in refused[2]["err_msg"]
    assert last["err_no"] == 0
    np.testing.assert_allclose(last["values"]["price"], _price(np.ones((1, 13))), rtol=1e-5)


def test_a_paddle_op_runs_with_its_own_signatures(ports: dict[str, int]) -> None:
    feats = json.dumps(FEATURES.tolist())
    code = (
        CLIENT
        + f"""
x = np.array({feats}, dtype="float32")
for mode in ("predict", "skip", "refuse", "raise", "short", "bad-post", "predict"):
    call(feed_dict={{"x": x, "mode": mode}})
print(json.dumps(results))
"""
    )
    ok, skipped, refused, raised, short, bad_post, again = run_paddle(code, str(ports["uci-op"]))
    for r in (ok, again):
        assert r["err_no"] == 0, r
        np.testing.assert_allclose(r["values"]["price"], _price(FEATURES), rtol=1e-5)
    assert skipped["err_no"] == 0 and skipped["values"] == {"price": [[-1.0]]}
    assert refused["err_no"] == 5000
    assert "errcode 7: the features are out of range" in refused["err_msg"]
    assert "step 'uci'" in refused["err_msg"]
    assert raised["err_no"] == 10000 and "RuntimeError: the op broke" in raised["err_msg"]
    assert short["err_no"] == 10000
    assert "preprocess() returned a tuple of 2" in short["err_msg"], short
    assert bad_post["err_no"] == 10000
    assert "postprocess() returned dict; expected (dict, errcode, errinfo)" in bad_post["err_msg"]
