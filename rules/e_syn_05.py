"""E-SYN-05: TMA copies and mbar_expect_tx must be issued by exactly one thread.

What: `copy` kind `tma_load` / `tma_store` and `mbar_expect_tx` are single-thread operations: the
enclosing guards must select exactly one thread of the role per intended issue -- `role_tid == 0`,
`tid == c`, `lane == 0 && role_warp == c`, or `elect_one()` inside a one-warp guard (`role_warp == 0
&& elect_one()`). The rule evaluates the guards per thread (elect_one() = the lowest active lane of
each warp that reaches it) and reports any other count; `legal` is 1 and the fix wraps the statement
(or the pipeline statement it was expanded from) in `if role_tid == 0`.

What goes wrong on hardware: every executing thread issues its own bulk copy. N threads issuing a
tma_load move the tile N times (N-fold L2/HBM traffic) and deliver N times the bytes to the mbarrier,
while N threads executing expect_tx arrive N times and announce N times the bytes: the tx-count and
arrival count no longer match the declaration, so phases complete early (reads of half-written
stages) or never (hang). N threads issuing a tma_store write the same global tile N times, racing
with each other and with later stores.
"""
from cake_ir.analysis import sync
from cake_ir.nodes import Copy, MbarExpectTx

from ._syn_util import safe

CODE = "E-SYN-05"
TITLE = "single-thread ops (TMA, expect_tx) under an elected thread"
STAGE = "expanded"


def _guard_fix(ctx, ks, s, m):
    """Tighten the innermost thread guard: `&& elect_one()` when it selects one warp."""
    from cake_ir.walk import resolve
    tg = ks.thread_guards(s)
    if not tg:
        return None
    sp = ks.space(s.role_index)
    if sp.warps_of(m) != 1:
        return None
    g = tg[-1]
    if ks.expanded(g):
        return None
    node = resolve(ctx.source, g)
    if node is None or getattr(node, "op", None) != "if" or not isinstance(node.cond, str):
        return None
    if any(x.path == g and not x.taken for x in s.guards):
        return None
    return [{"op": "replace", "path": g + "/cond", "value": f"{node.cond} && elect_one()"}]


def _wrap_fix(ctx, ks, s, n):
    from cake_ir.walk import resolve
    target = ks.src_path(s.path)
    src_node = resolve(ctx.source, target)
    if src_node is not None and getattr(src_node, "op", None) in (n.op, "pipe_acquire", "pipe_commit"):
        return [{"op": "replace", "path": target,
                 "value": {"op": "if", "cond": sync.one_thread_cond(s), "then": [sync.dump(src_node)]}}]
    return None


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    for s in ks.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind in ("tma_load", "tma_store"):
            what = f"copy {n.kind}"
        elif isinstance(n, MbarExpectTx):
            what = "mbar_expect_tx"
        else:
            continue
        m = ks.mask(s)
        if m is None:
            continue
        cnt = int(m.sum())
        if cnt <= 1:
            continue
        # several threads may each issue a *different* operation (one per warpgroup, by offset/index)
        if isinstance(n, Copy):
            refs = [n.src, n.dst]
            exprs = [e for r in refs for e in list(r.offset or []) + ([r.slot] if r.slot is not None else [])]
            if n.barrier is not None:
                exprs.append(n.barrier.index)
        else:
            exprs = [n.barrier.index]
        share = ks.max_sharing(s, exprs)
        if share is not None and share <= 1:
            continue
        sp = ks.space(s.role_index)
        fix = _guard_fix(ctx, ks, s, m) or _wrap_fix(ctx, ks, s, n)
        effect = ("moves the tile and completes its bytes" if "load" in what else
                  "stores the tile" if "store" in what else "arrives and announces the bytes")
        yield ctx.report(s.path, f"{what} is executed by {sp.describe(m)}; it must run on exactly one thread per "
                         f"issue -- each executing thread {effect} once, so the traffic and the barrier's "
                         f"arrival/tx counts are multiplied by {cnt}", legal=1, fix=fix,
                         related=ks.thread_guards(s))
