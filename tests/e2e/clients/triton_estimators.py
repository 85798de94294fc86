"""``tritonclient`` 2.73 (HTTP and gRPC, the clients' defaults) calling models of the
estimator runtimes; run by tests/e2e/test_estimators_e2e.py under .venv-clients.

    python triton_estimators.py HOST:PORT HOST:GRPC_PORT TOKEN IN_NPZ OUT_DIR

IN_NPZ holds one input array per model name. Writes OUT_DIR/results.json (each model's
metadata over HTTP and gRPC, and the error of a call with the wrong dtype) and
OUT_DIR/arrays.npz: ``<model>.<call>.<output>`` for the calls ``binary`` (HTTP, binary
tensors), ``json`` (HTTP, JSON tensors both ways) and ``grpc``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def main() -> None:
    http_host, grpc_host, token, in_npz, out_dir = sys.argv[1:6]
    bearer = {"Authorization": f"Bearer {token}"}
    with np.load(in_npz) as given:
        models = {name: given[name] for name in given.files}
    http = httpclient.InferenceServerClient(http_host)
    grpc = grpcclient.InferenceServerClient(grpc_host)
    results: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for model, x in models.items():
        meta = http.get_model_metadata(model, headers=dict(bearer))
        outputs = [o["name"] for o in meta["outputs"]]
        grpc_auth = {"authorization": bearer["Authorization"]}
        results[model] = {
            "metadata": meta,
            "grpc_metadata": grpc.get_model_metadata(model, headers=grpc_auth, as_json=True),
        }
        name, datatype = meta["inputs"][0]["name"], np_to_triton_dtype(x.dtype)
        for call, binary in (("binary", True), ("json", False)):
            t = httpclient.InferInput(name, list(x.shape), datatype)
            t.set_data_from_numpy(x, binary_data=binary)
            wanted = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
            answer = http.infer(model, [t], outputs=wanted, headers=dict(bearer))
            for o in outputs:
                arrays[f"{model}.{call}.{o}"] = answer.as_numpy(o)
        g = grpcclient.InferInput(name, list(x.shape), datatype)
        g.set_data_from_numpy(x)
        answer = grpc.infer(model, [g], headers=grpc_auth)
        for o in outputs:
            arrays[f"{model}.grpc.{o}"] = answer.as_numpy(o)
        # The wrong dtype: the other float width.
        wrong = x.astype(np.float32 if x.dtype == np.float64 else np.float64)
        t = httpclient.InferInput(name, list(x.shape), np_to_triton_dtype(wrong.dtype))
        t.set_data_from_numpy(wrong)
        try:
            http.infer(model, [t], headers=dict(bearer))
            results[model]["wrong_dtype"] = "succeeded"
        except InferenceServerException as exc:
            results[model]["wrong_dtype"] = f"{exc.status()} {exc.message()}"
    http.close()
    grpc.close()
    (Path(out_dir) / "results.json").write_text(json.dumps(results, default=str))
    np.savez(Path(out_dir) / "arrays.npz", **arrays)


if __name__ == "__main__":
    main()
