"""One Lloyd iteration with the assignment on Hopper's warpgroup MMA (sm_90a).

The mma.sync kernels (programs.py) spend most of a K = 256 iteration issuing the assignment: per 16
points and 8 centroids a k16 HMMA, plus the ldmatrix of every centroid fragment (32 HMMA per point at
K = 256, D = 128: about flashlib's time, the profile: 70% of the cycles no eligible warp).
Here a warpgroup scores its 64 points against BN centroids with one wgmma chain per centroid tile,
both operands read from shared memory by the tensor cores, and the argmin is `topk` k = 1 over the
`wgmma_acc` tile (each warp its 16 points). The update is the tensor-core one-hot product of
programs._update_mma, reading the points from the same swizzled tile.

X and C tiles are stored as D / 64 swizzle atoms (128-byte rows, what wgmma reads K-major): atom a of a
[rows, D] tile holds its columns [64 a, 64 a + 64) at rows [a * rows, (a + 1) * rows). Centroid norms
are summed atom by atom (`reduce ... accumulate`) once per CTA.

resident=True (kmax <= 128, or 256 with sums "regs"): the batch's centroids are loaded once per CTA and
the point tiles are double-buffered; resident=False: centroid tiles of BN stream past each point tile
(2-stage ring), for K up to 256 where the smem sums leave no room for resident centroids.

sums="regs": each warp holds its blocks of the sums in registers from the first point tile to the flush
(programs._update_held): no per-tile load / store of the sums (K x d x 8 bytes of shared-memory traffic
per tile) and no smem sums at all (red_add from the accumulators), which makes room for K = 256 resident.
sums="wgmma": the same sums in wgmma accumulators, the one-hot product on wgmma too (`update_wgmma`: A =
the one-hot from registers, B = the points read MN-major from the swizzled X tile).
"""
from cake_ir.builder import KernelBuilder, tile
from tasks.base import signature_defaults

from . import programs
from .programs import (BIG, UPDATE_DN, _declare_finish, _declare_io, _declare_registers, _declare_update,
                       _flush_and_finish, _update, _zero_partials, point_loop_prefetched)

ATOM = 64   # f16 elements per 128-byte swizzle row


def kmeans_wgmma(kmax: int = 256, d: int = 128, bm: int = 64, bn: int = 128, ctas: int = 132, rows: int = 8,
                 urows: int = 16, resident: bool = False, xstages: int = 1, sums: str = "smem", update_n: int = 64,
                 astages: int = 1, chains: int = 1, aunroll: bool = False, arch: str = "sm_90a"):
    """Fused Lloyd iteration for K <= kmax: wgmma assignment (64 points per warpgroup, bm / 64
    warpgroups), tensor-core one-hot update (`urows` clusters per accumulator block), smem sums
    flushed once per CTA, the last CTA of a batch finishes (programs.kmeans_fused). xstages 2 (streamed
    form): the next point tile loads during this one's last centroid tile (programs.kmeans_fused).
    sums "regs": each warp keeps its blocks of the sums in registers for the whole kernel
    (programs._update_held; K x d x 4 / threads bytes per thread: kmax 256 needs bm 128), stored to the
    smem sums once, for the flush; "smem": loaded and stored per point tile (programs._update_mma);
    "wgmma": held in wgmma accumulators, the one-hot product on wgmma (`update_wgmma`), `update_n` dims
    (one or both swizzle atoms of X) per instruction. astages 2 (resident form): two distance accumulators,
    centroid tile t + 1's wgmma in flight while tile t's argmin runs (`assign_pipelined`); with aunroll, all
    KMAX / BN tiles in one static sequence, each tile's argmin under the next tile's wgmma (`assign_static`).
    chains: the argmin's independent running bests per row (topk `chains`: its compare-select chain that many
    times shorter)."""
    if arch != "sm_90a":
        raise ValueError("kmeans_wgmma needs sm_90a (wgmma)")
    if d != 128:
        raise ValueError("the finishing pass is written for D = 128")
    if bm % 64 or bn % 16 or not 16 <= bn <= 256 or kmax % bn:
        raise ValueError(f"bm must be a multiple of 64, bn a multiple of 16 up to 256 dividing kmax "
                         f"(got bm={bm}, bn={bn}, kmax={kmax})")
    if xstages not in (1, 2) or (xstages == 2 and resident):
        raise ValueError("xstages 2 is for the streamed form (the resident one double-buffers its points)")
    if resident and kmax > 128 and sums == "smem":
        raise ValueError("resident centroids fit for kmax <= 128 (the smem sums take the rest; sums 'regs' frees them)")
    if sums not in ("smem", "regs", "wgmma"):
        raise ValueError(f"sums is 'smem', 'regs' or 'wgmma', not {sums!r}")
    if update_n not in (64, 128) or (update_n != 64 and sums != "wgmma"):
        raise ValueError(f"update_n (the wgmma update's N) is 64 or 128, with sums 'wgmma' (got {update_n})")
    if astages not in (1, 2) or (astages == 2 and (not resident or (kmax // bn) % 2)):
        raise ValueError(f"astages (distance accumulators in flight) is 1 or 2; 2 is for the resident form with an "
                         f"even number of centroid tiles (kmax / bn; got astages={astages}, kmax={kmax}, bn={bn})")
    if aunroll and astages != 2:
        raise ValueError("aunroll (every centroid tile in one static sequence) pipelines two accumulators: astages 2")
    if sums == "wgmma":
        wgmma_held_blocks(kmax, bm)       # raises where the blocks do not deal evenly or fit the registers
    assert UPDATE_DN == ATOM, "the update's X blocks are whole swizzle atoms"
    warps = bm // 16
    threads = 32 * warps
    atoms = d // ATOM
    crow = kmax if resident else bn            # rows of one centroid atom in sC
    # (astages 2 / chains drop "_d128" from the name: D is always 128 here and names stop at 48 characters)
    short = astages == 2 or chains > 1
    kb = KernelBuilder(f"kmeans_{'resident' if resident else 'fused'}_k{kmax}{'' if short else f'_d{d}'}"
                       f"_{bm}x{bn}_wg_mma{urows}"
                       + ("_x2" if xstages == 2 else "") + {"smem": "", "regs": "_rs", "wgmma": "_rw"}[sums]
                       + ("128" if update_n == 128 else "") + ("_a2" if astages == 2 else "") + ("u" if aunroll else "")
                       + (f"_c{chains}" if chains > 1 else ""),
                       arch=arch, grid=["min(P, cdiv(N, BM))", "B"], threads=threads,
                       note="one Lloyd iteration: wgmma argmin assignment + tensor-core one-hot update"
                            + (", resident centroids" if resident else ", streamed centroid tiles"))
    kb.const(BM=bm, BN=bn, D=d, KMAX=kmax, P=ctas, RB=rows)
    levels = [("m", rows, "RB"), ("t", 1, None)]
    _declare_io(kb, kmax)
    kb.buffer("sX", "smem", "f16", [atoms * bm, ATOM], layout="swizzle_128B",
              **({"stages": 2} if resident or xstages == 2 else {}))
    kb.buffer("sC", "smem", "f16", [atoms * crow, ATOM], layout="swizzle_128B", **({} if resident else {"stages": 2}))
    kb.buffer("cn", "smem", "f32", [kmax])
    if sums == "wgmma":
        held = declare_wgmma_sums(kb, kmax, bm, atoms, update_n // ATOM)
    else:
        _declare_update(kb, kmax, d, bm, "mma", urows=urows, held=sums == "regs")
        held = programs.declare_held_sums(kb, kmax, d, warps, urows) if sums == "regs" else 0
    kb.buffer("scnt", "smem", "f32", [kmax, 1])
    fscope = _declare_finish(kb, threads)
    _declare_registers(kb, d, bn, levels, fscope, mma="wgmma")
    if astages == 2:
        kb.buffer("acc1", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")

    def load_c(r, row0: str, n: int, dst_row0: str, slot):
        for a in range(atoms):
            r.copy("cp_async", tile("C", [row0, a * ATOM], [n, ATOM]),
                   tile("sC", [f"{a * crow} + {dst_row0}", 0], [n, ATOM], slot=slot), oob="zfill")

    def load_x(r, row0: str, slot, id=None):
        for a in range(atoms):
            r.copy("cp_async", tile("X", [row0, a * ATOM], [bm, ATOM]), tile("sX", [a * bm, 0], [bm, ATOM], slot=slot),
                   oob="zfill", id=id if a == 0 else None)

    def norms(r, row0: str, slot):
        """cn[row0 .. row0 + n) = squared norms of the staged centroid rows, atom by atom."""
        n = kmax if resident else bn
        for a in range(atoms):
            r.reduce("sum_sq", tile("sC", [a * crow, 0], [n, ATOM], slot=slot), tile("cn", [row0], [n]),
                     accumulate=a > 0, id="centroid_norms" if a == 0 else None)

    def distances(r, xslot, cslot, t: str, acc: str = "acc", id="distances"):
        """acc = X tile . C tile t (this warpgroup's 64 points), uncommitted."""
        r.sync("wgmma_fence")
        for a in range(atoms):
            r.wgmma([64, bn, 16], tile("sX", [f"{a * bm} + 64 * wg", 0], [64, ATOM], slot=xslot),
                    tile("sC", [f"{a * crow} + " + (f"{t} * BN" if resident else "0"), 0], [bn, ATOM], slot=cslot),
                    tile(acc), accumulate=a > 0, id=id if a == 0 else None)

    def argmin(r, t: str, acc: str = "acc", id="argmin"):
        # rows of C beyond K (the next batch's centroids or zero fill) are skipped by limit
        r.add("topk", id=id, kind="min", k=1, src=tile(acc), vals=tile("bv"), idx=tile("bi"),
              col=f"{t} * BN", limit="K", scale=-2.0, col_bias=tile("cn", [f"{t} * BN"], [bn]),
              **({"chains": chains} if chains > 1 else {}))

    def assign(r, xslot, cslot, t: str):
        """acc = X tile . C tile t, then the running argmin."""
        distances(r, xslot, cslot, t)
        r.sync("wgmma_commit")
        r.sync("wgmma_wait", n=0)
        argmin(r, t)

    def assign_pipelined(r, xslot):
        """The resident centroid loop over pairs of tiles on two accumulators: tile 2u + 1's wgmma runs on the
        tensor cores while tile 2u's argmin runs on the ALUs. Both tiles are always issued (KMAX / BN is even,
        so tile 2u + 1 is in sC; past K the argmin's limit skips its columns): a conditional wgmma, or one
        issued across the loop's back edge, makes ptxas serialize every wgmma (C7514)."""
        with r.for_("u", 0, "cdiv(K, 2 * BN)", id="centroid_pairs"):
            distances(r, xslot, None, "(2 * u)")
            r.sync("wgmma_commit")
            distances(r, xslot, None, "(2 * u + 1)", acc="acc1", id="distances_odd")
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1)
            argmin(r, "(2 * u)")
            r.sync("wgmma_wait", n=0)
            argmin(r, "(2 * u + 1)", acc="acc1", id="argmin_odd")

    def assign_static(r, xslot):
        """Every one of the KMAX / BN centroid tiles in one static sequence on two accumulators: tile t + 1's
        wgmma is issued before tile t's argmin, so each argmin but the last runs under a wgmma. No loop and no
        condition (ptxas keeps the wgmma pipelined: C7514 serializes a conditional or back-edge issue); tiles
        past K are computed and skipped by the argmin's limit (the variant is for K near KMAX)."""
        nt = kmax // bn
        accs = ("acc", "acc1")
        distances(r, xslot, None, "0", acc=accs[0])
        r.sync("wgmma_commit")
        for t in range(nt):
            if t + 1 < nt:
                distances(r, xslot, None, str(t + 1), acc=accs[(t + 1) % 2], id=f"distances_{t + 1}")
                r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1 if t + 1 < nt else 0)
            argmin(r, str(t), acc=accs[t % 2], id="argmin" if t == 0 else f"argmin_{t}")

    def x_block(slot):
        # the update's [16 points, 64 dims] block: dims [uc, uc + 64) are atom uc / 64
        return lambda p: tile("sX", [f"(uc / {ATOM}) * BM + {p * 16}", 0], [16, ATOM], slot=slot)

    def update(slot):
        if sums == "wgmma":
            update_wgmma(r, bm, atoms, held, slot, update_n // ATOM)
        else:
            _update(r, "mma", bm, d, warps, tile("ssum"), slot=slot, urows=urows, x_block=x_block(slot), held=held)

    def flush(r):
        if sums == "wgmma":
            flush_wgmma_sums(r, bm, atoms, held, update_n // ATOM)
        else:
            programs.flush_held_sums(r, urows, held)

    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("wm0", "role_warp * 16")
        _zero_partials(r, d, threads, None if held else "KMAX / 8")
        if held and sums == "wgmma":
            zero_wgmma_sums(r, bm, atoms, held, update_n // ATOM)
        elif held:
            programs.zero_held_sums(r, d, warps, urows, held)
        if resident:
            # rows of C beyond K (the next batch's centroids or zero fill) are never chosen: topk's limit
            load_c(r, "b * K", kmax, "0", None)
            r.let("ntile", "cdiv(cdiv(N, BM) - bid.x, nbid.x)")
            load_x(r, "b * N + bid.x * BM", 0, id="load_first_points")
            r.sync("cp_async_commit")
            r.sync("cp_async_wait", n=0)
            r.sync("syncthreads")
            norms(r, "0", None)
            with r.for_("it", 0, "ntile", id="point_tiles"):
                r.let("n0", "(bid.x + it * nbid.x) * BM")
                r.sync("cp_async_wait", n=0)     # tile it has landed (this thread's copies) ...
                r.fence("proxy_async")           # ... visible to the tensor cores' async proxy
                r.sync("syncthreads")            # every thread's copies; every warp done with tile it - 1
                with r.if_("it + 1 < ntile"):
                    load_x(r, "b * N + n0 + nbid.x * BM", "(it + 1) % 2", id="prefetch_points")
                r.sync("cp_async_commit")
                r.fill("bv", BIG)
                r.fill("bi", -1)
                if aunroll:
                    assign_static(r, "it % 2")
                elif astages == 2:
                    assign_pipelined(r, "it % 2")
                else:
                    with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
                        assign(r, "it % 2", None, "t")
                r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
                r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
                update("it % 2")
        else:
            with r.for_("t0", 0, "cdiv(K, BN)", id="centroid_norms_once"):
                r.sync("syncthreads")   # the previous tile's norm readers are done with slot 0
                load_c(r, "b * K + t0 * BN", bn, "0", 0)
                r.sync("cp_async_commit")
                r.sync("cp_async_wait", n=0)
                r.sync("syncthreads")
                norms(r, "t0 * BN", 0)
            if xstages == 2:
                point_loop_prefetched(
                    r, lambda row, slot, id=None: load_x(r, row, slot, id=id), lambda row, slot: load_c(r, row, bn, "0", slot),
                    lambda t, xslot, cslot: assign(r, xslot, cslot, t),
                    update,
                    fence=True)
                flush(r)
                _flush_and_finish(r, kmax, d, 0 if held else 1, levels, fscope)
                return kb.build()
            with r.for_("it", 0, "cdiv(cdiv(N, BM) - bid.x, nbid.x)", id="point_tiles"):
                r.let("n0", "(bid.x + it * nbid.x) * BM")
                r.sync("syncthreads")   # the previous tile's readers of sX / sC are done
                load_x(r, "b * N + n0", None, id="load_points")
                load_c(r, "b * K", bn, "0", 0)
                r.sync("cp_async_commit")
                r.fill("bv", BIG)
                r.fill("bi", -1)
                with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
                    r.sync("cp_async_wait", n=0)
                    r.fence("proxy_async")
                    r.sync("syncthreads")
                    with r.if_("t + 1 < cdiv(K, BN)"):
                        load_c(r, "b * K + (t + 1) * BN", bn, "0", "(t + 1) % 2")
                    r.sync("cp_async_commit")
                    assign(r, None, "t % 2", "t")
                r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
                r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
                update(None)
        flush(r)
        _flush_and_finish(r, kmax, d, 0 if held else 1, levels, fscope)
    return kb.build()


def wgmma_held_blocks(kmax: int, bm: int) -> int:
    """sums "wgmma": the 64-cluster blocks each of the bm / 64 warpgroups holds, each 64 accumulator registers
    per thread over D = 128; at most 128 registers."""
    wgs = bm // 64
    if kmax % (64 * wgs) or kmax // wgs > programs.HELD_REGS:
        raise ValueError(f"sums 'wgmma' deals 64-cluster blocks evenly over the {wgs} warpgroups, at most "
                         f"{programs.HELD_REGS} accumulator registers per thread (kmax / warpgroups <= "
                         f"{programs.HELD_REGS}; got kmax={kmax}, bm={bm})")
    return kmax // 64 // wgs


# Which clusters the held accumulators sum: warpgroup g holds the 64 H clusters from 64 H g (H = held blocks), and
# row 16 w + r of its block j (warp w's rows of the wgmma accumulator) is cluster 64 H g + 16 H w + 16 j + r. So a
# warp's rows of all H blocks are 16 H consecutive clusters: one one-hot fragment [16 H, 16] per warp and 16-point
# step (row tile j the A operand of block j), its targets read and converted once for every block.
def _warp_clusters(held: int) -> str:
    """The first cluster of the calling warp's rows (its row tile 0)."""
    return f"{64 * held} * wg + {16 * held} * (role_warp % 4)"


def _block_first(held: int, j: int) -> str:
    """The least cluster block j of the calling warpgroup sums (warp 0, row 0): the block is skipped past K."""
    return f"{64 * held} * wg + {16 * j}"


def declare_wgmma_sums(kb, kmax: int, bm: int, atoms: int, span: int = 1) -> int:
    """sums "wgmma": warpgroup g holds `held` 64-row blocks of the sums (the clusters of _warp_clusters), one
    wgmma_acc [64, 64 span] per block and `span` swizzle atoms of dims (S{j}_{c}); the one-hot A fragments
    oh_{parity} [16 held, 16] (each warp its 16 held clusters x 16 points), double-buffered over the 16-point
    steps; the tile's targets."""
    held = wgmma_held_blocks(kmax, bm)
    kb.buffer("sidx", "smem", "i32", [bm, 1])
    for par in (0, 1):
        kb.buffer(f"oh_{par}", "reg", "f16", [16 * held, 16], layout="mma_a", scope="warp")
    for j in range(held):
        for c in range(atoms // span):
            kb.buffer(f"S{j}_{c}", "reg", "f32", [64, ATOM * span], layout="wgmma_acc", scope="warpgroup")
    return held


def zero_wgmma_sums(r, bm: int, atoms: int, held: int, span: int = 1) -> None:
    r.let("uw", _warp_clusters(held))
    for j in range(held):
        r.let(f"ur{j}", _block_first(held, j))
        for c in range(atoms // span):
            r.fill(f"S{j}_{c}", 0.0)


def update_wgmma(r, bm: int, atoms: int, held: int, slot, span: int = 1) -> None:
    """sums[c, :] += X[j, :] for the tile's points j of cluster c on wgmma: per 16 points, A = the one-hot
    [16 held clusters, 16 points] each warp builds in registers (row tile j: block j's rows), B = the points' X
    rows read MN-major from the swizzled tile (dims contiguous; `span` 2: both atoms in one m64n128k16, the
    second BM rows after the first), into the warpgroup's held accumulators. The fragment of step p is
    rewritten at step p + 2, after wgmma_wait 1 has retired step p. Rows past K stay zero (no target is
    >= K); a block wholly past K is skipped."""
    r.sts(tile("bi"), tile("sidx", ["wm0", 0], [16, 1]), vec_bytes=4, id="stage_targets")
    r.sync("syncthreads")   # every warp reads every warp's targets

    def steps(limit, tag: str):
        for p in range(bm // 16):
            par = p % 2
            r.add("onehot", index=tile("sidx", [p * 16, 0], [16, 1]), dst=tile(f"oh_{par}"), row0="uw",
                  col0=f"n0 + {p * 16}", **({"limit": limit} if limit else {}), id=f"onehot{tag}" if p == 0 else None)
            r.sync("wgmma_fence")
            for j in range(held):
                with r.if_(f"ur{j} < K"):
                    for c in range(atoms // span):
                        r.wgmma([64, ATOM * span, 16], tile(f"oh_{par}", [16 * j, 0], [16, 16]),
                                tile("sX", [f"{c * span} * BM + {p * 16}", 0], [16, ATOM], slot=slot), tile(f"S{j}_{c}"),
                                accumulate=True, b_major="mn", b_atom_rows=bm if span > 1 else None,
                                id=f"sums_wgmma{tag}" if p == j == c == 0 else None)
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1)
    # a whole tile of points (all but a batch's last): the one-hot fragments without a per-point test of N (~8
    # instructions per fragment; as a test inside each onehot, a branch per fragment, it cost the mma.sync updates
    # 10%)
    with r.if_("n0 + BM <= N", id="whole_tile"):
        steps(None, "")
    with r.else_():
        steps("N", "_tail")
    r.sync("wgmma_wait", n=0)    # the tile's sX slot is reloaded after the next barrier
    r.add("scatter_add", id="count_points", index=tile("bi"), dst=tile("scnt"), row0="n0 + wm0", row_limit="N")


def flush_wgmma_sums(r, bm: int, atoms: int, held: int, span: int = 1) -> None:
    """Each lane adds its accumulator rows to their clusters' sums: row 16 w + r of block j is cluster
    ur{j} + 16 (held - 1) w + (16 w + r) (_warp_clusters)."""
    for j in range(held):
        first = f"ur{j} + {16 * (held - 1)} * (role_warp % 4)"     # the cluster of the warp's accumulator row 0
        with r.if_(f"ur{j} < K"):
            for c in range(atoms // span):
                r.add("red_add", id="flush_held_sums" if j == c == 0 else None, src=tile(f"S{j}_{c}"),
                      dst=tile("WS", [f"b * K + {first}", c * span * ATOM], [64, span * ATOM]),
                      row_limit=f"K - ({first})")


def _held_fits(p: dict) -> bool:
    """sums "regs" deals its blocks evenly over the warps within the register budget (programs.held_blocks);
    "wgmma" its 64-cluster blocks over the warpgroups (wgmma_held_blocks)."""
    try:
        if p.get("sums") == "wgmma":
            wgmma_held_blocks(p["kmax"], p["bm"])
        else:
            programs.held_blocks(p["kmax"], 128, p["bm"] // 16, p.get("urows", 16))
        return True
    except ValueError:
        return False


# the agent's seed and family (tasks/<task>/programs.py SEEDS / FAMILIES)
programs.SEEDS["kmeans_wgmma_sm90a"] = lambda: kmeans_wgmma()
programs.FAMILIES["kmeans_wgmma_sm90a"] = {
    "make": kmeans_wgmma,
    "defaults": signature_defaults(kmeans_wgmma),
    "space": {"kmax": [128, 256], "bm": [64, 128], "bn": [64, 128, 256], "ctas": [66, 132, 264], "urows": [16, 32],
              "resident": [False, True], "xstages": [1, 2], "sums": ["smem", "regs", "wgmma"], "update_n": [64, 128],
              "astages": [1, 2], "aunroll": [False, True], "chains": [1, 2, 4]},
    # resident centroids fit for kmax <= 128 (256 with the sums in registers); a centroid tile divides kmax;
    # wgmma tiles of 64 points; the prefetched point tile is for the streamed form; held sums fit the registers
    "check": lambda p: p["bm"] % 64 == 0 and p["kmax"] % p["bn"] == 0
    and (not p["resident"] or p["kmax"] <= 128 or p.get("sums", "smem") != "smem")
    and (p.get("xstages", 1) == 1 or not p["resident"]) and (p.get("sums", "smem") == "smem" or _held_fits(p))
    and (p.get("update_n", 64) == 64 or p.get("sums") == "wgmma")
    and (p.get("astages", 1) == 1 or (p["resident"] and p["kmax"] // p["bn"] % 2 == 0))
    and (not p.get("aunroll") or p.get("astages", 1) == 2),
    "tactics": {"retile": ["bm", "bn"], "update_mechanism": ["sums", "urows"]},
}
