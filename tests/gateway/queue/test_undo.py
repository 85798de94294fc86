"""A full database (SQLite's own SQLITE_FULL, from ``PRAGMA max_page_count``) through the
gateway: the put and the commit that cannot be written answer 507 and change nothing,
/readyz reports the store until a write succeeds again. (Every refused removal, on both
backends and across a restart: test_backend_conformance.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from eas_sdk.errors import HTTPStatusError
from eas_sdk.queue import AsyncQueueClient
from gateway.app import create_app
from gateway.config import parse_config
from gateway.fronts.state import GATEWAY_KEY
from tests.e2e.queue.server_proc import TOKEN

N = 600  # records both groups hold


async def _ready(http: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
    r = await http.get("/readyz")
    return r.status, await r.json()


async def test_a_full_database_answers_507_changes_nothing_and_shows_in_readyz(tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path), "access_log": False},
            "services": [{"name": "jobs", "processor": "queue", "token": TOKEN}],
        }
    )
    app = create_app(cfg)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as http:
        qm: Any = app[GATEWAY_KEY].queues
        q = qm.queue("jobs")
        async with AsyncQueueClient(f"127.0.0.1:{http.port}", "jobs") as client:
            client.set_token(TOKEN)
            client.set_retry_count(0)
            client.init(gid="g1")
            for _ in range(N):
                await q.put(b"r", {}, None)[2]
            for gid in ("g1", "g2"):  # two groups: a commit by one is written as acks
                c, dur = q.connect(gid, "u-" + gid, 0, N, False, {})
                await dur
                q.take(c)
            conn = qm.backend._conn
            conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
            try:
                with pytest.raises(HTTPStatusError) as info:
                    for _ in range(N):  # until the pages there are hold no more
                        await client.put(b"r")
                assert info.value.code == 507 and "database or disk is full" in str(info.value)
                length = q.length
                with pytest.raises(HTTPStatusError) as info:
                    await client.commit(list(range(1, N + 1)))  # N acks need pages of their own
                assert info.value.code == 507
                g1 = q.groups["g1"]
                assert (len(g1.pending), g1.committed, q.length) == (N, set(), length)
                assert len(g1.consumers["u-g1"].pending) == N
                status, doc = await _ready(http)
                assert status == 503 and not doc["ready"]
                assert doc["storage"] == "queue store refuses writes: sqlite: database or disk is full"
                r = await http.get("/readyz", params={"service": "jobs"})
                assert r.status == 503 and (await r.json())["reason"] == doc["storage"]
            finally:
                conn.execute("PRAGMA max_page_count = 1073741823")
            await client.commit(list(range(1, N + 1)))
            assert await _ready(http) == (200, {"ready": True, "services": {"jobs": True}})
            assert len(q.groups["g1"].committed) == N
