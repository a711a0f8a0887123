"""E-PIP-05: stage slot and barrier index agree with the pipeline iteration.

What: after `pipe_acquire(P, it)` in the producer, every copy (or store) into one of P's buffers in the
same loop body must use `slot` equal to `it % S` (S = P's stages), and for mechanism `tma` its
`barrier` must be `P_full` with index equal to the same slot. After `pipe_wait(P, it)` in a consumer,
every read of P's buffers (wgmma operands, ldmatrix, lds, copies) in that loop body must use the same
slot. Equality is `expr.same` after inlining lets, falling back to evaluation over the first
iterations; the fix writes the expected expression.

What goes wrong on hardware: the barriers protect slot `it % S`. A copy into another slot overwrites
a stage the consumer may be reading, and a TMA copy that completes its bytes on another stage's full
barrier completes that phase early (the consumer reads a half-written tile) while the acquired stage's
phase never completes (hang). A consumer reading another slot computes on the wrong K tile.
"""
from cake_ir.analysis import sync
from cake_ir.nodes import Access, Copy, Fill, Map, PipeOp, Wgmma

from ._syn_util import safe

CODE = "E-PIP-05"
TITLE = "slot and barrier index equal the pipeline iteration's stage"
STAGE = "source"


def _body_after(ks, anchor, all_anchors):
    lp = sync.innermost_loop_path(anchor)
    nxt = [a for a in all_anchors if a.role_index == anchor.role_index and ks.before(anchor.path, a.path)
           and sync.innermost_loop_path(a) == lp]
    stop = min((ks.order[a.path] for a in nxt), default=None)
    for s in ks.sites:
        if s.role_index != anchor.role_index or not ks.before(anchor.path, s.path):
            continue
        if stop is not None and ks.order[s.path] >= stop:
            continue
        if lp is not None and not s.path.startswith(lp + "/"):
            continue
        if lp is None and s.loops and anchor.loops != s.loops[:len(anchor.loops)]:
            continue
        yield s


def _refs(n, write: bool):
    if isinstance(n, Wgmma):
        return [] if write else [("a", n.a), ("b", n.b)]
    if isinstance(n, (Copy, Access)):
        return [("dst", n.dst)] if write else [("src", n.src)]
    if isinstance(n, (Fill, Map)):
        return [("dst", n.dst)] if write else []
    return []


@safe
def check(ctx):
    k = ctx.kernel
    ks = sync.get(k)
    for pi, p in enumerate(k.pipelines):
        S = p.stages
        bufs = set(p.buffers)
        ops = [s for s in ks.sites if isinstance(s.node, PipeOp) and s.node.pipe == p.name and s.role is not None]
        for op, write in (("pipe_acquire", True), ("pipe_wait", False)):
            anchors = [s for s in ops if s.node.op == op]
            for a in anchors:
                it = a.node.iter
                want = f"({it}) % {S}" if not str(it).isidentifier() else f"{it} % {S}"
                for s in _body_after(ks, a, anchors):
                    n = s.node
                    for fld, ref in _refs(n, write):
                        if ref.buf not in bufs:
                            continue
                        slot = ref.slot if ref.slot is not None else 0
                        if sync.compare_at_site(k, s, slot, want, 3 * S + 2) is False:
                            yield ctx.report(s.path, f"{'writes' if write else 'reads'} {ref.buf} slot {slot!r} but "
                                             f"the enclosing {op}({p.name!r}, {it}) guards slot {want!r}",
                                             legal=want, fix=[{"op": "replace" if ref.slot is not None else "add",
                                                               "path": f"{s.path}/{fld}/slot", "value": want}],
                                             related=[a.path, f"/pipelines/{pi}"])
                    if write and p.mechanism == "tma" and isinstance(n, Copy) and n.kind == "tma_load" and \
                            n.dst.buf in bufs:
                        full = f"{p.name}_full"
                        b = n.barrier
                        if b is None or b.name != full:
                            yield ctx.report(s.path, f"TMA copy into pipeline buffer {n.dst.buf!r} completes on "
                                             f"{b.name if b else 'no barrier'!r} instead of {full!r}[{want}]",
                                             legal={"name": full, "index": want},
                                             fix=[{"op": "add" if b is None else "replace", "path": f"{s.path}/barrier",
                                                   "value": {"name": full, "index": want}}],
                                             related=[a.path, f"/pipelines/{pi}"])
                        elif sync.compare_at_site(k, s, b.index, want, 3 * S + 2) is False:
                            yield ctx.report(s.path, f"TMA copy completes on {full}[{b.index}] but the acquired stage "
                                             f"is {want}: another stage's phase completes early and this one never",
                                             legal=want, fix=[{"op": "replace", "path": f"{s.path}/barrier/index",
                                                               "value": want}],
                                             related=[a.path, f"/pipelines/{pi}"])
