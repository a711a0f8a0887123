"""E-GRID-01: last_cta is used where not every thread of the CTA reaches it, or on a bad counter.

`last_cta` synchronises the whole CTA (__syncthreads around the arrival), so it must sit at the top
level of a role that covers every warp of the launch (not inside an `if`, not inside another
`last_cta`); its counter is one element of an i32 global tensor with `access: readwrite`, and
`count` is the number of CTAs that arrive (e.g. `nbid.x`).

What goes wrong on hardware: threads that skip the statement never reach its barriers (the CTA
hangs), and a counter the kernel may not write, or of another type, never reaches `count`.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import LastCta

CODE = "E-GRID-01"
TITLE = "last_cta placement and counter"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    warps = k.launch.threads // 32
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, LastCta):
            continue
        if s.role is None or s.role.warps[0] != 0 or s.role.warps[1] != warps:
            yield ctx.report(p, f"last_cta synchronises the CTA: its role must cover all {warps} warps",
                             legal=[[0, warps]])
        elif s.guards:
            yield ctx.report(p, f"last_cta sits under the `if` at {s.guards[-1].path}: every thread of the CTA must "
                             "reach its barriers", related=[s.guards[-1].path])
        for inner in ctx.sites:
            if isinstance(inner.node, LastCta) and inner.path.startswith(p + "/body/"):
                yield ctx.report(inner.path, "last_cta inside another last_cta runs in one CTA only; its arrivals "
                                 "never reach the count", related=[p])
        t = resolve_tile(k, n.counter)
        pr = t.param
        if pr is None or pr.dtype != "i32" or pr.access != "readwrite":
            yield ctx.report(f"{p}/counter/buf", "the counter is an element of an i32 global tensor with access "
                             "readwrite", legal=["i32 readwrite tensor"])
        elif t.shape and any(d != 1 for d in t.shape):
            yield ctx.report(f"{p}/counter/shape", f"the counter is one element; tile shape {list(t.shape)}",
                             legal=[[1] * len(t.shape)])
