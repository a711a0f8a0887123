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


@dataclass(frozen=True)
class BulkRows:
    """How a `bulk_load` copy moves its tile (shared by the lowering, the verifier and the cost model).

    The tile's rows (leading dims folded) are one cp.async.bulk each, or, when the tile covers whole
    rows of its row_major smem buffer and its rows sit in global memory at a constant stride equal to
    that buffer's row pitch (a workspace laid out at the smem pitch), one contiguous run: a single
    copy that also fills the pads between the rows. `copies` x `copy_bytes` is what completes on
    the barrier as transaction bytes."""
    rows: int
    row_bytes: int
    merged: bool
    span_bytes: int          # the merged run: (rows - 1) * pitch + row, in bytes

    @property
    def copies(self) -> int:
        return 1 if self.merged else self.rows

    @property
    def copy_bytes(self) -> int:
        return self.span_bytes if self.merged else self.row_bytes

    @property
    def total_bytes(self) -> int:
        return self.copies * self.copy_bytes


def bulk_rows(k: Kernel, src_ref: TileRef, dst_ref: TileRef) -> Optional[BulkRows]:
    """The rows of a bulk_load from `src_ref` (global) into `dst_ref` (smem), or None when the tiles
    do not resolve to a static shape."""
    from .. import expr as E
    from ..passes.plan_smem import row_pitch_elems
    src, dst = resolve_tile(k, src_ref), resolve_tile(k, dst_ref)
    b, p = dst.buffer, src.param
    if b is None or p is None or not dst.shape or b.dtype not in _SIZES:
        return None
    shape = dst.shape
    es = _SIZES[b.dtype]
    rows = prod(shape[:-1]) if len(shape) > 1 else 1
    row_bytes = shape[-1] * es
    pitch = row_pitch_elems(b)
    merged = False
    col0 = dst.offset[-1] if dst.offset else 0
    col0 = col0 if isinstance(col0, int) else E.try_const(E.parse_index(col0), k.consts)
    if rows > 1 and len(p.shape) == len(shape) and b.layout == "row_major" and shape[-1] == b.shape[-1] \
            and col0 == 0:
        lead = [d for d in range(len(shape) - 1) if shape[d] > 1]
        # one row dim, and the tile's consecutive rows are consecutive rows of the buffer
        if len(lead) == 1 and all(x == 1 for x in b.shape[lead[0] + 1:-1]):
            d = lead[0]
            if p.strides is not None:
                dims = [p.strides[d]]
            else:
                dims = list(p.shape[d + 1:])
            stride = 1
            for x in dims:
                v = x if isinstance(x, int) else E.try_const(E.parse_index(x), k.consts)
                if not isinstance(v, int) or isinstance(v, bool):
                    stride = None
                    break
                stride *= v
            merged = stride == pitch
    return BulkRows(rows, row_bytes, merged, ((rows - 1) * pitch + shape[-1]) * es)
