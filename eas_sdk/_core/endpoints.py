"""Where requests go: gateway URL rules, direct-mode discovery and weighted round robin.

I/O-free. The clients fetch the discovery document themselves and hand the body
to :func:`parse_discovery`; :class:`EndpointSet` then holds the current list.

Gateway mode
  * ``custom_url`` non-empty: that exact string is the request URL.
  * else the endpoint gets ``http://`` prepended unless it already has a scheme
    (``http://`` or ``https://``; the reference client breaks https endpoints by
    prepending anyway), and one trailing ``/`` is removed.
  * an empty endpoint means "inside EAS": ``http://<service name up to '/', with
    '_' -> '-'>.<$NAMESPACE>:8080``, or an error when NAMESPACE is unset.
  * request URL: ``<endpoint>/api/predict/<service_name>`` (the name may hold ``/``).

Direct mode
  * discovery: ``GET <scheme>://<host>/api/v1/servicediscovery/upstreams/<service
    name up to '/'>``, plus ``?internal=true`` when both NAMESPACE and POD_NAME are
    set in the environment.
  * body: ``{"endpoints": {"items": [{"ip": str, "port": int|str, "weight": int}]}}``.
  * selection: interleaved weighted round robin in the order of the response;
    A=3, B=1, C=2 gives A A C A B C, then repeats. Weight 0 is never picked.
  * requests go to ``http://<ip>:<port>/api/predict/<service_name>``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

from ..errors import NoEndpointError, PredictException
from .constants import DISCOVERY_PATH_PREFIX, PREDICT_PATH_PREFIX

DISCOVERY_INTERVAL = 3.0  # seconds between discovery refreshes
FIRST_DISCOVERY_WAIT = 5.0  # how long a first call waits for the first list


@dataclass(frozen=True, order=True)
class Endpoint:
    """One backend instance (direct mode)."""

    host: str
    port: int
    weight: int = 1

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def normalize_gateway_endpoint(endpoint: str, service_name: str, env: Mapping[str, str] | None = None) -> str:
    """Base URL of the gateway (no trailing slash)."""
    if not endpoint:
        namespace = _env(env).get("NAMESPACE")
        if not namespace:
            raise PredictException(500, "'endpoint' must be set when running outside eas service")
        host = service_name.split("/", 1)[0].replace("_", "-")
        endpoint = f"{host}.{namespace}:8080"
    if not endpoint.startswith(("http://", "https://")):
        endpoint = "http://" + endpoint
    if endpoint.endswith("/"):
        endpoint = endpoint[:-1]
    return endpoint


def predict_url(base_url: str, service_name: str) -> str:
    return f"{base_url}{PREDICT_PATH_PREFIX}{service_name}"


def discovery_url(endpoint: str, service_name: str, env: Mapping[str, str] | None = None) -> str:
    """URL of the service-discovery document for direct mode."""
    if not endpoint:
        raise PredictException(500, "'endpoint' must be set for direct mode (the discovery address)")
    scheme = "http"
    if endpoint.startswith("https://"):
        scheme, endpoint = "https", endpoint[len("https://") :]
    elif endpoint.startswith("http://"):
        endpoint = endpoint[len("http://") :]
    endpoint = endpoint.rstrip("/")
    service = service_name.split("/", 1)[0]
    e = _env(env)
    internal = e.get("NAMESPACE") is not None and e.get("POD_NAME") is not None
    query = "?internal=true" if internal else ""
    return f"{scheme}://{endpoint}{DISCOVERY_PATH_PREFIX}{service}{query}"


class DiscoveryError(ValueError):
    """The discovery document is malformed; the previous list should be kept."""


def _parse_port(value: object) -> int:
    if isinstance(value, bool):
        raise DiscoveryError("port must be an int or a decimal string")
    if isinstance(value, int):
        port = value
    elif isinstance(value, str) and value.strip().isdigit():
        port = int(value.strip())
    else:
        raise DiscoveryError("port must be an int or a decimal string")
    if not 0 < port < 65536:
        raise DiscoveryError(f"port out of range: {port}")
    return port


def parse_discovery(body: bytes | str) -> list[Endpoint]:
    """Endpoints from a discovery response body, in response order.

    Raises DiscoveryError for anything malformed (bad JSON, a missing key, a
    non-string ip, a weight that is not a non-negative int): the whole document is
    rejected so that a half-understood list never replaces a good one.
    """
    try:
        doc = json.loads(body)
        items = doc["endpoints"]["items"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DiscoveryError(f"malformed discovery document: {exc.__class__.__name__}") from None
    if items is None:
        return []
    if not isinstance(items, list):
        raise DiscoveryError("endpoints.items must be a list")
    result: list[Endpoint] = []
    for item in items:
        if not isinstance(item, dict):
            raise DiscoveryError("each endpoint must be an object")
        ip = item.get("ip")
        if not isinstance(ip, str) or not ip:
            raise DiscoveryError("ip must be a non-empty string")
        weight = item.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise DiscoveryError("weight must be an integer")
        if weight < 0:
            raise DiscoveryError("weight must be >= 0")
        result.append(Endpoint(ip, _parse_port(item.get("port")), weight))
    return result


class WeightedRoundRobin:
    """Classic interleaved weighted round robin over a fixed list (not thread-safe).

    The current weight steps down by the gcd of the weights each round; an entry is
    picked when its weight is at least the current weight.
    """

    __slots__ = ("_cw", "_gcd", "_i", "_items", "_max")

    def __init__(self, items: Sequence[Endpoint]) -> None:
        self._items = tuple(items)
        weights = [e.weight for e in self._items]
        self._max = max(weights, default=0)
        self._gcd = reduce(math.gcd, weights, 0)
        self._i = -1
        self._cw = 0

    @property
    def items(self) -> tuple[Endpoint, ...]:
        return self._items

    @property
    def cycle_length(self) -> int:
        """Picks in one full cycle: sum(weights) / gcd."""
        if self._gcd == 0:
            return 0
        return sum(e.weight for e in self._items) // self._gcd

    def next(self) -> Endpoint | None:
        n = len(self._items)
        if n == 0 or self._max == 0:
            return None
        while True:
            self._i = (self._i + 1) % n
            if self._i == 0:
                self._cw -= self._gcd
                if self._cw <= 0:
                    self._cw = self._max
            item = self._items[self._i]
            if item.weight >= self._cw:
                return item


class EndpointSet:
    """The current endpoint list of a direct-mode client, swapped atomically.

    ``update`` installs a new list only when it differs (as a multiset) from the
    current one, resetting the scheduler as the reference client does. ``pick``
    returns the next endpoint by WRR, skipping endpoints already tried by this call
    while an untried one with a non-zero weight exists. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wrr = WeightedRoundRobin(())
        self._key: tuple[Endpoint, ...] | None = None  # None: never synced

    @property
    def ready(self) -> bool:
        """True once a discovery document has been installed (even an empty one)."""
        return self._key is not None

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._wrr.items

    def update(self, endpoints: Iterable[Endpoint]) -> bool:
        items = tuple(endpoints)
        key = tuple(sorted(items))
        with self._lock:
            if key == self._key:
                return False
            self._wrr = WeightedRoundRobin(items)
            self._key = key
            return True

    def pick(self, tried: Iterable[Endpoint] = ()) -> Endpoint:
        tried_set = set(tried)
        with self._lock:
            wrr = self._wrr
            first = wrr.next()
            if first is None:
                raise NoEndpointError("No backend found for the target service")
            if first not in tried_set:
                return first
            untried = [e for e in wrr.items if e.weight > 0 and e not in tried_set]
            if not untried:
                return first
            # Walk the schedule (at most one cycle) to the next untried endpoint, so
            # failover still follows the weights.
            for _ in range(wrr.cycle_length):
                candidate = wrr.next()
                if candidate is not None and candidate not in tried_set:
                    return candidate
            return untried[0]


@dataclass(frozen=True)
class Target:
    """Where one attempt goes: the URL and, in direct mode, the endpoint."""

    url: str
    endpoint: Endpoint | None = None


DISCOVERY_TIMEOUT = 2.0  # one discovery call never blocks the refresh loop longer
WARNING_INTERVAL = 30.0  # at most one discovery warning per this many seconds


def apply_discovery_response(endpoints: EndpointSet, status: int, body: bytes) -> bool:
    """Install the list from one discovery response; True when it changed.

    Raises DiscoveryError (and leaves the previous list in place) on a non-200
    status or a malformed body.
    """
    if status != 200:
        raise DiscoveryError(f"discovery answered HTTP {status}")
    return endpoints.update(parse_discovery(body))


class WarningLimiter:
    """Lets one warning through per ``interval`` seconds; the rest go to DEBUG."""

    def __init__(self, interval: float = WARNING_INTERVAL) -> None:
        self.interval = interval
        self._next = -math.inf
        self.suppressed = 0

    def allow(self, now: float) -> bool:
        if now >= self._next:
            self._next = now + self.interval
            return True
        self.suppressed += 1
        return False
