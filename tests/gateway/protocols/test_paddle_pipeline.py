"""Paddle's pipeline messages: NumPy reprs read as literals (never evaluated), Tensor
messages in each of the client's packings, and answers as Paddle writes them."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest

from gateway._proto import pipeline_service_pb2 as pb
from gateway.codecs import paddle_pipeline as pp
from gateway.codecs.errors import paddle_pipeline_error
from gateway.core import errors


@pytest.mark.parametrize(
    "arr",
    [
        np.array([[0.5, 1.0, -2.25e-7, 3e12]]),
        np.array([[0.5, 1.0]], dtype=np.float32),
        np.arange(12, dtype=np.int64).reshape(2, 3, 2),
        np.array([1, -2, 3], dtype=np.int32),
        np.array([True, False]),
        np.array([np.nan, np.inf, -np.inf]),
        np.array(7.5),
        np.linspace(0, 1, 2000, dtype=np.float32).reshape(40, 50),
    ],
)
def test_a_repr_reads_back_as_the_array(arr: np.ndarray) -> None:
    with np.printoptions(threshold=sys.maxsize):  # as PipelineClient sets it
        text = repr(arr)
    got = pp.numpy_literal(text, "x")
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("array([[1.0, 2.0]]); __import__('os').getcwd()", "not a literal array"),
        ("np.array([1])", "not a NumPy array repr"),
        ("array(__import__('os').getcwd())", "not a literal array"),
        ("array([1, 2], dtype=object)", "not a numeric type"),
        ("array([[1, 2], [3]])", "rectangular"),
        ("array([1 2])", "missing ','"),
        ("array([1,, 2])", "misplaced ','"),
        ("array([1, 2]])", "unbalanced"),
        ("array([1, 2)", "not a literal array"),
        ("array(" + "[" * 40 + "1" + "]" * 40 + ")", "nested deeper"),
        ("array([1] [2])", "misplaced '['"),
        ("array(['a', 'b'], dtype='<U1')", "not a"),
    ],
)
def test_anything_but_a_literal_array_is_refused_by_name(text: str, what: str) -> None:
    with pytest.raises(pp.PipelineRequestError, match=re.escape(what)) as info:
        pp.numpy_literal(text, "image")
    assert "'image'" in str(info.value)


def _request(**kw: object) -> bytes:
    return pb.Request(**kw).SerializeToString()  # type: ignore[arg-type]


def test_key_values_are_reprs_or_the_callers_text() -> None:
    call = pp.parse(
        _request(
            key=["a", "b", "c", "d", "pipeline.profile"],
            value=["array([[1, 2]])", "0.5, 1.5", "[[1, 2], [3, 4]]", "hello", "1"],
            logid=7,
        )
    )
    assert call.log_id == 7
    assert set(call.inputs) == {"a", "b", "c", "d"}
    np.testing.assert_array_equal(call.inputs["a"], [[1, 2]])
    assert call.inputs["b"] == [[0.5, 1.5]]  # one instance, as the HTTP key/value form reads it
    assert call.inputs["c"] == [[[1, 2], [3, 4]]]
    assert call.inputs["d"] == ["hello"]


def test_tensors_in_each_packing() -> None:
    saved = io.BytesIO()
    np.save(saved, np.arange(6, dtype=np.float64).reshape(2, 3))
    tensors = [
        pb.Tensor(name="f", elem_type=1, float_data=[1, 2, 3, 4], shape=[2, 2]),
        pb.Tensor(name="i", elem_type=0, int64_data=[5, 6], shape=[2]),
        pb.Tensor(name="u", elem_type=7, uint32_data=[255], shape=[1, 1]),
        pb.Tensor(name="s", elem_type=12, str_data=["ab", "c"]),
        pb.Tensor(name="b", elem_type=13, byte_data=saved.getvalue()),
    ]
    inputs = pp.parse(_request(tensors=tensors)).inputs
    assert inputs["f"].dtype == np.float32 and inputs["f"].shape == (2, 2)
    np.testing.assert_array_equal(inputs["i"], [5, 6])
    assert inputs["u"].dtype == np.uint8
    assert inputs["s"] == ["abc"]  # Paddle joins a string tensor's pieces
    np.testing.assert_array_equal(inputs["b"], np.arange(6).reshape(2, 3))


@pytest.mark.parametrize(
    ("tensor", "what"),
    [
        (pb.Tensor(name="x", elem_type=1, float_data=[1, 2, 3], shape=[2, 2]), "does not hold"),
        (pb.Tensor(name="x", elem_type=42), "elem_type 42"),
        (pb.Tensor(name="x", elem_type=13, byte_data=b"not npy"), "byte_data"),
        (pb.Tensor(elem_type=1, float_data=[1]), "no name"),
    ],
)
def test_bad_tensors_are_refused(tensor: pb.Tensor, what: str) -> None:
    with pytest.raises(pp.PipelineRequestError, match=what):
        pp.parse(_request(tensors=[tensor]))


def test_pickled_bytes_are_never_loaded() -> None:
    saved = io.BytesIO()
    np.save(saved, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(pp.PipelineRequestError, match="byte_data"):
        pp.parse(_request(tensors=[pb.Tensor(name="x", elem_type=13, byte_data=saved.getvalue())]))


@pytest.mark.parametrize(
    "body", [b"\xff\xff\xff", _request(key=["a"]), _request()], ids=["garbage", "unpaired", "empty"]
)
def test_malformed_requests_are_refused(body: bytes) -> None:
    with pytest.raises(pp.PipelineRequestError):
        pp.parse(body)


def test_answers_are_reprs_and_texts() -> None:
    resp = pb.Response()
    resp.ParseFromString(
        pp.answer(
            {"price": np.array([[18.5]], dtype=np.float32), "label": np.array(["positive"], dtype=object)}
        )
    )
    assert (resp.err_no, resp.err_msg) == (0, "")
    assert list(resp.key) == ["price", "label"]
    assert list(resp.value) == ["array([[18.5]], dtype=float32)", "positive"]
    np.testing.assert_array_equal(pp.numpy_literal(resp.value[0]), [[18.5]])


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (pp.PipelineRequestError("bad"), 5000),
        (errors.of_status(401, "no token"), 5000),
        (errors.of_status(404, "no such service"), 3002),
        (errors.of_status(503, "not ready"), 3001),
        (errors.of_status(504, "late"), 6000),
        (errors.of_status(502, "step 'x' failed"), 10000),
        (RuntimeError("a defect"), 10000),
    ],
)
def test_errors_carry_paddles_codes(exc: Exception, code: int) -> None:
    err_no, err_msg = paddle_pipeline_error(exc)
    assert err_no == code
    assert "a defect" not in err_msg  # a defect's details stay in the log


def test_an_rpc_port_is_a_listener_of_its_own() -> None:
    from gateway.config import ConfigError, parse_config

    svc = {"processor": "python", "entry": "samples/processors/echo.py:EchoProcessor", "public": True}
    doc = {
        "gateway": {"port": 9100, "grpc_port": 9101},
        "services": [{**svc, "name": "a", "rpc_port": 9101}, {**svc, "name": "b", "rpc_port": 70000}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert "services[1] (b).rpc_port: must be <= 65535, got 70000" in str(info.value)
    doc["services"] = [{**svc, "name": "a", "rpc_port": 9101}]
    with pytest.raises(ConfigError, match=r"gateway.grpc_port and services \(a\).rpc_port are both 9101"):
        parse_config(doc)
