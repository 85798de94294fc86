"""Model metadata: what processors report about their inputs and outputs (checked against
the onnx package), and what a user's python processor may declare."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gateway.config import ServiceConfig
from gateway.core.metadata import ModelMetadata, TensorSpec, misfit
from gateway.worker.agent import metadata_json
from gateway.worker.processors.onnx import OnnxProcessor
from gateway.worker.processors.python import PythonProcessor

_ONNX_TO_NAME = {
    TensorProto.FLOAT: "FP32",
    TensorProto.INT64: "INT64",
    TensorProto.DOUBLE: "FP64",
    TensorProto.UINT8: "UINT8",
    TensorProto.STRING: "BYTES",
    TensorProto.BOOL: "BOOL",
    TensorProto.INT32: "INT32",
    TensorProto.FLOAT16: "FP16",
}


def _expected(
    values: list[onnx.ValueInfoProto], skip: set[str] = frozenset()
) -> list[tuple[str, str, tuple[int, ...]]]:
    out = []
    for vi in values:
        if vi.name in skip:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out.append((vi.name, _ONNX_TO_NAME[tt.elem_type], dims))
    return out


def _onnx(path: Path) -> OnnxProcessor:
    p = OnnxProcessor(ServiceConfig(name="m", processor="onnx", model=str(path)))
    p.load()
    return p


def _triples(specs: tuple[TensorSpec, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(t.name, t.datatype, t.shape) for t in specs]


def test_onnx_metadata_matches_the_onnx_package_for_every_sample_model(models: dict[str, Path]) -> None:
    paths = sorted({p for p in models.values() if p.suffix == ".onnx"})
    assert len(paths) >= 3
    for path in paths:
        model = onnx.load(str(path))
        inits = {t.name for t in model.graph.initializer}
        meta = _onnx(path).metadata()
        assert meta.platform == "onnxruntime_onnx" and meta.versions == ("1",)
        assert _triples(meta.inputs) == _expected(list(model.graph.input), inits), path
        assert _triples(meta.outputs) == _expected(list(model.graph.output)), path


def test_initializers_listed_as_inputs_are_not_inputs(tmp_path: Path) -> None:
    # IR < 4 models list their weights among the graph inputs.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    weights = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x, w], [y], [weights])
    path = tmp_path / "old.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 3
    path.write_bytes(model.SerializeToString())
    meta = _onnx(path).metadata()
    assert [t.name for t in meta.inputs] == ["x"]
    assert meta.inputs[0].shape == (-1, 2)


def test_a_file_that_is_not_onnx_fails_the_load(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\xff\xff\xff\xff not a model")
    with pytest.raises(Exception, match=r"(?i)protobuf|invalid|load"):
        _onnx(path)


def test_metadata_travels_over_the_worker_pipe(models: dict[str, Path]) -> None:
    meta = _onnx(models["digits"]).metadata()
    assert pickle.loads(pickle.dumps(meta)) == meta  # noqa: S301 - our own bytes
    assert meta.inputs[0].as_json() == {"name": "input", "datatype": "FP32", "shape": [-1, 64]}


def _python(tmp_path: Path, body: str) -> PythonProcessor:
    src = tmp_path / "proc.py"
    src.write_text(f"class P:\n    def process(self, data):\n        return data\n{body}")
    p = PythonProcessor(ServiceConfig(name="py", processor="python", entry=f"{src}:P"))
    p.load()
    return p


def test_a_python_processor_without_metadata_reports_none(tmp_path: Path) -> None:
    assert _python(tmp_path, "").metadata() == ModelMetadata()


def test_a_python_processor_declares_its_metadata(tmp_path: Path) -> None:
    body = (
        "    def metadata(self):\n"
        "        return {'platform': 'custom',\n"
        "                'inputs': [{'name': 'x', 'datatype': 'FP32', 'shape': [-1, 3]}],\n"
        "                'outputs': [{'name': 'y', 'datatype': 'BYTES', 'shape': [-1]}]}\n"
    )
    meta = _python(tmp_path, body).metadata()
    assert meta == ModelMetadata(
        (TensorSpec("x", "FP32", (-1, 3)),), (TensorSpec("y", "BYTES", (-1,)),), platform="custom"
    )


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("42", "expected a mapping"),
        ("{'inputs': 'x'}", "inputs must be a list"),
        ("{'inputs': [{'datatype': 'FP32'}]}", r"inputs\[0\]: name"),
        ("{'outputs': [{'name': 'y', 'datatype': 'float'}]}", "datatype 'float'"),
        ("{'inputs': [{'name': 'x', 'shape': [2.5]}]}", "shape must be a list of integers"),
        ("{'platform': 3}", "platform must be a string"),
    ],
)
def test_malformed_python_metadata_fails_the_load(tmp_path: Path, returned: str, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _python(tmp_path, f"    def metadata(self):\n        return {returned}\n")


def test_only_a_signature_the_workers_check_refuses_calls_early(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """The onnx processor checks every call against its signature: the gateway may refuse what
    it would, with its words; a signature nothing checks, or a call only the workers can
    judge (an input missing or unknown, a rank the model leaves open), goes on to them."""
    meta = _onnx(models["digits"]).metadata()
    assert meta.checks_inputs
    assert ModelMetadata.from_json(metadata_json(meta)) == meta  # as a remote worker registers it
    f32, strings = np.dtype(np.float32), np.dtype(object)
    assert misfit(meta, {"input": (f32, (3, 64))}) is None
    assert (
        misfit(meta, {"input": (strings, (3, 64))})
        == "input 'input': expected float32[N,64], got string[3,64]"
    )
    assert misfit(meta, {"input": (np.dtype(np.int64), (3, 63))}, loose={"input"}) == (
        "input 'input': expected float32[N,64], got float32[3,63]"  # a loose input is cast first
    )
    assert misfit(meta, {"input": (np.dtype(np.int64), (3, 64))}, loose={"input"}) is None
    assert misfit(meta, {}) is None and misfit(meta, {"input": (f32, (1,)), "x": (f32, (1,))}) is None
    assert misfit(replace(meta, checks_inputs=False), {"input": (strings, (3, 64))}) is None
    open_rank = replace(meta, inputs=(TensorSpec("input", "FP32", ()),))
    assert misfit(open_rank, {"input": (f32, (3, 63))}) is None
    assert (
        misfit(open_rank, {"input": (strings, (3, 63))})
        == "input 'input': expected float32[], got string[3,63]"
    )
    declared = (
        "    def metadata(self):\n"
        "        return {'inputs': [{'name': 'x', 'datatype': 'FP32', 'shape': [-1]}]}\n"
    )
    assert not _python(tmp_path, declared).metadata().checks_inputs
