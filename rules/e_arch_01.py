"""E-ARCH-01: wgmma needs sm_90a.

`wgmma.mma_async` and its fence/commit/wait, and `wgmma_acc` register tiles, exist only on sm_90a.
On sm_80/86/89 use `ldmatrix` + `mma_sync` (m16n8k16) instead.
"""
from cake_ir.nodes import SimpleSync, WaitGroup, Wgmma

CODE = "E-ARCH-01"
TITLE = "wgmma needs sm_90a"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    if "wgmma" in ctx.arch.features:
        return
    fix = [{"op": "replace", "path": "/arch", "value": "sm_90a"}]
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Wgmma) or (isinstance(n, (SimpleSync, WaitGroup)) and n.op.startswith("wgmma_")):
            yield ctx.report(s.path, f"{n.op} needs sm_90a (kernel targets {k.arch}); use ldmatrix + mma_sync",
                             legal=["sm_90a"], fix=fix)
    for bi, b in enumerate(k.buffers):
        if b.layout == "wgmma_acc":
            yield ctx.report(f"/buffers/{bi}/layout", f"layout wgmma_acc needs sm_90a (kernel targets {k.arch})",
                             legal=["mma_acc", "blocked"], fix=fix)
