"""The image transforms' vocabulary and their args' checks: Paddle Serving's
``paddle_serving_app`` preprocessing (``File2Image``/``Base64ToImage``, ``BGR2RGB``, ``Div``,
``Normalize``, ``Resize``, ``CenterCrop``, ``Transpose``, ``Sequential``) as built-in pipeline
transforms, with Paddle's own argument names. They run in gateway.worker.image_ops, on OpenCV
(the ``images-cv`` extra), which is imported only when a pipeline uses one of them."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

# name -> the args it takes. Each reads ``x`` and gives ``y``.
IMAGE_TRANSFORMS: dict[str, frozenset[str]] = {
    "decode_image": frozenset(),  # File2Image / String2Image: an image file's bytes
    "base64_to_image": frozenset(),  # Base64ToImage
    "bgr2rgb": frozenset(),
    "rgb2bgr": frozenset(),
    "div": frozenset({"value"}),
    "normalize": frozenset({"mean", "std", "channel_first"}),
    "resize": frozenset({"size", "max_size", "interpolation"}),
    "center_crop": frozenset({"size"}),
    "transpose": frozenset({"transpose_target"}),
    "sequential": frozenset({"transforms"}),
}
DECODERS = ("decode_image", "base64_to_image")
# What a transform's ``y`` is when fixed; the others keep their input's type.
IMAGE_DTYPES = {"decode_image": "UINT8", "base64_to_image": "UINT8", "div": "FP32", "normalize": "FP32"}
# cv2's interpolation flags by name (cv2.INTER_*); Paddle's default (None) is cv2.resize's: linear.
INTERPOLATIONS = {"nearest": 0, "linear": 1, "cubic": 2, "area": 3, "lanczos4": 4, "linear_exact": 5}
_USES_CV2 = ("decode_image", "base64_to_image", "resize")
_MAX_SIZE = 2147483647


class ImageArgsError(ValueError):
    """Args that cannot run: ``where`` is the arg (relative to the step's ``args``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImageArgsError(where, f"expected a number, got {value!r}")
    return float(value)


def _size(value: Any, where: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return
    raise ImageArgsError(where, f"expected a positive integer, got {value!r}")


def _numbers(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise ImageArgsError(where, f"expected a non-empty list of numbers, got {value!r}")
    return [_number(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _check_one(name: str, args: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(map(str, args)) - IMAGE_TRANSFORMS[name])
    if unknown:
        raise ImageArgsError(where, f"unknown arg(s) {', '.join(unknown)} for {name}")
    if name == "div":
        if "value" not in args or _number(args["value"], f"{where}.value") == 0:
            raise ImageArgsError(f"{where}.value", "required: a number other than 0")
    elif name == "normalize":
        for key in ("mean", "std"):
            if key not in args:
                raise ImageArgsError(f"{where}.{key}", "required: one number per channel")
        mean, std = _numbers(args["mean"], f"{where}.mean"), _numbers(args["std"], f"{where}.std")
        if len(mean) != len(std):
            raise ImageArgsError(f"{where}.std", f"has {len(std)} values but mean has {len(mean)}")
        if 0.0 in std:
            raise ImageArgsError(f"{where}.std", "a standard deviation of 0")
        if not isinstance(args.get("channel_first", False), bool):
            raise ImageArgsError(f"{where}.channel_first", "expected true or false")
    elif name == "resize":
        size = args.get("size")
        if isinstance(size, list):
            if len(size) != 2:
                raise ImageArgsError(f"{where}.size", f"expected [width, height], got {size!r}")
            for i, v in enumerate(size):
                _size(v, f"{where}.size[{i}]")
        else:
            _size(size, f"{where}.size")
        if "max_size" in args:
            _size(args["max_size"], f"{where}.max_size")
        interp = args.get("interpolation")
        flag = isinstance(interp, int) and not isinstance(interp, bool) and interp in INTERPOLATIONS.values()
        if interp is not None and not flag and interp not in INTERPOLATIONS:
            raise ImageArgsError(
                f"{where}.interpolation",
                f"expected one of {', '.join(INTERPOLATIONS)} (or its cv2.INTER_* value)",
            )
    elif name == "center_crop":
        _size(args.get("size"), f"{where}.size")
    elif name == "transpose":
        axes = args.get("transpose_target")
        ints = isinstance(axes, list) and all(isinstance(a, int) and not isinstance(a, bool) for a in axes)
        if not ints or not axes or sorted(axes) != list(range(len(axes))):
            raise ImageArgsError(
                f"{where}.transpose_target", f"expected a permutation such as [2, 0, 1], got {axes!r}"
            )


def sequence(args: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A ``sequential``'s transforms as (name, args): each item is a name, or a mapping of one
    name to its args."""
    out: list[tuple[str, dict[str, Any]]] = []
    for item in args.get("transforms") or []:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, Mapping) and len(item) == 1:
            name, inner = next(iter(item.items()))
            out.append((str(name), dict(inner or {})))
        else:
            out.append(("", {}))
    return out


def check_image_args(name: str, args: Mapping[str, Any]) -> None:
    """Raise ImageArgsError unless ``args`` are ones the image transform ``name`` runs with."""
    if name != "sequential":
        _check_one(name, args, "args")
    else:
        unknown = sorted(set(map(str, args)) - IMAGE_TRANSFORMS[name])
        if unknown:
            raise ImageArgsError("args", f"unknown arg(s) {', '.join(unknown)} for sequential")
        items = args.get("transforms")
        if not isinstance(items, list) or not items:
            raise ImageArgsError("args.transforms", "expected a non-empty list of transforms")
        for i, (inner, inner_args) in enumerate(sequence(args)):
            where = f"args.transforms[{i}]"
            if inner not in IMAGE_TRANSFORMS or inner == "sequential":
                known = ", ".join(n for n in IMAGE_TRANSFORMS if n != "sequential")
                raise ImageArgsError(where, f"expected an image transform ({known}) or {{name: args}}")
            if inner in DECODERS and i:
                raise ImageArgsError(where, f"{inner} decodes the input, so it can only come first")
            _check_one(inner, inner_args, where)
    names = [n for n, _ in sequence(args)] if name == "sequential" else [name]
    if any(n in _USES_CV2 for n in names) and importlib.util.find_spec("cv2") is None:
        raise ImageArgsError("transform", f"{name} needs OpenCV: pip install 'easkit[images-cv]'")


def image_dtype(name: str, args: Mapping[str, Any]) -> str | None:
    """The V2 datatype of an image transform's ``y``, or None where it keeps its input's."""
    found = None
    for inner, _ in sequence(args) if name == "sequential" else [(name, args)]:
        found = IMAGE_DTYPES.get(inner, found)
    return found


__all__ = [
    "DECODERS",
    "IMAGE_TRANSFORMS",
    "INTERPOLATIONS",
    "ImageArgsError",
    "check_image_args",
    "image_dtype",
    "sequence",
]
