"""The wide k-means assignment for large D on Hopper: points streamed with the centroids (a GEMM main loop).

`kmeans_wide_assign_wgmma` keeps a point tile's whole D in shared memory, so at D >= 768 only 64 points fit
(one warpgroup per SM, each m64 n64 wgmma reading both operands from shared memory). Here both operands
stream through the ring instead: step g stages dims [64 a, 64 a + 64) (a = g % NCH) of the CTA's `bm`
points and of centroid tile t = g / NCH, so the point tile can be 128 rows (two warpgroups) at any D, at the
price of re-reading the points once per centroid tile (from L2: N K D 2 / bn bytes against the centroids'
N K D 2 / bm). The argmin is the other forms'; the scatter reads the points from global memory (they were
just streamed: L2 hits). Tensors and the finalize are `tasks.kmeans.wide`'s.
"""
from cake_ir.builder import KernelBuilder, tile

from .wide import (ATOM, BIG, SMEM_BYTES, K_MAX, _declare_assign_io, _load_step, argmin_tile, await_and_refill, count_points,
                   check_copies, check_d, check_red, padded, slice_of, suffix, sums_row)


def streamed_smem_bytes(bm: int, bn: int, stages: int) -> int:
    """The ring (a point atom [bm, 64], a centroid atom [bn, 64] and bn norms per stage) plus 1 KB of
    alignment for the swizzled slots."""
    return stages * (2 * bm * ATOM + 2 * bn * ATOM + 4 * bn) + 1024


def _check(d: int, bm: int, bn: int, stages: int, minb: int, arch: str) -> None:
    if arch != "sm_90a":
        raise ValueError("kmeans_wide_assign_streamed needs sm_90a (wgmma)")
    if bm not in (64, 128) or bn % 16 or not 16 <= bn <= 256 or stages < 3 or minb not in (1, 2):
        raise ValueError(f"kmeans_wide_assign_streamed: bm 64 or 128, bn a multiple of 16 up to 256, stages >= 3, "
                         f"minb 1 or 2 (got bm={bm}, bn={bn}, stages={stages}, minb={minb})")
    smem = minb * streamed_smem_bytes(bm, bn, stages)
    if smem > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_streamed: {smem} B of shared memory for {minb} CTA(s) at bm={bm}, "
                         f"bn={bn}, stages={stages} exceed sm_90a's {SMEM_BYTES['sm_90a']}")


def _load_points_step(r, g: str, bm: int, stages: int) -> None:
    """Ring step `g`'s point atom: dims ((g) % NCH) * 64 of the CTA's bm points into slot g % stages."""
    r.copy("cp_async", tile("X", ["b * N + n0", f"(({g}) % NCH) * DC"], [bm, ATOM]),
           tile("sX", slot=f"({g}) % {stages}"), oob="zfill")


def _step(r, g: str, bm: int, bn: int, stages: int) -> None:
    _load_points_step(r, g, bm, stages)
    _load_step(r, g, bn, ATOM, stages)


def kmeans_wide_assign_streamed(d: int = 1024, bm: int = 128, bn: int = 128, stages: int = 4, red: int = 1,
                                minb: int = 1, arch: str = "sm_90a", copies: int = 1, lv: bool = False):
    """Assignment + global scatter with points and centroids streamed as 64-dim swizzle atoms; grid
    (cdiv(N, BM), B). One wgmma chain stays in flight across the next step's barrier (the ring loads
    stages - 2 steps ahead, into a slot whose chain has retired). minb: CTAs per SM the registers and shared
    memory must allow (2: one CTA's argmin and scatter run under the other's main loop). red, copies, lv: as
    in `tasks.kmeans.wide.kmeans_wide_assign`."""
    check_d(d)
    check_red(red, arch, lv)
    check_copies(copies)
    _check(d, bm, bn, stages, minb, arch)
    nch = padded(d, ATOM) // ATOM
    warps = bm // 16
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_s{stages}_st" + (f"_b{minb}" if minb > 1 else "")
                       + suffix(red, copies, lv), arch=arch,
                       grid=["cdiv(N, BM)", "B"], threads=32 * warps, min_blocks_per_sm=minb,
                       note="wide k-means assignment: points and centroids streamed, wgmma argmin, global scatter")
    kb.const(BM=bm, BN=bn, D=d, DC=ATOM, NCH=nch)
    _declare_assign_io(kb, d, copies)
    kb.buffer("sX", "smem", "f16", [bm, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("sC", "smem", "f16", [bn, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("cn", "smem", "f32", [1, bn], stages=stages)
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")
    kb.buffer("bv", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    kb.buffer("bi", "reg", "i32", [16, 1], layout="mma_rows", scope="warp")
    steps = "cdiv(K, BN) * NCH"
    ahead = stages - 2
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("n0", "bid.x * BM")
        r.let("wm0", "role_warp * 16")
        for s in range(ahead):
            with r.if_(f"{s} < {steps}"):
                _step(r, str(s), bm, bn, stages)
            r.sync("cp_async_commit")
        r.fill("bv", BIG)
        r.fill("bi", -1)
        with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
            with r.for_("a", 0, "NCH", id="atom_loop"):
                g = "t * NCH + a"
                await_and_refill(r, g, ahead, steps, lambda step: _step(r, step, bm, bn, stages))
                r.sync("wgmma_fence")
                r.wgmma([64, bn, 16], tile("sX", ["64 * wg", 0], [64, ATOM], slot=f"({g}) % {stages}"),
                        tile("sC", [0, 0], [bn, ATOM], slot=f"({g}) % {stages}"), tile("acc"), accumulate="a > 0",
                        id="distances")
                r.sync("wgmma_commit")
                r.sync("wgmma_wait", n=1)
            r.sync("wgmma_wait", n=0)                   # the argmin reads acc
            argmin_tile(r, "acc", "t", bn, stages)
        r.sync("cp_async_wait", n=0)
        r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
        r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
        _scatter_points_global(r, d, red, copies, lv)
    return kb.build()


def _scatter_points_global(r, d: int, red: int, copies: int, lv: bool = False, sb: int = 1,
                           sorted_sums: bool = False) -> None:
    """WS[a_j] += X[j] (rows read from global memory), WC[a_j] += 1, for the warp's 16 points (rows past N
    skipped); sb: groups of reds per lane and slice, whose loads are all in flight before the first red.
    sorted_sums: the counts only (the sums by tasks.kmeans.sorted_sums)."""
    if sorted_sums:
        return count_points(r, "bi", copies, "n0 + wm0")
    w = slice_of(red) * sb
    with r.for_("sc", 0, d // w, id="scatter_slices"):
        r.add("scatter_add", id="sum_points", index=tile("bi"), src=tile("X", ["b * N + n0 + wm0", f"sc * {w}"], [16, w]),
              dst=tile("WS", [sums_row(copies), f"sc * {w}"], [K_MAX, w]), row0="n0 + wm0", row_limit="N",
              vec=red, load_vec=lv)
    count_points(r, "bi", copies, "n0 + wm0")
