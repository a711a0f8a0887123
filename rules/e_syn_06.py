"""E-SYN-06: cp.async commit/wait discipline.

What: `cp_async` copies only become waitable once a `cp_async_commit` closes their group; a read of
shared memory filled by cp.async (ldmatrix, lds, a wgmma operand, a sync copy) needs a
`cp_async_wait n` that leaves that group complete (wait_group n lets the n most recent groups stay in
flight) and, because the copies were issued cooperatively by other threads, a CTA/role barrier
(`syncthreads` / `bar_sync`) between the wait and the read. In the classic single-role pipeline with S
stages and one commit per iteration that is `cp_async_wait (S-2)` then `syncthreads` at the top of
the iteration. Checked on the protocol simulation (cake_ir.analysis.sync): the read must be ordered
after the copy's completion (through the wait), and through a barrier when the threads differ.

What goes wrong on hardware: `cp.async.wait_group` does not wait for uncommitted copies, and it only
makes the *issuing thread's* copies complete and visible to that thread. Without the commit, with too
large an n, or without the barrier, warps read a stage whose 16-byte chunks are still landing: stale
or partially written tiles feed the MMAs and the result is silently wrong (often only for some
blocks or some K sizes).
"""
from ._syn_util import safe, sim_issues

CODE = "E-SYN-06"
TITLE = "cp.async commit / wait_group / barrier before reading"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
