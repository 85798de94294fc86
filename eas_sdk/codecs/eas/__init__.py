"""The EAS predict protobuf family (TF, Torch, Blade): one codec for the SDK and the gateway.

Modules by responsibility: ``dtypes`` (DT tables, numpy mapping), ``wire`` (varints, the
field scanner, packed fields), ``values`` (value conversion and checks), ``arrays`` and
``raw`` (ArrayProto encoding and decoding), ``tf``, ``torch``, ``blade`` (each format's
request and response, both directions).

Client side
-----------
``encode_tf_request(signature_name, inputs, output_filter=()) -> bytes``
``decode_tf_response(buf) -> dict[str, RawArray]``
``encode_torch_request(inputs, map_inputs=None, output_filter=(), debug_level=0) -> bytes``
``decode_torch_response(buf) -> (list[RawArray], dict[str, RawArray])``
``encode_blade_request(signature_name, inputs, output_info=()) -> bytes``
   inputs: sequence of ``BladeInput(name, array, batchsize=None, dtype=None)``;
   output_info: sequence of ``(name, blade_dt)``
``decode_blade_response(buf) -> list[RawArray]`` (``.name_in_dl_model`` and ``.batchsize`` set)

Server side
-----------
``decode_tf_request(buf) -> TFRequestData(signature_name, inputs: dict[str, Tensor], output_filter)``
``encode_tf_response(outputs: Mapping[str, ndarray | Tensor] | Iterable[(name, value)]) -> bytes``
``decode_torch_request(buf, compressed=False) -> TorchRequestData(inputs: list[Tensor | None],
   map_inputs: dict[str, Tensor], output_filter: list[int], debug_level)``
   (``compressed=None`` sniffs a snappy body, ``True`` requires one)
``encode_torch_response(outputs: Iterable[ndarray | Tensor], map_outputs=None) -> bytes``
``decode_blade_request(buf) -> BladeRequestData(signature_name, inputs: list[BladeTensor],
   output_info: list[(name, blade_dt)])``
``encode_blade_response(outputs: Mapping[str, ndarray] | Sequence[BladeInput]) -> bytes``
The ``*_raw`` decoders parse without validating tensors, for a server's own checks.

A server's request handling (``server``, ``decoded``, ``binding``, ``sniff``, ``json_form``):
``decode_request(body, configured="auto", header=None) -> DecodedRequest`` resolves the
format (header, else the service setting, else sniffed; JSON included), ``bind_inputs`` and
``select_outputs`` map it onto a model's ``TensorSpec`` list (``bind_arrays`` and
``output_positions`` do the same for arrays a server decoded itself, such as V2's),
``encode_response`` answers in the request's format; every bad body raises ``InvalidInput``
(HTTP 400).

Inputs to the encoders may be ndarrays, Tensors or (for requests) nested lists; DT codes are
inferred from numpy dtypes when not given. Output is byte-identical to protobuf's own
serialisation and to eas-prediction 0.36 wherever that client works. Everything malformed
raises ``CodecError`` (a ValueError) for wire data, and ValueError/TypeError naming the
tensor for bad values. Decoders accept bytes, bytearray or memoryview. Not supported on the
wire (no value field): DT_HALF, DT_BFLOAT16, DT_COMPLEX*, DT_RESOURCE, DT_VARIANT.
"""

from __future__ import annotations

from .arrays import (
    Tensor,
    array_proto,
    map_entry,
    request_array,
    response_array,
)
from .binding import TensorSpec, bind_arrays, bind_inputs, conform, output_positions, refusal, select_outputs
from .blade import (
    BladeInput,
    BladeRequestData,
    BladeTensor,
    blade_array,
    decode_blade_request,
    decode_blade_request_raw,
    decode_blade_response,
    encode_blade_request,
    encode_blade_response,
    output_info_bytes,
)
from .decoded import (
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    FORMATS,
    MAX_ELEMENTS,
    MAX_INPUTS,
    DecodedRequest,
    InputTensor,
    InvalidInput,
    count_elements,
    dtype_name,
    type_str,
)
from .dtypes import (
    BLADE_DT_FLOAT,
    BLADE_DT_INT32,
    BLADE_DT_INT64,
    BLADE_DT_NAMES,
    BLADE_DT_STRING,
    BLADE_DT_UNKNOWN,
    BLADE_FIELD_KINDS,
    BLADE_FIELDS,
    BLADE_KINDS,
    BLADE_NUMPY_DTYPES,
    DT_BFLOAT16,
    DT_BOOL,
    DT_COMPLEX64,
    DT_COMPLEX128,
    DT_DOUBLE,
    DT_FLOAT,
    DT_HALF,
    DT_INT8,
    DT_INT16,
    DT_INT32,
    DT_INT64,
    DT_INVALID,
    DT_NAMES,
    DT_QINT8,
    DT_QINT16,
    DT_QINT32,
    DT_QUINT8,
    DT_QUINT16,
    DT_RESOURCE,
    DT_STRING,
    DT_UINT8,
    DT_UINT16,
    DT_VARIANT,
    FIELD_KINDS,
    FIELDS,
    FLT_MAX,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    KIND_BOOL,
    KIND_BYTES,
    KIND_DOUBLE,
    KIND_FLOAT,
    KIND_INT32,
    KIND_INT64,
    NUMPY_DTYPES,
    TF_FIELD_KINDS,
    TF_FIELDS,
    TORCH_FIELD_KINDS,
    TORCH_FIELDS,
    Kind,
    dt_for_numpy,
    numpy_dtype,
    value_field,
    value_kind,
)
from .json_form import decode_json, encode_json_response
from .raw import (
    RawArray,
)
from .server import blade_outputs, decode, decode_request, encode_response, resolve_format
from .sniff import sniff
from .tf import (
    TFRequestData,
    decode_tf_request,
    decode_tf_request_raw,
    decode_tf_response,
    encode_tf_request,
    encode_tf_response,
)
from .torch import (
    TorchRequestData,
    decode_torch_request,
    decode_torch_request_raw,
    decode_torch_response,
    encode_torch_request,
    encode_torch_response,
    is_placeholder,
)
from .values import (
    check_shape,
    response_strings,
    shape_size,
    to_wire_values,
    wire_payload,
)
from .wire import (
    CodecError,
    Pieces,
    as_buffer,
    decode_varints,
    encode_varints,
    fields,
    read_varint,
    scan_fields,
    snappy_decompress,
    varint,
)

__all__ = [
    "BLADE_DT_FLOAT",
    "BLADE_DT_INT32",
    "BLADE_DT_INT64",
    "BLADE_DT_NAMES",
    "BLADE_DT_STRING",
    "BLADE_DT_UNKNOWN",
    "BLADE_FIELDS",
    "BLADE_FIELD_KINDS",
    "BLADE_KINDS",
    "BLADE_NUMPY_DTYPES",
    "CONTENT_TYPE_JSON",
    "CONTENT_TYPE_PROTOBUF",
    "DT_BFLOAT16",
    "DT_BOOL",
    "DT_COMPLEX64",
    "DT_COMPLEX128",
    "DT_DOUBLE",
    "DT_FLOAT",
    "DT_HALF",
    "DT_INT8",
    "DT_INT16",
    "DT_INT32",
    "DT_INT64",
    "DT_INVALID",
    "DT_NAMES",
    "DT_QINT8",
    "DT_QINT16",
    "DT_QINT32",
    "DT_QUINT8",
    "DT_QUINT16",
    "DT_RESOURCE",
    "DT_STRING",
    "DT_UINT8",
    "DT_UINT16",
    "DT_VARIANT",
    "FIELDS",
    "FIELD_KINDS",
    "FLT_MAX",
    "FORMATS",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "KIND_BOOL",
    "KIND_BYTES",
    "KIND_DOUBLE",
    "KIND_FLOAT",
    "KIND_INT32",
    "KIND_INT64",
    "MAX_ELEMENTS",
    "MAX_INPUTS",
    "NUMPY_DTYPES",
    "TF_FIELDS",
    "TF_FIELD_KINDS",
    "TORCH_FIELDS",
    "TORCH_FIELD_KINDS",
    "BladeInput",
    "BladeRequestData",
    "BladeTensor",
    "CodecError",
    "DecodedRequest",
    "InputTensor",
    "InvalidInput",
    "Kind",
    "Pieces",
    "RawArray",
    "TFRequestData",
    "Tensor",
    "TensorSpec",
    "TorchRequestData",
    "array_proto",
    "as_buffer",
    "bind_arrays",
    "bind_inputs",
    "blade_array",
    "blade_outputs",
    "check_shape",
    "conform",
    "count_elements",
    "decode",
    "decode_blade_request",
    "decode_blade_request_raw",
    "decode_blade_response",
    "decode_json",
    "decode_request",
    "decode_tf_request",
    "decode_tf_request_raw",
    "decode_tf_response",
    "decode_torch_request",
    "decode_torch_request_raw",
    "decode_torch_response",
    "decode_varints",
    "dt_for_numpy",
    "dtype_name",
    "encode_blade_request",
    "encode_blade_response",
    "encode_json_response",
    "encode_response",
    "encode_tf_request",
    "encode_tf_response",
    "encode_torch_request",
    "encode_torch_response",
    "encode_varints",
    "fields",
    "is_placeholder",
    "map_entry",
    "numpy_dtype",
    "output_info_bytes",
    "output_positions",
    "read_varint",
    "refusal",
    "request_array",
    "resolve_format",
    "response_array",
    "response_strings",
    "scan_fields",
    "select_outputs",
    "shape_size",
    "snappy_decompress",
    "sniff",
    "to_wire_values",
    "type_str",
    "value_field",
    "value_kind",
    "varint",
    "wire_payload",
]
