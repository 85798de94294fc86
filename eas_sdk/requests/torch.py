"""TorchRequest / TorchResponse: the PyTorch ``PredictRequest``/``PredictResponse`` of PAI-EAS.

Same names, methods and argument order as eas-prediction 0.36 and the same bytes whenever
it works, including ``TorchRequest(flag=True)``, which snappy-compresses the whole body
(raw snappy block format, identical to python-snappy's ``snappy.compress``; done with
cramjam). The response is never decompressed, as in the original.

Additions: numpy arrays of any shape (``shape=None``), DT inference (``content_type=None``),
validation naming the input, every integer DT (and bool, as int_val 0/1) and DT_STRING
travel in their fields instead of being silently dropped, and ``to_numpy(index_or_name)``.
Positional inputs are padded with empty tensors up to ``index``; feeding an index or map
key twice appends to its shape and values, as the original did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import eas as _t
from .base import ArrayDataTypes, Request, Response, prepare_feed
from .tf import _Feed, _name

_TORCH_KINDS = {v: k for k, v in _t.TORCH_FIELDS.items()}


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


class TorchRequest(ArrayDataTypes, Request):
    """Request for PyTorch-style services (protobuf ``pytorch.eas.PredictRequest``)."""

    def __init__(self, flag: bool = False) -> None:
        self.flag = flag
        self._inputs: list[_Feed] = []
        self._map_inputs: dict[str, _Feed] = {}
        self._fetches: list[int] = []
        self._debug_level = 0
        self._body: bytes | None = None
        self._body_flag: bool | None = None

    def __repr__(self) -> str:
        feeds = [(_t.DT_NAMES.get(f.dtype, f.dtype), f.dims) for f in self._inputs]
        maps = {k: (_t.DT_NAMES.get(f.dtype, f.dtype), f.dims) for k, f in self._map_inputs.items()}
        return f"TorchRequest(flag={self.flag}, inputs={feeds}, map_inputs={maps}, fetch={self._fetches})"

    __str__ = __repr__

    def set_debug_level(self, dbg_lvl: int = 0) -> None:
        level = _index(dbg_lvl, "debug level")
        if not _t.INT32_MIN <= level <= _t.INT32_MAX:
            raise ValueError(f"debug level {level} out of int32 range")
        self._debug_level = level
        self._body = None

    def add_feed(self, index: int, shape: Any, content_type: Any, content: Any) -> None:
        """Set positional input ``index`` (earlier positions are padded with empty tensors)."""
        idx = _index(index, "index")
        if idx < 0:
            raise ValueError(f"input index must be >= 0, got {idx}")
        dt, dims, field, chunks = prepare_feed(f"input {idx}", shape, content_type, content, "torch")
        while len(self._inputs) <= idx:
            self._inputs.append(_Feed())
        self._merge(self._inputs[idx], dt, dims, field, chunks)

    def add_feed_map(self, index: str, shape: Any, content_type: Any, content: Any) -> None:
        """Set named input ``index`` (the ``map_inputs`` field)."""
        key = _name(index, "map input name")
        dt, dims, field, chunks = prepare_feed(f"map input {key!r}", shape, content_type, content, "torch")
        feed = self._map_inputs.get(key)
        if feed is None:
            feed = self._map_inputs[key] = _Feed()
        self._merge(feed, dt, dims, field, chunks)

    def _merge(self, feed: _Feed, dt: int, dims: list[int], field: int, chunks: list[Any]) -> None:
        feed.dtype = dt
        feed.dims.extend(dims)
        feed.fields.setdefault(field, []).extend(chunks)
        self._body = None

    def add_fetch(self, output_index: int) -> None:
        """Ask for positional output ``output_index`` only (repeatable)."""
        idx = _index(output_index, "output index")
        if not _t.INT32_MIN <= idx <= _t.INT32_MAX:
            raise ValueError(f"output index {idx} out of int32 range")
        self._fetches.append(idx)
        self._body = None

    def _serialize(self) -> bytes:
        pieces: list[Any] = []
        for feed in self._inputs:
            if not feed.dtype and not feed.dims and not feed.fields:
                pieces.append(b"\x0a\x00")  # padding: an empty ArrayProto
                continue
            vp, vs = _t.array_proto(feed.dtype, feed.dims, feed.fields, _TORCH_KINDS)
            pieces += [b"\x0a", _t.varint(vs), *vp]
        if self._fetches:
            payload = _t.encode_varints(np.array(self._fetches, dtype=np.int64))
            pieces += [b"\x12", _t.varint(len(payload)), payload]
        for key, feed in self._map_inputs.items():
            vp, vs = _t.array_proto(feed.dtype, feed.dims, feed.fields, _TORCH_KINDS)
            pieces += _t.map_entry(b"\x1a", key, vp, vs)[0]
        if self._debug_level:
            pieces += [b"\xa0\x06", _t.varint(self._debug_level)]
        return b"".join(pieces)

    def to_string(self) -> bytes:
        """The serialized request, snappy-compressed when ``flag`` is true (cached)."""
        flag = bool(self.flag)
        if self._body is None or self._body_flag != flag:
            body = self._serialize()
            if flag:
                try:
                    import cramjam  # python-snappy's compress() is cramjam.snappy.compress_raw
                except ImportError as exc:
                    raise ImportError(
                        "TorchRequest(flag=True) compresses with snappy: pip install 'easkit[snappy]'"
                    ) from exc

                body = bytes(cramjam.snappy.compress_raw(body))
            self._body, self._body_flag = body, flag
        return self._body

    @property
    def request_data(self) -> Any:
        """A protobuf ``PredictRequest`` parsed from the uncompressed body (a snapshot)."""
        from .._proto import torch_predict_pb2

        return torch_predict_pb2.PredictRequest.FromString(self._serialize())

    def parse_response(self, response_data: bytes) -> TorchResponse:
        return TorchResponse(response_data)


def _flat_values(out: _t.RawArray | None) -> list[Any] | None:
    if out is None:
        return None
    try:
        kind = _t.value_kind(out.dtype, "torch")
    except ValueError:
        return None
    values = out.values(kind)
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


class TorchResponse(Response):
    """A PyTorch-style ``PredictResponse`` (positional ``outputs`` and ``map_outputs``)."""

    def __init__(self, response_data: bytes | None = None) -> None:
        self.response_data = b"" if response_data is None else response_data
        self._outputs, self._map_outputs = _t.decode_torch_response(self.response_data)
        self._pb: Any = None

    @property
    def response(self) -> Any:
        """The protobuf ``PredictResponse`` (parsed on first use), as the original exposed."""
        if self._pb is None:
            from .._proto import torch_predict_pb2

            self._pb = torch_predict_pb2.PredictResponse.FromString(bytes(self.response_data))
        return self._pb

    def __str__(self) -> str:
        return str(self.response)

    def to_string(self) -> str:
        return str(self.response)

    def __len__(self) -> int:
        return len(self._outputs)

    def map_output_names(self) -> list[str]:
        return list(self._map_outputs)

    def get_tensor_shape(self, output_index: int) -> list[int]:
        """Shape of positional output ``output_index`` (IndexError if out of range)."""
        return self._outputs[output_index].shape()

    def get_values(self, output_index: int) -> list[Any] | None:
        """Flat values of positional output ``output_index`` as Python values."""
        return _flat_values(self._outputs[output_index])

    def get_tensor_shape_map(self, output_index: str) -> list[int]:
        """Shape of map output ``output_index`` ([] if absent, as the original)."""
        out = self._map_outputs.get(output_index)
        return out.shape() if out is not None else []

    def get_values_map(self, output_index: str) -> list[Any] | None:
        """Flat values of map output ``output_index`` (None if absent, as the original)."""
        return _flat_values(self._map_outputs.get(output_index))

    def to_numpy(self, output: int | str) -> np.ndarray:
        """Positional (int) or map (str) output as a shaped ndarray."""
        if isinstance(output, str):
            out = self._map_outputs.get(output)
            if out is None:
                raise KeyError(f"no map output {output!r} in response (have {list(self._map_outputs)})")
            return out.to_tensor(f"map output {output!r}").array
        return self._outputs[output].to_tensor(f"output {output}").array


__all__ = ["TorchRequest", "TorchResponse"]
