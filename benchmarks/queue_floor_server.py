"""The floor for the queue's HTTP calls on this machine: our lean HTTP/1.1 front with a
Python dict for a queue.

It speaks just enough of the EAS queue protocol for the SDK's put, get, commit and
attributes calls, with no storage, no token check, no consumer groups and no query
checks: what is left is the HTTP exchange itself (the client's and the server's side).
``bench_queue.py`` runs it beside the real server to show how far the protocol alone
is from Redis' RESP calls.

Usage: python benchmarks/queue_floor_server.py PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from aiohttp import web

from eas_sdk._core import constants as C
from eas_sdk._proto.queue_pb2 import DataFrameListProto
from gateway.lean_http import FastProtocol, FastRequest, Hooks, Limits, Query, Reply, protocol_factory

OK = Reply(200, b"OK")


class DictQueue:
    def __init__(self) -> None:
        self.records: dict[int, tuple[str, bytes]] = {}
        self.next_idx = 1

    async def serve(self, req: FastRequest, query: Query) -> Reply:
        if req.method == "POST":
            idx, self.next_idx = self.next_idx, self.next_idx + 1
            rid = str(uuid.uuid4())
            self.records[idx] = (rid, await req.read())
            return Reply(200, str(idx).encode(), "text/plain", {C.HEADER_QUEUE_REQUEST_ID: rid})
        args = dict(query)
        if req.method == "PUT":
            for i in args[C.Q_INDEXES].split(","):
                self.records.pop(int(i), None)
            return OK
        if C.Q_ATTRS in args:
            attrs = {"stream.length": str(len(self.records))}
            return Reply(200, json.dumps(attrs).encode(), "application/json")
        idx = int(args.get(C.Q_INDEX, "0"))
        out = DataFrameListProto()
        if idx in self.records:
            rid, data = self.records[idx]
            df = out.index.add()
            df.index = idx
            df.data = data
            df.tags[C.TAG_REQUEST_ID] = rid
            if args.get(C.Q_AUTO_DELETE, "true") == "true":
                del self.records[idx]
        return Reply(200, out.SerializeToString(), C.CONTENT_TYPE_PROTOBUF)


async def main(port: int) -> None:
    runner = web.AppRunner(web.Application(), access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    conns: set[FastProtocol] = set()
    factory = protocol_factory(Hooks(DictQueue().serve), runner.server, conns, Limits(1 << 20))
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1])))
