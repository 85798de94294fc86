"""Reading the answers of the request forms a model service speaks, for the runtimes'
end-to-end tests, and the text every form gives for an input the model refuses.

    v1_output(body["predictions"], "predict", outputs)  # one output's rows of a V1 answer
    kv_outputs(body)                                     # Paddle's key/value answer, by name
    refused(message, "input", described("float64", (10, 3)))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np


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


__all__ = ["described", "kv_outputs", "refused", "v1_output"]
