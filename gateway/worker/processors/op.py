"""A pipeline's Python op in worker processes of its own (a step with ``placement: process``).

The step's inputs arrive as a values message (gateway.codecs.pipeline_values: numpy arrays and
plain Python values by name, the arrays' bytes copied once into it, or into shared memory
when large, and read in place here),
the op's ``preprocess`` and ``postprocess`` run as they would in the gateway's threads, and
its outputs go back the same way. Worth it for an op that holds the GIL (pure Python work)
or that must not take the gateway down when it crashes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from gateway.codecs import pipeline_values as wire
from gateway.codecs.shm import SHM_ENV, ShmWriter
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.ops import OpError, load_op
from gateway.worker.processors.base import Processor, ProcessorError

log = logging.getLogger("gateway.worker")


class OpProcessor(Processor):
    def load(self) -> None:
        self.op = load_op(self.service.entry or "", self.service.config)
        # The pipeline's shared memory directory: the only one this worker maps or writes.
        self.shm = os.environ.get(SHM_ENV) or None
        self.pre = getattr(self.op, "preprocess", None)
        self.post = getattr(self.op, "postprocess", None)

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        try:
            inputs, wanted, answer_shm = wire.decode(req.body, shm=self.shm)
        except ValueError as exc:
            raise ProcessorError(f"cannot read the step's inputs: {exc}") from None
        try:
            values: Any = self.pre(inputs) if self.pre is not None else inputs
            if self.post is not None:
                values = self.post(inputs, values)
        except OpError as exc:
            raise ProcessorError(exc.message, exc.status, "PipelineStepFailed") from None
        except Exception as exc:
            log.info("op raised %s (request %s)", type(exc).__name__, req.request_id)
            detail = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise ProcessorError(
                f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__, 500
            ) from None
        if not isinstance(values, dict):
            raise ProcessorError(f"the op returned {type(values).__name__}; expected a dict", 500)
        wanted = wanted or list(values)
        missing = [n for n in wanted if n not in values]
        if missing:
            raise ProcessorError(
                f"produced no output {missing[0]!r}; it gave: {', '.join(map(str, values))}", 500
            )
        # Large arrays go back through the gateway's shared memory, which it removes once read.
        writer = ShmWriter(self.shm) if self.shm and answer_shm == self.shm else None
        try:
            body = wire.encode({n: values[n] for n in wanted}, shm=writer)
        except TypeError as exc:
            if writer is not None:
                writer.remove_all()
            raise ProcessorError(f"cannot send the op's outputs: {exc}", 500) from None
        return WorkerResponse(200, body, wire.CONTENT_TYPE)

    def close(self) -> None:
        close = getattr(getattr(self, "op", None), "close", None)
        if callable(close):
            close()
