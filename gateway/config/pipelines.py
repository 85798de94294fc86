"""A pipeline's ``pipeline:`` config block: parsed into frozen specs and validated as a graph.

Everything a config can get wrong is found here, at load time, with a message that names
the step and the field: an unknown step or output, a cycle, a missing or mistyped input,
an output nothing uses. The module does no I/O beyond checking that the files it names exist
for file paths, and imports nothing of the gateway, so ``gateway.config`` can call it.

The shape (docs/pipelines.md has the whole story)::

    pipeline:
      inputs:  {image: {dtype: bytes, shape: [-1]}}      # the request's tensors
      steps:
        - name: decode                                   # a Python op
          op: ops.py:DecodeImage
          inputs: {image: request.image}                 # argument -> source
          outputs: {pixels: float32}                     # name -> dtype (or a list of names)
        - name: features                                 # a model: another service ...
          service: features
          inputs: {x: decode.pixels}
          outputs: [embedding]
        - name: classify                                 # ... or its own model file
          model: classifier.onnx                         # (its runtime by the suffix, or processor:)
          inputs: {x: features.embedding}
          outputs: [probabilities]
        - name: top                                      # a built-in pure transform
          transform: topk
          args: {k: 3}
          inputs: {x: classify.probabilities}
          outputs: [indices, values]
      outputs: {label: top.indices, score: top.values}   # answer name -> source
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.catalog import (
    DTYPES,
    MODEL_PROCESSORS,
    NOT_A_STEP,
    STEP_PROCESSORS,
    TRANSFORM_DTYPES,
    TRANSFORMS,
)
from gateway.config.files import ConfigError, existing_file, resolve_path
from gateway.config.image_transforms import IMAGE_TRANSFORMS, ImageArgsError, check_image_args, image_dtype
from gateway.config.model_urls import check_model_url, file_url_path, is_file_url, is_model_url
from gateway.config.user_code import ENTRY_FORMS
from gateway.config.values import check_model, runtime_of

REQUEST = "request"  # the source "step" of the request's own inputs
STEP_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
TENSOR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_:/.-]{0,127}$")

_STEP_KEYS = {
    "name", "inputs", "outputs", "service", "model", "op", "transform", "args", "config",
    "concurrency", "workers", "intra_op_threads", "placement", "predictor", "processor",
}  # fmt: skip
# The protocols a step speaks to a predictor on another server.
PREDICTOR_PROTOCOLS = ("v1", "v2", "grpc")
_PREDICTOR_KEYS = {"url", "model", "protocol", "timeout_ms", "retries", "token"}


class PipelineConfigError(ConfigError):
    """A pipeline block that cannot run; the message names the step and the field."""


@dataclass(frozen=True)
class Source:
    """Where a value comes from: ``request.<input>`` or ``<step>.<output>``."""

    step: str
    name: str

    def __str__(self) -> str:
        return f"{self.step}.{self.name}"


@dataclass(frozen=True)
class StepInput:
    name: str  # the argument's name inside the step (a model's input name, an op's key)
    source: Source
    dtype: str | None = None  # what the step expects, when the config says


@dataclass(frozen=True)
class TensorDecl:
    name: str
    dtype: str | None  # a V2 datatype name; None: any
    shape: tuple[int, ...] | None = None  # -1 for any size; None: any rank


@dataclass(frozen=True)
class PredictorSpec:
    """A model served by another server, which a model step calls by URL (KServe's
    transformer in front of ``--predictor_host``)."""

    url: str  # http://host:port for v1 and v2; host:port (or grpc://host:port) for grpc
    model: str  # the model's name on that server
    protocol: str = "v2"  # v1, v2 (REST, JSON tensors) or grpc (V2 gRPC)
    timeout_ms: int = 0  # each attempt's limit; 0: what is left of the call's own budget
    retries: int = 0  # further attempts after a failure to connect or a 502/503/504
    token: str | None = None  # sent as Authorization: Bearer <token>; never logged

    def __repr__(self) -> str:  # never show the token
        return f"PredictorSpec(url={self.url!r}, model={self.model!r}, protocol={self.protocol!r})"

    @property
    def label(self) -> str:
        """How errors name it."""
        return f"predictor {self.model!r} at {self.url} ({self.protocol})"


@dataclass(frozen=True)
class StepSpec:
    name: str
    kind: str  # "model", "op" or "transform"
    inputs: tuple[StepInput, ...]
    outputs: tuple[TensorDecl, ...]
    service: str | None = None  # a model step that calls another service's workers
    model: str | None = None  # a model step with its own model file, folder or URL
    # The runtime of the step's own model (gateway.config.catalog.MODEL_PROCESSORS).
    processor: str = "onnx"
    op: str | None = None  # "path/to/file.py:Class" or "package.module:Class"
    transform: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    concurrency: int = 0  # 0: the default (one thread for an op, no limit for a model call)
    # Where a step's own model runs, or its op when it has none: "process" (worker processes,
    # ``workers`` of them) or "thread" (in the gateway process, ``concurrency`` threads, values
    # passed as they are). An op around a model always runs in the gateway's threads.
    placement: str = "thread"
    workers: int = 1
    intra_op_threads: int = 1
    predictor: PredictorSpec | None = None  # a model step that calls another server by URL

    @property
    def deps(self) -> tuple[str, ...]:
        """The earlier steps this one waits for."""
        return tuple(dict.fromkeys(i.source.step for i in self.inputs if i.source.step != REQUEST))

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)


@dataclass(frozen=True)
class PipelineSpec:
    inputs: tuple[TensorDecl, ...]
    steps: tuple[StepSpec, ...]  # in an order where every step comes after its inputs' steps
    outputs: tuple[tuple[str, Source], ...]  # the answer's names and where each comes from

    def step(self, name: str) -> StepSpec:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def dtype_of(self, source: Source) -> str | None:
        """The declared datatype of a value, None when nothing says."""
        return _declared(self.inputs, {s.name: s for s in self.steps}, source)


# ----------------------------------------------------------------------------- parsing


def _fail(where: str, message: str) -> PipelineConfigError:
    return PipelineConfigError(f"{where}: {message}")


def _dtype(value: Any, where: str) -> str | None:
    if value is None:
        return None
    key = str(value).strip().lower()
    if key not in DTYPES and str(value).upper() not in DTYPES.values():
        raise _fail(where, f"unknown dtype {str(value)[:32]!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES.get(key) or str(value).upper()


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(where, f"expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in value
    ):
        raise _fail(where, "expected a list of integers (-1 for any size)")
    return tuple(value)


def _tensor_decl(name: Any, value: Any, where: str) -> TensorDecl:
    if not isinstance(name, str) or not TENSOR_NAME_RE.match(name):
        raise _fail(where, f"{name!r} is not a valid tensor name")
    if isinstance(value, Mapping):
        extra = set(value) - {"dtype", "shape"}
        if extra:
            raise _fail(f"{where}.{name}", f"unknown key(s) {', '.join(sorted(map(str, extra)))}")
        return TensorDecl(
            name, _dtype(value.get("dtype"), f"{where}.{name}.dtype"), _shape(value.get("shape"), where)
        )
    return TensorDecl(name, _dtype(value, f"{where}.{name}"))


def tensor_decls(raw: Any, where: str) -> tuple[TensorDecl, ...]:
    """``[a, b]`` or ``{a: dtype, b: {dtype, shape}}``."""
    if isinstance(raw, list):
        out = tuple(_tensor_decl(n, None, where) for n in raw)
    elif isinstance(raw, Mapping):
        out = tuple(_tensor_decl(n, v, where) for n, v in raw.items())
    else:
        raise _fail(where, "expected a list of names or a mapping of name to dtype")
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise _fail(where, "a name appears twice")
    return out


def _source(value: Any, where: str) -> Source:
    if not isinstance(value, str) or value.count(".") < 1:
        raise _fail(where, f"expected 'request.<input>' or '<step>.<output>', got {value!r}")
    step, _, name = value.partition(".")
    return Source(step, name)


def _step_inputs(raw: Any, where: str) -> tuple[StepInput, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise _fail(where, "expected a mapping of argument name to 'request.<input>' or '<step>.<output>'")
    out = []
    for name, value in raw.items():
        w = f"{where}.{name}"
        if not isinstance(name, str) or not TENSOR_NAME_RE.match(name):
            raise _fail(where, f"{name!r} is not a valid input name")
        if isinstance(value, Mapping):
            extra = set(value) - {"from", "dtype"}
            if extra:
                raise _fail(w, f"unknown key(s) {', '.join(sorted(map(str, extra)))}; allowed: dtype, from")
            out.append(
                StepInput(name, _source(value.get("from"), f"{w}.from"), _dtype(value.get("dtype"), w))
            )
        else:
            out.append(StepInput(name, _source(value, w)))
    return tuple(out)


def _step(raw: Any, i: int, base: Path | None) -> StepSpec:
    where = f"steps[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(where, "expected a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not STEP_NAME_RE.match(name) or name == REQUEST:
        raise _fail(f"{where}.name", f"{name!r} must match {STEP_NAME_RE.pattern} and not be {REQUEST!r}")
    where = f"steps[{i}] ({name})"
    unknown = sorted(set(map(str, raw)) - _STEP_KEYS)
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_STEP_KEYS))}")
    service, model, op, transform = (raw.get(k) for k in ("service", "model", "op", "transform"))
    for key, value in (("service", service), ("model", model), ("op", op), ("transform", transform)):
        if value is not None and (not isinstance(value, str) or not value):
            raise _fail(f"{where}.{key}", "expected a non-empty string")
    predictor = _predictor(raw["predictor"], f"{where}.predictor") if "predictor" in raw else None
    if predictor is not None and (service or model or transform):
        raise _fail(f"{where}.predictor", "a step calls a predictor, a service or its own model: one of them")
    if service and model:
        raise _fail(where, "a step calls a service or runs its own model, not both")
    if transform and (service or model or op):
        raise _fail(f"{where}.transform", "a transform step has no op, model or service")
    if not (service or model or op or transform or predictor):
        raise _fail(where, "a step needs one of: service, model, predictor, op, transform")
    kind = "transform" if transform else ("op" if op else "model")
    processor = "onnx"
    if model:
        model, processor = _step_model(model, raw.get("processor"), base, where)
    elif "processor" in raw:
        raise _fail(f"{where}.processor", "only a step with its own model names its runtime")
    if op:
        if ":" not in op:
            raise _fail(f"{where}.op", f"expected {ENTRY_FORMS}")
        target, _, cls = op.rpartition(":")
        if target.endswith(".py"):
            target = existing_file(target, base, f"{where}.op")
        op = f"{target}:{cls}"
    inputs = _step_inputs(raw.get("inputs"), f"{where}.inputs")
    if "outputs" not in raw:
        raise _fail(f"{where}.outputs", "required: the names this step produces")
    outputs = tensor_decls(raw.get("outputs"), f"{where}.outputs")
    if not outputs:
        raise _fail(f"{where}.outputs", "a step must produce at least one output")
    args = raw.get("args") or {}
    config = raw.get("config") or {}
    for key, value in (("args", args), ("config", config)):
        if not isinstance(value, Mapping):
            raise _fail(f"{where}.{key}", "expected a mapping")
    placement = _placement(raw.get("placement"), model, op, service or transform or predictor, where)
    if transform:
        _check_transform(transform, inputs, outputs, args, where)
    elif args:
        raise _fail(f"{where}.args", "only transform steps take args (an op takes config)")
    return StepSpec(
        name=name, kind=kind, inputs=inputs, outputs=outputs, service=service, model=model,
        processor=processor, op=op,
        transform=transform, args=dict(args), config=dict(config),
        concurrency=_int(raw.get("concurrency", 0), f"{where}.concurrency", 0, 256),
        placement=placement,
        workers=_int(raw.get("workers", 1), f"{where}.workers", 1, 64),
        intra_op_threads=_int(raw.get("intra_op_threads", 1), f"{where}.intra_op_threads", 1, 64),
        predictor=predictor,
    )  # fmt: skip


def _predictor(raw: Any, where: str) -> PredictorSpec:
    """``predictor: {url, model, protocol, timeout_ms, retries, token}``."""
    if not isinstance(raw, Mapping):
        raise _fail(where, "expected a mapping with url and model")
    unknown = sorted(set(map(str, raw)) - _PREDICTOR_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_PREDICTOR_KEYS))
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    protocol = raw.get("protocol", "v2")
    if protocol not in PREDICTOR_PROTOCOLS:
        expected = ", ".join(PREDICTOR_PROTOCOLS)
        raise _fail(f"{where}.protocol", f"expected one of {expected}, got {protocol!r}")
    url, model, token = raw.get("url"), raw.get("model"), raw.get("token")
    for key, value in (("url", url), ("model", model)):
        if not isinstance(value, str) or not value:
            raise _fail(f"{where}.{key}", "required: a non-empty string")
    assert isinstance(url, str) and isinstance(model, str)
    if token is not None and (not isinstance(token, str) or not token):
        raise _fail(f"{where}.token", "expected a non-empty string")
    if protocol == "grpc":
        address = url.removeprefix("grpc://")
        if "://" in address or ":" not in address:
            raise _fail(f"{where}.url", f"a grpc predictor is host:port (or grpc://host:port), got {url!r}")
    elif not url.startswith(("http://", "https://")):
        raise _fail(f"{where}.url", f"a {protocol} predictor is http://host:port or https://..., got {url!r}")
    return PredictorSpec(
        url=url.rstrip("/"), model=model, protocol=protocol, token=token,
        timeout_ms=_int(raw.get("timeout_ms", 0), f"{where}.timeout_ms", 0, 3_600_000),
        retries=_int(raw.get("retries", 0), f"{where}.retries", 0, 10),
    )  # fmt: skip


def _step_model(value: str, processor: Any, base: Path | None, where: str) -> tuple[str, str]:
    """A step's own model and its runtime: a file (a SavedModel's folder for ``tensorflow``),
    or a URL the gateway fetches (as a service's ``model``). The runtime is ``processor``, or
    else the one the model's name says, as ``serve --model`` picks it (a file whose suffix
    names none is ONNX)."""
    w = f"{where}.model"
    if processor is not None and processor not in MODEL_PROCESSORS:
        expected = ", ".join(MODEL_PROCESSORS)
        raise _fail(f"{where}.processor", f"expected one of {expected}, got {processor!r}")
    if is_model_url(value):
        return check_model_url(value, w), processor or runtime_of(value)
    if is_file_url(value):
        value = file_url_path(value, w)
    path = resolve_path(value, base, w)
    processor = processor or runtime_of(path)
    try:
        check_model(path, processor, w)
    except ConfigError as exc:
        raise PipelineConfigError(str(exc)) from None
    return path, processor


def _placement(value: Any, model: str | None, op: str | None, elsewhere: str | None, where: str) -> str:
    """Where a step's own model runs (``model``: worker processes by default), or its op when
    it has no model (the gateway's threads by default)."""
    if value is None:
        return "process" if model else "thread"
    if value not in ("process", "thread"):
        raise _fail(f"{where}.placement", f"expected process or thread, got {value!r}")
    if elsewhere and not model and not op:
        raise _fail(f"{where}.placement", "a service step runs on its workers, a transform in the gateway")
    if op and not model and elsewhere:
        raise _fail(f"{where}.placement", "an op around a service runs in the gateway's threads")
    return str(value)


def _check_transform(
    transform: str, inputs: tuple[StepInput, ...], outputs: tuple[TensorDecl, ...], args: Any, where: str
) -> None:
    if transform not in TRANSFORMS:
        raise _fail(f"{where}.transform", f"unknown transform {transform!r}; known: {', '.join(TRANSFORMS)}")
    wants, gives, takes = TRANSFORMS[transform]
    names = [i.name for i in inputs]
    for want in wants:
        if want not in names:
            raise _fail(f"{where}.inputs", f"missing input {want!r} ({transform} takes {', '.join(wants)})")
    extra = [n for n in names if wants and n not in wants]
    if extra:
        raise _fail(f"{where}.inputs.{extra[0]}", f"{transform} takes only {', '.join(wants)}")
    if not inputs:
        raise _fail(f"{where}.inputs", f"{transform} needs at least one input")
    for out in outputs:
        if out.name not in gives:
            raise _fail(f"{where}.outputs.{out.name}", f"{transform} produces only {', '.join(gives)}")
    unknown = sorted(set(map(str, args)) - takes)
    if unknown:
        raise _fail(f"{where}.args", f"unknown arg(s) {', '.join(unknown)} for {transform}")
    if transform in IMAGE_TRANSFORMS:
        try:
            check_image_args(transform, args)
        except ImageArgsError as exc:
            raise _fail(f"{where}.{exc.where}", exc.message) from None
    if transform == "topk" and "k" in args:
        _int(args["k"], f"{where}.args.k", 1, 1 << 20)
    if transform == "label_map":
        labels = args.get("labels")
        if not isinstance(labels, list) or not labels:
            raise _fail(f"{where}.args.labels", "expected a non-empty list of labels")
    if transform == "cast":
        if _dtype(args.get("dtype"), f"{where}.args.dtype") is None:
            raise _fail(f"{where}.args.dtype", "required")


def pipeline_of(raw: Mapping[str, Any], processor: str, where: str, base: Path | None) -> PipelineSpec | None:
    """A service's ``pipeline:`` block parsed (``raw``: the service's mapping), or None for a
    service that is not a pipeline (which must not have one)."""
    if processor == "pipeline":
        return parse_pipeline(raw.get("pipeline"), where, base)
    if raw.get("pipeline") is not None:
        raise PipelineConfigError(f"{where}.pipeline: only a service with processor: pipeline has one")
    return None


def parse_pipeline(raw: Any, where: str, base: Path | None = None) -> PipelineSpec:
    """The validated spec of a ``pipeline:`` block (``where``: the service, for messages;
    ``base``: the config file's directory, for relative file paths)."""
    try:
        return _parse(raw, base)
    except PipelineConfigError as exc:
        raise PipelineConfigError(f"{where}.pipeline.{exc}") from None


def _parse(raw: Any, base: Path | None) -> PipelineSpec:
    if not isinstance(raw, Mapping):
        raise PipelineConfigError("expected a mapping with inputs, steps and outputs")
    unknown = sorted(set(map(str, raw)) - {"inputs", "steps", "outputs"})
    if unknown:
        raise _fail("pipeline", f"unknown key(s) {', '.join(unknown)}; allowed: inputs, outputs, steps")
    if not raw.get("inputs"):
        raise _fail("inputs", "required: the request's tensors, by name")
    inputs = tensor_decls(raw["inputs"], "inputs")
    steps_raw = raw.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise _fail("steps", "expected a non-empty list of steps")
    steps = [_step(s, i, base) for i, s in enumerate(steps_raw)]
    index: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.name in index:
            raise _fail(f"steps[{i}].name", f"step {s.name!r} is declared twice")
        index[s.name] = i
    outs_raw = raw.get("outputs")
    if not isinstance(outs_raw, Mapping) or not outs_raw:
        raise _fail("outputs", "expected a mapping of answer name to '<step>.<output>'")
    outputs = tuple((str(n), _source(v, f"outputs.{n}")) for n, v in outs_raw.items())
    by_name = {s.name: s for s in steps}
    request_names = [d.name for d in inputs]

    def check(source: Source, where: str, want: str | None) -> None:
        if source.step == REQUEST:
            if source.name not in request_names:
                raise _fail(where, f"no request input {source.name!r}; inputs: {', '.join(request_names)}")
        elif source.step not in by_name:
            raise _fail(where, f"unknown step {source.step!r}; steps: {', '.join(by_name)}")
        else:
            gives = by_name[source.step].output_names
            if source.name not in gives:
                raise _fail(
                    where, f"step {source.step!r} has no output {source.name!r}; outputs: {', '.join(gives)}"
                )
        have = _declared(inputs, by_name, source)
        if want is not None and have is not None and want != have:
            raise _fail(where, f"expects {want}, but {source} is {have}")

    for i, s in enumerate(steps):
        for inp in s.inputs:
            check(inp.source, f"steps[{i}] ({s.name}).inputs.{inp.name}", inp.dtype)
    for name, source in outputs:
        check(source, f"outputs.{name}", None)
    order = _topological(steps, index)
    _check_used(inputs, steps, outputs, index)
    return PipelineSpec(inputs, tuple(order), outputs)


def _declared(inputs: tuple[TensorDecl, ...], steps: Mapping[str, StepSpec], source: Source) -> str | None:
    if source.step == REQUEST:
        return next((d.dtype for d in inputs if d.name == source.name), None)
    step = steps[source.step]
    declared = next((d.dtype for d in step.outputs if d.name == source.name), None)
    if declared is None and step.transform == "sequential":
        declared = image_dtype(step.transform, step.args)
    if declared is None and step.transform:
        declared = TRANSFORM_DTYPES.get((step.transform, source.name))
    return declared


def _topological(steps: list[StepSpec], index: Mapping[str, int]) -> list[StepSpec]:
    """Steps ordered so that each follows the steps it reads from; a cycle is an error
    that spells the cycle out."""
    state: dict[str, int] = {}  # 1: being visited, 2: done
    order: list[StepSpec] = []

    def visit(step: StepSpec, path: list[str]) -> None:
        if state.get(step.name) == 2:
            return
        if state.get(step.name) == 1:
            loop = [*path[path.index(step.name) :], step.name]
            raise _fail(f"steps[{index[step.name]}] ({step.name}).inputs", f"cycle: {' -> '.join(loop)}")
        state[step.name] = 1
        for dep in step.deps:
            visit(steps[index[dep]], [*path, step.name])
        state[step.name] = 2
        order.append(step)

    for s in steps:
        visit(s, [])
    return order


def _check_used(
    inputs: tuple[TensorDecl, ...],
    steps: list[StepSpec],
    outputs: tuple[tuple[str, Source], ...],
    index: Mapping[str, int],
) -> None:
    """Every request input and every step output feeds something: an unused one is a
    misspelt name or a step whose work is thrown away."""
    used = {str(i.source) for s in steps for i in s.inputs} | {str(src) for _, src in outputs}
    for d in inputs:
        if f"{REQUEST}.{d.name}" not in used:
            raise _fail(f"inputs.{d.name}", "never used by a step or the pipeline's outputs")
    for s in steps:
        for out in s.outputs:
            if f"{s.name}.{out.name}" not in used:
                raise _fail(
                    f"steps[{index[s.name]}] ({s.name}).outputs.{out.name}",
                    "never used by a later step or the pipeline's outputs",
                )


def check_services(spec: PipelineSpec, where: str, processors: Mapping[str, str]) -> None:
    """A model step's ``service`` must name a service of the same config that runs a model or
    a Python processor (``processors``: service name -> processor)."""
    for s in spec.steps:
        if s.service is None:
            continue
        processor = processors.get(s.service)
        field_ = f"{where}.pipeline.steps ({s.name}).service"
        if processor is None:
            raise PipelineConfigError(f"{field_}: unknown service {s.service!r}")
        if processor not in STEP_PROCESSORS:
            why = NOT_A_STEP.get(processor, "it runs no model")
            raise PipelineConfigError(
                f"{field_}: service {s.service!r} is a {processor} service ({why}); "
                f"a model step calls a service whose processor is one of {', '.join(STEP_PROCESSORS)}"
            )


def check_pipelines(services: Sequence[Any]) -> None:
    """Every pipeline's ``service:`` steps against the config's services (each with ``name``,
    ``processor`` and ``pipeline``)."""
    processors = {svc.name: svc.processor for svc in services}
    for svc in services:
        if svc.pipeline is not None:
            check_services(svc.pipeline, f"services ({svc.name})", processors)


__all__ = [
    "DTYPES",
    "PREDICTOR_PROTOCOLS",
    "REQUEST",
    "TRANSFORMS",
    "PipelineConfigError",
    "PipelineSpec",
    "PredictorSpec",
    "Source",
    "StepInput",
    "StepSpec",
    "TensorDecl",
    "check_pipelines",
    "check_services",
    "parse_pipeline",
    "pipeline_of",
    "tensor_decls",
]
