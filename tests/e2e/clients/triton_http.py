"""Every call a ``tritonclient.http`` 2.73 user makes, with the client's defaults, against a
running gateway; run by tests/e2e/test_kserve_clients_e2e.py under .venv-clients.

    python triton_http.py HOST:PORT TOKEN OUT_DIR

Writes OUT_DIR/results.json (answers of the non-inference calls, error messages) and
OUT_DIR/arrays.npz (every numeric inference result, by call and output name; BYTES results
are in results.json under "bytes").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODEL = "mixed"
OUTPUTS = ("scores", "count", "echo")


def inputs(binary: bool) -> list[httpclient.InferInput]:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    n = np.array([[1, -2, 3, 1 << 40], [0, 5, -7, 9]], dtype=np.int64)
    s = np.array([["héllo"], ["wörld"]], dtype=object)
    out = []
    for name, arr, datatype in (("x", x, "FP32"), ("n", n, "INT64"), ("s", s, "BYTES")):
        t = httpclient.InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr, binary_data=binary)
        out.append(t)
    return out


def main() -> None:
    host, token, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    bearer = {"Authorization": f"Bearer {token}"}

    class Auth(dict):  # a fresh headers dict per call: infer() writes its own headers into it
        def __init__(self) -> None:
            super().__init__(bearer)

    client = httpclient.InferenceServerClient(host)  # every setting at its default
    res: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready(MODEL, headers=Auth()),
        "model_ready_v1": client.is_model_ready(MODEL, "1", headers=Auth()),
        "server_metadata": client.get_server_metadata(),
        "model_metadata": client.get_model_metadata(MODEL, headers=Auth()),
        "model_metadata_v1": client.get_model_metadata(MODEL, "1", headers=Auth()),
        "model_config": client.get_model_config(MODEL, headers=Auth()),
        "repository_index": client.get_model_repository_index(headers=Auth()),
    }
    arrays: dict[str, np.ndarray] = {}

    def keep(call: str, result: httpclient.InferResult, names: tuple[str, ...] = OUTPUTS) -> None:
        res[f"{call}_response"] = result.get_response()
        for name in names:
            got = result.as_numpy(name)
            if got is None:
                continue
            if got.dtype == object:  # BYTES: kept as text, with the shape
                res.setdefault("bytes", {})[f"{call}.{name}"] = [
                    list(got.shape),
                    [b.decode() if isinstance(b, bytes) else b for b in got.ravel()],
                ]
            else:
                arrays[f"{call}.{name}"] = got

    # The defaults: binary tensors in, every output binary (binary_data_output) out.
    keep("binary", client.infer(MODEL, inputs(True), headers=Auth()))
    # JSON both ways.
    json_out = [httpclient.InferRequestedOutput(n, binary_data=False) for n in OUTPUTS]
    keep("json", client.infer(MODEL, inputs(False), outputs=json_out, headers=Auth()))
    # gzip both ways.
    keep(
        "gzip",
        client.infer(
            MODEL,
            inputs(True),
            headers=Auth(),
            request_compression_algorithm="gzip",
            response_compression_algorithm="gzip",
        ),
    )
    # A subset of the outputs, in the order asked.
    subset = [httpclient.InferRequestedOutput("echo"), httpclient.InferRequestedOutput("count")]
    keep("subset", client.infer(MODEL, inputs(True), outputs=subset, headers=Auth()), ("echo", "count"))
    # The classification extension.
    top = [httpclient.InferRequestedOutput("scores", class_count=2)]
    keep("classes", client.infer(MODEL, inputs(True), outputs=top, headers=Auth()), ("scores",))
    # Each version, and the version an answer names.
    for version in ("1", "2"):
        keep(f"v{version}", client.infer(MODEL, inputs(True), model_version=version, headers=Auth()))
    res["statistics"] = client.get_inference_statistics(MODEL, headers=Auth())
    res["statistics_v1"] = client.get_inference_statistics(MODEL, "1", headers=Auth())
    errors: dict[str, str] = {}
    for call, fn in (
        ("no_token", lambda: client.infer(MODEL, inputs(True))),
        ("unknown_model", lambda: client.get_model_metadata("nope", headers=Auth())),
        ("unknown_version", lambda: client.infer(MODEL, inputs(True), model_version="9", headers=Auth())),
    ):
        try:
            fn()
            errors[call] = "succeeded"
        except InferenceServerException as exc:
            errors[call] = f"{exc.status()} {exc.message()}"
    res["errors"] = errors
    client.close()
    (out_dir / "results.json").write_text(json.dumps(res, default=str))
    np.savez(out_dir / "arrays.npz", **arrays)


if __name__ == "__main__":
    main()
