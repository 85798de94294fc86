"""Cluster Serving style client against an asynchronous service of the gateway.

Start a gateway with the sample model as an async service::

    python samples/build_cluster_serving_model.py
    cat > /tmp/cs.yaml <<'YAML'
    services:
      - name: cs
        processor: onnx
        model: samples/models/cluster_serving.onnx
        async: true
    YAML
    python -m gateway serve --config /tmp/cs.yaml --port 8080

then run ``python samples/cluster_serving_client.py [host:port]``.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eas_sdk import InputQueue, OutputQueue


def main(endpoint: str = "127.0.0.1:8080") -> None:
    image = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    from PIL import Image

    png = Path(tempfile.mkdtemp(prefix="cs-sample-")) / "sample.png"
    Image.fromarray(image).save(png)
    sparse = [np.array([[0, 1, 4], [0, 2, 5]]), np.array([101.0, 102.0, 103.0]), np.array([5, 10])]

    with InputQueue(endpoint=endpoint, name="cs") as iq, OutputQueue(endpoint=endpoint, name="cs") as oq:
        for i in range(3):
            iq.enqueue(
                f"instance-{i}",
                words=["hello", "world"],
                image={"path": str(png)},
                tensor=np.array([i, i + 1.0]),
                sparse=sparse,
            )
        result = None
        for _ in range(50):
            result = oq.query("instance-0", timeout="1s")
            if result is not None:
                break
        print("instance-0:", {k: v.tolist() for k, v in (result or {}).items() if k != "sparse_dense"})
        time.sleep(0.5)
        for uri, res in sorted(oq.dequeue().items()):
            print(uri, "tensor_x2 =", res["tensor_x2"].tolist())

    b64 = base64.b64encode(png.read_bytes()).decode()
    instance = {
        "words": ["come", "on"],
        "image": b64,
        "tensor": [1, 2],
        "sparse": {"shape": [5, 10], "data": [1.5], "indices": [[0, 0]]},
    }
    request = {"instances": [instance, instance]}
    with InputQueue(sync=True, frontend_url=f"http://{endpoint}", name="cs") as sync_q:
        resp = sync_q.predict(json.dumps(request))
        print("sync predict:", resp.status_code, resp.text[:200])


if __name__ == "__main__":
    main(*sys.argv[1:2])
