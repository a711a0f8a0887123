"""E-PIP-01: pipeline declarations and pipeline statements must be legal.

What: a `pipeline` names an existing producer role and existing, distinct consumer roles (the
producer is not a consumer); its `buffers` are smem buffers whose `stages` equal the pipeline's
`stages`; mechanism `tma` needs sm_90a (`cp_async` otherwise). Every `pipe_*` statement names an
existing pipeline and sits in the right role: `pipe_acquire`/`pipe_commit` in the producer,
`pipe_wait`/`pipe_release` in a consumer, none in the prologue. Checked on the IR as written.

What goes wrong on hardware: the expansion sizes the `<P>_full`/`<P>_empty` barriers from these
declarations (full arrivals = producer threads for cp_async, empty arrivals = consumer warps). A stage
count that differs from a buffer's `stages` makes slot `it % S` index past the buffer (overwriting the
next buffer in shared memory) or leaves stages unused; ops in the wrong role arrive on barriers whose
counts assume other threads (hang or early completion); a TMA pipeline on sm_80 does not compile.
"""
from cake_ir.analysis import sync
from cake_ir.nodes import PipeOp

from ._syn_util import safe

CODE = "E-PIP-01"
TITLE = "pipeline declarations and pipe_* placement"
STAGE = "source"


@safe
def check(ctx):
    k = ctx.kernel
    roles = [r.name for r in k.roles]
    for pi, p in enumerate(k.pipelines):
        base = f"/pipelines/{pi}"
        if k.role(p.producer) is None:
            yield ctx.report(f"{base}/producer", f"pipeline {p.name!r}: producer {p.producer!r} is not a role",
                             legal=roles)
        seen = set()
        for ci, c in enumerate(p.consumers):
            if k.role(c) is None:
                yield ctx.report(f"{base}/consumers/{ci}", f"pipeline {p.name!r}: consumer {c!r} is not a role",
                                 legal=[r for r in roles if r != p.producer])
            elif c == p.producer:
                yield ctx.report(f"{base}/consumers/{ci}", f"pipeline {p.name!r}: role {c!r} is both producer and "
                                 "consumer; the full/empty protocol needs two sides",
                                 legal=[r for r in roles if r != p.producer])
            elif c in seen:
                yield ctx.report(f"{base}/consumers/{ci}", f"pipeline {p.name!r}: consumer {c!r} is listed twice "
                                 "(the empty barrier would expect its warps twice)",
                                 fix=[{"op": "remove", "path": f"{base}/consumers/{ci}"}])
            seen.add(c)
        for bj, name in enumerate(p.buffers):
            b = k.buffer(name)
            bi = next((i for i, x in enumerate(k.buffers) if x.name == name), None)
            if b is None:
                yield ctx.report(f"{base}/buffers/{bj}", f"pipeline {p.name!r}: buffer {name!r} does not exist",
                                 legal=[x.name for x in k.buffers if x.space == "smem"])
            elif b.space != "smem":
                yield ctx.report(f"{base}/buffers/{bj}", f"pipeline {p.name!r}: buffer {name!r} is a register "
                                 "tile; pipeline stages live in shared memory",
                                 legal=[x.name for x in k.buffers if x.space == "smem"])
            elif b.stages != p.stages:
                yield ctx.report(f"/buffers/{bi}/stages", f"buffer {name!r} has {b.stages} stage(s) but pipeline "
                                 f"{p.name!r} cycles through {p.stages}: slot `it % {p.stages}` "
                                 + ("runs past the buffer into the next smem allocation" if b.stages < p.stages
                                    else "leaves stages unused"),
                                 legal=p.stages, fix=[{"op": "replace", "path": f"/buffers/{bi}/stages",
                                                       "value": p.stages}], related=[base])
        if p.mechanism == "tma" and "tma" not in ctx.arch.features:
            yield ctx.report(f"{base}/mechanism", f"pipeline {p.name!r} uses TMA, which {k.arch} does not have",
                             legal=["cp_async"], fix=[{"op": "replace", "path": f"{base}/mechanism",
                                                       "value": "cp_async"}])
    names = [p.name for p in k.pipelines]
    for s in sync.get(k).sites:
        n = s.node
        if not isinstance(n, PipeOp):
            continue
        p = k.pipeline(n.pipe)
        if p is None:
            yield ctx.report(s.path, f"{n.op} names pipeline {n.pipe!r}, which is not declared", legal=names)
            continue
        pi = names.index(n.pipe)
        if s.role is None:
            yield ctx.report(s.path, f"{n.op} in the prologue: pipeline statements belong in the producer "
                             f"({p.producer!r}) or consumer roles", related=[f"/pipelines/{pi}"])
            continue
        if n.op in ("pipe_acquire", "pipe_commit") and s.role.name != p.producer:
            yield ctx.report(s.path, f"{n.op} in role {s.role.name!r}, but {p.name!r}'s producer is "
                             f"{p.producer!r}", legal=[p.producer], related=[f"/pipelines/{pi}/producer"])
        if n.op in ("pipe_wait", "pipe_release") and s.role.name not in p.consumers:
            yield ctx.report(s.path, f"{n.op} in role {s.role.name!r}, which is not a consumer of {p.name!r}",
                             legal=list(p.consumers), related=[f"/pipelines/{pi}/consumers"])
