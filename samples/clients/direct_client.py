"""Direct (VPC-style) mode: the client asks the gateway for the workers and calls them itself."""

from __future__ import annotations

from _common import DIGITS_INPUT, DIGITS_LABEL, digits, parse_args

from eas_sdk import ENDPOINT_TYPE_DIRECT, PredictClient, TFRequest

args = parse_args(__doc__ or "")
images, labels = digits(8)

client = PredictClient(args.endpoint, args.service)
client.set_endpoint_type(ENDPOINT_TYPE_DIRECT)
client.set_token(args.token)
client.init()
correct = 0
try:
    for image, label in zip(images, labels, strict=True):
        request = TFRequest("serving_default")
        request.add_feed(DIGITS_INPUT, [1, 64], TFRequest.DT_FLOAT, image)
        request.add_fetch(DIGITS_LABEL)
        predicted = int(client.predict(request).to_numpy(DIGITS_LABEL)[0])
        print(f"label {label} -> predicted {predicted}")
        correct += int(predicted == label)
finally:
    client.destroy()
print(f"{correct}/{len(labels)} correct through the workers' own endpoints")
assert correct >= len(labels) - 2  # the sample model is a small logistic regression
