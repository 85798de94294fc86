"""Paddle Serving's image preprocessing as pipeline transforms on the real gateway: a base64
JPEG decoded, resized, cropped, normalized and transposed in front of an ONNX model, the
model's answer checked against the same preprocessing done here with cv2 and numpy; then
what must be refused (not an image, a mean that does not fit the image) as a 400 naming the
step, with the gateway answering the next call."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.pipeline_http import post, wait_ready

cv2 = pytest.importorskip("cv2")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CHAIN: list[Any] = [
    "base64_to_image",
    "bgr2rgb",
    {"resize": {"size": 40}},
    {"center_crop": {"size": 32}},
    {"div": {"value": 255}},
    {"normalize": {"mean": MEAN, "std": STD}},
    {"transpose": {"transpose_target": [2, 0, 1]}},
]


def _model(path: Path) -> Path:
    """image [N, 3, 32, 32] -> pixels (the same) and means [N, 3] (each channel's mean)."""
    from onnx import TensorProto, helper, save

    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["image"], ["pixels"]),
            helper.make_node("ReduceMean", ["image"], ["means"], axes=[2, 3], keepdims=0),
        ],
        "preprocessed",
        [helper.make_tensor_value_info("image", f32, ["N", 3, 32, 32])],
        [
            helper.make_tensor_value_info("pixels", f32, ["N", 3, 32, 32]),
            helper.make_tensor_value_info("means", f32, ["N", 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))
    return path


def _pipeline(name: str, model: Path, chain: list[Any]) -> dict[str, Any]:
    return {
        "name": name,
        "processor": "pipeline",
        "public": True,
        "pipeline": {
            "inputs": {"image": {"dtype": "bytes", "shape": [-1]}},
            "steps": [
                {"name": "preprocess", "transform": "sequential", "args": {"transforms": chain},
                 "inputs": {"x": "request.image"}, "outputs": ["y"]},
                {"name": "classify", "model": str(model), "placement": "thread",
                 "inputs": {"image": "preprocess.y"}, "outputs": ["pixels", "means"]},
            ],
            "outputs": {"pixels": "classify.pixels", "means": "classify.means"},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("image-transforms")
    model = _model(tmp / "preprocessed.onnx")
    four = [*CHAIN[:5], {"normalize": {"mean": [*MEAN, 0.5], "std": [*STD, 0.5]}}, CHAIN[6]]
    config = {"services": [_pipeline("images", model, CHAIN), _pipeline("rgba-mean", model, four)]}
    proc = GatewayProcess.start(config, tmp)
    try:
        wait_ready(proc)
        yield proc
    finally:
        assert proc.stop() == 0, proc.output()[-3000:]


def _jpeg_b64(h: int, w: int, seed: int) -> str:
    yy, xx = np.mgrid[0:h, 0:w]
    noise = np.random.default_rng(seed).integers(0, 40, (h, w, 3))
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (h + w)], axis=-1) + noise
    ok, buf = cv2.imencode(".jpg", np.clip(img, 0, 255).astype(np.uint8))
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


def _here(b64: str) -> np.ndarray:
    """The same preprocessing, written directly with cv2 and numpy."""
    img = cv2.imdecode(np.frombuffer(base64.b64decode(b64), np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
    h, w = img.shape[:2]
    img = cv2.resize(img, (round(w * 40 / min(h, w)), round(h * 40 / min(h, w))))
    top, left = (img.shape[0] - 32) // 2, (img.shape[1] - 32) // 2
    img = img[top : top + 32, left : left + 32, :].astype("float32") / 255.0
    img = (img - np.array(MEAN).reshape((1, 1, 3))) / np.array(STD).reshape((1, 1, 3))
    return img.transpose((2, 0, 1)).astype(np.float32)


def _infer(gw: GatewayProcess, model: str, images: list[str]) -> tuple[int, Any]:
    doc = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [len(images)], "data": images}]}
    status, body, _ = post(gw, f"/v2/models/{model}/infer", doc)
    return status, body


def test_a_base64_jpeg_preprocessed_as_paddle_does_feeds_the_model(gw: GatewayProcess) -> None:
    images = [_jpeg_b64(48, 64, 1), _jpeg_b64(70, 50, 2)]  # two sizes, one tensor after the crop
    status, body = _infer(gw, "images", images)
    assert status == 200, body
    out = {o["name"]: o for o in body["outputs"]}
    want = np.stack([_here(b) for b in images])
    assert out["pixels"]["shape"] == [2, 3, 32, 32]
    np.testing.assert_allclose(np.reshape(out["pixels"]["data"], want.shape), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.reshape(out["means"]["data"], (2, 3)), want.mean(axis=(2, 3)), atol=1e-4)
    # Paddle's own key/value form, as a Paddle Serving image client sends its base64 text.
    status, body, _ = post(gw, "/images/prediction", {"key": ["image"], "value": [images[0]]})
    assert status == 200 and body["err_no"] == 0, body
    means = dict(zip(body["key"], body["value"], strict=True))["means"]
    np.testing.assert_allclose(json.loads(means), want[:1].mean(axis=(2, 3)), atol=1e-4)


def test_bad_input_is_a_400_naming_the_step_and_the_gateway_goes_on(gw: GatewayProcess) -> None:
    not_an_image = base64.b64encode(b"plain text, not a JPEG").decode()
    status, body = _infer(gw, "images", [not_an_image])
    assert status == 400, body
    assert body["error"].startswith("step 'preprocess': base64_to_image: not an image"), body
    status, body = _infer(gw, "rgba-mean", [_jpeg_b64(48, 64, 3)])
    assert status == 400, body
    assert body["error"].startswith("step 'preprocess': normalize: mean and std have 4 values"), body
    status, body = _infer(gw, "images", [_jpeg_b64(48, 64, 4)])
    assert status == 200, body
