"""E-TOPK-05: a `topk` that merges sorted lists (`src_sorted`) over operands that are not lists.

With `src_sorted` each row of `src` is merged into the row's list by a bitonic network, which reads it as
a sorted top-k list of the same length: `src` must be a per-thread `row_major` f32 tile [R, k] (k
entries per row, the selection's k) with `src_idx` for their indices, and the scores must be the
entries themselves: `scale` 1, no `row_bias` / `col_bias`, no `limit`.

What goes wrong on hardware: the network pairs slot q of one list with slot k - 1 - q of the other; rows
of another length, moved scores or skipped entries pair the wrong slots and keep entries that are not
the best k (wrong neighbours, silently).
"""
from cake_ir.analysis.topk import sorted_merge_problems
from cake_ir.nodes import TopK

CODE = "E-TOPK-05"
TITLE = "topk src_sorted: per-thread f32 [R, k] lists with src_idx, unscaled"
STAGE = "source"


def check(ctx):
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, TopK) or not n.src_sorted:
            continue
        plain = [{"op": "replace", "path": f"{p}/src_sorted", "value": False}]   # insert entry by entry
        for field, why, legal in sorted_merge_problems(ctx.kernel, n):
            yield ctx.report(f"{p}/{field}" if field else p, why, legal=legal or None, fix=plain)
