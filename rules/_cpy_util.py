"""Shared helpers for the memory-access rules (E-CPY-*, E-MMA-*, W-PERF-*): tile operands of a
statement, effective tile shapes, element strides, and alignment proofs from facts."""
from __future__ import annotations

import math
from typing import Iterator, Optional

from cake_ir import expr as E
from cake_ir.analysis.bounds import Prover
from cake_ir.analysis.tiles import Tile, resolve_tile
from cake_ir.dtypes import SIZE
from cake_ir.nodes import (Access, Buffer, Copy, Fill, Kernel, LastCta, Map, MmaSync, OneHot, RedAdd, Reduce, Scan,
                           ScatterAdd, TensorParam, TileRef, TopK, TopKBound, TopKMerge, Wgmma)
from cake_ir.passes.plan_smem import row_pitch_elems

TILE_FIELDS = ((Copy, ("src", "dst")), (Access, ("src", "dst")), (MmaSync, ("a", "b", "c")),
               (Wgmma, ("a", "b", "acc")), (Fill, ("dst",)), (Map, ("dst",)), (Reduce, ("src", "dst")),
               (Scan, ("src", "dst")), (TopK, ("src", "vals", "idx", "src_idx", "row_bias", "col_bias")),
               (TopKMerge, ("vals", "idx")), (TopKBound, ("vals", "bound")), (OneHot, ("index", "dst")), (ScatterAdd, ("index", "src", "dst")),
               (RedAdd, ("src", "dst")),
               (LastCta, ("counter",)))

SWIZZLE_SPAN = {"swizzle_32B": 32, "swizzle_64B": 64, "swizzle_128B": 128}
FRAGMENT_LAYOUTS = ("mma_a", "mma_b", "mma_acc", "wgmma_acc")


def tile_refs(node) -> Iterator[tuple[str, TileRef]]:
    for cls, fields in TILE_FIELDS:
        if isinstance(node, cls):
            for f in fields:
                ref = getattr(node, f, None)
                if isinstance(ref, TileRef):
                    yield f, ref
            return


def parse(e) -> Optional[E.Node]:
    try:
        return E.parse_index(e)
    except (E.ExprError, TypeError, ValueError, RecursionError):
        return None


def fact(env, e) -> E.Fact:
    n = e if isinstance(e, (E.Num, E.Var, E.Un, E.Bin, E.Call)) else parse(e)
    if n is None:
        return E.Fact()
    try:
        return E.facts(n, env)
    except (RecursionError, ValueError, TypeError, OverflowError, ZeroDivisionError):
        return E.Fact()


def const_value(kernel: Kernel, e) -> Optional[int]:
    n = parse(e)
    if n is None:
        return None
    v = E.try_const(n, kernel.consts)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def esize(dtype: str) -> int:
    return SIZE.get(dtype, 0)


def param_const_shape(kernel: Kernel, p: TensorParam) -> Optional[tuple]:
    vals = [const_value(kernel, d) for d in p.shape]
    return tuple(vals) if all(v is not None for v in vals) else None


def rank(t: Tile) -> Optional[int]:
    if t.buffer is not None:
        return len(t.buffer.shape)
    if t.param is not None:
        return len(t.param.shape)
    return None


def squeeze(shape) -> tuple:
    s = tuple(shape)
    while len(s) > 1 and s[0] == 1:
        s = s[1:]
    return s


def squeeze_units(shape) -> tuple:
    """The shape without any size-1 dims (at least one dim kept)."""
    s = tuple(d for d in shape if d != 1)
    return s or (1,)


def fit_rank(shape, r: int) -> Optional[tuple]:
    """Left-pad a shape with 1s (or drop leading 1s) to rank r."""
    s = tuple(shape)
    while len(s) > r and s[0] == 1:
        s = s[1:]
    if len(s) > r:
        return None
    return (1,) * (r - len(s)) + s


def tile_shape(kernel: Kernel, t: Tile, other: Optional[Tile] = None) -> Optional[tuple]:
    """The static shape of a tile, in the rank of its target. Global tiles without a shape take the
    other operand's shape (or the whole tensor when its dims are constants)."""
    r = rank(t)
    if r is None:
        return None
    if t.ref.shape:
        return tuple(t.ref.shape) if len(t.ref.shape) == r else None
    if t.buffer is not None:
        return tuple(t.buffer.shape)
    if other is not None and other.known and other.shape:
        return fit_rank(other.shape, r)
    if t.param is not None:
        return param_const_shape(kernel, t.param)
    return None


def offsets(t: Tile) -> Optional[tuple]:
    r = rank(t)
    if r is None or len(t.offset) != r:
        return None
    return tuple(t.offset)


def strides(t: Tile) -> Optional[list]:
    """Element strides per dim (index-expression strings or ints), outermost first."""
    if t.param is not None:
        p = t.param
        if p.strides is not None:
            return list(p.strides) if len(p.strides) == len(p.shape) else None
        dims = list(p.shape)
        out: list = [1] * len(dims)
        acc = None  # product of the dims to the right, as an expression
        for i in range(len(dims) - 1, -1, -1):
            out[i] = 1 if acc is None else acc
            acc = f"({dims[i]})" if acc is None else f"({dims[i]}) * {acc}"
        return out
    b = t.buffer
    if b is not None and b.space == "smem":
        out, acc = [], 1
        dims = list(b.shape)
        for i in range(len(dims) - 1, -1, -1):
            out.append(acc)
            acc *= row_pitch_elems(b) if i == len(dims) - 1 else dims[i]
        return list(reversed(out))
    return None


def div_ok(env, e, d: int) -> bool:
    if d <= 1:
        return True
    return fact(env, e).divisible_by(d)


def base_align(t: Tile) -> int:
    """Guaranteed byte alignment of the tile's base address (before offsets)."""
    if t.param is not None:
        return t.param.align
    b = t.buffer
    if b is not None and b.space == "smem":
        return 1024 if b.layout.startswith("swizzle") else 128
    return 0


def alignment_problem(env, t: Tile, shape: tuple, vbytes: int, rows_only: bool = False) -> Optional[tuple]:
    """Why a V-byte vector access at every chunk of the tile rows is not provably V-aligned, as
    (sub-path relative to the tile ref, message); None when proved.

    Address (elements) = sum_d (offset_d + r_d) * stride_d + chunk start, for r_d in [0, shape_d).
    Each term must be a multiple of V / elem_size, and the base pointer V-aligned.
    """
    es = esize(t.dtype)
    if es == 0:
        return ("", "unknown element type")
    if vbytes < es or vbytes % es:
        return ("", f"{vbytes}-byte vectors cannot hold whole {t.dtype} elements")
    need = vbytes // es
    if base_align(t) % vbytes:
        where = "base pointer" if t.param is not None else "buffer"
        return ("", f"the {where} of {t.ref.buf!r} is only {base_align(t)}-byte aligned")
    if need == 1:
        return None  # one element per access: any element address is aligned
    offs, st = offsets(t), strides(t)
    if offs is None or st is None or len(st) != len(offs) or len(shape) != len(offs):
        return ("", "tile offsets / strides do not resolve")
    inner = len(offs) - 1
    if str(st[inner]) != "1" and st[inner] != 1:
        return ("", f"the innermost dim of {t.ref.buf!r} is not contiguous (stride {st[inner]})")
    if t.buffer is not None and t.buffer.stages > 1 and t.ref.slot is not None:
        from cake_ir.passes.plan_smem import stage_stride
        if stage_stride(t.buffer) % vbytes:
            return ("/slot", f"the stage stride of {t.ref.buf!r} is not {vbytes}-byte aligned")
    for dim in range(len(offs)):
        o, s = offs[dim], st[dim]
        term = f"({o}) * ({s})" if dim != inner else f"({o})"
        if not div_ok(env, term, need):
            return (f"/offset/{dim}", f"offset {o!r} along dim {dim} is not provably a multiple of "
                                      f"{need} elements ({vbytes} bytes{' with the row stride' if dim != inner else ''})")
        if dim != inner and shape[dim] > 1 and not div_ok(env, s, need):
            return ("", f"the row stride along dim {dim} of {t.ref.buf!r} ({s} elements) is not provably a "
                        f"multiple of {need} elements ({vbytes} bytes)")
    return None


def prover(ctx, site) -> Prover:
    return Prover(ctx.kernel, site, ctx.env(site))


def reg_contig_elems(b: Buffer, shape: tuple) -> int:
    """Elements each thread holds contiguously along the tile's inner dim."""
    inner = shape[-1] if shape else 1
    if b.layout == "blocked":
        return math.gcd(b.vec, inner)
    if b.layout in FRAGMENT_LAYOUTS:
        return math.gcd(2, inner)
    return inner


def contiguous_bytes(kernel: Kernel, t: Tile, shape: tuple) -> int:
    """Bytes of one contiguous run of the tile in memory (rows merge when they span whole rows)."""
    es = esize(t.dtype)
    if not shape:
        return 0
    if t.param is not None:
        dims = param_const_shape(kernel, t.param) if t.param.strides is None else None
        run = shape[-1]
        if dims is not None and len(dims) == len(shape):
            for d in range(len(shape) - 1, 0, -1):
                if shape[d] != dims[d]:
                    break
                run *= shape[d - 1]
        return run * es
    return shape[-1] * es
