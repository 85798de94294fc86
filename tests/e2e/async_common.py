"""Helpers shared by the asynchronous inference end-to-end tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np

from eas_sdk._proto import tf_predict_pb2
from tests.e2e.gateway_proc import DIGITS_MODEL

REF_PUT = r"""
import json, sys
from eas_prediction import QueueClient, TFRequest
endpoint, name, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = json.loads(sys.stdin.read())
q = QueueClient(endpoint, name)
q.init()
out = []
for i, row in enumerate(rows):
    req = TFRequest('serving_default')
    req.add_feed('input', [1, 64], TFRequest.DT_FLOAT, row)
    index, rid = q.put(req.to_string(), tags={'row': str(first + i)})
    out.append(rid)
print(json.dumps(out))
"""


@cache
def digits_rows(n: int) -> np.ndarray:
    # 8x8 images scaled to [0, 1] (random ones: importing scikit-learn for its data set costs seconds).
    return np.random.default_rng(n).random((n, 64), dtype=np.float32)


def ort_probabilities(rows: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    _label, probs = sess.run(["label", "probabilities"], {"input": rows})
    return np.asarray(probs)


def tf_body(row: np.ndarray) -> bytes:
    from eas_sdk.requests import TFRequest

    req = TFRequest()
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, row.tolist())
    return bytes(req.to_string())


def tf_probabilities(body: bytes) -> np.ndarray:
    resp = tf_predict_pb2.PredictResponse()
    resp.ParseFromString(body)
    arr = resp.outputs["probabilities"]
    return np.asarray(arr.float_val, dtype=np.float32).reshape(list(arr.array_shape.dim))


class SinkCollector:
    """Watch a sink in a thread (our SDK's Watcher) and keep every frame it delivers."""

    def __init__(self, endpoint: str, name: str, window: int = 200) -> None:
        from eas_sdk import QueueClient

        self.client = QueueClient(endpoint, f"{name}/sink")
        self.client.init(uid="collector")
        self.watcher = self.client.watch(0, window, auto_commit=True)
        self.frames: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for f in self.watcher.run():
                tags = dict(f.tags)
                with self.lock:
                    self.frames.append((tags.get("requestId", ""), tags, bytes(f.data)))
        except BaseException as exc:  # closed by stop(), or a real failure reported by wait()
            self.error = exc

    def wait(self, count: int, timeout: float) -> list[tuple[str, dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.frames) >= count:
                    break
            time.sleep(0.02)
        with self.lock:
            return list(self.frames)

    def stop(self) -> None:
        self.watcher.close()
        self.client.close()
        self.thread.join(5)


def exactly_once(rids: Iterable[str], frames: list[tuple[str, dict[str, str], bytes]]) -> dict[str, Any]:
    """Map request id -> (tags, data), asserting each expected id appears exactly once."""
    want = list(rids)
    assert len(set(want)) == len(want), "put returned a request id twice"
    seen: dict[str, Any] = {}
    dups: list[str] = []
    for rid, tags, data in frames:
        if rid in seen:
            dups.append(rid)
        else:
            seen[rid] = (tags, data)
    assert not dups, f"{len(dups)} results delivered twice, e.g. {dups[:3]}"
    missing = set(want) - set(seen)
    extra = set(seen) - set(want)
    assert not missing, f"{len(missing)} accepted inputs have no result, e.g. {sorted(missing)[:3]}"
    assert not extra, f"{len(extra)} results for unknown request ids"
    return seen
