"""E-SYN-02: the arrivals issued per barrier phase must equal the declared arrival count.

What: for every mbarrier (and index), the arrivals issued in one phase by all executing threads of all
roles must add up to the declaration's `arrivals`: `mbar_arrive` counts one per executing thread (an
unguarded arrive in a 128-thread role is 128 arrivals; `if lane == 0` makes it one per warp),
`mbar_expect_tx` one per executing thread, `cp_async_arrive` one per executing thread; TMA copies only
complete transaction bytes. A phase is one iteration of the loop that indexes the barrier (arrivals
inside deeper constant loops are multiplied by their trip counts), and arrivals of different roles on
the same (normalised) index add up. Named barriers likewise: the warps reaching `bar_sync`/`bar_arrive`
(counted as 32 threads each, as the hardware does) must equal the barrier's `threads`; sites of one role
reached by disjoint warp sets (`if wg == 0: bar_sync` beside `if wg == 1: bar_arrive`, warpgroups taking
turns) meet in one instance, so their warps add up. A barrier that
is waited on but never arrived on is reported too. `legal` is the count the code actually issues.

What goes wrong on hardware: too few arrivals and the phase never completes -- the waiting role spins
in `mbarrier.try_wait` forever (the kernel hangs, the launch times out). Too many and the phase
completes early (a consumer reads a stage before the producer's data landed, or the producer overwrites
a stage still being read), and the surplus arrivals spill into the next phase, so the protocol drifts
out of step: wrong results, then a hang. A named barrier with the wrong thread count either hangs or
releases before all participants arrived.
"""
import numpy as np

from cake_ir.analysis import sync
from cake_ir.nodes import CpAsyncArrive, MBarrier, MbarArrive, MbarExpectTx, MbarInit, MbarWait, NamedBarSync, NamedBarrier

from ._syn_util import barrier_in_source, safe

CODE = "E-SYN-02"
TITLE = "arrival count per phase equals the declared arrivals"
STAGE = "expanded"

ARRIVERS = (MbarArrive, MbarExpectTx, CpAsyncArrive)


def _exclusive(a, b) -> bool:
    ga = {g.path: g.taken for g in a.guards}
    return any(ga.get(g.path, g.taken) != g.taken for g in b.guards)


def _fix(ctx, k, bi, total):
    if not barrier_in_source(ctx, bi):
        return None
    fix = [{"op": "replace", "path": f"/barriers/{bi}/arrivals", "value": total}]
    name = k.barriers[bi].name
    for s in sync.get(ctx.source).sites:
        if isinstance(s.node, MbarInit) and s.node.barrier.name == name:
            fix.append({"op": "replace", "path": s.path + "/arrivals", "value": total})
    return fix


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    bidx = {b.name: i for i, b in enumerate(k.barriers)}
    groups: dict = {}
    unknown: set = set()
    arrived_names: set = set()
    waits = []
    named: dict = {}
    for s in ks.sites:
        n = s.node
        if isinstance(n, NamedBarSync):
            d = k.barrier(n.barrier)
            if isinstance(d, NamedBarrier) and d.bar_id != 0:
                m = ks.mask(s)
                if m is None:
                    named.setdefault(n.barrier, {})["?"] = None
                else:
                    sp = ks.space(s.role_index)
                    cnt = sp.warps_of(m) * 32
                    if cnt:
                        warps = frozenset(int(w) for w in np.unique(sp.gwarp[m]))
                        named.setdefault(n.barrier, {}).setdefault(s.role_index, []).append((s, cnt, warps))
            continue
        if not isinstance(n, ARRIVERS + (MbarWait,)):
            continue
        decl = k.barrier(n.barrier.name)
        if not isinstance(decl, MBarrier):
            continue
        node = sync.norm_index(s, n.barrier.index, k.consts)
        key = (n.barrier.name, sync.key_of(node), sync.phase_loop(s, node))
        if isinstance(n, MbarWait):
            waits.append(s)
            continue
        arrived_names.add(n.barrier.name)
        cnt = ks.max_sharing(s, [n.barrier.index])  # arrivals on one barrier index
        mult = sync.inner_multiplicity(s, key[2], k.consts)
        if cnt is None or mult is None:
            unknown.add(key)
            continue
        if cnt == 0:
            continue
        groups.setdefault(key, []).append((s, cnt * mult * sync.cluster_weight(k, n)))
    # mbarriers
    for key, items in groups.items():
        if key in unknown:
            continue
        name, _, depth = key
        decl = k.barrier(name)
        bi = bidx[name]
        per_role: dict = {}
        for s, c in items:
            ctxp = s.loop_paths[depth] if depth >= 0 else None
            lst = per_role.setdefault(s.role_index, {}).setdefault(ctxp, [])
            if any(_exclusive(t, s) for t, _ in lst):
                continue
            lst.append((s, c))
        first = {r: sum(c for _, c in next(iter(v.values()))) for r, v in per_role.items()}
        for r, ctxs in per_role.items():
            for ctxp, lst in ctxs.items():
                total = sum(c for _, c in lst) + sum(v for r2, v in first.items() if r2 != r)
                if total == decl.arrivals:
                    continue
                s0 = lst[0][0]
                parts = []
                for r2, ctxs2 in per_role.items():
                    l2 = lst if r2 == r else next(iter(ctxs2.values()))
                    for s2, c2 in l2:
                        who = ks.space(s2.role_index).describe(ks.mask(s2))
                        parts.append(f"{c2} at {s2.path} ({who})")
                yield ctx.report(s0.path, f"{name}[{s0.node.barrier.index}] gets {total} arrival(s) per phase "
                                 f"({'; '.join(parts)}) but is declared with arrivals {decl.arrivals}: "
                                 + ("the phase never completes and the waiter hangs" if total < decl.arrivals else
                                    "the phase completes early and the surplus spills into the next phase"),
                                 legal=total, fix=_fix(ctx, k, bi, total),
                                 related=[f"/barriers/{bi}"] + [s2.path for s2, _ in lst[1:]])
    # waited but never arrived
    reported = set()
    for s in waits:
        name = s.node.barrier.name
        if name in arrived_names or name in reported:
            continue
        reported.add(name)
        yield ctx.report(s.path, f"waits on mbarrier {name!r}, but no statement ever arrives on it (mbar_arrive, "
                         "mbar_expect_tx or cp_async_arrive; TMA copies only complete bytes): the wait never "
                         "completes", legal=0, related=[f"/barriers/{bidx[name]}"])
    # named barriers
    for name, per_role in named.items():
        if "?" in per_role:
            continue
        decl = k.barrier(name)
        bi = bidx[name]
        roles = list(per_role)
        if len(roles) == 1:
            for s, c in _role_instances(per_role[roles[0]]):
                if c != decl.threads:
                    fix = [{"op": "replace", "path": f"/barriers/{bi}/threads", "value": c}] \
                        if barrier_in_source(ctx, bi) else None
                    yield ctx.report(s.path, f"{s.node.op} on {name!r} is reached by {c // 32} warp(s) ({c} "
                                     f"threads) but the barrier expects {decl.threads}: "
                                     + ("it never completes (hang)" if c < decl.threads else
                                        "it completes before every participant arrived"),
                                     legal=c, fix=fix, related=[f"/barriers/{bi}"])
        else:
            total = sum(max(c for _, c in _role_instances(lst)) for lst in per_role.values())
            if total != decl.threads:
                s0 = per_role[roles[0]][0][0]
                fix = [{"op": "replace", "path": f"/barriers/{bi}/threads", "value": total}] \
                    if barrier_in_source(ctx, bi) else None
                yield ctx.report(s0.path, f"named barrier {name!r} is reached by {total} threads per instance across "
                                 f"roles but expects {decl.threads}", legal=total, fix=fix,
                                 related=[f"/barriers/{bi}"] + [lst[0][0].path for lst in per_role.values()][1:])


def _role_instances(sites: list) -> list:
    """(site, threads per instance) for one role's sites on a named barrier. Sites reached by disjoint warp
    sets (e.g. `if wg == 0: bar_sync` / `else: bar_arrive`, warpgroups taking turns) meet in one instance, so
    each counts the warps of every such set (the largest site per set); sites of overlapping sets count alone."""
    sets: dict = {}
    for _, c, warps in sites:
        sets[warps] = max(c, sets.get(warps, 0))
    keys = list(sets)
    disjoint = all(not (a & b) for i, a in enumerate(keys) for b in keys[i + 1:])
    if len(keys) > 1 and disjoint:
        total = sum(sets.values())
        return [(s, total) for s, _, _ in sites]
    return [(s, c) for s, c, _ in sites]
