"""Scalar element types of CAKE IR and their sizes / C spellings."""
from __future__ import annotations

from typing import Literal

DType = Literal["i8", "u8", "i32", "u32", "i64", "u64", "pred", "f16", "bf16", "f32", "f64"]
FloatDType = Literal["f16", "bf16", "f32"]

SIZE = {"i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "pred": 1, "f16": 2, "bf16": 2,
        "f32": 4, "f64": 8}
C_TYPE = {"i8": "int8_t", "u8": "uint8_t", "i32": "int", "u32": "unsigned", "i64": "long long",
          "u64": "unsigned long long", "pred": "bool", "f16": "__half", "bf16": "__nv_bfloat16",
          "f32": "float", "f64": "double"}
FLOAT = {"f16", "bf16", "f32", "f64"}
INTEGER = {"i8", "u8", "i32", "u32", "i64", "u64"}


def size(dtype: str) -> int:
    return SIZE[dtype]
