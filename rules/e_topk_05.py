"""E-TOPK-05: a `topk` that merges sorted lists (`src_sorted`) over operands that are not lists.

With `src_sorted` each row of `src` is merged into the row's list by a bitonic network, which reads it as
a sorted top-k list of the same length: `src` must be a per-thread `row_major` f32 tile [R, k] (k
entries per row, the selection's k) with `src_idx` for their indices, and the scores must be the
entries themselves: `scale` 1, no `row_bias` / `col_bias`, no `limit`.

What goes wrong on hardware: the network pairs slot q of one list with slot k - 1 - q of the other; rows
of another length, moved scores or skipped entries pair the wrong slots and keep entries that are not
the best k (wrong neighbours, silently).
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import TopK

CODE = "E-TOPK-05"
TITLE = "topk src_sorted: per-thread f32 [R, k] lists with src_idx, unscaled"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, TopK) or not n.src_sorted:
            continue
        plain = [{"op": "replace", "path": f"{p}/src_sorted", "value": False}]   # insert entry by entry
        sb = resolve_tile(k, n.src).buffer
        if sb is None or sb.space != "reg" or sb.layout != "row_major" or sb.scope != "thread" or sb.dtype != "f32":
            yield ctx.report(f"{p}/src/buf", "src_sorted merges per-thread row_major f32 lists",
                             legal=["row_major f32 (scope thread)"], fix=plain)
            continue
        if sb.shape[-1] != n.k:
            yield ctx.report(f"{p}/src/buf", f"src_sorted reads each row of {sb.name!r} as a list of k = {n.k} "
                             f"entries; its rows hold {sb.shape[-1]}", legal=[n.k], fix=plain)
        if n.src_idx is None:
            yield ctx.report(p, "src_sorted lists need their indices (src_idx, i32 of src's shape)", fix=plain)
        if n.scale != 1.0 or n.row_bias is not None or n.col_bias is not None or n.limit is not None:
            bad = [f for f in ("scale", "row_bias", "col_bias", "limit")
                   if (getattr(n, f) != 1.0 if f == "scale" else getattr(n, f) is not None)]
            yield ctx.report(f"{p}/{bad[0]}", f"src_sorted merges the lists' own entries: {', '.join(bad)} would move "
                             "or drop them", legal=["scale 1, no biases, no limit"], fix=plain)
