"""QueueClient as in the eas-prediction documentation's demo: one thread puts records, a watcher
receives and commits them.
"""

from __future__ import annotations

import threading

from _common import parse_args

from eas_sdk import QueueClient

args = parse_args(__doc__ or "", service="jobs")
N = 20

queue = QueueClient(args.endpoint, args.service)
queue.set_token(args.token)
queue.init()
request_ids: list[str] = []


def producer() -> None:
    for i in range(N):
        _index, request_id = queue.put(f"job {i}".encode())
        request_ids.append(request_id)


thread = threading.Thread(target=producer)
thread.start()
watcher = queue.watch(0, 5, auto_commit=True)
seen = []
for record in watcher.run():
    seen.append(record.tags["requestId"])
    print(f"received index {record.index}: {record.data!r}")
    if len(seen) == N:
        break
watcher.close()
thread.join()
assert sorted(seen) == sorted(request_ids)
print("every request id arrived; stream.length =", queue.attributes()["stream.length"])
