"""The floor of any call at c=1 on this machine: the gateway's lean HTTP/1.1 front answering
each request at once with a small fixed JSON body, with nothing behind it.

No service, token, codec, model or metrics: what is left is the loopback round trip with
the client and the front's own parsing and writing. ``bench_runtimes.py`` measures it at
c=1 with the loop sleeping between calls and with it polling (``--busy-poll-us``, as the
gateway's ``busy_poll_us``), beside the gateway: the difference between the two is what
waking an idle loop costs each call, and the gateway's own added latency is measured from
this floor up.

Usage: python benchmarks/front_floor_server.py PORT [--busy-poll-us N]
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web

from gateway.lean_http import FastProtocol, FastRequest, Hooks, Limits, Query, Reply, protocol_factory

ANSWER = Reply(200, b'{"outputs":[]}', "application/json")


async def serve(req: FastRequest, query: Query) -> Reply:
    return ANSWER


async def main(port: int, busy_poll_us: int) -> None:
    runner = web.AppRunner(web.Application(), access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    conns: set[FastProtocol] = set()
    limits = Limits(1 << 20, busy_poll_s=busy_poll_us / 1e6)
    factory = protocol_factory(Hooks(serve), runner.server, conns, limits)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", port, reuse_address=True)
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    async with server:
        await stopped.wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--busy-poll-us", type=int, default=0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.port, args.busy_poll_us))
