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
one of two consumer-owned slots and are waited for before that tile's argmin. After the last centroid tile the
consumers scatter their points (re-read from global memory) into the sums, `sb` groups of 4-float reds per lane
and slice with every group's loads issued before its reds. Options measured and left off in the rule
(docs/perf-log.md): CTA pairs multicasting the centroid atoms (`cluster`), several point tiles a CTA with the
scatter by the producer warpgroup behind the consumers (`pt`). Tensors and the finalize are `tasks.kmeans.wide`'s.
"""
from cake_ir.builder import KernelBuilder, bar, tile

from .wide import (ATOM, BIG, K_MAX, SMEM_BYTES, _declare_assign_io, check_batch, check_copies, check_d, check_red,
                   check_sorted_sums, count_points, padded, slice_of, suffix, sums_row)
from .wide_streamed import _scatter_points_global

TMA_D_MIN = 64      # the box is a 64-dim atom wide
NORM_SLOTS = 2      # tile t's norms land while tile t - 1's argmin may still read its slot
SCATTER_WARPS = 3   # pt > 1: the producer warpgroup's warps 1-3 scatter (warp 0 issues the TMA loads)
SCATTER_UNROLL = 8
# (producer, consumer) setmaxnreg per thread, by pt > 1: the scatter warps need more than a TMA issuer; the
# consumers' code is compiled under the 384-thread launch cap (168) either way
REGS = {False: (40, 232), True: (88, 208)}


def tma_smem_bytes(bm: int, bn: int, stages: int, pt: int = 1) -> int:
    """The ring (a point atom [bm, 64] and a centroid atom [bn, 64] per stage), the norm slots, pt > 1: two
    slots of a tile's assignments, and 1 KB of alignment for the swizzled slots (the mbarriers fit in it)."""
    return stages * (2 * bm * ATOM + 2 * bn * ATOM) + NORM_SLOTS * 4 * bn + (2 * 4 * bm if pt > 1 else 0) + 1024


def _check(d: int, bm: int, bn: int, stages: int, arch: str, pt: int = 1) -> None:
    if arch != "sm_90a":
        raise ValueError("kmeans_wide_assign_tma needs sm_90a (TMA, wgmma)")
    if d < TMA_D_MIN:
        raise ValueError(f"kmeans_wide_assign_tma: D >= {TMA_D_MIN} (a TMA box of 64 dims), got {d}")
    if bm not in (64, 128) or bn % 16 or not 16 <= bn <= 256 or not 2 <= stages <= 8:
        raise ValueError(f"kmeans_wide_assign_tma: bm 64 or 128, bn a multiple of 16 up to 256, stages 2..8 "
                         f"(got bm={bm}, bn={bn}, stages={stages})")
    smem = tma_smem_bytes(bm, bn, stages, pt)
    if smem > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_tma: {smem} B of shared memory at bm={bm}, bn={bn}, "
                         f"stages={stages} exceed sm_90a's {SMEM_BYTES['sm_90a']}")


def kmeans_wide_assign_tma(d: int = 1024, bm: int = 128, bn: int = 256, stages: int = 4, red: int = 4,
                           arch: str = "sm_90a", copies: int = 1, lv: bool = False, cluster: int = 1, pt: int = 1,
                           sb: int = 1, sorted_sums: bool = False):
    """Assignment + global scatter, grid (cdiv(N, BM), B): a producer warpgroup (one elected thread issues the
    TMA loads) and bm / 64 consumer warpgroups of 64 point rows each. cluster 2: CTA pairs (consecutive point
    tiles, the grid rounded up to even) share each centroid atom, each CTA loading half of its rows multicast
    into both, so the centroids cross from L2 once per pair (`Pipeline.cluster`: a slot is refilled once both
    CTAs released it). pt > 1: `pt` consecutive point tiles a CTA (grid cdiv(N, BM PT)), the ring running on
    across them, and the scatter of tile p done by the producer warpgroup's warps 1-3 while the consumers run
    tile p + 1 (`_scatter_behind`). sb: the scatter's groups of 4-float reds per lane and slice, every group's
    point loads in flight before its reds (sb 1: one L2 round trip per 16 dims of a row pair). red, copies, lv:
    as in `tasks.kmeans.wide.kmeans_wide_assign`. sorted_sums: only the counts, the sums left to a counting sort
    (tasks.kmeans.sorted_sums; pt 1)."""
    check_d(d)
    check_sorted_sums(sorted_sums, copies)
    if sorted_sums and pt > 1:
        raise ValueError("kmeans_wide_assign_tma: sorted_sums with one point tile a CTA (pt 1)")
    check_red(red, arch, lv)
    check_batch(sb, red, d)
    check_copies(copies)
    _check(d, bm, bn, stages, arch, pt)
    if cluster not in (1, 2) or pt not in (1, 2, 4, 8) or (cluster > 1 and pt > 1):
        raise ValueError(f"kmeans_wide_assign_tma: cluster 1 or 2 CTAs, pt (point tiles a CTA) 1, 2, 4 or 8, not "
                         f"both above 1 (got cluster={cluster}, pt={pt})")
    cons = bm // 16                                             # consumer warps
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_s{stages}_tma" + (f"_cl{cluster}" if cluster > 1 else "")
                       + (f"_t{pt}" if pt > 1 else "") + suffix(red, copies, lv, sorted_sums) + (f"_sb{sb}" if sb > 1 and not sorted_sums else ""),
                       arch=arch,
                       grid=[_grid_x(cluster, pt), "B"], threads=128 + 32 * cons,
                       cluster=[cluster, 1] if cluster > 1 else None,
                       note="wide k-means assignment: TMA producer, wgmma consumers, argmin, global scatter")
    kb.const(BM=bm, BN=bn, D=d, DC=ATOM, NCH=padded(d, ATOM) // ATOM, NS=stages)
    if pt > 1:
        kb.const(PT=pt)
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
    if pt > 1:
        _declare_handoff(kb, bm, cons)
    producer_regs, consumer_regs = REGS[pt > 1]
    with kb.role("producer", warps=(0, 4), regs=producer_regs) as r:
        if pt > 1:
            _produce_tiles(r, bm, bn)
            _scatter_behind(r, d, red, copies, lv, sb)
        else:
            _produce(r, bm, bn, cluster)
    with kb.role("consumer", warps=(4, cons), regs=consumer_regs) as r:
        if pt > 1:
            _consume_tiles(r, bn)
        else:
            _consume(r, d, bn, red, copies, lv, sb, sorted_sums)
    return kb.build()


def _grid_x(cluster: int, pt: int) -> str:
    if cluster > 1:
        return "cdiv(N, BM * 2) * 2"
    return "cdiv(N, BM * PT)" if pt > 1 else "cdiv(N, BM)"


def _declare_handoff(kb, bm: int, cons: int) -> None:
    """Two slots of a tile's assignments (written by the consumers, read by the scatter warps) and their
    mbarriers: `asg_full` counts the consumer warps, `asg_empty` the scatter warps."""
    kb.buffer("sa", "smem", "i32", [bm, 1], stages=2)
    kb.buffer("si", "reg", "i32", [16, 1], layout="mma_rows", scope="warp", role="producer")
    kb.mbarrier("asg_full", arrivals=cons, count=2)
    kb.mbarrier("asg_empty", arrivals=SCATTER_WARPS, count=2)
    with kb.prologue.if_("tid == 0"):
        for i in range(2):
            kb.prologue.mbar_init(bar("asg_full", i), cons)
            kb.prologue.mbar_init(bar("asg_empty", i), SCATTER_WARPS)
    kb.prologue.fence("mbarrier_init")
    kb.prologue.sync("syncthreads")


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


def _consume(r, d: int, bn: int, red: int, copies: int, lv: bool = False, sb: int = 1,
             sorted_sums: bool = False) -> None:
    """Per centroid tile: the distances' wgmma chains over the NCH atoms, then the running argmin; at the
    end the assignments and the scatter of the points into the sums."""
    r.let("b", "bid.y")
    r.let("n0", "bid.x * BM")
    r.let("wm0", "role_warp * 16")
    _assign_tile(r, bn, "t")
    _scatter_points_global(r, d, red, copies, lv, sb, sorted_sums)


def _assign_tile(r, bn: int, tt: str) -> None:
    """The point tile's assignments: the running argmin over every centroid tile (tt: the CTA's centroid-tile
    counter, see `_centroid_tile`), merged across the quad and stored to A."""
    r.fill("bv", BIG)
    r.fill("bi", -1)
    with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
        _centroid_tile(r, bn, tt)
    r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
    r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")


def _centroid_tile(r, bn: int, tt: str) -> None:
    """Centroid tile t (the CTA's tt-th: ring steps and norm slots count across point tiles): its norms, the
    wgmma chains over the NCH atoms, the running argmin."""
    g = f"{_par(tt)} * NCH + a"
    r.copy("cp_async", tile("CN", [0, "b * K + t * BN"], [1, bn]), tile("cn", slot=f"{_par(tt)} % {NORM_SLOTS}"),
           oob="zfill", vec_bytes=4, id="load_norms")
    r.sync("cp_async_commit")
    with r.for_("a", 0, "NCH", id="atom_loop"):
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
          col="t * BN", limit="K", scale=-2.0,
          col_bias=tile("cn", [0, 0], [1, bn], slot=f"{_par(tt)} % {NORM_SLOTS}"))


def _par(e: str) -> str:
    return e if e.isidentifier() else f"({e})"


def _produce_tiles(r, bm: int, bn: int) -> None:
    """pt > 1: `_produce` over the CTA's PT point tiles, ring steps numbered across them."""
    r.let("b", "bid.y")
    with r.if_("role_warp == 0 && elect_one()"):
        with r.for_("p", 0, "PT", id="point_tiles"):
            r.let("n0", "(bid.x * PT + p) * BM")
            with r.for_("g", 0, "cdiv(K, BN) * NCH", id="load_loop"):
                gs = "(p * cdiv(K, BN) * NCH + g)"
                r.pipe("acquire", "ring", gs)
                r.copy("tma_load", tile("X", ["b * N + n0", "(g % NCH) * DC"], [bm, ATOM]),
                       tile("sX", slot=f"{gs} % NS"), barrier=bar("ring_full", f"{gs} % NS"), scope="thread",
                       id="tma_points")
                r.copy("tma_load", tile("C", ["b * K + (g / NCH) * BN", "(g % NCH) * DC"], [bn, ATOM]),
                       tile("sC", slot=f"{gs} % NS"), barrier=bar("ring_full", f"{gs} % NS"), scope="thread",
                       id="tma_centroids")
                r.pipe("commit", "ring", gs)


def _consume_tiles(r, bn: int) -> None:
    """pt > 1: per point tile p the centroid tiles as in `_consume`, then the assignments to global memory and
    to assignment slot p % 2 (once the scatter of tile p - 2 has left it), handed to the scatter warps."""
    r.let("b", "bid.y")
    r.let("wm0", "role_warp * 16")
    with r.for_("p", 0, "PT", id="point_tiles"):
        r.let("n0", "(bid.x * PT + p) * BM")
        _assign_tile(r, bn, "p * cdiv(K, BN) + t")
        with r.if_("p >= 2"):
            r.mbar_wait(bar("asg_empty", "p % 2"), "(p / 2 - 1) % 2")
        r.sts(tile("bi"), tile("sa", ["wm0", 0], [16, 1], slot="p % 2"), vec_bytes=4, id="hand_assign")
        r.sync("syncwarp")
        with r.if_("lane == 0"):
            r.mbar_arrive(bar("asg_full", "p % 2"))


def _scatter_behind(r, d: int, red: int, copies: int, lv: bool, sb: int) -> None:
    """pt > 1, the producer warpgroup's warps 1-3: per point tile p, once its assignments are in slot p % 2,
    the scatter of its 16-row groups (warp w: groups w - 1, w + 2, ...) from global memory, then the slot
    released."""
    w = slice_of(red) * sb
    with r.if_("role_warp > 0"):
        with r.for_("p", 0, "PT", id="scatter_tiles"):
            r.let("n0", "(bid.x * PT + p) * BM")
            r.mbar_wait(bar("asg_full", "p % 2"), "(p / 2) % 2")
            with r.for_("grp", 0, "BM / 16", id="scatter_groups"):
                with r.if_(f"grp % {SCATTER_WARPS} == role_warp - 1"):
                    _scatter_group(r, d, w, red, copies, lv)
            r.sync("syncwarp")
            with r.if_("lane == 0"):
                r.mbar_arrive(bar("asg_empty", "p % 2"))


def _scatter_group(r, d: int, w: int, red: int, copies: int, lv: bool) -> None:
    """Rows [16 grp, 16 grp + 16) of point tile p: their assignments from slot p % 2, WS[a_j] += X[j] (rows
    read from global memory), WC[a_j] += 1 (rows past N skipped)."""
    r.let("r0", "n0 + grp * 16")
    r.lds(tile("sa", ["grp * 16", 0], [16, 1], slot="p % 2"), tile("si"), vec_bytes=4, id="take_assign")
    # unrolled to about SCATTER_UNROLL 16-dim slices a step; the reds (asm with a memory clobber) still keep a
    # slice's loads behind the previous slice's reds: sb is what puts several groups' loads in flight
    with r.for_("sc", 0, d // w, unroll=max(1, SCATTER_UNROLL * slice_of(4) // w), id="scatter_slices"):
        r.add("scatter_add", id="sum_points", index=tile("si"), src=tile("X", ["b * N + r0", f"sc * {w}"], [16, w]),
              dst=tile("WS", [sums_row(copies), f"sc * {w}"], [K_MAX, w]), row0="r0", row_limit="N", vec=red,
              load_vec=lv)
    count_points(r, "si", copies, "r0")
