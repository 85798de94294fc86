"""A pipeline service's dataplane ``Backend``: decode the call, run the graph, answer.

To the dataplane a pipeline is one more backend, so every entry point serves it unchanged
(EAS predict in TF, Torch, Blade or JSON form, KServe V1 and V2, Paddle Serving, the
asynchronous queue, Cluster Serving): the request is decoded with the EAS codec, bound to
the pipeline's declared inputs, run through the steps, and the pipeline's outputs are
encoded in the request's own format. It is a ``ServiceBackend`` (gateway.core.backend) in
full, so the application keeps it beside the pools; it has no workers of its own to scale.

A model step with ``service:`` calls that service's worker pool (one predictor serves its
direct callers and every pipeline that uses it), in the form its processor speaks (an
``onnx`` or a ``python`` service, see gateway.backends.pipelines.forms); a step with its own
``model:`` gets a pool of its own, named ``<pipeline>.<step>``, started and stopped with the pipeline.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.backends.in_gateway import RunsInGateway
from gateway.backends.pipelines.forms import STEP_FORMS
from gateway.backends.pipelines.local import FetchedModel, LocalModel
from gateway.backends.pipelines.remote import RemoteModelCall
from gateway.backends.pipelines.runner import (
    CallContext,
    ModelCall,
    ModelRunner,
    ModelStep,
    OpStep,
    Runner,
    StepExec,
    StepFailed,
    TransformStep,
)
from gateway.backends.pipelines.timings import TIMINGS_HEADER, StepTimings, server_timing, wants_timings
from gateway.backends.sourced import cache_dir
from gateway.codecs import v2_tensors
from gateway.codecs.errors import eas_body
from gateway.codecs.shm import SHM_ENV, ShmArea
from gateway.config import ConfigError, GatewayConfig, ServiceConfig
from gateway.config.catalog import DTYPES
from gateway.config.image_transforms import IMAGE_TRANSFORMS, image_dtype
from gateway.config.model_urls import is_model_url
from gateway.config.pipelines import REQUEST, PipelineSpec, Source, StepSpec, TensorDecl
from gateway.core import errors, json_answer
from gateway.core.backend import ServiceBackend
from gateway.core.calls import RESPONSE_FORMAT_HEADER, WorkerRequest, WorkerResponse
from gateway.core.dataplane import DataPlane
from gateway.core.metadata import UNKNOWN, ModelMetadata, TensorSpec
from gateway.core.services import backend_ready
from gateway.worker.ops import load_op

log = logging.getLogger("gateway.pipelines")
JSON = "application/json"
PoolFactory = Callable[[ServiceConfig, GatewayConfig], ServiceBackend]


def step_service(
    pipeline: ServiceConfig, step: StepSpec, env: Mapping[str, str] | None = None
) -> ServiceConfig:
    """The hidden service whose pool runs a step's own model, or its op (``env``: more
    variables for its workers): on worker processes, or for a model of another runtime than
    ONNX with ``placement: thread``, in the gateway's threads (``concurrency`` of them) as a
    service of that runtime runs there. It takes the pipeline's tokens: the gateway's calls
    over the worker IPC need none, and a direct call to its workers' HTTP port needs the
    pipeline's."""
    in_threads = step.model is not None and step.placement == "thread"
    return ServiceConfig(
        name=f"{pipeline.name}.{step.name}",
        token=pipeline.token,
        extra_tokens=pipeline.extra_tokens,
        public=pipeline.public,
        processor=step.processor if step.model else "op",
        model=step.model,
        entry=None if step.model else step.op,
        config=step.config,
        placement="thread" if in_threads else "process",
        workers=max(1, step.concurrency) if in_threads else step.workers,
        intra_op_threads=step.intra_op_threads,
        max_pending=pipeline.max_pending,
        timeout_ms=pipeline.timeout_ms,
        request_format="tf",
        env={**pipeline.env, **(env or {})},
    )


def _json_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _answer_array(value: Any) -> np.ndarray:
    """A pipeline output as the answer's tensor: arrays, numbers, strings and lists of them as
    they are; a dict (a plain value no tensor holds) as its JSON text."""
    if isinstance(value, dict):
        return np.array(json.dumps(value, ensure_ascii=False, default=_json_text), dtype=object)
    return np.asarray(value)


def _answer_size(kind: str, arrays: list[np.ndarray]) -> int:
    """About how many bytes the answer in ``kind`` takes: the JSON form's text (numbers in
    their shortest form, as it writes them), a protobuf form's values as packed bytes."""
    if kind == "json":
        return sum(json_answer.array_estimate(a, floats="shortest") for a in arrays)
    return sum(json_answer.raw_size(a) for a in arrays)


def _tensor_spec(decl: TensorDecl) -> eas.TensorSpec:
    dtype = v2_tensors.DATATYPES.get(decl.dtype) if decl.dtype else None
    return eas.TensorSpec(decl.name, dtype, decl.shape)


# Transform outputs of their input's type.
_FOLLOWS_INPUT = {("topk", "values"), ("softmax", "y"), ("concat", "y")}
ModelTypes = Callable[[str, str], "str | None"]


def _dtype(spec: PipelineSpec, source: Source, model_types: ModelTypes) -> str | None:
    """A value's V2 datatype: as declared, else as a transform or a model step makes it."""
    declared = spec.dtype_of(source)
    if declared is not None or source.step == REQUEST:
        return declared
    step = spec.step(source.step)
    if step.transform == "cast":
        return DTYPES.get(str(step.args["dtype"]).lower()) or str(step.args["dtype"]).upper()
    if step.transform in IMAGE_TRANSFORMS:  # decoders, div and normalize fix it; others keep it
        fixed = image_dtype(step.transform, step.args)
        if fixed is not None:
            return fixed
    if (step.transform, source.name) in _FOLLOWS_INPUT or step.transform in IMAGE_TRANSFORMS:
        found = {_dtype(spec, i.source, model_types) for i in step.inputs}
        return found.pop() if len(found) == 1 else None
    return model_types(step.name, source.name) if step.kind == "model" else None


def _metadata(spec: PipelineSpec, model_types: ModelTypes) -> ModelMetadata:
    """KServe metadata from the graph's entry (the request's inputs) and exit (its outputs)."""
    inputs = tuple(TensorSpec(d.name, d.dtype or UNKNOWN, d.shape or (-1,)) for d in spec.inputs)
    outputs = tuple(
        TensorSpec(name, _dtype(spec, src, model_types) or UNKNOWN, (-1,)) for name, src in spec.outputs
    )
    return ModelMetadata(inputs, outputs, platform="pipeline")


class PipelineBackend(RunsInGateway):
    """A pipeline service's backend (see the module docstring)."""

    # Calls arrive encoded: the pipeline decodes them with the EAS codec.
    takes_tensors = False

    def __init__(
        self,
        service: ServiceConfig,
        gateway: GatewayConfig,
        pools: Mapping[str, ServiceBackend],
        *,
        pool_factory: PoolFactory,
        timings: StepTimings | None = None,
        processors: Mapping[str, str] | None = None,
    ) -> None:
        assert service.pipeline is not None
        # The processor of each service a step may call: it decides the form of the call.
        self.processors = dict(processors or {})
        self.service = service
        self.spec: PipelineSpec = service.pipeline
        self.gateway = gateway
        # The largest answer (gateway.max_response_bytes; 0: none).
        self.max_answer = gateway.max_response_bytes
        self.timings = timings or StepTimings()
        self.timings.declare(service.name, [s.name for s in self.spec.steps])
        # Shared memory for the large arrays of ops on worker processes of their own.
        self.shm: ShmArea | None = None
        # Each model step's backend: the referenced service's pool, or a pool of its own.
        self.own_pools: dict[str, ServiceBackend] = {}
        self.model_backends: dict[str, ServiceBackend] = {}
        for step in self.spec.steps:
            if step.service is not None:
                self.model_backends[step.name] = pools[step.service]
            elif self._own_pool(step):
                env: dict[str, str] = {}
                if step.model is None:  # an op alone: its large arrays in shared memory
                    if self.shm is None:
                        self.shm = ShmArea.plan(service.name)
                    if self.shm is not None:
                        env[SHM_ENV] = self.shm.path
                pool = pool_factory(step_service(service, step, env), gateway)
                self.own_pools[step.name] = self.model_backends[step.name] = pool
        self._metadata: ModelMetadata | None = None
        self.plane: DataPlane | None = None
        self._local: dict[str, LocalModel] = {}
        # The in-gateway models named by a URL, fetched before they load (the steps' own
        # pools fetch theirs as any service does: the pool factory wraps them).
        self._fetches: dict[str, FetchedModel] = {}
        # The model steps whose predictor is another server (gateway.backends.pipelines.remote).
        self._remote: dict[str, RemoteModelCall] = {}
        self.input_specs = [_tensor_spec(d) for d in self.spec.inputs]
        self.output_names = [name for name, _ in self.spec.outputs]
        self.runner: Runner | None = None
        self._ops: list[OpStep] = []
        self._closers: list[Callable[[], None]] = []
        self.restarts_total = 0  # its steps' workers restart in their own pools
        self._pending = 0

    @staticmethod
    def _own_pool(step: StepSpec) -> bool:
        """Whether a step runs on a pool of its own: its model or its op on worker processes,
        or its model of another runtime than ONNX in the gateway's threads (an ONNX model
        there is a LocalModel, which hands tensors on as they are)."""
        if step.placement == "process":
            return step.model is not None or step.op is not None
        return step.model is not None and step.processor != "onnx"

    @property
    def metadata(self) -> ModelMetadata:
        """The pipeline's signature; a model step's output types fill in once its workers have
        reported them (kept from then on)."""
        if self._metadata is not None:
            return self._metadata
        complete = True

        def model_types(step: str, output: str) -> str | None:
            nonlocal complete
            local = self._local.get(step)
            if local is not None:
                return local.outputs.get(output)
            if step in self._remote:  # another server's: only what the step declares
                return None
            backend = self.model_backends.get(step)
            meta = backend.metadata if backend is not None else None
            if meta is None:
                complete = False
                return None
            return next((t.datatype for t in meta.outputs if t.name == output), None)

        found = _metadata(self.spec, model_types)
        if complete and self.runner is not None:
            self._metadata = found
        return found

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load the ops (user code: an import error fails the start, naming the step) and
        start the steps' own pools; workers boot in the background, as a pool's do."""
        execs: dict[str, StepExec] = {}
        if self.shm is not None and not self.shm.open():
            log.warning(
                "pipeline %s: no shared memory directory; large arrays go in the messages", self.service.name
            )
            self.shm = None
        for step in self.spec.steps:
            model: ModelRunner | None = None
            # An op alone with placement: process runs on its own workers, like a model.
            remote_op = step.kind == "op" and step.model is None and step.name in self.own_pools
            wanted = step.output_names if step.kind == "model" or remote_op else ()
            if step.name in self.model_backends:
                through = None
                if step.service is not None and self.plane is not None:
                    through = functools.partial(self._through_plane, step.service)
                processor = self.processors.get(step.service, "onnx") if step.service else step.processor
                form = "values" if remote_op else STEP_FORMS.get(processor, "tf")
                shm = self.shm.path if remote_op and self.shm is not None else None
                model = ModelCall(
                    step.name, self.model_backends[step.name], wanted, step.concurrency, through, form, shm
                )
            elif step.predictor is not None:  # another server, by URL
                remote = RemoteModelCall(step.name, step.predictor, step.output_names)
                self._remote[step.name] = remote
                model = remote
            elif step.model is not None and is_model_url(step.model):  # placement: thread, fetched first
                model = self._fetched_model(step, wanted)
            elif step.model is not None:  # placement: thread
                model = await self._local_model(step, wanted)
            if step.kind == "transform":
                execs[step.name] = TransformStep(step)
            elif step.kind == "op" and not remote_op:
                assert step.op is not None
                try:
                    op = await asyncio.to_thread(load_op, step.op, step.config)
                except Exception as exc:
                    # A config error (the CLI exits 2 with it), not a crash: the config names the op.
                    raise ConfigError(
                        f"service {self.service.name!r}: step {step.name!r}: "
                        f"cannot load op {step.op!r}: {exc}"
                    ) from exc
                execs[step.name] = op_step = OpStep(step, op, model)
                self._ops.append(op_step)
            else:
                assert model is not None
                execs[step.name] = ModelStep(model)
        self.runner = Runner(self.spec, execs)
        for fetch in self._fetches.values():
            fetch.start()
        for pool in self.own_pools.values():
            await pool.start()

    def _fetched_model(self, step: StepSpec, wanted: tuple[str, ...]) -> LocalModel:
        assert step.model is not None
        given = [i.name for i in step.inputs] if step.kind == "model" else []
        local = LocalModel(step.name, step.model, wanted, step.concurrency, step.intra_op_threads, given)
        self._fetches[step.name] = FetchedModel(local, self.gateway.model_sources, cache_dir(self.gateway))
        self._closers.append(local.close)
        self._local[step.name] = local
        return local

    async def _local_model(self, step: StepSpec, wanted: tuple[str, ...]) -> LocalModel:
        assert step.model is not None
        given = [i.name for i in step.inputs] if step.kind == "model" else []
        local = LocalModel(step.name, step.model, wanted, step.concurrency, step.intra_op_threads, given)
        try:
            await asyncio.to_thread(local.load)
        except Exception as exc:
            raise ConfigError(
                f"service {self.service.name!r}: step {step.name!r}: cannot load model {step.model!r}: {exc}"
            ) from exc
        self._closers.append(local.close)
        self._local[step.name] = local
        return local

    def _step_span(self, step: str) -> AbstractContextManager[Any]:
        return self.plane.step_span(self.service.name, step) if self.plane is not None else nullcontext()

    def attach(self, plane: DataPlane) -> None:
        """Call other services through the gateway's dataplane (set before start)."""
        self.plane = plane

    async def _through_plane(
        self, service: str, body: bytes, headers: Mapping[str, str], request_id: str, timeout: float
    ) -> WorkerResponse:
        assert self.plane is not None
        svc = self.plane.services[service]
        return await self.plane.record_call(svc, headers, body, request_id=request_id, timeout=timeout)

    async def wait_ready(self, timeout: float) -> bool:
        results = await asyncio.gather(
            *(b.wait_ready(timeout) for b in self.model_backends.values()),
            *(f.wait(timeout) for f in self._fetches.values()),
        )
        return all(results)

    async def wait_all_ready(self, timeout: float) -> bool:
        """Every worker of every model step's backend ready (see ``wait_ready``); a fetched
        model, once its fetch ends (bounded by the store's timeouts)."""
        results = await asyncio.gather(
            *(b.wait_all_ready(timeout) for b in self.model_backends.values()),
            *(f.wait(None) for f in self._fetches.values()),
        )
        return all(results)

    async def scale(self, workers: int, drain_timeout: float) -> None:
        """A pipeline's workers are its steps' (``workers:`` of a step, or the service it calls)."""
        raise errors.BadRequest(f"service {self.service.name!r} is a pipeline service: it has no workers")

    def is_ready(self) -> bool:
        """Ready when every model step's backend is (a pipeline of ops only: once started)."""
        if self.runner is None:
            return False
        fetched = all(f.loaded for f in self._fetches.values())
        return fetched and all(backend_ready(b) for b in self.model_backends.values())

    def not_ready_reason(self) -> str | None:
        """None while ready; otherwise the first model step whose backend is not, and why."""
        if self.runner is None:
            return "the pipeline is not started"
        for step, fetch in self._fetches.items():
            if not fetch.loaded:
                return f"step {step}: {fetch.reason()}"
        for step, backend in self.model_backends.items():
            if not backend_ready(backend):
                return f"step {step}: {backend.not_ready_reason() or 'it has no ready worker'}"
        return None

    @property
    def pending(self) -> int:
        return self._pending

    async def stop(self, drain_timeout: float) -> None:
        for fetch in self._fetches.values():
            await fetch.stop()
        await asyncio.gather(
            *(p.stop(drain_timeout) for p in self.own_pools.values()), return_exceptions=True
        )
        if self.shm is not None:  # what calls that gave up left behind
            self._closers.append(self.shm.close)
            self.shm = None
        for remote in self._remote.values():
            await remote.aclose()
        for close in [op.close for op in self._ops] + self._closers:
            try:
                close()
            except Exception:
                log.exception("closing a step of %s", self.service.name)

    def snapshot(self) -> list[dict[str, Any]]:
        """The steps' own workers, each marked with its step."""
        out = []
        for step, pool in self.own_pools.items():
            out.extend({**w, "step": step} for w in pool.snapshot())
        return out

    # ------------------------------------------------------------------ calls
    def _error(self, status: int, code: str, message: str, rid: str) -> WorkerResponse:
        return WorkerResponse(status, eas_body(code, message, rid), JSON)

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        t0 = time.perf_counter()
        rid = req.request_id
        if self.runner is None:
            return self._error(503, "ServiceNotReady", f"pipeline {self.service.name!r} is not started", rid)
        if not all(f.loaded for f in self._fetches.values()):
            reason = self.not_ready_reason()
            return self._error(
                503, "ServiceNotReady", f"pipeline {self.service.name!r} is not ready: {reason}", rid
            )
        try:
            decoded = eas.decode_request(
                req.body, self.service.request_format, req.header("X-Eas-Request-Format")
            )
            feeds = eas.bind_inputs(decoded, self.input_specs)
            indices = eas.select_outputs(decoded, self.output_names)
        except eas.InvalidInput as exc:
            return self._error(400, "InvalidInput", exc.message, rid)
        if req.header(RESPONSE_FORMAT_HEADER) == "tf":  # a gateway adapter reads the arrays
            decoded = replace(decoded, kind="tf")
        deadline = time.monotonic() + timeout
        if req.deadline:
            deadline = min(deadline, req.deadline)
        ctx = CallContext(rid, deadline, span=self._step_span)
        self._pending += 1  # runs under way: the service's calls in flight (``pending``)
        try:
            # A step's own model calls keep to the deadline; an op cannot be interrupted, so
            # the whole run is bounded here too.
            values, timings = await asyncio.wait_for(
                self.runner.run(feeds, ctx), max(0.0, deadline - time.monotonic())
            )
        except StepFailed as exc:
            return self._error(exc.status, exc.code, str(exc), rid)
        except asyncio.TimeoutError:
            waiting = ", ".join(sorted(ctx.running)) or "none"
            message = f"the pipeline did not finish within {timeout:g} s (steps still running: {waiting})"
            return self._error(504, "UpstreamTimeout", message, rid)
        finally:
            self._pending -= 1
        self.timings.observe(self.service.name, timings)
        arrays = [_answer_array(values[f"{src.step}.{src.name}"]) for _, src in self.spec.outputs]
        try:
            # The outputs' size can follow the caller's shapes: refused before it is encoded.
            json_answer.check(
                _answer_size(decoded.kind, [arrays[i] for i in indices]), self.max_answer, "about"
            )
            body, ctype = eas.encode_response(decoded, self.output_names, arrays, indices)
        except json_answer.AnswerTooLarge as exc:
            return self._error(exc.status, exc.code, str(exc), rid)
        except eas.InvalidInput as exc:
            return self._error(500, "InternalError", exc.message, rid)
        elapsed = time.perf_counter() - t0
        resp = WorkerResponse(200, body, ctype, int(elapsed * 1e6))
        if wants_timings(req.header(TIMINGS_HEADER)):
            resp.headers = {"Server-Timing": server_timing(timings, elapsed)}
        return resp


def pipeline_backends(
    services: list[ServiceConfig],
    gateway: GatewayConfig,
    pools: Mapping[str, ServiceBackend],
    pool_factory: PoolFactory,
    timings: StepTimings,
) -> dict[str, PipelineBackend]:
    """A backend for each pipeline service, over the other services' pools."""
    processors = {s.name: s.processor for s in services}
    return {
        s.name: PipelineBackend(
            s, gateway, pools, pool_factory=pool_factory, timings=timings, processors=processors
        )
        for s in services
        if s.pipeline is not None
    }


__all__ = ["PipelineBackend", "pipeline_backends", "step_service"]
