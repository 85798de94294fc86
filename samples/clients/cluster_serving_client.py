"""Cluster Serving style client against the asynchronous ``cs`` service of samples/services.yaml.

``InputQueue.enqueue`` puts instances (strings, an image, a dense and a sparse tensor) on the
service's input queue; the gateway's dispatcher runs them through the model and
``OutputQueue.query``/``dequeue`` read the results from the sink. ``InputQueue(sync=True)``
calls the synchronous ``POST /predict`` JSON path. Run with ``--endpoint http://host:port``.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import need, parse_args

from eas_sdk import InputQueue, OutputQueue


def main(endpoint: str, token: str) -> None:
    image = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    need("PIL")
    from PIL import Image

    png = Path(tempfile.mkdtemp(prefix="cs-sample-")) / "sample.png"
    Image.fromarray(image).save(png)
    sparse = [np.array([[0, 1, 4], [0, 2, 5]]), np.array([101.0, 102.0, 103.0]), np.array([5, 10])]

    with (
        InputQueue(endpoint=endpoint, name="cs", token=token) as iq,
        OutputQueue(endpoint=endpoint, name="cs", token=token) as oq,
    ):
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
        assert result is not None, "no result for instance-0"
        print("instance-0:", {k: v.tolist() for k, v in result.items() if k != "sparse_dense"})
        results: dict = {}
        deadline = time.monotonic() + 10
        while len(results) < 3 and time.monotonic() < deadline:
            results.update(oq.dequeue())
            time.sleep(0.1)
        for uri, res in sorted(results.items()):
            print(uri, "tensor_x2 =", res["tensor_x2"].tolist())
        assert sorted(results) == ["instance-0", "instance-1", "instance-2"]

    b64 = base64.b64encode(png.read_bytes()).decode()
    instance = {
        "words": ["come", "on"],
        "image": b64,
        "tensor": [1, 2],
        "sparse": {"shape": [5, 10], "data": [1.5], "indices": [[0, 0]]},
    }
    request = {"instances": [instance, instance]}
    with InputQueue(sync=True, frontend_url=f"http://{endpoint}", name="cs", token=token) as sync_q:
        resp = sync_q.predict(json.dumps(request))
        print("sync predict:", resp.status_code, resp.text[:200])
        assert resp.status_code == 200, resp.text


if __name__ == "__main__":
    args = parse_args(__doc__ or "", service="cs")
    main(args.endpoint.removeprefix("http://"), args.token)
