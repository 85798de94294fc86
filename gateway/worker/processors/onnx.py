"""ONNX Runtime processor: EAS TF / Torch / Blade protobuf and JSON requests.

One session per worker process with ``intra_op_num_threads = service.intra_op_threads``
(default 1), ``inter_op_threads`` (default 1: sequential execution), so several workers
share a small machine without oversubscribing its cores, on the service's ``providers``
(default ``[CPUExecutionProvider]``; those this ONNX Runtime build lacks are skipped and
logged, the ones really used are logged and shown in the worker's snapshot). Inputs are checked against the
model's declared dtypes and shapes before running; see docs/processors.md.

Decoding, the checks, output selection, the answer in each request's own form and dynamic
batching are every model runtime's (gateway.worker.processors.model): models whose inputs or
outputs lack a dynamic first dimension are never batched.

Metadata (:meth:`OnnxProcessor.metadata`) comes from the loaded session: the inputs it
needs (initializers excluded) and its outputs, with KServe V2 datatype names.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.metadata import UNKNOWN, ModelMetadata, TensorSpec
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.model import ModelProcessor, Signature

log = logging.getLogger("gateway.worker")

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
# ONNX Runtime type strings -> KServe V2 datatype names (for metadata).
ORT_TO_V2: dict[str, str] = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def _tensor_spec(arg: Any) -> TensorSpec:
    """A session input or output for metadata: a named or unknown dimension is -1."""
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return TensorSpec(arg.name, ORT_TO_V2.get(arg.type, UNKNOWN), dims)


def _spec(arg: Any) -> eas.TensorSpec:
    shape = None if arg.shape is None else tuple(arg.shape)
    return eas.TensorSpec(arg.name, ORT_DTYPES.get(arg.type), shape)


def choose_providers(service: str, wanted: tuple[str, ...], available: list[str]) -> list[str]:
    """The wanted execution providers this ONNX Runtime build has, in the wanted order; the
    others are logged. None of them available: the service cannot start (LoadError)."""
    usable = [p for p in wanted if p in available]
    missing = [p for p in wanted if p not in available]
    if not usable:
        raise LoadError(
            f"none of the execution providers {', '.join(wanted)} is available in this ONNX Runtime "
            f"(it has {', '.join(available)})"
        )
    if missing:
        log.warning(
            "service %s: %s not available in this ONNX Runtime build (it has %s)",
            service, ", ".join(missing), ", ".join(available),
        )  # fmt: skip
    return usable


def open_session(
    model: str,
    intra_op_threads: int,
    inter_op_threads: int = 1,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    service: str = "",
    label: str = "",
) -> Any:
    """An ONNX Runtime session as the gateway runs them, in a worker process or in the
    gateway's own threads (a ``placement: thread`` service or pipeline step): threads that
    never spin, sequential execution unless given threads between operators. ``label``:
    who opens it, for the log (default: the service)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, intra_op_threads)
    opts.inter_op_num_threads = max(1, inter_op_threads)
    # Operators run side by side only when given threads to do it.
    parallel = inter_op_threads > 1
    opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads burn a core between requests; workers and the gateway share the machine.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    usable = choose_providers(service, providers, ort.get_available_providers())
    session = ort.InferenceSession(model, opts, providers=usable)
    log.info(
        "%s: ONNX Runtime runs on %s (intra-op %d, inter-op %d thread(s))",
        label or f"service {service}", ", ".join(session.get_providers()), opts.intra_op_num_threads,
        opts.inter_op_num_threads,
    )  # fmt: skip
    return session


class OnnxProcessor(ModelProcessor):
    # cancel_running() interrupts a run (ONNX Runtime's terminate flag).
    interruptible = True

    def open(self) -> Signature:
        import onnxruntime as ort

        svc = self.service
        assert svc.model is not None  # ModelProcessor.load checked it
        self.session = open_session(
            svc.model, svc.intra_op_threads, svc.inter_op_threads, svc.providers, svc.name
        )
        # What ONNX Runtime really uses (a provider can also fail to initialise, e.g. no GPU).
        self.providers_used = list(self.session.get_providers())
        self._ort = ort
        self._run_options: Any = None
        return Signature(
            tuple(_spec(a) for a in self.session.get_inputs()),
            tuple(_spec(o) for o in self.session.get_outputs()),
            "onnxruntime_onnx",
        )

    def metadata(self) -> ModelMetadata:
        # From the session's own type strings: they name types numpy has not (bfloat16).
        return ModelMetadata(
            tuple(_tensor_spec(a) for a in self.session.get_inputs()),
            tuple(_tensor_spec(o) for o in self.session.get_outputs()),
            platform="onnxruntime_onnx",
            checks_inputs=True,  # every call is checked against this signature (ModelProcessor.prepare)
        )

    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
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
        return list(results)

    def cancel_running(self) -> None:
        # ONNX Runtime checks this flag between nodes (and Loop iterations) and aborts the run.
        ro = self._run_options
        if ro is not None:
            ro.terminate = True
