"""AsyncPredictClient: many concurrent calls from one event loop."""

from __future__ import annotations

import asyncio
import time

from _common import DIGITS_INPUT, DIGITS_LABEL, digits, parse_args

from eas_sdk import AsyncPredictClient, TFRequest

args = parse_args(__doc__ or "")
images, labels = digits(64)


async def main() -> None:
    async with AsyncPredictClient(args.endpoint, args.service, token=args.token) as client:

        async def classify(i: int) -> int:
            request = TFRequest("serving_default")
            request.add_feed(DIGITS_INPUT, [1, 64], TFRequest.DT_FLOAT, images[i])
            request.add_fetch(DIGITS_LABEL)
            response = await client.predict(request)
            return int(response.to_numpy(DIGITS_LABEL)[0])

        start = time.perf_counter()
        predicted = await asyncio.gather(*(classify(i) for i in range(len(images))))
        elapsed = time.perf_counter() - start
        correct = sum(int(p == t) for p, t in zip(predicted, labels, strict=True))
        print(f"{len(images)} concurrent calls in {elapsed * 1000:.0f} ms, {correct}/{len(images)} correct")
        assert correct >= len(images) * 0.9


asyncio.run(main())
