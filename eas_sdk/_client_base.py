"""Settings, setters and per-call planning shared by PredictClient and AsyncPredictClient.

No I/O here: the clients in ``eas_sdk.predict`` and ``eas_sdk.aio_predict`` build a
:class:`~eas_sdk._core.request.PredictCall` per call from :attr:`_ClientBase.config`
and send its attempts through a transport (``eas_sdk._transports``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ._core.constants import ENDPOINT_TYPE_DEFAULT
from ._core.endpoints import (
    DISCOVERY_INTERVAL,
    DISCOVERY_TIMEOUT,
    FIRST_DISCOVERY_WAIT,
    DiscoveryError,
    EndpointSet,
    WarningLimiter,
    apply_discovery_response,
    discovery_url,
)
from ._core.request import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT_MS,
    Attempt,
    ClientConfig,
    PredictCall,
    Step,
    mask_token,
    redact_url,
)
from ._core.retry import RetryBudget, RetryPolicy
from ._transports import (
    DEFAULT_KEEPALIVE_EXPIRY,
    AsyncBaseTransport,
    AsyncHTTPTransport,
    BaseTransport,
    HTTPTransport,
    TransportFailure,
)
from .errors import NoEndpointError

logger = logging.getLogger("eas_sdk.predict")


def request_body(req: object) -> bytes:
    """The body of ``req``: ``req.to_string()`` (str is UTF-8 encoded), or raw bytes/str."""
    data = req.to_string() if hasattr(req, "to_string") else req  # type: ignore[attr-defined]
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"request must provide to_string() -> bytes|str, got {type(data).__name__}")


def _parse(req: object, body: bytes) -> Any:
    parse = getattr(req, "parse_response", None)
    return parse(body) if parse is not None else body


class _NotCarriedOver:
    """An eas-prediction client attribute with no counterpart here: reading or assigning it raises."""

    def __init__(self, hint: str) -> None:
        self.hint = hint
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _error(self, owner: type) -> AttributeError:
        what = f"{owner.__name__}.{self.name}"
        return AttributeError(f"{what} is not carried over from eas-prediction: {self.hint}")

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        raise self._error(type(obj))

    def __set__(self, obj: Any, value: Any) -> None:
        raise self._error(type(obj))


class _ClientBase:
    """Settings, setters and per-call planning shared by both clients."""

    def __init__(
        self,
        endpoint: str = "",
        service_name: str = "",
        custom_url: str = "",
        *,
        token: str = "",
        endpoint_type: str = ENDPOINT_TYPE_DEFAULT,
        retry_count: int | None = None,
        max_connection_count: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT_MS,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy | None = None,
        retry_budget: RetryBudget | None = None,
        discovery_interval: float = DISCOVERY_INTERVAL,
        discovery_timeout: float = DISCOVERY_TIMEOUT,
        first_discovery_wait: float = FIRST_DISCOVERY_WAIT,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        ca_certs: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        transport: BaseTransport | AsyncBaseTransport | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._service_name = service_name
        self._custom_url = custom_url
        self._token = token
        self._endpoint_type = endpoint_type or ENDPOINT_TYPE_DEFAULT
        policy = retry_policy or RetryPolicy()
        if retry_count is not None:
            policy = _replace_retries(policy, int(retry_count))
        self._retry_policy = policy
        self._max_connection_count = max_connection_count
        self._timeout_ms = float(timeout)
        self._content_type = content_type
        self._extra_headers: dict[str, str] = dict(headers or {})
        self._budget = retry_budget if retry_budget is not None else RetryBudget(now=time.monotonic())
        self._discovery_interval = discovery_interval
        self._discovery_timeout = discovery_timeout
        self._first_discovery_wait = first_discovery_wait
        self._keepalive_expiry = keepalive_expiry
        # https is always verified; ca_certs names a PEM bundle to trust instead of the system's.
        self._ca_certs = ca_certs
        # Presented to a gateway that asks for client certificates (mTLS): a PEM file with the
        # certificate and key, or (certificate, key).
        self._client_cert = client_cert
        # Tests (and callers with special needs) hand in a transport, e.g. MockTransport.
        self._transport = transport
        self._cached: ClientConfig | None = None
        self._rng = random.Random()
        self._endpoints: EndpointSet | None = None
        self._url: str | None = None
        self._warnings = WarningLimiter()

    # -- setters of the original API ---------------------------------------------
    def _changed(self) -> None:
        self._cached = None

    def set_endpoint(self, endpoint: str) -> None:
        """Gateway address, or the discovery address in direct mode (needs ``init()``)."""
        self._endpoint = endpoint
        self._changed()

    def set_service_name(self, service_name: str) -> None:
        """Service name; may contain '/' for a sub-path (needs ``init()``)."""
        self._service_name = service_name
        self._changed()

    def set_endpoint_type(self, endpoint_type: str) -> None:
        """ENDPOINT_TYPE_GATEWAY/DEFAULT or ENDPOINT_TYPE_DIRECT (needs ``init()``)."""
        self._endpoint_type = endpoint_type or ENDPOINT_TYPE_DEFAULT
        self._changed()

    def set_token(self, token: str) -> None:
        """Service token; ``''`` sends no Authorization header. Applies to the next call."""
        self._token = token or ""
        self._changed()

    def set_retry_count(self, max_retry_count: int) -> None:
        """Retries after the first attempt (``0``: exactly one attempt; default 5)."""
        self._retry_policy = _replace_retries(self._retry_policy, int(max_retry_count))
        self._changed()

    def set_max_connection_count(self, max_connection_count: int) -> None:
        """Pool size per endpoint (default 100); takes effect at ``init()``."""
        self._max_connection_count = int(max_connection_count)
        self._changed()

    def set_timeout(self, timeout: float) -> None:
        """Per-attempt timeout in **milliseconds** (default 5000)."""
        self._timeout_ms = float(timeout)
        self._changed()

    def set_content_type(self, content_type: str) -> None:
        self._content_type = content_type or ""
        self._changed()

    def set_log_level(self, log_level: int | str) -> None:
        """Level of the ``eas_sdk.predict`` logger (no handler is ever added)."""
        logger.setLevel(log_level)

    def add_extra_headers(self, headers: dict[str, str]) -> None:
        """Headers sent with every request (merged into the previous extra headers)."""
        if not isinstance(headers, dict):
            raise TypeError("headers must be a dict")
        self._extra_headers.update({str(k): str(v) for k, v in headers.items()})
        self._changed()

    # -- read-only views --------------------------------------------------------------
    @property
    def config(self) -> ClientConfig:
        cfg = self._cached
        if cfg is None:
            cfg = ClientConfig(
                endpoint=self._endpoint,
                service_name=self._service_name,
                custom_url=self._custom_url,
                endpoint_type=self._endpoint_type,
                token=self._token,
                timeout=self._timeout_ms / 1000.0,
                content_type=self._content_type,
                headers=tuple(self._extra_headers.items()),
                retry=self._retry_policy,
                max_connection_count=self._max_connection_count,
            )
            self._cached = cfg
        return cfg

    # -- the original's public attributes -------------------------------------------
    # eas-prediction kept its settings in plain attributes that programs assign
    # (``client.timeout = 3000`` before ``init()``). Each one here routes to its
    # setter, so an assignment takes effect exactly like the setter call; the
    # attributes with no counterpart raise instead of being silently ignored.
    @property
    def retry_count(self) -> int:
        """Retries after the first attempt (``set_retry_count``)."""
        return self._retry_policy.retries

    @retry_count.setter
    def retry_count(self, value: int) -> None:
        self.set_retry_count(value)

    @property
    def timeout(self) -> float:
        """Per-attempt timeout in milliseconds (``set_timeout``)."""
        return self._timeout_ms

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.set_timeout(value)

    @property
    def max_connection_count(self) -> int:
        """Connections per endpoint (``set_max_connection_count``; needs ``init()``)."""
        return self._max_connection_count

    @max_connection_count.setter
    def max_connection_count(self, value: int) -> None:
        self.set_max_connection_count(value)

    @property
    def token(self) -> str:
        """The service token (``set_token``); never shown by ``repr()``."""
        return self._token

    @token.setter
    def token(self, value: str) -> None:
        self.set_token(value)

    @property
    def endpoint_name(self) -> str:
        """The gateway (or discovery) address (``set_endpoint``; needs ``init()``)."""
        return self._endpoint

    @endpoint_name.setter
    def endpoint_name(self, value: str) -> None:
        self.set_endpoint(value)

    @property
    def service_name(self) -> str:
        return self._service_name

    @service_name.setter
    def service_name(self, value: str) -> None:
        self.set_service_name(value)

    @property
    def endpoint_type(self) -> str:
        return self._endpoint_type

    @endpoint_type.setter
    def endpoint_type(self, value: str) -> None:
        self.set_endpoint_type(value)

    @property
    def custom_url(self) -> str:
        return self._custom_url

    @custom_url.setter
    def custom_url(self, value: str) -> None:
        self._custom_url = value or ""
        self._changed()

    @property
    def content_type(self) -> str:
        return self._content_type

    @content_type.setter
    def content_type(self, value: str) -> None:
        self.set_content_type(value)

    @property
    def headers(self) -> Mapping[str, str]:
        """The extra headers (read-only view; assign a dict or use ``add_extra_headers``)."""
        return MappingProxyType(self._extra_headers)

    @headers.setter
    def headers(self, value: Mapping[str, str]) -> None:
        self._extra_headers = {}
        self.add_extra_headers(dict(value))

    @property
    def logger(self) -> logging.Logger:
        """The ``eas_sdk.predict`` logger, shared by all clients (no per-client logger)."""
        return logger

    @logger.setter
    def logger(self, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__}.logger cannot be replaced: every client logs to "
            "logging.getLogger('eas_sdk.predict'); configure that logger or call set_log_level()"
        )

    endpoint = _NotCarriedOver(
        "use endpoint_name (or set_endpoint()) for the address; the direct-mode set is .endpoints"
    )
    connection_pool = _NotCarriedOver("the pool is internal; set max_connection_count before init()")
    stop = _NotCarriedOver("call close() (or destroy()) to stop the client")

    @property
    def endpoints(self) -> EndpointSet | None:
        """The direct-mode endpoint set (None in gateway mode or before ``init()``)."""
        return self._endpoints

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(endpoint={self._endpoint!r}, service_name={self._service_name!r}, "
            f"custom_url={redact_url(self._custom_url)!r}, endpoint_type={self._endpoint_type!r}, "
            f"token={mask_token(self._token)}, retry_count={self._retry_policy.retries}, "
            f"timeout_ms={self._timeout_ms:g})"
        )

    __str__ = __repr__

    # -- shared plumbing ------------------------------------------------------------------
    def _sync_transport(self) -> BaseTransport:
        """The transport given as ``transport=``, else a new pool with this client's settings."""
        given = self._transport
        if given is not None:
            assert isinstance(given, BaseTransport), "PredictClient needs a BaseTransport"
            return given
        return HTTPTransport(
            max_connections=self._max_connection_count,
            keepalive_expiry=self._keepalive_expiry,
            ca_certs=self._ca_certs,
            client_cert=self._client_cert,
        )

    def _async_transport(self) -> AsyncBaseTransport:
        given = self._transport
        if given is not None:
            assert isinstance(given, AsyncBaseTransport), "AsyncPredictClient needs an AsyncBaseTransport"
            return given
        return AsyncHTTPTransport(
            max_connections=self._max_connection_count,
            keepalive_expiry=self._keepalive_expiry,
            ca_certs=self._ca_certs,
            client_cert=self._client_cert,
        )

    def _prepare(self) -> ClientConfig:
        """Validate settings and set up the target (fixed URL or endpoint set)."""
        cfg = self.config
        cfg.validate()
        if cfg.token and cfg.custom_url and _plain_http_to_remote(cfg.custom_url):
            logger.warning("the raw token is sent over plain HTTP to a non-loopback host; prefer https")
        if cfg.direct:
            self._url = None
            self._endpoints = EndpointSet()
        else:
            self._url = cfg.gateway_url()
            self._endpoints = None
        return cfg

    def _new_call(self, body: bytes) -> PredictCall:
        return PredictCall(
            self.config,
            body,
            now=time.monotonic(),
            url=self._url,
            endpoints=self._endpoints,
            budget=self._budget,
            rng=self._rng,
        )

    def _discovery_url(self) -> str:
        return discovery_url(self._endpoint, self._service_name)

    def _discovery_result(self, status: int | None, body: bytes, error: str | None) -> None:
        """Record one discovery outcome (status/body, or an error text)."""
        assert self._endpoints is not None
        try:
            if error is not None:
                raise DiscoveryError(error)
            assert status is not None
            if apply_discovery_response(self._endpoints, status, body):
                logger.info(
                    "service %s endpoints now: %s",
                    self._service_name,
                    ", ".join(f"{e.address}(w={e.weight})" for e in self._endpoints.endpoints),
                )
        except DiscoveryError as exc:
            kept = len(self._endpoints.endpoints)
            if self._warnings.allow(time.monotonic()):
                logger.warning(
                    "service discovery for %s failed (%s); keeping %d known endpoints",
                    self._service_name,
                    exc,
                    kept,
                )
            else:
                logger.debug("service discovery failed again: %s", exc)

    @classmethod
    def _failed_attempt(cls, call: PredictCall, attempt: Attempt, exc: TransportFailure) -> Step:
        """The step after ``attempt`` failed in the transport (retry or raise), logged."""
        step = call.on_failure(exc.kind, exc.reason, time.monotonic(), reused=exc.reused, started=exc.started)
        cls._log_step(attempt, step, type(exc.cause).__name__)
        return step

    @staticmethod
    def _log_step(attempt: Attempt, step: Step, what: str) -> None:
        if step.body is None and step.error is None and logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "attempt %d to %s failed (%s); retrying in %.3fs",
                attempt.number,
                redact_url(attempt.url),
                what,
                step.delay,
            )


def _plain_http_to_remote(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _replace_retries(policy: RetryPolicy, retries: int) -> RetryPolicy:
    from dataclasses import replace

    return replace(policy, retries=retries)


def _no_endpoint(service: str, waited: float) -> NoEndpointError:
    return NoEndpointError(f"Get service backend timeout: no endpoint list for {service!r} after {waited:g}s")
