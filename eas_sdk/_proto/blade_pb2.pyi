from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DT_UNKNOWN: _ClassVar[DataType]
    DT_FLOAT: _ClassVar[DataType]
    DT_INT32: _ClassVar[DataType]
    DT_INT64: _ClassVar[DataType]
    DT_STRING: _ClassVar[DataType]
DT_UNKNOWN: DataType
DT_FLOAT: DataType
DT_INT32: DataType
DT_INT64: DataType
DT_STRING: DataType

class Shape(_message.Message):
    __slots__ = ("dim",)
    DIM_FIELD_NUMBER: _ClassVar[int]
    dim: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dim: _Optional[_Iterable[int]] = ...) -> None: ...

class Array(_message.Message):
    __slots__ = ("blade_blob_name", "name_in_dl_model", "batchsize", "shape", "float_val", "int_val", "int64_val", "string_val")
    BLADE_BLOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_IN_DL_MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCHSIZE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VAL_FIELD_NUMBER: _ClassVar[int]
    INT_VAL_FIELD_NUMBER: _ClassVar[int]
    INT64_VAL_FIELD_NUMBER: _ClassVar[int]
    STRING_VAL_FIELD_NUMBER: _ClassVar[int]
    blade_blob_name: str
    name_in_dl_model: str
    batchsize: int
    shape: Shape
    float_val: _containers.RepeatedScalarFieldContainer[float]
    int_val: _containers.RepeatedScalarFieldContainer[int]
    int64_val: _containers.RepeatedScalarFieldContainer[int]
    string_val: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, blade_blob_name: _Optional[str] = ..., name_in_dl_model: _Optional[str] = ..., batchsize: _Optional[int] = ..., shape: _Optional[_Union[Shape, _Mapping]] = ..., float_val: _Optional[_Iterable[float]] = ..., int_val: _Optional[_Iterable[int]] = ..., int64_val: _Optional[_Iterable[int]] = ..., string_val: _Optional[_Iterable[bytes]] = ...) -> None: ...

class OutputInfo(_message.Message):
    __slots__ = ("blade_blob_name", "name_in_dl_model", "data_type")
    BLADE_BLOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_IN_DL_MODEL_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    blade_blob_name: str
    name_in_dl_model: str
    data_type: DataType
    def __init__(self, blade_blob_name: _Optional[str] = ..., name_in_dl_model: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("tf_signature_name", "inputs", "output_info")
    TF_SIGNATURE_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_INFO_FIELD_NUMBER: _ClassVar[int]
    tf_signature_name: str
    inputs: _containers.RepeatedCompositeFieldContainer[Array]
    output_info: _containers.RepeatedCompositeFieldContainer[OutputInfo]
    def __init__(self, tf_signature_name: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Array, _Mapping]]] = ..., output_info: _Optional[_Iterable[_Union[OutputInfo, _Mapping]]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[Array]
    def __init__(self, outputs: _Optional[_Iterable[_Union[Array, _Mapping]]] = ...) -> None: ...
