"""W-RES-04: fewer blocks fit on an SM than `launch.min_blocks_per_sm` asks for.

Occupancy is the minimum over: threads per SM / threads, the max resident blocks, shared memory per
SM / (planned smem + 1 KiB reserved), and registers per SM / block registers (role budgets under
setmaxnreg, else the register tiles' per-thread need plus overhead, rounded to 8). When it is below
`min_blocks_per_sm`, the compiler squeezes registers to honour `__launch_bounds__` (spills) or the
hoped-for co-residency never happens.
"""
from ._res_util import occupancy

CODE = "W-RES-04"
TITLE = "occupancy below min_blocks_per_sm"
STAGE = "expanded"


def check(ctx):
    k = ctx.kernel
    want = k.launch.min_blocks_per_sm
    if want <= 1:
        return
    got, which, limits = occupancy(k, ctx.arch)
    if got >= want:
        return
    detail = ", ".join(f"{n}: {v}" for n, v in limits.items())
    fix = [{"op": "replace", "path": "/launch/min_blocks_per_sm", "value": got}] if got >= 1 else None
    yield ctx.report("/launch/min_blocks_per_sm",
                     f"min_blocks_per_sm = {want} but {which} allows only {got} block(s) per SM ({detail})",
                     legal=list(range(1, got + 1)) if got >= 1 else None, fix=fix)
