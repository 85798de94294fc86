"""``eas-gateway worker``: one worker on another host, joined to the gateways' pools.

1. Asks a gateway what the service is (``GET /api/v1/workers/<service>``, with the
   service's worker token): processor, model, client tokens, limits. ``--model`` and
   ``--entry`` override the paths, since files live where this host keeps them.
2. Loads the processor and serves it as a local worker does (gateway.worker.serve), the
   RPC on TCP (every connection must open with the worker token) and direct HTTP calls on
   its own port.
3. Registers with every gateway the ``--gateway`` host name resolves to (several replicas
   behind one name: a Kubernetes headless Service), and repeats that as its heartbeat.
4. On SIGTERM, deregisters (no new calls), then answers what it holds and exits.
5. On SIGHUP, loads its TLS files again (``--tls-cert``, ``--tls-key``, ``--tls-ca``): its
   RPC port's handshakes and its registrations use them from then on, connections already
   open keep theirs; files that do not load change nothing and are logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import uuid
from dataclasses import dataclass, replace
from multiprocessing.connection import Pipe
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.codecs.ipc import TCP_PREFIX
from gateway.config import ConfigError, GatewayConfig, ServiceConfig, parse_service
from gateway.config.model_urls import is_model_url, redact_url
from gateway.config.tls import TlsConfig
from gateway.core.metadata import ModelMetadata
from gateway.core.tls import ClientTls, ServerTls, TlsError
from gateway.sources import FetchError, Progress, fetch_model
from gateway.worker.serve import serve

log = logging.getLogger("gateway.agent")

PATH = "/api/v1/workers"


@dataclass(frozen=True)
class AgentOptions:
    gateway: str  # http://host:port of one gateway, or of a name resolving to several
    service: str
    token: str  # the service's remote_workers.token
    model: str | None = None
    entry: str | None = None
    host: str = "127.0.0.1"  # where this worker listens
    port: int = 0  # its RPC port (0: any free one)
    advertise: str | None = None  # the address gateways and clients reach it at
    heartbeat_s: float | None = None  # default: a third of the service's ttl_s
    log_level: str = "INFO"
    # Mutual TLS with the gateways (their gateway.worker_tls): this worker's certificate and
    # key, and the CA the gateways' certificates chain to. None: plain TCP and HTTP.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    # Where a model named by a URL is downloaded to (the gateway's download cache's layout).
    cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "easkit", "models")

    @property
    def tls(self) -> TlsConfig | None:
        if self.tls_cert is None or self.tls_key is None or self.tls_ca is None:
            return None
        return TlsConfig(self.tls_cert, self.tls_key, self.tls_ca, "required")


class AgentError(Exception):
    """The worker cannot start (unreachable gateway, wrong token, bad service)."""


def gateway_urls(url: str) -> list[str]:
    """Every gateway ``url``'s host resolves to, as base URLs (one per address)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(f"--gateway: expected http://host:port, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AgentError(f"--gateway: cannot resolve {parts.hostname}: {exc}") from None
    hosts = sorted({str(info[4][0]) for info in infos})
    return [f"{parts.scheme}://{f'[{h}]' if ':' in h else h}:{port}" for h in hosts]


def local_address_towards(url: str) -> str:
    """This host's address on the route to ``url`` (what a gateway there can reach)."""
    parts = urlsplit(url)
    family = socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((parts.hostname or "127.0.0.1", parts.port or 80))  # no packet is sent
        return str(s.getsockname()[0])


def metadata_json(meta: ModelMetadata | None) -> dict[str, Any] | None:
    if meta is None:
        return None
    return {
        "inputs": [t.as_json() for t in meta.inputs],
        "outputs": [t.as_json() for t in meta.outputs],
        "platform": meta.platform,
        "explains": meta.explains,
        "checks_inputs": meta.checks_inputs,
    }


class Agent:
    def __init__(self, opts: AgentOptions) -> None:
        self.opts = opts
        self.id = f"{socket.gethostname()[:40]}-{uuid.uuid4().hex[:12]}"
        self.headers = {"Authorization": f"Bearer {opts.token}"}
        self.registration: dict[str, Any] = {}
        self.ttl_s = 6.0
        self._known: dict[str, str] = {}  # gateway base URL -> last outcome logged
        # With TLS: the registrations' side (this worker's certificate, the gateways' CA) and
        # the RPC port's, both loaded again on SIGHUP.
        self.client_tls: ClientTls | None = None
        self.server_tls: ServerTls | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        """The context of the next connection to a gateway (aiohttp's default without TLS)."""
        return self.client_tls.context if self.client_tls is not None else True

    def reload_tls(self) -> None:
        """SIGHUP: the TLS files again, for both sides; files that do not load change nothing."""
        if self.client_tls is None or self.server_tls is None:
            log.info("SIGHUP received: no TLS files to load again")
            return
        try:
            self.server_tls.reload()  # checks the files before anything changes
            self.client_tls.reload()
        except TlsError as exc:
            log.error("SIGHUP: %s; the previous certificate stays in use", exc)

    async def describe(self, session: aiohttp.ClientSession) -> ServiceConfig:
        url = f"{self.opts.gateway.rstrip('/')}{PATH}/{self.opts.service}"
        try:
            async with session.get(url, headers=self.headers, ssl=self._ssl()) as r:
                body = await r.read()
                if r.status != 200:
                    raise AgentError(f"{url}: {r.status} {body[:300].decode(errors='replace')}")
        except aiohttp.ClientError as exc:
            raise AgentError(f"{url}: {exc}") from None
        doc = json.loads(body)
        spec = dict(doc["service"])
        self.ttl_s = float(doc.get("ttl_s", self.ttl_s))
        for key in ("model", "entry"):
            if getattr(self.opts, key):
                spec[key] = getattr(self.opts, key)
        spec["workers"] = 1
        spec.pop("async", None)
        spec.pop("queue", None)
        try:
            return parse_service(spec, where=f"service {self.opts.service}")
        except ConfigError as exc:
            raise AgentError(str(exc)) from None

    async def fetch(self, service: ServiceConfig) -> str:
        """The service's model URL fetched into this host's download cache (the store and
        its credentials from the environment: AWS_*, OSS_*)."""
        assert service.model is not None
        progress = Progress(redact_url(service.model))
        try:
            fetched = await asyncio.to_thread(fetch_model, service.model, (), self.opts.cache_dir, progress)
        except FetchError as exc:
            raise AgentError(str(exc)) from None
        return str(fetched.path)

    async def register_all(self, session: aiohttp.ClientSession) -> None:
        for base in gateway_urls(self.opts.gateway):
            url = f"{base}{PATH}/{self.opts.service}"
            try:
                async with session.post(
                    url, json=self.registration, headers=self.headers, ssl=self._ssl()
                ) as r:
                    outcome = f"{r.status}"
                    if r.status != 200:
                        outcome += f" {(await r.read())[:200].decode(errors='replace')}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome = f"unreachable ({type(exc).__name__})"
            if self._known.get(base) != outcome:
                level = logging.INFO if outcome == "200" else logging.WARNING
                said = "accepted" if outcome == "200" else outcome
                log.log(level, "gateway %s: registration %s", base, said)
                self._known[base] = outcome

    async def deregister_all(self, session: aiohttp.ClientSession) -> None:
        for base in self._known:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                url = f"{base}{PATH}/{self.opts.service}/{self.id}"
                async with session.delete(url, headers=self.headers, ssl=self._ssl()) as r:
                    await r.read()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=5)
        tls = self.opts.tls
        if tls is not None:
            try:
                # Registrations over HTTPS presenting this worker's certificate; the RPC port
                # asks the gateways for theirs.
                self.client_tls, self.server_tls = ClientTls(tls), ServerTls(tls, alpn=())
            except TlsError as exc:
                raise AgentError(str(exc)) from None
        loop.add_signal_handler(signal.SIGHUP, self.reload_tls)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            service = await self.describe(session)
            if is_model_url(service.model):  # fetched on this host, once for its restarts too
                service = replace(service, model=await self.fetch(service))
            gateway = GatewayConfig(worker_host=self.opts.host, log_level=self.opts.log_level, worker_tls=tls)
            ours, theirs = Pipe()
            listen = f"{TCP_PREFIX}{self.opts.host}:{self.opts.port}"
            worker = asyncio.create_task(
                serve(service, gateway, listen, theirs, 10.0, key=self.opts.token, tls=self.server_tls)
            )
            ready: asyncio.Future[dict[str, Any]] = loop.create_future()

            def on_ready() -> None:
                loop.remove_reader(ours.fileno())
                with contextlib.suppress(EOFError, OSError):
                    if not ready.done():
                        ready.set_result(ours.recv())

            loop.add_reader(ours.fileno(), on_ready)
            done, _ = await asyncio.wait({ready, worker}, return_when=asyncio.FIRST_COMPLETED)
            if ready not in done or not ready.result().get("ok"):
                loop.remove_reader(ours.fileno())
                error = ready.result().get("error") if ready.done() else "the worker stopped"
                log.error("service %s: the worker did not start: %s", service.name, error)
                worker.cancel()
                return 3
            msg = ready.result()
            advertise = self.opts.advertise or self.opts.host
            if advertise in ("0.0.0.0", "::"):  # noqa: S104 - recognised here, not bound
                advertise = local_address_towards(self.opts.gateway)
            ipc_port = int(str(msg["socket"]).rsplit(":", 1)[1])
            self.registration = {
                "id": self.id,
                "ipc": f"{TCP_PREFIX}{advertise}:{ipc_port}",
                "http": f"{advertise}:{msg['http_port']}",
                "metadata": metadata_json(msg.get("metadata")),
            }
            log.info(
                "service %s: remote worker %s serving (rpc %s:%d, http %s:%s)",
                service.name, self.id, advertise, ipc_port, advertise, msg["http_port"],
            )  # fmt: skip
            stopping = asyncio.Event()
            loop.add_signal_handler(signal.SIGTERM, stopping.set)
            loop.add_signal_handler(signal.SIGINT, stopping.set)
            interval = self.opts.heartbeat_s or max(0.2, self.ttl_s / 3)
            while not stopping.is_set() and not worker.done():
                await self.register_all(session)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), interval)
            # Leave the pools first, so no gateway sends more; then answer what is held.
            await self.deregister_all(session)
            ours.close()  # EOF: the worker drains and returns
            return int(await worker) if not worker.cancelled() else 0


def run(opts: AgentOptions) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        runner: Any = asyncio.run
    else:
        runner = uvloop.run
    try:
        return int(runner(Agent(opts).run()))
    except AgentError as exc:
        log.error("%s", exc)
        return 2


__all__ = ["Agent", "AgentError", "AgentOptions", "gateway_urls", "local_address_towards", "run"]
