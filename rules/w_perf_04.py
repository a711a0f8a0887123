"""W-PERF-04: `wgmma_wait 0` right after `wgmma_commit` in a loop serialises consecutive k-steps.

Waiting for all wgmma groups immediately after committing leaves the tensor cores idle while the
next stage is waited for and issued. Keep one group in flight: `wgmma_wait 1`, and release the
previous stage's buffers (e.g. `pipe_release(k - 1)` guarded by `k > 0`) instead of the current
one; drain with `wgmma_wait 0` after the loop.
"""
from cake_ir.nodes import For, SimpleSync, WaitGroup

CODE = "W-PERF-04"
TITLE = "wgmma_wait 0 directly after wgmma_commit in a loop"
STAGE = "source"


def check(ctx):
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, For):
            continue
        for i in range(len(n.body) - 1):
            a, b = n.body[i], n.body[i + 1]
            if isinstance(a, SimpleSync) and a.op == "wgmma_commit" and isinstance(b, WaitGroup) \
                    and b.op == "wgmma_wait" and b.n == 0:
                yield ctx.report(f"{s.path}/body/{i + 1}/n", "wgmma_wait 0 right after wgmma_commit in the loop "
                                 "leaves no wgmma in flight across k-steps; wait with 1 and release the previous "
                                 "stage", legal=[1], related=[f"{s.path}/body/{i}"])
