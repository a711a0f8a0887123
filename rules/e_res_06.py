"""E-RES-06: a blocked register tile does not split evenly over the threads that access it.

A `blocked` tile is dealt round-robin to the threads of its scope in chunks of `vec` elements, so the
tile's element count must be a multiple of threads x vec, and its inner extent a multiple of vec. The
thread count is the scope's, seen from the role that executes the access (warp 32, warpgroup 128,
role: the role's threads, cta: the block). Before this rule the lowering rejected such programs
(E-LOWER-UNSUPPORTED) after the verifier had passed them: the explore strategy found softmax with
1024 threads and 8-element chunks of a 4096-element row (4096 < 1024 x 8).
"""
from math import prod

from cake_ir.analysis.tiles import threads_in_scope
from cake_ir.nodes import Access

CODE = "E-RES-06"
TITLE = "blocked register tiles split evenly over their scope's threads"
STAGE = "expanded"

VECS = (1, 2, 4, 8, 16)


def check(ctx):
    k = ctx.kernel
    bufs = {b.name: (i, b) for i, b in enumerate(k.buffers)}
    seen = set()
    for s in ctx.sites:
        st = s.node
        if not isinstance(st, Access):
            continue
        for field in ("src", "dst"):
            ref = getattr(st, field, None)
            hit = bufs.get(getattr(ref, "buf", None))
            if hit is None:
                continue
            bi, b = hit
            if b.space != "reg" or b.layout != "blocked":
                continue
            rt = s.role.threads if s.role is not None else k.launch.threads
            T = threads_in_scope(b.scope, rt, k.launch.threads)
            n, inner = prod(b.shape), b.shape[-1]
            if n % (T * b.vec) == 0 and inner % b.vec == 0:
                continue
            key = (b.name, T)
            if key in seen:   # one report per buffer and thread count, at its first access
                continue
            seen.add(key)
            legal = [v for v in VECS if n % (T * v) == 0 and inner % v == 0]
            fix = [{"op": "replace", "path": f"/buffers/{bi}/vec", "value": max(legal)}] if legal else None
            yield ctx.report(f"{s.path}/{field}",
                             f"blocked tile {b.name!r} has {n} elements (inner extent {inner}); {T} threads "
                             f"({b.scope} scope) x vec {b.vec} = {T * b.vec} does not divide it evenly",
                             legal=legal or f"fewer threads: {n} must be a multiple of threads x vec",
                             fix=fix, related=[f"/buffers/{bi}"])
