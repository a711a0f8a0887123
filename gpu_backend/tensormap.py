"""TMA descriptors from the driver's tensor-map encoder, built from the same box and swizzle the
verifier checked (the kernel's TmaSpec)."""
from __future__ import annotations

import ctypes

from .driver import check

_DTYPE = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
          "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "i32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
          "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}
_SWZ = {"none": "CU_TENSOR_MAP_SWIZZLE_NONE", "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
        "64B": "CU_TENSOR_MAP_SWIZZLE_64B", "128B": "CU_TENSOR_MAP_SWIZZLE_128B"}
_SIZE = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u8": 1}


def encode_tiled(ptr: int, dtype: str, shape: list[int], box: list[int], swizzle: str = "128B",
                 oob_fill: str = "zero", strides: list[int] | None = None) -> bytes:
    """Encode a tiled tensor map; shape/box/strides are outermost-first in elements (as in the IR).
    Returns the 128 opaque bytes to pass by value as a __grid_constant__ kernel argument."""
    from cuda.bindings import driver
    rank = len(shape)
    es = _SIZE[dtype]
    if strides is None:
        strides = [1] * rank
        for d in range(rank - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
    dims = [driver.cuuint64_t(int(x)) for x in reversed(shape)]
    # globalStrides: bytes, for dims 1..rank-1 in innermost-first order
    gstrides = [driver.cuuint64_t(int(s * es)) for s in list(reversed(strides))[1:]]
    boxd = [driver.cuuint32_t(int(x)) for x in reversed(box)]
    estr = [driver.cuuint32_t(1)] * rank
    fill = (driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA if oob_fill == "nan"
            else driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    tmap = check(driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, _DTYPE[dtype]), rank, ptr, dims, gstrides, boxd, estr,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, _SWZ[swizzle]),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B, fill), "cuTensorMapEncodeTiled")
    raw = ctypes.string_at(tmap.getPtr(), 128)
    return raw
