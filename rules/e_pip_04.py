"""E-PIP-04: drain asynchronous work before a role ends.

What: before a role's body ends, its cp.async groups must be waited to 0 (`cp_async_wait 0` after
the last commit -- unless a `cp_async_arrive` hands them to an mbarrier that a consumer waits on),
its TMA stores committed and waited (`tma_store_commit; tma_store_wait 0`), and its wgmma groups
retired; reads of the accumulator after the last wgmma need `wgmma_wait 0` (wait n > 0 leaves the
final groups running). Checked on the protocol simulation at the end of each role; the fix appends the
missing wait to the role body.

What goes wrong on hardware: the block's shared memory is released when its last thread exits and
reused by the next block scheduled on the SM. A cp.async or bulk copy still in flight then writes into
(or a TMA store reads from) another block's shared memory -- corrupting an unrelated tile or storing
garbage to global memory. Reading the accumulator while the last wgmma group is running stores
partially accumulated results.
"""
from ._syn_util import safe, sim_issues

CODE = "E-PIP-04"
TITLE = "drain cp.async / TMA store / wgmma before the role ends"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
