"""Run one of the EAS guide's demos (``eas_guide/*_demo.py``, as the guide prints them)
against this gateway, with the real ``eas-prediction`` client.

    python samples/runtimes/run_guide_demo.py samples/runtimes/eas_guide/tf_demo.py \\
        http://127.0.0.1:8080 [--calls 3]

The demo's code runs unchanged; two things around it differ from the guide's cloud: its
``PredictClient`` is given this endpoint instead of the guide's (masked) one, and the demo
stops after ``--calls`` predictions (the guide's loops run a million times). Its service
names and tokens are the guide's own: samples/runtimes/services.yaml serves those names
with those tokens. Run it with the interpreter that has ``eas-prediction`` (.venv-eas).
"""

from __future__ import annotations

import argparse
import runpy
import sys


class Enough(Exception):
    """The demo made the calls it was allowed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", help="a demo file, e.g. samples/runtimes/eas_guide/tf_demo.py")
    parser.add_argument("endpoint", help="this gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--calls", type=int, default=3, help="predictions before the demo stops")
    args = parser.parse_args()

    import eas_prediction

    guide_client = eas_prediction.PredictClient
    made = [0]

    class PredictClient(guide_client):  # type: ignore[misc,valid-type]
        def __init__(self, endpoint: str = "", service_name: str = "", custom_url: str = "") -> None:
            super().__init__(args.endpoint, service_name, custom_url)

        def predict(self, req):  # type: ignore[no-untyped-def]
            if made[0] >= args.calls:
                raise Enough
            made[0] += 1
            return super().predict(req)

    eas_prediction.PredictClient = PredictClient
    try:
        runpy.run_path(args.demo, run_name="__main__")
    except Enough:
        pass
    print(f"== {made[0]} prediction(s) made", flush=True)
    sys.exit(0 if made[0] else 1)


if __name__ == "__main__":
    main()
