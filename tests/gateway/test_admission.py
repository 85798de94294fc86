"""Admission counters and decisions (gateway/core/admission.py), without I/O."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig
from gateway.core import errors
from gateway.core.admission import Admission, AdmissionLimits


def test_limits_come_from_the_gateway_config() -> None:
    gw = GatewayConfig(max_connections=7, max_buffered_bytes=100, max_unverified_bytes=10)
    assert AdmissionLimits.of(gw) == AdmissionLimits(7, 100, 10, GatewayConfig().max_inflight_per_service)


def test_unverified_bodies_have_their_own_smaller_budget() -> None:
    adm = Admission(AdmissionLimits(max_buffered_bytes=100, max_unverified_bytes=40))
    a = adm.hold_body(30, verified=False)
    with pytest.raises(errors.TooManyRequests) as info:
        adm.hold_body(20, verified=False)
    assert info.value.status == 429 and info.value.close and info.value.headers["Retry-After"] == "1"
    b = adm.hold_body(60, verified=True)  # a verified body still fits the total
    with pytest.raises(errors.TooManyRequests):
        adm.hold_body(20, verified=True)
    assert (adm.buffered, adm.unverified) == (90, 30)
    a.release()
    a.release()  # idempotent
    b.release()
    assert (adm.buffered, adm.unverified) == (0, 0)
    assert adm.snapshot()["refused"] == {"unverified_bytes": 1, "buffered_bytes": 1}


def test_inflight_per_service() -> None:
    adm = Admission(AdmissionLimits(max_inflight_per_service=2))
    adm.enter("a")
    adm.enter("a")
    adm.enter("b")
    with pytest.raises(errors.TooManyRequests, match="'a' has 2 calls in flight"):
        adm.enter("a")
    adm.leave("a")
    adm.enter("a")
    assert adm.snapshot()["inflight"] == {"a": 2, "b": 1}


def test_connections_and_zero_turns_a_limit_off() -> None:
    adm = Admission(AdmissionLimits(max_connections=2))
    adm.open_connections = lambda: 2
    assert not adm.admit_connection()
    adm.open_connections = lambda: 1
    assert adm.admit_connection()
    off = Admission(AdmissionLimits(0, 0, 0, 0))
    off.open_connections = lambda: 10**6
    assert off.admit_connection()
    off.hold_body(1 << 40, verified=False)
    for _ in range(5):
        off.enter("a")
