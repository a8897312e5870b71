"""Tensor element types as the three file formats name them, without importing torch.

torch.save names a dtype by its legacy storage class (`torch.FloatStorage`) or,
for dtypes newer than typed storages, by `torch.<dtype>` next to an
`UntypedStorage`; safetensors by a short code (`F32`); DCP metadata by the
`torch.<dtype>` global. One table keeps the three in step.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # attribute of the torch module: torch.<name>
    itemsize: int
    storage: str | None  # legacy typed storage class, None: UntypedStorage + _rebuild_tensor_v3
    safetensors: str | None
    floating: bool = False


_TABLE = [
    DType("float64", 8, "DoubleStorage", "F64", True),
    DType("float32", 4, "FloatStorage", "F32", True),
    DType("float16", 2, "HalfStorage", "F16", True),
    DType("bfloat16", 2, "BFloat16Storage", "BF16", True),
    DType("int64", 8, "LongStorage", "I64"),
    DType("int32", 4, "IntStorage", "I32"),
    DType("int16", 2, "ShortStorage", "I16"),
    DType("int8", 1, "CharStorage", "I8"),
    DType("uint8", 1, "ByteStorage", "U8"),
    DType("bool", 1, "BoolStorage", "BOOL"),
    DType("complex128", 16, "ComplexDoubleStorage", None),
    DType("complex64", 8, "ComplexFloatStorage", "C64"),
    DType("uint16", 2, None, "U16"),
    DType("uint32", 4, None, "U32"),
    DType("uint64", 8, None, "U64"),
    DType("complex32", 4, None, None),
    DType("float8_e4m3fn", 1, None, "F8_E4M3", True),
    DType("float8_e5m2", 1, None, "F8_E5M2", True),
    DType("float8_e4m3fnuz", 1, None, "F8_E4M3FNUZ", True),
    DType("float8_e5m2fnuz", 1, None, "F8_E5M2FNUZ", True),
    DType("float8_e8m0fnu", 1, None, None, True),
    DType("float4_e2m1fn_x2", 1, None, None),
]

BY_NAME = {d.name: d for d in _TABLE}
BY_STORAGE = {d.storage: d for d in _TABLE if d.storage}
BY_SAFETENSORS = {d.safetensors: d for d in _TABLE if d.safetensors}

# Storage classes of quantized tensors: refused, their bytes need scales and zero points.
QUANTIZED_STORAGES = {"QInt8Storage", "QInt32Storage", "QUInt8Storage", "QUInt4x2Storage", "QUInt2x4Storage"}

# --dtype spellings
CAST_TARGETS = {"bf16": BY_NAME["bfloat16"], "fp16": BY_NAME["float16"], "fp32": BY_NAME["float32"]}
