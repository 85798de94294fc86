from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ArrayDataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DT_INVALID: _ClassVar[ArrayDataType]
    DT_FLOAT: _ClassVar[ArrayDataType]
    DT_DOUBLE: _ClassVar[ArrayDataType]
    DT_INT32: _ClassVar[ArrayDataType]
    DT_UINT8: _ClassVar[ArrayDataType]
    DT_INT16: _ClassVar[ArrayDataType]
    DT_INT8: _ClassVar[ArrayDataType]
    DT_STRING: _ClassVar[ArrayDataType]
    DT_COMPLEX64: _ClassVar[ArrayDataType]
    DT_INT64: _ClassVar[ArrayDataType]
    DT_BOOL: _ClassVar[ArrayDataType]
    DT_QINT8: _ClassVar[ArrayDataType]
    DT_QUINT8: _ClassVar[ArrayDataType]
    DT_QINT32: _ClassVar[ArrayDataType]
    DT_BFLOAT16: _ClassVar[ArrayDataType]
    DT_QINT16: _ClassVar[ArrayDataType]
    DT_QUINT16: _ClassVar[ArrayDataType]
    DT_UINT16: _ClassVar[ArrayDataType]
    DT_COMPLEX128: _ClassVar[ArrayDataType]
    DT_HALF: _ClassVar[ArrayDataType]
    DT_RESOURCE: _ClassVar[ArrayDataType]
    DT_VARIANT: _ClassVar[ArrayDataType]
DT_INVALID: ArrayDataType
DT_FLOAT: ArrayDataType
DT_DOUBLE: ArrayDataType
DT_INT32: ArrayDataType
DT_UINT8: ArrayDataType
DT_INT16: ArrayDataType
DT_INT8: ArrayDataType
DT_STRING: ArrayDataType
DT_COMPLEX64: ArrayDataType
DT_INT64: ArrayDataType
DT_BOOL: ArrayDataType
DT_QINT8: ArrayDataType
DT_QUINT8: ArrayDataType
DT_QINT32: ArrayDataType
DT_BFLOAT16: ArrayDataType
DT_QINT16: ArrayDataType
DT_QUINT16: ArrayDataType
DT_UINT16: ArrayDataType
DT_COMPLEX128: ArrayDataType
DT_HALF: ArrayDataType
DT_RESOURCE: ArrayDataType
DT_VARIANT: ArrayDataType

class ArrayShape(_message.Message):
    __slots__ = ("dim",)
    DIM_FIELD_NUMBER: _ClassVar[int]
    dim: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dim: _Optional[_Iterable[int]] = ...) -> None: ...

class ArrayProto(_message.Message):
    __slots__ = ("dtype", "array_shape", "float_val", "double_val", "int_val", "string_val", "int64_val", "bool_val")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ARRAY_SHAPE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VAL_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VAL_FIELD_NUMBER: _ClassVar[int]
    INT_VAL_FIELD_NUMBER: _ClassVar[int]
    STRING_VAL_FIELD_NUMBER: _ClassVar[int]
    INT64_VAL_FIELD_NUMBER: _ClassVar[int]
    BOOL_VAL_FIELD_NUMBER: _ClassVar[int]
    dtype: ArrayDataType
    array_shape: ArrayShape
    float_val: _containers.RepeatedScalarFieldContainer[float]
    double_val: _containers.RepeatedScalarFieldContainer[float]
    int_val: _containers.RepeatedScalarFieldContainer[int]
    string_val: _containers.RepeatedScalarFieldContainer[bytes]
    int64_val: _containers.RepeatedScalarFieldContainer[int]
    bool_val: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, dtype: _Optional[_Union[ArrayDataType, str]] = ..., array_shape: _Optional[_Union[ArrayShape, _Mapping]] = ..., float_val: _Optional[_Iterable[float]] = ..., double_val: _Optional[_Iterable[float]] = ..., int_val: _Optional[_Iterable[int]] = ..., string_val: _Optional[_Iterable[bytes]] = ..., int64_val: _Optional[_Iterable[int]] = ..., bool_val: _Optional[_Iterable[bool]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("signature_name", "inputs", "output_filter")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ArrayProto
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ArrayProto, _Mapping]] = ...) -> None: ...
    SIGNATURE_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FILTER_FIELD_NUMBER: _ClassVar[int]
    signature_name: str
    inputs: _containers.MessageMap[str, ArrayProto]
    output_filter: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, signature_name: _Optional[str] = ..., inputs: _Optional[_Mapping[str, ArrayProto]] = ..., output_filter: _Optional[_Iterable[str]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("outputs",)
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ArrayProto
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ArrayProto, _Mapping]] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.MessageMap[str, ArrayProto]
    def __init__(self, outputs: _Optional[_Mapping[str, ArrayProto]] = ...) -> None: ...
