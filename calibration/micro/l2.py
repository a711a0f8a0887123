"""L2 bandwidth: a 16 MiB working set (a quarter of the H200's L2, so it stays resident in both
partitions' share) re-read many times by every SM.

- l2_tma_read: the TMA read stream of hbm.py with tiles taken modulo W (W x 16 KiB = 16 MiB).
- l2_ldg_read: 8 warps ldg 4 KiB tiles modulo W into an f32 register accumulator (one stg at the end).

l2_bw (bytes/s) = the faster of the two: bytes read / time. The cost model charges every global
byte against l2_bw (per SM share) and only the footprint against hbm_bw, which is what these
kernels exercise (their X footprint is 16 MiB, the traffic 4 GiB).
"""
from __future__ import annotations

from .base import Micro, TensorArg
from .hbm import COLS, GIB, _tiles, ldg_read, tma_stream

WORKING_SET = 16 * 2**20


def micros(sms: int, quick: bool = False) -> list[Micro]:
    total = GIB if quick else 4 * GIB
    out = []
    br, S, per_sm = 128, 4, 3
    G = per_sm * sms
    T = _tiles(total, br * COLS * 2, G)
    W = WORKING_SET // (br * COLS * 2)
    out.append(Micro(
        "l2_tma_read", "l2", tma_stream("l2_tma_read", br, S, store=False, working_set=W),
        {"G": G, "T": T}, {"X": TensorArg((W * br, COLS), "bf16", "randn")},
        "rate", ("l2_bw",), work=1.0 * G * T * br * COLS * 2, unit="B/s", flush_l2=False,
        description=f"TMA loads of {br}x64 bf16 tiles from a {WORKING_SET >> 20} MiB working set, "
                    f"{S}-stage pipeline, {per_sm} CTAs/SM; bytes read / time",
        extra={"working_set_bytes": WORKING_SET, "tile_bytes": br * COLS * 2}))

    br, per_sm = 32, 4
    G = per_sm * sms
    T = _tiles(total, br * COLS * 2, G)
    W = WORKING_SET // (br * COLS * 2)
    out.append(Micro(
        "l2_ldg_read", "l2", ldg_read("l2_ldg_read", br, working_set=W), {"G": G, "T": T},
        {"X": TensorArg((W * br, COLS), "bf16", "randn"), "Y": TensorArg((G * br, COLS), "f32", "poison")},
        "rate", ("l2_bw",), work=1.0 * G * T * br * COLS * 2, unit="B/s", flush_l2=False,
        description=f"ldg 16 B vectors of {br}x64 bf16 tiles from a {WORKING_SET >> 20} MiB working set "
                    f"into an f32 accumulator, {per_sm} CTAs/SM; bytes read / time",
        extra={"working_set_bytes": WORKING_SET, "tile_bytes": br * COLS * 2}))

    # The same ldg read over a working set far larger than L2: HBM read rate, informational.
    total_h = GIB // 4 if quick else GIB
    T = _tiles(total_h, br * COLS * 2, G)
    W = G * T
    out.append(Micro(
        "hbm_ldg_read", "hbm", ldg_read("hbm_ldg_read", br), {"G": G, "T": T},
        {"X": TensorArg((W * br, COLS), "bf16", "randn"), "Y": TensorArg((G * br, COLS), "f32", "poison")},
        "rate", ("hbm_bw",), work=1.0 * W * br * COLS * 2, unit="B/s", primary=False,
        description="the l2_ldg_read kernel streaming 1 GiB once (no reuse): HBM read rate",
        extra={"tile_bytes": br * COLS * 2}))
    return out
