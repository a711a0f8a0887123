"""E-SYN-07: wgmma fence / commit / wait discipline.

What: a batch of `wgmma` must be preceded by `wgmma_fence` (before the first wgmma of the role and
after any ordinary access of the accumulator or A-fragment registers: fill, map, stg, a previous
read), closed by `wgmma_commit`, and retired by `wgmma_wait n` before (a) the accumulator is read or
written by ordinary instructions (stg / map / reduce / sts of acc) and (b) the smem stage the wgmma
reads is released to the producer (`pipe_release`, or `mbar_arrive` on the slot's empty barrier).
`wgmma_wait n` leaves the n most recent groups in flight, so releasing the slot of the group just
committed after `wgmma_wait 1` is a bug, while releasing the previous iteration's slot is fine.
Checked on the protocol simulation: the wgmma's smem read is an interval [issue, retire], and the
producer's next write of the slot must be ordered after the retire.

What goes wrong on hardware: without the fence, wgmma may read accumulator registers before earlier
register writes are visible (stale or mixed accumulators). Without commit, wait_group does not cover
the wgmma. Reading the accumulator before the wait reads registers the tensor cores are still
writing (garbage in the output). Releasing the stage early lets TMA overwrite the A/B tiles while the
tensor cores still read them: wrong products that depend on timing.
"""
from ._syn_util import safe, sim_issues

CODE = "E-SYN-07"
TITLE = "wgmma fence / commit / wait before acc reads and slot release"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
