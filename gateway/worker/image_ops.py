"""Paddle Serving's image preprocessing (``paddle_serving_app.reader``) as built-in pipeline
transforms, computed as paddle_serving_app computes them (cv2.imdecode, cv2.resize, numpy),
so a model gets the same tensor it got behind Paddle's op. Their args are checked at load by
gateway.config.image_transforms.

An image is an (H, W, C) array, as cv2 decodes it (BGR, uint8). A rank-4 value is a batch of
them: each image goes through the transform alone and the results are stacked. A decoder
turns a string tensor into images (one per element, in its shape); ``sequential`` runs its
chain on each element (or each image of a batch) and stacks what comes out, so images of
different sizes may be resized and cropped to one before they are stacked. Input that is not
what a transform takes is a 400 naming the step. OpenCV is imported at the first call.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

from gateway.config.image_transforms import DECODERS, INTERPOLATIONS, sequence
from gateway.worker.op_types import OpError

Image = Callable[[Any], np.ndarray]


@cache
def _cv2() -> ModuleType:
    try:
        import cv2  # only a pipeline with an image transform needs OpenCV
    except ImportError:
        raise OpError("image transforms need OpenCV: pip install 'easkit[images-cv]'", 500) from None
    return cv2


def _bad(message: str) -> OpError:
    return OpError(message, 400)


def _imdecode(data: bytes, name: str) -> np.ndarray:
    cv2 = _cv2()
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
    except cv2.error:
        img = None
    if img is None:
        raise _bad(f"{name}: not an image ({len(data)} bytes that OpenCV cannot decode)")
    return img


def _file_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _bad(f"decode_image: expected an image file's bytes, got {type(value).__name__}")


def _decode_image(value: Any) -> np.ndarray:
    """File2Image / String2Image, of bytes the client read from the file."""
    return _imdecode(_file_bytes(value), "decode_image")


def _base64_to_image(value: Any) -> np.ndarray:
    if not isinstance(value, str | bytes | bytearray):
        raise _bad(f"base64_to_image: expected base64 text, got {type(value).__name__}")
    try:
        data = base64.b64decode(value)
    except (binascii.Error, ValueError) as exc:
        raise _bad(f"base64_to_image: not base64 ({exc})") from None
    return _imdecode(data, "base64_to_image")


def _image(img: np.ndarray, name: str) -> np.ndarray:
    if img.ndim != 3:
        raise _bad(f"{name}: expected an image (height, width, channels), got shape {list(img.shape)}")
    return img


def _bgr2rgb(args: Mapping[str, Any]) -> Image:
    return lambda img: _image(img, "bgr2rgb")[:, :, ::-1]


def _div(args: Mapping[str, Any]) -> Image:
    value = float(args["value"])
    return lambda img: np.asarray(img).astype("float32") / value


def _normalize(args: Mapping[str, Any]) -> Image:
    first = bool(args.get("channel_first", False))
    n = len(args["mean"])
    shape = (n, 1, 1) if first else (1, 1, n)
    mean, std = np.array(args["mean"]).reshape(shape), np.array(args["std"]).reshape(shape)

    def run(img: np.ndarray) -> np.ndarray:
        channels = _image(img, "normalize").shape[0 if first else 2]
        if channels != n:
            where = "first" if first else "last"
            raise _bad(
                f"normalize: mean and std have {n} values, the image has {channels} channels ({where} axis)"
            )
        out = np.array(img).astype("float32")
        out -= mean
        out /= std
        return out

    return run


def _resize(args: Mapping[str, Any]) -> Image:
    size, max_size = args["size"], int(args.get("max_size", 2147483647))
    interpolation = args.get("interpolation")

    def run(img: np.ndarray) -> np.ndarray:
        h, w = _image(img, "resize").shape[:2]
        if isinstance(size, list):  # Paddle's (width, height) tuple
            width, height = min(size[0], max_size), min(size[1], max_size)
        else:  # the shorter side to ``size``, the longer one at most ``max_size``
            percent = float(size) / min(h, w)
            if np.round(percent * max(h, w)) > max_size:
                percent = float(max_size) / float(max(h, w))
            width, height = round(w * percent), round(h * percent)  # half to even, as Paddle rounds
        if interpolation is None:
            return _cv2().resize(img, (width, height))
        flag = INTERPOLATIONS.get(interpolation, interpolation)  # a name, or Paddle's cv2.INTER_* value
        return _cv2().resize(img, (width, height), interpolation=flag)

    return run


def _center_crop(args: Mapping[str, Any]) -> Image:
    size = int(args["size"])

    def run(img: np.ndarray) -> np.ndarray:
        h, w = _image(img, "center_crop").shape[:2]
        if size > h or size > w:
            raise _bad(f"center_crop: a {size}x{size} crop does not fit a {h}x{w} image; resize first")
        top, left = (h - size) // 2, (w - size) // 2
        return img[top : top + size, left : left + size, :]

    return run


def _transpose(args: Mapping[str, Any]) -> Image:
    axes = tuple(args["transpose_target"])

    def run(img: np.ndarray) -> np.ndarray:
        if img.ndim != len(axes):
            raise _bad(f"transpose: transpose_target {list(axes)} does not fit shape {list(img.shape)}")
        return img.transpose(axes)

    return run


_MAKERS: dict[str, Callable[[Mapping[str, Any]], Image]] = {
    "bgr2rgb": _bgr2rgb,
    "rgb2bgr": _bgr2rgb,  # the same channel flip
    "div": _div,
    "normalize": _normalize,
    "resize": _resize,
    "center_crop": _center_crop,
    "transpose": _transpose,
}
_DECODE: dict[str, Callable[[Any], np.ndarray]] = {
    "decode_image": _decode_image,
    "base64_to_image": _base64_to_image,
}


def _stack(images: list[np.ndarray], shape: tuple[int, ...], name: str) -> np.ndarray:
    if len({i.shape for i in images}) > 1:
        found = sorted({str(list(i.shape)) for i in images})
        raise _bad(
            f"{name}: the images differ in shape ({', '.join(found)}); resize and crop them in a sequential"
        )
    return np.stack(images).reshape(shape + images[0].shape)


def _per_item(x: Any, name: str, decoder: Callable[[Any], np.ndarray] | None, chain: Image) -> np.ndarray:
    """``chain`` on each string element (after ``decoder``), or on each image of a batch."""
    arr = np.asarray(x) if not isinstance(x, bytes | str) else np.array(x, dtype=object)
    if decoder is not None:
        if arr.dtype.kind not in "OSU":
            raise _bad(f"{name}: expected a string tensor of encoded images, got {arr.dtype}")
        if arr.size == 0:
            raise _bad(f"{name}: no image given")
        return _stack([chain(decoder(v)) for v in arr.reshape(-1)], arr.shape, name)
    if arr.dtype.kind not in "biuf":
        raise _bad(f"{name}: expected a numeric image, got {arr.dtype} (decode it first)")
    if arr.ndim == 4:
        return _stack([chain(img) for img in arr], arr.shape[:1], name)
    return chain(arr)


def image_transform(name: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, np.ndarray]]:
    """The transform function of the image transform ``name`` (as gateway.worker.ops runs them)."""

    def run(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        steps = sequence(args) if name == "sequential" else [(name, args)]
        decoder = _DECODE[steps[0][0]] if steps[0][0] in DECODERS else None
        fns = [_MAKERS[n](a) for n, a in steps if n not in DECODERS]

        def chain(img: np.ndarray) -> np.ndarray:
            for fn in fns:
                img = fn(img)
            return img

        if name == "div":  # element-wise on any shape
            x = np.asarray(inputs["x"])
            if x.dtype.kind not in "biuf":
                raise _bad(f"div: expected a numeric tensor, got {x.dtype}")
            return {"y": fns[0](x)}
        return {"y": _per_item(inputs["x"], name, decoder, chain)}

    return run


__all__ = ["image_transform"]
