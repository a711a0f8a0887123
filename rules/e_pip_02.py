"""E-PIP-02: pipeline stages are reused only after release, and written only after acquire.

What: in each consumer role every `pipe_wait(P, it)` is matched, in the same loop body, by a
`pipe_release(P, it')` with `it - it'` a constant d >= 0 (d = 0: release after use in the same
iteration, after the wait; d = 1: the deferred release of the previous stage used with
`wgmma_wait 1`, plus a final release after the loop). Every `pipe_release` in a loop has such a wait.
In the producer role every write of a pipeline buffer (copy / sts / fill / map) follows a
`pipe_acquire(P, ...)` in the same loop body, and for mechanism `cp_async` every acquire is followed by
a `pipe_commit` with the same iteration (it is what arrives on the full barrier). Checked on the IR as
written.

What goes wrong on hardware: a consumer that never releases a stage leaves its empty barrier
incomplete -- after S iterations the producer waits forever (hang). A release without a wait (or with
another iteration) arrives on the wrong phase and lets the producer overwrite a stage still being read
(wrong results). A producer writing a stage without acquiring it overwrites data the consumer is still
reading; a cp_async acquire without commit never signals the full barrier (hang).
"""
from cake_ir import expr as E
from cake_ir.analysis import sync
from cake_ir.nodes import Access, Copy, Fill, Map, PipeOp, WaitGroup

from ._syn_util import safe

CODE = "E-PIP-02"
TITLE = "wait/release pairing and acquire before producer writes"
STAGE = "source"


def _diff(a_site, a_text, b_site, b_text):
    na, nb = sync.parse_i(a_text), sync.parse_i(b_text)
    if na is None or nb is None:
        return None
    na, nb = sync.subst_lets(na, a_site.lets), sync.subst_lets(nb, b_site.lets)
    c = E.canon(E.Bin("-", na, nb))
    try:
        return int(c)
    except (TypeError, ValueError):
        return None


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    for pi, p in enumerate(k.pipelines):
        ops = [s for s in ks.sites if isinstance(s.node, PipeOp) and s.node.pipe == p.name and s.role is not None]
        waits = [s for s in ops if s.node.op == "pipe_wait" and s.role.name in p.consumers]
        rels = [s for s in ops if s.node.op == "pipe_release" and s.role.name in p.consumers]
        acqs = [s for s in ops if s.node.op == "pipe_acquire" and s.role.name == p.producer]
        commits = [s for s in ops if s.node.op == "pipe_commit" and s.role.name == p.producer]
        for w in waits:
            lp = sync.innermost_loop_path(w)
            ok = False
            for r in rels:
                if r.role_index != w.role_index or sync.innermost_loop_path(r) != lp:
                    continue
                d = _diff(w, w.node.iter, r, r.node.iter)
                if d is None or d < 0:
                    continue
                if d == 0 and not ks.before(w.path, r.path):
                    continue
                ok = True
                break
            if not ok:
                body = (lp + "/body/-") if lp else f"/roles/{w.role_index}/body/-"
                rel = {"op": "pipe_release", "pipe": p.name, "iter": w.node.iter}
                # with wgmma_wait n > 0 after the wait, the stage of iteration it - n is the one retired
                lag = max((s.node.n for s in ks.sites if isinstance(s.node, WaitGroup) and s.node.op == "wgmma_wait"
                           and s.role_index == w.role_index and sync.innermost_loop_path(s) == lp
                           and ks.before(w.path, s.path)), default=0)
                if lag and w.loops:
                    loop = w.loops[-1]
                    first = f"{loop.start} + {lag * loop.step}" if not isinstance(loop.start, int) \
                        else str(loop.start + lag * loop.step)
                    rel = {"op": "if", "cond": f"{loop.var} >= {first}",
                           "then": [{"op": "pipe_release", "pipe": p.name, "iter": f"{w.node.iter} - {lag}"}]}
                yield ctx.report(w.path, f"pipe_wait({p.name!r}, {w.node.iter}) has no matching pipe_release("
                                 f"{w.node.iter}) (or of an earlier iteration) in the same loop body: the stage is "
                                 "never handed back and the producer hangs once it wraps around",
                                 fix=[{"op": "add", "path": body, "value": rel}], related=[f"/pipelines/{pi}"])
        for r in rels:
            lp = sync.innermost_loop_path(r)
            if lp is None:
                continue
            ok = False
            for w in waits:
                if w.role_index != r.role_index or sync.innermost_loop_path(w) != lp:
                    continue
                d = _diff(w, w.node.iter, r, r.node.iter)
                if d is not None and d >= 0 and (d > 0 or ks.before(w.path, r.path)):
                    ok = True
                    break
            if not ok:
                yield ctx.report(r.path, f"pipe_release({p.name!r}, {r.node.iter}) does not follow a pipe_wait of the "
                                 "same (or a later) iteration in this loop body: it arrives on a phase of a stage "
                                 "this role has not consumed, letting the producer overwrite it early",
                                 related=[f"/pipelines/{pi}"])
        # producer writes after acquire
        bufs = set(p.buffers)
        prod = k.role(p.producer)
        if prod is None:
            continue
        for s in ks.sites:
            if s.role is None or s.role.name != p.producer:
                continue
            n = s.node
            if not isinstance(n, (Copy, Access, Fill, Map)):
                continue
            if not any(w and ref.buf in bufs for ref, w in sync.smem_refs(n)):
                continue
            lp = sync.innermost_loop_path(s)
            if any(sync.innermost_loop_path(a) == lp and ks.before(a.path, s.path) for a in acqs):
                continue
            yield ctx.report(s.path, f"writes pipeline buffer(s) of {p.name!r} without a preceding pipe_acquire in "
                             "the same loop body: the stage may still be read by the consumers",
                             related=[f"/pipelines/{pi}"])
        if p.mechanism == "cp_async":
            for a in acqs:
                lp = sync.innermost_loop_path(a)
                if not any(sync.innermost_loop_path(c) == lp and ks.before(a.path, c.path)
                           and _diff(a, a.node.iter, c, c.node.iter) == 0 for c in commits):
                    yield ctx.report(a.path, f"pipe_acquire({p.name!r}, {a.node.iter}) of a cp_async pipeline has no "
                                     "pipe_commit of the same iteration after it: nothing arrives on the full barrier "
                                     "and the consumers hang", related=[f"/pipelines/{pi}"])
