"""The dataplane: one protocol-neutral path from a decoded call to a worker and back.

Every way into a model goes through one :class:`DataPlane`::

    aiohttp predict route ─┐
    lean HTTP front ───────┤
    worker's direct port ──┤   find ─> authenticate ─> admit ─> dispatch ─> WorkerResponse
    queue dispatcher ──────┤     (400/404)  (401/400) (408/429) (450/503/504, 413 answer too large)
    KServe V1 / V2 ────────┤
    Cluster Serving ───────┘   any failure: a GatewayError (gateway/core/errors.py), one status table

An entry point only moves bytes: it turns its transport's request into headers, a raw
path and a body, asks the dataplane, and writes the answer (or the ``GatewayError``) in
its own protocol's shape. The gateway has one dataplane over its worker pools; a worker
process has one over its compute queue, so direct calls get the same checks and errors.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from eas_sdk._core.constants import (
    DEFAULT_CONTENT_TYPE,
    HEADER_AUTHORIZATION,
    HEADER_DEADLINE_MS,
    HEADER_QUEUE_UID,
)
from gateway.config import SERVICE_NAME_RE, ServiceConfig
from gateway.core import errors, json_answer, tensors
from gateway.core.admission import Admission, BodyHold
from gateway.core.auth import STRICT, AuthStatus, ReplayCache, SignaturePolicy, keep_for, verify
from gateway.core.backend import Backend
from gateway.core.calls import (
    RESPONSE_FORMAT_HEADER,
    TensorRequest,
    TensorResponse,
    WorkerRequest,
    WorkerResponse,
)
from gateway.core.metadata import declared_dtypes
from gateway.core.parse_pool import parse_off_loop
from gateway.lean_http.wire import Headers

log = logging.getLogger("gateway.dataplane")

# Below this much remaining budget a call is not worth starting: the caller would have
# given up before a worker could answer.
MIN_DEADLINE_MS = 10
# Request headers never handed to a processor: credentials and hop-by-hop headers.
DROP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Authorization", "Content-MD5", "Date", "Host", "Connection", "Content-Length",
        "Transfer-Encoding", "Keep-Alive", "Cookie", "Upgrade", "Proxy-Authorization",
    )
)  # fmt: skip
# How the onnx processor is asked for its JSON form (the KServe and Cluster Serving adapters).
JSON_FORM_HEADERS = {"Content-Type": "application/json", "X-Eas-Request-Format": "json"}
TF_FORM_HEADERS = {"Content-Type": "application/octet-stream", "X-Eas-Request-Format": "tf"}
# The JSON form, answered in the TF form: arrays the adapter reads in place (infer_arrays).
JSON_ARRAYS_HEADERS = {**JSON_FORM_HEADERS, RESPONSE_FORMAT_HEADER: "tf"}
# Raw tokens remembered as verified, per dataplane (a client sends the same token on every call).
_VERIFIED_MAX = 1024


class DispatchObserver(Protocol):
    def observe_dispatch(self, service: str, seconds: float, compute_us: int) -> None: ...


class InferStats:
    """Per-service call figures, as Triton's statistics extension reports them."""

    __slots__ = ("compute_ns", "fail_count", "fail_ns", "last_inference_ms", "success_count", "success_ns")

    def __init__(self) -> None:
        self.success_count = self.success_ns = self.fail_count = self.fail_ns = 0
        self.compute_ns = 0
        self.last_inference_ms = 0

    def record(self, ok: bool, seconds: float, compute_us: int) -> None:
        ns = int(seconds * 1e9)
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns
        self.compute_ns += compute_us * 1000
        self.last_inference_ms = int(time.time() * 1000)


class DataPlane:
    """Finds services, checks credentials, admits and dispatches calls; see the module docstring."""

    def __init__(
        self,
        services: Iterable[ServiceConfig],
        backends: Mapping[str, Backend],
        *,
        make_request: Callable[..., WorkerRequest] = WorkerRequest,
        observer: DispatchObserver | None = None,
        admission: Admission | None = None,
        max_response_bytes: int = 0,
        signature: SignaturePolicy = STRICT,
        replay: ReplayCache | None = None,
    ) -> None:
        # The first service of a name wins, as in the configuration's own lookup.
        self.services: dict[str, ServiceConfig] = {}
        for svc in services:
            self.services.setdefault(svc.name, svc)
        self.backends = backends
        self.make_request = make_request
        self.observer = observer
        # Gateway-wide limits: connections, body bytes being received, calls in flight.
        self.admission = admission or Admission()
        self.max_response_bytes = max_response_bytes
        # What an EAS signature must carry, and the optional cache of signatures seen.
        self.signature = signature
        self.replay = replay
        # (service or queue name, raw token) pairs that verified. Tokens come from the config,
        # so a success stays one; a signature covers one call and is always checked. Bounded.
        self._verified: dict[tuple[str, str], None] = {}
        self.stats: dict[str, InferStats] = {name: InferStats() for name in self.services}

    # ------------------------------------------------------------------ services at run time
    def set_service(self, svc: ServiceConfig) -> None:
        """Add or replace a service (the service manager; its backend is in ``backends``).
        Tokens verified for the old version are forgotten: a removed token stops working."""
        self.services[svc.name] = svc
        self.stats.setdefault(svc.name, InferStats())
        self._forget(svc.name)

    def remove_service(self, name: str) -> None:
        self.services.pop(name, None)
        self.stats.pop(name, None)
        self._forget(name)

    def _forget(self, name: str) -> None:
        prefix = name + "/"
        for key in [k for k in self._verified if k[0] == name or k[0].startswith(prefix)]:
            del self._verified[key]

    # ------------------------------------------------------------------ find
    def find(self, raw_name: str) -> ServiceConfig:
        """The service named by a raw (undecoded) path segment: 400 for a malformed name, 404
        for an unknown one. Checking the raw segment means ``..%2F``, ``%00`` or any
        non-ASCII byte can never match a service."""
        if not SERVICE_NAME_RE.fullmatch(raw_name):
            raise errors.InvalidServiceName("invalid service name")
        svc = self.services.get(raw_name)
        if svc is None:
            raise errors.ServiceNotFound(f"service {raw_name!r} not found")
        return svc

    def find_model(self, raw_name: str) -> ServiceConfig:
        """A service that runs on workers (what KServe and Cluster Serving call a model)."""
        svc = self.find(raw_name)
        if svc.name not in self.backends:
            raise errors.ServiceNotFound(f"service {raw_name!r} not found")
        return svc

    @staticmethod
    def refuse_queue_call(svc: ServiceConfig, headers: Mapping[str, str]) -> None:
        """A QueueClient pointed at a predict service: 400 saying so. Queue clients send their
        identity header on every call; a predict call never does."""
        if HEADER_QUEUE_UID in headers:
            raise errors.WrongServiceKind(
                f"service {svc.name!r} is a synchronous predict service, not a queue: "
                "call it with a PredictClient, not a QueueClient"
            )

    @staticmethod
    def refuse_predict_call(svc: ServiceConfig, headers: Mapping[str, str], method: str, queue: str) -> None:
        """A PredictClient pointed at a plain queue: 400 saying so, before anything is stored.
        Its calls carry the deadline it waits for an answer (``X-Eas-Deadline-Ms``), which a
        queue put never gives, and no queue identity header."""
        if (
            svc.processor == "queue"
            and queue == svc.name
            and method == "POST"
            and HEADER_DEADLINE_MS in headers
            and HEADER_QUEUE_UID not in headers
        ):
            raise errors.WrongServiceKind(
                f"service {svc.name!r} is a queue, not a predict service: put records with a "
                "QueueClient and read the results from its consumers, not with a PredictClient"
            )

    # ------------------------------------------------------------------ authenticate
    def refused_early(self, svc: ServiceConfig, headers: Mapping[str, str], key: str = "") -> bool:
        """True when a call to ``svc`` fails authentication whatever its body holds, so it can
        be answered 401 before the body is read: no credentials, or a raw token that matches
        none of the service's. An ``EAS`` signature covers the body's MD5: it waits for the body."""
        if not svc.tokens:
            return False
        auth = headers.get(HEADER_AUTHORIZATION)
        if not auth:
            return True
        if auth.startswith("EAS ") or (key or svc.name, auth) in self._verified:
            return False
        if verify(svc.tokens, headers, "", None).ok:
            self._remember(key or svc.name, auth)
            return False
        return True

    def authenticate(
        self, svc: ServiceConfig, headers: Mapping[str, str], raw_path: str, body: bytes | None, key: str = ""
    ) -> None:
        """Raise Unauthorized (401) or BadDigest (400) unless the call carries a valid token
        or signature for ``svc`` (``key``: the queue's name when a queue is called)."""
        if not svc.tokens:
            return
        auth = headers.get(HEADER_AUTHORIZATION)
        if not auth:
            raise errors.Unauthorized("invalid or missing token")
        name = key or svc.name
        if (name, auth) in self._verified:
            return
        # A service may set its own Date window (signature_max_skew_s) over the gateway's.
        policy = self.signature.for_service(svc)
        result = verify(svc.tokens, headers, raw_path, body, policy)
        if not result.ok:
            if result.status is AuthStatus.BAD_DIGEST:
                raise errors.BadDigest("Content-MD5 does not match the body")
            if result.status is AuthStatus.STALE or result.reason.endswith("Content-MD5"):
                raise errors.Unauthorized(result.reason)  # a valid HMAC: the reason gives nothing away
            raise errors.Unauthorized("invalid or missing token")
        if not auth.startswith("EAS "):
            self._remember(name, auth)
        elif self.replay is not None and self.replay.replayed(auth, keep_s=keep_for(policy)):
            raise errors.Unauthorized("this signature was already used (replay)")

    def _remember(self, name: str, auth: str) -> None:
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified[(name, auth)] = None

    # ------------------------------------------------------------------ admit
    def hold_body(self, svc: ServiceConfig, headers: Mapping[str, str], nbytes: int) -> BodyHold:
        """Admit a body about to be received (after :meth:`refused_early`): 429 when the
        gateway already receives too many bytes. A call that can only be authenticated with
        its body (an ``EAS`` signature) counts against the smaller unverified budget too."""
        auth = headers.get(HEADER_AUTHORIZATION) or ""
        verified = not svc.tokens or not auth.startswith("EAS ")
        return self.admission.hold_body(nbytes, verified=verified)

    @staticmethod
    def caller_deadline(headers: Mapping[str, str]) -> float | None:
        """The caller's remaining budget (``X-Eas-Deadline-Ms``) in seconds, None without one.
        Checked before the body is read: a call already late is refused at once."""
        raw = headers.get(HEADER_DEADLINE_MS)
        if raw is None:
            return None
        try:
            deadline_ms = int(raw.strip())
        except ValueError:
            raise errors.BadRequest(f"{HEADER_DEADLINE_MS} must be an integer") from None
        if deadline_ms < MIN_DEADLINE_MS:
            raise errors.DeadlineExceeded("the caller's deadline has already passed")
        return deadline_ms / 1000.0

    @staticmethod
    def budget(svc: ServiceConfig, deadline: float | None, arrived: float) -> float:
        """Seconds the call may take: the service's timeout, or less when the caller's deadline
        (which also paid for the upload since ``arrived``, monotonic) leaves less."""
        timeout = svc.timeout_ms / 1000.0
        if deadline is not None:
            timeout = min(timeout, deadline - (time.monotonic() - arrived))
            if timeout < MIN_DEADLINE_MS / 1000.0:
                raise errors.DeadlineExceeded("the caller's deadline passed while the body was read")
        return timeout

    # ------------------------------------------------------------------ dispatch
    async def infer(
        self,
        svc: ServiceConfig,
        headers: Mapping[str, str],
        body: bytes,
        *,
        subpath: str = "",
        request_id: str = "",
        timeout: float,
        content_type: str | None = None,
        tensors: tuple[Mapping[str, np.ndarray], Sequence[str]] | None = None,
    ) -> WorkerResponse:
        """Run one call on the service's backend; every failure raises a GatewayError.
        ``content_type``: when ``headers`` is a plain dict, not a case-insensitive one;
        ``tensors``: (inputs, output names) for a backend that ``takes_tensors``, instead of
        the body (:meth:`infer_tensors`)."""
        if headers is TF_FORM_HEADERS or headers is JSON_FORM_HEADERS or headers is JSON_ARRAYS_HEADERS:
            sent = dict(headers)  # the adapters' own: nothing to drop, plain str already
        elif type(headers) is Headers:
            sent = {k: v for k, v in headers.items() if k not in DROP_HEADERS}  # lower-case str keys
        else:
            # Plain str keys: multidict keys are istr, which strict JSON encoders (orjson) refuse.
            sent = {str(k): str(v) for k, v in headers.items() if k.lower() not in DROP_HEADERS}
        # The worker drops the call unrun once this passes: nobody waits for its answer.
        deadline = time.monotonic() + timeout
        if tensors is not None:
            req: WorkerRequest = TensorRequest(
                b"",
                request_id=request_id,
                headers=sent,
                deadline=deadline,
                inputs=tensors[0],
                outputs=tensors[1],
            )
        else:
            req = self.make_request(
                body=body,
                subpath=subpath,
                content_type=content_type or headers.get("Content-Type", DEFAULT_CONTENT_TYPE),
                request_id=request_id,
                headers=sent,
                deadline=deadline,
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "dispatch %s subpath=%r bytes=%d timeout=%.3fs",
                svc.name, subpath, len(body), timeout, extra={"request_id": request_id},
            )  # fmt: skip
        backend = self.backends.get(svc.name)
        if backend is None:
            raise errors.ServiceNotFound(f"service {svc.name!r} not found")
        t0 = time.perf_counter()
        stats = self.stats.get(svc.name)
        self.admission.enter(svc.name)
        try:
            resp = await backend.dispatch(req, timeout)
        except Exception as exc:
            if stats is not None:
                stats.record(False, time.perf_counter() - t0, 0)
            raise errors.from_exception(exc) from None
        finally:
            self.admission.leave(svc.name)
        elapsed = time.perf_counter() - t0
        limit = self.max_response_bytes
        if limit:
            size = len(resp.body)
            if isinstance(resp, TensorResponse):  # from the gateway's threads: arrays, no body
                size += sum(map(json_answer.raw_size, resp.arrays.values()))
            if size > limit:
                if stats is not None:
                    stats.record(False, elapsed, int(resp.compute_us))
                raise errors.ResponseTooLarge(str(json_answer.AnswerTooLarge(size, limit)))
        compute_us = int(resp.compute_us)
        if stats is not None:
            stats.record(resp.status < 400, elapsed, compute_us)
        if self.observer is not None:
            self.observer.observe_dispatch(svc.name, elapsed, compute_us)
        return resp

    async def predict(
        self,
        svc: ServiceConfig,
        headers: Mapping[str, str],
        raw_path: str,
        body: bytes,
        *,
        subpath: str = "",
        request_id: str = "",
        arrived: float,
        deadline: float | None,
    ) -> WorkerResponse:
        """A whole predict call once its body is in: authenticate, admit, dispatch.
        ``deadline``: :meth:`caller_deadline`, which adapters read before the body."""
        self.refuse_queue_call(svc, headers)
        self.authenticate(svc, headers, raw_path, body)
        timeout = self.budget(svc, deadline, arrived)
        return await self.infer(svc, headers, body, subpath=subpath, request_id=request_id, timeout=timeout)

    async def infer_json(
        self,
        svc: ServiceConfig,
        body: bytes,
        *,
        request_id: str,
        timeout: float,
        extra: Mapping[str, str] | None = None,
        answer_headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """A call in the onnx processor's JSON form (the KServe and Cluster Serving adapters):
        -> (200, the reply body) or (the processor's status, its error message as UTF-8).
        ``extra``: caller's headers the backend reads (a pipeline's timings request);
        ``answer_headers``: filled with the backend's own answer headers (Server-Timing)."""
        headers = {**JSON_FORM_HEADERS, **extra} if extra else JSON_FORM_HEADERS
        resp = await self.infer(svc, headers, body, request_id=request_id, timeout=timeout)
        if answer_headers is not None and resp.headers:
            answer_headers.update(resp.headers)
        status, reply = int(resp.status), bytes(resp.body)
        if status == 200:
            return status, reply
        return status, errors.message_of(reply).encode()

    async def infer_arrays(
        self,
        svc: ServiceConfig,
        body: bytes,
        *,
        request_id: str,
        timeout: float,
        declared: Mapping[str, np.dtype[Any]] | None = None,
        max_values: int = 0,
        extra: Mapping[str, str] | None = None,
        answer_headers: dict[str, str] | None = None,
    ) -> dict[str, np.ndarray]:
        """A call in the onnx processor's JSON form whose outputs an adapter writes in its own
        protocol (Cluster Serving, KServe V1, Paddle): the processor answers in the TF form,
        read as arrays over the reply's bytes (``declared``: the model's output dtypes, see
        ``tf_outputs``; default: as the backend's metadata says), never a Python object per
        element. A processor that answers the JSON form anyway (user code) has it parsed when
        it holds at most ``max_values`` values (413 beyond; 0: no limit). ``extra`` and
        ``answer_headers`` as for :meth:`infer_json`; a processor's error answer raises
        ProcessorFailed with its status and message."""
        headers = {**JSON_ARRAYS_HEADERS, **extra} if extra else JSON_ARRAYS_HEADERS
        if declared is None:  # the TF form widens a few dtypes: the model's own, as it declares them
            backend = self.backends.get(svc.name)
            declared = declared_dtypes(backend.metadata if backend is not None else None)
        resp = await self.infer(svc, headers, body, request_id=request_id, timeout=timeout)
        if answer_headers is not None and resp.headers:
            answer_headers.update(resp.headers)
        status, reply = int(resp.status), bytes(resp.body)
        if status != 200:
            raise errors.ProcessorFailed(status, errors.message_of(reply))
        try:
            if reply[:64].lstrip()[:1] != b"{":
                return tensors.tf_outputs(reply, declared)
            parse = functools.partial(json_answer.processor_outputs, reply, max_values)
            # A Python object per value while parsed: a large one off the event loop.
            return await parse_off_loop(parse) if len(reply) > 64 << 10 else parse()
        except json_answer.AnswerTooLarge as exc:
            raise errors.ResponseTooLarge(str(exc)) from None
        except (ValueError, TypeError, KeyError) as exc:
            message = f"the service's reply is neither a TF PredictResponse nor the JSON form ({exc})"
            raise errors.ProcessorFailed(502, message) from None

    async def infer_tensors(
        self,
        svc: ServiceConfig,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] = (),
        *,
        request_id: str,
        timeout: float,
        declared: Mapping[str, np.dtype[Any]] | None = None,
        extra: Mapping[str, str] | None = None,
        answer_headers: dict[str, str] | None = None,
    ) -> dict[str, np.ndarray]:
        """A call with tensors by name (the V2 binary and gRPC adapters): it travels in the
        onnx processor's TF protobuf form, so it costs a worker what an EAS TFRequest costs.
        -> the output arrays (``declared``: the model's output dtypes, see ``tf_outputs``;
        ``extra`` and ``answer_headers`` as for :meth:`infer_json`).
        A processor's error answer raises ProcessorFailed with its status and message.
        A backend in the gateway process that ``takes_tensors`` gets the arrays as they are."""
        headers = {**TF_FORM_HEADERS, **extra} if extra else TF_FORM_HEADERS
        backend = self.backends.get(svc.name)
        if backend is not None and backend.takes_tensors:
            resp = await self.infer(
                svc, headers, b"", request_id=request_id, timeout=timeout, tensors=(inputs, outputs)
            )
        else:
            body = tensors.tf_request(inputs, outputs)
            resp = await self.infer(svc, headers, body, request_id=request_id, timeout=timeout)
        if answer_headers is not None and resp.headers:
            answer_headers.update(resp.headers)
        if isinstance(resp, TensorResponse):
            return resp.arrays
        status, reply = int(resp.status), bytes(resp.body)
        if status != 200:
            raise errors.ProcessorFailed(status, errors.message_of(reply))
        try:
            return tensors.tf_outputs(reply, declared)
        except (ValueError, TypeError) as exc:
            message = f"the worker's reply is not a TF PredictResponse ({exc})"
            raise errors.ProcessorFailed(502, message) from None


__all__ = [
    "DROP_HEADERS",
    "JSON_ARRAYS_HEADERS",
    "JSON_FORM_HEADERS",
    "MIN_DEADLINE_MS",
    "TF_FORM_HEADERS",
    "Backend",
    "DataPlane",
    "InferStats",
]
