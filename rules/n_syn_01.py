"""N-SYN-01: the synchronisation simulation did not run on this kernel.

The race and protocol rules (E-SYN-06/07/08/10/11/12, the pipeline checks) judge a kernel on a
simulation of its roles at sampled sizes. When the simulation cannot run -- more statement executions
than its budget, an expression it cannot evaluate (a data-dependent value, a uniform value that
differs between threads), no launch sizes satisfying the params' facts -- those rules say nothing,
which reads like a clean bill. This note says that they did not look, and why, so that an author (or
the agent) knows the barriers are unchecked: shrink the sampled sizes' work (params' `min` facts), make
the value uniform, or accept the risk knowingly. (Loops whose bounds differ between threads, such as
per-warp strided loops, are simulated: each iteration runs with the threads whose range holds it.)
"""
from cake_ir.analysis import sync

from ._syn_util import safe

CODE = "N-SYN-01"
TITLE = "synchronisation not simulated (the race rules are silent)"
STAGE = "expanded"


@safe
def check(ctx):
    ks = sync.get(ctx.kernel)
    if ks.sim() is not None or ks.skipped is None:
        return
    why, path = ks.skipped
    yield ctx.report(path or "/", f"shared-memory synchronisation was not simulated: {why}; the race and barrier "
                                  "rules (E-SYN-*) did not check this kernel")
