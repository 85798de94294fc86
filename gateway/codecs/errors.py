"""The one error renderer: a failure as each protocol answers it.

Every refusal and failure reaches a client as a :class:`GatewayError` (its status, code,
message, headers and whether to close the connection: gateway/core/errors.py) or as a
protocol's own request error (a malformed KServe, Paddle or Cluster Serving body, a tensor
that does not match its description, an answer too large to build). :func:`gateway_error`
turns any of them into the ``GatewayError`` it means, so every front reads one status
table, gRPC included (gateway/fronts/grpc/status.py maps the status to its code);
:func:`render` writes it in one protocol's shape:

=================  =============================================  ==============================
shape              body                                           content type
=================  =============================================  ==============================
EAS                ``{"code", "message", "request_id"}``          application/json; charset=utf-8
V2                 ``{"error": message}`` (KServe V1/V2, Triton)  application/json
CLUSTER_SERVING    ``{"error": message}``                         application/json; charset=utf-8
PADDLE             ``{"err_no": status, "err_msg": message}``     application/json
PADDLE_KEY_VALUE   the same with empty ``key`` and ``value``      application/json
QUEUE              the message as text                            text/plain; charset=utf-8
=================  =============================================  ==============================

Paddle's pipeline gRPC service answers with its ``Response`` message: the
``(err_no, err_msg)`` of :func:`paddle_pipeline_error`, Paddle's codes for each status.

Nothing else in the gateway formats an error body: the fronts, the worker's direct port,
the processors' and pipelines' error answers (:func:`eas_body`) and the queue's refusals
all come here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import NamedTuple

from eas_sdk._core.constants import HEADER_RETRY_AFTER
from gateway.codecs import kserve, paddle
from gateway.codecs.cluster_serving import ClusterServingRequestError
from gateway.core import errors
from gateway.core.json_answer import AnswerTooLarge
from gateway.core.tensors import TensorError


class Shape(enum.Enum):
    """The error shapes the gateway's protocols answer with (see the module docstring)."""

    EAS = "eas"
    V2 = "v2"
    CLUSTER_SERVING = "cluster_serving"
    PADDLE = "paddle"
    PADDLE_KEY_VALUE = "paddle_key_value"
    QUEUE = "queue"


class ErrorAnswer(NamedTuple):
    """What a front writes for an error: status, body, content type, headers, and whether the
    connection closes after it (a body left unread, a slow client)."""

    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str]
    close: bool


EAS_JSON = "application/json; charset=utf-8"
_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"
_NO_HEADERS: Mapping[str, str] = {}
# The queue protocol tells a client when to retry the refusals worth retrying (full,
# unavailable, storage trouble), whichever error said so.
_QUEUE_RETRY = frozenset((429, 503, 507))
_QUEUE_RETRY_AFTER = {HEADER_RETRY_AFTER: "1"}


def gateway_error(exc: BaseException) -> errors.GatewayError | None:
    """The GatewayError a failure means; None for a defect (the caller logs it and answers a
    bare 500, see :func:`internal`)."""
    if isinstance(exc, errors.GatewayError):
        return exc
    if isinstance(exc, (kserve.KServeRequestError, ClusterServingRequestError, paddle.PaddleRequestError)):
        return errors.of_status(exc.status, str(exc))
    if isinstance(exc, TensorError):
        return errors.BadRequest(str(exc))
    if isinstance(exc, AnswerTooLarge):
        return errors.ResponseTooLarge(str(exc))
    return None


def internal() -> errors.GatewayError:
    """The error a defect is answered with: no details (the caller logs the exception)."""
    return errors.InternalError("internal error")


def eas_body(code: str, message: str, request_id: str) -> bytes:
    """The EAS protocol's error body, as every EAS answer carries it (a front's, a processor's
    or a pipeline's: the worker's answer passes through unchanged)."""
    doc = {"code": code, "message": message, "request_id": request_id}
    return json.dumps(doc, ensure_ascii=True).encode()


def render(exc: BaseException, shape: Shape, request_id: str = "") -> ErrorAnswer:
    """``exc`` (a GatewayError or a protocol's request error; anything else answers 500) in
    ``shape``. ``request_id`` goes into the EAS body; the fronts add the ``X-Request-Id``
    header themselves, as they do to every answer."""
    err = gateway_error(exc) or internal()
    status, message = err.status, err.message
    if shape is Shape.EAS:
        return ErrorAnswer(status, eas_body(err.code, message, request_id), EAS_JSON, err.headers, err.close)
    if shape is Shape.V2:
        return ErrorAnswer(status, kserve.dumps({"error": message}), _JSON, err.headers, err.close)
    if shape is Shape.PADDLE or shape is Shape.PADDLE_KEY_VALUE:
        doc: dict[str, object] = {"err_no": status, "err_msg": message}
        if shape is Shape.PADDLE_KEY_VALUE:
            doc.update(key=[], value=[])
        return ErrorAnswer(status, paddle.dumps(doc), _JSON, err.headers, err.close)
    if shape is Shape.CLUSTER_SERVING:
        # As Cluster Serving's own frontend answers: the body alone, no retry hint.
        return ErrorAnswer(status, json.dumps({"error": message}).encode(), EAS_JSON, _NO_HEADERS, err.close)
    headers = _QUEUE_RETRY_AFTER if status in _QUEUE_RETRY else _NO_HEADERS
    return ErrorAnswer(status, message.encode("utf-8"), _TEXT, headers, err.close)


# Paddle Serving's pipeline error codes (its CustomExceptionCode) for the gateway's statuses:
# a refused input, a timeout, a service that is not there or not ready, anything else.
PADDLE_INPUT_ERROR = 5000
PADDLE_TIMEOUT = 6000
PADDLE_NO_SERVICE = 3002
PADDLE_CLOSED = 3001
PADDLE_UNKNOWN = 10000
_PADDLE_CODES = {400: PADDLE_INPUT_ERROR, 401: PADDLE_INPUT_ERROR, 403: PADDLE_INPUT_ERROR,
                 413: PADDLE_INPUT_ERROR, 422: PADDLE_INPUT_ERROR, 404: PADDLE_NO_SERVICE,
                 450: PADDLE_CLOSED, 429: PADDLE_CLOSED, 503: PADDLE_CLOSED, 504: PADDLE_TIMEOUT}  # fmt: skip


def paddle_pipeline_error(exc: BaseException) -> tuple[int, str]:
    """``(err_no, err_msg)`` as Paddle's pipeline server answers a failure: its own code for
    the kind of failure, the message with the gateway's status in it."""
    err = gateway_error(exc) or internal()
    return _PADDLE_CODES.get(err.status, PADDLE_UNKNOWN), f"[{err.status}] {err.message}"


def paddle_shape(form: str) -> Shape:
    """The Paddle error shape for a body in ``form`` (gateway.codecs.paddle.FEED or KEY_VALUE)."""
    return Shape.PADDLE_KEY_VALUE if form == paddle.KEY_VALUE else Shape.PADDLE


__all__ = [
    "EAS_JSON",
    "ErrorAnswer",
    "Shape",
    "eas_body",
    "gateway_error",
    "internal",
    "paddle_pipeline_error",
    "paddle_shape",
    "render",
]
