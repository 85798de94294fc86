"""The one error renderer: each protocol's error shape, from a GatewayError or a protocol's
own request error, with the status, headers and connection handling of the error."""

from __future__ import annotations

import json

import pytest

from gateway.codecs import errors as render_errors
from gateway.codecs.cluster_serving import ClusterServingRequestError
from gateway.codecs.errors import Shape, gateway_error, render
from gateway.codecs.kserve import KServeRequestError
from gateway.codecs.paddle import PaddleRequestError
from gateway.core import errors
from gateway.core.json_answer import AnswerTooLarge
from gateway.core.tensors import TensorError


def test_eas_shape_carries_code_message_and_request_id() -> None:
    answer = render(errors.TooManyPending("queue full"), Shape.EAS, "rid-1")
    assert answer.status == 450
    assert json.loads(answer.body) == {
        "code": "TooManyPending",
        "message": "queue full",
        "request_id": "rid-1",
    }
    assert answer.content_type == "application/json; charset=utf-8"
    assert answer.headers == {"Retry-After": "1"} and not answer.close
    # Non-ASCII messages stay readable JSON, escaped.
    assert render(errors.BadRequest("é"), Shape.EAS).body.isascii()


def test_v2_shape_is_error_only_and_keeps_headers_and_close() -> None:
    answer = render(errors.RequestTimeout("body late", close=True), Shape.V2, "rid")
    assert (answer.status, json.loads(answer.body)) == (408, {"error": "body late"})
    assert answer.content_type == "application/json" and answer.close
    allowed = render(errors.MethodNotAllowed("use POST", allow="POST"), Shape.V2)
    assert allowed.headers == {"Allow": "POST"}


def test_cluster_serving_shape_is_the_body_alone() -> None:
    answer = render(errors.ServiceNotReady("no worker"), Shape.CLUSTER_SERVING)
    assert (answer.status, json.loads(answer.body)) == (503, {"error": "no worker"})
    assert answer.content_type == "application/json; charset=utf-8" and answer.headers == {}


def test_paddle_shapes_follow_the_callers_form() -> None:
    feed = render(errors.Unauthorized("invalid or missing token"), Shape.PADDLE)
    assert json.loads(feed.body) == {"err_no": 401, "err_msg": "invalid or missing token"}
    kv = render(errors.ServiceNotReady("none"), Shape.PADDLE_KEY_VALUE)
    assert json.loads(kv.body) == {"err_no": 503, "err_msg": "none", "key": [], "value": []}
    assert kv.content_type == "application/json" and kv.headers == {"Retry-After": "1"}


@pytest.mark.parametrize(("status", "retry"), [(404, False), (429, True), (503, True), (507, True)])
def test_queue_shape_is_text_and_says_when_to_retry(status: int, retry: bool) -> None:
    answer = render(errors.of_status(status, "queue says no"), Shape.QUEUE)
    assert (answer.status, answer.body, answer.content_type) == (
        status,
        b"queue says no",
        "text/plain; charset=utf-8",
    )
    assert answer.headers == ({"Retry-After": "1"} if retry else {})


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (KServeRequestError("bad input"), 400),
        (KServeRequestError("model 'x' not found", 404), 404),
        (ClusterServingRequestError("too many instances", 413), 413),
        (PaddleRequestError("neither form"), 400),
        (TensorError("shape mismatch"), 400),
        (AnswerTooLarge(10, 5), 413),
    ],
)
def test_a_protocols_request_error_reads_the_same_status_table(exc: Exception, status: int) -> None:
    err = gateway_error(exc)
    assert err is not None and err.status == status and err.message == str(exc)
    for shape in Shape:
        assert render(exc, shape).status == status


def test_a_defect_is_a_bare_500_in_every_shape() -> None:
    assert gateway_error(RuntimeError("secret")) is None
    for shape in Shape:
        answer = render(RuntimeError("secret"), shape, "rid")
        assert answer.status == 500 and b"secret" not in answer.body
    assert json.loads(render(RuntimeError("x"), Shape.EAS, "rid").body)["code"] == "InternalError"


def test_of_status_names_the_code_of_the_status() -> None:
    assert (errors.of_status(404, "gone").code, errors.of_status(999, "odd").code) == ("NotFound", "Error")
    assert render_errors.eas_body("C", "m", "r") == b'{"code": "C", "message": "m", "request_id": "r"}'
