"""E-SYN-01: mbarriers must be initialised exactly once, in the prologue, by one thread, then fenced
and published with __syncthreads before any role uses them.

What: every index of every declared `mbarrier` array gets exactly one `mbar_init` with the
declaration's `arrivals`; the inits sit in the prologue under a one-thread guard (`tid == 0`); after
the last init the prologue executes `fence mbarrier_init` (or `proxy_async`) in the initialising
thread and then an unguarded `syncthreads`.

Why / what goes wrong on hardware: `mbarrier.init` is a plain shared-memory store of the 64-bit
barrier word. An index that is never initialised holds garbage (phase, pending count), so waits on it
pass at random or hang; initialising twice (two threads, or an init inside a role loop) can reset a
phase that another warp already arrived on -- the arrival is lost and the pipeline hangs. Without the
fence the init is not visible to the async proxy (TMA complete_tx may hit an uninitialised barrier),
and without the __syncthreads other warps can arrive or wait before the init lands. Initialising with
a different arrival count than declared makes phases complete early (races) or never (hangs).
"""
import itertools

from cake_ir import expr as E
from cake_ir.analysis import sync
from cake_ir.nodes import Fence, MBarrier, MbarInit, NamedBarSync, NamedBarrier, SimpleSync

from ._syn_util import barrier_in_source, safe

CODE = "E-SYN-01"
TITLE = "mbarrier initialisation: once, in the prologue, one thread, fence + syncthreads"
STAGE = "expanded"


def _index_values(ks, site, idx_text):
    node = sync.parse_i(idx_text)
    if node is None:
        return None
    node = sync.subst_lets(node, site.lets)
    consts = dict(ks.k.consts)
    ranges = []
    for loop in site.loops:
        t = sync.static_trip(loop, consts)
        a = E.try_const(E.parse_index(loop.start), consts)
        if t is None or not isinstance(a, int):
            return None
        ranges.append([(loop.var, a + j * loop.step) for j in range(t)])
    out = []
    for combo in itertools.islice(itertools.product(*ranges), 4096):
        env = dict(consts)
        env.update(combo)
        v = E.try_const(node, env)
        if not isinstance(v, int):
            return None
        out.append(v)
    return out


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    decls = {b.name: (i, b) for i, b in enumerate(k.barriers) if isinstance(b, MBarrier)}
    seen = {}
    unknown = set()
    prologue_inits = []
    for s in ks.sites:
        n = s.node
        if not isinstance(n, MbarInit):
            continue
        name = n.barrier.name
        if name not in decls:
            yield ctx.report(s.path, f"mbar_init names {name!r}, which is not a declared mbarrier",
                             legal=sorted(decls))
            continue
        bi, decl = decls[name]
        bpath = f"/barriers/{bi}"
        if s.role is not None:
            yield ctx.report(s.path, f"mbarrier {name!r} is initialised inside role {s.role.name!r}: initialise it "
                             "in the prologue (one thread), before the fence and __syncthreads that publish it; "
                             "re-initialising a live barrier loses arrivals of the other roles",
                             related=[bpath])
            continue
        cnt = ks.count(s)
        if cnt == 0:
            yield ctx.report(s.path, f"no thread executes this mbar_init of {name!r} (its guards select no thread "
                             "of the CTA), so the barrier stays uninitialised", legal=1,
                             related=ks.thread_guards(s) + [bpath])
            continue
        prologue_inits.append(s)
        if cnt is not None and cnt > 1:
            sp = ks.space(None)
            fix = None
            if not ks.expanded(s.path):
                fix = [{"op": "replace", "path": s.path, "value": {"op": "if", "cond": "tid == 0",
                                                                   "then": [sync.dump(n)]}}]
            yield ctx.report(s.path, f"mbar_init of {name!r} is executed by {sp.describe(ks.mask(s))}; exactly one "
                             "thread must initialise each mbarrier (guard it with `if tid == 0`)", legal=1,
                             fix=fix, related=ks.thread_guards(s) + [bpath])
        if n.arrivals != decl.arrivals:
            fix = None if ks.expanded(s.path) else [{"op": "replace", "path": s.path + "/arrivals",
                                                      "value": decl.arrivals}]
            yield ctx.report(s.path, f"mbar_init gives {name!r} {n.arrivals} arrival(s) per phase but the "
                             f"declaration says {decl.arrivals}", legal=decl.arrivals, fix=fix, related=[bpath])
        vals = _index_values(ks, s, n.barrier.index)
        if vals is None:
            unknown.add(name)
            continue
        for v in vals:
            if not 0 <= v < decl.count:
                yield ctx.report(s.path, f"mbar_init index {v} is outside {name!r}[0..{decl.count})",
                                 legal=list(range(decl.count)), related=[bpath])
            elif (name, v) in seen:
                yield ctx.report(s.path, f"{name}[{v}] is initialised twice (first at {seen[(name, v)]}); a second "
                                 "init resets the phase and pending count", related=[seen[(name, v)], bpath])
            else:
                seen[(name, v)] = s.path
    for name, (bi, decl) in decls.items():
        if name in unknown:
            continue
        missing = [i for i in range(decl.count) if (name, i) not in seen]
        if missing:
            fix = None
            if barrier_in_source(ctx, bi):
                inits = [{"op": "mbar_init", "barrier": {"name": name, "index": i}, "arrivals": decl.arrivals}
                         for i in missing]
                fix = [{"op": "add", "path": "/prologue/0", "value": {"op": "if", "cond": "tid == 0", "then": inits}}]
                if not prologue_inits:
                    fix += [{"op": "add", "path": "/prologue/1", "value": {"op": "fence", "kind": "mbarrier_init"}},
                            {"op": "add", "path": "/prologue/2", "value": {"op": "syncthreads"}}]
            yield ctx.report(f"/barriers/{bi}", f"mbarrier {name!r} index(es) {missing} are never initialised "
                             "(mbar_init in the prologue): waits on them read garbage and hang or pass at random",
                             legal=missing, fix=fix)
    if not prologue_inits:
        return
    last = max(prologue_inits, key=lambda s: ks.order[s.path])
    init_mask = ks.mask(last)
    fence = None
    for s in ks.sites:
        if s.role is not None or ks.order[s.path] <= ks.order[last.path]:
            continue
        if isinstance(s.node, Fence) and s.node.kind in ("mbarrier_init", "proxy_async"):
            m = ks.mask(s)
            if m is None or init_mask is None or not (init_mask & ~m).any():
                fence = s
                break
    sync_site = None
    if fence is not None:
        sp = ks.space(None)
        for s in ks.sites:
            if s.role is not None or ks.order[s.path] <= ks.order[fence.path]:
                continue
            n = s.node
            is_bar = isinstance(n, SimpleSync) and n.op == "syncthreads"
            if isinstance(n, NamedBarSync) and n.op == "bar_sync":
                d = k.barrier(n.barrier)
                is_bar = isinstance(d, NamedBarrier) and d.threads >= k.launch.threads
            if is_bar:
                m = ks.mask(s)
                if m is not None and m.all():
                    sync_site = s
                    break
    top = last.path.split("/")
    try:
        after = int(top[2]) + 1
    except (IndexError, ValueError):
        after = None
    if fence is None:
        fix = None
        if after is not None and not ks.expanded(last.path):
            fix = [{"op": "add", "path": f"/prologue/{after}", "value": {"op": "fence", "kind": "mbarrier_init"}},
                   {"op": "add", "path": f"/prologue/{after + 1}", "value": {"op": "syncthreads"}}]
        yield ctx.report(last.path, "no `fence mbarrier_init` (executed by the initialising thread) follows the "
                         "mbarrier inits in the prologue: the inits may not be visible to the async proxy (TMA "
                         "complete_tx) or to other warps", fix=fix)
    elif sync_site is None:
        fix = None
        if not ks.expanded(fence.path):
            fix = [{"op": "add", "path": sync.next_path(fence.path), "value": {"op": "syncthreads"}}]
        yield ctx.report(fence.path, "no unguarded `syncthreads` follows the mbarrier init fence in the prologue: "
                         "other warps may arrive on or wait for a barrier before it is initialised",
                         fix=fix, related=[last.path])
