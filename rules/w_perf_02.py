"""W-PERF-02: a global access is poorly coalesced.

DRAM and L2 move 32-byte sectors: a tile whose contiguous run per row is under 32 bytes wastes
most of each sector (runs merge across rows only when the tile spans whole rows). Separately, a
`cp_async`/`sync`/`ldg`/`stg` using `vec_bytes` < 16 when 16-byte vectors are provably legal issues
more, narrower instructions than needed (fix: `vec_bytes: 16`).
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access, Copy

from . import e_cpy_01, e_cpy_04
from ._cpy_util import contiguous_bytes, tile_shape

CODE = "W-PERF-02"
TITLE = "uncoalesced or narrow global access"
STAGE = "expanded"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind in ("cp_async", "sync"):
            gf, of = "src", "dst"
        elif isinstance(n, Access) and n.op in ("ldg", "stg"):
            gf, of = ("src", "dst") if n.op == "ldg" else ("dst", "src")
        else:
            continue
        g, o = resolve_tile(k, getattr(n, gf)), resolve_tile(k, getattr(n, of))
        if g.param is None or o.buffer is None:
            continue
        shape = tile_shape(k, g, o)
        if shape is None:
            continue
        run = contiguous_bytes(k, g, shape)
        if 0 < run < 32:
            yield ctx.report(f"{s.path}/{gf}", f"{g.ref.buf!r} tile {list(shape)} reads/writes runs of {run} bytes; "
                             "32-byte sectors are mostly wasted (make the inner tile extent >= 32 bytes)",
                             legal=">= 32 bytes per row")
            continue
        if n.vec_bytes >= 16:
            continue
        env = ctx.env(s)
        if isinstance(n, Copy):
            if o.buffer.space != "smem" or e_cpy_01.problem(env, k, g, o, 16) is not None:
                continue
        else:
            if o.buffer.space != "reg" or e_cpy_04.vec_problem(env, k, n, g, o, 16) is not None:
                continue
        yield ctx.report(f"{s.path}/vec_bytes", f"{n.vec_bytes}-byte vectors where 16-byte vectors are provably "
                         "aligned", legal=[16], fix=[{"op": "replace", "path": f"{s.path}/vec_bytes", "value": 16}])
