"""E-SYN-11: intra-role shared-memory hazards need a barrier between different threads' accesses.

What: within one role, shared memory written by some threads (sts, a sync copy, fill/map into smem,
cp.async after its wait) and read by other threads (lds/ldmatrix, or the same tile read with a
different thread-to-element mapping) needs a `syncthreads` / `bar_sync` between the write and the
read (`syncwarp` suffices when every element is written and read within one warp). Likewise a write
that overwrites elements other threads read earlier (write-after-read), e.g. in a single-role cp.async
pipeline the copy into slot (kt+S-1)%S in iteration kt must come after the barrier that follows the
reads of iteration kt-1. Accesses with the same mapping (sts then lds of the same tile with the same
register layout) and single-thread accesses are exempt. Checked on the protocol simulation with
per-warp element regions.

What goes wrong on hardware: warps run at different speeds; without a barrier a warp reads elements
another warp has not stored yet (stale data) or overwrites elements another warp has not read yet.
The result is wrong intermittently -- typical symptoms are a few corrupted tiles in a GEMM epilogue
staged through shared memory, or errors that appear only with more K iterations.
"""
from ._syn_util import safe, sim_issues

CODE = "E-SYN-11"
TITLE = "intra-role smem hazards need syncthreads / bar_sync / syncwarp"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
