"""E-CPY-06: a tile reference does not resolve to a region of its buffer.

Every TileRef must name a buffer or tensor param; `offset` and `shape` have one entry per dim of the
target; on buffers the tile shape fits the buffer and `0 <= offset` and `offset + shape <= dim` are
provable along each dim (global bounds are E-CPY-03); a `slot` on a staged buffer is provably in
`[0, stages)`.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import TensorParam

from ._cpy_util import fact, prover, rank, tile_refs

CODE = "E-CPY-06"
TITLE = "tile references resolve and stay inside their buffer"
STAGE = "expanded"


def check(ctx):
    k = ctx.kernel
    names = [b.name for b in k.buffers] + [p.name for p in k.params if isinstance(p, TensorParam)]
    for s in ctx.sites:
        pv = None
        env = None
        for f, ref in tile_refs(s.node):
            base = f"{s.path}/{f}"
            t = resolve_tile(k, ref)
            if not t.known:
                what = "a scalar param" if k.param(ref.buf) is not None else "unknown"
                yield ctx.report(f"{base}/buf", f"tile names {ref.buf!r} ({what}); it must be a buffer or tensor param",
                                 legal=names)
                continue
            r = rank(t)
            if ref.offset is not None and len(ref.offset) != r:
                yield ctx.report(f"{base}/offset", f"offset has {len(ref.offset)} entries but {ref.buf!r} has {r} dims",
                                 legal=r)
                continue
            if ref.shape is not None and len(ref.shape) != r:
                yield ctx.report(f"{base}/shape", f"shape has {len(ref.shape)} entries but {ref.buf!r} has {r} dims",
                                 legal=r)
                continue
            b = t.buffer
            if b is None:
                continue
            bad = False
            for d, (ts, bs) in enumerate(zip(t.shape, b.shape)):
                if ts > bs:
                    yield ctx.report(f"{base}/shape/{d}", f"tile dim {d} is {ts} but {b.name!r} has {bs}",
                                     legal=list(range(1, bs + 1)) if bs <= 256 else [bs])
                    bad = True
                    break
            if bad:
                continue
            if ref.offset is not None:
                for d, (o, ts, bs) in enumerate(zip(ref.offset, t.shape, b.shape)):
                    if isinstance(o, int) and 0 <= o <= bs - ts:
                        continue
                    pv = pv or prover(ctx, s)
                    if not pv.nonneg(o) or not pv.le(f"({o}) + {ts}", bs):
                        yield ctx.report(f"{base}/offset/{d}", f"cannot prove 0 <= {o} and {o} + {ts} <= {bs} "
                                         f"(dim {d} of {b.name!r})", legal=f"[0, {bs - ts}]")
                        break
            if ref.slot is not None and b.stages > 1:
                env = env or ctx.env(s)
                fs = fact(env, ref.slot)
                if not (fs.lo >= 0 and fs.hi <= b.stages - 1):
                    pv = pv or prover(ctx, s)
                    if not (pv.nonneg(ref.slot) and pv.le(ref.slot, b.stages - 1)):
                        yield ctx.report(f"{base}/slot", f"slot {ref.slot!r} is not provably in [0, {b.stages}) for "
                                         f"{b.name!r}", legal=list(range(b.stages)))
