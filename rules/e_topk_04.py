"""E-TOPK-04: a `topk_bound` (a row's bound moved between registers and its shared-bound word) has
operands of the wrong kind, layout or shape.

- `bound` is a tile [rows, 1] of a 2-d global i32 tensor with `readwrite` access: one word per row, the
  `topk` shared bound's order-preserving keys;
- mode "load": `vals` is a filtered topk's given bound or bound cache, an `mma_rows` f32 register tile
  [rows, 1]; the kernel that loads the words is their last reader, so a later `stg` into the tensor
  (in it or in a later kernel of the program) must zero them (the next launch would start from this
  one's bounds);
- mode "store": `vals` is a sorted list whose last entry is the row's k-th best: an `mma_rows` f32
  [rows, k] tile (after `topk_merge`: the quad agrees) or a per-thread `row_major` f32 [1, k] tile (a
  merge's list); `bound` then has the list's rows ([1, 1] for the per-thread list).

What goes wrong on hardware: a word that is not the row's mixes the bounds of different rows, so a
row filters with another row's k-th best and silently loses true neighbours; a store of the wrong
entry (not the k-th) publishes a bound tighter than the row's k-th best, with the same effect.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import TopKBound

from ._topk_util import bound_word_errors, reset_later

CODE = "E-TOPK-04"
TITLE = "topk_bound operands: a global i32 word per row, a bound cache (load) or a sorted list (store)"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    sites = ctx.sites
    for i, s in enumerate(sites):
        n, p = s.node, s.path
        if not isinstance(n, TopKBound):
            continue
        errs = list(bound_word_errors(ctx, n.bound, f"{p}/bound"))
        yield from (e for e, _ in errs)
        if any(fatal for _, fatal in errs):
            continue
        t = resolve_tile(k, n.bound)
        par = t.param
        v = resolve_tile(k, n.vals).buffer
        if v is None or v.space != "reg" or v.dtype != "f32":
            yield ctx.report(f"{p}/vals/buf", f"{n.vals.buf!r} must be an f32 register tile")
            continue
        if v.layout == "mma_rows":
            rows, cols = v.shape[0], v.shape[-1]
        elif v.layout == "row_major" and v.scope == "thread" and len(v.shape) == 2 and v.shape[0] == 1:
            rows, cols = 1, v.shape[-1]
        else:
            rows, cols = None, None
        if n.mode == "load" and (v.layout != "mma_rows" or cols != 1):
            yield ctx.report(f"{p}/vals/buf", f"a loaded bound goes to a topk's bound cache: an mma_rows f32 tile "
                             f"[rows, 1], not {v.layout} {list(v.shape)}", legal=["mma_rows [rows, 1]"])
            continue
        if rows is None:
            yield ctx.report(f"{p}/vals/buf", f"a stored bound is the k-th entry of an mma_rows [rows, k] or a "
                             f"per-thread row_major [1, k] list, not {v.layout} {list(v.shape)}",
                             legal=["mma_rows", "row_major (thread)"])
            continue
        if list(t.shape) != [rows, 1]:
            yield ctx.report(f"{p}/bound/shape", f"the bound's tile is {list(t.shape)}; it holds a word per row of "
                             f"{n.vals.buf!r}: [{rows}, 1]", legal=[[rows, 1]])
        if n.mode == "load" and not reset_later(ctx, sites[i + 1:], par.name):
            yield ctx.report(f"{p}", f"no later stg resets {par.name!r}: the next launch would start from this one's "
                             "bounds (zero the words after the last reader)")
