"""StringRequest against the echo Python processor, with the classic setter-style API.

This is the pattern of Alibaba's eas-prediction documentation, unchanged except for the
import line.
"""

from __future__ import annotations

from _common import parse_args

from eas_sdk import PredictClient, StringRequest

args = parse_args(__doc__ or "", service="echo")

client = PredictClient(args.endpoint, args.service)
client.init()

request = StringRequest("hello from eas_sdk")
for _ in range(3):
    response = client.predict(request)
    print("echo replied:", response.response_data)
assert response.response_data == b"hello from eas_sdk"
client.destroy()
