"""The image transforms (Paddle Serving's preprocessing) against the same operations written
directly with cv2 and numpy, with the same parameters: exact where the step is integer work,
to float32 rounding where it is float work; and their args checked at load."""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from gateway.config import ConfigError, parse_config
from gateway.worker.op_types import OpError
from gateway.worker.ops import TRANSFORM_FUNCTIONS

cv2 = pytest.importorskip("cv2")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _image(h: int = 37, w: int = 53, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _jpeg(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def _run(name: str, x: Any, **args: Any) -> np.ndarray:
    return TRANSFORM_FUNCTIONS[name](args, {"x": x})["y"]


def test_decoders_are_imdecode_of_the_file_bytes() -> None:
    data = _jpeg(_image())
    want = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(_run("decode_image", np.array([data], dtype=object)), want[None])
    np.testing.assert_array_equal(_run("decode_image", data), want)
    b64 = base64.b64encode(data).decode()
    np.testing.assert_array_equal(
        _run("base64_to_image", np.array([b64, b64], dtype=object)), np.stack([want, want])
    )


def test_channel_flip_div_and_transpose_are_numpy_s() -> None:
    img = _image()
    np.testing.assert_array_equal(_run("bgr2rgb", img), img[:, :, ::-1])
    got = _run("div", img, value=255)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, img.astype("float32") / 255.0)
    np.testing.assert_array_equal(
        _run("transpose", img, transpose_target=[2, 0, 1]), img.transpose((2, 0, 1))
    )
    batch = np.stack([img, img[::-1]])
    np.testing.assert_array_equal(
        _run("transpose", batch, transpose_target=[2, 0, 1]), batch.transpose((0, 3, 1, 2))
    )


@pytest.mark.parametrize("channel_first", [False, True])
def test_normalize_is_per_channel_mean_and_std_in_float32(channel_first: bool) -> None:
    img = _image().astype("float32") / 255.0
    if channel_first:
        img = img.transpose((2, 0, 1))
    shape = (3, 1, 1) if channel_first else (1, 1, 3)
    want = (img.astype(np.float64) - np.array(MEAN).reshape(shape)) / np.array(STD).reshape(shape)
    got = _run("normalize", img, mean=MEAN, std=STD, channel_first=channel_first)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "args",
    [
        {"size": 64},  # the shorter side to 64
        {"size": [40, 30]},  # Paddle's (width, height)
        {"size": 64, "max_size": 80},  # the longer side at most 80
    ],
)
def test_resize_matches_cv2_resize_with_paddle_s_sizes(args: dict[str, Any]) -> None:
    img = _image()
    h, w = img.shape[:2]
    if isinstance(args["size"], list):
        want_wh = tuple(args["size"])
    else:
        percent = args["size"] / min(h, w)
        if round(percent * max(h, w)) > args.get("max_size", 1 << 40):
            percent = args["max_size"] / max(h, w)
        want_wh = (round(w * percent), round(h * percent))
    np.testing.assert_array_equal(_run("resize", img, **args), cv2.resize(img, want_wh))
    cubic = cv2.resize(img, want_wh, interpolation=cv2.INTER_CUBIC)
    np.testing.assert_array_equal(_run("resize", img, interpolation="cubic", **args), cubic)
    np.testing.assert_array_equal(_run("resize", img, interpolation=cv2.INTER_CUBIC, **args), cubic)


def test_resize_of_the_shorter_side_keeps_the_aspect() -> None:
    assert _run("resize", _image(37, 53), size=64).shape == (64, 92, 3)
    assert _run("resize", _image(53, 37), size=64).shape == (92, 64, 3)


def test_center_crop_is_the_middle_slice() -> None:
    img = _image()
    top, left = (37 - 20) // 2, (53 - 20) // 2
    np.testing.assert_array_equal(_run("center_crop", img, size=20), img[top : top + 20, left : left + 20, :])


def test_sequential_is_the_chain_per_image_then_stacked() -> None:
    imgs = [_image(37, 53, 1), _image(60, 45, 2)]  # different sizes: resized and cropped to one
    data = [base64.b64encode(_jpeg(i)).decode() for i in imgs]
    chain = [
        "base64_to_image",
        "bgr2rgb",
        {"resize": {"size": 32}},
        {"center_crop": {"size": 24}},
        {"div": {"value": 255}},
        {"normalize": {"mean": MEAN, "std": STD}},
        {"transpose": {"transpose_target": [2, 0, 1]}},
    ]
    got = _run("sequential", np.array(data, dtype=object), transforms=chain)
    want = []
    for b64 in data:
        img = cv2.imdecode(np.frombuffer(base64.b64decode(b64), np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
        h, w = img.shape[:2]
        img = cv2.resize(img, (round(w * 32 / min(h, w)), round(h * 32 / min(h, w))))
        top, left = (img.shape[0] - 24) // 2, (img.shape[1] - 24) // 2
        img = img[top : top + 24, left : left + 24, :].astype("float32") / 255.0
        img = (img - np.array(MEAN).reshape((1, 1, 3))) / np.array(STD).reshape((1, 1, 3))
        want.append(img.transpose((2, 0, 1)))
    assert got.shape == (2, 3, 24, 24) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "x", "args", "needle"),
    [
        ("decode_image", np.array([b"not an image"], dtype=object), {}, "decode_image: not an image"),
        ("base64_to_image", np.array(["%%%"], dtype=object), {}, "base64_to_image: not"),
        ("normalize", np.zeros((4, 4, 3), np.float32), {"mean": [0, 0], "std": [1, 1]}, "2 values"),
        ("center_crop", np.zeros((4, 4, 3), np.uint8), {"size": 8}, "does not fit"),
        ("bgr2rgb", np.zeros((4, 4), np.uint8), {}, "expected an image"),
        ("resize", np.array([b"x"], dtype=object), {"size": 4}, "decode it first"),
    ],
)
def test_bad_input_is_a_400_naming_the_transform(
    name: str, x: Any, args: dict[str, Any], needle: str
) -> None:
    with pytest.raises(OpError) as info:
        _run(name, x, **args)
    assert info.value.status == 400
    assert needle in info.value.message


def _load(step_args: dict[str, Any], transform: str = "normalize") -> None:
    parse_config({
        "services": [{
            "name": "p", "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"x": "float32"},
                "steps": [{"name": "pre", "transform": transform, "args": step_args,
                           "inputs": {"x": "request.x"}, "outputs": ["y"]}],
                "outputs": {"y": "pre.y"},
            },
        }]
    })  # fmt: skip


@pytest.mark.parametrize(
    ("transform", "args", "needle"),
    [
        (
            "normalize",
            {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5]},
            "(pre).args.std: has 2 values but mean has 3",
        ),
        ("normalize", {"mean": [0.5]}, "(pre).args.std: required"),
        ("div", {"value": 0}, "(pre).args.value"),
        ("resize", {"size": [1, 2, 3]}, "(pre).args.size"),
        ("resize", {"size": 8, "interpolation": "bilinear"}, "(pre).args.interpolation"),
        ("resize", {"size": 8, "interpolation": True}, "(pre).args.interpolation"),
        ("transpose", {"transpose_target": [0, 0, 1]}, "(pre).args.transpose_target"),
        ("sequential", {"transforms": ["bgr2rgb", "decode_image"]}, "transforms[1]: decode_image decodes"),
        ("sequential", {"transforms": [{"softmax": {}}]}, "transforms[0]: expected an image transform"),
        ("sequential", {"transforms": [{"center_crop": {"size": -1}}]}, "transforms[0].size"),
    ],
)
def test_bad_args_fail_the_load_naming_the_step_and_arg(
    transform: str, args: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(args, transform)
    assert needle in str(info.value)


def test_good_args_load() -> None:
    _load({"mean": MEAN, "std": STD, "channel_first": True})
    _load({"size": 8, "interpolation": 3}, "resize")  # Paddle passes cv2.INTER_AREA itself
    _load(
        {"transforms": ["decode_image", {"resize": {"size": [8, 8], "interpolation": "area"}}]}, "sequential"
    )


def test_a_sequential_s_output_type_is_known_to_the_check() -> None:
    """A decoder's chain ending in normalize gives float32: a step declaring int64 is refused."""
    steps = [
        {"name": "pre", "transform": "sequential", "inputs": {"x": "request.x"}, "outputs": ["y"],
         "args": {"transforms": ["base64_to_image", {"div": {"value": 255}}]}},
        {"name": "top", "transform": "argmax", "inputs": {"x": {"from": "pre.y", "dtype": "int64"}},
         "outputs": ["index"]},
    ]  # fmt: skip
    pipeline = {"inputs": {"x": "bytes"}, "steps": steps, "outputs": {"i": "top.index"}}
    with pytest.raises(ConfigError, match=r"expects INT64, but pre\.y is FP32"):
        parse_config(
            {"services": [{"name": "p", "processor": "pipeline", "public": True, "pipeline": pipeline}]}
        )


def test_opencv_is_imported_only_by_a_pipeline_that_uses_it() -> None:
    code = "import sys, gateway.worker.ops, gateway.backends.pipelines; assert 'cv2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_missing_opencv_fails_the_load_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cv2" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"\(pre\)\.transform: resize needs OpenCV: pip install 'easkit\[images-cv\]'"
    ):
        _load({"size": 8}, "resize")
    _load({"value": 2}, "div")  # numpy alone
