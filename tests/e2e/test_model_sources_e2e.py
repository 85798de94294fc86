"""Models named by a URL, end to end: a real S3-compatible server (moto's server mode, on
127.0.0.1, with its access-key checks on) and a local HTTPS server the test makes; the
gateway fetches, caches and serves them, loads a changed object again, reuses its cache
across a restart, and names the URL and the store's error when a fetch fails."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import GatewayProcess
from tests.waiting import wait_until

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
trustme = pytest.importorskip("trustme")

ADMIN_TOKEN = "admin-token-5b1e0c93d7a24f68"
BUCKET = "models"


def _doubling_model(path: Path) -> None:
    """An ONNX model with the digits model's input and one output, ``doubled`` = 2 x input."""
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 64])
    y = helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [None, 64])
    graph = helper.make_graph([helper.make_node("Add", ["input", "input"], ["doubled"])], "double", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))


class S3:
    """moto's S3 server in this process, with a user whose key may read and write."""

    def __init__(self) -> None:
        from moto import settings

        self._settings = settings
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        iam = self.client("iam", "testing", "testing")
        iam.create_user(UserName="models")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="models", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="models")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        self.s3 = self.client("s3", self.key_id, self.secret)
        self.s3.create_bucket(Bucket=BUCKET)
        self.s3.create_bucket(Bucket="locked")
        # From here on every request is checked against the users' keys, as a real store does.
        self._before = settings.INITIAL_NO_AUTH_ACTION_COUNT
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0

    def client(self, service: str, key_id: str, secret: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )

    def put(self, key: str, path: Path, bucket: str = BUCKET) -> None:
        self.s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    def stop(self) -> None:
        self._settings.INITIAL_NO_AUTH_ACTION_COUNT = self._before
        # moto's backends live in this process: the next test's server starts empty.
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"))
        self.server.stop()


@pytest.fixture
def s3() -> Iterator[S3]:
    server = S3()
    try:
        yield server
    finally:
        server.stop()


def _secret_file(path: Path, **values: str) -> str:
    path.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    path.chmod(0o600)
    return str(path)


def _infer(gw: GatewayProcess, name: str, values: list[float]) -> dict[str, Any]:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": values}]}
    req = urllib.request.Request(
        f"{gw.url}/v2/models/{name}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return {o["name"]: o["data"] for o in json.loads(r.read())["outputs"]}


def _wait_ready(gw: GatewayProcess, name: str, timeout: float = 60.0) -> None:
    wait_until(lambda: gw.services()[name]["ready"], timeout, f"{name} ready")


def _load(gw: GatewayProcess, name: str) -> None:
    req = urllib.request.Request(
        f"{gw.url}/v2/repository/models/{name}/load",
        data=b"{}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200


def _config(s3: S3, tmp_path: Path, services: list[dict[str, Any]], **gateway: Any) -> dict[str, Any]:
    creds = _secret_file(tmp_path / "s3.secret", access_key_id=s3.key_id, secret_access_key=s3.secret)
    return {
        "gateway": {
            "model_cache_dir": str(tmp_path / "cache"),
            "model_sources": [
                {"prefix": f"s3://{BUCKET}/", "endpoint": s3.endpoint, "credentials_file": creds}
            ],
            **gateway,
        },
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "services": services,
    }


def test_s3_model_is_served_loaded_again_when_changed_and_cached_across_restarts(
    s3: S3, digits_model: Path, tmp_path: Path, gateway_factory: Any
) -> None:
    s3.put("digits/model.onnx", digits_model)
    services = [
        {"name": "digits", "processor": "onnx", "model": f"s3://{BUCKET}/digits/model.onnx", "workers": 2}
    ]
    cfg = _config(s3, tmp_path, services)
    gw = gateway_factory(cfg, name="first")
    _wait_ready(gw, "digits")
    assert set(_infer(gw, "digits", [0.5] * 64)) == {"label", "probabilities"}
    # Both workers load the one file the gateway fetched, from the cache.
    (cached,) = (tmp_path / "cache").glob("*/*/model.onnx")
    assert cached.read_bytes() == digits_model.read_bytes()

    # The object changes; loading the model again fetches and serves the new one.
    doubling = tmp_path / "doubling.onnx"
    _doubling_model(doubling)
    s3.put("digits/model.onnx", doubling)
    _load(gw, "digits")
    out = _infer(gw, "digits", [1.5] * 64)
    assert out == {"doubled": [3.0] * 64}
    log = gw.output()
    assert log.count("model s3://models/digits/model.onnx: downloading") == 2, log
    gw.stop()

    # A restart finds the object unchanged: the cached file serves, nothing is downloaded.
    (newest,) = [
        p for p in (tmp_path / "cache").glob("*/*/model.onnx") if p.read_bytes() == doubling.read_bytes()
    ]
    before = newest.stat()
    again = gateway_factory(cfg, name="second")
    _wait_ready(again, "digits")
    assert _infer(again, "digits", [1.0] * 64) == {"doubled": [2.0] * 64}
    log = again.output()
    assert "downloading" not in log, log
    assert "version in the cache" in log
    after = newest.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # No credential reaches a log.
    for text in (gw.output(), log):
        assert s3.secret not in text and s3.key_id not in text


def test_a_failed_fetch_is_the_reason_naming_the_url_and_the_stores_error(
    s3: S3, digits_model: Path, tmp_path: Path, gateway_factory: Any
) -> None:
    s3.put("digits.onnx", digits_model, bucket="locked")
    wrong = _secret_file(
        tmp_path / "wrong.secret", access_key_id="AKIAWRONGWRONGWRONG1", secret_access_key="nope"
    )
    gone = "http://127.0.0.1:9"  # discard: nothing listens
    cfg = _config(
        s3,
        tmp_path,
        [
            {"name": "missing", "processor": "onnx", "model": f"s3://{BUCKET}/missing.onnx"},
            {"name": "locked", "processor": "onnx", "model": "s3://locked/digits.onnx"},
            {"name": "down", "processor": "onnx", "model": "s3://gone/digits.onnx"},
        ],
    )
    cfg["gateway"]["model_sources"] += [
        {"prefix": "s3://locked/", "endpoint": s3.endpoint, "credentials_file": wrong},
        {"prefix": "s3://gone/", "endpoint": gone, "credentials_file": wrong, "timeout_s": 2},
        # oss:// is the same store through the S3-compatible API (path-style for this server).
        {
            "prefix": f"oss://{BUCKET}/",
            "endpoint": s3.endpoint,
            "addressing_style": "path",
            "credentials_file": str(tmp_path / "s3.secret"),
        },
    ]
    gw = gateway_factory(cfg)

    def reasons() -> dict[str, str]:
        return {n: s.get("reason", "") for n, s in gw.services().items()}

    wait_until(lambda: all("cannot fetch" in r for r in reasons().values()), 60, "three failed fetches")
    got = reasons()
    assert got["missing"].startswith("cannot fetch model s3://models/missing.onnx: NoSuchKey"), got
    assert got["locked"].startswith("cannot fetch model s3://locked/digits.onnx: InvalidAccessKeyId"), got
    assert got["down"].startswith("cannot fetch model s3://gone/digits.onnx: Could not connect"), got
    # A call gets 503 with the same reason; the gateway serves on.
    req = urllib.request.Request(f"{gw.url}/api/predict/missing", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 503
    assert "s3://models/missing.onnx: NoSuchKey" in json.loads(err.value.read())["message"]
    assert "AKIAWRONGWRONGWRONG1" not in gw.output() and "nope" not in json.dumps(got)

    # The admin API takes model URLs too, for each version of a service.
    doubling = tmp_path / "doubling.onnx"
    _doubling_model(doubling)
    s3.put("v1.onnx", digits_model)
    s3.put("v2.onnx", doubling)
    admin = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1]
    spec = {"name": "late", "processor": "onnx", "public": True}
    spec["versions"] = {1: f"s3://{BUCKET}/v1.onnx", 2: f"s3://{BUCKET}/v2.onnx"}
    req = urllib.request.Request(
        f"{admin}/admin/services",
        data=json.dumps(spec).encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["ready"] is True
    assert _infer(gw, "late", [1.0] * 64) == {"doubled": [2.0] * 64}
    assert set(_infer(gw, "late/versions/1", [1.0] * 64)) == {"label", "probabilities"}
    alias = {"name": "alias", "processor": "onnx", "public": True, "model": f"oss://{BUCKET}/v2.onnx"}
    req = urllib.request.Request(
        f"{admin}/admin/services",
        data=json.dumps(alias).encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["ready"] is True
    assert _infer(gw, "alias", [0.5] * 64) == {"doubled": [1.0] * 64}


class _Files(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    token = ""
    release = threading.Event()

    def _head(self) -> bytes | None:
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_error(401)
            return None
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return None
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{hash(body) & 0xFFFFFFFF:x}"')
        self.end_headers()
        return body

    def do_HEAD(self) -> None:
        self.send_error(405)  # as a presigned URL, signed for GET only

    def do_GET(self) -> None:
        authorized = self.headers.get("Authorization") == f"Bearer {self.token}"
        if authorized and self.headers.get("Range") == "bytes=0-0" and self.path in self.files:
            whole = self.files[self.path]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-0/{len(whole)}")
            self.send_header("Content-Length", "1")
            self.send_header("ETag", f'"{hash(whole) & 0xFFFFFFFF:x}"')
            self.end_headers()
            self.wfile.write(whole[:1])
            return
        body = self._head()
        if body is None:
            return
        if self.path.endswith("/slow.onnx"):  # half now, the rest once the test has looked
            half = len(body) // 2
            self.wfile.write(body[:half])
            self.wfile.flush()
            self.release.wait(30)
            body = body[half:]
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_https_source_with_a_private_ca_and_a_bearer_token(
    digits_model: Path, tmp_path: Path, gateway_factory: Any
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    files = {"/m/digits.onnx": digits_model.read_bytes(), "/m/slow.onnx": digits_model.read_bytes()}
    release = threading.Event()
    handler = type("Files", (_Files,), {"files": files, "token": "t0k3n", "release": release})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ca_file = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        base = f"https://127.0.0.1:{server.server_address[1]}"
        cfg = {
            "gateway": {
                "model_cache_dir": str(tmp_path / "cache"),
                "model_sources": [
                    {
                        "prefix": f"{base}/m/",
                        "ca_file": str(ca_file),
                        "credentials_file": _secret_file(tmp_path / "http.secret", token="t0k3n"),
                    }
                ],
            },
            "services": [
                {"name": "digits", "processor": "onnx", "model": f"{base}/m/digits.onnx"},
                {"name": "absent", "processor": "onnx", "model": f"{base}/m/absent.onnx"},
            ],
            "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        }
        gw = gateway_factory(cfg)
        _wait_ready(gw, "digits")
        out = _infer(gw, "digits", [0.25] * 64)
        assert len(out["probabilities"]) == 10 and np.isclose(sum(out["probabilities"]), 1.0, atol=1e-4)
        wait_until(lambda: "HTTP 404" in gw.services()["absent"].get("reason", ""), 30, "absent's reason")
        reason = gw.services()["absent"]["reason"]
        assert reason == f"cannot fetch model {base}/m/absent.onnx: HTTP 404 Not Found", reason
        # A service created while the gateway runs, whose download is held half-way: its
        # reason says how far it is (the admin call answers once it is ready).
        admin = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1]
        spec = {"name": "slow", "processor": "onnx", "public": True, "model": f"{base}/m/slow.onnx"}
        create = urllib.request.Request(
            f"{admin}/admin/services",
            data=json.dumps(spec).encode(),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        )
        created: list[int] = []

        def post() -> None:
            with urllib.request.urlopen(create, timeout=60) as r:
                created.append(r.status)

        creator = threading.Thread(target=post)
        creator.start()
        size = len(files["/m/slow.onnx"])
        half, whole = f"{size // 2 / 1024:.1f} KiB", f"{size / 1024:.1f} KiB"
        shown = f"downloading model {base}/m/slow.onnx: {half} of {whole} (50%)"
        wait_until(lambda: gw.services().get("slow", {}).get("reason") == shown, 30, "slow's progress")
        release.set()
        creator.join(60)
        assert created == [201]
        _wait_ready(gw, "slow")
        assert "t0k3n" not in gw.output()
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_model_repository_in_a_bucket(
    s3: S3, digits_model: Path, tmp_path: Path, gateway_factory: Any
) -> None:
    doubling = tmp_path / "doubling.onnx"
    _doubling_model(doubling)
    s3.put("repo/digits/1/model.onnx", digits_model)
    s3.put("repo/digits/1/config.pbtxt", tmp_path / "doubling.onnx")  # not a model: left alone
    s3.put("repo/double.onnx", doubling)
    # Every runtime's files, picked by the rule serve --model uses: a LightGBM text model.
    from tests.e2e import estimator_models
    from tests.e2e.runtime_models import same

    built = estimator_models.build(tmp_path / "built")
    s3.put("repo/iris/1/model.txt", built["lightgbm"])
    s3.put("repo/iris/1/labels.txt", built["lightgbm"])  # beside a model.<ext>: left alone
    env = {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "EASGW_DATA_DIR": str(tmp_path / "data"),
    }
    args = ("--model-repository", f"s3://{BUCKET}/repo/", "--poll", "0.5")
    gw = gateway_factory({}, serve_args=args, env=env)
    _wait_ready(gw, "digits")
    _wait_ready(gw, "double")
    assert _infer(gw, "double", [1.0] * 64) == {"doubled": [2.0] * 64}
    assert set(_infer(gw, "digits", [1.0] * 64)) == {"label", "probabilities"}
    _wait_ready(gw, "iris")
    assert gw.services()["iris"]["processor"] == "lightgbm"
    x = estimator_models.features("lightgbm")
    body = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP64", "data": x.ravel().tolist()}]
    }
    req = urllib.request.Request(f"{gw.url}/v2/models/iris/infer", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        (out,) = json.loads(r.read())["outputs"]
    want = estimator_models.expected("lightgbm", built["lightgbm"], x)["predict"]
    same(np.asarray(out["data"]).reshape(out["shape"]), want, "iris.predict")
    # A new version folder in the bucket: the next scan rolls the service to it.
    s3.put("repo/digits/2/model.onnx", doubling)
    wait_until(
        lambda: "model repository s3://models/repo/: changed digits" in gw.output(), 30, "digits rolled"
    )
    assert _infer(gw, "digits", [1.0] * 64) == {"doubled": [2.0] * 64}
    assert (tmp_path / "data" / "models").is_dir()


def test_a_remote_worker_fetches_its_model_on_its_own_host(
    s3: S3, digits_model: Path, tmp_path: Path, gateway_factory: Any
) -> None:
    s3.put("remote/model.onnx", digits_model)
    token = "worker-secret-0123456789abcdef"
    service = {"name": "far", "processor": "onnx", "model": f"s3://{BUCKET}/remote/model.onnx"}
    service |= {"workers": 0, "remote_workers": {"token": token, "ttl_s": 3}}
    gw = gateway_factory(_config(s3, tmp_path, [service]))
    env = {
        **os.environ,
        "EAS_WORKER_TOKEN": token,
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    argv = [
        sys.executable, "-m", "gateway", "worker", "--gateway", gw.url, "--service", "far",
        "--host", "127.0.0.1", "--heartbeat", "0.3", "--model-cache-dir", str(tmp_path / "worker-cache"),
    ]  # fmt: skip
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(gw, "far")
        assert set(_infer(gw, "far", [1.0] * 64)) == {"label", "probabilities"}
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(15)
    (cached,) = (tmp_path / "worker-cache").glob("*/*/model.onnx")
    assert cached.read_bytes() == digits_model.read_bytes()
    assert not (tmp_path / "cache").exists()  # the gateway fetched nothing: the worker's host did
    assert "model s3://models/remote/model.onnx: downloading" in log.read_text()
