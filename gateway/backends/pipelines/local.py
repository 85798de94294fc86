"""A pipeline step's own ONNX model run in the gateway process (``placement: thread``).

The step's ``concurrency`` threads (one by default) each run the one ONNX Runtime session,
which releases the GIL while it computes, so the event loop keeps serving. The tensors
come from the earlier step and go to the next as they are: no encoding, no IPC, no copy
beyond a cast to the model's own input type. This is Paddle Serving's in-process
``local_predictor``; a step that needs isolation (a model that may crash or leak) keeps the
default ``placement: process`` and runs on worker processes of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gateway.backends.pipelines.runner import CallContext, StepFailed
from gateway.worker.ops import OpError
from gateway.worker.processors.onnx import ORT_DTYPES, ORT_TO_V2, open_session


class LocalModel:
    def __init__(
        self,
        step: str,
        path: str,
        wanted: Sequence[str],
        threads: int,
        intra_op_threads: int,
        given: Sequence[str] = (),
    ) -> None:
        self.step = step
        self.given = list(given)  # the step's input names, when they are the model's (no op before it)
        self.path = path
        self.wanted = list(wanted) or None
        self.intra_op_threads = intra_op_threads
        self.threads = ThreadPoolExecutor(max(1, threads), thread_name_prefix=f"model-{step}")
        self.session: Any = None
        self.inputs: dict[str, np.dtype[Any] | None] = {}
        self.outputs: dict[str, str | None] = {}  # output name -> V2 datatype

    def load(self) -> None:
        """Open the session (blocking: call it off the event loop, once)."""
        self.session = open_session(self.path, self.intra_op_threads, label=f"pipeline step {self.step}")
        self.inputs = {a.name: ORT_DTYPES.get(a.type) for a in self.session.get_inputs()}
        for name in self.given:
            if name not in self.inputs:
                raise ValueError(
                    f"inputs.{name}: the model has no input {name!r}; its inputs: {', '.join(self.inputs)}"
                )
        for name in self.inputs if self.given else ():
            if name not in self.given:
                raise ValueError(f"inputs: the model's input {name!r} is not given")
        self.outputs = {o.name: ORT_TO_V2.get(o.type) for o in self.session.get_outputs()}
        names = list(self.outputs)
        missing = [w for w in self.wanted or () if w not in names]
        if missing:
            raise ValueError(
                f"outputs.{missing[0]}: the model has no output {missing[0]!r}; "
                f"its outputs: {', '.join(names)}"
            )

    def _run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        for name, want in self.inputs.items():
            if name not in feeds:
                raise OpError(f"the model's input {name!r} was not given; inputs: {', '.join(feeds)}", 500)
            arr = np.asarray(feeds[name])
            if want is not None and arr.dtype != want and arr.dtype.kind in "biuf" and want.kind in "biuf":
                arr = arr.astype(want)
            arrays[name] = arr
        try:
            results = self.session.run(self.wanted, arrays)
        except Exception as exc:  # the runtime refuses what it was given (a shape, a type)
            raise OpError(f"model run failed: {str(exc).splitlines()[0][:300]}", 400) from None
        names = self.wanted or [o.name for o in self.session.get_outputs()]
        return dict(zip(names, results, strict=True))

    async def __call__(self, feeds: Mapping[str, Any], ctx: CallContext) -> dict[str, np.ndarray]:
        if ctx.deadline <= time.monotonic():
            raise StepFailed(self.step, 504, "the request's time ran out before this step", "UpstreamTimeout")
        return await asyncio.get_running_loop().run_in_executor(self.threads, self._run, feeds)

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)


__all__ = ["LocalModel"]
