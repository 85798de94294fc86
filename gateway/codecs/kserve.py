"""KServe's V2 REST protocol (the Open Inference Protocol): the JSON documents shared by
every V2 route, model metadata, Triton's model configuration and statistics extensions.

Building answers only (no I/O). Inference requests and answers, JSON and binary, are in
``gateway.codecs.v2_infer``; V1 is ``gateway.codecs.kserve_v1``. Model metadata is what
the service's processor reported when its workers became ready
(gateway.core.metadata.ModelMetadata). Every error is ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.core.metadata import ModelMetadata, TensorSpec

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

MAX_NESTING = 32
JSON_TYPE = "application/json"
BINARY_HEADER = "Inference-Header-Content-Length"


class KServeRequestError(ValueError):
    """Bad input: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def loads(body: bytes) -> Any:
    try:
        return _orjson.loads(body) if _orjson is not None else json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise KServeRequestError(f"body is not valid JSON ({str(exc)[:120]})") from None


def dumps(doc: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(doc)
    return json.dumps(doc, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- V2


def flatten(data: list[Any], where: str) -> list[Any]:
    """Row-major flattening of (possibly) nested lists; flat lists are returned as they are."""
    if not any(isinstance(v, list) for v in data):
        return data
    out: list[Any] = []

    def walk(v: list[Any], depth: int) -> None:
        if depth > MAX_NESTING:
            raise KServeRequestError(f"{where}: data nested more than {MAX_NESTING} deep")
        for item in v:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                out.append(item)

    walk(data, 0)
    return out


def v2_metadata(model_name: str, meta: ModelMetadata, versions: Sequence[str] = ()) -> bytes:
    """``versions``: the model's versions, when the service declares them (else the processor's)."""
    return dumps(
        {
            "name": model_name,
            "versions": list(versions or meta.versions),
            "platform": meta.platform,
            "inputs": [t.as_json() for t in meta.inputs],
            "outputs": [t.as_json() for t in meta.outputs],
        }
    )


# The backend a model configuration names, by the platform its metadata gives: the runtime that
# serves it (the estimator runtimes by their library's name; user code is Python's).
_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "sklearn": "sklearn",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}


def triton_config(
    model_name: str,
    meta: ModelMetadata,
    *,
    workers: int,
    max_batch_size: int,
    queue_delay_ms: float,
    all_versions: bool = False,
) -> bytes:
    """The model's configuration in Triton's JSON form (``GET /v2/models/<m>/config``), derived
    from its metadata and the service's settings: with dynamic batching on, the first (batch)
    dimension leaves ``dims`` and ``max_batch_size`` says how many rows a batch takes.
    ``all_versions``: the service serves several versions of its model, all at once."""
    batched = max_batch_size > 1

    def tensor(t: TensorSpec) -> dict[str, Any]:
        dims = list(t.shape[1:]) if batched and t.shape else list(t.shape)
        return {
            "name": t.name,
            "data_type": "TYPE_" + _TRITON_TYPES.get(t.datatype, t.datatype),
            "dims": dims,
        }

    doc: dict[str, Any] = {
        "name": model_name,
        "platform": meta.platform,
        "backend": _BACKENDS.get(meta.platform, "python"),
        "version_policy": {"all": {}} if all_versions else {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size if batched else 0,
        "input": [tensor(t) for t in meta.inputs],
        "output": [tensor(t) for t in meta.outputs],
        "instance_group": [{"name": model_name, "kind": "KIND_CPU", "count": workers}],
    }
    if batched:
        doc["dynamic_batching"] = {"max_queue_delay_microseconds": round(queue_delay_ms * 1000)}
    return dumps(doc)


def triton_statistics(figures: Sequence[tuple[str, str, Any]]) -> bytes:
    """Triton's statistics extension answer for (model name, version, InferStats) triples. The gateway
    measures a call as a whole: ``compute_infer`` is the processor's own time, ``queue`` the
    rest of a successful call (waiting, transport); input and output are part of those."""

    def d(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    stats = []
    for name, version, st in figures:
        n = st.success_count
        stats.append(
            {
                "name": name,
                "version": version,
                "last_inference": st.last_inference_ms,
                "inference_count": n,
                "execution_count": n,
                "inference_stats": {
                    "success": d(n, st.success_ns),
                    "fail": d(st.fail_count, st.fail_ns),
                    "queue": d(n, max(0, st.success_ns - st.compute_ns)),
                    "compute_input": d(n, 0),
                    "compute_infer": d(n, st.compute_ns),
                    "compute_output": d(n, 0),
                    "cache_hit": d(0, 0),
                    "cache_miss": d(0, 0),
                },
                "batch_stats": [],
            }
        )
    return dumps({"model_stats": stats})


# Triton's model configuration names a V2 datatype TYPE_<name>, except BYTES (TYPE_STRING).
_TRITON_TYPES = {"BYTES": "STRING"}


__all__ = [
    "BINARY_HEADER",
    "JSON_TYPE",
    "KServeRequestError",
    "dumps",
    "flatten",
    "loads",
    "triton_config",
    "triton_statistics",
    "v2_metadata",
]
