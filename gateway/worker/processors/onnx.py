"""ONNX Runtime processor: EAS TF / Torch / Blade protobuf and JSON requests.

One session per worker process with ``intra_op_num_threads = service.intra_op_threads``
(default 1), ``inter_op_threads`` (default 1: sequential execution), so several workers
share a small machine without oversubscribing its cores, on the service's ``providers``
(default ``[CPUExecutionProvider]``; those this ONNX Runtime build lacks are skipped and
logged, the ones really used are logged and shown in the worker's snapshot). Inputs are checked against the
model's declared dtypes and shapes before running; see docs/processors.md.

Dynamic batching (``batching.max_batch_size > 1``, opt-in) through the
:class:`~gateway.worker.processors.base.Batchable` interface: the worker's compute thread
calls :meth:`OnnxProcessor.prepare` on each queued request (decode + checks, so a bad
request fails alone), groups prepared requests with equal :attr:`Prepared.key`, and runs
them with :meth:`OnnxProcessor.process_batch`: inputs concatenated along axis 0, one
session run, outputs split by each request's row count and encoded in each request's own
format. Models whose inputs or outputs lack a dynamic first dimension are never batched.

Metadata (:meth:`OnnxProcessor.metadata`) comes from the loaded session: the inputs it
needs (initializers excluded) and its outputs, with KServe V2 datatype names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.calls import (
    RESPONSE_FORMAT_HEADER,
    TENSORS,
    TensorRequest,
    TensorResponse,
    WorkerRequest,
    WorkerResponse,
)
from gateway.core.metadata import UNKNOWN, ModelMetadata, TensorSpec
from gateway.worker.processors.base import Batchable, LoadError, ProcessorError

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


def _dynamic_first(shape: tuple[Any, ...] | None) -> Any:
    """The first dimension's symbol when it is dynamic (a name, or "" when unnamed);
    None when the rank is unknown, zero, or the first dimension is fixed."""
    if not shape:
        return None
    first = shape[0]
    if isinstance(first, int) and first >= 0:
        return None
    return first if isinstance(first, str) else ""


@dataclass(slots=True)
class Prepared:
    """One decoded, validated request, ready to run alone or in a batch."""

    decoded: eas.DecodedRequest
    feeds: dict[str, np.ndarray]
    indices: list[int]
    wanted: list[str]
    rows: int
    # Requests with equal keys can share one session run; None: always runs alone.
    key: tuple[Any, ...] | None


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


class OnnxProcessor(Batchable[Prepared]):
    # cancel_running() interrupts a run (ONNX Runtime's terminate flag).
    interruptible = True

    def load(self) -> None:
        import onnxruntime as ort

        if not self.service.model:
            raise ValueError("the onnx processor needs a model path")
        svc = self.service
        self.session = open_session(
            svc.model, svc.intra_op_threads, svc.inter_op_threads, svc.providers, svc.name
        )
        # What ONNX Runtime really uses (a provider can also fail to initialise, e.g. no GPU).
        self.providers_used = list(self.session.get_providers())
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        # (indices, names) of every output; shared by the calls that ask for all (read only).
        self._every = (list(range(len(self.output_names))), list(self.output_names))
        self._strings = {s.name for s in self.inputs if s.dtype == np.dtype(object)}
        self._ort = ort
        self._run_options: Any = None
        self._batchable = self.service.batching.max_batch_size > 1 and self._batch_dims_ok()

    @property
    def supports_batching(self) -> bool:
        return self._batchable

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(
            tuple(_tensor_spec(a) for a in self.session.get_inputs()),
            tuple(_tensor_spec(o) for o in self.session.get_outputs()),
            platform="onnxruntime_onnx",
        )

    def _batch_dims_ok(self) -> bool:
        """Batch only models whose every input and output has a dynamic first dimension,
        all with the same name when named (two named batch axes may differ in size)."""
        specs = list(self.inputs) + [_spec(o) for o in self.session.get_outputs()]
        firsts = [_dynamic_first(s.shape) for s in specs]
        if any(f is None for f in firsts):
            return False
        named = {f for f in firsts if f}
        return len(named) <= 1

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        return self._run_one(self.prepare(req))

    def prepare(self, req: WorkerRequest) -> Prepared:
        """Decode and check one request (raises ProcessorError); no model run."""
        try:
            if isinstance(req, TensorRequest):  # arrays from a V2 or gRPC adapter in the gateway
                named = {n: eas.InputTensor(np.asarray(a)) for n, a in req.inputs.items()}
                decoded = eas.DecodedRequest(TENSORS, named, output_names=list(req.outputs))
            else:
                decoded = eas.decode_request(
                    req.body, self.service.request_format, req.header("X-Eas-Request-Format")
                )
            feeds = eas.bind_inputs(decoded, self.inputs)
            if not decoded.output_names and not decoded.output_indices:
                indices, wanted = self._every  # every output, as most calls ask
            else:
                indices = eas.select_outputs(decoded, self.output_names)
                wanted = [self.output_names[i] for i in dict.fromkeys(indices)]
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None
        if decoded.kind != TENSORS and req.header(RESPONSE_FORMAT_HEADER) == "tf":
            decoded = replace(decoded, kind="tf")  # bound already: only the answer's form changes
        for name in self._strings:
            arr = feeds[name]
            feeds[name] = np.vectorize(
                lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v), otypes=[object]
            )(arr)
        rows, key = 0, None
        if self._batchable:
            arrays = [feeds[s.name] for s in self.inputs]
            rows = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
            if rows > 0 and all(a.ndim and a.shape[0] == rows for a in arrays):
                key = (decoded.kind, tuple(wanted), tuple((a.dtype.str, a.shape[1:]) for a in arrays))
        return Prepared(decoded, feeds, indices, wanted, rows, key)

    def _run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
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

    def _encode(self, p: Prepared, results: list[np.ndarray]) -> WorkerResponse:
        if p.decoded.kind == TENSORS:
            return TensorResponse(200, b"", arrays=dict(zip(p.wanted, results, strict=True)))
        if p.wanted == self.output_names:
            arrays: list[np.ndarray | None] = results  # every output, in the model's order
        else:
            by_name = dict(zip(p.wanted, results, strict=True))
            arrays = [by_name.get(n) for n in self.output_names]
        try:
            body, ctype = eas.encode_response(p.decoded, self.output_names, arrays, p.indices)  # type: ignore[arg-type]
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message, status=500, code="InternalError") from None
        return WorkerResponse(200, body, ctype)

    def _run_one(self, p: Prepared) -> WorkerResponse:
        return self._encode(p, self._run(p.wanted, p.feeds))

    def _answer_each(self, batch: list[Prepared]) -> list[WorkerResponse | ProcessorError]:
        out: list[WorkerResponse | ProcessorError] = []
        for p in batch:
            try:
                out.append(self._run_one(p))
            except ProcessorError as exc:
                out.append(exc)
        return out

    def process_batch(self, batch: list[Prepared]) -> list[WorkerResponse | ProcessorError]:
        """Run prepared requests with equal keys as one session run; one answer (or error)
        per request, in order. If the joint run fails, or an output is not split along
        the batch axis, every request is run on its own so one cannot fail the others."""
        if len(batch) == 1:
            return self._answer_each(batch)
        first = batch[0]
        names = list(first.feeds)
        feeds = {n: np.concatenate([p.feeds[n] for p in batch]) for n in names}
        total = sum(p.rows for p in batch)
        try:
            results = self._run(first.wanted, feeds)
        except ProcessorError as exc:
            if exc.code == "UpstreamTimeout":  # every member was cancelled
                return [exc] * len(batch)
            return self._answer_each(batch)
        if any(r.ndim == 0 or r.shape[0] != total for r in results):
            return self._answer_each(batch)
        out: list[WorkerResponse | ProcessorError] = []
        start = 0
        for p in batch:
            end = start + p.rows
            try:
                out.append(self._encode(p, [r[start:end] for r in results]))
            except ProcessorError as exc:
                out.append(exc)
            start = end
        return out

    def cancel_running(self) -> None:
        # ONNX Runtime checks this flag between nodes (and Loop iterations) and aborts the run.
        ro = self._run_options
        if ro is not None:
            ro.terminate = True
