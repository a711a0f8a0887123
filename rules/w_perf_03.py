"""W-PERF-03: the grid ends in a mostly empty wave (tail-wave quantisation).

With a constant grid, blocks run in waves of `SMs x blocks-per-SM` (occupancy as in W-RES-04). When
there are fewer than 4 waves and the last one is less than half full, a large share of the GPU idles
for the tail (e.g. 264 + 1 blocks on 132 SMs take three waves). A grid of fewer blocks than half the
SMs (but more than one block) is reported too: most SMs get no work. Pick tile sizes that divide the
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
    if blocks < per_wave:
        # Less than one wave: what idles is SMs without any block.
        if blocks == 1 or blocks >= a.sms / 2:
            return
        yield ctx.report("/launch/grid", f"{blocks} blocks leave {a.sms - blocks} of {a.sms} SMs idle; split the "
                         "work into more blocks (smaller tiles, split-K)", legal=[f">= {a.sms // 2} blocks"])
        return
    waves = blocks / per_wave
    rem = blocks % per_wave
    if rem == 0 or waves >= 4 or rem / per_wave >= 0.5:
        return
    full = blocks // per_wave
    eff = waves / (full + 1)
    yield ctx.report("/launch/grid", f"{blocks} blocks = {full} full wave(s) + a tail of {rem}/{per_wave} "
                     f"({a.sms} SMs x {bps} blocks/SM); the tail wastes {100 * (1 - eff):.0f}% of the run",
                     legal=[per_wave * w for w in range(1, 5)])
