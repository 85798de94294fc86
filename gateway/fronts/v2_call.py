"""One V2 REST inference call, shared by the aiohttp route (gateway/fronts/routes/kserve.py)
and the lean front (gateway/fronts/fast_front.py).

The call goes into the core as ``DataPlane.tensors_call``, which checks it in the core's
order and runs the tensors on the worker's TF protobuf path; this module gives it the
decoding (JSON, binary or mixed; large bodies off the event loop) and builds the answer.
Every failure is raised (:data:`ERRORS`): a ``KServeRequestError`` or ``TensorError`` (the
client's fault) or a ``GatewayError``, which the fronts render in V2's ``{"error"}`` shape
(gateway/codecs/errors.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gateway.codecs import kserve as proto
from gateway.codecs import v2_infer, v2_tensors
from gateway.config import ServiceConfig
from gateway.core import errors, json_answer
from gateway.core.calls import infer_call_headers
from gateway.core.dataplane import Body, DataPlane
from gateway.core.metadata import ModelMetadata, misfit
from gateway.core.parse_pool import parse_off_loop
from gateway.core.traffic import VERSION_HEADER

LARGE_BODY = 1 << 20  # parse bigger bodies off the event loop
ENCODE_ON_LOOP_MAX = 16 << 10  # answers of more elements are written in a thread


# What a V2 call raises for a client to read: rendered in V2's shape, everything else is a defect.
ERRORS = (proto.KServeRequestError, v2_tensors.TensorError, errors.GatewayError)


async def infer(
    plane: DataPlane,
    svc: ServiceConfig,
    runs: ServiceConfig | None,
    version: str,
    meta: ModelMetadata | None,
    headers: Mapping[str, str],
    raw_path: str,
    body: Body,
    *,
    request_id: str,
    arrived: float,
    extra: Mapping[str, str] | None = None,
    answer_headers: dict[str, str] | None = None,
) -> tuple[bytes | bytearray, int | None]:
    """-> (answer body, JSON header length when binary tensors follow it, else None).
    ``svc``: the model as clients name it; ``runs``: the service whose workers serve
    ``version`` when the path names it (None: the dataplane picks the version, and the
    answer names the one that served it); ``meta``: their signature (None before a worker
    was ready); ``headers``,
    ``raw_path``, ``body`` and ``arrived``: the call as the front received it; ``extra``:
    the caller's headers a backend reads, ``answer_headers``: filled with the backend's own
    (a pipeline's timings, see gateway.backends.pipelines.timings)."""
    binary_header = headers.get(proto.BINARY_HEADER)
    call_headers = dict(extra) if extra else {}
    # When one backend runs the call (the version the path names, or a model without
    # versions), what its workers' signature refuses is refused here, before it is sent.
    signature = meta if runs is not None or not svc.versions else None

    async def decode(data: bytes) -> tuple[v2_infer.InferRequest, Mapping[str, np.ndarray], Sequence[str]]:
        if len(data) > LARGE_BODY:
            # Off the loop, one large parse at a time (its Python objects take 10-20x the body).
            req = await parse_off_loop(functools.partial(v2_infer.parse_request, data, binary_header))
        else:
            req = v2_infer.parse_request(data, binary_header)
        refused = misfit(signature, {name: (a.dtype, a.shape) for name, a in req.inputs.items()})
        if refused is not None:
            raise proto.KServeRequestError(refused)
        if req.id or req.parameters:  # for the processor: read once this decode has run
            call_headers.update(infer_call_headers(req.id, req.parameters))
        return req, req.inputs, req.output_names

    # No signature yet (no worker was ever ready): the call goes on, and the pool answers
    # 503 naming why (a model that does not load, workers starting).
    declared, order = _outputs_of(meta)
    if answer_headers is None:
        answer_headers = {}
    req, arrays = await plane.tensors_call(
        svc, headers, raw_path, body, decode, runs=runs, request_id=request_id, arrived=arrived,
        declared=declared, extra=call_headers, answer_headers=answer_headers,
    )  # fmt: skip
    # The outputs' size can follow the client's shapes: refused before the answer is built
    # past the limit; a large one written in a thread (it takes the GIL a block at a time).
    version = answer_headers.get(VERSION_HEADER, version)  # the one that served it
    limit = plane.max_response_bytes
    try:
        elements = 0
        for a in arrays.values():
            elements += a.size
        if elements > ENCODE_ON_LOOP_MAX:
            return await asyncio.to_thread(
                v2_infer.answer, svc.name, version, req, arrays, order, None, limit
            )
        return v2_infer.answer(svc.name, version, req, arrays, order, None, limit)
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


__all__ = ["ERRORS", "LARGE_BODY", "infer"]
