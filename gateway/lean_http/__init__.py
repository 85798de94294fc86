"""A lean HTTP/1.1 front that answers simple requests itself and hands the rest to aiohttp.

Why: most of a small request's server CPU went into aiohttp's generic machinery
(request and response objects, header multidicts, routing, a task per message):
about 120 us per request on the benchmark machine against about 20 us for a bare
asyncio protocol. Users: the queue-only server (gateway/queue/server.py), the
gateway's listener (gateway/fronts/fast_front.py: plain queue and predict calls) and the
worker's direct-mode HTTP port (gateway/worker/serve.py). Each builds its listener
with :func:`protocol_factory` from a handler (``serve`` and the optional ``accept``,
``early`` and ``late`` hooks, the same checks as its aiohttp route), aiohttp's
``web.Server`` for everything else, and its :class:`Limits`.

* :mod:`.connection`: what a connection received and which request is in progress,
  without I/O; requests are parsed by httptools (llhttp), and only simple ones (see
  there) are answered here. Anything else (a WebSocket watch, a chunked body, HTTP/1.0,
  a malformed head, ...) switches the connection to aiohttp's own protocol with every
  byte of that request replayed, so aiohttp sees the connection as the client sent it.
* :mod:`.protocol`: the asyncio protocol that moves the bytes, runs the handlers (in
  order; pipelining is fine) and the deadlines: a request head must arrive within
  ``header_timeout`` (slowloris), an idle kept-alive connection is closed after
  ``keepalive_timeout``, and a body still incomplete ``body_timeout`` after its head is
  answered by ``late`` (a 408; without ``late`` the connection goes to aiohttp, which
  then times the body on its own). ``early`` may refuse a request whose head is in but
  whose body is not (a missing token: no body can fix it). Both answers close the
  connection after a lingering close.
* :mod:`.cork`: the answers of one event-loop turn are written together at its end, so a
  busy listener serves more requests per turn and per system call.
* :mod:`.spin`: busy polling (``busy_poll_us``): after an answer the loop polls for the next
  request for a while instead of sleeping, for callers one at a time.
* :mod:`.wire`: the request, reply and header types the handlers see.
"""

from gateway.lean_http.connection import (
    BODY,
    HAND_OVER,
    HEAD,
    IDLE,
    MAX_HEAD,
    Connection,
    Head,
    Ready,
    parse_head,
)
from gateway.lean_http.protocol import (
    HIGH_WATER,
    LINGER_S,
    FastProtocol,
    Handler,
    Hooks,
    Limits,
    close_all,
    protocol_factory,
)
from gateway.lean_http.wire import (
    Accept,
    Admit,
    Early,
    FastRequest,
    Headers,
    Late,
    Query,
    Reply,
    Serve,
    encode_reply,
    parse_query,
)

__all__ = [
    "BODY",
    "HAND_OVER",
    "HEAD",
    "HIGH_WATER",
    "IDLE",
    "LINGER_S",
    "MAX_HEAD",
    "Accept",
    "Admit",
    "Connection",
    "Early",
    "FastProtocol",
    "FastRequest",
    "Handler",
    "Head",
    "Headers",
    "Hooks",
    "Late",
    "Limits",
    "Query",
    "Ready",
    "Reply",
    "Serve",
    "close_all",
    "encode_reply",
    "parse_head",
    "parse_query",
    "protocol_factory",
]
