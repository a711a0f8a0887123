"""E-MMA-03: wgmma shape or operands are not a legal wgmma.mma_async.

`wgmma` issues `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16` per k16 step: shape must be
[64, N, 16] with N a multiple of 8 in [8, 256]; acc a `wgmma_acc` f32 register tile [64, N]; a a
shared-memory tile [64, TK] and b a shared-memory tile [N, TK] (B stored N x K), both bf16/f16 of
one type, with TK a multiple of 16, in swizzled layouts whose rows are exactly one swizzle span
(K-major swizzle atoms: 128B swizzle = 64 bf16 per row). `a` may instead be an `mma_a` register
fragment [16, 16] per warp (one k16 step); `b_major` "mn" stores b [TK, N] (N contiguous), which needs
A in registers, and N * element size one swizzle span (one atom wide), or N a multiple of it with
`b_atom_rows` naming how many rows of b's buffer the next atom starts after.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Wgmma

from ._cpy_util import SWIZZLE_SPAN, esize, tile_shape

CODE = "E-MMA-03"
TITLE = "wgmma shape and operands"
STAGE = "source"

LEGAL_N = list(range(8, 257, 8))


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, Wgmma):
            continue
        M, N, K = n.shape
        p = s.path
        if M != 64:
            yield ctx.report(f"{p}/shape/0", f"wgmma M must be 64 (got {M})", legal=[64],
                             fix=[{"op": "replace", "path": f"{p}/shape/0", "value": 64}])
        if N % 8 or not 8 <= N <= 256:
            yield ctx.report(f"{p}/shape/1", f"wgmma N must be a multiple of 8 in [8, 256] (got {N})", legal=LEGAL_N)
        if K != 16:
            yield ctx.report(f"{p}/shape/2", f"wgmma K must be 16 for 16-bit operands (got {K})", legal=[16],
                             fix=[{"op": "replace", "path": f"{p}/shape/2", "value": 16}])
        acc, a, b = resolve_tile(k, n.acc), resolve_tile(k, n.a), resolve_tile(k, n.b)
        if acc.known:
            ab = acc.buffer
            if ab is None or ab.space != "reg" or ab.layout != "wgmma_acc" or ab.dtype != "f32":
                yield ctx.report(f"{p}/acc", f"wgmma acc must be an f32 reg tile with layout wgmma_acc; "
                                 f"{n.acc.buf!r} is not", legal=["wgmma_acc f32"])
            else:
                shp = tile_shape(k, acc)
                if shp is not None and list(shp) != [64, N]:
                    yield ctx.report(f"{p}/acc", f"wgmma acc tile {list(shp)} must be [64, {N}] (M x N)",
                                     legal=[[64, N]])
        tk = {}
        mn = n.b_major == "mn"
        if a.known and a.buffer is not None and a.buffer.space == "reg":
            ab = a.buffer
            if ab.layout != "mma_a" or ab.dtype not in ("bf16", "f16") or list(tile_shape(k, a) or []) != [16, 16]:
                yield ctx.report(f"{p}/a", f"wgmma A in registers is a bf16/f16 mma_a fragment [16, 16] per warp (the "
                                 f"warp's 16 rows of the 64, one k16 step); {n.a.buf!r} is {ab.layout} {ab.dtype} "
                                 f"{list(tile_shape(k, a) or [])}", legal=["mma_a [16, 16]"])
            tk["a"] = 16
        elif mn:
            yield ctx.report(f"{p}/b_major", "wgmma with an MN-major b takes A from registers (an mma_a fragment)",
                             legal=["k"])
        for f, t, rows in (("a", a, 64), ("b", b, N)):
            if not t.known or f in tk:
                continue
            buf = t.buffer
            if buf is None or buf.space != "smem":
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} must be a shared-memory tile", legal=["smem"])
                continue
            if buf.dtype not in ("bf16", "f16"):
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} is {buf.dtype}; CAKE's wgmma takes bf16/f16",
                                 legal=["bf16", "f16"])
                continue
            span = SWIZZLE_SPAN.get(buf.layout)
            if span is None:
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} buffer {buf.name!r} has layout {buf.layout}; wgmma "
                                 "descriptors need a swizzled layout", legal=sorted(SWIZZLE_SPAN))
                continue
            if buf.shape[-1] * esize(buf.dtype) != span:
                yield ctx.report(f"{p}/{f}", f"buffer {buf.name!r} rows are {buf.shape[-1] * esize(buf.dtype)} bytes; "
                                 f"{buf.layout} K-major atoms need rows of exactly {span} bytes "
                                 f"({span // esize(buf.dtype)} elements)", legal=[span // esize(buf.dtype)])
            shp = tile_shape(k, t)
            if shp is None or len(shp) != 2:
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} must be a 2-D tile", legal=[2])
                continue
            if f == "b" and mn:         # [TK, N]: K rows, N contiguous, one atom wide (more atoms: b_atom_rows apart)
                atom = span // esize(buf.dtype)
                if shp[1] != atom or (N != atom and (not n.b_atom_rows or N % atom)):
                    yield ctx.report(f"{p}/b", f"an MN-major wgmma b tile is [TK, {atom}] (one {span}-byte swizzle "
                                     f"row), N = {atom} or, with b_atom_rows (the next atom's row distance), a "
                                     f"multiple of it; got {list(shp)} at N = {N}", legal=[[16, atom]])
                if shp[0] % 16:
                    yield ctx.report(f"{p}/b", f"an MN-major wgmma b tile's K extent {shp[0]} is not a multiple of 16",
                                     legal=[16 * i for i in range(1, 9)])
                tk["b"] = shp[0]
                continue
            if shp[0] != rows:
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} tile {list(shp)} must have {rows} rows",
                                 legal=[[rows, shp[1]]])
            if shp[1] % 16:
                yield ctx.report(f"{p}/{f}", f"wgmma operand {f} K extent {shp[1]} is not a multiple of 16",
                                 legal=[16 * i for i in range(1, 9)])
            tk[f] = shp[1]
        if len(tk) == 2 and tk["a"] != tk["b"]:
            yield ctx.report(f"{p}/b", f"wgmma K extents differ: a has {tk['a']}, b has {tk['b']}", legal=[tk["a"]])
