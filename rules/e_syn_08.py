"""E-SYN-08: generic-proxy writes of shared memory read by the async proxy need `fence proxy_async`.

What: shared memory written by ordinary instructions (sts, a sync copy, fill/map into an smem tile,
and cp.async, which also writes through the generic proxy) and then read by the async proxy -- a `tma_store` source or a `wgmma` A/B operand -- needs a
`fence proxy_async` executed by the writing threads after their writes and before the barrier that
hands the tile to the issuing thread (typical epilogue: sts; fence proxy_async; bar_sync; one thread
tma_store). Checked on the protocol simulation: the last write of the region before the async read
must reach it through a proxy fence. The fix inserts the fence after the write.

What goes wrong on hardware: TMA and wgmma read shared memory through the async proxy, which is not
ordered with generic-proxy stores by barriers alone. Without the fence the bulk store or the tensor
cores may read the old contents of the tile: stale rows in the output, intermittently.
"""
from ._syn_util import safe, sim_issues

CODE = "E-SYN-08"
TITLE = "fence proxy_async between generic writes and async-proxy reads"
STAGE = "expanded"


@safe
def check(ctx):
    yield from sim_issues(ctx, CODE)
