"""InputQueue / OutputQueue against a real gateway with an asynchronous ONNX service.

The model (samples/build_cluster_serving_model.py) takes one input of each Cluster Serving
kind at once; each test varies one kind and checks the output that depends on it.
"""

from __future__ import annotations

import base64
import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictException
from eas_sdk.cluster_serving import InputQueue, OutputQueue
from tests.e2e.gateway_proc import GatewayProcess
from tests.eas_reference import ROOT

sys.path.insert(0, str(ROOT / "samples"))
from build_cluster_serving_model import build, reference

TOKEN = "cs-e2e-token"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("csgw")
    model = build(work / "models")
    gw = GatewayProcess.start(
        {
            "services": [
                {"name": "cs", "processor": "onnx", "model": str(model), "async": True, "token": TOKEN}
            ]
        },
        work / "gw",
    )
    try:
        gw.wait_workers_ready("cs", 1)
        yield gw
    finally:
        gw.kill()


@pytest.fixture
def queues(gateway: GatewayProcess) -> Iterator[tuple[InputQueue, OutputQueue]]:
    iq = InputQueue(endpoint=gateway.endpoint, name="cs", token=TOKEN)
    oq = OutputQueue(endpoint=gateway.endpoint, name="cs", token=TOKEN)
    try:
        oq.dequeue()  # start from an empty sink
        yield iq, oq
    finally:
        iq.close()
        oq.close()


def _png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (5, 7, 3), dtype=np.uint8)


SPARSE = [np.array([[0, 1, 4], [0, 2, 5]]), np.array([101.0, 102.0, 103.0]), np.array([5, 10])]
WORDS = ["hello", "world"]


def _inputs(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "words": WORDS,
        "image": {"b64": base64.b64encode(_png(_image(0))).decode()},
        "tensor": np.array([1.0, 2.0], dtype=np.float32),
        "sparse": SPARSE,
    }
    base.update(over)
    return base


def _query(oq: OutputQueue, uri: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = oq.query(uri, timeout="1s")
        if r is not None:
            return r
    raise AssertionError(f"no result for {uri}")


def _dense(sp: list[np.ndarray]) -> np.ndarray:
    out = np.zeros(tuple(sp[2]), dtype=np.float32)
    out[tuple(sp[0])] = sp[1]
    return out


def test_strings(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, oq = queues
    iq.enqueue("s1", **_inputs(words=["come", "on", "united", "city"]))
    assert _query(oq, "s1")["word_ids"].tolist() == [3, 4, 5, 0]


def test_image_path_and_b64(queues: tuple[InputQueue, OutputQueue], tmp_path: Path) -> None:
    iq, oq = queues
    img1, img2 = _image(1), _image(2)
    (tmp_path / "a.png").write_bytes(_png(img1))
    iq.enqueue("img-path", **_inputs(image={"path": str(tmp_path / "a.png")}))
    iq.enqueue("img-b64", **_inputs(image={"b64": base64.b64encode(_png(img2)).decode()}))
    ref1 = reference(np.array([WORDS]), img1[None], np.zeros((1, 2)), _coo())["image_mean"][0]
    ref2 = reference(np.array([WORDS]), img2[None], np.zeros((1, 2)), _coo())["image_mean"][0]
    np.testing.assert_allclose(_query(oq, "img-path")["image_mean"], ref1, rtol=1e-6)
    np.testing.assert_allclose(_query(oq, "img-b64")["image_mean"], ref2, rtol=1e-6)


def _coo() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.array([[0, 0, 0]]), np.array([0.0], dtype=np.float32), np.array([1, 5, 10])


def test_dense_tensor(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, oq = queues
    iq.enqueue("t-float", **_inputs(tensor=np.array([0.5, -4.25], dtype=np.float32)))
    iq.enqueue("t-int", **_inputs(tensor=np.array([3, 7])))  # ints feed the float input
    got = _query(oq, "t-float")
    assert isinstance(got["tensor_x2"], np.ndarray) and got["tensor_x2"].dtype == np.float32
    assert got["tensor_x2"].tolist() == [1.0, -8.5]
    assert _query(oq, "t-int")["tensor_x2"].tolist() == [6.0, 14.0]


def test_sparse_tensor(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, oq = queues
    sp = [np.array([[1, 3], [9, 0]]), np.array([7.5, -1.0]), np.array([5, 10])]
    iq.enqueue("sp", **_inputs(sparse=sp))
    np.testing.assert_array_equal(_query(oq, "sp")["sparse_dense"], _dense(sp))


def test_several_at_once_and_dequeue(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, oq = queues
    img = _image(9)
    uris = [f"inst-{i}" for i in range(5)]
    for i, uri in enumerate(uris):
        iq.enqueue(
            uri,
            words=["united", "hello"],
            image={"b64": base64.b64encode(_png(img)).decode()},
            tensor=np.array([i, i + 0.5], dtype=np.float32),
            sparse=SPARSE,
        )
    _query(oq, uris[-1])
    deadline = time.monotonic() + 10
    results: dict[str, Any] = {}
    while len(results) < len(uris) and time.monotonic() < deadline:
        results.update(oq.dequeue())
        time.sleep(0.05)
    assert sorted(results) == uris
    for i, uri in enumerate(uris):
        ref = reference(
            np.array([["united", "hello"]]),
            img[None],
            np.array([[i, i + 0.5]], dtype=np.float32),
            (
                np.array([[0, 0, 0], [0, 1, 2], [0, 4, 5]]),
                np.array([101, 102, 103], dtype=np.float32),
                np.array([1, 5, 10]),
            ),
        )
        assert set(results[uri]) == set(ref)
        for name, want in ref.items():
            np.testing.assert_allclose(results[uri][name], want[0], rtol=1e-6, err_msg=name)
    # dequeue removed them: nothing left to query or dequeue
    assert oq.query(uris[0]) is None
    assert oq.dequeue() == {}


def test_failed_inference_and_unknown_uri(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, oq = queues
    assert oq.query("never-enqueued") is None
    iq.enqueue("bad", **_inputs(tensor=np.array([1.0, 2.0, 3.0])))  # the model wants 2 values
    with pytest.raises(PredictException) as err:
        _query(oq, "bad")
    assert err.value.code == 400
    got = oq.dequeue()
    assert isinstance(got["bad"], PredictException)


def test_bad_enqueue_is_refused_client_side(queues: tuple[InputQueue, OutputQueue]) -> None:
    iq, _oq = queues
    with pytest.raises(ValueError, match="sparse indices"):
        iq.enqueue("x", sparse=[np.array([[0, 1, 2]]), np.array([1.0]), np.array([5, 10])])
    with pytest.raises(ValueError, match="image"):
        iq.enqueue("x", image={"b64": base64.b64encode(b"not an image").decode()})
    with pytest.raises(ValueError, match="at least one"):
        iq.enqueue("x")


def test_sync_predict_through_the_real_gateway(gateway: GatewayProcess) -> None:
    img = _image(4)
    inst = {
        "words": ["hello", "on"],
        "image": base64.b64encode(_png(img)).decode(),
        "tensor": [2, 3],
        "sparse": {"shape": [5, 10], "data": [6.5], "indices": [[4, 9]]},
    }
    with InputQueue(sync=True, frontend_url=gateway.url, name="cs", token=TOKEN) as iq:
        resp = iq.predict({"instances": [inst, inst]})
        assert resp.status_code == 200, resp.text
        preds = resp.json()["predictions"]
        assert len(preds) == 2
        assert preds[1]["word_ids"] == [1, 4] and preds[1]["tensor_x2"] == [4.0, 6.0]
        assert preds[0]["sparse_dense"][4][9] == 6.5
        bad = iq.predict('{"instances": [{"tensor": [1, 2]}]}')
        assert bad.status_code == 400 and set(bad.json()) == {"error"}
    # bare /predict: the only service is the default
    with InputQueue(sync=True, frontend_url=gateway.url, token=TOKEN) as iq:
        assert iq.predict({"instances": [inst]}).status_code == 200
