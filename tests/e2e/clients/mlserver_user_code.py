"""MLServer 1.7's V2 types and codecs calling user code (a ``python`` service that declares
its tensors): the request built with ``InferenceRequest`` and ``NumpyCodec``/``StringCodec``,
the answer read with ``InferenceResponse`` and the same codecs; run by
tests/e2e/test_user_code_models_e2e.py under .venv-mlserver.

    python mlserver_user_code.py BASE_URL TOKEN OUT_DIR
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import numpy as np
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


def main() -> None:
    base, token, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    x = np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.25]], dtype=np.float32)
    request = InferenceRequest(
        inputs=[NumpyCodec.encode_input("x", x), StringCodec.encode_input("tag", ["cat", "dög"])]
    )
    # StringCodec encodes a list as shape [2, 1]; the model declares tag as [-1].
    request.inputs[1].shape = [2]
    req = urllib.request.Request(
        f"{base}/v2/models/scorer/infer",
        data=request.model_dump_json(exclude_none=True).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        response = InferenceResponse.model_validate_json(r.read())
    outputs = {o.name: o for o in response.outputs}
    result = {
        "model_name": response.model_name,
        "score": NumpyCodec.decode_output(outputs["score"]).tolist(),
        "label": StringCodec.decode_output(outputs["label"]),
    }
    (out_dir / "mlserver.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
