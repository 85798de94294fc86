"""What every model runtime shares: named tensors in, named tensors out.

A runtime (onnx, sklearn, xgboost, lightgbm) subclasses :class:`ModelProcessor` with two
methods: :meth:`~ModelProcessor.open` loads the model and says its :class:`Signature` (the
inputs, with the dtypes and shapes requests are checked against, and the outputs), and
:meth:`~ModelProcessor.run` runs it on checked arrays. Everything between the wire and
those two calls is here, once: every request form the gateway speaks reaches a runtime as
an EAS request (TF, Torch, Blade protobuf or the JSON form) or, in the gateway's own threads,
as the V2 and gRPC adapters' arrays (a ``TensorRequest``); this module decodes it with the EAS
codec (eas_sdk.codecs.eas), binds and checks the inputs (a wrong dtype or shape is a 400 that
names the input), selects the outputs asked for, and answers in the request's own form. So a
new runtime answers EAS, KServe V1/V2 (REST and gRPC), Paddle and Cluster Serving calls, in
worker processes and in the gateway's threads, and as a pipeline step, with no adapter
knowing it exists.

Dynamic batching (``batching.max_batch_size > 1``) through the
:class:`~gateway.worker.processors.base.Batchable` interface: :meth:`ModelProcessor.prepare`
decodes and checks each queued request on its own (so a bad request fails alone), requests
with equal :attr:`Prepared.key` are concatenated along axis 0 and run once, and the outputs
are split by each request's row count. A runtime batches when its model takes a batch
dimension (:meth:`ModelProcessor.batches_rows`); a joint run that fails, or whose outputs are
not split along that axis, is run again request by request.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core import json_answer
from gateway.core.calls import (
    RESPONSE_FORMAT_HEADER,
    TENSORS,
    TensorRequest,
    TensorResponse,
    WorkerRequest,
    WorkerResponse,
)
from gateway.core.metadata import DATATYPES, UNKNOWN, ModelMetadata, TensorSpec
from gateway.worker.processors.base import Batchable, ProcessorError

# numpy dtype -> V2 datatype name (for metadata built from a signature).
V2_NAMES: dict[np.dtype[Any], str] = {dtype: name for name, dtype in DATATYPES.items()}


@dataclass(frozen=True)
class Signature:
    """A loaded model's tensors: the inputs requests are checked against (a None dtype or
    dimension accepts any), and the outputs in the order the model gives them."""

    inputs: tuple[eas.TensorSpec, ...]
    outputs: tuple[eas.TensorSpec, ...]
    platform: str = ""


def _v2_spec(spec: eas.TensorSpec) -> TensorSpec:
    """A signature tensor for metadata: a named or unknown dimension is -1."""
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (spec.shape or ()))
    name = UNKNOWN if spec.dtype is None else V2_NAMES.get(np.dtype(spec.dtype).newbyteorder("<"), UNKNOWN)
    return TensorSpec(spec.name, name, dims)


def dynamic_first(shape: tuple[Any, ...] | None) -> Any:
    """The first dimension's symbol when it is dynamic (a name, or "" when unnamed);
    None when the rank is unknown, zero, or the first dimension is fixed."""
    if not shape:
        return None
    first = shape[0]
    if isinstance(first, int) and first >= 0:
        return None
    return first if isinstance(first, str) else ""


# What a request of arrays (TensorRequest) prepares as: its answers only read the kind.
_ARRAYS = eas.DecodedRequest(TENSORS)


@dataclass(slots=True)
class Prepared:
    """One decoded, validated request, ready to run alone or in a batch."""

    decoded: eas.DecodedRequest
    feeds: dict[str, np.ndarray]
    indices: list[int]
    wanted: list[str]
    rows: int
    # Requests with equal keys can share one model run; None: always runs alone.
    key: tuple[Any, ...] | None


class ModelProcessor(Batchable[Prepared]):
    """A processor that runs a model file over named tensors; see the module's text."""

    signature: Signature

    @abstractmethod
    def open(self) -> Signature:
        """Load the model (blocking, once) and say its inputs and outputs. A file the
        runtime cannot read raises LoadError naming the format it expected."""

    @abstractmethod
    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the model on checked inputs; the outputs named in ``wanted``, in that order.
        A run the runtime refuses raises ProcessorError."""

    def load(self) -> None:
        if not self.service.model:
            raise ValueError(f"the {self.service.processor} processor needs a model path")
        self.signature = sig = self.open()
        self.inputs = list(sig.inputs)
        self.output_names = [o.name for o in sig.outputs]
        # (indices, names) of every output; shared by the calls that ask for all (read only).
        self._every = (list(range(len(self.output_names))), list(self.output_names))
        self._strings = {s.name for s in self.inputs if s.dtype == np.dtype(object)}
        self._batchable = self.service.batching.max_batch_size > 1 and self.batches_rows()

    def batches_rows(self) -> bool:
        """Whether requests can be joined along axis 0: by default when every input and
        output has a dynamic first dimension, all with the same name when named (two named
        batch axes may differ in size)."""
        sig = self.signature
        firsts = [dynamic_first(s.shape) for s in (*sig.inputs, *sig.outputs)]
        if any(f is None for f in firsts):
            return False
        return len({f for f in firsts if f}) <= 1

    @property
    def supports_batching(self) -> bool:
        return self._batchable

    def metadata(self) -> ModelMetadata:
        sig = self.signature
        return ModelMetadata(
            tuple(_v2_spec(s) for s in sig.inputs), tuple(_v2_spec(s) for s in sig.outputs), sig.platform
        )

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        return self._run_one(self.prepare(req))

    def prepare(self, req: WorkerRequest) -> Prepared:
        """Decode and check one request (raises ProcessorError); no model run."""
        try:
            if isinstance(req, TensorRequest):  # arrays from a V2 or gRPC adapter in the gateway
                decoded = _ARRAYS
                feeds = eas.bind_arrays(req.inputs, self.inputs)
                indices = eas.output_positions(req.outputs, self.output_names) if req.outputs else None
            else:
                decoded = eas.decode_request(
                    req.body, self.service.request_format, req.header("X-Eas-Request-Format")
                )
                feeds = eas.bind_inputs(decoded, self.inputs)
                asked = bool(decoded.output_names or decoded.output_indices)
                indices = eas.select_outputs(decoded, self.output_names) if asked else None
            if indices is None:
                indices, wanted = self._every  # every output, as most calls ask
            else:
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

    def _encode(self, p: Prepared, results: list[np.ndarray]) -> WorkerResponse:
        if p.decoded.kind == TENSORS:
            return TensorResponse(200, b"", arrays=dict(zip(p.wanted, results, strict=True)))
        if p.wanted == self.output_names:
            arrays: list[np.ndarray | None] = results  # every output, in the model's order
        else:
            by_name = dict(zip(p.wanted, results, strict=True))
            arrays = [by_name.get(n) for n in self.output_names]
        self._check_size(p, arrays)
        try:
            body, ctype = eas.encode_response(p.decoded, self.output_names, arrays, p.indices)  # type: ignore[arg-type]
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message, status=500, code="InternalError") from None
        return WorkerResponse(200, body, ctype)

    def _check_size(self, p: Prepared, arrays: list[np.ndarray | None]) -> None:
        """Refuse an answer past the response limit before it is encoded: its size from the
        outputs it would hold (their bytes in a protobuf answer, a sample of their text in
        the JSON form), not from the encoded body (a JSON answer is several times the
        model's output, all of it built in the worker before the limit was applied)."""
        limit = self.max_response_bytes
        if not limit:
            return
        sel = [a for a in (arrays[i] for i in dict.fromkeys(p.indices)) if a is not None]
        if p.decoded.kind in ("tf", "torch", "blade"):
            size, qualifier = sum(json_answer.raw_size(a) for a in sel), ""
        else:
            size, qualifier = sum(json_answer.array_estimate(np.asarray(a)) for a in sel), "about"
        try:
            json_answer.check(size, limit, qualifier)
        except json_answer.AnswerTooLarge as exc:
            raise ProcessorError(str(exc), status=exc.status, code=exc.code) from None

    def _run_one(self, p: Prepared) -> WorkerResponse:
        return self._encode(p, self.run(p.wanted, p.feeds))

    def _answer_each(self, batch: list[Prepared]) -> list[WorkerResponse | ProcessorError]:
        out: list[WorkerResponse | ProcessorError] = []
        for p in batch:
            try:
                out.append(self._run_one(p))
            except ProcessorError as exc:
                out.append(exc)
        return out

    def process_batch(self, batch: list[Prepared]) -> list[WorkerResponse | ProcessorError]:
        """Run prepared requests with equal keys as one model run; one answer (or error)
        per request, in order. If the joint run fails, or an output is not split along
        the batch axis, every request is run on its own so one cannot fail the others."""
        if len(batch) == 1:
            return self._answer_each(batch)
        first = batch[0]
        names = list(first.feeds)
        feeds = {n: np.concatenate([p.feeds[n] for p in batch]) for n in names}
        total = sum(p.rows for p in batch)
        try:
            results = self.run(first.wanted, feeds)
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


__all__ = ["ModelProcessor", "Prepared", "Signature", "dynamic_first"]
