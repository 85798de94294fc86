"""Configuring and starting the gRPC endpoint."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
import yaml

from gateway.cli import _parser, build_config, main
from gateway.config import ConfigError, parse_config
from gateway.fronts.grpc.server import listen_address
from tests.gateway.front.fakes import live_gateway


def test_grpc_port_from_config_and_command_line(tmp_path: Path) -> None:
    assert parse_config({}).gateway.grpc_port == 0  # off unless asked for
    assert parse_config({"gateway": {"grpc_port": 8081}}).gateway.grpc_port == 8081
    with pytest.raises(ConfigError, match=r"gateway\.grpc_port: must be <= 65535"):
        parse_config({"gateway": {"grpc_port": 70000}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"gateway": {"grpc_port": 8081}}))
    args = _parser().parse_args(["serve", "--config", str(path), "--grpc-port", "9001"])
    assert build_config(args).gateway.grpc_port == 9001
    args = _parser().parse_args(["serve", "--config", str(path), "--grpc-port", "0"])
    assert build_config(args).gateway.grpc_port == 0
    assert main(["serve", "--config", str(path), "--grpc-port", "70000"]) == 2


def test_listen_address() -> None:
    assert listen_address("127.0.0.1", 8081) == "127.0.0.1:8081"
    assert listen_address("::1", 8081) == "[::1]:8081"


async def test_a_port_in_use_fails_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{port}"):
            async with live_gateway(grpc_port=port):
                pass  # pragma: no cover


def test_a_grpc_port_without_grpcio_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"gateway": {"grpc_port": 8081}}))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"needs grpcio: pip install 'easkit\[grpc\]'"):
        build_config(_parser().parse_args(["serve", "--config", str(path)]))
    # Off: nothing to install.
    assert build_config(_parser().parse_args(["serve", "--config", str(path), "--grpc-port", "0"]))
