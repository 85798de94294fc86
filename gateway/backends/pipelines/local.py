"""A pipeline step's own ONNX model run in the gateway process (``placement: thread``).

The step's ``concurrency`` threads (one by default) each run the one ONNX Runtime session,
which releases the GIL while it computes, so the event loop keeps serving. The tensors
come from the earlier step and go to the next as they are: no encoding, no IPC, no copy
beyond a cast to the model's own input type. This is Paddle Serving's in-process
``local_predictor``; a step that needs isolation (a model that may crash or leak) keeps the
default ``placement: process`` and runs on worker processes of its own.

A step's model named by a URL is fetched first (:class:`FetchedModel`: gateway.sources, into
the gateway's download cache, as a service's model is) and loaded once it is on disk; until
then the step is not ready, and a fetch that fails is its reason, naming the URL without
credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gateway.backends.pipelines.runner import CallContext, StepFailed
from gateway.config.model_urls import ModelSource, redact_url
from gateway.sources import FetchCancelled, FetchError, Progress, fetch_model
from gateway.worker.ops import OpError
from gateway.worker.processors.onnx import ORT_DTYPES, ORT_TO_V2, open_session

log = logging.getLogger("gateway.pipelines")


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


class FetchedModel:
    """A :class:`LocalModel` whose file is fetched from its URL before it loads."""

    def __init__(self, local: LocalModel, sources: tuple[ModelSource, ...], cache_dir: str) -> None:
        self.local = local
        self.url = local.path
        self.sources = sources
        self.cache_dir = cache_dir
        self.progress = Progress(redact_url(local.path))
        self.error: str | None = None
        self.loaded = False
        self._cancel = threading.Event()
        self._done: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._fetch_then_load(), name=f"fetch-step-{self.local.step}")

    async def _fetch_then_load(self) -> None:
        assert self._done is not None
        try:
            fetched = await asyncio.to_thread(
                fetch_model, self.url, self.sources, self.cache_dir, self.progress, self._cancel
            )
            self.local.path = str(fetched.path)
            await asyncio.to_thread(self.local.load)
            self.loaded = True
        except FetchCancelled:
            return
        except FetchError as exc:
            self.error = str(exc)
        except Exception as exc:  # the file came but does not load
            self.error = f"cannot load model {self.progress.url}: {str(exc).splitlines()[0][:300]}"
        finally:
            self._done.set()
        if self.error is not None:
            log.error("pipeline step %s: %s", self.local.step, self.error)

    def reason(self) -> str:
        return self.error or self.progress.text()

    async def wait(self, timeout: float | None) -> bool:
        """Whether the model is loaded, waiting for the fetch at most ``timeout`` (None: until it ends)."""
        if self._done is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout)
        return self.loaded

    async def stop(self) -> None:
        self._cancel.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


__all__ = ["FetchedModel", "LocalModel"]
