"""The binary tensor data extension of V2 REST (as Triton defines it): framing a body.

A body with binary tensors is a JSON header of ``Inference-Header-Content-Length`` bytes,
then the tensors back to back in the order the header lists them: each input (or output)
whose ``parameters`` carry ``binary_data_size`` takes that many bytes, in the raw form of
``gateway.codecs.v2_tensors`` (little-endian, row-major; BYTES elements each prefixed
with their 4-byte length). Numeric inputs are numpy views over the received body: the
tensor bytes are not copied here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.codecs import v2_tensors
from gateway.codecs.kserve import BINARY_HEADER, KServeRequestError

OCTET_STREAM = "application/octet-stream"


def header_length(raw: str | None, body_length: int) -> int | None:
    """The JSON header's length from ``Inference-Header-Content-Length`` (None without it)."""
    if raw is None:
        return None
    try:
        n = int(raw.strip())
    except ValueError:
        raise KServeRequestError(f"{BINARY_HEADER} must be an integer") from None
    if not 0 < n <= body_length:
        raise KServeRequestError(f"{BINARY_HEADER} is {n}, the body has {body_length} bytes")
    return n


class BinarySection:
    """The binary tensors after a request's JSON header, handed out in order as views."""

    def __init__(self, body: bytes, start: int | None) -> None:
        self._view = memoryview(body)[start:] if start is not None else None
        self._pos = 0

    def tensor(self, size: Any, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
        """The next ``size`` bytes as the tensor the header describes (a view for numbers)."""
        if self._view is None:
            raise KServeRequestError(f"{where}: binary_data_size needs the {BINARY_HEADER} header")
        if type(size) is not int or size < 0:
            raise KServeRequestError(f"{where}: binary_data_size must be a non-negative integer")
        end = self._pos + size
        if end > len(self._view):
            left = len(self._view) - self._pos
            raise KServeRequestError(f"{where}: binary_data_size is {size}, only {left} binary bytes remain")
        chunk = self._view[self._pos : end]
        self._pos = end
        try:
            return v2_tensors.from_raw(chunk, datatype, shape, where)
        except v2_tensors.TensorError as exc:
            raise KServeRequestError(str(exc)) from None

    def finish(self) -> None:
        """Every byte after the header belongs to a tensor: anything left over is an error."""
        if self._view is not None and self._pos != len(self._view):
            left = len(self._view) - self._pos
            raise KServeRequestError(f"{left} bytes of binary data follow the last binary tensor")


def output_bytes(arr: np.ndarray) -> bytes | memoryview:
    """An output tensor in the raw form (a view of its memory when it already is)."""
    return v2_tensors.to_raw(arr)


def frame(
    header: bytes | bytearray, chunks: Sequence[bytes | memoryview]
) -> tuple[bytes | bytearray, int | None]:
    """An answer body and its header length: the JSON header alone without binary tensors."""
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


__all__ = ["OCTET_STREAM", "BinarySection", "frame", "header_length", "output_bytes"]
