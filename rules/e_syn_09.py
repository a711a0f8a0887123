"""E-SYN-09: no `syncthreads` (barrier 0) in role-divergent code.

What: `syncthreads` (and `bar_sync` on a named barrier with bar_id 0) waits for *every* thread of
the CTA. It may only appear where all threads execute it: in the prologue or in the body of the only
role, and never under a thread-dependent guard (`lane`, `tid`, `warp`, `role_warp`, `role_tid`,
`wg`, `wg_tid`, `elect_one()`, or lets derived from them). In a kernel with several roles, synchronise
a role's warps with a named barrier (`bar_sync` with bar_id >= 1 and `threads` = the role's threads);
the fix declares one and uses it.

What goes wrong on hardware: bar 0 counts arrivals from the whole CTA. If only one role (or one
branch) reaches it, the arrived warps wait for warps that never come -- the kernel hangs -- or, when
another role happens to reach a different `__syncthreads`, the two calls pair up with each other and
the barrier releases at the wrong program point, so the synchronisation it was meant to provide is
silently gone.
"""
from cake_ir.analysis import sync
from cake_ir.nodes import NamedBarSync, NamedBarrier, SimpleSync

from ._syn_util import safe

CODE = "E-SYN-09"
TITLE = "no syncthreads in role-divergent code"
STAGE = "expanded"


def _fix(ctx, s):
    k = ctx.kernel
    role = s.role
    used = {b.bar_id for b in k.barriers if isinstance(b, NamedBarrier)}
    free = [i for i in range(1, 16) if i not in used]
    if not free or ctx.source.role(role.name) is None:
        return None
    names = {b.name for b in k.barriers} | {b.name for b in k.buffers} | set(k.consts) | \
        {p.name for p in k.params} | {r.name for r in k.roles} | {p.name for p in k.pipelines}
    name = f"{role.name}_sync"[:48]
    i = 2
    while name in names:
        name = f"{role.name}_sync{i}"[:48]
        i += 1
    existing = next((b for b in k.barriers if isinstance(b, NamedBarrier) and b.bar_id != 0
                     and b.threads == role.threads), None)
    if existing is not None:
        return [{"op": "replace", "path": s.path, "value": {"op": "bar_sync", "barrier": existing.name}}]
    return [{"op": "add", "path": "/barriers/-", "value": {"kind": "named", "name": name, "bar_id": free[0],
                                                          "threads": role.threads}},
            {"op": "replace", "path": s.path, "value": {"op": "bar_sync", "barrier": name}}]


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    for s in ks.sites:
        n = s.node
        if isinstance(n, SimpleSync) and n.op == "syncthreads":
            what = "syncthreads"
        elif isinstance(n, NamedBarSync):
            d = k.barrier(n.barrier)
            if not (isinstance(d, NamedBarrier) and d.bar_id == 0):
                continue
            what = f"{n.op} on barrier 0 ({n.barrier!r})"
        else:
            continue
        guards = ks.thread_guards(s)
        m = ks.mask(s)
        if guards and (m is None or not m.all()):
            yield ctx.report(s.path, f"{what} under a thread-dependent guard: only the threads taking the branch "
                             "arrive at the CTA-wide barrier 0, the others never do -- the kernel hangs or the "
                             "barrier pairs with an unrelated __syncthreads", related=guards)
            continue
        if s.role is not None and len(k.roles) > 1:
            fix = None if ks.expanded(s.path) else _fix(ctx, s)
            yield ctx.report(s.path, f"{what} inside role {s.role.name!r} of a kernel with {len(k.roles)} roles: "
                             "barrier 0 waits for all threads of the CTA, which the other roles never provide "
                             f"here; use a named barrier over this role's {s.role.threads} threads",
                             fix=fix, related=[f"/roles/{s.role_index}"])
