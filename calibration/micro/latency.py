"""Copy latency and mbarrier round trip: one CTA, one outstanding operation at a time.

- lat_tma_cold / lat_tma_warm: one warp; per iteration one elected thread arms an mbarrier
  (expect_tx) and issues one TMA load of a 128x64 bf16 tile (16 KiB), then the warp waits on the
  mbarrier's phase. cold: a new tile every iteration from a buffer that is not in L2 (flushed
  before each repetition); warm: the same tile every iteration (an L2 hit after the first).
  lat_tma_small: the cold loop with a 8x64 tile (1 KiB): informational.
- lat_cp_async_cold / lat_cp_async_warm: 4 warps; per iteration one cp.async of a 32x64 bf16 tile
  (4 KiB, 16-byte chunks, two per thread), commit, wait_group 0.
- lat_ldg_cold: 4 warps; per iteration one ldg of a 32x64 bf16 tile into registers added into an
  accumulator, in a loop kept rolled (`unroll: 1` -> #pragma unroll 1; in-order issue: the next
  load waits for the add, which waits for the load). The cost model charges ldg streams cp_async_latency_s; informational.
- sync_mbarrier_pingpong: warp 0 arrives on `ping` and waits on `pong`; warp 1 waits on `ping` and
  arrives on `pong`. One iteration is one round trip.

Conversions (seconds per dependent iteration, launch overhead removed first):
    mbarrier_roundtrip_s = pingpong time / iterations
    tma_latency_s        = lat_tma_cold time / iterations - mbarrier_roundtrip_s
                           (cake_ir.cost charges an unpipelined TMA stream latency + round trip)
    cp_async_latency_s   = lat_cp_async_cold time / iterations
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, bar, tile

from .base import Micro, TensorArg
from .hbm import COLS


def _init_barriers(kb, names):
    p = kb.prologue
    with p.if_("tid == 0"):
        for n, arrivals in names:
            p.mbar_init(bar(n), arrivals)
    p.fence("mbarrier_init")
    p.sync("syncthreads")


def tma_latency(name: str, br: int = 128, tiles: int = 1):
    kb = KernelBuilder(name, arch="sm_90a", grid=[1], threads=32,
                       note="TMA latency: one load in flight, wait on its mbarrier each iteration")
    if tiles > 1:
        kb.const(BR=br, W=tiles)
    kb.scalar("J", min=1)
    kb.tensor("X", "bf16", ["W * BR" if tiles > 1 else br, COLS], tma={"box": [br, COLS], "swizzle": "128B"})
    kb.buffer("s", "smem", "bf16", [br, COLS], layout="swizzle_128B")
    kb.mbarrier("b", arrivals=1)
    _init_barriers(kb, [("b", 1)])
    idx = "0" if tiles == 1 else "(i % W) * BR"
    with kb.role("main", warps=(0, 1)) as r:
        with r.for_("i", 0, "J", id="loop"):
            with r.if_("elect_one()"):
                r.mbar_expect_tx(bar("b"), br * COLS * 2)
                r.copy("tma_load", tile("X", [idx, 0], [br, COLS]), tile("s"), barrier=bar("b"), scope="thread",
                       id="tma_load")
            r.mbar_wait(bar("b"), "i % 2")
    return kb.build()


def cp_async_latency(name: str, br: int = 32, tiles: int = 1, warps: int = 4):
    kb = KernelBuilder(name, arch="sm_90a", grid=[1], threads=32 * warps,
                       note="cp.async latency: one group in flight, wait_group 0 each iteration")
    if tiles > 1:
        kb.const(BR=br, W=tiles)
    kb.scalar("J", min=1)
    kb.tensor("X", "bf16", ["W * BR" if tiles > 1 else br, COLS])
    kb.buffer("s", "smem", "bf16", [br, COLS])
    idx = "0" if tiles == 1 else "(i % W) * BR"
    with kb.role("main", warps=(0, warps)) as r:
        with r.for_("i", 0, "J", id="loop"):
            r.copy("cp_async", tile("X", [idx, 0], [br, COLS]), tile("s"), vec_bytes=16, id="cp_async")
            r.sync("cp_async_commit")
            r.sync("cp_async_wait", n=0)
    return kb.build()


def ldg_latency(name: str, br: int = 32, tiles: int = 1, warps: int = 4):
    kb = KernelBuilder(name, arch="sm_90a", grid=[1], threads=32 * warps,
                       note="ldg latency: a load, then an add that needs it, in a loop that is not unrolled")
    if tiles > 1:
        kb.const(BR=br, W=tiles)
    kb.scalar("J", min=1)
    kb.tensor("X", "bf16", ["W * BR" if tiles > 1 else br, COLS])
    kb.tensor("Y", "f32", [br, COLS], access="write")
    kb.buffer("x", "reg", "bf16", [br, COLS], layout="blocked", vec=8, scope="cta")
    kb.buffer("acc", "reg", "f32", [br, COLS], layout="blocked", vec=8, scope="cta")
    idx = "0" if tiles == 1 else "(i % W) * BR"
    with kb.role("main", warps=(0, warps)) as r:
        r.fill("acc", 0.0)
        with r.for_("i", 0, "J", unroll=1, id="loop"):     # '#pragma unroll 1': no overlap across iterations
            r.ldg(tile("X", [idx, 0], [br, COLS]), tile("x"), vec_bytes=16, id="ldg")
            r.map("acc", "acc + x")
        r.stg(tile("acc"), tile("Y", [0, 0], [br, COLS]), vec_bytes=16)
    return kb.build()


def mbarrier_pingpong():
    kb = KernelBuilder("sync_mbarrier_pingpong", arch="sm_90a", grid=[1], threads=64,
                       note="mbarrier round trip: two warps ping-pong on two mbarriers")
    kb.scalar("J", min=1)
    kb.mbarrier("ping", arrivals=1)
    kb.mbarrier("pong", arrivals=1)
    _init_barriers(kb, [("ping", 1), ("pong", 1)])
    with kb.role("a", warps=(0, 1)) as r:
        with r.for_("i", 0, "J", id="loop_a"):
            with r.if_("lane == 0"):
                r.mbar_arrive(bar("ping"))
            r.mbar_wait(bar("pong"), "i % 2")
    with kb.role("b", warps=(1, 1)) as r:
        with r.for_("i", 0, "J", id="loop_b"):
            r.mbar_wait(bar("ping"), "i % 2")
            with r.if_("lane == 0"):
                r.mbar_arrive(bar("pong"))
    return kb.build()


def micros(sms: int, quick: bool = False) -> list[Micro]:
    J = 500 if quick else 2000
    out = []
    out.append(Micro(
        "sync_mbarrier_pingpong", "sync", mbarrier_pingpong(), {"J": 4 * J}, {},
        "latency", ("mbarrier_roundtrip_s",), work=4.0 * J, unit="s", flush_l2=False,
        description="two warps ping-pong through two mbarriers (arrive / try_wait.parity); seconds per "
                    "round trip"))
    br = 128
    out.append(Micro(
        "lat_tma_cold", "latency", tma_latency("lat_tma_cold", br, tiles=J), {"J": J},
        {"X": TensorArg((J * br, COLS), "bf16", "randn")},
        "latency", ("tma_latency_s",), work=float(J), unit="s", subtract=("mbarrier_roundtrip_s",),
        description=f"one CTA, one {br}x64 bf16 TMA load (16 KiB) in flight, a new tile each iteration "
                    f"(HBM); seconds per load - mbarrier_roundtrip_s",
        extra={"tile_bytes": br * COLS * 2}))
    out.append(Micro(
        "lat_tma_warm", "latency", tma_latency("lat_tma_warm", br, tiles=1), {"J": J},
        {"X": TensorArg((br, COLS), "bf16", "randn")},
        "latency", ("tma_latency_s",), work=float(J), unit="s", subtract=("mbarrier_roundtrip_s",),
        primary=False, flush_l2=False,
        description="the same 16 KiB tile every iteration (L2 hit); seconds per load - mbarrier_roundtrip_s",
        extra={"tile_bytes": br * COLS * 2}))
    out.append(Micro(
        "lat_tma_small", "latency", tma_latency("lat_tma_small", 8, tiles=J), {"J": J},
        {"X": TensorArg((J * 8, COLS), "bf16", "randn")},
        "latency", ("tma_latency_s",), work=float(J), unit="s", subtract=("mbarrier_roundtrip_s",),
        primary=False,
        description="cold loop with an 8x64 bf16 tile (1 KiB); seconds per load - mbarrier_roundtrip_s",
        extra={"tile_bytes": 8 * COLS * 2}))
    br = 32
    out.append(Micro(
        "lat_cp_async_cold", "latency", cp_async_latency("lat_cp_async_cold", br, tiles=J), {"J": J},
        {"X": TensorArg((J * br, COLS), "bf16", "randn")},
        "latency", ("cp_async_latency_s",), work=float(J), unit="s",
        description=f"one CTA of 4 warps, one {br}x64 bf16 cp.async group (4 KiB) in flight, a new tile "
                    f"each iteration (HBM); seconds per group",
        extra={"tile_bytes": br * COLS * 2}))
    out.append(Micro(
        "lat_cp_async_warm", "latency", cp_async_latency("lat_cp_async_warm", br, tiles=1), {"J": J},
        {"X": TensorArg((br, COLS), "bf16", "randn")},
        "latency", ("cp_async_latency_s",), work=float(J), unit="s", primary=False, flush_l2=False,
        description="the same 4 KiB tile every iteration (L2 hit); seconds per group",
        extra={"tile_bytes": br * COLS * 2}))
    out.append(Micro(
        "lat_ldg_cold", "latency", ldg_latency("lat_ldg_cold", br, tiles=J), {"J": J},
        {"X": TensorArg((J * br, COLS), "bf16", "randn"), "Y": TensorArg((br, COLS), "f32", "poison")},
        "latency", ("cp_async_latency_s",), work=float(J), unit="s", primary=False,
        description="one CTA of 4 warps, ldg of a new 4 KiB tile per iteration feeding an add; seconds per "
                    "load",
        extra={"tile_bytes": br * COLS * 2}))
    return out
