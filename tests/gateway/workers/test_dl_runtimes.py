"""The torch, tensorflow and pmml runtimes in-process: their config (a device only for torch,
a SavedModel is a folder), a file of another format refused with a message naming the format
expected, TorchScript's inputs declared or not, requests batched into one run of the library,
the PMML list of records, and how a request names its TensorFlow signature. The protocols end
to end: tests/e2e/test_runtimes_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk.codecs import eas
from gateway.config import BatchingConfig, ConfigError, ServiceConfig, parse_config
from gateway.config.pipelines import TensorDecl
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.registry import create_processor
from gateway.worker.processors.tensorflow import named_signature
from tests.e2e.runtime_models import ROOT, TF_SIGNATURE, expected, features, same, sample_builder
from tests.runtime_libraries import require_runtime

torch = require_runtime("torch")
require_runtime("sklearn_pmml_model")

IMAGE = TensorDecl("image", "FP32", (-1, 3, 224, 224))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dl-runtimes")
    builder = sample_builder()
    return {"torch": builder.build_torch(folder / "net.pt"), "pmml": builder.build_pmml(folder / "card.pmml")}


def _loaded(processor: str, path: Path, **extra: object) -> object:
    svc = ServiceConfig(name="m", processor=processor, model=str(path), **extra)  # type: ignore[arg-type]
    proc = create_processor(svc)
    proc.load()
    return proc


def _parse(**service: object) -> ServiceConfig:
    return parse_config({"services": [{"name": "m", "public": True, **service}]}).services[0]


def test_config_device_and_saved_model_folder(models: dict[str, Path], tmp_path: Path) -> None:
    assert _parse(processor="torch", model=str(models["torch"]), device="cuda:1").device == "cuda:1"
    assert _parse(processor="torch", model=str(models["torch"])).device == "cpu"
    with pytest.raises(ConfigError, match=r"\(m\)\.device: expected cpu, cuda or cuda:N, got 'gpu0'"):
        _parse(processor="torch", model=str(models["torch"]), device="gpu0")
    with pytest.raises(ConfigError, match=r"\(m\)\.device: only a torch service runs on a device"):
        _parse(processor="pmml", model=str(models["pmml"]), device="cuda")
    with pytest.raises(ConfigError, match=r"\(m\)\.model: not a folder holding saved_model\.pb"):
        _parse(processor="tensorflow", model=str(models["pmml"]))
    with pytest.raises(ConfigError, match=r"\(m\)\.model: not a folder holding saved_model\.pb"):
        _parse(processor="tensorflow", model=str(tmp_path))
    (tmp_path / "saved_model.pb").write_bytes(b"")
    assert _parse(processor="tensorflow", model=str(tmp_path)).model == str(tmp_path)
    # TorchScript takes several tensors: a torch service may declare more than one.
    svc = _parse(processor="torch", model=str(models["torch"]), inputs={"a": "float32", "b": "int64"})
    assert [d.name for d in svc.inputs] == ["a", "b"]


def test_a_file_of_another_format_is_refused_naming_the_one_expected(models: dict[str, Path]) -> None:
    with pytest.raises(LoadError, match=r"cannot load card\.pmml as a TorchScript module \(torch\.jit\.save"):
        _loaded("torch", models["pmml"])
    with pytest.raises(LoadError, match=r"cannot load net\.pt as a PMML file"):
        _loaded("pmml", models["torch"])


def test_torch_declared_inputs_check_requests_and_give_the_outputs(models: dict[str, Path]) -> None:
    proc = _loaded("torch", models["torch"], inputs=(IMAGE,), batching=BatchingConfig(max_batch_size=8))
    meta = proc.metadata()  # type: ignore[attr-defined]
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("image", "FP32", (-1, 3, 224, 224))]
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [
        ("output__0", "FP32", (-1, 10)),
        ("output__1", "INT64", (-1,)),
    ]
    assert proc.supports_batching  # type: ignore[attr-defined]
    x = features("torch", 1)
    answer = proc.handle(WorkerRequest(eas.encode_torch_request([x])))  # type: ignore[attr-defined]
    assert isinstance(answer, WorkerResponse) and answer.status == 200
    outputs, _ = eas.decode_torch_response(answer.body)
    want = expected("torch", models["torch"], x)
    np.testing.assert_allclose(outputs[0].to_tensor("0").array, want["output__0"], rtol=2e-6)
    with pytest.raises(ProcessorError, match=r"input 'image': expected float32\[-1,3,224,224\], got float64"):
        proc.handle(WorkerRequest(eas.encode_torch_request([x.astype(np.float64)])))  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample SavedModel: its signatures take images float32[None,784]."""
    require_runtime("tensorflow")
    path: Path = sample_builder().build_savedmodel(tmp_path_factory.mktemp("saved") / "mnist_saved_model")
    return path


def _torch_call(x: np.ndarray) -> bytes:
    return eas.encode_torch_request([x])


def _torch_answer(body: bytes) -> dict[str, np.ndarray]:
    outputs, _ = eas.decode_torch_response(body)
    return {f"output__{i}": raw.to_tensor(str(i)).array for i, raw in enumerate(outputs)}


def _tf_call(x: np.ndarray, signature: str = TF_SIGNATURE) -> bytes:
    return eas.encode_tf_request(signature, {"images": x})


def _tf_answer(body: bytes) -> dict[str, np.ndarray]:
    return {name: raw.to_tensor(name).array for name, raw in eas.decode_tf_response(body).items()}


@pytest.mark.parametrize("runtime", ["torch", "tensorflow"])
def test_requests_share_one_run_along_rows(
    models: dict[str, Path], runtime: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests of one form share one call of the library (counted where the runtime makes it:
    the TorchScript module, the signature's function) over every caller's rows; each caller
    gets its own rows of what the library computes for them."""
    batching = BatchingConfig(max_batch_size=8)
    calls: list[int] = []  # the rows each call of the library was given
    proc: Any
    if runtime == "torch":
        path = models["torch"]
        proc = _loaded("torch", path, inputs=(IMAGE,), batching=batching)
        module = proc.module
        monkeypatch.setattr(proc, "module", lambda image: calls.append(len(image)) or module(image))
        call, answer = _torch_call, _torch_answer
    else:
        path = request.getfixturevalue("saved_model")
        proc = _loaded("tensorflow", path, batching=batching)
        runner = proc.runners[TF_SIGNATURE]
        function = runner.function
        monkeypatch.setattr(
            runner, "function", lambda **kw: calls.append(len(kw["images"])) or function(**kw)
        )
        call, answer = _tf_call, _tf_answer
        # Another signature is another model: its requests never join these.
        one = features(runtime, 1)
        keys = {proc.prepare(WorkerRequest(_tf_call(one, s))).key for s in ("serving_default", TF_SIGNATURE)}
        assert len(keys) == 2
    assert proc.supports_batching
    x = features(runtime, 6)
    parts = [x[:1], x[1:3], x[3:]]
    items = [proc.prepare(WorkerRequest(call(part))) for part in parts]
    assert len({item.key for item in items}) == 1 and [item.rows for item in items] == [1, 2, 3]
    answers = proc.process_batch(items)
    assert calls == [len(x)]
    for i, (part, got) in enumerate(zip(parts, answers, strict=True)):
        assert isinstance(got, WorkerResponse), got
        outputs = answer(got.body)
        want = expected(runtime, path, part)
        assert set(outputs) == set(want), outputs
        for name, array in want.items():
            same(outputs[name], array, f"caller {i}: {name}")


def test_torch_without_a_declaration_takes_what_the_module_takes(models: dict[str, Path]) -> None:
    proc = _loaded("torch", models["torch"])
    meta = proc.metadata()  # type: ignore[attr-defined]
    assert [(t.name, t.datatype) for t in meta.inputs] == [("image", "UNKNOWN")]  # forward's argument
    assert [t.name for t in meta.outputs] == ["output__0", "output__1"]
    assert not proc.supports_batching  # type: ignore[attr-defined]
    small = np.zeros((1, 3, 8, 8), np.float32)  # any size the convolution takes
    answer = proc.handle(WorkerRequest(eas.encode_torch_request([small])))  # type: ignore[attr-defined]
    assert answer.status == 200
    with pytest.raises(ProcessorError, match=r"model run failed: RuntimeError"):
        proc.handle(WorkerRequest(eas.encode_torch_request([np.zeros((1, 3), np.float32)])))  # type: ignore[attr-defined]


def test_torch_declaration_must_match_forward(models: dict[str, Path]) -> None:
    two = (IMAGE, TensorDecl("mask", "BOOL", (-1,)))
    with pytest.raises(LoadError, match=r"forward takes 1 tensor\(s\) \(image\), the service declares 2"):
        _loaded("torch", models["torch"], inputs=two)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build that sees a GPU can use it")
def test_torch_device_this_build_cannot_use(models: dict[str, Path]) -> None:
    with pytest.raises(LoadError, match=r"device 'cuda:0': this PyTorch build sees no CUDA device"):
        _loaded("torch", models["torch"], device="cuda:0")


def test_pmml_records_in_and_out(models: dict[str, Path]) -> None:
    proc = _loaded("pmml", models["pmml"], batching=BatchingConfig(max_batch_size=8))
    meta = proc.metadata()  # type: ignore[attr-defined]
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("input", "FP64", (-1, 2))]
    x = features("pmml", 3)
    want = expected("pmml", models["pmml"], x)
    body = json.dumps([{"fea1": a, "fea2": b} for a, b in x.tolist()]).encode()
    rows = json.loads(proc.handle(WorkerRequest(body)).body)  # type: ignore[attr-defined]
    assert [r["y"] for r in rows] == want["predict"].tolist()
    got = [[r["probability(0)"], r["probability(1)"]] for r in rows]
    np.testing.assert_allclose(got, want["predict_proba"], rtol=1e-12)
    # Two calls batched: each gets its own row back.
    one, two = (proc.prepare(WorkerRequest(json.dumps([r]).encode())) for r in (rows_of(x, 0), rows_of(x, 1)))  # type: ignore[attr-defined]
    assert one.key == two.key
    answers = proc.process_batch([one, two])  # type: ignore[attr-defined]
    assert [json.loads(a.body)[0]["y"] for a in answers] == want["predict"][:2].tolist()
    for bad, message in (
        (b'[{"fea1": 1}]', "input 'fea2': missing from a record; the model's fields: fea1, fea2"),
        (b'[{"fea1": "one", "fea2": 2}]', "input 'fea1': expected numbers"),
        (b"[1, 2]", "expected a JSON list of records"),
        (b"[]", "expected a JSON list of records"),
        (b'[{"fea1": [1, 2], "fea2": 2}]', "input 'fea1': expected numbers"),
        (b"[{", "cannot decode request as a JSON list of records"),
    ):
        with pytest.raises(ProcessorError, match=message.replace("(", r"\(").replace(")", r"\)")):
            proc.handle(WorkerRequest(bad))  # type: ignore[attr-defined]


def rows_of(x: np.ndarray, i: int) -> dict[str, float]:
    return {"fea1": float(x[i, 0]), "fea2": float(x[i, 1])}


def test_a_request_names_its_signature_in_its_first_field() -> None:
    x = np.zeros((1, 4), np.float32)
    assert named_signature(eas.encode_tf_request("predict_images", {"images": x})) == "predict_images"
    blade = eas.encode_blade_request("predict_words", [eas.BladeInput("x", x)])
    assert named_signature(blade) == "predict_words"
    assert named_signature(eas.encode_tf_request("", {"images": x})) == ""
    assert named_signature(eas.encode_torch_request([x])) == ""
    assert named_signature(b'{"inputs": {"images": [[0, 0, 0, 0]]}}') == ""
    assert named_signature(b'[{"fea1": 1}]') == ""
    assert named_signature(b"\xff\xff\xff") == ""  # not protobuf: no name


def test_the_guides_demo_files_are_the_guides() -> None:
    """samples/runtimes/eas_guide holds the guide's demos as it prints them: each one's code
    is in the guide's text, line for line (its indentation removed)."""
    guide = (ROOT.parent / "shared" / "seeds").glob("002_*.txt")
    text = next(iter(guide), None)
    if text is None:
        pytest.skip("the EAS guide (shared/seeds) is not beside this checkout")
    lines = [line.removeprefix("    ") for line in text.read_text().splitlines()]
    for demo in sorted((ROOT / "samples" / "runtimes" / "eas_guide").glob("*_demo.py")):
        code = demo.read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line == code[0] and lines[i : i + len(code)] == code]
        assert starts, f"{demo.name} differs from the guide"
