"""E-ARCH-03: role register budgets (`regs`, lowered to setmaxnreg) need sm_90a and warpgroup-aligned
roles.

`setmaxnreg` is an sm_90a instruction executed by all warps of a warpgroup together, so a role with
`regs` must start on a warp that is a multiple of 4 and span a multiple of 4 warps. On older targets
drop `regs` (use `launch.min_blocks_per_sm` to steer the compiler's register allocation).
"""
CODE = "E-ARCH-03"
TITLE = "setmaxnreg needs sm_90a and warpgroup-aligned roles"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    has = "setmaxnreg" in ctx.arch.features
    for ri, r in enumerate(k.roles):
        if r.regs is None:
            continue
        if not has:
            yield ctx.report(f"/roles/{ri}/regs", f"role {r.name!r} sets regs (setmaxnreg) but {k.arch} has no "
                             "setmaxnreg", legal=["sm_90a"], fix=[{"op": "remove", "path": f"/roles/{ri}/regs"}])
        elif r.first_warp % 4 or r.num_warps % 4:
            first = r.first_warp // 4 * 4
            count = max(4, -(-r.num_warps // 4) * 4)
            yield ctx.report(f"/roles/{ri}/warps", f"role {r.name!r} sets regs (setmaxnreg, per warpgroup) but its "
                             f"warps {list(r.warps)} are not warpgroup-aligned (first warp and count multiples of 4)",
                             legal={"first_warp": list(range(0, 32, 4)), "count": list(range(4, 33, 4))},
                             fix=[{"op": "replace", "path": f"/roles/{ri}/warps", "value": [first, count]}])
