"""E-ARCH-02: TMA needs sm_90a.

Tensor-map (`tma`) params, `tma_load`/`tma_store` copies, pipelines with mechanism `tma`,
transaction-count mbarriers (`mbar_expect_tx`) and `fence proxy_async` exist only on sm_90a. On
older targets use `cp_async` copies (and a `cp_async` pipeline).
"""
from cake_ir.nodes import Copy, Fence, MbarExpectTx, SimpleSync, TensorParam, WaitGroup

CODE = "E-ARCH-02"
TITLE = "TMA needs sm_90a"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    if "tma" in ctx.arch.features:
        return
    legal = ["sm_90a"]
    for pi, p in enumerate(k.params):
        if isinstance(p, TensorParam) and p.tma is not None:
            yield ctx.report(f"/params/{pi}/tma", f"param {p.name!r} asks for a TMA tensor map; {k.arch} has no "
                             "TMA", legal=legal, fix=[{"op": "remove", "path": f"/params/{pi}/tma"}])
    for pi, p in enumerate(k.pipelines):
        if p.mechanism == "tma":
            yield ctx.report(f"/pipelines/{pi}/mechanism", f"pipeline {p.name!r} uses TMA; {k.arch} has no TMA",
                             legal=["cp_async"])
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind in ("tma_load", "tma_store"):
            yield ctx.report(f"{s.path}/kind", f"copy kind {n.kind} needs sm_90a (kernel targets {k.arch})",
                             legal=["cp_async", "sync"])
        elif isinstance(n, MbarExpectTx):
            yield ctx.report(s.path, f"mbar_expect_tx (transaction-count mbarriers) needs sm_90a", legal=legal)
        elif isinstance(n, Fence) and n.kind == "proxy_async":
            yield ctx.report(f"{s.path}/kind", "fence proxy_async needs sm_90a", legal=legal)
        elif isinstance(n, (SimpleSync, WaitGroup)) and n.op.startswith("tma_store_"):
            yield ctx.report(s.path, f"{n.op} needs sm_90a", legal=legal)
