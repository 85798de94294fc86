"""ONNX Runtime processor: EAS TF / Torch / Blade protobuf and JSON requests.

One session per worker process with ``intra_op_num_threads = service.intra_op_threads``
(default 1), one inter-op thread and sequential execution, so several workers share a
small machine without oversubscribing its cores. Inputs are checked against the
model's declared dtypes and shapes before running; see docs/processors.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.protocols import eas
from gateway.workers.ipc import WorkerRequest, WorkerResponse
from gateway.workers.processors.base import Processor, ProcessorError

# ONNX Runtime type strings -> numpy dtypes.
ORT_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}


def _spec(arg: Any) -> eas.TensorSpec:
    shape = None if arg.shape is None else tuple(arg.shape)
    return eas.TensorSpec(arg.name, ORT_DTYPES.get(arg.type), shape)


class OnnxProcessor(Processor):
    def load(self) -> None:
        import onnxruntime as ort

        if not self.service.model:
            raise ValueError("the onnx processor needs a model path")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, self.service.intra_op_threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning threads burn a core between requests; workers share the machine.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(self.service.model, opts, providers=["CPUExecutionProvider"])
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._strings = {s.name for s in self.inputs if s.dtype == np.dtype(object)}
        self._ort = ort
        self._run_options: Any = None

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        try:
            decoded = eas.decode_request(
                req.body, self.service.request_format, req.header("X-Eas-Request-Format")
            )
            feeds = eas.bind_inputs(decoded, self.inputs)
            indices = eas.select_outputs(decoded, self.output_names)
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None
        for name in self._strings:
            arr = feeds[name]
            feeds[name] = np.vectorize(
                lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v), otypes=[object]
            )(arr)
        wanted = [self.output_names[i] for i in dict.fromkeys(indices)]
        ro = self._ort.RunOptions()
        ro.log_severity_level = 4  # a terminated run is not an error worth logging
        self._run_options = ro
        try:
            results = self.session.run(wanted, feeds, ro)
        except Exception as exc:  # the runtime rejects what our checks let through
            if ro.terminate:
                raise ProcessorError("model run cancelled", 504, "UpstreamTimeout") from None
            raise ProcessorError(f"model run failed: {str(exc).splitlines()[0][:300]}") from None
        finally:
            self._run_options = None
        by_name = dict(zip(wanted, results, strict=True))
        arrays = [by_name.get(n) for n in self.output_names]
        try:
            body, ctype = eas.encode_response(decoded, self.output_names, arrays, indices)  # type: ignore[arg-type]
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message, status=500, code="InternalError") from None
        return WorkerResponse(200, body, ctype)

    def cancel_running(self) -> None:
        # ONNX Runtime checks this flag between nodes (and Loop iterations) and aborts the run.
        ro = self._run_options
        if ro is not None:
            ro.terminate = True
