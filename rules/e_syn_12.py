"""E-SYN-12: conflicting global-memory accesses by different threads of one CTA need a barrier.

What: two accesses to the same elements of a global tensor by different threads of the CTA, at least
one of them a write (ldg/stg, red_add, scatter_add into global), must be separated by a CTA barrier
(`syncthreads`, or the role's `bar_sync`; `syncwarp` when both sides stay within one warp). Atomic
updates (red_add, scatter_add) do not conflict with each other. The element -> thread mapping comes
from the register tile: a per-thread `row_major` tile means every executing thread touches every
element; a `blocked` tile deals its chunks over the scope's threads; atomics are taken as touching
their whole destination tile. Accesses through other layouts (mma / wgmma fragments, mma_rows) and
copies are not mapped and not checked. Checked on the protocol simulation of
cake_ir.analysis.sync (straight-line code, loops, `if`s and `last_cta` bodies; a `last_cta` orders
its body after the role's earlier statements, as its lowering does). Accesses by different CTAs are
out of scope (that is what `last_cta` and its fences are for).

What goes wrong on hardware: warps run at different speeds. When every thread reads a value from a
global workspace and every thread then zeroes it (the k-means finishing pass did this with its
per-thread count tile), a fast warp clears the value before a slow warp has read it; the slow warp
computes with zero and the results are wrong intermittently (seen on the H200 at B=32).
"""
from ._syn_util import safe, sim_issues

CODE = "E-SYN-12"
TITLE = "intra-CTA global-memory conflicts need syncthreads / bar_sync"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
