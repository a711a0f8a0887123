"""Device memory on cuda.bindings, with numpy on the host side (no torch).

    a = DeviceArray.alloc((M, N), "bf16")      # cuMemAlloc
    a.upload(x)                                # float array -> rounded to bf16 -> H2D
    a.poison()                                 # fill with this dtype's NaN poison pattern
    y = a.download()                           # D2H, bf16 widened to float32
    a.free()

bf16 on the host is numpy uint16 bit patterns; `f32_to_bf16_bits` rounds to nearest even (NaN stays
NaN), `bf16_bits_to_f32` widens exactly. The poison patterns are signalling-NaN payloads no arithmetic
produces (a GPU writes the canonical NaN), so "still poison" means "never written" and any other NaN
means "computed a NaN".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .driver import check

SIZE = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u32": 4, "u8": 1, "i8": 1, "f64": 8, "i64": 8, "u64": 8}

# Bit pattern written by poison(): NaN with payload 0x25/0xA5.. for floats, 0xA5 bytes for integers.
POISON_BITS = {"bf16": 0x7FA5, "f16": 0x7DA5, "f32": 0x7FA5A5A5, "i32": 0xA5A5A5A5, "u32": 0xA5A5A5A5,
               "u8": 0xA5, "i8": 0xA5, "f64": 0xA5A5A5A5, "i64": 0xA5A5A5A5, "u64": 0xA5A5A5A5}
# numpy dtype holding the raw bits of one element
BITS_DTYPE = {"bf16": np.uint16, "f16": np.uint16, "f32": np.uint32, "i32": np.uint32, "u32": np.uint32,
              "u8": np.uint8, "i8": np.uint8, "f64": np.uint64, "i64": np.uint64, "u64": np.uint64}
# numpy dtype of host values
VALUE_DTYPE = {"bf16": np.float32, "f16": np.float16, "f32": np.float32, "i32": np.int32, "u32": np.uint32,
               "u8": np.uint8, "i8": np.int8, "f64": np.float64, "i64": np.int64, "u64": np.uint64}


# ------------------------------------------------------------------------------- bf16 on numpy
def f32_to_bf16_bits(x) -> np.ndarray:
    """float -> bf16 bit patterns (uint16), round to nearest even; NaN -> canonical 0x7FC0."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32)
    # uint32 arithmetic wraps only for patterns >= 0xFFFF8001, which are NaNs (replaced below)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)


def bf16_bits_to_f32(bits) -> np.ndarray:
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (what a bf16 tensor can hold)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def to_bits(values, dtype: str) -> np.ndarray:
    """Host values -> the raw element bits the device holds (contiguous)."""
    if dtype == "bf16":
        return np.ascontiguousarray(f32_to_bf16_bits(values))
    return np.ascontiguousarray(np.asarray(values, dtype=VALUE_DTYPE[dtype])).view(BITS_DTYPE[dtype])


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Raw element bits -> host values (bf16 widened to float32)."""
    if dtype == "bf16":
        return bf16_bits_to_f32(bits)
    return np.ascontiguousarray(bits).view(VALUE_DTYPE[dtype])


def poison_mask(bits: np.ndarray, dtype: str) -> np.ndarray:
    """True where an element still holds the poison pattern (was never written)."""
    pat = POISON_BITS[dtype]
    if SIZE[dtype] == 8:
        pat = pat | (pat << 32)
    return bits == BITS_DTYPE[dtype](pat)


# ------------------------------------------------------------------------------- device arrays
@dataclass
class DeviceArray:
    """A contiguous device buffer: a raw pointer, a shape and a CAKE dtype."""

    ptr: int
    shape: tuple[int, ...]
    dtype: str
    owned: bool = True

    @classmethod
    def alloc(cls, shape: Sequence[int], dtype: str) -> "DeviceArray":
        from cuda.bindings import driver
        shape = tuple(int(s) for s in shape)
        nbytes = max(1, math.prod(shape) * SIZE[dtype])
        ptr = check(driver.cuMemAlloc(nbytes), "cuMemAlloc")
        return cls(int(ptr), shape, dtype)

    @classmethod
    def from_host(cls, values: np.ndarray, dtype: str) -> "DeviceArray":
        a = cls.alloc(np.shape(values), dtype)
        a.upload(values)
        return a

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * SIZE[self.dtype]

    def data_ptr(self) -> int:          # the same spelling as torch, so runners accept either
        return self.ptr

    def upload(self, values: np.ndarray) -> None:
        """Host values (any float/int array of this shape) -> device, converting to the dtype."""
        if tuple(np.shape(values)) != self.shape:
            raise ValueError(f"upload: shape {np.shape(values)} != {self.shape}")
        self.upload_bits(to_bits(values, self.dtype))

    def upload_bits(self, bits: np.ndarray) -> None:
        from cuda.bindings import driver
        bits = np.ascontiguousarray(bits)
        if bits.nbytes != self.nbytes:
            raise ValueError(f"upload_bits: {bits.nbytes} bytes != {self.nbytes}")
        check(driver.cuMemcpyHtoD(self.ptr, bits.ctypes.data, self.nbytes), "cuMemcpyHtoD")

    def download_bits(self) -> np.ndarray:
        from cuda.bindings import driver
        out = np.empty(self.shape, dtype=BITS_DTYPE[self.dtype])
        check(driver.cuMemcpyDtoH(out.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return out

    def download(self) -> np.ndarray:
        return from_bits(self.download_bits(), self.dtype)

    def fill_bits(self, pattern: int, stream: int = 0) -> None:
        """Asynchronously fill every element with a raw bit pattern (cuMemsetD8/D16/D32)."""
        memset_bits(self.ptr, self.nbytes, SIZE[self.dtype], pattern, stream)

    def poison(self, stream: int = 0) -> None:
        self.fill_bits(POISON_BITS[self.dtype], stream)

    def free(self) -> None:
        if self.owned and self.ptr:
            from cuda.bindings import driver
            check(driver.cuMemFree(self.ptr), "cuMemFree")
        self.ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


def memset_bits(ptr: int, nbytes: int, elem_bytes: int, pattern: int, stream: int = 0) -> None:
    from cuda.bindings import driver
    s = driver.CUstream(stream)
    if elem_bytes == 1:
        check(driver.cuMemsetD8Async(ptr, pattern & 0xFF, nbytes, s), "cuMemsetD8Async")
    elif elem_bytes == 2:
        check(driver.cuMemsetD16Async(ptr, pattern & 0xFFFF, nbytes // 2, s), "cuMemsetD16Async")
    else:  # 4- and 8-byte elements: a 32-bit pattern repeated
        check(driver.cuMemsetD32Async(ptr, pattern & 0xFFFFFFFF, nbytes // 4, s), "cuMemsetD32Async")


def synchronize(call: str = "cuCtxSynchronize") -> None:
    """Wait for all device work; a kernel fault surfaces here as a CudaError."""
    from cuda.bindings import driver
    check(driver.cuCtxSynchronize(), call)


class Arena:
    """Owns a set of device arrays; frees them all on exit (also after an error)."""

    def __init__(self):
        self.arrays: list[DeviceArray] = []

    def alloc(self, shape, dtype: str) -> DeviceArray:
        a = DeviceArray.alloc(shape, dtype)
        self.arrays.append(a)
        return a

    def free(self, strict: bool = False) -> Optional[Exception]:
        err = None
        for a in self.arrays:
            try:
                a.free()
            except Exception as e:  # noqa: BLE001 - a poisoned context cannot free; keep going
                err = err or e
        self.arrays.clear()
        if err and strict:
            raise err
        return err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
