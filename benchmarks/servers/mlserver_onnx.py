"""An MLServer runtime serving one ONNX model with ONNX Runtime: a benchmark competitor.

``bench_servers.py`` writes MLServer's settings next to it (``parallel_workers: 0``,
gzip and metrics off) and starts ``mlserver start`` from ``.venv-mlserver``, which has
httptools, so its uvicorn does not fall back to the pure-Python h11 parser.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        uri = self.settings.parameters.uri if self.settings.parameters else None
        self._session = ort.InferenceSession(str(uri), opts, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        arrays = self._session.run(self._outputs, feeds)
        outputs = [NumpyCodec.encode_output(n, a) for n, a in zip(self._outputs, arrays, strict=True)]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
