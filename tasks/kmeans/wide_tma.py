"""The wide k-means assignment for large D on Hopper as a warp-specialized GEMM main loop: a TMA producer
warp streams the points and the centroids as 64-dim swizzle atoms through an mbarrier ring, the consumer
warpgroups run only wgmma, the argmin and the scatter.

`kmeans_wide_assign_streamed` streams the same atoms with cp.async issued by the MMA warps themselves and a
CTA-wide barrier per step, so every step's loads and barrier stand between two wgmma chains. Here step g
(centroid tile t = g / NCH, dims [64 a, 64 a + 64), a = g % NCH) is one TMA load of the CTA's `bm` points and
one of the tile's `bn` centroids into ring slot g % NS, `stages` steps ahead of the consumers, who wait on the
slot's full barrier, issue one wgmma chain, keep it in flight across the next wait and release a slot once its
chain retired. TMA zero-fills rows past the tensors' ends (rows of the next batch or past K are computed and
masked: the argmin's `limit`, the scatter's `row_limit`). The centroid norms of tile t come by cp.async into
one of two consumer-owned slots and are waited for before that tile's argmin. Tensors and the finalize are
`tasks.kmeans.wide`'s.
"""
from cake_ir.builder import KernelBuilder, bar, tile

from .wide import ATOM, BIG, SMEM_BYTES, _declare_assign_io, check_copies, check_d, check_red, padded, suffix
from .wide_streamed import _scatter_points_global

TMA_D_MIN = 64      # the box is a 64-dim atom wide
NORM_SLOTS = 2      # tile t's norms land while tile t - 1's argmin may still read its slot


def tma_smem_bytes(bm: int, bn: int, stages: int) -> int:
    """The ring (a point atom [bm, 64] and a centroid atom [bn, 64] per stage), the norm slots, and 1 KB of
    alignment for the swizzled slots (the ring's mbarriers fit in it)."""
    return stages * (2 * bm * ATOM + 2 * bn * ATOM) + NORM_SLOTS * 4 * bn + 1024


def _check(d: int, bm: int, bn: int, stages: int, arch: str) -> None:
    if arch != "sm_90a":
        raise ValueError("kmeans_wide_assign_tma needs sm_90a (TMA, wgmma)")
    if d < TMA_D_MIN:
        raise ValueError(f"kmeans_wide_assign_tma: D >= {TMA_D_MIN} (a TMA box of 64 dims), got {d}")
    if bm not in (64, 128) or bn % 16 or not 16 <= bn <= 256 or not 2 <= stages <= 8:
        raise ValueError(f"kmeans_wide_assign_tma: bm 64 or 128, bn a multiple of 16 up to 256, stages 2..8 "
                         f"(got bm={bm}, bn={bn}, stages={stages})")
    smem = tma_smem_bytes(bm, bn, stages)
    if smem > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_tma: {smem} B of shared memory at bm={bm}, bn={bn}, "
                         f"stages={stages} exceed sm_90a's {SMEM_BYTES['sm_90a']}")


def kmeans_wide_assign_tma(d: int = 1024, bm: int = 128, bn: int = 256, stages: int = 4, red: int = 4,
                           arch: str = "sm_90a", copies: int = 1, lv: bool = False, cluster: int = 1):
    """Assignment + global scatter, grid (cdiv(N, BM), B): a producer warpgroup (one elected thread issues the
    TMA loads) and bm / 64 consumer warpgroups of 64 point rows each. cluster 2: CTA pairs (consecutive point
    tiles, the grid rounded up to even) share each centroid atom, each CTA loading half of its rows multicast
    into both, so the centroids cross from L2 once per pair (`Pipeline.cluster`: a slot is refilled once both
    CTAs released it). red, copies, lv: as in `tasks.kmeans.wide.kmeans_wide_assign`."""
    check_d(d)
    check_red(red, arch, lv)
    check_copies(copies)
    _check(d, bm, bn, stages, arch)
    if cluster not in (1, 2):
        raise ValueError(f"kmeans_wide_assign_tma: cluster 1 or 2 CTAs, got {cluster}")
    cons = bm // 16                                             # consumer warps
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_s{stages}_tma" + (f"_cl{cluster}" if cluster > 1 else "")
                       + suffix(red, copies, lv), arch=arch,
                       grid=["cdiv(N, BM * 2) * 2" if cluster > 1 else "cdiv(N, BM)", "B"], threads=128 + 32 * cons,
                       cluster=[cluster, 1] if cluster > 1 else None,
                       note="wide k-means assignment: TMA producer, wgmma consumers, argmin, global scatter")
    kb.const(BM=bm, BN=bn, D=d, DC=ATOM, NCH=padded(d, ATOM) // ATOM, NS=stages)
    _declare_assign_io(kb, d, copies, tma={"X": {"box": [bm, ATOM], "swizzle": "128B"},
                                           "C": {"box": [bn // cluster, ATOM], "swizzle": "128B"}})
    kb.buffer("sX", "smem", "f16", [bm, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("sC", "smem", "f16", [bn, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("cn", "smem", "f32", [1, bn], stages=NORM_SLOTS)
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup", role="consumer")
    kb.buffer("bv", "reg", "f32", [16, 1], layout="mma_rows", scope="warp", role="consumer")
    kb.buffer("bi", "reg", "i32", [16, 1], layout="mma_rows", scope="warp", role="consumer")
    kb.named_barrier("norms_bar", 1, 32 * cons)
    kb.pipeline("ring", stages=stages, mechanism="tma", producer="producer", consumers=["consumer"],
                buffers=["sX", "sC"], cluster=cluster > 1)
    with kb.role("producer", warps=(0, 4), regs=40) as r:
        _produce(r, bm, bn, cluster)
    with kb.role("consumer", warps=(4, cons), regs=232) as r:
        _consume(r, d, bn, red, copies, lv)
    return kb.build()


def _produce(r, bm: int, bn: int, cluster: int = 1) -> None:
    """Ring step g: the CTA's points and centroid tile g / NCH at dims (g % NCH) * 64, one TMA load each; in a
    pair (cluster 2) the centroid load is this CTA's half of the tile's rows (its rank bid.x % 2), multicast."""
    r.let("b", "bid.y")
    r.let("n0", "bid.x * BM")
    half = bn // cluster
    c_row = "b * K + (g / NCH) * BN" + (f" + (bid.x % 2) * {half}" if cluster > 1 else "")
    c_dst = [f"(bid.x % 2) * {half}", 0] if cluster > 1 else None
    with r.if_("role_warp == 0 && elect_one()"):
        with r.for_("g", 0, "cdiv(K, BN) * NCH", id="load_loop"):
            r.pipe("acquire", "ring", "g")
            r.copy("tma_load", tile("X", ["b * N + n0", "(g % NCH) * DC"], [bm, ATOM]), tile("sX", slot="g % NS"),
                   barrier=bar("ring_full", "g % NS"), scope="thread", id="tma_points")
            r.copy("tma_load", tile("C", [c_row, "(g % NCH) * DC"], [half, ATOM]),
                   tile("sC", c_dst, [half, ATOM] if cluster > 1 else None, slot="g % NS"),
                   barrier=bar("ring_full", "g % NS"), scope="thread", id="tma_centroids", multicast=cluster > 1)
            r.pipe("commit", "ring", "g")


def _consume(r, d: int, bn: int, red: int, copies: int, lv: bool = False) -> None:
    """Per centroid tile: the distances' wgmma chains over the NCH atoms, then the running argmin; at the
    end the assignments and the scatter of the points into the sums."""
    r.let("b", "bid.y")
    r.let("n0", "bid.x * BM")
    r.let("wm0", "role_warp * 16")
    r.fill("bv", BIG)
    r.fill("bi", -1)
    with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
        r.copy("cp_async", tile("CN", [0, "b * K + t * BN"], [1, bn]), tile("cn", slot=f"t % {NORM_SLOTS}"),
               oob="zfill", vec_bytes=4, id="load_norms")
        r.sync("cp_async_commit")
        with r.for_("a", 0, "NCH", id="atom_loop"):
            g = "t * NCH + a"
            r.pipe("wait", "ring", g)
            r.sync("wgmma_fence")
            r.wgmma([64, bn, 16], tile("sX", ["64 * wg", 0], [64, ATOM], slot=f"({g}) % NS"),
                    tile("sC", [0, 0], [bn, ATOM], slot=f"({g}) % NS"), tile("acc"), accumulate="a > 0",
                    id="distances")
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1)                   # this step's chain stays in flight ...
            with r.if_(f"{g} > 0"):
                r.pipe("release", "ring", f"{g} - 1")   # ... the previous one's slot is free
        r.sync("wgmma_wait", n=0)                       # the argmin reads acc
        r.sync("cp_async_wait", n=0)
        r.add("bar_sync", barrier="norms_bar")          # every consumer's share of the norms has landed
        r.add("topk", id="argmin", kind="min", k=1, src=tile("acc"), vals=tile("bv"), idx=tile("bi"),
              col="t * BN", limit="K", scale=-2.0, col_bias=tile("cn", [0, 0], [1, bn], slot=f"t % {NORM_SLOTS}"))
    r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
    r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
    _scatter_points_global(r, d, red, copies, lv)
