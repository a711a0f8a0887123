"""E-CPY-04: an ldg/stg/lds/sts vector width does not fit the layout or is not provably aligned.

Each thread moves its contiguous run of the register tile with `vec_bytes` vector accesses. The run
is `vec` elements for `blocked` tiles (clipped to the tile's inner extent), 2 for mma/wgmma
fragments, and the whole inner extent for a thread's row_major array; `vec_bytes` must divide the
run's bytes in memory, hold whole elements, and every vector address must be provably aligned (base
alignment, innermost offset, row strides/pitch). The legal list gives the widths that are provable.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access

from ._cpy_util import alignment_problem, esize, reg_contig_elems, tile_shape

CODE = "E-CPY-04"
TITLE = "vector width vs layout and alignment"
STAGE = "expanded"

MEM = {"ldg": ("src", "dst", "global"), "stg": ("dst", "src", "global"), "lds": ("src", "dst", "smem"),
       "sts": ("dst", "src", "smem")}


def vec_problem(env, k, n, mt, rt, v):
    rshape = tile_shape(k, rt)
    mshape = tile_shape(k, mt, rt)
    if rshape is None or mshape is None:
        return None
    es = esize(mt.dtype)
    if not es:
        return None
    run = reg_contig_elems(rt.buffer, rshape) * es
    if v < es or run % v:
        return ("/vec_bytes", f"each thread's contiguous run is {run} bytes ({rt.buffer.layout} tile "
                              f"{rt.ref.buf!r}), which {v}-byte vectors do not divide")
    pr = alignment_problem(env, mt, mshape, v)
    if pr is not None:
        sub, msg = pr
        mf = MEM[n.op][0]
        return (f"/{mf}{sub}" if sub else "/vec_bytes", msg)
    return None


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, Access) or n.op not in MEM:
            continue
        mf, rf, space = MEM[n.op]
        mt, rt = resolve_tile(k, getattr(n, mf)), resolve_tile(k, getattr(n, rf))
        if mt.space != space or rt.buffer is None or rt.buffer.space != "reg":
            continue  # E-CPY-05
        env = ctx.env(s)
        pr = vec_problem(env, k, n, mt, rt, n.vec_bytes)
        if pr is None:
            continue
        legal = [v for v in (2, 4, 8, 16) if vec_problem(env, k, n, mt, rt, v) is None]
        sub, msg = pr
        fix = [{"op": "replace", "path": f"{s.path}/vec_bytes", "value": legal[-1]}] if legal else None
        yield ctx.report(f"{s.path}{sub}", f"{n.op} with {n.vec_bytes}-byte vectors: {msg}", legal=legal, fix=fix,
                         related=[f"{s.path}/vec_bytes"] if sub != "/vec_bytes" else [])
