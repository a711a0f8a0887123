"""E-TOPK-02: a deferred-insertion (queued) topk whose queue is malformed, does not start empty or is never flushed.

- `queue_vals` / `queue_idx` come together, on a `topk` with k > 1 over an `mma_acc` / `wgmma_acc`
  score tile: `mma_rows` tiles [rows, T] (f32 values, i32 indices) with the lists' rows, 1 <= T <= 16.
- the queue starts empty: a `fill` of `queue_idx` with -1 comes before the topk in program order.
- the lists are complete only after a `topk_merge` of the same lists that takes the same queue: one
  must come after the topk in program order, and a `topk_merge` that takes a queue names a queue some
  `topk` on its lists fills.

What goes wrong on hardware: entries still queued when the lists are merged and stored are lost (a
result misses some of its true top-k); a queue that starts with garbage indices inserts garbage.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Fill, TopK, TopKMerge

CODE = "E-TOPK-02"
TITLE = "deferred top-k insertion: queue operands, initial fill and the flushing merge"
STAGE = "source"

T_MAX = 16


def _queue_shape_errors(ctx, k, n, p, rows):
    for f, dt in (("queue_vals", "f32"), ("queue_idx", "i32")):
        b = resolve_tile(k, getattr(n, f)).buffer
        if b is None or b.space != "reg" or b.layout != "mma_rows":
            yield ctx.report(f"{p}/{f}/buf", f"{f} must be an mma_rows register tile [rows, T]", legal=["mma_rows"])
            continue
        if b.dtype != dt:
            yield ctx.report(f"{p}/{f}/buf", f"{f} {b.name!r} is {b.dtype}; a queue holds {dt}", legal=[dt])
        T = b.shape[-1]
        if len(b.shape) != 2 or b.shape[0] != rows or not 1 <= T <= T_MAX:
            yield ctx.report(f"{p}/{f}/buf", f"{f} {b.name!r} has shape {list(b.shape)}; a queue is [{rows}, T] "
                             f"with 1 <= T <= {T_MAX}", legal=[[rows, 4]])
    qv, qi = resolve_tile(k, n.queue_vals).buffer, resolve_tile(k, n.queue_idx).buffer
    if qv is not None and qi is not None and list(qv.shape) != list(qi.shape):
        yield ctx.report(f"{p}/queue_idx/buf", f"queue_vals {list(qv.shape)} and queue_idx {list(qi.shape)} differ")


def check(ctx):
    k = ctx.kernel
    sites = ctx.sites
    for i, s in enumerate(sites):
        n, p = s.node, s.path
        if not isinstance(n, (TopK, TopKMerge)):
            continue
        if (n.queue_vals is None) != (n.queue_idx is None):
            have = "queue_vals" if n.queue_vals is not None else "queue_idx"
            yield ctx.report(f"{p}/{have}", "a queue takes both queue_vals and queue_idx",
                             fix=[{"op": "remove", "path": f"{p}/{have}"}])
            continue
        if n.queue_vals is None:
            continue
        if isinstance(n, TopKMerge):
            if not any(isinstance(o.node, TopK) and o.node.vals.buf == n.vals.buf
                       and o.node.queue_idx is not None and o.node.queue_idx.buf == n.queue_idx.buf for o in sites):
                yield ctx.report(f"{p}/queue_idx", f"no topk on {n.vals.buf!r} fills queue {n.queue_idx.buf!r}")
            continue
        sb = resolve_tile(k, n.src).buffer
        if sb is None or sb.space != "reg" or sb.layout not in ("mma_acc", "wgmma_acc") or n.k < 2:
            yield ctx.report(f"{p}/queue_vals", "deferred insertion is for k > 1 over mma_acc / wgmma_acc scores",
                             fix=[{"op": "remove", "path": f"{p}/queue_vals"}, {"op": "remove", "path": f"{p}/queue_idx"}])
            continue
        rows = 16 if sb.layout == "wgmma_acc" else sb.shape[0]
        errs = list(_queue_shape_errors(ctx, k, n, p, rows))
        yield from errs
        if errs:
            continue
        qname = n.queue_idx.buf
        if not any(isinstance(o.node, Fill) and o.node.dst.buf == qname and float(o.node.value) == -1.0
                   for o in sites[:i]):
            yield ctx.report(f"{p}/queue_idx", f"queue {qname!r} is not filled with -1 (empty) before this topk",
                             legal=[-1])
        if not any(isinstance(o.node, TopKMerge) and o.node.vals.buf == n.vals.buf and o.node.queue_idx is not None
                   and o.node.queue_idx.buf == qname for o in sites[i + 1:]):
            yield ctx.report(p, f"no later topk_merge of {n.vals.buf!r} takes queue {qname!r}: entries still "
                             "queued would be lost (give the merge queue_vals / queue_idx)")
