"""E-SYN-10: cross-role shared-memory races and protocol deadlocks.

What: every pair of conflicting accesses (at least one write) to the same smem buffer, stage and
element region by different roles -- or involving an asynchronous TMA access, which is not ordered by
program order even within the issuing role -- must be ordered by a happens-before path: write ->
(arrive / TMA complete_tx on barrier b[i]) -> (wait on b[i] that observes that phase) -> read, and for
reuse of a stage (write-after-read): read -> arrive(empty[i]) -> producer's wait(empty[i]) -> next
write. The check runs on the protocol simulation of cake_ir.analysis.sync (all roles interpreted
with sampled sizes, mbarrier phases/parities/tx-counts and named barriers modelled exactly, a
happens-before DAG with async operations as [issue, completion] intervals): the prologue, every
iteration of the steady-state loops and the epilogue are covered. A run in which no role can make
progress is reported as a deadlock at the blocked wait. Races a more specific rule explains (wgmma
retire -> E-SYN-07, cp.async groups -> E-SYN-06, same-role thread mapping -> E-SYN-11) are reported
there.

What goes wrong on hardware: an unordered pair is a data race between warps or between a warp and
the TMA engine: consumers compute on half-written or previous-round tiles, producers overwrite tiles
still being read -- results are wrong intermittently and depend on timing, problem size and clocks.
A deadlock shows up as a kernel that never finishes (launch timeout / watchdog).
"""
from cake_ir.analysis import sync
from cake_ir.nodes import NamedBarSync, SimpleSync

from ._syn_util import barrier_path, safe, sim_issues

CODE = "E-SYN-10"
TITLE = "cross-role smem races and protocol deadlocks (happens-before)"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
    ks = sync.get(ctx.kernel)
    res = ks.sim()
    if res is None:
        return
    for item in res.deadlock:
        if not item:
            continue
        path, msg = item
        s = ks.by_path.get(path)
        if s is not None and isinstance(s.node, (SimpleSync, NamedBarSync)):
            continue  # __syncthreads / bar.sync in divergent code: E-SYN-09 / E-SYN-02
        rel = []
        if s is not None and hasattr(s.node, "barrier") and hasattr(s.node.barrier, "name"):
            rel = [barrier_path(ctx.kernel, s.node.barrier.name)]
        sizes = ", ".join(f"{k}={v}" for k, v in res.sizes.items())
        yield ctx.report(path, f"deadlock: this wait {msg.split(' ', 1)[1] if msg.startswith('waits') else msg}"
                         + (f" (simulated with {sizes})" if sizes else ""), related=[r for r in rel if r])
