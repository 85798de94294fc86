"""The ceiling for a Python HTTP hop on this machine: aiohttp answering a fixed body.

It reads the request body (as a worker must) and returns 16 bytes, nothing else.
Usage: python benchmarks/hello_server.py PORT
"""

from __future__ import annotations

import sys

from aiohttp import web

BODY = b"0123456789abcdef"


async def handle(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/octet-stream")


def main() -> None:
    port = int(sys.argv[1])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
