"""The calls a backend runs: a request's bytes and what it answered, or tensors by name.

``WorkerRequest``/``WorkerResponse`` are what every backend takes and gives: the worker RPC
(gateway.codecs.ipc) frames them between processes, and a backend in the gateway process
takes them as they are.

A call with tensors by name is for a model that runs in the gateway process.

The V2 binary, V2 JSON and gRPC adapters hold numpy arrays; a worker process needs them
encoded (a TF ``PredictRequest``) and its answer decoded again. A backend in the gateway's
own threads (``placement: thread``, gateway.backends.threads) takes the arrays as they are:
the onnx processor checks them against the model exactly as it checks a decoded TF
request, and answers with the output arrays, so neither side encodes anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class WorkerRequest:
    body: bytes
    subpath: str = ""
    content_type: str = "application/octet-stream"
    request_id: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    # Absolute time.monotonic() after which the worker drops the request unrun (0: none).
    # CLOCK_MONOTONIC is system-wide on Linux, so gateway and worker agree on it.
    deadline: float = 0.0

    def header(self, name: str, default: str | None = None) -> str | None:
        """Case-insensitive header lookup."""
        headers = self.headers
        value = headers.get(name)
        if value is not None:
            return value
        # Most calls do not carry the header asked for: every name is looked at, and only
        # one of the right length is lower-cased.
        low = name.lower()
        size = len(low)
        for k, v in headers.items():
            if len(k) == size and k.lower() == low:
                return v
        return default


@dataclass(slots=True)
class WorkerResponse:
    status: int
    body: bytes
    content_type: str = "application/octet-stream"
    compute_us: int = 0
    # Extra answer headers the gateway's side of a backend adds (a pipeline's Server-Timing,
    # a cold start's wait); never sent over the worker IPC.
    headers: dict[str, str] | None = None


# The decoded request's kind of a tensor call (gateway.worker.processors.onnx).
TENSORS = "tensors"
# A request header with which the gateway's adapters ask for the answer in the TF protobuf
# form whatever form the request came in (``tf``): a JSON-form request keeps its loose
# casting, and its answer is read as arrays over the reply's bytes instead of one Python
# object per element. Processors that know no such form (user code) answer as they do.
RESPONSE_FORMAT_HEADER = "X-Eas-Response-Format"
# A request header with which the gateway's model protocols ask a model to explain the call
# instead of predicting it (``explain``: KServe's ``:explain``), for a model whose metadata
# says it explains.
VERB_HEADER = "X-Eas-Verb"
EXPLAIN = "explain"
# A V2 call's own ``id`` and request ``parameters`` (a JSON object), as request headers for
# the processor: user code that reads them (a kserve.Model gets them in its InferRequest).
# Sent only when the call has them; a tensor call carries nothing else of its V2 envelope.
INFER_ID_HEADER = "X-Infer-Id"
INFER_PARAMETERS_HEADER = "X-Infer-Parameters"


def infer_call_headers(call_id: str | None, parameters: Mapping[str, object]) -> dict[str, str]:
    """The request headers that carry a V2 call's ``id`` and ``parameters`` to its processor."""
    headers: dict[str, str] = {}
    if call_id:
        headers[INFER_ID_HEADER] = call_id
    if parameters:
        headers[INFER_PARAMETERS_HEADER] = json.dumps(parameters, separators=(",", ":"))
    return headers


@dataclass(slots=True)
class TensorRequest(WorkerRequest):
    """A WorkerRequest whose inputs are arrays (``body`` stays empty); never sent over IPC."""

    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Output names asked for; empty: every output of the model.
    outputs: Sequence[str] = ()


@dataclass(slots=True)
class TensorResponse(WorkerResponse):
    """A 200 answer to a TensorRequest: the outputs asked for, in the model's own dtypes."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)


__all__ = [
    "EXPLAIN",
    "INFER_ID_HEADER",
    "INFER_PARAMETERS_HEADER",
    "RESPONSE_FORMAT_HEADER",
    "TENSORS",
    "VERB_HEADER",
    "TensorRequest",
    "TensorResponse",
    "WorkerRequest",
    "WorkerResponse",
    "infer_call_headers",
]
