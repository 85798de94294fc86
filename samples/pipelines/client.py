"""Calls both sample pipelines (pipelines.yaml) the ways a client can: EAS (the SDK's
StringRequest JSON and TFRequest), KServe V2 and V1, Paddle Serving's feed/fetch and
key/value forms, and the feature model the image pipeline shares, called directly.

    python samples/pipelines/client.py [--endpoint http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from eas_sdk import PredictClient, StringRequest, TFRequest

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digit_pngs(n: int) -> tuple[list[bytes], list[int]]:
    """The first ``n`` of scikit-learn's bundled 8x8 digits drawn as 32x32 PNGs (dark ink on
    white paper, as a scan would be), and their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    pngs = []
    for image in data.images[:n]:
        grey = (255 - image * 255 / 16).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(grey).resize((32, 32), Image.Resampling.NEAREST).save(buf, "PNG")
        pngs.append(buf.getvalue())
    return pngs, data.target[:n].tolist()


def post(endpoint: str, path: str, doc: Any, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(  # noqa: S310 - the endpoint is the caller's
        endpoint + path, json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - the endpoint is the caller's
        return json.loads(resp.read())


def image_pipeline(endpoint: str) -> None:
    pngs, labels = digit_pngs(3)
    b64 = [base64.b64encode(p).decode() for p in pngs]
    with PredictClient(endpoint, "digits-pipeline") as client:
        # EAS JSON: images as base64 text.
        reply = json.loads(
            client.predict(StringRequest(json.dumps({"inputs": {"image": b64}}))).response_data
        )
        top1 = [row[0] for row in np.reshape(reply["outputs"]["classes"]["data"], (-1, 3)).tolist()]
        print("EAS JSON  : top-1", top1, "labels", labels)
        assert top1 == labels
        # EAS TFRequest: the PNG bytes themselves, as a DT_STRING tensor.
        request = TFRequest("serving_default")
        request.add_feed("image", [len(pngs)], TFRequest.DT_STRING, pngs)
        response = client.predict(request)
        print("EAS TF    : labels", [v.decode() for v in response.to_numpy("labels")[:, 0]])
        assert response.to_numpy("classes")[:, 0].tolist() == labels
    v2 = post(
        endpoint,
        "/v2/models/digits-pipeline/infer",
        {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [b64[0]]}]},
    )
    print("KServe V2 :", {o["name"]: o["data"] for o in v2["outputs"]})
    paddle = post(endpoint, "/digits-pipeline/prediction", {"feed": [{"image": b64[1]}], "fetch": ["labels"]})
    print("Paddle    :", paddle)
    assert paddle["result"]["labels"][0][0] == DIGIT_NAMES[labels[1]]
    # The feature model the pipeline's "features" step calls, called directly by its own clients.
    from sklearn.datasets import load_digits

    pixels = (load_digits().data[:1] / 16.0).tolist()
    features = post(
        endpoint, "/digits-features/prediction", {"feed": [{"pixels": pixels[0]}], "fetch": ["features"]}
    )
    print("features  : direct call,", len(features["result"]["features"][0]), "features")


def text_pipeline(endpoint: str) -> None:
    texts = ["great product love it", "terrible it broke after a day", "the box contains a cable"]
    with PredictClient(endpoint, "reviews") as client:
        reply = json.loads(
            client.predict(StringRequest(json.dumps({"inputs": {"text": texts}}))).response_data
        )
    print("EAS JSON  :", reply["outputs"]["label"]["data"])
    assert reply["outputs"]["label"]["data"] == ["positive", "negative", "neutral"]
    v1 = post(endpoint, "/v1/models/reviews:predict", {"instances": [{"text": texts[1]}]})
    print("KServe V1 :", v1["predictions"][0]["label"])
    kv = post(
        endpoint,
        "/reviews/prediction",
        {"key": ["text"], "value": [texts[0]]},
        {"X-Eas-Pipeline-Timings": "1"},
    )
    print("Paddle k/v:", kv)
    assert kv["err_no"] == 0 and kv["value"][kv["key"].index("label")] == "positive"


def _exit_if_tools_missing() -> None:
    """samples/build_models.py says what the samples extra would bring (loaded by its path)."""
    spec = importlib.util.spec_from_file_location(
        "_easkit_sample_models", Path(__file__).resolve().parents[1] / "build_models.py"
    )
    assert spec is not None and spec.loader is not None
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    samples.exit_if_tools_missing("pipelines/client.py", ("sklearn", "PIL"))


if __name__ == "__main__":
    _exit_if_tools_missing()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", default=os.environ.get("EAS_ENDPOINT", "http://127.0.0.1:8080"))
    args = parser.parse_args()
    image_pipeline(args.endpoint)
    text_pipeline(args.endpoint)
    print("both sample pipelines answered correctly")
