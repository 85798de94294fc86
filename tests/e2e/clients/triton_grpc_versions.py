"""``tritonclient.grpc`` 2.73 calling each version of a versioned model, with the client's
defaults; run by tests/e2e/test_kserve_clients_e2e.py under .venv-clients.

    python triton_grpc_versions.py HOST:PORT TOKEN OUT_DIR

Writes OUT_DIR/versions.json (metadata, readiness, the index, the unknown version's error)
and OUT_DIR/versions.npz (the numeric outputs of versions 1, 2 and the default, by name).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "mixed"


def inputs() -> list[grpcclient.InferInput]:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    n = np.array([[1, -2, 3, 1 << 40], [0, 5, -7, 9]], dtype=np.int64)
    s = np.array([["héllo"], ["wörld"]], dtype=object)
    out = []
    for name, arr, datatype in (("x", x, "FP32"), ("n", n, "INT64"), ("s", s, "BYTES")):
        t = grpcclient.InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def main() -> None:
    host, token, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    auth = {"authorization": f"Bearer {token}"}
    client = grpcclient.InferenceServerClient(host)
    meta = client.get_model_metadata(MODEL, headers=auth, as_json=True)
    results = {
        "versions": meta["versions"],
        "ready": {v: client.is_model_ready(MODEL, v, headers=auth) for v in ("1", "2", "")},
        "index": [
            (m.get("name"), m.get("version"), m.get("state"))
            for m in client.get_model_repository_index(headers=auth, as_json=True)["models"]
        ],
    }
    arrays = {}
    for version in ("1", "2", ""):
        answer = client.infer(MODEL, inputs(), model_version=version, headers=auth)
        for name in ("scores", "count"):
            arrays[f"{version or 'default'}/{name}"] = answer.as_numpy(name)
    try:
        client.infer(MODEL, inputs(), model_version="3", headers=auth)
    except InferenceServerException as exc:
        results["unknown_version"] = exc.status()
    (out_dir / "versions.json").write_text(json.dumps(results))
    np.savez(out_dir / "versions.npz", **arrays)


if __name__ == "__main__":
    main()
