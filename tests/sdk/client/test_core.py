"""Unit and property tests of the I/O-free core: URLs, discovery, WRR, retry, headers."""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import replace
from email.utils import parsedate_to_datetime
from functools import reduce
from math import gcd

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eas_sdk._core.endpoints import (
    DiscoveryError,
    Endpoint,
    EndpointSet,
    WarningLimiter,
    WeightedRoundRobin,
    apply_discovery_response,
    discovery_url,
    normalize_gateway_endpoint,
    parse_discovery,
)
from eas_sdk._core.request import ClientConfig, PredictCall, build_headers
from eas_sdk._core.retry import FailureKind, RetryBudget, RetryPolicy, UnlimitedBudget, parse_retry_after
from eas_sdk.errors import (
    ConnectError,
    NoEndpointError,
    PredictException,
    ServiceUnavailableError,
    TimeoutError,
    TransportError,
)
from gateway.core.auth import SignaturePolicy, verify

# --- gateway URL rules ----------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("1828.cn-shanghai.pai-eas.aliyuncs.com", "http://1828.cn-shanghai.pai-eas.aliyuncs.com"),
        ("http://host:8080/", "http://host:8080"),
        ("https://host", "https://host"),  # the reference breaks this into http://https://host
        ("host//", "http://host/"),  # exactly one trailing slash is removed
    ],
)
def test_gateway_endpoint_normalisation(endpoint: str, expected: str) -> None:
    assert normalize_gateway_endpoint(endpoint, "svc", env={}) == expected


def test_empty_endpoint_inside_eas_uses_namespace() -> None:
    assert normalize_gateway_endpoint("", "my_svc/sub", env={"NAMESPACE": "ns1"}) == "http://my-svc.ns1:8080"
    with pytest.raises(PredictException, match="'endpoint' must be set"):
        normalize_gateway_endpoint("", "svc", env={})


def test_request_urls_per_mode() -> None:
    cfg = ClientConfig(endpoint="gw:80/", service_name="a/b/c")
    assert cfg.gateway_url(env={}) == "http://gw:80/api/predict/a/b/c"
    cfg = ClientConfig(endpoint="gw", service_name="svc", custom_url="https://x/y?q=1")
    assert cfg.gateway_url(env={}) == "https://x/y?q=1"


def test_discovery_url() -> None:
    assert (
        discovery_url("http://pai-eas-vpc.cn-hangzhou.aliyuncs.com/", "svc/sub", env={})
        == "http://pai-eas-vpc.cn-hangzhou.aliyuncs.com/api/v1/servicediscovery/upstreams/svc"
    )
    both = {"NAMESPACE": "n", "POD_NAME": "p"}
    assert discovery_url("h:1", "svc", env=both).endswith("/upstreams/svc?internal=true")
    assert "internal" not in discovery_url("h:1", "svc", env={"NAMESPACE": "n"})


# --- discovery documents ------------------------------------------------------------------------


def test_parse_discovery_accepts_int_or_string_ports() -> None:
    body = b'{"endpoints": {"items": [{"ip": "10.0.0.1", "port": 8080, "weight": 100},'
    body += b' {"ip": "10.0.0.2", "port": "9090", "weight": 0, "extra": 1}]}, "other": 2}'
    assert parse_discovery(body) == [Endpoint("10.0.0.1", 8080, 100), Endpoint("10.0.0.2", 9090, 0)]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"endpoints": {"items": {}}}',
        b'{"endpoints": {"items": [{"ip": "a", "port": 1, "weight": 1.5}]}}',
        b'{"endpoints": {"items": [{"ip": "a", "port": 1, "weight": true}]}}',
        b'{"endpoints": {"items": [{"ip": "a", "port": 1, "weight": -1}]}}',
        b'{"endpoints": {"items": [{"ip": 1, "port": 1, "weight": 1}]}}',
        b'{"endpoints": {"items": [{"ip": "a", "port": "x", "weight": 1}]}}',
        b'{"endpoints": {"items": [{"ip": "a", "port": 70000, "weight": 1}]}}',
    ],
)
def test_parse_discovery_rejects_malformed_documents(body: bytes) -> None:
    with pytest.raises(DiscoveryError):
        parse_discovery(body)


def test_failed_discovery_keeps_the_previous_list() -> None:
    eps = EndpointSet()
    good = b'{"endpoints": {"items": [{"ip": "10.0.0.1", "port": 1, "weight": 1}]}}'
    assert apply_discovery_response(eps, 200, good)
    with pytest.raises(DiscoveryError):
        apply_discovery_response(eps, 500, b"")
    with pytest.raises(DiscoveryError):
        apply_discovery_response(
            eps, 200, b'{"endpoints": {"items": [{"ip": "x", "port": 1, "weight": 0.5}]}}'
        )
    assert eps.endpoints == (Endpoint("10.0.0.1", 1, 1),)
    assert not apply_discovery_response(eps, 200, good)  # unchanged: scheduler not reset


def test_warning_limiter() -> None:
    lim = WarningLimiter(30.0)
    assert lim.allow(100.0)
    assert not lim.allow(101.0) and not lim.allow(129.9)
    assert lim.allow(130.0)
    assert lim.suppressed == 2


# --- weighted round robin --------------------------------------------------------------


def _names(wrr: WeightedRoundRobin, n: int) -> str:
    out = []
    for _ in range(n):
        ep = wrr.next()
        assert ep is not None
        out.append(ep.host)
    return "".join(out)


def test_wrr_reference_sequence() -> None:
    wrr = WeightedRoundRobin([Endpoint("A", 1, 3), Endpoint("B", 1, 1), Endpoint("C", 1, 2)])
    assert _names(wrr, 12) == "AACABCAACABC"


def test_wrr_equal_weights_alternate_and_zero_is_never_picked() -> None:
    assert _names(WeightedRoundRobin([Endpoint("A", 1, 5), Endpoint("B", 1, 5)]), 6) == "ABABAB"
    assert _names(WeightedRoundRobin([Endpoint("A", 1, 0), Endpoint("B", 1, 2)]), 4) == "BBBB"
    assert WeightedRoundRobin([Endpoint("A", 1, 0)]).next() is None
    with pytest.raises(NoEndpointError):
        EndpointSet().pick()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=6))
def test_wrr_picks_proportional_to_weight(weights: list[int]) -> None:
    items = [Endpoint(f"h{i}", 1000 + i, w) for i, w in enumerate(weights)]
    wrr = WeightedRoundRobin(items)
    g = reduce(gcd, weights, 0)
    if g == 0:
        assert wrr.next() is None
        return
    cycle = sum(weights) // g
    assert wrr.cycle_length == cycle
    counts = Counter(wrr.next() for _ in range(cycle * 2))
    for ep in items:
        assert counts[ep] == 2 * ep.weight // g


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(min_value=1, max_value=5), min_size=2, max_size=5),
    st.data(),
)
def test_pick_prefers_untried_endpoints(weights: list[int], data: st.DataObject) -> None:
    eps = EndpointSet()
    items = [Endpoint(f"h{i}", 1, w) for i, w in enumerate(weights)]
    eps.update(items)
    tried = data.draw(st.lists(st.sampled_from(items), max_size=len(items) - 1, unique=True))
    for _ in range(5):
        assert eps.pick(tried) not in tried
    # When everything was tried, pick still answers.
    assert eps.pick(items) in items


def test_endpoint_list_swap_is_atomic_under_threads() -> None:
    eps = EndpointSet()
    list_a = [Endpoint("a", i + 1, 1) for i in range(3)]
    list_b = [Endpoint("b", i + 1, 2) for i in range(5)]
    eps.update(list_a)
    allowed = set(list_a) | set(list_b)
    bad: list[Endpoint] = []
    stop = threading.Event()

    def reader() -> None:
        for _ in range(20_000):
            if stop.is_set():
                break
            ep = eps.pick()
            if ep not in allowed:
                bad.append(ep)

    def writer() -> None:
        for i in range(2_000):
            eps.update(list_a if i % 2 else list_b)

    threads = [threading.Thread(target=reader) for _ in range(7)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    threads[-1].join(30)
    stop.set()
    for t in threads:
        t.join(30)
    assert not bad
    # After the last swap the schedule follows the final list.
    assert set(eps.endpoints) in (set(list_a), set(list_b))


# --- retry policy -------------------------------------------------------------------


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=0, max_value=200))
def test_backoff_is_full_jitter_within_bounds(seed: int, n: int) -> None:
    policy = RetryPolicy()
    delay = policy.backoff(n, random.Random(seed))
    assert 0.0 <= delay < min(policy.backoff_cap, policy.backoff_base * 2**n)


def test_backoff_schedules_differ_between_clients() -> None:
    policy = RetryPolicy()
    schedules = {tuple(policy.backoff(n, random.Random()) for n in range(5)) for _ in range(100)}
    assert len(schedules) == 100


def test_status_classification() -> None:
    p = RetryPolicy()
    for status in (450, 500, 502, 503, 504):
        assert p.is_retryable_status(status)
    for status in (400, 401, 403, 404, 405, 408, 413, 429, 501):
        assert not p.is_retryable_status(status)
    assert p.is_retryable_status(429, {"retry-after": "1"})
    assert not p.is_retryable_status(429, {"Retry-After": "60"})
    assert not RetryPolicy(retry_on_500=False).is_retryable_status(500)


def test_decisions_respect_retries_and_remaining_time() -> None:
    p = RetryPolicy(retries=2)
    assert p.after_status(503, {}, 0, 10.0).retry
    assert p.after_status(503, {}, 1, 10.0).retry
    assert not p.after_status(503, {}, 2, 10.0).retry
    assert not p.after_status(503, {}, 0, 0.0).retry  # no time left for the back-off
    d = p.after_status(503, {"Retry-After": "1"}, 0, 10.0)
    assert d.retry and d.delay >= 1.0
    d = p.after_status(429, {"Retry-After": "1"}, 0, 10.0)
    assert d.retry and d.delay == 1.0
    assert not p.after_status(429, {"Retry-After": "1"}, 0, 0.5).retry
    assert p.after_failure(FailureKind.CONNECT, 0, 10.0).retry
    assert not p.after_failure(FailureKind.FATAL, 0, 10.0).retry
    assert not RetryPolicy(retry_on_timeout=False).after_failure(FailureKind.TIMEOUT, 0, 10.0).retry


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("nan") is None
    date = "Sun, 22 Nov 2026 01:42:20 GMT"
    epoch = parsedate_to_datetime(date).timestamp()
    assert parse_retry_after(date, now_epoch=epoch - 5) == 5.0


def test_total_deadline() -> None:
    assert RetryPolicy(retries=5).total_timeout(5.0) == 30.0  # 6 x 5 s, at the cap
    assert RetryPolicy(retries=2).total_timeout(1.0) == 3.0
    assert RetryPolicy(retries=0).total_timeout(100.0) == 30.0
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def _drive(call: PredictCall, statuses: list[int], clock: list[float]) -> tuple[int, Exception | None]:
    """Run one call against scripted statuses with a fake clock; return (attempts, error)."""
    i = 0
    while True:
        attempt = call.next_attempt(clock[0])
        status = statuses[min(i, len(statuses) - 1)]
        i += 1
        step = call.on_response(status, {}, b"body", clock[0])
        if step.body is not None:
            return call.attempts, None
        if step.error is not None:
            return call.attempts, step.error
        clock[0] += step.delay
        assert attempt.timeout > 0


def test_retry_budget_caps_attempts_against_a_dead_backend() -> None:
    # Always 503 at 100 calls/s for 5 s -> attempts <= 1.2 x calls.
    budget = RetryBudget(now=0.0)
    cfg = ClientConfig(endpoint="h", service_name="s")
    clock = [0.0]
    attempts = calls = 0
    for n in range(500):
        clock[0] = n * 0.01
        call = PredictCall(cfg, b"x", now=clock[0], url="http://h/api/predict/s", budget=budget)
        made, err = _drive(call, [503], clock)
        assert isinstance(err, ServiceUnavailableError)
        attempts += made
        calls += 1
    assert attempts <= 1.2 * calls
    # A single failing call on a quiet client still gets all its retries.
    fresh = PredictCall(cfg, b"x", now=0.0, url="http://h/api/predict/s", budget=RetryBudget(now=0.0))
    assert _drive(fresh, [503], [0.0])[0] == 6


def test_deadline_header_shrinks_and_call_times_out() -> None:
    cfg = ClientConfig(endpoint="h", service_name="s", timeout=1.0, retry=RetryPolicy(retries=2))
    call = PredictCall(cfg, b"x", now=0.0, url="http://h/api/predict/s", budget=UnlimitedBudget())
    a1 = call.next_attempt(0.0)
    assert a1.headers["X-Eas-Deadline-Ms"] == "1000" and a1.timeout == 1.0
    step = call.on_failure(FailureKind.TIMEOUT, "read timed out", 1.0)
    assert step.error is None
    a2 = call.next_attempt(1.0 + step.delay)
    assert a2.headers["X-Eas-Deadline-Ms"] == "1000"  # 2 s of the 3 s total remain
    assert a2.headers["X-Request-Id"] == a1.headers["X-Request-Id"]
    step = call.on_failure(FailureKind.TIMEOUT, "read timed out", 2.7)
    assert step.error is None  # 0.3 s left, the back-off (< 0.1 s) fits
    a3 = call.next_attempt(2.7 + step.delay)
    assert int(a3.headers["X-Eas-Deadline-Ms"]) <= 300 and a3.timeout <= 0.3
    with pytest.raises(TimeoutError, match="deadline"):
        call.next_attempt(3.0)


def test_transport_errors_become_typed_exceptions_without_query() -> None:
    cfg = ClientConfig(custom_url="http://h/x?token=abc", retry=RetryPolicy(retries=0))
    call = PredictCall(cfg, b"x", now=0.0, url=cfg.custom_url)
    call.next_attempt(0.0)
    step = call.on_failure(FailureKind.CONNECT, "refused http://h/x?token=abc", 0.1)
    assert isinstance(step.error, ConnectError)
    assert "abc" not in str(step.error)


def test_stale_disconnect_is_resent_once_for_free() -> None:
    cfg = ClientConfig(endpoint="h", service_name="s", retry=RetryPolicy(retries=0))
    call = PredictCall(cfg, b"x", now=0.0, url="http://h/api/predict/s")
    call.next_attempt(0.0)
    step = call.on_failure(FailureKind.DISCONNECTED, "reset", 0.0, reused=True)
    assert step.error is None and step.delay == 0.0
    call.next_attempt(0.0)
    step = call.on_failure(FailureKind.DISCONNECTED, "reset", 0.0, reused=True)
    assert isinstance(step.error, ConnectError)
    assert call.attempts == 2


def test_fresh_connection_drop_is_an_ordinary_failure() -> None:
    # retries=0 is one attempt; only a *reused* pooled connection gets the free re-send.
    cfg = ClientConfig(endpoint="h", service_name="s", retry=RetryPolicy(retries=0))
    call = PredictCall(cfg, b"x", now=0.0, url="http://h/api/predict/s")
    call.next_attempt(0.0)
    step = call.on_failure(FailureKind.DISCONNECTED, "reset", 0.0)
    assert isinstance(step.error, ConnectError)
    assert call.attempts == 1


def test_a_started_response_is_never_retried() -> None:
    # Only failures before any response byte are retried.
    cfg = ClientConfig(endpoint="h", service_name="s", retry=RetryPolicy(retries=3))
    assert not cfg.retry.after_failure(FailureKind.BROKEN, 0, 10.0).retry
    for kind, cls in (
        (FailureKind.BROKEN, TransportError),
        (FailureKind.DISCONNECTED, TransportError),
        (FailureKind.TIMEOUT, TimeoutError),
    ):
        call = PredictCall(cfg, b"x", now=0.0, url="http://h/api/predict/s", budget=UnlimitedBudget())
        call.next_attempt(0.0)
        step = call.on_failure(kind, "cut off", 0.0, reused=True, started=True)
        assert type(step.error) is cls, kind
        assert call.attempts == 1


# --- headers and signing -----------------------------------------------------------------


def test_signing_matches_the_reference_client_vector() -> None:
    cfg = ClientConfig(endpoint="h", service_name="my_svc", token="dG9rZW4xMjM=")
    headers = build_headers(cfg, b"hello", request_id="r1", date="Sun, 22 Nov 2026 01:42:15 GMT")
    assert headers["Authorization"] == "EAS 6gEpGaphauPID7xbYB++bq4ERII="
    assert headers["Content-MD5"] == "5d41402abc4b2a76b9719d911017c592"
    # A fixed Date: checked without the gateway's Date window.
    assert verify(
        ["dG9rZW4xMjM="], headers, "/api/predict/my_svc", b"hello", SignaturePolicy(max_skew_s=0)
    ).ok


def test_headers_modes_and_overrides() -> None:
    extra = (("authorization", "user-supplied"), ("x-request-id", "mine"), ("CONTENT-TYPE", "a/b"))
    signed = build_headers(ClientConfig(service_name="s", token="t", headers=extra), b"x", request_id="r")
    assert [k for k in signed if k.lower() == "authorization"] == ["Authorization"]
    assert signed["Authorization"].startswith("EAS ")
    assert signed["Content-Type"] == "a/b"
    assert signed["x-request-id"] == "mine" and "X-Request-Id" not in signed
    raw = build_headers(ClientConfig(custom_url="http://u", token="t"), b"x", request_id="r")
    assert raw["Authorization"] == "t" and "Content-MD5" not in raw
    anon = build_headers(ClientConfig(service_name="s"), b"x", request_id="r", deadline_ms=0)
    assert "Authorization" not in anon and anon["X-Eas-Deadline-Ms"] == "1"


def test_config_repr_masks_token_and_query() -> None:
    cfg = ClientConfig(service_name="s", token="supersecret", custom_url="http://u/p?key=supersecret")
    assert "supersecret" not in repr(cfg) and "supersecret" not in str(cfg)
    assert "***" in repr(cfg)
    assert "supersecret" not in repr(replace(cfg, token=""))


def test_config_validation() -> None:
    with pytest.raises(PredictException, match="Unsupported endpoint type"):
        ClientConfig(service_name="s", endpoint_type="NOPE").validate()
    with pytest.raises(PredictException, match="service_name"):
        ClientConfig(endpoint="h").validate()
    with pytest.raises(ValueError):
        ClientConfig(timeout=0)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=300))
def test_retry_budget_bound_holds_for_any_arrival_pattern(gaps: list[float]) -> None:
    # Every call wants as many retries as it can get; spent retries never exceed
    # ratio x calls + the reserve (min_per_second x window) + refills over the elapsed time.
    budget = RetryBudget(ratio=0.1, min_per_second=3.0, window=10.0, now=0.0)
    now = spent = 0.0
    for gap in gaps:
        now += gap
        budget.on_call()
        while budget.try_spend(now):
            spent += 1
            assert spent < 10_000
    assert spent <= 0.1 * len(gaps) + 30.0 + 3.0 * now + 1e-9
