"""One V2 inference call once its body is in, shared by the aiohttp route
(gateway/fronts/routes/kserve.py) and the lean front (gateway/fronts/fast_front.py).

Parse (JSON, binary or mixed; large bodies off the event loop), find the model's
signature, run the tensors on the worker's TF protobuf path (``DataPlane.infer_tensors``),
and build the answer. Authentication and the deadline are the caller's: each reads them
from its own request. Every failure is raised: a ``KServeRequestError`` or
``TensorError`` (the client's fault) or a ``GatewayError``; :func:`error_reply` turns any
of them into the protocol's ``{"error": ...}`` body with its status and headers.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.codecs import kserve as proto
from gateway.codecs import v2_infer, v2_tensors
from gateway.config import ServiceConfig
from gateway.core import errors, json_answer
from gateway.core.dataplane import DataPlane
from gateway.core.metadata import ModelMetadata
from gateway.core.parse_pool import parse_off_loop

LARGE_BODY = 1 << 20  # parse bigger bodies off the event loop
ENCODE_ON_LOOP_MAX = 16 << 10  # answers of more elements are written in a thread


async def infer(
    plane: DataPlane,
    svc: ServiceConfig,
    runs: ServiceConfig,
    version: str,
    meta: ModelMetadata | None,
    body: bytes,
    binary_header: str | None,
    *,
    request_id: str,
    timeout: float,
    extra: Mapping[str, str] | None = None,
    answer_headers: dict[str, str] | None = None,
) -> tuple[bytes | bytearray, int | None]:
    """-> (answer body, JSON header length when binary tensors follow it, else None).
    ``svc``: the model as clients name it; ``runs``: the service whose workers serve
    ``version``; ``meta``: their signature (None before a worker was ready); ``extra``:
    the caller's headers a backend reads, ``answer_headers``: filled with the backend's own
    (a pipeline's timings, see gateway.backends.pipelines.timings)."""
    if len(body) > LARGE_BODY:
        # Off the loop, one large parse at a time (its Python objects take 10-20x the body).
        req = await parse_off_loop(functools.partial(v2_infer.parse_request, body, binary_header))
    else:
        req = v2_infer.parse_request(body, binary_header)
    # No signature yet (no worker was ever ready): the call goes on, and the pool answers
    # 503 naming why (a model that does not load, workers starting).
    declared, order = _outputs_of(meta)
    arrays = await plane.infer_tensors(
        runs, req.inputs, req.output_names, request_id=request_id, timeout=timeout, declared=declared,
        extra=extra, answer_headers=answer_headers,
    )  # fmt: skip
    # The outputs' size can follow the client's shapes: refused before the answer is built
    # past the limit; a large one written in a thread (it takes the GIL a block at a time).
    answer = functools.partial(
        v2_infer.answer, svc.name, version, req, arrays, order, None, plane.max_response_bytes
    )
    try:
        if sum(a.size for a in arrays.values()) > ENCODE_ON_LOOP_MAX:
            return await asyncio.to_thread(answer)
        return answer()
    except KeyError as exc:
        raise proto.KServeRequestError(str(exc.args[0]), 502) from None
    except json_answer.AnswerTooLarge as exc:
        raise errors.ResponseTooLarge(str(exc)) from None


# Per signature (the same object until the model changes): its outputs' declared dtypes and
# names in the model's order, read on every call. Holding the signature keeps its id unique.
_OUTPUTS: dict[int, tuple[ModelMetadata, dict[str, Any], list[str]]] = {}
_OUTPUTS_MAX = 64


def _outputs_of(meta: ModelMetadata | None) -> tuple[Mapping[str, Any], Sequence[str]]:
    if meta is None:
        return {}, ()
    hit = _OUTPUTS.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1], hit[2]
    types = v2_tensors.DATATYPES
    declared = {t.name: types[t.datatype] for t in meta.outputs if t.datatype in types}
    order = [t.name for t in meta.outputs]
    if len(_OUTPUTS) >= _OUTPUTS_MAX:
        _OUTPUTS.clear()
    _OUTPUTS[id(meta)] = (meta, declared, order)
    return declared, order


def error_reply(exc: Exception) -> tuple[int, bytes, Mapping[str, str], bool] | None:
    """(status, ``{"error"}`` body, headers, close the connection) for an error a V2 call
    raised; None for anything else (a defect, which the caller logs and answers 500)."""
    if isinstance(exc, proto.KServeRequestError):
        return exc.status, proto.error_body(str(exc)), {}, False
    if isinstance(exc, v2_tensors.TensorError):
        return 400, proto.error_body(str(exc)), {}, False
    if isinstance(exc, errors.GatewayError):
        return exc.status, proto.error_body(exc.message), exc.headers, exc.close
    return None


__all__ = ["LARGE_BODY", "error_reply", "infer"]
