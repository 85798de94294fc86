"""What the queue store's memory of removed request ids costs a gateway: its RSS over puts
and deletes on one queue, printed every 10,000. It grows until the store remembers
``RECENT_LIMIT`` (100,000) removals and stays there; the soak's checker allows for it.

    .venv/bin/python -m tests.soak.remembered_ids [COUNT]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import psutil

from eas_sdk import QueueClient
from tests.e2e.gateway_proc import GatewayProcess

TOKEN = "remembered-ids-token-5e2b"


def main(count: int = 130_000) -> None:
    with tempfile.TemporaryDirectory() as work:
        service = {"name": "q", "processor": "queue", "token": TOKEN}
        gw = GatewayProcess.start({"services": [service]}, Path(work) / "gw")
        try:
            proc = psutil.Process(gw.pid)
            q = QueueClient(gw.endpoint, "q")
            q.set_token(TOKEN)
            q.init()
            base = proc.memory_info().rss
            for n in range(1, count + 1):
                index, _ = q.put(b"x")
                q.delete(index)
                if n % 10_000 == 0:
                    grown = (proc.memory_info().rss - base) / 2**20
                    print(
                        f"{n:>7} removed: RSS +{grown:5.1f} MB ({grown * 2**20 / min(n, 100_000):.0f} B each)"
                    )
            q.close()
        finally:
            gw.kill()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
