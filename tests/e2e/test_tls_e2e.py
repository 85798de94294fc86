"""TLS end to end, with certificates the tests make (trustme): HTTPS on the HTTP port (the
lean front and aiohttp), TLS on the gRPC port, a certificate replaced on SIGHUP while a
connection made before keeps working, client certificates (mTLS), and remote workers
reached over mutual TLS. The clients: our SDK (``https://`` with ``ca_certs``), the real
``eas-prediction`` client, urllib and grpcio."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictClient, TFRequest
from eas_sdk.errors import TransportError
from tests.eas_reference import run_reference
from tests.waiting import wait_until

trustme = pytest.importorskip("trustme")

TOKEN = "tls-token-0123456789abcdef"
WORKER_TOKEN = "worker-secret-0123456789abcdef"
ADMIN_TOKEN = "admin-token-7c1d9e2f40a3b856"
ROW = np.linspace(0, 16, 64, dtype=np.float32).reshape(1, 64)


class Pki:
    """A CA and the files a test hands the gateway and its clients."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ca = trustme.CA()
        self.ca_file = folder / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(self, name: str, *hosts: str) -> tuple[str, str]:
        cert = self.ca.issue_cert(*(hosts or ("127.0.0.1",)))
        chain, key = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return str(chain), str(key)

    def client_ctx(self, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def _tf() -> TFRequest:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, ROW)
    return req


def _get(url: str, ctx: ssl.SSLContext, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _start_worker(
    base: str, model: Path, cert_key: tuple[str, str], ca: str, log: Path
) -> subprocess.Popen[bytes]:
    """``eas-gateway worker`` serving digits for the gateway at ``base``, its RPC port and its
    registration on TLS with ``cert_key`` and the CA file ``ca``; its output in ``log``."""
    argv = [
        sys.executable, "-m", "gateway", "worker", "--gateway", base, "--service", "digits",
        "--host", "127.0.0.1", "--heartbeat", "0.3", "--model", str(model),
        "--tls-cert", cert_key[0], "--tls-key", cert_key[1], "--tls-ca", ca,
    ]  # fmt: skip
    env = {**os.environ, "EAS_WORKER_TOKEN": WORKER_TOKEN, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _remote_worker(base: str, pki: Pki) -> tuple[str, str]:
    """The host and RPC port of the one remote worker the gateway lists."""
    _, body = _get(f"{base}/api/services", pki.client_ctx())
    (worker,) = [w for w in body["services"][0]["workers"] if w.get("remote")]
    host, port = worker["remote"].removeprefix("tcp://").rsplit(":", 1)
    return host, port


def _wait_ready(base: str, ctx: ssl.SSLContext, name: str = "digits") -> None:
    def ready() -> bool:
        status, body = _get(f"{base}/readyz?service={name}", ctx)
        return status == 200 and body["ready"]

    wait_until(ready, 60, f"{name} ready over https")


def _served_cert(port: int, ctx: ssl.SSLContext) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = tls.getpeercert(binary_form=True)
        assert cert is not None
        return cert


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(digits_model: Path, **gateway: Any) -> dict[str, Any]:
    return {
        "gateway": gateway,
        "services": [{"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN}],
    }


REFERENCE = r"""
import sys
import numpy as np
from eas_prediction import PredictClient, TFRequest
client = PredictClient(sys.argv[1], "digits")
client.set_token(sys.argv[2])
client.init()
# eas-prediction 0.36 puts http:// in front of every endpoint it is given (https:// too):
# its gateway endpoint is pointed at the https:// address after init instead.
client.endpoint.domain = sys.argv[1]
req = TFRequest("serving_default")
req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, list(np.linspace(0, 16, 64, dtype=np.float32)))
resp = client.predict(req)
print(len(resp.response.outputs["probabilities"].float_val))
"""


@pytest.mark.parametrize("lean", [True, False], ids=["lean-front", "aiohttp"])
def test_https_serves_the_sdk_the_reference_client_and_aiohttp_routes(
    pki: Pki, digits_model: Path, gateway_factory: Any, lean: bool
) -> None:
    cert, key = pki.issue("server")
    paths = {} if lean else {"predict_fast_path": False, "queue_fast_path": False}
    cfg = _config(digits_model, tls={"cert_file": cert, "key_file": key}, **paths)
    cfg["admin"] = {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN}
    gw = gateway_factory(cfg)
    base = f"https://127.0.0.1:{gw.port}"
    assert f"listening on {base}" in gw.output()
    ctx = pki.client_ctx()
    _wait_ready(base, ctx)
    # The admin API listens over TLS too, with the same certificate.
    admin = re.findall(r"admin API listening on (https://\S+)", gw.output())[-1]
    status, body = _get(f"{admin}/admin/services", ctx, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200 and body["services"][0]["name"] == "digits"
    with PredictClient(base, "digits", token=TOKEN, ca_certs=str(pki.ca_file)) as client:
        out = client.predict(_tf())
        assert len(out.get_values("probabilities")) == 10
    # A route aiohttp serves, on the same TLS listener.
    status, body = _get(f"{base}/api/services", ctx)
    assert status == 200 and body["services"][0]["name"] == "digits"
    # The real eas-prediction client, trusting the test CA through OpenSSL's variable.
    proc = run_reference(REFERENCE, base, TOKEN, env={"SSL_CERT_FILE": str(pki.ca_file)})
    assert proc.stdout.decode().strip() == "10"
    # Plain HTTP to the HTTPS port is no call, and a client that does not trust the CA is refused.
    with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{gw.port}/healthz", timeout=5)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{base}/healthz", timeout=5, context=ssl.create_default_context())


def test_sighup_loads_a_new_certificate_and_open_connections_keep_working(
    pki: Pki, digits_model: Path, gateway_factory: Any
) -> None:
    cert, key = pki.issue("server")
    grpc_port = _free_port()
    gw = gateway_factory(_config(digits_model, tls={"cert_file": cert, "key_file": key}, grpc_port=grpc_port))
    base = f"https://127.0.0.1:{gw.port}"
    ctx = pki.client_ctx()
    _wait_ready(base, ctx)
    grpc_ctx = pki.client_ctx()
    grpc_ctx.set_alpn_protocols(["h2"])
    grpc_first = _served_cert(grpc_port, grpc_ctx)
    kept = http.client.HTTPSConnection("127.0.0.1", gw.port, context=ctx, timeout=10)
    kept.request("GET", "/healthz")
    assert kept.getresponse().read() and kept.sock is not None
    first = kept.sock.getpeercert(binary_form=True)
    assert first == _served_cert(gw.port, ctx)

    # A broken pair: the reload is refused, the certificate in use stays.
    Path(cert).write_text("not a certificate\n")
    os.kill(gw.pid, signal.SIGHUP)
    wait_until(lambda: "the previous certificate stays in use" in gw.output(), 10, "a refused reload")
    assert _served_cert(gw.port, ctx) == first

    fresh_cert, fresh_key = pki.issue("fresh")
    os.replace(fresh_cert, cert)
    os.replace(fresh_key, key)
    os.kill(gw.pid, signal.SIGHUP)
    wait_until(lambda: _served_cert(gw.port, ctx) != first, 10, "the new certificate served")
    # The gRPC port too, from its next handshake on.
    wait_until(lambda: _served_cert(grpc_port, grpc_ctx) != grpc_first, 10, "gRPC's new certificate")
    assert _served_cert(grpc_port, grpc_ctx) == _served_cert(gw.port, ctx)
    # The connection made before the reload goes on with its session.
    kept.request("GET", "/healthz")
    resp = kept.getresponse()
    assert resp.status == 200 and resp.read()
    assert kept.sock.getpeercert(binary_form=True) == first
    kept.close()


def test_client_certificates_on_http_and_grpc(pki: Pki, digits_model: Path, gateway_factory: Any) -> None:
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    cert, key = pki.issue("server")
    clients = Pki(pki.folder / "clients")
    good = clients.issue("client", "client.example")
    strangers = Pki(pki.folder / "strangers")
    stranger = strangers.issue("stranger", "client.example")
    grpc_port = _free_port()
    tls = {
        "cert_file": cert,
        "key_file": key,
        "client_ca_file": str(clients.ca_file),
        "client_auth": "required",
    }
    gw = gateway_factory(_config(digits_model, tls=tls, grpc_port=grpc_port))
    base = f"https://127.0.0.1:{gw.port}"

    def ctx(client: tuple[str, str] | None) -> ssl.SSLContext:
        c = pki.client_ctx()
        if client is not None:
            c.load_cert_chain(*client)
        return c

    _wait_ready(base, ctx(good))
    # Our SDK presents a client certificate when given one; without it, the handshake fails.
    with PredictClient(base, "digits", token=TOKEN, ca_certs=str(pki.ca_file), client_cert=good) as client:
        assert len(client.predict(_tf()).get_values("probabilities")) == 10
    with PredictClient(base, "digits", token=TOKEN, ca_certs=str(pki.ca_file), retry_count=0) as client:
        with pytest.raises(TransportError):
            client.predict(_tf())
    for who in (None, stranger):
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(f"{base}/healthz", ctx(who))

    ca = pki.ca_file.read_bytes()

    def ready(client: tuple[str, str] | None) -> bool:
        pair = {} if client is None else {"private_key": Path(client[1]).read_bytes()}
        if client is not None:
            pair["certificate_chain"] = Path(client[0]).read_bytes()
        creds = grpc.ssl_channel_credentials(root_certificates=ca, **pair)
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return bool(stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live)

    assert ready(good)
    for who in (None, stranger):
        with pytest.raises(grpc.RpcError) as err:
            ready(who)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_remote_workers_over_mutual_tls(
    pki: Pki, digits_model: Path, gateway_factory: Any, tmp_path: Path
) -> None:
    server = pki.issue("server")
    gateway_side = pki.issue("gateway", "gateway.internal")
    worker_side = pki.issue("worker", "127.0.0.1")
    ca = str(pki.ca_file)
    cfg = _config(
        digits_model,
        tls={"cert_file": server[0], "key_file": server[1], "client_ca_file": ca, "client_auth": "optional"},
        worker_tls={"cert_file": gateway_side[0], "key_file": gateway_side[1], "client_ca_file": ca},
    )
    cfg["services"][0].update(workers=0, remote_workers={"token": WORKER_TOKEN, "ttl_s": 3})
    gw = gateway_factory(cfg)
    base = f"https://127.0.0.1:{gw.port}"
    log = tmp_path / "worker.log"
    agent = _start_worker(base, digits_model, worker_side, ca, log)
    try:
        _wait_ready(base, pki.client_ctx())
        with PredictClient(base, "digits", token=TOKEN, ca_certs=ca) as client:
            assert len(client.predict(_tf()).get_values("probabilities")) == 10
        host, port = _remote_worker(base, pki)

        # The worker's RPC port keeps a connection that presented a certificate of the CA
        # (waiting for its first frame) and drops one that presented none.
        assert _rpc_handshake(host, int(port), pki.client_ctx(gateway_side))
        assert not _rpc_handshake(host, int(port), pki.client_ctx(None))
        # The worker token alone does not register a worker: its certificate is asked for too.
        req = urllib.request.Request(
            f"{base}/api/v1/workers/digits",
            data=json.dumps({"id": "w-1", "ipc": "tcp://127.0.0.1:9", "http": "127.0.0.1:9"}).encode(),
            headers={"Authorization": f"Bearer {WORKER_TOKEN}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10, context=pki.client_ctx())
        assert refused.value.code == 403
        assert "presenting a certificate" in json.loads(refused.value.read())["message"]
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(15)
    assert "registration accepted" in log.read_text(), log.read_text()


def _rpc_handshake(host: str, port: int, ctx: ssl.SSLContext) -> bool:
    """Whether a remote worker's RPC port keeps a TLS connection made with ``ctx`` (waiting
    for its first frame), rather than refusing it in the handshake or closing it after."""
    with socket.create_connection((host, port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.settimeout(1.0)
                return tls.recv(1) != b""
        except TimeoutError:
            return True
        except (ssl.SSLError, ConnectionError):
            return False


def test_remote_worker_tls_files_are_loaded_again_on_sighup(
    pki: Pki, digits_model: Path, gateway_factory: Any, tmp_path: Path
) -> None:
    """Every certificate and the CA replaced on disk (the gateway's listener, its side of the
    link to the worker, the worker's), then SIGHUP to the worker and to the gateway: the
    gateway connects to the worker again with the new files and its calls go on there; the
    worker refuses a connection with the old gateway certificate, and a client trusting only
    the old CA cannot verify the worker any more."""
    files = {name: pki.issue(name, *hosts) for name, hosts in [
        ("server", ("127.0.0.1",)), ("gateway", ("gateway.internal",)), ("worker", ("127.0.0.1",))
    ]}  # fmt: skip
    ca = str(pki.ca_file)
    cfg = _config(
        digits_model,
        tls={"cert_file": files["server"][0], "key_file": files["server"][1], "client_ca_file": ca,
             "client_auth": "optional"},
        worker_tls={"cert_file": files["gateway"][0], "key_file": files["gateway"][1], "client_ca_file": ca},
    )  # fmt: skip
    cfg["services"][0].update(workers=0, remote_workers={"token": WORKER_TOKEN, "ttl_s": 5})
    gw = gateway_factory(cfg)
    base = f"https://127.0.0.1:{gw.port}"
    log = tmp_path / "worker.log"
    agent = _start_worker(base, digits_model, files["worker"], ca, log)
    try:
        _wait_ready(base, pki.client_ctx())
        host, port = _remote_worker(base, pki)
        old_ca = pki.client_ctx(files["gateway"])
        assert _rpc_handshake(host, int(port), old_ca)

        # A new CA and new certificates, written over the files both sides were started with.
        fresh = Pki(pki.folder / "fresh")
        for name, (cert, key) in files.items():
            new_cert, new_key = fresh.issue(name, *(("gateway.internal",) if name == "gateway" else ()))
            os.replace(new_cert, cert)
            os.replace(new_key, key)
        os.replace(fresh.ca_file, ca)
        fresh.ca_file = pki.ca_file
        os.kill(agent.pid, signal.SIGHUP)
        # The worker takes the new gateway certificate in its handshakes, and not the old one.
        new_chain = fresh.client_ctx(files["gateway"])
        wait_until(lambda: _rpc_handshake(host, int(port), new_chain), 10, "the worker's new chain")
        stale = ssl.create_default_context()
        pki.ca.configure_trust(stale)
        fresh.ca.issue_cert("gateway.internal").configure_cert(stale)  # trusts only the old CA
        assert not _rpc_handshake(host, int(port), stale)
        wrong = ssl.create_default_context()
        fresh.ca.configure_trust(wrong)
        pki.ca.issue_cert("gateway.internal").configure_cert(wrong)  # presents the old CA's
        assert not _rpc_handshake(host, int(port), wrong)

        # Calls go on while the gateway opens new connections and lets the old ones finish
        # (the caller trusts both CAs: the listener's certificate changes under it too).
        outcomes: list[bool] = []
        stop = threading.Event()
        both = tmp_path / "both-cas.pem"
        both.write_bytes(pki.ca.cert_pem.bytes() + fresh.ca.cert_pem.bytes())

        def call_on() -> None:
            with PredictClient(base, "digits", token=TOKEN, ca_certs=str(both), retry_count=0) as client:
                while not stop.is_set():
                    try:
                        outcomes.append(len(client.predict(_tf()).get_values("probabilities")) == 10)
                    except Exception:
                        outcomes.append(False)

        caller = threading.Thread(target=call_on)
        caller.start()
        try:
            os.kill(gw.pid, signal.SIGHUP)
            renewed = "connected with the TLS files loaded again"
            wait_until(lambda: renewed in gw.output(), 15, "the gateway's new connections to the worker")
            calls = len(outcomes)
            wait_until(lambda: len(outcomes) > calls, 10, "a call after the new connections")
        finally:
            stop.set()
            caller.join(15)
        assert outcomes and all(outcomes), outcomes.count(False)
        # Calls go on, over the connections made with the new files; the listener serves its
        # new certificate, which only the new CA verifies.
        with PredictClient(base, "digits", token=TOKEN, ca_certs=ca) as client:
            assert len(client.predict(_tf()).get_values("probabilities")) == 10
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _get(f"{base}/healthz", old_ca)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(15)
    assert "the previous certificate stays in use" not in log.read_text() + gw.output()
