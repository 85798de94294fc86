"""Reading the answers of the request forms a model service speaks, for the runtimes'
end-to-end tests, and the text every form gives for an input the model refuses.

    v1_output(body["predictions"], "predict", outputs)  # one output's rows of a V1 answer
    kv_outputs(body)                                     # Paddle's key/value answer, by name
    refused(message, "input", described("float64", (10, 3)))
    check_torch_request(client, x, outputs, wanted, "input", "svc", same)  # the Torch form
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictClient, TorchRequest
from eas_sdk.errors import BadRequestError

TORCH_DTYPES = {np.dtype(np.float32): TorchRequest.DT_FLOAT, np.dtype(np.float64): TorchRequest.DT_DOUBLE}


def v1_output(predictions: list[Any], name: str, outputs: Sequence[str]) -> np.ndarray:
    """One output's rows of a V1 answer: a prediction is the output's row for a model of one
    output, else an object naming every output."""
    if len(outputs) == 1:
        assert name == outputs[0], (name, outputs)
        return np.array(predictions)
    return np.array([p[name] for p in predictions])


def kv_outputs(body: dict[str, Any]) -> dict[str, np.ndarray]:
    """Paddle's key/value answer pairs each output's name with its value as text: a single
    value as itself, more as a JSON array (so a lone row's shape is the reader's to give)."""
    assert body["err_no"] == 0 and body["err_msg"] == "", body
    return {k: np.array(json.loads(v)) for k, v in zip(body["key"], body["value"], strict=True)}


def described(dtype: str, shape: Sequence[int]) -> str:
    """A tensor as the gateway's messages write it: ``float64[10,3]``."""
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def refused(message: str, name: str, got: str) -> None:
    """The text of a refused input: it names the input, what the model declares and what came
    (``input 'input': expected float64[-1,4], got float64[10,3]``)."""
    assert message.startswith(f"input {name!r}: expected ") and message.endswith(f", got {got}"), (
        message,
        got,
    )


def _torch_call(x: np.ndarray, fetch: int | None = None) -> TorchRequest:
    req = TorchRequest()
    req.add_feed(0, list(x.shape), TORCH_DTYPES[x.dtype], x)
    if fetch is not None:
        req.add_fetch(fetch)
    return req


def check_torch_request(
    client: PredictClient,
    x: np.ndarray,
    outputs: Sequence[str],
    wanted: Mapping[str, np.ndarray],
    input_name: str,
    what: str,
    same: Callable[[Any, np.ndarray, str], None],
) -> None:
    """A TorchRequest feeds a model's one input by position and reads its outputs by position,
    in the order its metadata lists ``outputs``; ``add_fetch`` picks one by index. Torch
    carries float64 (DT_DOUBLE), so the answer is ``wanted`` (the library's, for the very rows).
    Rows one value short, or of the other float dtype (Torch states it, so it must match), are
    a 400 naming ``input_name``. ``what``: the service, for the assertions' messages;
    ``same``: how close to ``wanted`` an answer must be."""
    resp = client.predict(_torch_call(x))
    assert len(resp) == len(outputs)
    for i, name in enumerate(outputs):
        same(resp.to_numpy(i), wanted[name], f"{what} torch {i} ({name})")
    only = client.predict(_torch_call(x, fetch=len(outputs) - 1))
    assert len(only) == 1
    same(only.to_numpy(0), wanted[outputs[-1]], f"{what} torch fetch")
    other = np.float32 if x.dtype == np.float64 else np.float64
    for given in (np.ascontiguousarray(x[..., :-1]), x.astype(other)):
        with pytest.raises(BadRequestError) as info:
            client.predict(_torch_call(given))
        assert info.value.code == 400, info.value
        refused(info.value.message, input_name, described(given.dtype.name, given.shape))


__all__ = ["TORCH_DTYPES", "check_torch_request", "described", "kv_outputs", "refused", "v1_output"]
