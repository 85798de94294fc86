"""MLServer 1.7's V2 types and codecs against a running gateway: a request built with
``InferenceRequest`` and encoded with ``NumpyCodec``/``StringCodec``, the answer parsed with
``InferenceResponse`` and decoded with the same codecs; run by
tests/e2e/test_kserve_clients_e2e.py under .venv-mlserver.

    python mlserver_types.py BASE_URL TOKEN OUT_DIR
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import numpy as np
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse, RequestOutput


def main() -> None:
    base, token, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    n = np.array([[1, -2, 3, 1 << 40], [0, 5, -7, 9]], dtype=np.int64)
    request = InferenceRequest(
        id="mlserver-1",
        inputs=[
            NumpyCodec.encode_input("x", x),
            NumpyCodec.encode_input("n", n),
            StringCodec.encode_input("s", ["héllo", "wörld"]),
        ],
        outputs=[RequestOutput(name="scores"), RequestOutput(name="count"), RequestOutput(name="echo")],
    )
    # StringCodec encodes a list as shape [2]; the model takes [N, 1].
    request.inputs[2].shape = [2, 1]
    body = request.model_dump_json(exclude_none=True).encode()
    req = urllib.request.Request(
        f"{base}/v2/models/mixed/infer",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        response = InferenceResponse.model_validate_json(r.read())
    outputs = {o.name: o for o in response.outputs}
    result = {
        "id": response.id,
        "model_name": response.model_name,
        "model_version": response.model_version,
        "scores": NumpyCodec.decode_output(outputs["scores"]).tolist(),
        "count": NumpyCodec.decode_output(outputs["count"]).tolist(),
        "echo": StringCodec.decode_output(outputs["echo"]),
    }
    (out_dir / "results.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
