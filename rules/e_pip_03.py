"""E-PIP-03: producer and consumers of a pipeline run the same number of iterations.

What: the number of `pipe_acquire` executions of the producer (its loops' trip counts, summed over
acquire sites, with uniform guards applied) must equal the number of `pipe_wait` executions of every
consumer role. Trip counts are compared by evaluating the loops for sampled values of the integer
params (they must agree for all sizes); `legal` is the producer's trip expression and, when both
sides are one loop, the fix copies the producer's bound to the consumer's loop.

What goes wrong on hardware: a consumer that waits more often than the producer fills waits on a
full barrier that never completes (hang). A consumer that waits less leaves stages unconsumed and
unreleased: the producer blocks on the empty barrier after S iterations (hang), or, when the producer
stops first, the consumer's result misses the last K tiles (wrong results).
"""
from cake_ir import expr as E
from cake_ir.analysis import sync
from cake_ir.nodes import PipeOp

from ._syn_util import safe

CODE = "E-PIP-03"
TITLE = "equal trip counts across pipeline roles"
STAGE = "source"


def _trip_text(site):
    if not site.loops:
        return "1"
    parts = []
    for loop in site.loops:
        span = f"{loop.stop}" if str(loop.start) in ("0",) else f"({loop.stop}) - ({loop.start})"
        parts.append(span if loop.step == 1 else f"cdiv({span}, {loop.step})")
    return " * ".join(f"({x})" if len(parts) > 1 else x for x in parts)


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    samples = [sync.exec_env(k, p) for p in sync.param_samples(k, ms=(256, 1024, 4096))]
    for pi, p in enumerate(k.pipelines):
        ops = [s for s in ks.sites if isinstance(s.node, PipeOp) and s.node.pipe == p.name and s.role is not None]
        acqs = [s for s in ops if s.node.op == "pipe_acquire" and s.role.name == p.producer]
        if not acqs:
            continue
        prod_counts = []
        for env in samples:
            c = [sync.count_execs(k, s.path, env) for s in acqs]
            prod_counts.append(None if any(x is None for x in c) else sum(c))
        legal = " + ".join(_trip_text(s) for s in acqs)
        for cname in dict.fromkeys(p.consumers):
            ws = [s for s in ops if s.node.op == "pipe_wait" and s.role.name == cname]
            if not ws:
                continue
            bad = None
            for env, pc in zip(samples, prod_counts):
                if pc is None:
                    continue
                c = [sync.count_execs(k, s.path, env) for s in ws]
                if any(x is None for x in c):
                    continue
                if sum(c) != pc:
                    bad = (env, pc, sum(c))
                    break
            if bad is None:
                continue
            env, pc, cc = bad
            w = ws[0]
            node = w.loop_paths[-1] if w.loop_paths else w.path
            sizes = ", ".join(f"{q.name}={env[q.name]}" for q in k.params if q.name in env and
                              getattr(q, "kind", "") == "scalar")
            fix = None
            if len(acqs) == 1 and len(ws) == 1 and acqs[0].loops and w.loops:
                pl, cl = acqs[0].loops[-1], w.loops[-1]
                fv = E.free_vars(E.parse_index(pl.stop)) | E.free_vars(E.parse_index(pl.start))
                if fv <= set(k.consts) | {q.name for q in k.params} and pl.step == cl.step:
                    fix = [{"op": "replace", "path": node + "/start", "value": pl.start},
                           {"op": "replace", "path": node + "/stop", "value": pl.stop}]
            yield ctx.report(node, f"consumer {cname!r} waits on pipeline {p.name!r} {cc} times but the producer "
                             f"{p.producer!r} acquires {pc} stages (with {sizes}): "
                             + ("the extra waits never complete (hang)" if cc > pc else
                                "stages stay unconsumed and unreleased (producer hangs or results miss tiles)"),
                             legal=legal, fix=fix, related=[acqs[0].loop_paths[-1] if acqs[0].loop_paths
                                                            else acqs[0].path, f"/pipelines/{pi}"])
