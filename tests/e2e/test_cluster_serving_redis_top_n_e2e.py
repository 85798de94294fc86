"""Cluster Serving's top-N answer on Redis, read by the real bigdl-serving 2.4.0 client: a
service whose ``cluster_serving.top_n`` is set answers each record with its most probable
classes as ``[[class, probability], ...]``, most probable first, as Cluster Serving's
``topN`` writes them; ``OutputQueue().query(...)`` and ``dequeue()`` read it unchanged.
Compared with ONNX Runtime's own probabilities.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.bigdl_reference import run_bigdl
from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.test_cluster_serving_redis_e2e import CLIENT_PRELUDE
from tests.redis_server import RedisServer

ROWS = np.random.default_rng(11).random((2, 64), dtype=np.float32) * 2
STREAM = "top_n_stream"


@pytest.fixture(scope="module")
def gateway(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, digits_model: Path
) -> Iterator[RedisServer]:
    with redis_server.client(0) as c:
        c.delete(STREAM)
    cs = {"redis": redis_server.url(0), "stream": STREAM, "top_n": 3, "top_n_output": "probabilities"}
    svc = {"name": "digits", "processor": "onnx", "model": str(digits_model), "cluster_serving": cs}
    gw = GatewayProcess.start({"services": [svc]}, tmp_path_factory.mktemp("cs-redis-top-n"))
    try:
        yield redis_server
    finally:
        gw.kill()


def test_the_real_client_reads_the_top_n_classes(gateway: RedisServer, digits_model: Path) -> None:
    code = (
        CLIENT_PRELUDE
        + f"""
iq = InputQueue(host="127.0.0.1", port=port, name="{STREAM}")
oq = OutputQueue(host="127.0.0.1", port=port, name="{STREAM}")
rows = np.array(json.loads(sys.argv[2]), dtype=np.float32)
for i, row in enumerate(rows):
    iq.enqueue(f"r{{i}}", input=row)
out = {{"r0": plain(wait(oq, "r0"))}}
end = time.monotonic() + 20
rest = {{}}
while "r1" not in rest and time.monotonic() < end:
    rest.update(oq.dequeue())
    time.sleep(0.02)
out.update({{k: plain(v) for k, v in rest.items()}})
print(json.dumps(out))
"""
    )
    out = run_bigdl(code, str(gateway.port), json.dumps(ROWS.tolist()))
    probabilities = ort.InferenceSession(str(digits_model)).run(["probabilities"], {"input": ROWS})[0]
    for i in range(2):
        got = np.asarray(out[f"r{i}"]["data"]).reshape(out[f"r{i}"]["shape"])
        assert got.shape == (3, 2)
        want = np.argsort(-probabilities[i].astype(np.float64), kind="stable")[:3]
        assert got[:, 0].astype(int).tolist() == want.tolist()  # the classes, most probable first
        np.testing.assert_allclose(got[:, 1], probabilities[i][want], rtol=1e-4, atol=1e-7)
