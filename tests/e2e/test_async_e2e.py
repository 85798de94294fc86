"""End to end: 2,000 records through an asynchronous ONNX service, from two different clients."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from eas_sdk import QueueClient
from tests.e2e.async_common import (
    REF_PUT,
    SinkCollector,
    digits_rows,
    exactly_once,
    ort_probabilities,
    tf_body,
    tf_probabilities,
)
from tests.e2e.gateway_proc import DIGITS_MODEL
from tests.eas_reference import run_reference

N_OURS = 1000
N_REF = 1000


def _config(workers: int = 2) -> dict[str, Any]:
    return {
        "services": [
            {
                "name": "digits",
                "processor": "onnx",
                "placement": "process",
                "model": str(DIGITS_MODEL),
                "workers": workers,
                "async": True,
            }
        ]
    }


def _put_ours(endpoint: str, rows: np.ndarray, first: int) -> list[str]:
    def put_slice(lo: int, hi: int) -> list[str]:
        q = QueueClient(endpoint, "digits")
        q.init()
        try:
            return [q.put(tf_body(rows[i]), {"row": str(first + i)})[1] for i in range(lo, hi)]
        finally:
            q.close()

    n = len(rows)
    with ThreadPoolExecutor(4) as ex:
        parts = list(ex.map(lambda k: put_slice(k * n // 4, (k + 1) * n // 4), range(4)))
    return [rid for part in parts for rid in part]


def test_two_thousand_records_exactly_once_with_onnxruntime_numbers(gateway_factory: Any) -> None:
    gw = gateway_factory(_config())
    gw.wait_workers_ready("digits", 2)
    rows = digits_rows(N_OURS + N_REF)
    want = ort_probabilities(rows)
    sink = SinkCollector(gw.endpoint, "digits")
    try:
        t0 = time.monotonic()
        ref = run_reference(
            REF_PUT,
            gw.endpoint,
            "digits",
            str(N_OURS),
            input_bytes=json.dumps(rows[N_OURS:].tolist()).encode(),
            timeout=50,
        )
        ours = _put_ours(gw.endpoint, rows[:N_OURS], 0)
        ref_ids = json.loads(ref.stdout)
        frames = sink.wait(N_OURS + N_REF, timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        sink.stop()
    assert sink.error is None, sink.error
    results = exactly_once(ours + ref_ids, frames)
    for rid, (tags, data) in results.items():
        assert tags["status"] == "200", (rid, tags, data[:200])
        row = int(tags["row"])
        got = tf_probabilities(data)
        np.testing.assert_allclose(got[0], want[row], rtol=1e-5, atol=1e-7)
    # Every input was committed: the input queue is empty, and the sink was consumed by the watcher.
    q = QueueClient(gw.endpoint, "digits")
    q.init()
    try:
        assert q.attributes()["stream.length"] == "0"
    finally:
        q.close()
    print(f"2,000 records put->result in {elapsed:.2f} s")


def test_sink_get_by_request_id_and_direct_predict_still_work(gateway_factory: Any) -> None:
    gw = gateway_factory(_config(workers=1))
    gw.wait_workers_ready("digits", 1)
    rows = digits_rows(3)
    q = QueueClient(gw.endpoint, "digits")
    q.init()
    sink = QueueClient(gw.endpoint, "digits/sink")
    sink.init()
    try:
        _idx, rid = q.put(tf_body(rows[0]))
        frames = []
        for _ in range(50):
            frames = sink.get(request_id=rid, timeout="1s", auto_delete=False)
            if frames:
                break
        assert len(frames) == 1 and frames[0].tags["requestId"] == rid
        np.testing.assert_allclose(
            tf_probabilities(bytes(frames[0].data))[0], ort_probabilities(rows[:1])[0], rtol=1e-5
        )
        # A bad record gives an error result (no retry loop), an empty one is still committed.
        _i, bad = q.put(b"definitely not a request")
        frames = []
        for _ in range(50):
            frames = sink.get(request_id=bad, timeout="1s", auto_delete=False)
            if frames:
                break
        assert frames and frames[0].tags["status"] == "400", frames
        deadline = time.monotonic() + 10
        while q.attributes()["stream.length"] != "0" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert q.attributes()["stream.length"] == "0"
        # Synchronous callers can still use the workers directly (direct mode).
        workers = gw.services()["digits"]["workers"]
        port = next(w["http_port"] for w in workers if w.get("state") == "ready")
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/predict/digits", data=tf_body(rows[1]), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            direct = tf_probabilities(r.read())
        np.testing.assert_allclose(direct[0], ort_probabilities(rows[1:2])[0], rtol=1e-5)
    finally:
        q.close()
        sink.close()
