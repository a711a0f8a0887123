"""Tensor-core throughput on resident operands (no global traffic inside the loop).

- tensor_mma_sync: 8 warps per CTA, one CTA per SM. Each warp ldmatrix-loads a 64x16 A fragment
  and a 64x16 B fragment once (random bf16 from global through smem), then issues
  mma_sync(64x64x16) J times: 32 independent m16n8k16 instructions per statement, each
  accumulating into its own fp32 fragment. The accumulator is stored once at the end.
- tensor_wgmma: two consumer warpgroups per CTA, one CTA per SM. One elected thread TMA-loads a
  128x64 A tile and a 256x64 B tile (128B swizzle) once; then each warpgroup issues J times
  fence / wgmma m64n256k16 x 4 (K = 64) / commit / wait_group 1, accumulating in registers; a final
  wait_group 0 and one stg of the accumulator.

mma_sync_flops / wgmma_flops (FLOP/s) = 2*M*N*K summed over all CTAs / time.
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, bar, tile

from .base import Micro, TensorArg


def mma_sync_loop(warps: int = 8, wm: int = 64, wn: int = 64, unroll: int = 2):
    kb = KernelBuilder("tensor_mma_sync", arch="sm_90a", grid=["G"], threads=32 * warps,
                       note="mma.sync throughput on resident fragments")
    kb.const(WM=wm)
    kb.scalar("G", min=1)
    kb.scalar("J", min=1)
    kb.tensor("A", "bf16", [wm, 16])
    kb.tensor("B", "bf16", [wn, 16])
    kb.tensor("C", "f32", [f"G * {warps} * WM", wn], access="write")
    kb.buffer("sA", "smem", "bf16", [wm, 16], pad=8)      # 48-byte pitch: conflict-free ldmatrix
    kb.buffer("sB", "smem", "bf16", [wn, 16], pad=8)
    kb.buffer("fa", "reg", "bf16", [wm, 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "bf16", [wn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [wm, wn], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, warps)) as r:
        r.copy("sync", tile("A", [0, 0], [wm, 16]), tile("sA"), vec_bytes=16)
        r.copy("sync", tile("B", [0, 0], [wn, 16]), tile("sB"), vec_bytes=16)
        r.sync("syncthreads")
        r.ldmatrix(tile("sA"), tile("fa"))
        r.ldmatrix(tile("sB"), tile("fb"))
        r.fill("acc", 0.0)
        with r.for_("j", 0, "J", unroll=unroll, id="loop"):
            r.mma_sync(tile("fa"), tile("fb"), tile("acc"), id="mma")
        r.stg(tile("acc"), tile("C", [f"(bid.x * {warps} + role_warp) * WM", 0], [wm, wn]), vec_bytes=4)
    return kb.build()


def wgmma_loop(consumers: int = 2, bn: int = 256, bk: int = 64):
    bm = 64 * consumers
    kb = KernelBuilder("tensor_wgmma", arch="sm_90a", grid=["G"], threads=128 * consumers,
                       note="wgmma throughput on resident smem tiles")
    kb.const(BM=bm)
    kb.scalar("G", min=1)
    kb.scalar("J", min=1)
    kb.tensor("A", "bf16", [bm, bk], tma={"box": [bm, bk], "swizzle": "128B"})
    kb.tensor("B", "bf16", [bn, bk], tma={"box": [bn, bk], "swizzle": "128B"})
    kb.tensor("C", "f32", ["G * BM", bn], access="write")
    kb.buffer("sA", "smem", "bf16", [bm, bk], layout="swizzle_128B")
    kb.buffer("sB", "smem", "bf16", [bn, bk], layout="swizzle_128B")
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup", role="mma")
    kb.mbarrier("ld", arrivals=1)
    p = kb.prologue
    with p.if_("tid == 0"):
        p.mbar_init(bar("ld"), 1)
    p.fence("mbarrier_init")
    p.sync("syncthreads")
    with kb.role("mma", warps=(0, 4 * consumers)) as r:
        with r.if_("role_warp == 0 && elect_one()"):
            r.mbar_expect_tx(bar("ld"), (bm + bn) * bk * 2)
            r.copy("tma_load", tile("A", [0, 0], [bm, bk]), tile("sA"), barrier=bar("ld"), scope="thread")
            r.copy("tma_load", tile("B", [0, 0], [bn, bk]), tile("sB"), barrier=bar("ld"), scope="thread")
        r.mbar_wait(bar("ld"), 0)
        r.fill("acc", 0.0)
        with r.for_("j", 0, "J", id="loop"):
            r.sync("wgmma_fence")
            r.wgmma([64, bn, 16], tile("sA", ["64 * wg", 0], [64, bk]), tile("sB", [0, 0], [bn, bk]), tile("acc"),
                    id="wgmma")
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1)
        r.sync("wgmma_wait", n=0)
        r.stg(tile("acc"), tile("C", ["bid.x * BM + 64 * wg", 0], [64, bn]), vec_bytes=4)
    return kb.build()


def micros(sms: int, quick: bool = False) -> list[Micro]:
    out = []
    warps, wm, wn = 8, 64, 64
    G = sms
    J = 512 if quick else 2048
    out.append(Micro(
        "tensor_mma_sync", "tensor", mma_sync_loop(warps, wm, wn), {"G": G, "J": J},
        {"A": TensorArg((wm, 16), "bf16", "randn"), "B": TensorArg((wn, 16), "bf16", "randn"),
         "C": TensorArg((G * warps * wm, wn), "f32", "poison")},
        "rate", ("mma_sync_flops",), work=2.0 * G * warps * J * wm * wn * 16, unit="FLOP/s", flush_l2=False,
        description=f"mma.sync m16n8k16 bf16->fp32, {warps} warps x {wm}x{wn} warp tiles (32 independent "
                    f"accumulators per warp), 1 CTA/SM; 2*M*N*K / time",
        extra={"iterations": J}))
    consumers, bn, bk = 2, 256, 64
    J = 256 if quick else 1024
    out.append(Micro(
        "tensor_wgmma", "tensor", wgmma_loop(consumers, bn, bk), {"G": G, "J": J},
        {"A": TensorArg((64 * consumers, bk), "bf16", "randn"), "B": TensorArg((bn, bk), "bf16", "randn"),
         "C": TensorArg((G * 64 * consumers, bn), "f32", "poison")},
        "rate", ("wgmma_flops",), work=2.0 * G * consumers * J * 64 * bn * bk, unit="FLOP/s", flush_l2=False,
        description=f"wgmma m64n{bn}k16 bf16->fp32 from resident 128B-swizzled smem, {consumers} warpgroups "
                    f"x K={bk} per commit, wait_group 1, 1 CTA/SM; 2*M*N*K / time",
        extra={"iterations": J}))
    return out
