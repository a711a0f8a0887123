"""E-MMA-02: mma_sync fragments do not agree.

`mma_sync` computes c[TM,TN] += a[TM,TK] * b[TN,TK]^T over m16n8k16 (or m16n8k8) steps: a must be an
`mma_a` register tile [TM, TK], b an `mma_b` tile [TN, TK] (B stored N x K) and c an `mma_acc` tile
[TM, TN], with TM a multiple of 16, TN of 8 and TK of the instruction's k; the three must agree on
TM, TN and TK, and tile offsets inside larger fragments must land on fragment boundaries.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import MmaSync

from ._cpy_util import fact, tile_shape

CODE = "E-MMA-02"
TITLE = "mma_sync fragment layouts and shapes agree"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, MmaSync):
            continue
        m, nn, kk = n.shape if tuple(n.shape) in ((16, 8, 16), (16, 8, 8)) else (16, 8, 16)
        env = None
        ops = {}
        for f, layout, gran in (("a", "mma_a", (m, kk)), ("b", "mma_b", (nn, kk)), ("c", "mma_acc", (m, nn))):
            t = resolve_tile(k, getattr(n, f))
            if not t.known:
                ops = None
                break
            b = t.buffer
            if b is None or b.space != "reg" or b.layout != layout:
                got = f"{b.space} {b.layout}" if b is not None else "a global tensor"
                yield ctx.report(f"{s.path}/{f}", f"mma_sync operand {f} must be a reg tile with layout {layout}; "
                                 f"{t.ref.buf!r} is {got}", legal=[layout])
                ops = None
                break
            shp = tile_shape(k, t)
            if shp is None or len(shp) != 2:
                yield ctx.report(f"{s.path}/{f}", f"mma_sync operand {f} must be a 2-D tile", legal=[2])
                ops = None
                break
            for d in range(2):
                if shp[d] % gran[d]:
                    yield ctx.report(f"{s.path}/{f}", f"operand {f} tile {list(shp)}: dim {d} must be a multiple "
                                     f"of {gran[d]} for m{m}n{nn}k{kk}", legal=[gran[d] * i for i in range(1, 9)])
                    ops = None
                    break
            if ops is None:
                break
            if t.ref.offset:
                env = env or ctx.env(s)
                for d, o in enumerate(t.ref.offset[:2]):
                    if not fact(env, o).divisible_by(gran[d]):
                        yield ctx.report(f"{s.path}/{f}/offset/{d}", f"offset {o!r} of fragment {f} is not a "
                                         f"provable multiple of {gran[d]}")
            ops[f] = shp
        if not ops:
            continue
        (am, ak), (bn, bk), (cm, cn) = ops["a"], ops["b"], ops["c"]
        if ak != bk:
            yield ctx.report(f"{s.path}/b", f"K disagrees: a is [{am},{ak}] but b is [{bn},{bk}] (b is N x K)",
                             legal=[ak])
        if am != cm:
            yield ctx.report(f"{s.path}/c", f"M disagrees: a has {am} rows, c has {cm}", legal=[am])
        if bn != cn:
            yield ctx.report(f"{s.path}/c", f"N disagrees: b has {bn} rows (N), c has {cn} columns", legal=[bn])
