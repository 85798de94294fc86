"""KServe V2 (Open Inference Protocol) and V1 REST calls to the digits model, with plain HTTP
(docs/kserve.md): model metadata, V2 infer, V1 predict."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from _common import DIGITS_INPUT, DIGITS_LABEL, digits, parse_args

args = parse_args(__doc__ or "")
base = args.endpoint if args.endpoint.startswith("http") else "http://" + args.endpoint
images, labels = digits(3)


def call(path: str, doc: Any = None) -> Any:
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Authorization": args.token})  # noqa: S310
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (http URL built above)
        return json.loads(resp.read())


meta = call(f"/v2/models/{args.service}")
print("V2 metadata:", meta["inputs"], "->", [o["name"] for o in meta["outputs"]])
doc = {
    "id": "sample-1",
    "inputs": [
        {
            "name": DIGITS_INPUT,
            "shape": list(images.shape),
            "datatype": "FP32",
            "data": images.ravel().tolist(),
        }
    ],
    "outputs": [{"name": DIGITS_LABEL}],
}
answer = call(f"/v2/models/{args.service}/infer", doc)
print("V2 infer:", answer["outputs"][0])
assert answer["id"] == "sample-1" and answer["outputs"][0]["data"] == labels.tolist()

predictions = call(f"/v1/models/{args.service}:predict", {"instances": images.tolist()})["predictions"]
print("V1 predict labels:", [p[DIGITS_LABEL] for p in predictions])
assert [p[DIGITS_LABEL] for p in predictions] == labels.tolist()
