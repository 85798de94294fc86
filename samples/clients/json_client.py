"""StringRequest carrying the documented JSON form to the digits ONNX model (docs/processors.md)."""

from __future__ import annotations

import json

from _common import DIGITS_INPUT, DIGITS_LABEL, digits, parse_args

from eas_sdk import PredictClient, StringRequest

args = parse_args(__doc__ or "")
images, labels = digits(3)

with PredictClient(args.endpoint, args.service, token=args.token) as client:
    body = json.dumps({"inputs": {DIGITS_INPUT: images.tolist()}, "outputs": [DIGITS_LABEL]})
    response = client.predict(StringRequest(body))
    result = json.loads(response.response_data)
    print("JSON reply:", result)
    assert result["outputs"][DIGITS_LABEL]["data"] == labels.tolist()
