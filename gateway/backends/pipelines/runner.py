"""Running one request through a pipeline's graph of steps.

Each step starts as soon as the steps it reads from are done, so independent branches run
at the same time (a chain runs as plain awaits, without a task per step). Values move
between steps as Python objects: nothing is serialised in this process. A model step is
one call to a service's workers in the form its processor speaks (gateway.backends.pipelines.forms:
the TF protobuf form for an ``onnx`` service, the JSON form for a ``python`` one); an op
runs in its step's own threads, so a slow step with few threads never holds up a fast one;
a transform runs inline. The first step to fail ends the request with a
:class:`StepFailed` that names it; the other requests are untouched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gateway.backends.pipelines.forms import FORM_HEADERS, json_outputs, json_request
from gateway.codecs import pipeline_values as values
from gateway.codecs import v2_tensors
from gateway.codecs.shm import ShmWriter
from gateway.config.pipelines import REQUEST, PipelineSpec, StepSpec
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.ops import TRANSFORM_FUNCTIONS, OpError, SkipModel


class StepFailed(Exception):
    """A step could not produce its outputs: answered with ``status``, naming the step."""

    def __init__(self, step: str, status: int, message: str, code: str = "PipelineStepFailed") -> None:
        super().__init__(f"step {step!r}: {message}")
        self.step = step
        self.status = status
        self.message = message
        self.code = code


@dataclass(slots=True)
class CallContext:
    request_id: str
    deadline: float  # absolute time.monotonic()
    # The steps started and not yet finished: what a request that runs out of time waits on.
    running: set[str] = field(default_factory=set)
    # A step's span in the call's trace (the dataplane's step_span); none outside one.
    span: Callable[[str], AbstractContextManager[Any]] = lambda _step: nullcontext()


class StepExec(Protocol):
    async def run(self, inputs: dict[str, Any], ctx: CallContext) -> Mapping[str, Any]: ...


class ModelRunner(Protocol):
    """A model a step runs: on a backend's workers (ModelCall) or in process (local.LocalModel)."""

    async def __call__(self, feeds: Mapping[str, Any], ctx: CallContext) -> Mapping[str, Any]: ...


# (body, headers, request id, timeout) -> the answer: a call dispatched through the dataplane.
Through = Callable[[bytes, Mapping[str, str], str, float], Awaitable[WorkerResponse]]


_FORM_NAMES = {
    "tf": "a TF PredictResponse",
    "json": "an answer in the JSON form",
    "values": "a values message",
}


class ModelCall:
    """One call of a model on a backend's workers: feeds by name in, outputs by name out."""

    def __init__(
        self,
        step: str,
        backend: ServiceBackend,
        wanted: Sequence[str] = (),
        concurrency: int = 0,
        through: Through | None = None,
        form: str = "tf",
        shm: str | None = None,
    ) -> None:
        self.step = step
        # "tf" (an onnx service), "json" (a python service), see gateway.backends.pipelines.forms, or
        # "values" (an op on its own workers), see gateway.codecs.pipeline_values.
        self.form = form
        self.headers = FORM_HEADERS[form]
        # The values form's shared memory directory, for large arrays (gateway.codecs.shm).
        self.shm = shm
        self.backend = backend
        # How a call reaches another service's backend: through the dataplane, so that its
        # figures (statistics, metrics) count the pipeline's calls beside its own callers'.
        self.through = through
        self.wanted = tuple(wanted)
        # A step's own limit on calls in flight; the pool's max_pending bounds the rest.
        self.limit = asyncio.Semaphore(concurrency) if concurrency > 0 else None
        self._checked: object = None  # the metadata the step's names were last checked against

    def _check(self, feeds: Mapping[str, Any]) -> None:
        """The step's names against the model's signature, once the workers have reported it:
        a mismatch is the config's fault (500 naming the name), not the caller's (the 400 a
        worker would answer)."""
        meta = self.backend.metadata
        if meta is None or meta is self._checked:
            return
        inputs = [s.name for s in meta.inputs]
        outputs = [s.name for s in meta.outputs]
        for name in feeds:
            if inputs and name not in inputs:
                raise StepFailed(
                    self.step, 500, f"the model has no input {name!r}; its inputs: {', '.join(inputs)}"
                )
        for name in inputs:
            if name not in feeds:
                raise StepFailed(self.step, 500, f"the model's input {name!r} is not given")
        for name in self.wanted:
            if outputs and name not in outputs:
                raise StepFailed(
                    self.step, 500, f"the model has no output {name!r}; its outputs: {', '.join(outputs)}"
                )
        self._checked = meta

    def _types(self, key: str) -> dict[str, np.dtype[Any]]:
        """The model's ``inputs`` or ``outputs`` (``key``) as numpy types, once reported."""
        meta = self.backend.metadata
        if meta is None:
            return {}
        specs = meta.inputs if key == "inputs" else meta.outputs
        return {s.name: v2_tensors.DATATYPES[s.datatype] for s in specs if s.datatype in v2_tensors.DATATYPES}

    def _feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Arrays for the wire; a numeric value is cast to the model's own input type (an op
        computing in float64 for a float32 model), as a client's loose JSON values are."""
        declared = self._types("inputs")
        out: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            arr = np.asarray(value)
            want = declared.get(name)
            if want is not None and arr.dtype != want and arr.dtype.kind in "biuf" and want.kind in "biuf":
                arr = arr.astype(want)
            out[name] = arr
        return out

    async def __call__(self, feeds: Mapping[str, Any], ctx: CallContext) -> dict[str, np.ndarray]:
        self._check(feeds)
        writer = ShmWriter(self.shm) if self.shm is not None else None
        try:
            if self.form == "values":  # an op's own workers: plain values as they are
                body = values.encode(feeds, self.wanted, writer, self.shm)
            elif self.form == "json":
                body = json_request(self._feeds(feeds), self.wanted)
            else:
                body = v2_tensors.tf_request(self._feeds(feeds), self.wanted)
        except (ValueError, TypeError) as exc:
            if writer is not None:
                writer.remove_all()
            raise StepFailed(self.step, 500, f"cannot send the model's inputs: {exc}") from None
        try:
            if self.limit is None:
                return await self._dispatch(body, ctx)
            async with self.limit:
                return await self._dispatch(body, ctx)
        finally:
            if writer is not None:  # the call is over (answered, failed or given up)
                writer.remove_all()

    async def _dispatch(self, body: bytes, ctx: CallContext) -> dict[str, np.ndarray]:
        remaining = ctx.deadline - time.monotonic()
        if remaining <= 0:
            raise StepFailed(self.step, 504, "the request's time ran out before this step", "UpstreamTimeout")
        try:
            if self.through is not None:
                resp = await self.through(body, self.headers, ctx.request_id, remaining)
            else:
                req = WorkerRequest(
                    body,
                    "",
                    self.headers["Content-Type"],
                    ctx.request_id,
                    dict(self.headers),
                    ctx.deadline,
                )
                resp = await self.backend.dispatch(req, remaining)
        except Exception as exc:
            err = errors.from_exception(exc)
            raise StepFailed(self.step, err.status, err.message, err.code) from None
        if resp.status != 200:
            raise StepFailed(self.step, int(resp.status), errors.message_of(bytes(resp.body)))
        try:
            if self.form == "values":
                return values.decode(bytes(resp.body), shm=self.shm, unlink=True).values
            if self.form == "json":
                return json_outputs(bytes(resp.body))
            return v2_tensors.tf_outputs(bytes(resp.body), self._types("outputs"))
        except (ValueError, TypeError) as exc:
            what = _FORM_NAMES[self.form]
            raise StepFailed(self.step, 502, f"the model's reply is not {what} ({exc})") from None


class ModelStep:
    def __init__(self, call: ModelRunner) -> None:
        self.call = call

    async def run(self, inputs: dict[str, Any], ctx: CallContext) -> Mapping[str, Any]:
        return await self.call(inputs, ctx)


class TransformStep:
    """A built-in pure transform: cheap numpy work, run inline on the event loop."""

    def __init__(self, spec: StepSpec) -> None:
        assert spec.transform is not None
        self.fn = TRANSFORM_FUNCTIONS[spec.transform]
        self.args = spec.args

    async def run(self, inputs: dict[str, Any], ctx: CallContext) -> Mapping[str, Any]:
        return self.fn(self.args, inputs)


class OpStep:
    """A Python op's hooks in the step's own threads (``concurrency`` of them), around an
    optional model call."""

    def __init__(self, spec: StepSpec, op: Any, model: ModelRunner | None) -> None:
        self.name = spec.name
        self.op = op
        self.model = model
        self.pre = getattr(op, "preprocess", None)
        self.post = getattr(op, "postprocess", None)
        self.threads = ThreadPoolExecutor(max(1, spec.concurrency), thread_name_prefix=f"op-{spec.name}")

    def _mapping(self, value: Any, hook: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise StepFailed(self.name, 500, f"{hook}() returned {type(value).__name__}; expected a dict")
        return value

    async def run(self, inputs: dict[str, Any], ctx: CallContext) -> Mapping[str, Any]:
        loop = asyncio.get_running_loop()
        values: Mapping[str, Any] = inputs
        if self.pre is not None:
            values = self._mapping(await loop.run_in_executor(self.threads, self.pre, inputs), "preprocess")
        if self.model is not None and not isinstance(values, SkipModel):
            values = await self.model(values, ctx)
        if self.post is not None:
            values = self._mapping(
                await loop.run_in_executor(self.threads, self.post, inputs, values), "postprocess"
            )
        return values

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.op, "close", None)
        if callable(close):
            close()


class Runner:
    """Runs requests through ``spec``'s steps (``execs``: step name -> its executor)."""

    def __init__(self, spec: PipelineSpec, execs: Mapping[str, StepExec]) -> None:
        self.spec = spec
        self.execs = dict(execs)
        steps = spec.steps
        # A chain (each step reads the one before it) gains nothing from a task per step.
        self.chain = all(steps[i - 1].name in steps[i].deps for i in range(1, len(steps)))

    async def run(
        self, inputs: Mapping[str, Any], ctx: CallContext
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """-> (every value by ``step.output`` / ``request.input``, seconds per step)."""
        values: dict[str, Any] = {f"{REQUEST}.{k}": v for k, v in inputs.items()}
        timings: dict[str, float] = {}
        if self.chain:
            for step in self.spec.steps:
                await self._step(step, values, timings, ctx)
            return values, timings
        tasks: dict[str, asyncio.Future[None]] = {}
        for step in self.spec.steps:
            deps = [tasks[d] for d in step.deps]
            tasks[step.name] = asyncio.ensure_future(self._after(deps, step, values, timings, ctx))
        try:
            await asyncio.gather(*tasks.values())
        except BaseException:
            for t in tasks.values():
                t.cancel()
                # Steps that failed after the first failure: their errors are not news.
                t.add_done_callback(_consume)
            raise
        return values, timings

    async def _after(
        self,
        deps: list[asyncio.Future[None]],
        step: StepSpec,
        values: dict[str, Any],
        timings: dict[str, float],
        ctx: CallContext,
    ) -> None:
        for dep in deps:
            await dep
        await self._step(step, values, timings, ctx)

    async def _step(
        self, step: StepSpec, values: dict[str, Any], timings: dict[str, float], ctx: CallContext
    ) -> None:
        inputs = {i.name: values[f"{i.source.step}.{i.source.name}"] for i in step.inputs}
        t0 = time.perf_counter()
        ctx.running.add(step.name)
        try:
            with ctx.span(step.name):
                out = await self.execs[step.name].run(inputs, ctx)
        except asyncio.CancelledError:
            raise  # left in ctx.running: the request ran out of time while this step ran
        except Exception as exc:
            timings[step.name] = time.perf_counter() - t0
            ctx.running.discard(step.name)
            raise _failure(step.name, exc) from None
        timings[step.name] = time.perf_counter() - t0
        ctx.running.discard(step.name)
        for name in step.output_names:
            if name not in out:
                raise StepFailed(
                    step.name, 500, f"produced no output {name!r}; it gave: {', '.join(map(str, out))}"
                )
            values[f"{step.name}.{name}"] = out[name]


def _failure(step: str, exc: Exception) -> StepFailed:
    if isinstance(exc, StepFailed):
        return exc
    if isinstance(exc, OpError):
        return StepFailed(step, exc.status, exc.message)
    detail = str(exc).splitlines()[0][:300] if str(exc) else ""
    return StepFailed(step, 500, f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__)


def _consume(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


__all__ = [
    "CallContext",
    "ModelCall",
    "ModelRunner",
    "ModelStep",
    "OpStep",
    "Runner",
    "StepExec",
    "StepFailed",
    "TransformStep",
]
