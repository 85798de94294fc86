"""Worker processes under the configured scheduling policy: SCHED_BATCH by default for every
thread of every worker (the event loop, the compute thread, the runtime's), the gateway itself
left as it was started; ``worker_scheduling: normal`` leaves workers as any process."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictClient, TFRequest
from tests.e2e.gateway_proc import digits_on_workers, thread_policies

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")

TOKEN = "sched-token-5b2e8c4f1a7d3096"


def _config(model: Path, **gateway: Any) -> dict[str, Any]:
    return {
        "gateway": gateway,
        "services": [digits_on_workers(model, TOKEN)],
    }


def _call(url: str) -> None:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, np.full((1, 64), 0.5, dtype=np.float32))
    with PredictClient(url, "digits", token=TOKEN) as client:
        assert client.predict(req).to_numpy("label").shape == (1,)


def test_workers_run_as_batch_by_default(gateway_factory: Any, digits_model: Path) -> None:
    gw = gateway_factory(_config(digits_model))
    gw.wait_workers_ready("digits", 2)
    _call(gw.url)  # every thread a call needs has started
    pids = gw.worker_pids("digits")
    assert len(pids) == 2
    for pid in pids:
        assert thread_policies(pid) == {os.SCHED_BATCH}, pid
    assert thread_policies(gw.pid) == {os.SCHED_OTHER}


def test_normal_leaves_workers_as_any_process(gateway_factory: Any, digits_model: Path) -> None:
    gw = gateway_factory(_config(digits_model, worker_scheduling="normal"))
    gw.wait_workers_ready("digits", 2)
    _call(gw.url)
    for pid in gw.worker_pids("digits"):
        assert thread_policies(pid) == {os.SCHED_OTHER}, pid
