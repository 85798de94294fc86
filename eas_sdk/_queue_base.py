"""Settings and call set-up shared by QueueClient and AsyncQueueClient (no I/O)."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Generic, TypeVar

from ._core import constants as C
from ._core import queue as core
from ._core.queue_call import QueueCall, QueueStep
from ._core.retry import RetryBudget, RetryPolicy
from ._transports import Request, TransportFailure
from .watcher import WatchSettings

DEFAULT_TIMEOUT_MS = 5000
PING_INTERVAL = 2.0
PING_TIMEOUT = 2.0

_log = logging.getLogger("eas_sdk.queue")

_W = TypeVar("_W")


def failure_step(call: QueueCall, exc: TransportFailure) -> QueueStep:
    """What ``call`` does after the transport failed: retry (after a delay) or raise."""
    return call.on_failure(
        exc.kind, exc.reason, time.monotonic(), reused=exc.reused, started=exc.started, sent=exc.sent
    )


class WatchSlot(Generic[_W]):
    """A client's one running watcher (a ``watcher.WatchClaim``): the client keeps it,
    its watchers claim it when they start and release it when they stop or close."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        # A thread lock for the asyncio client too: claims never wait on I/O, and an
        # asyncio client driven from several threads still gets one watcher.
        self.lock = lock if lock is not None else threading.Lock()
        self.current: _W | None = None

    def claim(self, watcher: _W) -> bool:
        with self.lock:
            if self.current is not None:
                return False
            self.current = watcher
            return True

    def release(self, watcher: _W) -> None:
        with self.lock:
            if self.current is watcher:
                self.current = None


class _Base:
    """Settings shared by the sync and async clients (no I/O)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "") -> None:
        self.endpoint = endpoint
        self.queue_name = queue_name
        self.service_name = queue_name
        self.custom_url = custom_url
        self.path_suffix = ""
        self.token: str | None = None
        self.uid = str(uuid.uuid4())
        self.gid = C.DEFAULT_QUEUE_GROUP
        self.timeout_ms: float = DEFAULT_TIMEOUT_MS
        self.content_type = ""
        self.extra_headers: dict[str, str] = {}
        self.retry_policy = RetryPolicy()
        self.budget = RetryBudget()
        self.logger: logging.Logger | None = _log
        self.ping_interval = PING_INTERVAL
        self.ping_timeout = PING_TIMEOUT
        self.ca_certs: str | None = None  # a PEM bundle trusted instead of the system's
        self.client_cert: str | tuple[str, str] | None = None  # presented for mTLS
        self._base: str | None = None
        self._rng = random.Random()

    # --- reference API --------------------------------------------------------
    def set_token(self, token: str) -> None:
        self.token = token

    def set_timeout(self, timeout: float) -> None:
        """Per-attempt timeout in milliseconds (like the reference)."""
        self.timeout_ms = float(timeout)

    def set_logger(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger

    def set_retry_count(self, retries: int) -> None:
        self.retry_policy = dataclasses.replace(self.retry_policy, retries=int(retries))

    # The reference's plain attributes that programs assign, routed to the settings.
    @property
    def timeout(self) -> float:
        """Per-attempt timeout in milliseconds (``set_timeout``)."""
        return self.timeout_ms

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.set_timeout(value)

    @property
    def retry_count(self) -> int:
        """Retries after the first attempt (``set_retry_count``)."""
        return self.retry_policy.retries

    @retry_count.setter
    def retry_count(self, value: int) -> None:
        self.set_retry_count(value)

    def set_content_type(self, content_type: str) -> None:
        self.content_type = content_type

    def add_extra_headers(self, headers: Mapping[str, str]) -> None:
        self.extra_headers.update(headers)

    def _init(self, uid: str | None, gid: str, custom_url: str, path_suffix: str) -> None:
        self.uid = str(uuid.uuid4()) if uid is None else uid
        self.gid = gid
        if custom_url:
            self.custom_url = custom_url
        self.path_suffix = path_suffix
        self._base = None

    @property
    def base_url(self) -> str:
        if self._base is None:
            self._base = core.base_url(self.endpoint, self.queue_name, self.custom_url, self.path_suffix)
        return self._base

    def _headers(self, accept_protobuf: bool = False) -> dict[str, str]:
        h = core.identity_headers(self.token, self.uid, self.gid, self.content_type, self.extra_headers)
        if accept_protobuf:
            h.update(core.PROTOBUF_ACCEPT)
        return h

    def _call(
        self,
        method: str,
        query: Mapping[str, object],
        headers: dict[str, str],
        body: bytes | None,
        read_timeout: float | None,
        idempotent: bool,
    ) -> tuple[QueueCall, Request]:
        """The retry state of one queue call and the request each attempt sends."""
        call = QueueCall(
            method,
            core.build_url(self.base_url, query),
            headers,
            body,
            timeout=self.timeout_ms / 1000.0,
            now=time.monotonic(),
            policy=self.retry_policy,
            budget=self.budget,
            rng=self._rng,
            read_timeout=read_timeout,
            idempotent=idempotent,
        )
        return call, Request(method, call.url, headers, body, call.attempt_timeout, idempotent)

    def _watch_settings(self) -> WatchSettings:
        """What a watcher made now needs of this client's settings."""
        return WatchSettings(
            # At least 1 s for the handshake, however short the per-call timeout is.
            open_timeout=max(1.0, self.timeout_ms / 1000.0),
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
            ca_certs=self.ca_certs,
            client_cert=self.client_cert,
            logger=self.logger,
        )

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}(queue={self.queue_name!r}, uid={self.uid!r}, gid={self.gid!r})"
