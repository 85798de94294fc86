"""KServe's ModelServer serving one ONNX model with ONNX Runtime: a benchmark competitor.

Run with the python of ``.venv-clients`` (kserve 0.21):
    python kserve_onnx.py --name digits --model PATH.onnx --port P
At its fastest settings: one uvicorn worker on uvloop, no gRPC server, no latency
logging, and its per-request access log off.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

V2_TYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
}


class OnnxModel(Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.session: ort.InferenceSession | None = None
        self.outputs: list[str] = []

    def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, opts, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return True

    def predict(self, payload: Any, headers: Any = None, response_headers: Any = None) -> InferResponse:
        assert isinstance(payload, InferRequest) and self.session is not None
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        arrays = self.session.run(self.outputs, feeds)
        outs = [
            InferOutput(name=n, shape=list(a.shape), datatype=V2_TYPES[a.dtype], data=a)
            for n, a in zip(self.outputs, arrays, strict=True)
        ]
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    args, _ = ap.parse_known_args()
    model = OnnxModel(args.name, args.model)
    model.load()
    server = ModelServer(
        http_port=args.port,
        workers=1,
        enable_grpc=False,
        enable_latency_logging=False,
        event_loop="uvloop",
    )
    for name in ("kserve", "kserve.trace", "uvicorn.access", "uvicorn"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([model])


if __name__ == "__main__":
    main()
