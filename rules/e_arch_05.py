"""E-ARCH-05: the bulk copy (`copy` kind `bulk_load`) needs an arch with the bulk-copy engine.

`bulk_load` lowers to `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`, the
non-tensor form of Hopper's bulk-copy (TMA) engine, and completes on an mbarrier's transaction count.
The arch table (cake_ir/arch.py) gives the `bulk_copy` feature to sm_90a only; `legal` lists the archs
that have it. On sm_80 / 86 / 89 copy the rows with `cp_async` and arrive on the barrier when they
land (`cp_async_arrive`, or `cp_async_wait` + `mbar_arrive`), with the barrier's arrivals to match.

What goes wrong on hardware: nothing runs; ptxas rejects the instruction for the target, and the
candidate fails to build with an error that names no IR node.
"""
from cake_ir.arch import ARCHES, has
from cake_ir.nodes import Copy

CODE = "E-ARCH-05"
TITLE = "bulk_load needs the bulk-copy engine (sm_90a)"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    if "bulk_copy" in ctx.arch.features:
        return
    legal = [a for a in ARCHES if has(a, "bulk_copy")]
    for s in ctx.sites:
        n = s.node
        if isinstance(n, Copy) and n.kind == "bulk_load":
            yield ctx.report(s.path, f"copy kind bulk_load (cp.async.bulk with complete_tx) needs "
                             f"{' or '.join(legal)}; the kernel targets {k.arch}: copy with cp_async and arrive "
                             "with cp_async_arrive instead", legal=legal)
