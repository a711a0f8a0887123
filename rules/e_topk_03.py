"""E-TOPK-03: a topk's filter operands (shared bound, bound cache, valid rows) malformed, or the bound never reset.

- `shared_bound` is for a `topk` with k > 1 over an `mma_acc` / `wgmma_acc` score tile (a top-1's
  running best, and the per-thread lists of a merge, filter nothing with it).
- it is a tile [rows, 1] of a 2-d global i32 tensor with `readwrite` access, one word per score row
  (rows: the mma_acc tile's rows, 64 for a warpgroup's wgmma_acc tile).
- the word 0 means "no bound", so the program must leave the words zeroed: a later `stg` into the same
  tensor (the reset, by whoever runs after every reader, e.g. the last CTA of a split) must exist, or a
  `topk_bound` store that overwrites them with a bound the next kernel reads (a sampled search's).
- `bound_cache` (the bound as last read) comes with a shared bound, is an `mma_rows` f32 register tile
  [rows, 1] beside the lists, and is filled (with the worst score: no bound yet) or loaded from the words
  (`topk_bound` load) before the topk.
- `given_bound` (a bound known before the selection, e.g. a sampled search's) is for the same filtered
  topk, an `mma_rows` f32 register tile [rows, 1] set (`topk_bound` load, or a fill) before it.
- `valid_rows` (rows past it are padding) is for the same filtered topk: k > 1 over `mma_acc` /
  `wgmma_acc` scores (elsewhere there is no filter to skip).

What goes wrong on hardware: a bound left over from an earlier launch (other data) filters out true
neighbours of this one: results silently miss entries of their top-k; a word that is not the row's
(wrong shape) mixes bounds of different rows, with the same effect; an unfilled cache starts from
whatever the registers held (a garbage bound).
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import TopK

from ._topk_util import bound_word_errors, reset_later, row_register_errors

CODE = "E-TOPK-03"
TITLE = "fused top-k filter operands: shared bound (reset after the last reader), bound cache, given bound, valid rows"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    sites = ctx.sites
    for i, s in enumerate(sites):
        n, p = s.node, s.path
        if not isinstance(n, TopK):
            continue
        if n.valid_rows is not None and not _filtered(k, n):
            yield ctx.report(f"{p}/valid_rows", "valid_rows is for k > 1 over mma_acc / wgmma_acc scores",
                             fix=[{"op": "remove", "path": f"{p}/valid_rows"}])
        if n.bound_cache is not None and n.shared_bound is None:
            yield ctx.report(f"{p}/bound_cache", "a bound cache caches a shared bound: give the topk shared_bound",
                             fix=[{"op": "remove", "path": f"{p}/bound_cache"}])
        elif n.bound_cache is not None:
            yield from row_register_errors(ctx, n, p, "bound_cache", "bound cache", "filled before this topk (fill "
                                           "it with the worst score: no bound yet, or topk_bound load the shared words)")
        if n.given_bound is not None and not _filtered(k, n):
            yield ctx.report(f"{p}/given_bound", "a given bound is for k > 1 over mma_acc / wgmma_acc scores",
                             fix=[{"op": "remove", "path": f"{p}/given_bound"}])
        elif n.given_bound is not None:
            yield from row_register_errors(ctx, n, p, "given_bound", "given bound", "set before this topk "
                                           "(topk_bound load it from the words an earlier kernel left, or fill it)")
        if n.shared_bound is None:
            continue
        fix = [{"op": "remove", "path": f"{p}/shared_bound"}]
        sb = resolve_tile(k, n.src).buffer
        if not _filtered(k, n):
            yield ctx.report(f"{p}/shared_bound", "a shared bound is for k > 1 over mma_acc / wgmma_acc scores",
                             fix=fix)
            continue
        errs = list(bound_word_errors(ctx, n.shared_bound, f"{p}/shared_bound"))
        yield from (e for e, _ in errs)
        if any(fatal for _, fatal in errs):
            continue
        t = resolve_tile(k, n.shared_bound)
        par = t.param
        rows = sb.shape[0]
        if list(t.shape) != [rows, 1]:
            yield ctx.report(f"{p}/shared_bound/shape", f"the shared bound's tile is {list(t.shape)}; it holds a "
                             f"word per score row: [{rows}, 1]", legal=[[rows, 1]])
        if not reset_later(ctx, sites[i + 1:], par.name):
            yield ctx.report(f"{p}/shared_bound", f"no later stg resets {par.name!r}: the next launch would filter "
                             "with this one's bounds (zero the words after the last reader, e.g. in the last CTA)")


def _filtered(k, n) -> bool:
    """n is the filtered topk: k > 1 over an mma_acc / wgmma_acc register score tile."""
    sb = resolve_tile(k, n.src).buffer
    return sb is not None and sb.space == "reg" and sb.layout in ("mma_acc", "wgmma_acc") and n.k >= 2
