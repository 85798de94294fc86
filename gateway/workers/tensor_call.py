"""A call with tensors by name for a model that runs in the gateway process.

The V2 binary, V2 JSON and gRPC adapters hold numpy arrays; a worker process needs them
encoded (a TF ``PredictRequest``) and its answer decoded again. A backend in the gateway's
own threads (``placement: thread``, gateway.workers.threads) takes the arrays as they are:
the onnx processor checks them against the model exactly as it checks a decoded TF
request, and answers with the output arrays, so neither side encodes anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway.workers.ipc import WorkerRequest, WorkerResponse

# The decoded request's kind of a tensor call (gateway.workers.processors.onnx).
TENSORS = "tensors"
# A request header with which the gateway's adapters ask for the answer in the TF protobuf
# form whatever form the request came in (``tf``): a JSON-form request keeps its loose
# casting, and its answer is read as arrays over the reply's bytes instead of one Python
# object per element. Processors that know no such form (user code) answer as they do.
RESPONSE_FORMAT_HEADER = "X-Eas-Response-Format"


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


__all__ = ["RESPONSE_FORMAT_HEADER", "TENSORS", "TensorRequest", "TensorResponse"]
