"""Resolving tile references: what a TileRef names, its shape, element size and bytes.

Shared by rules, the cost model and the lowering so all agree on what a tile is.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Optional, Union

from ..dtypes import SIZE as _SIZES
from ..dtypes import size
from ..nodes import Buffer, Kernel, TensorParam, TileRef


@dataclass(frozen=True)
class Tile:
    ref: TileRef
    target: Union[Buffer, TensorParam, None]  # None: unknown name
    space: str                                # "global" | "smem" | "reg" | "?"
    dtype: str
    shape: tuple[int, ...]                    # static tile shape (() when unknown)
    offset: tuple                              # index expressions per dim

    @property
    def known(self) -> bool:
        return self.target is not None

    @property
    def elems(self) -> int:
        return prod(self.shape) if self.shape else 0

    @property
    def bytes(self) -> int:
        return self.elems * size(self.dtype) if self.dtype in _SIZES else 0

    @property
    def buffer(self) -> Optional[Buffer]:
        return self.target if isinstance(self.target, Buffer) else None

    @property
    def param(self) -> Optional[TensorParam]:
        return self.target if isinstance(self.target, TensorParam) else None



def resolve_tile(k: Kernel, ref: TileRef) -> Tile:
    b = k.buffer(ref.buf)
    if b is not None:
        shape = tuple(ref.shape) if ref.shape else tuple(b.shape)
        off = tuple(ref.offset) if ref.offset else tuple(0 for _ in b.shape)
        return Tile(ref, b, b.space, b.dtype, shape, off)
    p = k.param(ref.buf)
    if isinstance(p, TensorParam):
        if ref.shape:
            shape = tuple(ref.shape)
        else:
            shape = ()
        off = tuple(ref.offset) if ref.offset else tuple(0 for _ in p.shape)
        return Tile(ref, p, "global", p.dtype, shape, off)
    return Tile(ref, None, "?", "?", tuple(ref.shape or ()), tuple(ref.offset or ()))


def threads_in_scope(scope: str, role_threads: int, block_threads: int) -> int:
    return {"thread": 1, "warp": 32, "warpgroup": 128, "role": role_threads, "cta": block_threads}[scope]


def per_thread_elems(b: Buffer, role_threads: int, block_threads: int) -> int:
    """Register elements each thread holds for a reg buffer (its layout's distribution)."""
    n = prod(b.shape)
    if b.layout in ("mma_a", "mma_b", "mma_acc"):
        return n // 32
    if b.layout == "wgmma_acc":
        return n // 128
    if b.layout == "mma_rows":     # [16m, k]: a quad holds a row (replicated), so a lane holds rows/8 rows
        return max(1, n // 8)
    if b.layout == "blocked":
        return max(1, n // threads_in_scope(b.scope, role_threads, block_threads))
    return n  # row_major reg: a plain per-thread array
