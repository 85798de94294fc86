"""``eas-gateway serve --paddle-config config.yml``: Paddle Serving's pipeline file, with an
ONNX model in place of its model folder and its Op class unchanged, answers the real
``PipelineClient`` on the file's ``rpc_port``; keys the gateway cannot honour are refused by
name before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from gateway.cli.paddle_config import translate
from gateway.config import ConfigError, parse_config
from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.test_paddle_pipeline_e2e import CLIENT, FEATURES, _model, _price
from tests.paddle_reference import run_paddle
from tests.redis_server import free_port

OPS = Path(__file__).resolve().parents[1] / "processors" / "paddle_ops.py"


def _config(folder: Path, rpc_port: int, **extra: object) -> dict[str, object]:
    (folder / "uci_housing_model").mkdir(exist_ok=True)
    _model(folder / "uci_housing_model" / "uci.onnx")  # paddle2onnx's file in the model folder
    return {
        "rpc_port": rpc_port, "http_port": 0, "worker_num": 2, "build_dag_each_worker": False,
        "dag": {"is_thread_op": False, "retry": 1, "use_profile": False},
        "op": {
            "uci": {
                "concurrency": 2, "timeout": -1, "retry": 1, "batch_size": 1, "op_class": f"{OPS}:UciOp",
                "request_keys": ["x", "mode"],
                "local_service_conf": {
                    "client_type": "local_predictor", "model_config": "uci_housing_model",
                    "fetch_list": ["price"], "device_type": 0, "devices": "", "thread_num": 1,
                },
            }
        },
        **extra,
    }  # fmt: skip


def test_the_file_starts_its_pipeline_for_the_pipeline_client(tmp_path: Path) -> None:
    rpc_port = free_port()
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(_config(tmp_path, rpc_port)), encoding="utf-8")
    gw = GatewayProcess.start(
        {}, tmp_path / "gw", serve_args=("--paddle-config", str(path), "--name", "uci"),
        env={"EASGW_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    try:
        gw.wait_workers_ready("uci-uci", 2)  # op.uci.concurrency workers for its model
        code = (
            CLIENT
            + f"""
call(feed_dict={{"x": np.array({FEATURES.tolist()}, dtype="float32"), "mode": "predict"}})
call(feed_dict={{"x": np.ones((1, 13), dtype="float32"), "mode": "refuse"}})
print(json.dumps(results))
"""
        )
        ok, refused = run_paddle(code, str(rpc_port))
    finally:
        gw.stop()
    assert ok["err_no"] == 0, ok
    np.testing.assert_allclose(ok["values"]["price"], _price(FEATURES), rtol=1e-5)
    assert refused["err_no"] == 5000 and "errcode 7" in refused["err_msg"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"dag": {"tracer": {"interval_s": 10}}}, "dag: tracer not supported"),
        ({"dag": {"use_profile": True}}, "dag.use_profile: True is not supported"),
        ({"op": {"uci": {"local_service_conf": {"client_type": "brpc"}}}}, "client_type: 'brpc'"),
        ({"op": {"uci": {"local_service_conf": {"use_mkldnn": True}}}}, "use_mkldnn not supported"),
        ({"op": {"uci": {"local_service_conf": {"device_type": 1}}}}, "device_type: 1 is not supported"),
        ({"op": {"uci": {"batch_size": 8}}}, "op.uci.batch_size: 8"),
        ({"op": {"uci": {"local_service_conf": {"model_config": "missing"}}}}, "is not an ONNX file"),
        ({"channel_size": 0}, "config.yml: channel_size not supported"),
        ({"worker_num": 0}, "worker_num: expected an integer of at least 1"),
    ],
)
def test_keys_it_cannot_honour_are_refused_by_name(
    tmp_path: Path, change: dict[str, object], named: str
) -> None:
    raw = _config(tmp_path, 0)
    for key, value in change.items():
        if key == "op":
            conf = raw["op"]["uci"]  # type: ignore[index]
            local = value["uci"].pop("local_service_conf", {})  # type: ignore[index]
            conf.update(value["uci"])  # type: ignore[index]
            conf["local_service_conf"].update(local)
        elif key == "dag":
            raw["dag"].update(value)  # type: ignore[attr-defined]
        else:
            raw[key] = value
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        translate(raw, tmp_path)


def test_build_dag_each_worker_gives_each_worker_its_models(tmp_path: Path) -> None:
    raw = _config(tmp_path, 0, build_dag_each_worker=True)
    cfg = parse_config(translate(raw, tmp_path, "uci"))
    workers = {s.name: s.workers for s in cfg.services}
    assert workers["uci-uci"] == 4  # worker_num x op concurrency
    (step,) = next(s for s in cfg.services if s.name == "uci").pipeline.steps  # type: ignore[union-attr]
    assert step.concurrency == 2 and [i.name for i in step.inputs] == ["x", "mode"]


def test_a_bad_file_is_a_config_error_at_start(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(_config(tmp_path, 0, dag={"tracer": {}})), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--paddle-config", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "dag: tracer not supported" in proc.stderr
