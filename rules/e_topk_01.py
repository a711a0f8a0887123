"""E-TOPK-01: topk / topk_merge operands have the wrong layout, dtype or shape.

- `topk` over an `mma_acc` score tile [TM, TN] keeps its lists in `mma_rows` tiles of shape [TM, k]
  (values f32, indices i32); over a `wgmma_acc` tile [64, TN] (one warpgroup tile) in `mma_rows`
  [16, k] lists (each warp's own 16 rows); over a per-thread `row_major` tile [R, C] (scope thread) in per-thread
  `row_major` [R, k] lists. `src_idx` (per-thread tiles only) is i32 with src's shape.
- `row_bias` / `col_bias` are smem f32 vectors ([n] or [1, n]) with at least TM / TN elements.
- `topk_merge` merges `mma_rows` value (f32) and index (i32) lists of one shape.

What goes wrong on hardware: the lowering indexes the lists by the fragment's row mapping; a list of
another shape or type is read and written out of its registers' range or reinterpreted (wrong ids).
"""
from math import prod

from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import TopK, TopKMerge

CODE = "E-TOPK-01"
TITLE = "topk / topk_merge operand layouts, dtypes and shapes"
STAGE = "source"


def _lists(ctx, path, vals, idx, layout, shape):
    for f, t, dt in (("vals", vals, "f32"), ("idx", idx, "i32")):
        b = t.buffer
        if b is None or b.space != "reg":
            yield ctx.report(f"{path}/{f}/buf", f"{f} must be a register tile", legal=[layout])
            continue
        if b.layout != layout:
            yield ctx.report(f"{path}/{f}/buf", f"{f} {b.name!r} is {b.layout}; this score tile needs {layout} lists",
                             legal=[layout])
        elif list(b.shape) != list(shape):
            yield ctx.report(f"{path}/{f}/buf", f"{f} {b.name!r} has shape {list(b.shape)}; expected {list(shape)}",
                             legal=[list(shape)])
        if b.dtype != dt:
            yield ctx.report(f"{path}/{f}/buf", f"{f} {b.name!r} is {b.dtype}; topk lists hold {dt}", legal=[dt])


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if isinstance(n, TopK):
            src = resolve_tile(k, n.src)
            sb = src.buffer
            if sb is None or sb.space != "reg" or not (sb.layout in ("mma_acc", "wgmma_acc") or
                                                        (sb.layout == "row_major" and sb.scope == "thread")):
                yield ctx.report(f"{p}/src/buf", "topk scores come from an mma_acc or wgmma_acc tile or a per-thread "
                                 "row_major tile", legal=["mma_acc", "wgmma_acc", "row_major"])
                continue
            vals, idx = resolve_tile(k, n.vals), resolve_tile(k, n.idx)
            if sb.layout in ("mma_acc", "wgmma_acc"):
                TM, TN = sb.shape[0], sb.shape[-1]
                if sb.layout == "wgmma_acc" and TM != 64:
                    yield ctx.report(f"{p}/src/buf", f"topk over a wgmma_acc tile takes one warpgroup tile [64, N]; "
                                     f"{sb.name!r} has {TM} rows", legal=[64])
                    continue
                yield from _lists(ctx, p, vals, idx, "mma_rows", [16 if sb.layout == "wgmma_acc" else TM, n.k])
                if n.src_idx is not None:
                    yield ctx.report(f"{p}/src_idx", "src_idx is for per-thread score tiles; mma_acc columns are "
                                     "numbered from `col`", fix=[{"op": "remove", "path": f"{p}/src_idx"}])
            else:
                TM, TN = prod(sb.shape[:-1]), sb.shape[-1]
                yield from _lists(ctx, p, vals, idx, "row_major", [TM, n.k])
                if n.src_idx is not None:
                    xb = resolve_tile(k, n.src_idx).buffer
                    if xb is None or xb.dtype != "i32" or list(xb.shape) != list(sb.shape):
                        yield ctx.report(f"{p}/src_idx/buf", f"src_idx must be an i32 tile of src's shape {list(sb.shape)}")
            for f, need in (("row_bias", TM), ("col_bias", TN)):
                ref = getattr(n, f)
                if ref is None:
                    continue
                t = resolve_tile(k, ref)
                b = t.buffer
                if b is None or b.space != "smem" or b.dtype != "f32" or prod(b.shape) != b.shape[-1]:
                    yield ctx.report(f"{p}/{f}/buf", f"{f} must be an smem f32 vector ([n] or [1, n])")
                elif (t.shape[-1] if t.shape else 0) < need:
                    yield ctx.report(f"{p}/{f}/shape", f"{f} tile holds {t.shape[-1]} values; the scores have {need} "
                                     f"{'rows' if f == 'row_bias' else 'columns'}", legal=[need])
        elif isinstance(n, TopKMerge):
            vals, idx = resolve_tile(k, n.vals), resolve_tile(k, n.idx)
            vb = vals.buffer
            shape = list(vb.shape) if vb is not None else []
            yield from _lists(ctx, p, vals, idx, "mma_rows", shape)
