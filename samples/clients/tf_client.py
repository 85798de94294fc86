"""TFRequest against the digits ONNX model: numpy in, numpy out, HMAC-signed token."""

from __future__ import annotations

from _common import DIGITS_INPUT, DIGITS_LABEL, DIGITS_PROBABILITIES, digits, parse_args

from eas_sdk import PredictClient, TFRequest

args = parse_args(__doc__ or "")
images, labels = digits(4)

with PredictClient(args.endpoint, args.service, token=args.token) as client:
    request = TFRequest("serving_default")
    request.add_feed(DIGITS_INPUT, images.shape, TFRequest.DT_FLOAT, images)  # numpy array, any shape
    response = client.predict(request)
    predicted = response.to_numpy(DIGITS_LABEL)
    probabilities = response.to_numpy(DIGITS_PROBABILITIES)
    print("labels     :", labels.tolist())
    print("predicted  :", predicted.tolist())
    print("confidence :", probabilities.max(axis=1).round(3).tolist())
    print("shape of probabilities:", response.get_tensor_shape(DIGITS_PROBABILITIES))
    assert predicted.tolist() == labels.tolist()

    # Only the label, selected with add_fetch (the output_filter).
    request = TFRequest("serving_default")
    request.add_feed(DIGITS_INPUT, [1, 64], TFRequest.DT_FLOAT, images[0].tolist())  # plain lists still work
    request.add_fetch(DIGITS_LABEL)
    print("first image, label only:", list(client.predict(request).get_values(DIGITS_LABEL)))
