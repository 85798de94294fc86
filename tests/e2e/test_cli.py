"""The eas-gateway CLI: start-up announcement, port file, config errors, clean stop."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from gateway.cli import main, write_port_file
from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, config_tokens, token_leaks

QUEUE_ONLY = {
    "gateway": {"shutdown_timeout_s": 5},
    "services": [{"name": "q", "processor": "queue", "workers": 0, "public": True}],
}


def test_start_announce_and_sigterm(gateway_factory: Any) -> None:
    gw = gateway_factory(QUEUE_ONLY)
    out = gw.output()
    assert re.search(rf"^gateway listening on http://127\.0\.0\.1:{gw.port}$", out, re.M), out
    assert (gw.workdir / "gateway.port").read_text() == f"127.0.0.1:{gw.port}\n"
    assert "event loop uvloop" in out  # uvloop is installed in the test environment
    assert gw.get_json("/readyz")[0] == 200
    assert gw.get_json("/healthz") == (200, {"status": "ok"})
    # Listens on loopback only.
    listening = [c for c in psutil.Process(gw.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    assert gw.stop(signal.SIGTERM) == 0
    assert "stopped" in gw.output()


def test_sigint_stops_cleanly(gateway_factory: Any) -> None:
    gw = gateway_factory(QUEUE_ONLY)
    assert gw.stop(signal.SIGINT) == 0


def test_ctrl_c_stops_a_gateway_with_workers_and_leaves_no_orphans(gateway_factory: Any) -> None:
    """Ctrl-C in a terminal signals the whole process group: the workers ignore SIGINT and the
    gateway stops them in order; none outlives it (not even re-parented to init)."""
    config = {
        "gateway": {"shutdown_timeout_s": 5},
        "services": [
            {"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY, "workers": 2},
            {"name": "q", "processor": "queue", "public": True, "workers": 0},
        ],
    }
    gw = gateway_factory(config)
    gw.wait_workers_ready("echo", 2)
    workers = [psutil.Process(pid) for pid in gw.worker_pids("echo")]
    assert len(workers) == 2 and all(w.ppid() == gw.pid for w in workers)
    os.killpg(gw.pid, signal.SIGINT)  # the gateway runs in its own session: pgid == pid
    assert gw.proc.wait(20) == 0, gw.output()[-2000:]
    _, alive = psutil.wait_procs(workers, timeout=1)  # reaped by the gateway before it exits
    assert not alive, [p.pid for p in alive]
    assert "SIGINT received" in gw.output()
    assert "Traceback" not in gw.output()


def test_json_logs(gateway_factory: Any) -> None:
    gw = gateway_factory(QUEUE_ONLY, extra_args=("--log-format", "json"))
    with urllib.request.urlopen(gw.url + "/healthz?token=query-secret-xyz", timeout=5) as r:
        assert r.status == 200
    assert gw.stop() == 0

    lines = [
        json.loads(line) for line in (gw.workdir / "stderr.log").read_text().splitlines() if line.strip()
    ]
    access = [rec for rec in lines if rec["logger"] == "gateway.access"]
    assert access and access[0]["path"] == "/healthz"  # no query string in the log
    assert "query-secret-xyz" not in (gw.workdir / "stderr.log").read_text()


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"gateway": {"port": "eighty"}, "services": []}, "gateway.port"),
        ({"services": [{"name": "x", "processor": "onnx", "public": True}]}, "services[0] (x).model"),
        (
            {"services": [{"name": "x", "processor": "onnx", "model": "no/such/model.onnx", "public": True}]},
            "services[0] (x).model: file not found: ",
        ),
        (
            {
                "services": [
                    {"name": "q", "processor": "queue", "public": True},
                    {"name": "p", "processor": "python", "entry": "no/such/processor.py:Cls", "public": True},
                ]
            },
            "services[1] (p).entry: file not found: ",
        ),
        ({"services": [{"name": "bad/name", "processor": "queue", "public": True}]}, "services[0].name"),
        ({"gateway": {"colour": "blue"}}, "gateway: unknown key 'colour' (line 2); allowed: "),
        ({"gateway": {"worker_host": "0.0.0.0"}}, "gateway.worker_advertise_host: required"),
        ({"gateway": {"worker_host": "10.1.2.3"}}, "gateway.worker_host: '10.1.2.3' is not a loopback"),
    ],
)
def test_config_errors_exit_2_naming_the_field(tmp_path: Path, config: dict[str, Any], field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _run_cli("serve", "--config", str(path), "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_errors_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(QUEUE_ONLY))
    assert main(["serve", "--config", str(path), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "--config", str(path), "--host", "0.0.0.0"]) == 2  # EASGW_LOOPBACK_ONLY=1
    assert "loopback" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["serve"])
    assert exc.value.code == 2


def test_port_file_is_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "port"
    write_port_file(str(target), "127.0.0.1", 1234)
    assert target.read_text() == "127.0.0.1:1234\n"
    assert [p.name for p in target.parent.iterdir()] == ["port"]


def test_readyz_turns_503_at_once_during_the_drain_delay(gateway_factory: Any) -> None:
    config = {**QUEUE_ONLY, "gateway": {"shutdown_timeout_s": 5, "drain_delay_s": 2.0}}
    gw = gateway_factory(config)
    assert gw.get_json("/readyz")[0] == 200
    os.kill(gw.pid, signal.SIGTERM)
    deadline = time.monotonic() + 1.5
    seen: list[int] = []
    while time.monotonic() < deadline and 503 not in seen:
        seen.append(gw.get_json("/readyz")[0])
        time.sleep(0.02)
    assert seen[-1] == 503, seen
    # Still serving (liveness and routes) while draining.
    assert gw.get_json("/healthz")[0] == 200
    assert gw.proc.wait(15) == 0
    assert "draining for 2 s" in gw.output()


def test_second_signal_cuts_the_drain_delay_short(gateway_factory: Any) -> None:
    config = {**QUEUE_ONLY, "gateway": {"shutdown_timeout_s": 5, "drain_delay_s": 30.0}}
    gw = gateway_factory(config)
    os.kill(gw.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "draining" not in gw.output():
        time.sleep(0.02)
    os.kill(gw.pid, signal.SIGINT)
    assert gw.proc.wait(15) == 0


def test_serve_model_makes_one_onnx_service_per_file(digits_model: Path, tmp_path: Path) -> None:
    from gateway.cli import _parser, build_config

    other = tmp_path / "other-name.onnx"
    other.write_bytes(digits_model.read_bytes())
    args = _parser().parse_args(["serve", "--model", str(digits_model), "-m", str(other), "--port", "0"])
    cfg = build_config(args)
    assert [(s.name, s.processor, s.model) for s in cfg.services] == [
        ("digits", "onnx", str(digits_model)),
        ("other-name", "onnx", str(other)),
    ]
    assert cfg.gateway.port == 0 and cfg.services[0].workers == 1 and not cfg.services[0].tokens
    with pytest.raises(SystemExit) as exc:  # a config file or models, not both and not neither
        _parser().parse_args(["serve", "--model", str(digits_model), "--config", "x.yaml"])
    assert exc.value.code == 2


def test_token_scan_finds_a_token_in_a_log(tmp_path: Path) -> None:
    config = {
        "services": [{"name": "a", "token": "leaky-token-123"}, {"name": "b", "tokens": ["other-token-9"]}]
    }
    tokens = config_tokens(config)
    assert tokens == ("leaky-token-123", "other-token-9")
    (tmp_path / "stderr.log").write_text("INFO all good\n")
    assert token_leaks([(tmp_path, tokens)]) == []
    (tmp_path / "stdout.log").write_text("DEBUG Authorization: leaky-token-123\n")
    assert token_leaks([(tmp_path, tokens)]) == [f"{tmp_path / 'stdout.log'}: lea..."]


@pytest.mark.parametrize(
    ("where", "setting"),
    [
        ("port", "--port or gateway.port"),
        ("grpc_port", "--grpc-port or gateway.grpc_port"),
        ("admin", "admin.port"),
    ],
)
def test_a_taken_port_is_named_with_its_setting_before_any_worker_starts(
    tmp_path: Path, where: str, setting: str
) -> None:
    """One line naming the address and what to change; no worker started only to be stopped."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        gateway: dict[str, Any] = {"port": 0, "data_dir": str(tmp_path / "data")}
        config: dict[str, Any] = {
            "gateway": gateway,
            "services": [
                {"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY, "workers": 2}
            ],
        }
        if where == "admin":
            config["admin"] = {"port": taken}
        else:
            gateway[where] = taken
        path = tmp_path / "services.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = _run_cli("serve", "--config", str(path))
    assert proc.returncode == 1, proc.stderr
    what = {"port": "the HTTP endpoint", "grpc_port": "the V2 gRPC endpoint", "admin": "the admin API"}[where]
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{taken} for {what}: " in errors[0], errors
    assert (
        f"the port is in use by another process: stop that process, or choose another port with {setting}"
        in errors[0]
    )
    assert "worker" not in proc.stderr and proc.stdout == "", proc.stderr


def test_a_v2_call_to_a_queue_says_it_is_not_served_over_v2(gateway_factory: Any) -> None:
    """Over REST and gRPC: the kind and what reaches it, not "not found"."""
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        grpc_port = free.getsockname()[1]
    gw = gateway_factory({**QUEUE_ONLY, "gateway": {**QUEUE_ONLY["gateway"], "grpc_port": grpc_port}})
    said = (
        "model 'q' is not served over V2: it is a queue service; call it over its queue: POST /api/predict/q"
    )
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0]}]}).encode()
    req = urllib.request.Request(gw.url + "/v2/models/q/infer", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info, urllib.request.urlopen(req, timeout=10):
        pass
    with info.value as answer:
        assert (answer.code, json.loads(answer.read())["error"]) == (404, said)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="q"), timeout=10)
        assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.NOT_FOUND, said)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="nothing"), timeout=10)
        assert failed.value.details() == "model 'nothing' not found"
    with (
        pytest.raises(urllib.error.HTTPError) as info,
        urllib.request.urlopen(gw.url + "/v2/models/nothing", timeout=10),
    ):
        pass
    with info.value as answer:
        assert answer.code == 404 and json.loads(answer.read())["error"] == "model 'nothing' not found"
