"""The classification extension of V2 (as Triton defines it): the top-k of an output.

A requested output with ``parameters: {"classification": k}`` is answered, instead of the
tensor, as BYTES strings ``"<score>:<index>"`` (``"<score>:<index>:<label>"`` when the
model has labels) for its k largest elements, largest first. An output of one dimension
(or none) gives ``[k]`` strings; a larger one is classified row by row along its first
(batch) dimension, each row flattened, and gives ``[rows, k]``. ``k`` larger than a row is
cut to the row's length. Scores print as Triton prints them: floats with six decimals,
integers as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.codecs.kserve import KServeRequestError

MAX_CLASSES = 1 << 16


def class_count(raw: Any, where: str) -> int:
    """The ``classification`` parameter: a positive integer."""
    if type(raw) is not int or not 0 < raw <= MAX_CLASSES:
        raise KServeRequestError(
            f"{where}: the classification extension takes an integer from 1 to {MAX_CLASSES}"
        )
    return raw


def classify(arr: np.ndarray, k: int, where: str, labels: Sequence[str] = ()) -> np.ndarray:
    """The top ``k`` of ``arr`` as an object array of ``score:index[:label]`` bytes."""
    if arr.dtype.kind not in "biuf":
        raise KServeRequestError(f"{where}: the classification extension needs a numeric output")
    rows = arr.reshape(1, -1) if arr.ndim <= 1 else arr.reshape(arr.shape[0], -1)
    k = min(k, rows.shape[1])
    # Largest first; a stable sort keeps the lower index first among equal scores.
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
    is_float = arr.dtype.kind == "f"
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        for j, idx in enumerate(order[r]):
            value = rows[r, idx]
            score = f"{float(value):f}" if is_float else str(int(value))
            text = f"{score}:{int(idx)}"
            if int(idx) < len(labels):
                text += f":{labels[int(idx)]}"
            out[r, j] = text.encode()
    return out.reshape(k) if arr.ndim <= 1 else out


__all__ = ["MAX_CLASSES", "class_count", "classify"]
