"""TensorFlow processor: a SavedModel folder (``model: mnist_saved_model/``) and its signatures.

Every signature the SavedModel exports is served, with the input and output names it
declares (its keyword arguments and the keys of the dict it returns), as TensorFlow
Serving and EAS's TensorFlow processor name them: a ``TFRequest("predict_images")`` (or a
Blade request with that signature name) runs the ``predict_images`` signature, feeds its
inputs by name and fetches its outputs by name (all of them when it names none). A request
that names no signature, and every request of a protocol that has none (the JSON form,
KServe V1/V2, gRPC, Paddle), runs the default one: ``serving_default`` when the model has
it, else its only signature, else the first by name. A signature name the model does not
have is a 400 that lists the ones it has. The model's metadata is the default signature's.

Dtypes and shapes come from each signature (a ``None`` dimension accepts any size), so a
wrong dtype or shape is a 400 naming the input before TensorFlow sees it. Inputs and outputs
are listed by name. Requests are batched (``batching``) per signature when its every input
and output has a dynamic first dimension. ``intra_op_threads`` and ``inter_op_threads`` set
TensorFlow's thread pools when the process has not started TensorFlow yet (the gateway's
threads share one runtime).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from eas_sdk.codecs.eas.wire import CodecError, fields, text
from gateway.core.calls import TensorRequest, WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata
from gateway.worker.processors.base import Batchable, LoadError, ProcessorError
from gateway.worker.processors.estimator import first_line
from gateway.worker.processors.model import ModelProcessor, Prepared, Signature

DEFAULT_SIGNATURE = "serving_default"
# A signature name longer than this is not one (the peek below reads only the first field).
_MAX_SIGNATURE = 256


def _spec(name: str, spec: Any) -> eas.TensorSpec:
    """A tf.TensorSpec as the EAS codec checks requests against it."""
    dtype = np.dtype(object) if spec.dtype.name == "string" else np.dtype(spec.dtype.as_numpy_dtype)
    if spec.shape.rank is None:
        return eas.TensorSpec(name, dtype, None)
    return eas.TensorSpec(name, dtype, tuple(-1 if d is None else int(d) for d in spec.shape.as_list()))


def named_signature(body: bytes) -> str:
    """The signature a TF or Blade protobuf body names (its field 1, which protobuf writes
    first); "" for any other body. Reads one field, not the tensors."""
    if not body or body[:1] in (b"{", b"["):
        return ""
    try:
        for number, wire_type, a, b in fields(body, 0, len(body)):
            if number == 1 and wire_type == 2 and b - a <= _MAX_SIGNATURE:
                name = text(body, a, b)
                # A Torch request's field 1 is a tensor, whose bytes are no printable name.
                return name if name.isprintable() else ""
            return ""
    except (CodecError, IndexError, ValueError):
        return ""
    return ""


class SignatureRunner(ModelProcessor):
    """One signature of a loaded SavedModel, run as a model of its own."""

    def __init__(self, service: Any, name: str, function: Any, tf: Any) -> None:
        super().__init__(service)
        self.name = name
        self.function = function
        self._tf = tf

    def open(self) -> Signature:
        args, kwargs = self.function.structured_input_signature
        if args:
            raise LoadError(f"signature {self.name!r} takes positional arguments; a signature's are named")
        outputs = self.function.structured_outputs
        if not isinstance(outputs, dict):
            raise LoadError(f"signature {self.name!r} returns a {type(outputs).__name__}, not named outputs")
        # By name: a loaded SavedModel's dicts come from protobuf maps, whose order is not
        # kept (saved_model_cli and TensorFlow Serving's metadata list them sorted, too).
        return Signature(
            tuple(_spec(n, kwargs[n]) for n in sorted(kwargs)),
            tuple(_spec(n, outputs[n]) for n in sorted(outputs)),
            "tensorflow_savedmodel",
        )

    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        tf = self._tf
        try:
            out = self.function(**{n: tf.constant(a) for n, a in feeds.items()})
        except Exception as exc:  # TensorFlow refuses what the signature's checks let through
            raise ProcessorError(f"model run failed: {first_line(exc)}") from None
        return [out[n].numpy() for n in wanted]


@dataclass(slots=True)
class Routed:
    """A prepared request and the signature that runs it."""

    runner: SignatureRunner
    item: Prepared
    key: tuple[Any, ...] | None
    rows: int


class TensorFlowProcessor(Batchable[Routed]):
    def load(self) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ chatter on stderr
        import tensorflow as tf

        svc = self.service
        if not svc.model:
            raise ValueError("the tensorflow processor needs a model path (a SavedModel folder)")
        try:
            tf.config.threading.set_intra_op_parallelism_threads(max(1, svc.intra_op_threads))
            tf.config.threading.set_inter_op_parallelism_threads(max(1, svc.inter_op_threads))
        except RuntimeError:
            pass  # TensorFlow already runs in this process: its pools are set for good
        try:
            self.model = tf.saved_model.load(svc.model)
        except Exception as exc:
            raise LoadError(
                f"cannot load {Path(svc.model).name} as a TensorFlow SavedModel (a folder holding "
                f"saved_model.pb, as tf.saved_model.save writes): {first_line(exc)}"
            ) from exc
        signatures = dict(self.model.signatures)
        if not signatures:
            raise LoadError(f"{Path(svc.model).name}: the SavedModel exports no signature to serve")
        self.runners: dict[str, SignatureRunner] = {}
        for name in sorted(signatures):
            runner = SignatureRunner(svc, name, signatures[name], tf)
            runner.load()
            self.runners[name] = runner
        default = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures else next(iter(self.runners))
        self.default = self.runners[default]

    @property
    def supports_batching(self) -> bool:
        return any(r.supports_batching for r in self.runners.values())

    def metadata(self) -> ModelMetadata:
        return self.default.metadata()

    def _runner(self, req: WorkerRequest) -> SignatureRunner:
        name = "" if isinstance(req, TensorRequest) else named_signature(req.body)
        return self.runners.get(name, self.default)

    def prepare(self, req: WorkerRequest) -> Routed:
        runner = self._runner(req)
        item = runner.prepare(req)
        asked = item.decoded.signature
        if asked and asked not in self.runners:
            raise ProcessorError(
                f"unknown signature {asked[:64]!r}; the model's signatures: {', '.join(self.runners)}"
            )
        key = None if item.key is None else (runner.name, *item.key)
        return Routed(runner, item, key, item.rows)

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        routed = self.prepare(req)
        answer = routed.runner.process_batch([routed.item])[0]
        if isinstance(answer, ProcessorError):
            raise answer
        return answer

    def process_batch(self, items: list[Routed]) -> list[WorkerResponse | ProcessorError]:
        # Items with equal keys share a signature (the key starts with its name).
        return items[0].runner.process_batch([r.item for r in items])


__all__ = ["DEFAULT_SIGNATURE", "SignatureRunner", "TensorFlowProcessor", "named_signature"]
