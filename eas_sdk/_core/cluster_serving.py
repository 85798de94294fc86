"""I/O-free codec for the Cluster Serving style API (shared by eas_sdk and the gateway).

Cluster Serving knows four input kinds; each becomes ONNX model inputs in the JSON
form the onnx processor reads (``{"inputs": {name: {"shape", "dtype", "data"}}}``):

* dense tensor (numpy array, nested list, scalar) -> input ``name`` as given;
* list of strings                                -> input ``name``, dtype ``string``;
* image (base64 bytes or a file path)            -> input ``name``, uint8 RGB, H x W x 3;
* sparse tensor (COO)                            -> three inputs ``name.indices`` (int64,
  ``[nnz, ndim]``), ``name.values`` (``[nnz]``) and ``name.shape`` (int64, ``[ndim]``),
  the layout ONNX ``ScatterND`` takes, so a model densifies it with
  ``ScatterND(ConstantOfShape(shape), indices, values)`` or works on the values directly.
  Sparse tensors are passed, never densified on the wire: a 100 x 10000 x 10 tensor with
  four values stays four values.

Every instance carries a leading batch axis: one instance is a batch of one, and the
gateway's REST path stacks N instances into a batch of N (sparse: a batch coordinate is
prepended to each index row and N to the shape, as TensorFlow batches sparse tensors).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SPARSE_SUFFIXES = (".indices", ".values", ".shape")

# numpy dtype name <-> wire dtype name used by the onnx processor's JSON form.
_WIRE_DTYPES = {
    "float32",
    "float64",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "string",
}

# Leading bytes of the image formats Pillow decodes that we recognise in base64 strings.
_IMAGE_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
    b"II*\x00",  # TIFF (little endian)
    b"MM\x00*",  # TIFF (big endian)
)


class ClusterServingInputError(ValueError):
    """An input value cannot be encoded; the message names the input."""


class ImageTooLarge(ClusterServingInputError):
    """An image whose header declares more pixels than allowed (a decompression bomb)."""


def wire_dtype(arr: np.ndarray) -> str:
    if arr.dtype.kind in ("U", "S", "O"):
        return "string"
    name = arr.dtype.name
    if name not in _WIRE_DTYPES:
        raise ClusterServingInputError(f"unsupported dtype {name}")
    return name


def tensor_to_wire(arr: np.ndarray, exact: bool = False) -> dict[str, Any]:
    """One ndarray -> the processor's JSON tensor form.

    Numbers are sent without a dtype unless ``exact``: the onnx processor then casts them to
    the model input's dtype where that is safe (int -> float, narrower ints), as Cluster
    Serving users expect ``np.array([1, 2])`` to feed a float input. Strings always say
    ``string``.
    """
    dtype = wire_dtype(arr)
    if dtype == "string":
        data: list[Any] = arr.reshape(-1).tolist()
        if set(map(type, data)) != {str}:  # bytes or numpy strings: converted (else no copy)
            data = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in data]
        return {"shape": list(arr.shape), "dtype": dtype, "data": data}
    out: dict[str, Any] = {"shape": list(arr.shape), "data": arr.reshape(-1).tolist()}
    if exact:
        out["dtype"] = dtype
    return out


def wire_to_tensor(obj: Mapping[str, Any]) -> np.ndarray:
    """The processor's JSON tensor form -> ndarray (strings as numpy unicode)."""
    dtype = obj.get("dtype", "float32")
    shape = [int(d) for d in obj.get("shape", [])]
    data = obj.get("data", [])
    if dtype == "string":
        return np.asarray(data, dtype=np.str_).reshape(shape)
    return np.asarray(data, dtype=np.dtype(dtype)).reshape(shape)


def looks_like_image(raw: bytes) -> bool:
    return raw.startswith(_IMAGE_MAGIC) or (raw[:4] == b"RIFF" and raw[8:12] == b"WEBP")


def b64_image_bytes(text: str) -> bytes | None:
    """The decoded bytes when ``text`` is base64 of a recognised image, else None."""
    if len(text) < 8:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if looks_like_image(raw) else None


def decode_image(raw: bytes, where: str, max_pixels: int | None = None) -> np.ndarray:
    """Image file bytes -> uint8 RGB array H x W x 3 (Pillow, an optional extra).

    ``max_pixels``: refuse (:class:`ImageTooLarge`) an image whose header declares more
    pixels, before any pixel is decoded: a few kilobytes of PNG can declare gigabytes.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ClusterServingInputError(
            f"{where}: image inputs need Pillow (pip install 'easkit[images]')"
        ) from None
    try:
        # Image.open reads only the header; Pillow's own bomb check (warning or error) fires there.
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLarge(f"{where}: image of {width} x {height} pixels exceeds {max_pixels}")
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(f"{where}: image too large ({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        if isinstance(exc, ClusterServingInputError):
            raise
        raise ClusterServingInputError(f"{where}: not a readable image ({exc})") from None


def sparse_to_coo(
    indices: Any, values: Any, shape: Any, where: str, *, points_first: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a sparse tensor; return (indices [nnz, ndim] int64, values [nnz], shape [ndim] int64).

    ``points_first``: the REST layout lists one index row per value ([nnz, ndim]); the Python
    API's layout is one row per dimension ([ndim, nnz]).
    """
    try:
        shp = np.asarray(shape, dtype=np.int64).reshape(-1)
        idx = np.asarray(indices, dtype=np.int64)
        vals = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ClusterServingInputError(f"{where}: sparse tensor is not numeric ({exc})") from None
    if vals.dtype.kind not in "biuf":
        raise ClusterServingInputError(f"{where}: sparse values must be numbers")
    vals = vals.reshape(-1)
    ndim = shp.size
    if ndim == 0 or (shp <= 0).any():
        raise ClusterServingInputError(f"{where}: sparse shape must be positive integers")
    nnz = vals.size
    if nnz == 0:
        idx = np.zeros((0, ndim), dtype=np.int64)
    elif idx.ndim == 1 and ndim == 1:
        idx = idx.reshape(-1, 1)
    elif idx.ndim != 2:
        raise ClusterServingInputError(f"{where}: sparse indices must be a 2-D array")
    elif not points_first:
        idx = idx.T
    if idx.shape != (nnz, ndim):
        expected = f"[{nnz}, {ndim}]" if points_first else f"[{ndim}, {nnz}]"
        raise ClusterServingInputError(
            f"{where}: sparse indices must have shape {expected} for {nnz} values in {ndim} dimensions"
        )
    if nnz and ((idx < 0).any() or (idx >= shp).any()):
        raise ClusterServingInputError(f"{where}: sparse index out of bounds for shape {shp.tolist()}")
    return np.ascontiguousarray(idx), vals, shp


def batch_sparse(
    items: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stack per-instance COO tensors into one of shape [N, *shape]."""
    shape0 = items[0][2]
    rows = []
    for b, (idx, _vals, shp) in enumerate(items):
        if not np.array_equal(shp, shape0):
            raise ClusterServingInputError(f"{where}: sparse shapes differ between instances")
        rows.append(np.concatenate([np.full((idx.shape[0], 1), b, dtype=np.int64), idx], axis=1))
    values = np.concatenate([v for _i, v, _s in items])
    indices = np.concatenate(rows) if rows else np.zeros((0, shape0.size + 1), dtype=np.int64)
    shape = np.concatenate([np.asarray([len(items)], dtype=np.int64), shape0])
    return indices, values, shape


def sparse_inputs(name: str, coo: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, dict[str, Any]]:
    idx, vals, shp = coo
    return {
        f"{name}.indices": tensor_to_wire(idx),
        f"{name}.values": tensor_to_wire(vals),
        f"{name}.shape": tensor_to_wire(shp),
    }


def outputs_from_reply(reply: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The processor's JSON reply -> {output name: ndarray}."""
    outs = reply.get("outputs")
    if not isinstance(outs, Mapping):
        raise ValueError("reply has no 'outputs' object")
    return {str(k): wire_to_tensor(v) for k, v in outs.items()}


def to_jsonable(arr: np.ndarray) -> Any:
    if arr.dtype.kind in ("U", "S", "O"):
        return np.vectorize(lambda x: x.decode() if isinstance(x, bytes) else str(x), otypes=[object])(
            arr
        ).tolist()
    return arr.tolist()


def top_classes(values: Any, n: int, where: str = "the result") -> dict[str, float]:
    """Cluster Serving's top-N answer: ``{"class index": probability}`` for the ``n`` most
    probable classes of one vector of class probabilities (or scores), most probable first
    (a tie: the lower index first). ValueError when ``n`` is not a positive integer or the
    values are not one vector (a row of a batch of one is)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"top_n must be a positive integer, got {n!r}")
    arr = np.asarray(values)
    if arr.ndim > 1 and all(d == 1 for d in arr.shape[:-1]):
        arr = arr.reshape(-1)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        got = f"{arr.dtype}{list(arr.shape)}"
        raise ValueError(f"top_n needs {where} to be one vector of class probabilities, got {got}")
    order = np.argsort(-arr.astype(np.float64), kind="stable")[:n]
    # str() first: a float32's shortest text (0.6, not 0.6000000238418579), as it was computed.
    return {str(int(i)): float(str(arr[i])) for i in order}


def top_of(result: Any, n: int, output: str | None = None) -> dict[str, float]:
    """``top_classes`` of a result (an ndarray, or ``{output name: ndarray}`` of a model with
    several outputs, of which ``output`` names the probabilities)."""
    if isinstance(result, Mapping):
        if output is None:
            if len(result) != 1:
                names = ", ".join(map(str, result))
                raise ValueError(f"top_n: the model has several outputs ({names}); name one with output=")
            output = next(iter(result))
        if output not in result:
            raise ValueError(f"top_n: no output {output!r}; the outputs are {', '.join(map(str, result))}")
        return top_classes(result[output], n, f"output {output!r}")
    return top_classes(result, n)


__all__ = [
    "SPARSE_SUFFIXES",
    "ClusterServingInputError",
    "ImageTooLarge",
    "b64_image_bytes",
    "batch_sparse",
    "decode_image",
    "looks_like_image",
    "outputs_from_reply",
    "sparse_inputs",
    "sparse_to_coo",
    "tensor_to_wire",
    "to_jsonable",
    "top_classes",
    "top_of",
    "wire_dtype",
    "wire_to_tensor",
]
