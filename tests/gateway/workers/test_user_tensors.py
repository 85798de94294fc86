"""User code over tensors (gateway.worker.processors.user_tensors): how a python processor
declares its inputs and outputs, which calls reach ``predict``/``explain`` as arrays, and
what a result that does not fit its declaration answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.config import ConfigError, ServiceConfig, parse_config
from gateway.core import tensors
from gateway.core.calls import EXPLAIN, VERB_HEADER, WorkerRequest
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.python import PythonProcessor

CODE = '''
import numpy as np

DECL_IN = [{"name": "x", "datatype": "INT32", "shape": [-1, 2]}]
DECL_OUT = [{"name": "total", "datatype": "INT64", "shape": [-1]}]


class Summer:
    inputs = DECL_IN
    outputs = DECL_OUT

    def predict(self, inputs):
        return {"total": inputs["x"].sum(axis=1)}


class Positional(Summer):
    def predict(self, inputs, headers):
        return [inputs["x"].sum(axis=1) + int(headers.get("X-Add", "0"))]


class WrongDtype(Summer):
    def predict(self, inputs):
        return {"total": inputs["x"].sum(axis=1) + 0.5}


class WrongShape(Summer):
    def predict(self, inputs):
        return {"total": inputs["x"]}


class Missing(Summer):
    def predict(self, inputs):
        return {"other": inputs["x"]}


class Undeclared:
    def predict(self, inputs):
        return {}


class BadDecl(Summer):
    inputs = [{"name": "x", "datatype": "FLOAT", "shape": [2]}]


class WithProcess(Summer):
    def process(self, data):
        return b"process:" + data

    def explain(self, inputs):
        return {"total": -inputs["x"].sum(axis=1)}


class Helper:
    """An EAS processor whose own helper happens to be called predict: no declaration."""

    inputs = "not a declaration: never read without predict declared tensors"

    def predict(self, data):
        return data

    def process(self, data):
        return self.predict(data)
'''


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "user_tensor_code.py"
    path.write_text(CODE)
    return path


def processor(code: Path, cls: str) -> PythonProcessor:
    p = PythonProcessor(ServiceConfig(name="m", processor="python", entry=f"{code}:{cls}"))
    p.load()
    return p


def tf_call(x: np.ndarray, **headers: str) -> WorkerRequest:
    return WorkerRequest(tensors.tf_request({"x": x}), headers={"X-Eas-Request-Format": "tf", **headers})


X = np.array([[1, 2], [3, 4]], dtype=np.int32)


def test_declared_tensors_reach_predict_and_the_answer_is_in_the_calls_form(code: Path) -> None:
    p = processor(code, "Summer")
    meta = p.metadata()
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "INT32", (-1, 2))]
    assert meta.tensors and not meta.explains
    out = tensors.tf_outputs(p.handle(tf_call(X)).body)
    assert out["total"].tolist() == [3, 7] and out["total"].dtype == np.int64
    # EAS's JSON form, with no header: a class without process decodes it itself.
    body = json.dumps({"inputs": {"x": [[5, 6]]}}).encode()
    answer = json.loads(p.handle(WorkerRequest(body)).body)
    assert answer["outputs"]["total"] == {"dtype": "int64", "shape": [1], "data": [11]}


def test_a_list_in_the_declared_order_and_the_headers(code: Path) -> None:
    p = processor(code, "Positional")
    out = tensors.tf_outputs(p.handle(tf_call(X, **{"X-Add": "10"})).body)
    assert out["total"].tolist() == [13, 17]


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        ("WrongDtype", "predict() output 'total': float64 cannot be answered as the declared INT64"),
        ("WrongShape", "predict() output 'total': shape [2, 2], declared [-1]"),
        ("Missing", "predict() returned no output 'total'"),
    ],
)
def test_a_result_that_does_not_fit_is_a_500_naming_the_output(code: Path, cls: str, message: str) -> None:
    with pytest.raises(ProcessorError) as info:
        processor(code, cls).handle(tf_call(X))
    assert info.value.status == 500 and info.value.message == message


def test_bad_inputs_are_a_400_naming_the_input(code: Path) -> None:
    p = processor(code, "Summer")
    with pytest.raises(ProcessorError) as info:
        p.handle(tf_call(X.astype(np.float32)))
    assert info.value.status == 400
    assert info.value.message == "input 'x': expected int32[-1,2], got float32[2,2]"
    with pytest.raises(ProcessorError) as info:
        p.handle(tf_call(np.ones((2, 3), np.int32)))
    assert info.value.status == 400 and "input 'x'" in info.value.message


def test_declarations_that_cannot_load(code: Path) -> None:
    with pytest.raises(LoadError, match=r"predict\(inputs\) needs the inputs declared"):
        processor(code, "Undeclared")
    with pytest.raises(TypeError, match="datatype 'FLOAT' is not one of"):
        processor(code, "BadDecl")


def test_process_keeps_eas_bodies_and_explain_is_asked_by_the_verb(code: Path) -> None:
    p = processor(code, "WithProcess")
    assert p.metadata().explains
    assert p.handle(WorkerRequest(b"raw")).body == b"process:raw"
    out = tensors.tf_outputs(p.handle(tf_call(X, **{VERB_HEADER: EXPLAIN})).body)
    assert out["total"].tolist() == [-3, -7]
    helper = processor(code, "Helper")  # no declaration: an EAS processor as ever
    assert not helper.metadata().tensors
    assert helper.handle(WorkerRequest(b"abc", headers={"X-Eas-Request-Format": "json"})).body == b"abc"


def test_the_service_config_may_declare_the_tensors(code: Path) -> None:
    svc = {"name": "m", "processor": "python", "entry": f"{code}:Undeclared", "public": True}
    decl = {
        "inputs": {"x": {"dtype": "int32", "shape": [-1, 2]}},
        "outputs": {"total": {"dtype": "INT64", "shape": [-1]}},
    }
    config = parse_config({"services": [{**svc, **decl}]})
    p = PythonProcessor(config.services[0])
    p.load()  # Undeclared alone cannot load: its predict has no declared inputs
    meta = p.metadata()
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "INT32", (-1, 2))]
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [("total", "INT64", (-1,))]
    with pytest.raises(ProcessorError) as info:
        p.handle(tf_call(X))  # its predict answers {}, which the declared outputs do not fit
    assert info.value.message == "predict() returned no output 'total'"
    with pytest.raises(ConfigError, match=r"outputs\.total: give its dtype and shape"):
        parse_config({"services": [{**svc, "inputs": decl["inputs"], "outputs": ["total"]}]})
    with pytest.raises(ConfigError, match="only a python service declares its outputs"):
        parse_config({"services": [{"name": "o", "processor": "onnx", "model": str(code), **decl}]})
