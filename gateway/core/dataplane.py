"""The dataplane: one protocol-neutral path from a call to a backend and back.

Every way into a model goes through one :class:`DataPlane`, by one call per kind of entry::

    lean HTTP front, aiohttp predict route, worker's direct port ─ predict_call
    the queue's front door (lean and aiohttp) ──────────────────── queue_call
    V2 REST (lean and aiohttp, JSON or binary), V2 gRPC ────────── tensors_call
    KServe V1, Paddle, Cluster Serving REST ────────────────────── arrays_call
    async dispatcher, a pipeline's step ────────────────────────── record_call
    Cluster Serving's Redis stream ─────────────────────────────── record_arrays_call
    metadata, readiness, statistics, discovery ─────────────────── authorize

and each call runs its steps in one order, which only this module decides::

    find ─> wrong kind ─> early refusal ─> hold the body ─> deadline ─> read ─> authenticate
    (400/404)  (400/405)      (401)            (429)        (400/408)  (408/413)  (401/400)
      ─> budget ─> version ─> dispatch ─> the answer's size ─> the answer
         (408)     (404)     (429/450/503/504)   (413)

The version step (:meth:`DataPlane._route`) picks which of a service's model versions runs
the call: the one its path or ``X-Model-Version`` names, else one drawn from the service's
``traffic`` split, else the latest; the answer says which in ``X-Model-Version``.

Any failure is a GatewayError (gateway/core/errors.py): one status table. An adapter only
moves bytes: it turns its transport's request into headers, a raw path and a body (the
bytes, or a :class:`BodyReader` when the transport still receives them), makes its call,
and writes the answer, or the error (gateway/codecs/errors.py), in its protocol's shape.
The gateway has one dataplane over its backends; a worker process has one over its
compute queue, so direct calls get the same checks and errors.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, TypeVar

import numpy as np

from eas_sdk._core.constants import (
    DEFAULT_CONTENT_TYPE,
    HEADER_AUTHORIZATION,
    HEADER_DEADLINE_MS,
    HEADER_QUEUE_UID,
)
from gateway.config import SERVICE_NAME_RE, ServiceConfig
from gateway.config.traffic import Traffic
from gateway.config.versions import served_version
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
from gateway.core.groups import ServiceGroups
from gateway.core.metadata import declared_dtypes
from gateway.core.mirror import Mirrors
from gateway.core.observers import DispatchObserver, PayloadObserver, logged
from gateway.core.parse_pool import parse_off_loop
from gateway.core.traffic import VERSION_HEADER, route
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
# The JSON form, answered in the TF form: arrays the adapter reads in place (arrays_call).
JSON_ARRAYS_HEADERS = {**JSON_FORM_HEADERS, RESPONSE_FORMAT_HEADER: "tf"}
# Raw tokens remembered as verified, per dataplane (a client sends the same token on every call).
_VERIFIED_MAX = 1024


# The protocol's own form of a call, as an adapter's ``decode`` gives it back.
T = TypeVar("T")


class BodyReader(Protocol):
    """A body the transport still receives (aiohttp: gateway.http.body.RequestBody)."""

    @property
    def arriving(self) -> bool:
        """Bytes are still on the way: the call may be refused before them, and they are held
        against the gateway's admission budget while they arrive."""
        ...

    @property
    def hold_bytes(self) -> int:
        """How many bytes to hold while the body arrives (its length, or a limit if chunked)."""
        ...

    @property
    def empty(self) -> bool:
        """The request has no body at all."""
        ...

    async def read(self) -> bytes:
        """The whole body, within the transport's limits (raises GatewayError: 408, 413, ...)."""
        ...


# A call's body: the bytes already in, or a reader for one still arriving.
Body = bytes | BodyReader


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
        payloads: PayloadObserver | None = None,
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
        # Told of the calls of services with a payload log (None: no payload log anywhere).
        self.payloads = payloads
        # (service or queue name, raw token) pairs that verified. Tokens come from the config,
        # so a success stays one; a signature covers one call and is always checked. Bounded.
        self._verified: dict[tuple[str, str], None] = {}
        self.stats: dict[str, InferStats] = {name: InferStats() for name in self.services}
        self.mirrors = Mirrors(backends, observer)
        self._groups = ServiceGroups()

    @property
    def groups(self) -> ServiceGroups:
        """Service groups: a name that splits its calls between services (gateway.core.groups)."""
        return self._groups

    @groups.setter
    def groups(self, groups: Mapping[str, Traffic]) -> None:
        self._groups = ServiceGroups(groups)

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

    # ------------------------------------------------------------------ the catalog
    def find(self, raw_name: str) -> ServiceConfig:
        """The service named by a raw (undecoded) path segment: 400 for a malformed name, 404
        for an unknown one. Checking the raw segment means ``..%2F``, ``%00`` or any
        non-ASCII byte can never match a service. The entry calls below find a service
        named by a string themselves; an adapter asks only to route by the service's kind
        or to read its metadata."""
        if not SERVICE_NAME_RE.fullmatch(raw_name):
            raise errors.InvalidServiceName("invalid service name")
        svc = self.services.get(raw_name)
        if svc is None and raw_name in self._groups:  # a service group: one member per call
            svc = self.services.get(self._groups.draw(raw_name))
        if svc is None:
            raise errors.ServiceNotFound(f"service {raw_name!r} not found")
        return svc

    def find_model(self, raw_name: str) -> ServiceConfig:
        """A service that runs on workers (what KServe and Cluster Serving call a model)."""
        svc = self.find(raw_name)
        if svc.name not in self.backends:
            raise errors.ServiceNotFound(f"service {raw_name!r} not found")
        return svc

    def step_span(self, pipeline: str, step: str) -> AbstractContextManager[Any]:
        """A pipeline's step as a traced call shows it (gateway.observability.tracing's
        dataplane makes it a span); nothing here."""
        return nullcontext()

    # ------------------------------------------------------------------ entry calls
    # One per kind of entry. Each runs the steps below in the one order the core keeps:
    # find -> wrong-kind refusals -> early refusal -> hold the body's bytes -> deadline ->
    # read the body -> authenticate -> budget -> dispatch -> the answer's size. It returns
    # the answer or raises a GatewayError (a ``decode`` callback's own request errors pass
    # through): adapters only translate their transport's request and the answer.

    async def predict_call(
        self,
        service: str | ServiceConfig,
        headers: Mapping[str, str],
        raw_path: str,
        body: Body,
        *,
        method: str = "POST",
        subpath: str = "",
        request_id: str = "",
        arrived: float,
    ) -> WorkerResponse:
        """An EAS predict. ``service``: the raw path segment, or the service an adapter's own
        route table holds; ``body``: the bytes already in, or a reader for a body the
        transport still receives; ``arrived``: when the call came (monotonic), which the
        caller's deadline also pays the upload from."""
        svc = service if isinstance(service, ServiceConfig) else self.find(service)
        self._refuse_queue_call(svc, headers)  # before 405: a queue GET says what is wrong
        if method != "POST":
            raise errors.MethodNotAllowed(f"method {method} is not allowed; use POST", allow="POST")
        if subpath and any(ord(c) < 0x21 or ord(c) > 0x7E for c in subpath):
            raise errors.BadRequest("invalid characters in the request path")
        tokens = svc.tokens
        auth = headers.get(HEADER_AUTHORIZATION) if tokens else None
        if isinstance(body, bytes):  # the hot path: the body is in, nothing held, no read
            if tokens and not auth:
                raise errors.Unauthorized("invalid or missing token")
            deadline = self._caller_deadline(headers)
            data = body
        else:
            received, deadline = await self._receive(svc, headers, body)
            data = received or b""  # read: always bytes
        if tokens and (svc.name, auth) not in self._verified:  # a raw token seen before passes
            self._authenticate(svc, headers, raw_path, data)
        timeout = self._budget(svc, deadline, arrived)
        runs = self._route(svc, headers) if svc.versions else svc
        call = self._dispatch(runs, headers, data, subpath=subpath, request_id=request_id, timeout=timeout)
        if svc.payload_log is None or self.payloads is None:
            return await call
        return await logged(self.payloads, runs, request_id, headers, data, call)

    async def queue_call(
        self,
        service: str | ServiceConfig,
        queue: str,
        headers: Mapping[str, str],
        raw_path: str,
        body: Body,
        *,
        method: str,
    ) -> bytes | None:
        """The queue's front door (a put, a get, a watch, ...): wrong-kind refusal, early
        refusal, body hold and read, credentials checked against ``queue`` (the service's
        queue or its sink). -> the body a POST carries (None otherwise) for the queue's own
        handlers; the call itself is theirs to serve."""
        svc = service if isinstance(service, ServiceConfig) else self.find(service)
        self._refuse_predict_call(svc, headers, method, queue)
        data: bytes | None
        if isinstance(body, bytes):
            if svc.tokens and not headers.get(HEADER_AUTHORIZATION):
                raise errors.Unauthorized("invalid or missing token")
            data = body if method == "POST" and body else None
        else:
            # Only a POST's body is read and signed over (aiohttp's can_read_body).
            read = method == "POST" and not body.empty
            data, _ = await self._receive(svc, headers, body, key=queue, read=read, deadline=False)
        self._authenticate(svc, headers, raw_path, data, key=queue)
        return data

    async def tensors_call(
        self,
        service: str | ServiceConfig,
        headers: Mapping[str, str],
        raw_path: str,
        body: Body | None,
        decode: Callable[[bytes], Awaitable[tuple[T, Mapping[str, np.ndarray], Sequence[str]]]],
        *,
        runs: ServiceConfig | None = None,
        request_id: str,
        arrived: float,
        deadline: float | None = None,
        declared: Mapping[str, np.dtype[Any]] | None = None,
        extra: Mapping[str, str] | None = None,
        answer_headers: dict[str, str] | None = None,
    ) -> tuple[T, dict[str, np.ndarray]]:
        """A call with tensors by name (V2 REST, JSON or binary, and V2 gRPC). ``decode``: the
        body -> (the protocol's call, its input arrays, the output names asked for), run once
        the call is authenticated and budgeted; ``body``: None when the transport decoded the
        call already (gRPC: no bytes to sign); ``runs``: the service whose backend serves the
        model's version asked for (default ``service``); ``deadline``: the transport's own
        (gRPC), seconds left, instead of ``X-Eas-Deadline-Ms``; ``extra`` is read once
        ``decode`` has run, so a decode may add headers of the call's own (its V2 ``id`` and
        ``parameters``, gateway.core.calls.infer_call_headers). -> (the call, the output
        arrays; see :meth:`_tensors` for ``declared``, ``extra`` and ``answer_headers``)."""
        svc = service if isinstance(service, ServiceConfig) else self.find_model(service)
        data, deadline = await self._take_body(svc, headers, body, deadline)
        self._authenticate(svc, headers, raw_path, data)
        timeout = self._budget(svc, deadline, arrived)
        runs = runs or self._route(svc, headers)
        call, inputs, outputs = await decode(data or b"")
        work = self._tensors(
            runs, inputs, outputs, request_id=request_id, timeout=timeout, declared=declared,
            extra=extra, answer_headers=answer_headers,
        )  # fmt: skip
        if svc.payload_log is None or self.payloads is None:
            return call, await work
        return call, await logged(self.payloads, runs, request_id, headers, data or inputs, work)

    async def arrays_call(
        self,
        service: str | ServiceConfig,
        headers: Mapping[str, str],
        raw_path: str,
        body: Body,
        decode: Callable[[bytes], Awaitable[tuple[T, bytes]]],
        *,
        request_id: str,
        arrived: float,
        max_values: int = 0,
        extra: Mapping[str, str] | None = None,
        answer_headers: dict[str, str] | None = None,
        runs: ServiceConfig | None = None,
    ) -> tuple[T, dict[str, np.ndarray]]:
        """A call the adapter turns into the onnx processor's JSON form and whose outputs it
        writes in its own protocol (KServe V1, Paddle, Cluster Serving). ``decode``: the body
        -> (the protocol's call, its JSON form), run once the call is authenticated and
        budgeted; ``runs``: the service whose backend answers it (default ``service``: a
        model's explainer is another). -> (the call, the output arrays; see :meth:`_arrays`)."""
        svc = service if isinstance(service, ServiceConfig) else self.find_model(service)
        received, deadline = await self._take_body(svc, headers, body, None)
        data = received or b""  # the body is always read
        self._authenticate(svc, headers, raw_path, data)
        timeout = self._budget(svc, deadline, arrived)
        runs = runs or self._route(svc, headers)
        call, form = await decode(data)
        work = self._arrays(
            runs, form, request_id=request_id, timeout=timeout, max_values=max_values, extra=extra,
            answer_headers=answer_headers,
        )  # fmt: skip
        if svc.payload_log is None or self.payloads is None:
            return call, await work
        return call, await logged(self.payloads, runs, request_id, headers, data, work)

    async def record_call(
        self,
        svc: ServiceConfig,
        headers: Mapping[str, str],
        body: bytes,
        *,
        content_type: str | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> WorkerResponse:
        """A call the gateway makes for a client it already admitted: an asynchronous record
        (authenticated when it was put), a pipeline's step calling another service. Only the
        dispatch and the answer's size: ``timeout``, what is left of the caller's budget
        (default: the service's timeout)."""
        if timeout is None:
            timeout = svc.timeout_ms / 1000.0
        runs = self._route(svc, headers) if svc.versions else svc
        call = self._dispatch(
            runs, headers, body, request_id=request_id, timeout=timeout, content_type=content_type
        )
        if svc.payload_log is None or self.payloads is None:
            return await call
        return await logged(self.payloads, runs, request_id, headers, body, call)

    async def record_arrays_call(
        self, svc: ServiceConfig, body: bytes, *, request_id: str
    ) -> dict[str, np.ndarray]:
        """A batch of records in the onnx processor's JSON form, read from a stream the gateway
        serves (Cluster Serving's Redis stream: no credentials travel with a record), within
        the service's timeout. -> the output arrays (see :meth:`_arrays`)."""
        runs = self._route(svc, {}) if svc.versions else svc
        work = self._arrays(runs, body, request_id=request_id, timeout=svc.timeout_ms / 1000.0)
        if svc.payload_log is None or self.payloads is None:
            return await work
        return await logged(self.payloads, runs, request_id, {}, body, work)

    # ------------------------------------------------------------------ version
    def _route(self, svc: ServiceConfig, headers: Mapping[str, str]) -> ServiceConfig:
        """The version of ``svc`` that runs a call (gateway.core.traffic); a path that names a
        version (V2's) gives its service as ``runs`` instead."""
        return route(svc, headers, self.services, self.backends)

    def authorize(
        self, svc: ServiceConfig, headers: Mapping[str, str], raw_path: str, body: bytes | None = None
    ) -> None:
        """A call that dispatches nothing (a model's metadata, readiness or statistics, the
        discovery of a service's workers): 401 (or 400 ``BadDigest``) unless it carries a
        valid token or signature for ``svc``."""
        if svc.tokens and not headers.get(HEADER_AUTHORIZATION):
            raise errors.Unauthorized("invalid or missing token")
        self._authenticate(svc, headers, raw_path, body)

    def body_arriving(
        self, svc: ServiceConfig, headers: Mapping[str, str], nbytes: int, key: str = ""
    ) -> BodyHold:
        """A transport that receives a body itself (the lean HTTP protocol) tells the core one
        is arriving, before any of it is read: 401 when the call fails authentication
        whatever its body holds, 429 when the gateway already receives too much; else the
        body's ``nbytes`` are held until the transport releases them (once the body is in).
        The entry call then gets the bytes."""
        self._refuse_early(svc, headers, True, key)
        return self._hold_body(svc, headers, nbytes)

    # ------------------------------------------------------------------ the body
    async def _take_body(
        self, svc: ServiceConfig, headers: Mapping[str, str], body: Body | None, deadline: float | None
    ) -> tuple[bytes | None, float | None]:
        """Early refusal, hold, deadline and read, for whatever form the body comes in."""
        if body is None or isinstance(body, bytes):
            if svc.tokens and not headers.get(HEADER_AUTHORIZATION):
                raise errors.Unauthorized("invalid or missing token")
            return body, deadline if deadline is not None else self._caller_deadline(headers)
        return await self._receive(svc, headers, body, deadline=deadline is None, given=deadline)

    async def _receive(
        self,
        svc: ServiceConfig,
        headers: Mapping[str, str],
        reader: BodyReader,
        *,
        key: str = "",
        read: bool = True,
        deadline: bool = True,
        given: float | None = None,
    ) -> tuple[bytes | None, float | None]:
        """A body the transport still reads: refused before it is read (no token at all, or a
        wrong raw token while it is still arriving: a body already in costs nothing to read,
        and the token is then looked at once), held while it arrives (429), the caller's
        deadline read before it (a call already late is refused unread), then read (or not,
        ``read``: None)."""
        arriving = reader.arriving
        self._refuse_early(svc, headers, arriving, key)
        hold = self._hold_body(svc, headers, reader.hold_bytes) if arriving else None
        try:
            left = self._caller_deadline(headers) if deadline else given
            return (await reader.read() if read else None), left
        finally:
            if hold is not None:
                hold.release()

    # ------------------------------------------------------------------ wrong kind of call
    @staticmethod
    def _refuse_queue_call(svc: ServiceConfig, headers: Mapping[str, str]) -> None:
        """A QueueClient pointed at a predict service: 400 saying so. Queue clients send their
        identity header on every call; a predict call never does."""
        if HEADER_QUEUE_UID in headers:
            raise errors.WrongServiceKind(
                f"service {svc.name!r} is a synchronous predict service, not a queue: "
                "call it with a PredictClient, not a QueueClient"
            )

    @staticmethod
    def _refuse_predict_call(svc: ServiceConfig, headers: Mapping[str, str], method: str, queue: str) -> None:
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
    def _refuse_early(self, svc: ServiceConfig, headers: Mapping[str, str], arriving: bool, key: str) -> None:
        """401 before the body is read: no credentials; or, while the body is still arriving,
        a raw token that matches none of the service's. An ``EAS`` signature covers the body's
        MD5: it waits for the body."""
        if not svc.tokens:
            return
        auth = headers.get(HEADER_AUTHORIZATION)
        if not auth:
            raise errors.Unauthorized("invalid or missing token")
        if not arriving or auth.startswith("EAS ") or (key or svc.name, auth) in self._verified:
            return
        self._verify_token(svc, headers, auth, key)

    def _verify_token(self, svc: ServiceConfig, headers: Mapping[str, str], auth: str, key: str) -> None:
        """A raw token checked before the body is in: remembered when it is one of the
        service's, else 401."""
        if verify(svc.tokens, headers, "", None).ok:
            self._remember(key or svc.name, auth)
            return
        raise errors.Unauthorized("invalid or missing token")

    def _authenticate(
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
    def _hold_body(self, svc: ServiceConfig, headers: Mapping[str, str], nbytes: int) -> BodyHold:
        """Admit a body about to be received: 429 when the gateway already receives too many
        bytes. A call that can only be authenticated with its body (an ``EAS`` signature)
        counts against the smaller unverified budget too."""
        auth = headers.get(HEADER_AUTHORIZATION) or ""
        verified = not svc.tokens or not auth.startswith("EAS ")
        return self.admission.hold_body(nbytes, verified=verified)

    @staticmethod
    def _caller_deadline(headers: Mapping[str, str]) -> float | None:
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
    def _budget(svc: ServiceConfig, deadline: float | None, arrived: float) -> float:
        """Seconds the call may take: the service's timeout, or less when the caller's deadline
        (which also paid for the upload since ``arrived``, monotonic) leaves less."""
        timeout = svc.timeout_ms / 1000.0
        if deadline is not None:
            timeout = min(timeout, deadline - (time.monotonic() - arrived))
            if timeout < MIN_DEADLINE_MS / 1000.0:
                raise errors.DeadlineExceeded("the caller's deadline passed while the body was read")
        return timeout

    # ------------------------------------------------------------------ dispatch
    async def _dispatch(
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
        the body (:meth:`_tensors`)."""
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
        if svc.mirror is not None:  # a copy for the mirror, which the call never waits for
            self.mirrors.copy(svc, req)
        t0 = time.perf_counter()
        stats = self.stats.get(svc.name)
        self.admission.enter(svc.name)
        try:
            resp = await backend.dispatch(req, timeout)
        except Exception as exc:
            elapsed = time.perf_counter() - t0
            if stats is not None:
                stats.record(False, elapsed, 0)
            error = errors.from_exception(exc)
            if self.observer is not None:
                self.observer.observe_failure(svc, error, elapsed)
            raise error from None
        finally:
            self.admission.leave(svc.name)
        elapsed = time.perf_counter() - t0
        limit = self.max_response_bytes
        if limit:
            size = len(resp.body)
            if isinstance(resp, TensorResponse):  # from the gateway's threads: arrays, no body
                size += json_answer.raw_total(resp.arrays.values())
            if size > limit:
                if stats is not None:
                    stats.record(False, elapsed, int(resp.compute_us))
                error = errors.ResponseTooLarge(str(json_answer.AnswerTooLarge(size, limit)))
                if self.observer is not None:
                    self.observer.observe_failure(svc, error, elapsed)
                raise error
        compute_us = int(resp.compute_us)
        status = int(resp.status)
        if stats is not None:
            stats.record(status < 400, elapsed, compute_us)
        if self.observer is not None:
            self.observer.observe_dispatch(svc, status, elapsed, compute_us, resp.body)
        if svc.versions or "@" in svc.name:  # a service with versions: the answer says which
            resp.headers = {**(resp.headers or {}), VERSION_HEADER: served_version(svc)}
        members = self._groups.members  # a group's member: the answer names it (gateway.core.groups)
        if members and (svc.name in members or "@" in svc.name):
            self._groups.name_member(svc.name, resp)
        return resp

    async def _arrays(
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
        it holds at most ``max_values`` values (413 beyond; 0: no limit). ``extra``: the
        caller's headers the backend reads (a pipeline's timings request); ``answer_headers``:
        filled with the backend's own answer headers (Server-Timing). A processor's error
        answer raises ProcessorFailed with its status and message."""
        headers = {**JSON_ARRAYS_HEADERS, **extra} if extra else JSON_ARRAYS_HEADERS
        if declared is None:  # the TF form widens a few dtypes: the model's own, as it declares them
            backend = self.backends.get(svc.name)
            declared = declared_dtypes(backend.metadata if backend is not None else None)
        resp = await self._dispatch(svc, headers, body, request_id=request_id, timeout=timeout)
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

    async def _tensors(
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
        ``extra`` and ``answer_headers`` as for :meth:`_arrays`).
        A processor's error answer raises ProcessorFailed with its status and message.
        A backend in the gateway process that ``takes_tensors`` gets the arrays as they are."""
        headers = {**TF_FORM_HEADERS, **extra} if extra else TF_FORM_HEADERS
        backend = self.backends.get(svc.name)
        if backend is not None and backend.takes_tensors:
            resp = await self._dispatch(
                svc, headers, b"", request_id=request_id, timeout=timeout, tensors=(inputs, outputs)
            )
        else:
            body = tensors.tf_request(inputs, outputs)
            resp = await self._dispatch(svc, headers, body, request_id=request_id, timeout=timeout)
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
    "VERSION_HEADER",
    "Backend",
    "Body",
    "BodyReader",
    "DataPlane",
    "DispatchObserver",
    "InferStats",
    "PayloadObserver",
]
