"""W-PERF-03: the grid ends in a mostly empty wave (tail-wave quantisation).

With a constant grid, blocks run in waves of `SMs x blocks-per-SM` (occupancy as in W-RES-04). When
there are fewer than 4 waves and the last one is less than half full, a large share of the GPU idles
for the tail (e.g. 264 + 1 blocks on 132 SMs take three waves). Pick tile sizes that divide the
work into full waves, or use a persistent/stream-K schedule.
"""
from ._res_util import constant_grid, occupancy

CODE = "W-PERF-03"
TITLE = "tail-wave quantisation"
STAGE = "expanded"


def check(ctx):
    k, a = ctx.kernel, ctx.arch
    blocks = constant_grid(k)
    if blocks is None:
        return
    bps, _, _ = occupancy(k, a)
    if bps < 1:
        return
    per_wave = a.sms * bps
    waves = blocks / per_wave
    rem = blocks % per_wave
    if rem == 0 or waves >= 4 or rem / per_wave >= 0.5:
        return
    full = blocks // per_wave
    eff = waves / (full + 1)
    if full == 0:
        msg = (f"{blocks} blocks fill only {rem}/{per_wave} slots of one wave ({a.sms} SMs x {bps} blocks/SM); "
               f"{100 * (1 - eff):.0f}% of the GPU idles")
    else:
        msg = (f"{blocks} blocks = {full} full wave(s) + a tail of {rem}/{per_wave} ({a.sms} SMs x {bps} blocks/SM); "
               f"the tail wastes {100 * (1 - eff):.0f}% of the run")
    yield ctx.report("/launch/grid", msg, legal=[per_wave * w for w in range(1, 5)])
