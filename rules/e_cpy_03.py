"""E-CPY-03: a global access marked in-bounds (`oob: "none"`) is not provably in bounds.

For `cp_async`/`sync` copies and `ldg`/`stg` with `oob: "none"`, CAKE emits unpredicated accesses,
so for every dim `0 <= offset` and `offset + tile_dim <= tensor_dim` must hold for all values of
the params and indices. The proof keeps integer params symbolic (cake_ir.analysis.bounds): e.g.
offset `bid.y * 128` with grid y `M / 128` gives `128 * (M / 128) <= M`; loop vars use their ranges,
and enclosing `if` guards are used. Otherwise predicate the access: `oob: "zfill"` for loads (zero
fill), `"mask"` for stores. TMA copies are bounds-safe in hardware and are not checked. A `bulk_load`
has no predication at all (`legal` is empty): its tile must be proved in bounds, e.g. by clamping the
index with `min`.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access, Copy

from ._cpy_util import offsets, prover, tile_shape

CODE = "E-CPY-03"
TITLE = "unpredicated global access not provably in bounds"
STAGE = "expanded"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind in ("cp_async", "sync"):
            gf, of, legal = "src", "dst", ["zfill"]
        elif isinstance(n, Copy) and n.kind == "bulk_load":
            gf, of, legal = "src", "dst", []
        elif isinstance(n, Access) and n.op == "ldg":
            gf, of, legal = "src", "dst", ["zfill", "mask"]
        elif isinstance(n, Access) and n.op == "stg":
            gf, of, legal = "dst", "src", ["mask"]
        else:
            continue
        if n.oob != "none":
            continue
        g, o = resolve_tile(k, getattr(n, gf)), resolve_tile(k, getattr(n, of))
        if g.param is None:
            continue
        shape, offs = tile_shape(k, g, o), offsets(g)
        if shape is None or offs is None:
            continue
        pv = prover(ctx, s)
        fix = [{"op": "replace", "path": f"{s.path}/oob", "value": legal[0]}] if legal else None
        how = ("predicate it or prove the bound with param facts (divisible_by/min)" if legal else
               "a bulk copy cannot be predicated: clamp the index (min) or prove the bound with param facts")
        for d, (off, dim) in enumerate(zip(offs, g.param.shape)):
            node = f"{s.path}/{gf}/offset/{d}"
            if not pv.nonneg(off):
                yield ctx.report(node, f"{n.op} {g.ref.buf!r}: offset {off!r} along dim {d} is not provably >= 0",
                                 legal=legal or None, fix=fix, related=[f"{s.path}/oob"])
                break
            if not pv.le(f"({off}) + {shape[d]}", dim):
                yield ctx.report(node, f"{n.op} {g.ref.buf!r} with oob none: cannot prove {off} + {shape[d]} <= {dim} "
                                 f"(dim {d}); {how}",
                                 legal=legal or None, fix=fix, related=[f"{s.path}/oob"])
                break
