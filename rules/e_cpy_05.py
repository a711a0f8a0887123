"""E-CPY-05: the operands of a data movement disagree in memory space, shape, type or layout.

- copy: tma_load / cp_async / sync / bulk_load move global -> smem, tma_store smem -> global; ldg global -> reg,
  stg reg -> global, lds smem -> reg, sts reg -> smem, ldmatrix smem -> reg.
- Both tiles of a copy or access have the same shape (leading size-1 dims ignored, and any size-1 dim
  between smem and register tiles; an accumulator's
  rows may fold into the leading dims of an n-d global tile, e.g. [16, 1, N] for tokens x heads, and
  with `trans` (ldg into / stg from an mma_acc tile) the global tile is its transpose; an `mma_rows`
  [R, 1] list may be stored as a [.., 1, R] row); copies do not
  convert, so their dtypes must be equal (ldg/stg/lds/sts convert element-wise).
- ldmatrix loads 16-bit elements from smem into an `mma_a` or `mma_b` fragment; with `trans` the smem
  tile is the transpose of the fragment (B stored [K, N] into an [N, K] `mma_b` fragment, A stored
  [K, M] into an [M, K] `mma_a` fragment).
- wgmma operands a and b have one dtype; mma_sync's a and b likewise (E-MMA-01).
- `slot` selects a stage of a staged smem buffer; on a global tensor, a reg tile or a single-stage
  buffer it must be absent (or provably 0).
"""
from math import prod

from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access, Copy, Wgmma

from ._cpy_util import fact, squeeze, squeeze_units, tile_refs, tile_shape

CODE = "E-CPY-05"
TITLE = "operand space, shape, dtype and layout agreement"
STAGE = "expanded"

SPACES = {"tma_load": ("global", "smem"), "tma_store": ("smem", "global"), "cp_async": ("global", "smem"),
          "bulk_load": ("global", "smem"),
          "sync": ("global", "smem"), "ldg": ("global", "reg"), "stg": ("reg", "global"), "lds": ("smem", "reg"),
          "sts": ("reg", "smem"), "ldmatrix": ("smem", "reg")}


def _kind(n):
    return n.kind if isinstance(n, Copy) else n.op


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        p = s.path
        if isinstance(n, (Copy, Access)):
            what = _kind(n)
            src, dst = resolve_tile(k, n.src), resolve_tile(k, n.dst)
            if not src.known or not dst.known:
                continue
            want = SPACES.get(what)
            bad = False
            for f, t, sp in (("src", src, want[0]), ("dst", dst, want[1])):
                if t.space != sp:
                    yield ctx.report(f"{p}/{f}/buf", f"{what} {f} must be a {sp} tile; {t.ref.buf!r} is {t.space}",
                                     legal=[sp])
                    bad = True
            if bad:
                continue
            if isinstance(n, Copy) and src.dtype != dst.dtype:
                yield ctx.report(f"{p}/dst/buf", f"copy does not convert: src {src.ref.buf!r} is {src.dtype}, dst "
                                 f"{dst.ref.buf!r} is {dst.dtype}", legal=[src.dtype])
            ss, ds = tile_shape(k, src, dst), tile_shape(k, dst, src)
            rb = src.buffer if what == "stg" else dst.buffer if what in ("ldg", "lds") else None
            reg_s, mem_s = (ss, ds) if what == "stg" else (ds, ss)
            if rb is not None and rb.layout == "mma_rows" and reg_s is not None and mem_s is not None \
                    and reg_s[-1] == 1 and squeeze(mem_s) == (reg_s[0],):
                ss = ds   # an mma_rows [R, 1] list stored to / loaded from a row along the last dim
            acc = src.buffer if what == "stg" else dst.buffer if what == "ldg" else None
            if acc is not None and acc.layout in ("mma_acc", "wgmma_acc"):
                mem_shape = ds if what == "stg" else ss
                if mem_shape is not None and len(mem_shape) >= 2:
                    fold = prod(mem_shape[:-1])
                    # an accumulator's rows fold into the tile's leading dims ([16, 1, N]); `trans` swaps them
                    folded = (mem_shape[-1], fold) if getattr(n, "trans", False) else (fold, mem_shape[-1])
                    if what == "stg":
                        ds = folded
                    else:
                        ss = folded
            if what == "ldmatrix" and getattr(n, "trans", False) and ss is not None and len(squeeze_units(ss)) == 2:
                ss = tuple(reversed(squeeze_units(ss)))   # .trans reads a transposed tile: B stored [K, N], A [K, M]
            # smem / register tiles are row-major views: size-1 dims anywhere do not move an element
            sq = squeeze_units if what in ("lds", "sts", "ldmatrix") else squeeze
            if ss is not None and ds is not None and sq(ss) != sq(ds):
                yield ctx.report(f"{p}/dst", f"{what} shapes differ: src {list(ss)}, dst {list(ds)}", legal=[list(ss)])
            if what == "ldmatrix":
                b = dst.buffer
                if b.layout not in ("mma_a", "mma_b"):
                    yield ctx.report(f"{p}/dst/buf", f"ldmatrix fills mma_a/mma_b fragments; {b.name!r} is "
                                     f"{b.layout}", legal=["mma_a", "mma_b"])
                for f, t in (("src", src), ("dst", dst)):
                    if t.dtype not in ("bf16", "f16"):
                        yield ctx.report(f"{p}/{f}/buf", f"ldmatrix moves 16-bit elements; {t.ref.buf!r} is {t.dtype}",
                                         legal=["bf16", "f16"])
        elif isinstance(n, Wgmma):
            a, b = resolve_tile(k, n.a), resolve_tile(k, n.b)
            if a.known and b.known and a.dtype != b.dtype:
                yield ctx.report(f"{p}/b/buf", f"wgmma operands differ in type: a is {a.dtype}, b is {b.dtype}",
                                 legal=[a.dtype])
        env = None
        for f, ref in tile_refs(n):
            if ref.slot is None:
                continue
            t = resolve_tile(k, ref)
            if not t.known:
                continue
            b = t.buffer
            if b is not None and b.space == "smem" and b.stages > 1:
                continue
            env = env or ctx.env(s)
            fs = fact(env, ref.slot)
            if fs.lo == 0 and fs.hi == 0:
                continue
            kind = "a global tensor" if b is None else ("a reg tile" if b.space == "reg" else "a single-stage buffer")
            yield ctx.report(f"{p}/{f}/slot", f"slot {ref.slot!r} on {ref.buf!r}, which is {kind}; only staged smem "
                             "buffers have slots", legal=[0], fix=[{"op": "remove", "path": f"{p}/{f}/slot"}])
