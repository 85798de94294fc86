"""An async service's figures at scrape time: /metrics and /api/services (in process)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import parse_config
from tests.gateway.routes.inproc import InProcPool

PROCESSORS = Path(__file__).resolve().parents[2] / "processors"  # python processors loaded by path


async def test_dispatcher_and_queue_figures(tmp_path: Path) -> None:
    config = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path), "access_log": False},
            "services": [
                {
                    "name": "echo",
                    "processor": "python",
                    "entry": f"{PROCESSORS / 'slow_echo.py'}:SlowEcho",
                    "async": True,
                    "config": {"sleep_s": 0.0},
                    "public": True,
                }
            ],
        }
    )
    app = create_app(config, pool_factory=InProcPool)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        for i in range(5):
            resp = await client.post("/api/predict/echo", data=f"r{i}".encode())
            assert resp.status == 200, await resp.text()
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        listing: dict[str, Any] = {}
        while loop.time() < end:
            body = await (await client.get("/api/services")).json()
            listing = {s["name"]: s for s in body["services"]}["echo"]
            if listing["dispatcher"]["results_total"] == 5:
                break
            await asyncio.sleep(0.02)
        figures = listing["dispatcher"]
        assert (figures["results_total"], figures["errors_total"], figures["inflight"]) == (5, 0, 0), figures
        assert {"retries_total", "sink_full_waits", "ready_waits", "window"} <= set(figures)
        assert listing["queues"]["echo/sink"]["length"] == 5
        sink = listing["queues"]["echo/sink"]
        # The results' payload bytes, all held in memory (far below memory_bytes).
        assert sink["bytes"] > 0 and sink["memory_bytes"] == sink["bytes"], sink
        metrics = await (await client.get("/metrics")).text()
    for line in (
        'easgw_async_results_total{service="echo"} 5.0',
        'easgw_async_errors_total{service="echo"} 0.0',
        'easgw_async_retries_total{service="echo"} 0.0',
        'easgw_async_sink_full_waits_total{service="echo"} 0.0',
        'easgw_async_inflight{service="echo"} 0.0',
        'easgw_queue_consumers{queue="echo"} 1.0',  # the dispatcher
        'easgw_queue_consumers{queue="echo/sink"} 0.0',
        'easgw_queue_pending{queue="echo"} 0.0',
        'easgw_queue_length{queue="echo/sink"} 5.0',
        'easgw_queue_bytes{queue="echo"} 0.0',
        f'easgw_queue_bytes{{queue="echo/sink"}} {float(sink["bytes"])}',
        f'easgw_queue_memory_bytes{{queue="echo/sink"}} {float(sink["bytes"])}',
    ):
        assert line in metrics, line
