"""Gateway statuses -> gRPC codes, one table."""

from __future__ import annotations

import grpc
import pytest

from gateway.core import errors
from gateway.fronts.grpc.status import grpc_code, trailers


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (401, grpc.StatusCode.UNAUTHENTICATED),
        (404, grpc.StatusCode.NOT_FOUND),
        (408, grpc.StatusCode.DEADLINE_EXCEEDED),
        (504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (450, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (503, grpc.StatusCode.UNAVAILABLE),
        (500, grpc.StatusCode.INTERNAL),
        (502, grpc.StatusCode.INTERNAL),
        (415, grpc.StatusCode.INTERNAL),
    ],
)
def test_status_table(status: int, code: grpc.StatusCode) -> None:
    assert grpc_code(status) is code


def test_trailers_carry_the_request_id_and_retry_after() -> None:
    assert trailers(errors.Unauthorized("no"), "rid-1") == (("x-request-id", "rid-1"),)
    busy = errors.TooManyPending("busy", retry_after_s=2)
    assert trailers(busy, "r") == (("x-request-id", "r"), ("retry-after", "2"))
    assert grpc_code(busy.status) is grpc.StatusCode.RESOURCE_EXHAUSTED
