"""E-RES-03: role register budgets (`regs`, setmaxnreg) are illegal or over-subscribe the SM.

On sm_90a `setmaxnreg` takes a multiple of 8 in [24, 256]. Warps start at the launch register count
(the compiler's `__launch_bounds__(threads, min_blocks_per_sm)` allocation); roles then release or
claim registers from the block's own pool, which is what the block was launched with: launch count x
threads (and never more than `regs_per_sm / min_blocks_per_sm`). The sum over roles of
`regs x threads` (roles without `regs` and idle warps at the launch count) must fit that pool, or
`setmaxnreg.inc` waits forever.

Found on the H200 (agent campaign gemm-20261130-020700): the seed GEMM (384 threads, launch count
168, pool 64512) with producer 32 / consumers 240 claims 65536 registers, which fits the SM's 65536
but not the block's pool; it passed the old check and hung until the watchdog killed it.
Legal values for the offending role's budget are listed.
"""
from ._res_util import launch_regs

CODE = "E-RES-03"
TITLE = "register budgets per role"
STAGE = "source"

LEGAL = list(range(24, 257, 8))


def check(ctx):
    k, a = ctx.kernel, ctx.arch
    if "setmaxnreg" not in a.features or not any(r.regs is not None for r in k.roles):
        return  # E-ARCH-03 covers regs on older targets
    bad = False
    for ri, r in enumerate(k.roles):
        if r.regs is not None and (r.regs % 8 or not 24 <= r.regs <= 256):
            bad = True
            v = max(24, min(256, r.regs // 8 * 8))
            yield ctx.report(f"/roles/{ri}/regs", f"setmaxnreg needs a multiple of 8 in [24, 256]; got {r.regs}",
                             legal=LEGAL, fix=[{"op": "replace", "path": f"/roles/{ri}/regs", "value": v}])
    if bad:
        return
    r0 = launch_regs(k, a)
    budget = min(a.regs_per_sm // max(1, k.launch.min_blocks_per_sm), r0 * k.launch.threads)
    nwarps = k.launch.threads // 32
    used = [r0 * 32] * nwarps  # per warp
    for r in k.roles:
        for w in range(r.first_warp, min(nwarps, r.first_warp + r.num_warps)):
            used[w] = (r.regs if r.regs is not None else r0) * 32
    total = sum(used)
    if total <= budget:
        return
    ri = max((i for i, r in enumerate(k.roles) if r.regs is not None), key=lambda i: k.roles[i].regs)
    r = k.roles[ri]
    others = total - r.regs * r.threads
    fit = (budget - others) // max(1, r.threads) // 8 * 8
    legal = [v for v in LEGAL if v <= fit]
    fix = [{"op": "replace", "path": f"/roles/{ri}/regs", "value": legal[-1]}] if legal else None
    yield ctx.report(f"/roles/{ri}/regs",
                     f"roles claim {total} registers per block (regs x threads, others at the launch count "
                     f"{r0}) but {a.name} has {budget} per block at min_blocks_per_sm="
                     f"{k.launch.min_blocks_per_sm}; role {r.name!r} fits at most {max(fit, 0)}",
                     legal=legal, fix=fix)
