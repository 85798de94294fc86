"""``tritonclient.http`` and ``tritonclient.grpc`` calling service groups by name, with the
clients' defaults; run by tests/e2e/test_groups_protocols_e2e.py under .venv-clients.

    python triton_groups.py HTTP_HOST:PORT GRPC_HOST:PORT OUT_JSON

Writes, per client: each group's answer (``y``), its metadata and readiness, and the status
and message of the calls that must fail (members that disagree, a member with no V2 form, a
version path).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def failure(fn: Callable[[], Any]) -> list[str] | None:
    try:
        fn()
    except InferenceServerException as exc:
        return [str(exc.status()), exc.message()]
    return None


def run(client: Any, module: Any) -> dict[str, Any]:
    def inputs() -> list[Any]:
        t = module.InferInput("x", [1, 1], "FP32")
        t.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
        return [t]

    def metadata(name: str) -> dict[str, Any]:
        if module is grpcclient:
            return dict(client.get_model_metadata(name, as_json=True))
        return dict(client.get_model_metadata(name))

    out: dict[str, Any] = {}
    for group in ("to-a", "to-b"):
        out[group] = float(client.infer(group, inputs()).as_numpy("y").ravel()[0])
    meta = metadata("to-a")
    out["metadata"] = {"name": meta["name"], "inputs": [i["name"] for i in meta["inputs"]]}
    out["ready"] = client.is_model_ready("to-a")
    out["disagree"] = failure(lambda: metadata("differ"))
    out["no_v2"] = failure(lambda: client.infer("with-code", inputs()))
    out["version"] = failure(lambda: client.infer("to-a", inputs(), model_version="1"))
    return out


def main() -> None:
    http_url, grpc_url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    results = {
        "http": run(httpclient.InferenceServerClient(http_url), httpclient),
        "grpc": run(grpcclient.InferenceServerClient(grpc_url), grpcclient),
    }
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
