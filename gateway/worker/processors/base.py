"""The processor interface a worker process runs, and what a processor offers to be batched.

This module imports no processor implementation: the registry
(gateway.worker.processors.registry) picks one for a service.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import ClassVar, Generic, Protocol, TypeVar

from gateway.codecs.errors import eas_body
from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata

JSON = "application/json"


class ProcessorError(Exception):
    """A request the processor refuses; answered with ``status`` and a JSON error body."""

    def __init__(self, message: str, status: int = 400, code: str = "InvalidInput") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class LoadError(Exception):
    """A processor that cannot load, with a message that already says what failed."""


def error_response(status: int, code: str, message: str, request_id: str = "") -> WorkerResponse:
    """A processor's error answer, in the EAS shape (gateway.codecs.errors): the gateway
    passes it through to the client unchanged."""
    return WorkerResponse(status, eas_body(code, message, request_id), JSON)


class Processor(ABC):
    """Loaded once per worker process; ``handle`` runs on the worker's compute thread."""

    # True when cancel_running() really interrupts a run: the worker may then run requests
    # right in its event loop, since a run that takes too long can be stopped there.
    interruptible: ClassVar[bool] = False
    # True when a run's time grows with its request's size and little else (an estimator's
    # rows): the worker may then run a request in its event loop when one as large was seen
    # to run fast, though nothing could interrupt it there.
    runs_by_size: ClassVar[bool] = False
    # The ONNX Runtime execution providers the loaded model really runs on, as the worker's
    # readiness and the status page report them; None for a processor that has none.
    providers_used: list[str] | None = None
    # The largest answer the worker may send (gateway.max_response_bytes; 0: no limit), set
    # by what serves the processor: one that can tell an answer's size before encoding it
    # refuses a larger one with 413 without building it.
    max_response_bytes: int = 0

    def __init__(self, service: ServiceConfig) -> None:
        self.service = service

    @abstractmethod
    def load(self) -> None:
        """Load the model or user code; an exception here means the worker never becomes ready."""

    @abstractmethod
    def handle(self, req: WorkerRequest) -> WorkerResponse:
        """Answer one request (blocking). May raise ProcessorError."""

    def metadata(self) -> ModelMetadata:
        """The loaded model's inputs and outputs (called once, after load). Empty by default."""
        return ModelMetadata()

    def cancel_running(self) -> None:  # noqa: B027 - optional hook
        """Called from the event loop thread when the request now running was cancelled
        (timeout or caller gone); a processor that can interrupt its work does so."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at shutdown."""


class BatchItem(Protocol):
    """One request decoded and checked by :meth:`Batchable.prepare`, not yet run."""

    # Items with equal keys can share one run; None: this one always runs alone.
    @property
    def key(self) -> Hashable | None: ...

    # How many rows (along the batch axis) the item brings; a batch holds at most
    # ``batching.max_batch_size`` rows.
    @property
    def rows(self) -> int: ...


ItemT = TypeVar("ItemT", bound=BatchItem)


class Batchable(Processor, Generic[ItemT]):
    """A processor that can run several requests as one model run (dynamic batching).

    The worker's compute thread prepares each queued request on its own (so a bad request
    fails alone), gathers prepared items with equal keys, and hands them to
    :meth:`process_batch`."""

    @property
    @abstractmethod
    def supports_batching(self) -> bool:
        """Whether the loaded model can be batched at all (asked once, after load)."""

    @abstractmethod
    def prepare(self, req: WorkerRequest) -> ItemT:
        """Decode and check one request without running the model. May raise ProcessorError."""

    @abstractmethod
    def process_batch(self, items: list[ItemT]) -> list[WorkerResponse | ProcessorError]:
        """Run items with equal keys together: one answer (or error) per item, in order."""


__all__ = ["BatchItem", "Batchable", "LoadError", "Processor", "ProcessorError", "error_response"]
