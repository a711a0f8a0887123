"""The wide k-means assignment with its point tile resident and consumer warpgroups taking turns on the
tensor cores (ping-pong), for D up to 512 on Hopper.

In the resident form (`tasks.kmeans.wide.kmeans_wide_assign_wgmma`) every warpgroup of a CTA meets the others
at a barrier per 64-dim step, so each centroid tile's argmin runs with no wgmma in flight: at D = 128 the
argmin of a [64, 128] accumulator costs about half as many issue slots as its chain takes on the tensor cores.
Here a TMA producer warp loads the CTA's points once (D / 64 swizzle atoms of `bm` rows) and then streams the
centroid atoms through an mbarrier ring; consumer warpgroup w of `wgs` owns `wr` point rows (wr / 64
accumulators of [64, bn]) and issues its chains for tile t only in its turn: warpgroup 0 issues tile t, lets
warpgroup 1 issue tile t, and runs tile t's argmin while the others' chains run, and so on in a cycle (a named
barrier per warpgroup's turn). A ring slot is freed once every warpgroup's chains on it retired, so the ring must hold a whole tile (stages
>= D / 64) and overlaps the turns only from two tiles (2 D / 64) on. Each warpgroup loads its own tile's centroid
norms by cp.async into its own pair of slots (waited on its own named barrier), so the two never meet after
the start. Tensors and the finalize are `tasks.kmeans.wide`'s.
"""
from cake_ir.builder import KernelBuilder, bar, tile

from .wide import (ATOM, BIG, K_MAX, SMEM_BYTES, _declare_assign_io, check_copies, check_d, check_red, padded,
                   slice_of, suffix, sums_row)

PP_D_MAX = 512          # the resident tile of all of D leaves no ring for more
NORM_SLOTS = 2          # per warpgroup: tile t's norms land while tile t - 1's argmin may still read its slot
WGS = (2, 3, 4)         # consumer warpgroups taking turns
PRODUCER_REGS = 40


def pingpong_smem_bytes(d: int, wr: int, bn: int, stages: int, wgs: int = 2) -> int:
    """The resident points (wgs wr rows by all of D in 64-dim atoms), the centroid ring (one [bn, 64] atom a
    stage), every warpgroup's norm slots, and 1 KB of alignment for the swizzled atoms (the mbarriers fit in it)."""
    return wgs * wr * padded(d, ATOM) * 2 + stages * bn * ATOM * 2 + wgs * NORM_SLOTS * 4 * bn + 1024


def consumer_regs(wgs: int) -> int:
    """Registers a consumer thread may take (setmaxnreg, a multiple of 8): the block's allocation at launch
    (its threads at 64K / threads, rounded down to 8) less the producer warpgroup's, shared by wgs warpgroups,
    at most 232."""
    threads = 128 * (1 + wgs)
    pool = threads * (65536 // threads // 8 * 8)
    return min(232, (pool - 128 * PRODUCER_REGS) // (128 * wgs) // 8 * 8)


def consumer_regs_needed(d: int, wr: int, bn: int, a_regs: bool = False) -> int:
    """A consumer thread's registers, estimated: its warpgroup's accumulators (wr x bn / 128), with a_regs the
    A fragments of its wr / 64 blocks (D / 4 each), and ~40 for indices, bests and addresses."""
    return wr * bn // 128 + (wr // 64 * padded(d, ATOM) // 4 if a_regs else 0) + 40


def _check(d: int, wr: int, bn: int, stages: int, wgs: int, arch: str, a_regs: bool = False) -> None:
    if arch != "sm_90a":
        raise ValueError("kmeans_wide_assign_pingpong needs sm_90a (TMA, wgmma)")
    if d > PP_D_MAX:
        raise ValueError(f"kmeans_wide_assign_pingpong: D <= {PP_D_MAX} (the resident point tile), got {d}")
    if wr not in (64, 128) or bn % 16 or not 16 <= bn <= 256 or not 2 <= stages <= 16:
        raise ValueError(f"kmeans_wide_assign_pingpong: wr 64 or 128, bn a multiple of 16 up to 256, stages 2..16 "
                         f"(got wr={wr}, bn={bn}, stages={stages})")
    if wgs not in WGS or consumer_regs_needed(d, wr, bn, a_regs) > consumer_regs(wgs):
        raise ValueError(f"kmeans_wide_assign_pingpong: wgs in {WGS}, and a consumer thread's registers (accumulators "
                         f"wr x bn / 128 = {wr * bn // 128}, A fragments {'wr D / 256' if a_regs else '0'}, ~40 more: "
                         f"{consumer_regs_needed(d, wr, bn, a_regs)}) within {consumer_regs(wgs)} "
                         f"(got wgs={wgs}, wr={wr}, bn={bn}, a_regs={a_regs})")
    if stages < padded(d, ATOM) // ATOM:
        raise ValueError(f"kmeans_wide_assign_pingpong: stages >= D / 64 = {padded(d, ATOM) // ATOM} (a warpgroup "
                         f"issues a whole tile in its turn: a smaller ring deadlocks), got {stages}")
    smem = pingpong_smem_bytes(d, wr, bn, stages, wgs)
    if smem > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_pingpong: {smem} B of shared memory at d={d}, wr={wr}, bn={bn}, "
                         f"stages={stages}, wgs={wgs} exceed sm_90a's {SMEM_BYTES['sm_90a']}")


def kmeans_wide_assign_pingpong(d: int = 128, wr: int = 128, bn: int = 128, stages: int = 8, red: int = 4,
                                arch: str = "sm_90a", copies: int = 1, lv: bool = False, wgs: int = 2, pt: int = 1,
                                handoff: str = "issued", a_regs: bool = False):
    """Assignment + global scatter, grid (cdiv(N, BM PT), B) with BM = wgs wr: a producer warpgroup (one elected
    thread issues the TMA loads) and wgs consumer warpgroups of wr point rows each, taking turns, over pt point
    tiles a CTA (pt > 1: one tile's last argmin and scatter run while the next one's points load); handoff: when
    a warpgroup passes the turn (`_issue_tile`); a_regs: each warp's points held in registers as wgmma A
    fragments (loaded once per point tile by ldmatrix), so a chain reads only the centroids from shared memory.
    red, copies, lv: as in `tasks.kmeans.wide.kmeans_wide_assign`."""
    if pt not in (1, 2, 4, 8) or handoff not in HANDOFFS:
        raise ValueError(f"kmeans_wide_assign_pingpong: pt (point tiles a CTA) 1, 2, 4 or 8, handoff one of {HANDOFFS} "
                         f"(got pt={pt}, handoff={handoff!r})")
    check_d(d)
    check_red(red, arch, lv)
    check_copies(copies)
    _check(d, wr, bn, stages, wgs, arch, a_regs)
    bm, atoms, blocks = wgs * wr, padded(d, ATOM) // ATOM, wr // 64
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_s{stages}_pp" + (f"{wgs}" if wgs != 2 else "")
                       + (f"_t{pt}" if pt > 1 else "") + ("" if handoff == "issued" else f"_h{handoff[0]}")
                       + ("_ra" if a_regs else "")
                       + suffix(red, copies, lv), arch=arch,
                       grid=["cdiv(N, BM * PT)", "B"], threads=128 + 128 * wgs,
                       note="wide k-means assignment: resident points, TMA centroid ring, ping-pong wgmma consumers")
    kb.const(BM=bm, BN=bn, D=d, DC=ATOM, NCH=atoms, NS=stages, PT=pt)
    _declare_assign_io(kb, d, copies, tma={"X": {"box": [bm, ATOM], "swizzle": "128B"},
                                           "C": {"box": [bn, ATOM], "swizzle": "128B"}})
    kb.buffer("sX", "smem", "f16", [atoms * bm, ATOM], layout="swizzle_128B")
    kb.buffer("sC", "smem", "f16", [bn, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("cn", "smem", "f32", [1, bn], stages=wgs * NORM_SLOTS)
    for h in range(blocks):
        kb.buffer(f"acc{h}", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup", role="consumer")
        kb.buffer(f"bv{h}", "reg", "f32", [16, 1], layout="mma_rows", scope="warp", role="consumer")
        kb.buffer(f"bi{h}", "reg", "i32", [16, 1], layout="mma_rows", scope="warp", role="consumer")
        if a_regs:
            kb.buffer(f"fa{h}", "reg", "f16", [16, atoms * ATOM], layout="mma_a", scope="warp", role="consumer")
    for w in range(wgs):
        kb.named_barrier(f"norms{w}", 1 + w, 128)           # warpgroup w's share of its norms has landed
        kb.named_barrier(f"turn{w}", 1 + wgs + w, 256)      # warpgroup w may issue (the one before it arrives)
    kb.pipeline("points", stages=1, mechanism="tma", producer="producer", consumers=["consumer"], buffers=["sX"])
    kb.pipeline("ring", stages=stages, mechanism="tma", producer="producer", consumers=["consumer"],
                buffers=["sC"])
    with kb.role("producer", warps=(0, 4), regs=PRODUCER_REGS) as r:
        _produce(r, bm, bn, atoms)
    with kb.role("consumer", warps=(4, 4 * wgs), regs=consumer_regs(wgs)) as r:
        _consume(r, d, wr, bn, blocks, wgs, pt, handoff, a_regs, red, copies, lv)
    return kb.build()


def _produce(r, bm: int, bn: int, atoms: int) -> None:
    """Per point tile p of the CTA: its points (atom a: dims [64 a, 64 a + 64)) once the previous tile's chains
    retired, then ring step g: centroid tile g / NCH at dims (g % NCH) * 64 (ring steps numbered across p)."""
    r.let("b", "bid.y")
    with r.if_("role_warp == 0 && elect_one()"):
        with r.for_("p", 0, "PT", id="point_tiles"):
            r.let("n0", "(bid.x * PT + p) * BM")
            r.pipe("acquire", "points", "p")
            for a in range(atoms):
                r.copy("tma_load", tile("X", ["b * N + n0", a * ATOM], [bm, ATOM]), tile("sX", [a * bm, 0], [bm, ATOM]),
                       barrier=bar("points_full", "p % 1"), scope="thread", id="tma_points" if a == 0 else None)
            r.pipe("commit", "points", "p")
            with r.for_("g", 0, "cdiv(K, BN) * NCH", id="load_loop"):
                gs = "p * cdiv(K, BN) * NCH + g"
                r.pipe("acquire", "ring", gs)
                r.copy("tma_load", tile("C", ["b * K + (g / NCH) * BN", "(g % NCH) * DC"], [bn, ATOM]),
                       tile("sC", slot=f"({gs}) % NS"), barrier=bar("ring_full", f"({gs}) % NS"), scope="thread",
                       id="tma_centroids")
                r.pipe("commit", "ring", gs)


def _by_warpgroup(r, wgs: int, op: str, name: str, step: int = 0, last_cond: str = "") -> None:
    """Warpgroup w runs `op` on barrier `{name}{(w + step) % wgs}` (a named barrier's id is static); the last
    warpgroup only where `last_cond` holds ("": always)."""
    for w in range(wgs):
        with r.if_(f"wg == {w}"):
            if w == wgs - 1 and last_cond:
                with r.if_(last_cond):
                    r.add(op, barrier=f"{name}{(w + step) % wgs}")
            else:
                r.add(op, barrier=f"{name}{(w + step) % wgs}")


HANDOFFS = ("issued", "first", "before")


def _issue_tile(r, wr: int, bn: int, atoms: int, blocks: int, wgs: int, handoff: str, a_regs: bool) -> None:
    """Warpgroup wg's chains for the CTA's tile tt (centroid tile t): per atom, wait for its ring slot and issue
    one m64 n{bn} k64 chain per accumulator block (rows wr wg + 64 h of the resident points). The next
    warpgroup's turn is passed (warpgroup 0 takes none after the last tile) once every chain is issued
    (`handoff` "issued"), once the first atom's are ("first"), or once the first slot has landed, before any
    chain ("before"): the earlier, the less the tensor cores wait for the next warpgroup to wake and issue,
    the more its chains mix with this one's."""
    def pass_turn():
        _by_warpgroup(r, wgs, "bar_arrive", "turn", step=1, last_cond="t + 1 < cdiv(K, BN)")
    for a in range(atoms):
        g = f"tt * NCH + {a}"
        r.pipe("wait", "ring", g)
        if a == 0 and handoff == "before":
            pass_turn()
        r.sync("wgmma_fence")
        for h in range(blocks):
            if a_regs:
                _chain_from_registers(r, a, h, bn, g)
                continue
            r.wgmma([64, bn, 16], tile("sX", [f"{a} * BM + {wr} * wg + {64 * h}", 0], [64, ATOM]),
                    tile("sC", [0, 0], [bn, ATOM], slot=f"({g}) % NS"), tile(f"acc{h}"), accumulate=a > 0,
                    id="distances" if a == 0 and h == 0 else None)
        r.sync("wgmma_commit")
        if (a == 0 and handoff == "first") or (a == atoms - 1 and handoff == "issued"):
            pass_turn()


def _chain_from_registers(r, a: int, h: int, bn: int, g: str) -> None:
    """Block h's chain over atom a with A from the warps' fragments: one k16 wgmma per 16 dims."""
    for kk in range(ATOM // 16):
        r.wgmma([64, bn, 16], tile(f"fa{h}", [0, a * ATOM + kk * 16], [16, 16]),
                tile("sC", [0, kk * 16], [bn, 16], slot=f"({g}) % NS"), tile(f"acc{h}"),
                accumulate=a > 0 or kk > 0, id="distances" if a == 0 and h == 0 and kk == 0 else None)


def _consume(r, d: int, wr: int, bn: int, blocks: int, wgs: int, pt: int, handoff: str, a_regs: bool, red: int,
             copies: int, lv: bool) -> None:
    """Per point tile p of the CTA: per centroid tile the norms' load, the warpgroup's turn, its chains, the next
    one's turn, then (under the others' chains) the wait, the ring slots' release and the running argmin; then
    the assignments and the scatter of the warpgroup's points into the sums (pt > 1: the points read from global
    memory, so the next tile's points load during the last argmin and the scatter)."""
    r.let("b", "bid.y")
    r.let("wq", "role_warp % 4")
    with r.for_("p", 0, "PT", id="point_tiles"):
        r.let("n0", "(bid.x * PT + p) * BM")
        for h in range(blocks):
            r.fill(f"bv{h}", BIG)
            r.fill(f"bi{h}", -1)
        r.pipe("wait", "points", "p")
        if a_regs:
            for h in range(blocks):
                for a in range(padded(d, ATOM) // ATOM):
                    r.ldmatrix(tile("sX", [f"{a} * BM + {wr} * wg + {64 * h} + 16 * wq", 0], [16, ATOM]),
                               tile(f"fa{h}", [0, a * ATOM], [16, ATOM]), id="load_fragments" if a + h == 0 else None)
        with r.if_(f"wg == {wgs - 1}"):
            r.add("bar_arrive", barrier="turn0")             # warpgroup 0 takes the first turn
        with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
            _centroid_tile(r, d, wr, bn, blocks, wgs, handoff, a_regs)
        if pt > 1:
            r.pipe("release", "points", "p")                # every chain on the points has retired
        for h in range(blocks):
            rows = f"{wr} * wg + {64 * h} + 16 * wq"
            r.add("topk_merge", kind="min", vals=tile(f"bv{h}"), idx=tile(f"bi{h}"))
            r.stg(tile(f"bi{h}"), tile("A", ["b", f"n0 + {rows}"], [1, 16]), oob="mask", vec_bytes=4,
                  id="store_assign" if h == 0 else None)
            _scatter_rows(r, d, rows, f"bi{h}", red, copies, lv, first=h == 0, from_global=pt > 1)
        if pt == 1:
            r.pipe("release", "points", "p")                # (the protocol's balance: the tile is not reloaded)


def _centroid_tile(r, d: int, wr: int, bn: int, blocks: int, wgs: int, handoff: str, a_regs: bool) -> None:
    """Centroid tile t of point tile p (the CTA's tile tt): norms, turn, chains, the next turn, wait, release,
    argmin."""
    atoms = padded(d, ATOM) // ATOM
    r.let("tt", "p * cdiv(K, BN) + t")
    slot = f"wg * {NORM_SLOTS} + tt % {NORM_SLOTS}"
    r.copy("cp_async", tile("CN", [0, "b * K + t * BN"], [1, bn]), tile("cn", slot=slot), oob="zfill",
           vec_bytes=4, scope="warpgroup", id="load_norms")
    r.sync("cp_async_commit")
    _by_warpgroup(r, wgs, "bar_sync", "turn")
    _issue_tile(r, wr, bn, atoms, blocks, wgs, handoff, a_regs)
    r.sync("wgmma_wait", n=0)                               # the argmin reads the accumulators
    for a in range(atoms):
        r.pipe("release", "ring", f"tt * NCH + {a}")
    r.sync("cp_async_wait", n=0)
    _by_warpgroup(r, wgs, "bar_sync", "norms")              # the warpgroup's share of the norms has landed
    for h in range(blocks):
        r.add("topk", id="argmin" if h == 0 else None, kind="min", k=1, src=tile(f"acc{h}"), vals=tile(f"bv{h}"),
              idx=tile(f"bi{h}"), col="t * BN", limit="K", scale=-2.0,
              col_bias=tile("cn", [0, 0], [1, bn], slot=slot))


def _scatter_rows(r, d: int, rows: str, idx: str, red: int, copies: int, lv: bool, first: bool,
                  from_global: bool = False) -> None:
    """WS[a_j] += X[j], WC[a_j] += 1 for the warp's 16 points at tile row `rows` (read from the swizzled
    resident atoms, or from global memory; rows past N skipped)."""
    w = slice_of(red)
    for a in range(padded(d, ATOM) // ATOM):
        loop = f"sc{a}"
        src = (tile("X", [f"b * N + n0 + {rows}", f"{a * ATOM} + {loop} * {w}"], [16, w]) if from_global else
               tile("sX", [f"{a} * BM + {rows}", f"{loop} * {w}"], [16, w]))
        with r.for_(loop, 0, min(ATOM, d - a * ATOM) // w, id="scatter_slices" if first and a == 0 else None):
            r.add("scatter_add", id="sum_points" if first and a == 0 else None, index=tile(idx), src=src,
                  dst=tile("WS", [sums_row(copies), f"{a * ATOM} + {loop} * {w}"], [K_MAX, w]),
                  row0=f"n0 + {rows}", row_limit="N", vec=red, load_vec=lv)
    r.add("scatter_add", id="count_points" if first else None, index=tile(idx),
          dst=tile("WC", [sums_row(copies), 0], [K_MAX, 1]), row0=f"n0 + {rows}", row_limit="N")
