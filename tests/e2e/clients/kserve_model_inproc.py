"""Existing ``kserve.Model`` subclasses (tests/e2e/kserve_custom_model.py) served by the
gateway's real routes and its real ``python`` processor, in one process under .venv-clients,
where KServe 0.21 is (the gateway's own environment has not the kserve package); run by
tests/e2e/test_kserve_model_e2e.py.

    python kserve_model_inproc.py ROOT OUT_DIR

Writes OUT_DIR/results.json: each call's status and answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from gateway.config import Config, GatewayConfig, ServiceConfig  # noqa: E402
from gateway.fronts.routes import kserve, predict  # noqa: E402
from gateway.fronts.state import GATEWAY_KEY  # noqa: E402
from tests.gateway.parts import gateway_parts  # noqa: E402
from tests.gateway.routes.inproc import InProcPool  # noqa: E402

TOKEN = "kserve-model-token-61fa"
MODELS = ROOT / "tests" / "e2e" / "kserve_custom_model.py"


async def main(out_dir: Path) -> None:
    services = (
        ServiceConfig(
            name="scaler", processor="python", entry=f"{MODELS}:Scaler", token=TOKEN, config={"factor": 3.0}
        ),
        ServiceConfig(name="plain", processor="python", entry=f"{MODELS}:Plain", token=TOKEN),
    )
    gw = GatewayConfig()
    pools = {s.name: InProcPool(s, gw) for s in services}
    for pool in pools.values():
        await pool.start()
    app = web.Application()
    app[GATEWAY_KEY] = gateway_parts(Config(gw, services), pools, started=True)
    kserve.setup(app)
    predict.setup(app)
    results: dict[str, Any] = {}
    auth = {"Authorization": TOKEN}
    doc = {"instances": [[1, -2], [0.5, 0.5]]}
    v2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    calls = {
        "predict": ("/v1/models/scaler:predict", doc),
        "explain": ("/v1/models/scaler:explain", doc),
        "eas": ("/api/predict/scaler", doc),
        "bad_payload": ("/v1/models/scaler:predict", {"rows": []}),
        "no_explainer": ("/v1/models/plain:explain", doc),
        "v2": ("/v2/models/scaler/infer", v2),
        "no_token": ("/v1/models/scaler:predict", doc),
    }
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        for name, (path, body) in calls.items():
            resp = await client.post(path, json=body, headers={} if name == "no_token" else auth)
            results[name] = [resp.status, await resp.json(content_type=None)]
        resp = await client.get("/v1/models")
        results["models"] = await resp.json()
    for pool in pools.values():
        await pool.stop(1.0)
    (out_dir / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[2])))
