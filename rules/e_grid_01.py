"""E-GRID-01: last_cta / arrive_wait is used where not every thread of the CTA reaches it, on a bad
counter, or (arrive_wait) with waiters chosen per thread.

`last_cta` and `arrive_wait` synchronise the whole CTA (__syncthreads around the arrival), so they must
sit at the top level of a role that covers every warp of the launch (not inside an `if`, not inside
another `last_cta` / `arrive_wait`); the counter is one element of an i32 global tensor with `access:
readwrite`, and `count` is the number of CTAs that arrive (e.g. `nbid.x`). `arrive_wait`'s `when` picks
whole CTAs: it may name block indices (`bid.*`, `nbid.*`), consts and scalar params only.

What goes wrong on hardware: threads that skip the statement never reach its barriers (the CTA
hangs), a counter the kernel may not write, or of another type, never reaches `count`, and a `when`
that differs between the threads of a CTA splits it at the waiters' barriers (a hang).
"""
from cake_ir import expr as E
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import ArriveWait, LastCta

CODE = "E-GRID-01"
TITLE = "last_cta / arrive_wait placement, counter and waiters"
STAGE = "source"
# the names a `when` may use, besides consts and scalar params
CTA_UNIFORM = ("bid.x", "bid.y", "bid.z", "nbid.x", "nbid.y", "nbid.z")


def check(ctx):
    k = ctx.kernel
    warps = k.launch.threads // 32
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, LastCta):
            continue
        if s.role is None or s.role.warps[0] != 0 or s.role.warps[1] != warps:
            yield ctx.report(p, f"{n.op} synchronises the CTA: its role must cover all {warps} warps",
                             legal=[[0, warps]])
        elif s.guards:
            yield ctx.report(p, f"{n.op} sits under the `if` at {s.guards[-1].path}: every thread of the CTA must "
                             "reach its barriers", related=[s.guards[-1].path])
        for inner in ctx.sites:
            if isinstance(inner.node, LastCta) and inner.path.startswith(p + "/body/"):
                yield ctx.report(inner.path, f"{inner.node.op} inside a {n.op} body runs in some CTAs only; its "
                                 "arrivals never reach the count", related=[p])
        if isinstance(n, ArriveWait):
            yield from _waiters(ctx, k, n, p)
        t = resolve_tile(k, n.counter)
        pr = t.param
        if pr is None or pr.dtype != "i32" or pr.access != "readwrite":
            yield ctx.report(f"{p}/counter/buf", "the counter is an element of an i32 global tensor with access "
                             "readwrite", legal=["i32 readwrite tensor"])
        elif t.shape and any(d != 1 for d in t.shape):
            yield ctx.report(f"{p}/counter/shape", f"the counter is one element; tile shape {list(t.shape)}",
                             legal=[[1] * len(t.shape)])


def _waiters(ctx, k, n: ArriveWait, p: str):
    """arrive_wait's `when` names whole CTAs (block indices, consts, scalars); `waiters` is at least 1."""
    allowed = set(CTA_UNIFORM) | set(k.consts) | {q.name for q in k.params if q.kind == "scalar"}
    names = E.free_vars(E.parse_cond(n.when)) if isinstance(n.when, str) else set()
    bad = sorted(names - allowed)
    if bad:
        yield ctx.report(f"{p}/when", f"arrive_wait's `when` picks whole CTAs: it names {', '.join(bad)}",
                         legal=sorted(allowed))
    count = E.try_const(E.parse_index(n.waiters), dict(k.consts)) if isinstance(n.waiters, str) else n.waiters
    if count is not None and count < 1:
        yield ctx.report(f"{p}/waiters", f"arrive_wait needs at least one waiter, got {count}", legal=[">= 1"])
