"""E-CPY-01: cp.async (and sync copy) chunks are not provably aligned.

A `cp_async`/`sync` copy moves the tile in chunks of `vec_bytes` (4, 8 or 16): `cp.async.cg/ca`
requires each chunk's global and shared addresses to be `vec_bytes`-aligned, and a chunk must not
straddle a row. So the inner tile extent in bytes must be a multiple of `vec_bytes`, the base
pointer (`align`) and the smem buffer must be aligned, the innermost offset a multiple of
`vec_bytes / elem_size`, and every row stride (global: from the param's shape/strides facts; smem:
the padded row pitch) a multiple of it too. The legal list gives the chunk sizes that are provable.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Copy

from ._cpy_util import alignment_problem, esize, tile_shape

CODE = "E-CPY-01"
TITLE = "cp.async chunk size and alignment"
STAGE = "expanded"


def problem(env, k, src, dst, v):
    """(node suffix, message) for vector size v, or None when provably fine."""
    sshape, dshape = tile_shape(k, src, dst), tile_shape(k, dst, src)
    if sshape is None or dshape is None:
        return None
    for f, t, shp in (("src", src, sshape), ("dst", dst, dshape)):
        es = esize(t.dtype)
        if es and (shp[-1] * es) % v:
            return ("/vec_bytes", f"the {f} tile rows are {shp[-1] * es} bytes, not a multiple of {v}-byte chunks")
    for f, t, shp in (("src", src, sshape), ("dst", dst, dshape)):
        pr = alignment_problem(env, t, shp, v)
        if pr is not None:
            sub, msg = pr
            return (f"/{f}{sub}" if sub else "/vec_bytes", msg)
    return None


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, Copy) or n.kind not in ("cp_async", "sync"):
            continue
        src, dst = resolve_tile(k, n.src), resolve_tile(k, n.dst)
        if src.param is None or dst.buffer is None or dst.buffer.space != "smem":
            continue  # E-CPY-05 / E-CPY-06
        env = ctx.env(s)
        pr = problem(env, k, src, dst, n.vec_bytes)
        if pr is None:
            continue
        legal = [v for v in (4, 8, 16) if problem(env, k, src, dst, v) is None]
        sub, msg = pr
        fix = [{"op": "replace", "path": f"{s.path}/vec_bytes", "value": legal[-1]}] if legal else None
        yield ctx.report(f"{s.path}{sub}", f"{n.kind} with {n.vec_bytes}-byte chunks: {msg}", legal=legal,
                         fix=fix, related=[f"{s.path}/vec_bytes"] if sub != "/vec_bytes" else [])
