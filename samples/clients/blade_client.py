"""BladeRequest against the digits ONNX model: inputs by name, outputs carry their batch size."""

from __future__ import annotations

from _common import DIGITS_INPUT, DIGITS_PROBABILITIES, digits, parse_args

from eas_sdk import BladeRequest, PredictClient

args = parse_args(__doc__ or "")
images, labels = digits(2)

with PredictClient(args.endpoint, args.service, token=args.token) as client:
    request = BladeRequest("serving_default")
    request.add_feed(DIGITS_INPUT, 2, [2, 64], BladeRequest.DT_FLOAT, images.ravel().tolist())
    request.add_fetch(DIGITS_PROBABILITIES, BladeRequest.DT_FLOAT)
    response = client.predict(request)
    probabilities = response.to_numpy(DIGITS_PROBABILITIES)
    print("shape:", response.get_tensor_shape(DIGITS_PROBABILITIES))
    print("argmax:", probabilities.argmax(axis=1).tolist(), "labels:", labels.tolist())
    assert probabilities.argmax(axis=1).tolist() == labels.tolist()
