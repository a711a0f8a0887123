"""E-MMA-04: wgmma must be issued by whole warpgroups.

`wgmma.*.sync.aligned` (mma_async, fence, commit_group, wait_group) is executed by all 128 threads of
a warpgroup together. The role issuing it must start on a warp that is a multiple of 4 and span a
multiple of 4 warps, and the statement must not sit under a guard that depends on the lane or
thread (`lane`, `tid`, `role_tid`, `wg_tid`, `elect_one()`) or that differs between the warps of
one warpgroup (e.g. `role_warp == 0`), which would split a warpgroup.
"""
from cake_ir import expr as E
from cake_ir.nodes import SimpleSync, WaitGroup, Wgmma

CODE = "E-MMA-04"
TITLE = "wgmma issued by whole warpgroups"
STAGE = "source"

THREAD_VARS = {"lane", "tid", "role_tid", "wg_tid"}


WARP_VARS = {"warp", "role_warp", "wg"}


def _divergent(cond, role, consts) -> bool:
    try:
        node = E.parse_cond(cond)
    except (E.ExprError, RecursionError):
        return False
    for x in E.walk(node):
        if isinstance(x, E.Var) and x.name in THREAD_VARS:
            return True
        if isinstance(x, E.Call) and x.fn == "elect_one":
            return True
    names = E.free_vars(node)
    if role is None or not names & WARP_VARS or not names <= WARP_VARS | set(consts):
        return False
    # A condition on warp indices only: it must agree across the 4 warps of each warpgroup.
    for g in range(role.num_warps // 4):
        vals = set()
        for rw in range(4 * g, 4 * g + 4):
            env = dict(consts, warp=role.first_warp + rw, role_warp=rw, wg=rw // 4)
            vals.add(bool(E.try_const(node, env)))
        if len(vals) > 1:
            return True
    return False


def check(ctx):
    k = ctx.kernel
    flagged_roles = set()
    for s in ctx.sites:
        n = s.node
        if not (isinstance(n, Wgmma) or (isinstance(n, (SimpleSync, WaitGroup)) and n.op.startswith("wgmma_"))):
            continue
        if s.role is None:
            if k.launch.threads % 128:
                yield ctx.report(s.path, f"{n.op} in the prologue runs on all {k.launch.threads} threads, not whole "
                                 "warpgroups", legal=[t for t in range(128, 1025, 128)])
        elif (s.role.first_warp % 4 or s.role.num_warps % 4) and s.role_index not in flagged_roles:
            flagged_roles.add(s.role_index)
            r = s.role
            yield ctx.report(f"/roles/{s.role_index}/warps", f"role {r.name!r} issues {n.op} but its warps "
                             f"{list(r.warps)} are not whole warpgroups (first warp and count multiples of 4)",
                             legal={"first_warp": list(range(0, 32, 4)), "count": list(range(4, 33, 4))},
                             related=[s.path])
        for g in s.guards:
            if _divergent(g.cond, s.role, k.consts):
                yield ctx.report(s.path, f"{n.op} sits under the thread-dependent guard {g.cond!r}; a warpgroup "
                                 "must execute it together", related=[g.path])
                break
