"""CPU one value-dense Cluster Serving call costs when the model's signature refuses it.

The body: 950,001 strings for digits' float input (tests/e2e/test_hostile_e2e.py). Without
the model's signature the gateway parses it and sends it on, and the worker parses it again
before answering 400; with the signature the gateway refuses it, with the worker's message,
before it is built into a request. CPU time (time.process_time) per call, the median of
``--rounds``; run it on an otherwise idle machine for figures worth comparing.

    .venv/bin/python benchmarks/refusal_cpu.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"instances": [{"input": [' + b'"ab",' * 950_000 + b'"ab"]}]}'


def _cpu_ms(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.process_time()
        out = fn()
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from eas_sdk.codecs import eas
    from gateway.codecs.cluster_serving import ClusterServingRequestError, parse_request
    from gateway.config import ServiceConfig
    from gateway.worker.processors.onnx import OnnxProcessor

    model = ROOT / "samples" / "models" / "digits.onnx"
    if not model.exists():
        raise SystemExit(f"{model} is missing: run samples/build_models.py")
    processor = OnnxProcessor(ServiceConfig(name="digits", processor="onnx", model=str(model)))
    processor.load()
    signature = processor.metadata()

    def gateway(sig: Any) -> Any:
        try:
            return parse_request(BODY, signature=sig)
        except ClusterServingRequestError as exc:
            return exc

    sent_ms, batch = _cpu_ms(lambda: gateway(None), args.rounds)

    def worker() -> str:
        try:
            eas.bind_inputs(eas.decode_request(batch.body, "auto", None), processor.inputs)
        except eas.InvalidInput as exc:
            return exc.message
        raise AssertionError("the worker took the call")

    worker_ms, said = _cpu_ms(worker, args.rounds)
    refused_ms, refusal = _cpu_ms(lambda: gateway(signature), args.rounds)
    assert isinstance(refusal, ClusterServingRequestError) and str(refusal) == said, (refusal, said)
    print(f"sent on:  gateway {sent_ms:.0f} ms + worker {worker_ms:.0f} ms CPU, then 400 {said!r}")
    print(f"refused:  gateway {refused_ms:.0f} ms CPU, worker none, 400 {str(refusal)!r}")


if __name__ == "__main__":
    main()
