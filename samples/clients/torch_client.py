"""TorchRequest against the digits ONNX model: inputs and outputs by position."""

from __future__ import annotations

from _common import digits, parse_args

from eas_sdk import PredictClient, TorchRequest

args = parse_args(__doc__ or "")
images, labels = digits(4)

with PredictClient(args.endpoint, args.service, token=args.token) as client:
    request = TorchRequest()
    request.add_feed(0, images.shape, TorchRequest.DT_FLOAT, images)
    request.add_fetch(0)  # output 0: the label
    response = client.predict(request)
    predicted = response.to_numpy(0)
    print("labels   :", labels.tolist())
    print("predicted:", predicted.tolist())
    assert predicted.tolist() == labels.tolist()
