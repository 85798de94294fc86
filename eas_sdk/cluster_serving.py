"""Cluster Serving style clients over an asynchronous EAS service.

``InputQueue``/``OutputQueue`` keep the calls of BigDL / Analytics Zoo Cluster Serving
(``enqueue(uri, **inputs)``, ``query(uri)``, ``dequeue()``, ``predict(json_str)``) but talk
to the gateway's queue service instead of Redis: an async service ``svc`` has its input
queue at ``/api/predict/svc`` and its results at ``/api/predict/svc/sink``.

* ``enqueue`` writes one record per instance in the onnx processor's JSON form
  (``{"inputs": {...}}``, see :mod:`eas_sdk._core.cluster_serving` for how each input kind
  maps onto model inputs), tagged ``uri=<uri>``; the gateway copies the tag onto the result.
* ``query(uri)`` reads the result for ``uri`` without removing it (``None`` while there is
  none yet); ``dequeue()`` returns and removes every available result as ``{uri: result}``.
* A result is an ndarray when the model has one output, else ``{output name: ndarray}``;
  the batch axis of one that ``enqueue`` added is removed again. A failed inference gives a
  :class:`PredictException` (raised by ``query``, returned as the value by ``dequeue``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._core.cluster_serving import (
    ClusterServingInputError,
    decode_image,
    outputs_from_reply,
    sparse_inputs,
    sparse_to_coo,
    tensor_to_wire,
    top_of,
)
from ._core.constants import SINK_SUFFIX, TAG_STATUS
from ._core.failures import FailureKind
from ._transports import HTTPTransport, Request, TransportFailure
from .errors import ConnectError, PredictException, TimeoutError, error_for_status

TAG_URI = "uri"
# One dequeue() page; dequeue loops until the sink has nothing more.
DEQUEUE_PAGE = 1000
DEQUEUE_MAX_PAGES = 10_000


def _endpoint(host: str | None, port: int | str | None, endpoint: str | None) -> str:
    if endpoint:
        return endpoint
    host = host or os.environ.get("EAS_ENDPOINT_HOST", "127.0.0.1")
    port = port or os.environ.get("EAS_ENDPOINT_PORT", "8080")
    return f"{host}:{port}"


def _service(name: str | None) -> str:
    name = name or os.environ.get("EAS_SERVICE_NAME")
    if not name:
        raise ValueError("InputQueue/OutputQueue need the async service's name (name= or EAS_SERVICE_NAME)")
    return name


def _image_input(name: str, value: Mapping[str, Any]) -> np.ndarray:
    if set(value) == {"path"}:
        try:
            with open(os.fspath(value["path"]), "rb") as f:
                raw = f.read()
        except OSError as exc:
            msg = f"{name}: cannot read image {value['path']!r}: {exc.strerror}"
            raise ClusterServingInputError(msg) from None
        return decode_image(raw, name)
    if set(value) == {"b64"}:
        b64 = value["b64"]
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ClusterServingInputError(f"{name}: b64 is not valid base64") from None
        return decode_image(raw, name)
    raise ClusterServingInputError(f"{name}: an image is given as {{'path': ...}} or {{'b64': ...}}")


def encode_instance(inputs: Mapping[str, Any]) -> bytes:
    """One instance's named inputs -> the onnx processor's JSON request (batch of one)."""
    if not inputs:
        raise ClusterServingInputError("enqueue needs at least one named input")
    wire: dict[str, Any] = {}
    for name, value in inputs.items():
        if isinstance(value, Mapping):
            arr = _image_input(name, value)
        elif (
            isinstance(value, (list, tuple))
            and len(value) == 3
            and all(isinstance(v, np.ndarray) for v in value)
        ):
            # [indices (ndim x nnz), values (nnz), shape (ndim)] as in Cluster Serving.
            idx, vals, shp = sparse_to_coo(value[0], value[1], value[2], name, points_first=False)
            wire.update(sparse_inputs(name, _batch_of_one(idx, vals, shp)))
            continue
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            arr = np.asarray(value, dtype=np.str_)
        elif isinstance(value, str):
            arr = np.asarray([value], dtype=np.str_)
        else:
            try:
                arr = np.asarray(value)
            except ValueError:
                raise ClusterServingInputError(f"{name}: nested lists must be rectangular") from None
            if arr.dtype == object:
                raise ClusterServingInputError(f"{name}: unsupported value of type {type(value).__name__}")
        wire[name] = tensor_to_wire(arr[np.newaxis, ...])
    return json.dumps({"inputs": wire}).encode()


def _batch_of_one(
    idx: np.ndarray, vals: np.ndarray, shp: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lead = np.zeros((idx.shape[0], 1), dtype=np.int64)
    return np.concatenate([lead, idx], axis=1), vals, np.concatenate([[1], shp]).astype(np.int64)


def decode_result(data: bytes, tags: Mapping[str, str]) -> Any:
    """A sink record -> ndarray | {name: ndarray}; a failed inference -> PredictException."""
    status = int(tags.get(TAG_STATUS, "200") or 200)
    if status != 200:
        # The worker's error reply, typed and decoded as any other client's error.
        return error_for_status(status, data, request_id=tags.get("requestId"))
    try:
        outputs = outputs_from_reply(json.loads(data))
    except (ValueError, TypeError, KeyError) as exc:
        return PredictException(500, f"result is not an onnx JSON reply: {exc}")
    out = {k: (v[0] if v.ndim >= 1 and v.shape[0] == 1 else v) for k, v in outputs.items()}
    if len(out) == 1:
        return next(iter(out.values()))
    return out


class SyncResponse:
    """What ``InputQueue(sync=True).predict`` returns (``.text``, ``.status_code``, ``.json()``)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code = status
        self.content = body

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def __repr__(self) -> str:
        return f"<SyncResponse [{self.status_code}]>"


class InputQueue:
    """Put instances to an async service's input queue (or call the REST path with ``sync``)."""

    def __init__(
        self,
        host: str | None = None,
        port: int | str | None = None,
        sync: bool = False,
        frontend_url: str | None = None,
        *,
        name: str | None = None,
        token: str | None = None,
        endpoint: str | None = None,
        timeout_ms: int = 5000,
    ) -> None:
        self.sync = sync
        self.name = name or os.environ.get("EAS_SERVICE_NAME")
        self._token = token
        self._timeout_ms = timeout_ms
        self.frontend_url = frontend_url
        self._client: Any = None
        self._http: HTTPTransport | None = None
        if sync:
            if not frontend_url:
                raise ValueError("InputQueue(sync=True) needs frontend_url")
            self._http = HTTPTransport(max_connections=10)
        else:
            from .queue import QueueClient

            self._client = QueueClient(_endpoint(host, port, endpoint), _service(self.name))
            if token:
                self._client.set_token(token)
            self._client.set_timeout(timeout_ms)
            self._client.init()

    def __repr__(self) -> str:  # never show the token
        return f"InputQueue(name={self.name!r}, sync={self.sync})"

    def enqueue(self, uri: str, **data: Any) -> tuple[str, str]:
        """Put one instance tagged with ``uri``; returns (index, request id) of the record."""
        if self._client is None:
            raise ValueError("enqueue needs an InputQueue created with sync=False")
        if not isinstance(uri, str) or not uri:
            raise ValueError("uri must be a non-empty string")
        index, request_id = self._client.put(encode_instance(data), {TAG_URI: uri})
        return index, request_id

    def predict(self, request_str: str | bytes | Mapping[str, Any]) -> SyncResponse:
        """POST a ``{"instances": [...]}`` request to the gateway's Cluster Serving REST path."""
        if self._http is None:
            raise ValueError("predict needs InputQueue(sync=True, frontend_url=...)")
        if isinstance(request_str, Mapping):
            body = json.dumps(request_str).encode()
        else:
            body = request_str.encode() if isinstance(request_str, str) else bytes(request_str)
        base = str(self.frontend_url).rstrip("/")
        if "://" not in base:
            base = "http://" + base
        url = f"{base}/api/cluster-serving/{self.name}/predict" if self.name else f"{base}/predict"
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = self._token
        try:
            resp = self._http.handle_request(Request("POST", url, headers, body, self._timeout_ms / 1000.0))
        except TransportFailure as exc:
            cls = TimeoutError if exc.kind is FailureKind.TIMEOUT else ConnectError
            raise cls(f"url: {url}, error: {exc.reason}") from None
        return SyncResponse(resp.status, resp.body)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> InputQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutputQueue:
    """Read results of an async service from its sink queue."""

    def __init__(
        self,
        host: str | None = None,
        port: int | str | None = None,
        *,
        name: str | None = None,
        token: str | None = None,
        endpoint: str | None = None,
        timeout_ms: int = 5000,
    ) -> None:
        from .queue import QueueClient

        self.name = _service(name)
        self._client = QueueClient(_endpoint(host, port, endpoint), f"{self.name}/{SINK_SUFFIX}")
        if token:
            self._client.set_token(token)
        self._client.set_timeout(timeout_ms)
        self._client.init()

    def __repr__(self) -> str:
        return f"OutputQueue(name={self.name!r})"

    def query(
        self, uri: str, timeout: str = "0s", top_n: int | None = None, output: str | None = None
    ) -> Any:
        """The result for ``uri`` (left in the sink), or None when there is none yet.

        ``timeout`` (a duration such as ``"2s"``) waits that long for it to arrive. ``top_n``:
        Cluster Serving's top-N answer instead, ``{"class index": probability}`` for the
        ``top_n`` most probable classes, most probable first (``output`` names the
        probabilities of a model with several outputs).
        """
        frames = self._client.get(index=0, length=1, timeout=timeout, auto_delete=False, tags={TAG_URI: uri})
        if not frames:
            return None
        result = decode_result(bytes(frames[0].data), dict(frames[0].tags))
        if isinstance(result, PredictException):
            raise result
        return result if top_n is None else top_of(result, top_n, output)

    def dequeue(self, top_n: int | None = None, output: str | None = None) -> dict[str, Any]:
        """Every available result as ``{uri: result}``, removed from the sink; ``top_n`` and
        ``output`` as for :meth:`query` (a failed inference stays a PredictException)."""
        out: dict[str, Any] = {}
        for _ in range(DEQUEUE_MAX_PAGES):
            frames = self._client.get(index=0, length=DEQUEUE_PAGE, timeout="0s", auto_delete=True)
            if not frames:
                break
            for f in frames:
                tags = dict(f.tags)
                key = tags.get(TAG_URI) or tags.get("requestId", str(f.index))
                result = decode_result(bytes(f.data), tags)
                if top_n is not None and not isinstance(result, PredictException):
                    result = top_of(result, top_n, output)
                out[key] = result
            if len(frames) < DEQUEUE_PAGE:
                break
        return out

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OutputQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["InputQueue", "OutputQueue", "SyncResponse", "decode_result", "encode_instance"]
