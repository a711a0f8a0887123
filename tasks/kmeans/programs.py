"""Seed programs for one Lloyd iteration of k-means, fused into one kernel:

1. assignment: a tile of `bm` points stays in shared memory (its mma.sync A fragments in registers)
   while centroid tiles stream past (cp.async double buffer); scores ||c||^2 - 2 x.c (the ||x||^2
   term does not change the argmin) feed a running argmin (`topk` k = 1) in registers, so the N x K
   distance matrix is never written;
2. update: each CTA loops over several point tiles (persistent over N) and aggregates them in shared
   memory -- `update="atomic"`: `scatter_add`, one red.shared (a CAS loop for f32) per point and dim;
   `update="mma"`: a tensor-core product per tile, sums[urows clusters, 64 dims] += onehot^T X, each warp
   owning whole blocks of the sums (no atomic) -- then flushes its per-cluster partial sums and
   counts to a zeroed global workspace with one `red_add` per (cluster, dim) -- not one global atomic
   per point;
3. finish: the last CTA of each batch (`last_cta` on a grid counter) divides sums by counts (empty
   clusters keep their centroid), writes the new centroids and zeroes the workspace for the next launch.

Tensors are 2-d with the batch folded into rows: X [B*N, D], C and Cnew [B*K, D] (= [B, N, D]
contiguous). `python -m tasks.export_seeds` writes the seeds to seeds/*.json.
"""
from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, tile

BIG = 3.0e38


def _finish_rows(r, rows: int, first: str, count: str, tag: str, barrier=None) -> None:
    """Finish `count` chunks of `rows` centroids starting at centroid `first` (within the batch), with
    the CTA's threads, or with warpgroup 0 synchronising on the named `barrier`."""
    with r.for_(f"f{tag}", 0, count):
        r.let(f"k{tag}", f"b * K + {first} + f{tag} * {rows}")
        r.ldg(tile("WS", [f"k{tag}", 0], [rows, 128]), tile(f"fs{tag}"), oob="zfill", vec_bytes=4)
        r.ldg(tile("WC", [f"k{tag}", 0], [rows, 1]), tile(f"fc{tag}"), oob="zfill", vec_bytes=4)
        r.ldg(tile("C", [f"k{tag}", 0], [rows, 128]), tile(f"fo{tag}"), oob="zfill", vec_bytes=2)
        # empty clusters keep their centroid
        r.map(f"fs{tag}", f"select(fc{tag} > 0.5, fs{tag} * recip(max(fc{tag}, 1)), fo{tag})")
        r.stg(tile(f"fs{tag}"), tile("Cnew", [f"k{tag}", 0], [rows, 128]), oob="mask", vec_bytes=4)
        # every thread reads every count of the chunk (fc is per thread) and every thread zeroes them:
        # without this barrier a fast warp zeroes WC before a slow warp has read it (that warp then keeps
        # the old centroid: seen on the H200 at B=32)
        if barrier is None:
            r.sync("syncthreads")
        else:
            r.add("bar_sync", barrier=barrier)
        r.fill(f"fs{tag}", 0.0)
        r.fill(f"fc{tag}", 0.0)
        r.stg(tile(f"fs{tag}"), tile("WS", [f"k{tag}", 0], [rows, 128]), oob="mask", vec_bytes=4)
        r.stg(tile(f"fc{tag}"), tile("WC", [f"k{tag}", 0], [rows, 1]), oob="mask", vec_bytes=4)


def _finish(r, levels, barrier=None) -> None:
    """The last CTA of a batch finishes its K clusters in chunks of decreasing size: `levels` is
    [(tag, rows, const name)], the last one (tag, 1, None); each level takes what the previous left."""
    prev = None
    for tag, rows, const in levels:
        first = "0" if prev is None else f"(K / {prev}) * {prev}"
        if prev is None:
            count = f"K / {const}"
        elif const is None:
            count = f"K % {prev}"
        else:
            count = f"(K % {prev}) / {const}"
        _finish_rows(r, rows, first, count, tag, barrier)
        prev = const


def _declare_io(kb, kmax: int) -> None:
    """Scalars and tensors of one Lloyd iteration (the task's interface, tasks/kmeans/task.py)."""
    kb.scalar("B", min=1)
    kb.scalar("N", min=1)
    kb.scalar("K", min=1, max=kmax)
    kb.tensor("X", "f16", ["B * N", "D"])
    kb.tensor("C", "f16", ["B * K", "D"])
    kb.tensor("A", "i32", ["B", "N"], access="write")
    kb.tensor("Cnew", "f32", ["B * K", "D"], access="write")
    kb.tensor("WS", "f32", ["B * K", "D"], access="readwrite")     # workspace: zero between launches
    kb.tensor("WC", "f32", ["B * K", 1], access="readwrite")
    kb.tensor("WT", "i32", ["B", 1], access="readwrite")


def _declare_finish(kb, threads: int) -> str:
    """The finish's thread group, declaring what it needs: the CTA up to 128 threads; beyond, warpgroup 0
    alone (a row of 128 columns spreads over 128 threads, one element each) on a named barrier of 128."""
    if threads <= 128:
        return "cta"
    kb.named_barrier("finish_bar", 1, 128)
    return "warpgroup"


def _declare_registers(kb, d: int, bn: int, levels, scope: str = "cta", mma: str = "sync") -> None:
    """Register tiles: the zero block, the argmin's mma fragments (mma "wgmma": only the warpgroup's
    [64, bn] accumulator; the operands stay in smem) and lists, the finish chunks."""
    kb.buffer("zero", "reg", "f32", [8, d], layout="blocked", vec=4, scope="cta")
    if mma == "wgmma":
        kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")
    else:
        kb.buffer("fa", "reg", "f16", [16, d], layout="mma_a", scope="warp")
        kb.buffer("fb", "reg", "f16", [bn, 16], layout="mma_b", scope="warp")
        kb.buffer("acc", "reg", "f32", [16, bn], layout="mma_acc", scope="warp")
    kb.buffer("bv", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    kb.buffer("bi", "reg", "i32", [16, 1], layout="mma_rows", scope="warp")
    for tag, n, _ in levels:
        kb.buffer(f"fs{tag}", "reg", "f32", [n, d], layout="blocked", vec=1, scope=scope)
        kb.buffer(f"fo{tag}", "reg", "f32", [n, d], layout="blocked", vec=1, scope=scope)
        kb.buffer(f"fc{tag}", "reg", "f32", [n, 1])


def _zero_partials(r, d: int, threads: int, sum_chunks) -> None:
    """Zero the CTA's smem sums (`sum_chunks` blocks of 8 rows) and its counts."""
    r.fill("zero", 0.0)
    if sum_chunks is not None:      # None: the sums live in registers (`sums="regs"`)
        with r.for_("z", 0, sum_chunks, id="zero_partials"):
            r.sts(tile("zero"), tile("ssum", ["z * 8", 0], [8, d]))
    with r.for_("z2", 0, f"cdiv(KMAX, {threads})"):   # stride: the CTA's thread count (64 when bm = 32)
        with r.if_(f"z2 * {threads} + tid < KMAX"):
            r.fill("fct", 0.0)
            r.sts(tile("fct"), tile("scnt", [f"z2 * {threads} + tid", 0], [1, 1]), vec_bytes=4)


def _flush_and_finish(r, kmax: int, d: int, copies: int, levels, scope: str = "cta") -> None:
    """Add the CTA's sums (`copies` per-warp copies or one; 0: they were flushed from registers,
    `flush_held_sums`) and counts into the zeroed workspace, one red.global per (cluster, dim); the last
    CTA of the batch divides and re-zeroes it."""
    r.sync("syncthreads")
    for c in range(copies):
        r.add("red_add", id=f"flush_sums{c}" if copies > 1 else "flush_sums",
              src=tile("ssum", [c * kmax, 0], [kmax, d]),
              dst=tile("WS", ["b * K", 0], [kmax, d]), row_limit="K")
    r.add("red_add", id="flush_counts", src=tile("scnt"), dst=tile("WC", ["b * K", 0], [kmax, 1]), row_limit="K")
    fin = r.add("last_cta", id="finish", counter=tile("WT", ["b", 0], [1, 1]), count="nbid.x", body=[])
    with r._nest(fin["body"]):
        if scope == "cta":
            _finish(r, levels)
        else:
            with r.if_("wg == 0"):
                _finish(r, levels, "finish_bar")


UPDATE_DN = 64   # columns of the sums one warp's accumulator block holds (32 f32 registers per lane)


def _declare_update(kb, kmax: int, d: int, bm: int, update: str, copies: int = 1, urows: int = 16,
                    held: bool = False) -> None:
    """The smem sums [kmax, d] and, for the tensor-core update, its operands. The mma update pads the
    sums' rows by 8 floats: its float2 loads / stores of an accumulator block (8 rows x 4 lane pairs
    per half-warp) then hit 32 different banks."""
    assert update in ("atomic", "mma"), update
    assert update == "atomic" or copies == 1, "the mma update owns its blocks per warp: no private copies"
    if not held:    # held: the sums stay in registers (`declare_held_sums`)
        kb.buffer("ssum", "smem", "f32", [copies * kmax, d], **({"pad": 8} if update == "mma" else {}))
    if update == "mma":
        kb.buffer("sidx", "smem", "i32", [bm, 1])
        kb.buffer("oh", "reg", "f16", [urows, 16], layout="mma_a", scope="warp")
        kb.buffer("xb", "reg", "f16", [UPDATE_DN, 16], layout="mma_b", scope="warp")
        if not held:
            kb.buffer("uacc", "reg", "f32", [urows, UPDATE_DN], layout="mma_acc", scope="warp")


def _update_mma(r, bm: int, d: int, warps: int, slot, urows: int = 16, x_block=None) -> None:
    """sums[c, :] += X[j, :] for the tile's points j of cluster c, on tensor cores: the tile's targets
    go to shared memory; warp w owns the sums' blocks (`urows` clusters x UPDATE_DN dims) u = w,
    w + warps, .. (the same blocks on every tile, so no two warps ever add into one block) and, per
    block, loads the f32 block, adds onehot(targets)^T [urows, 16 points] x X [16 points, UPDATE_DN]
    per 16 points (X through ldmatrix.trans) and stores it back. Shared-memory traffic per tile:
    the sums' blocks twice (K x d x 8 bytes) and X once per block row (K / urows x bm x d x 2 bytes):
    urows 32 halves the second for 32 more accumulator registers. Points past N (the next batch's
    rows, zero fill) are masked by the onehot's limit; the assignment's -1 never matches a cluster.
    x_block(p): the tile of points [16 p, 16 p + 16) x columns [uc, uc + UPDATE_DN) (default: sX
    row-major; the wgmma kernels store X as 64-column swizzle atoms)."""
    dn = UPDATE_DN
    r.sts(tile("bi"), tile("sidx", ["wm0", 0], [16, 1]), vec_bytes=4, id="stage_targets")
    r.sync("syncthreads")   # every warp reads every warp's targets
    with r.for_("u", "role_warp", f"cdiv(K, {urows}) * {d // dn}", step=warps, id="update_blocks"):
        r.let("ur", f"(u / {d // dn}) * {urows}")
        r.let("uc", f"(u % {d // dn}) * {dn}")
        r.lds(tile("ssum", ["ur", "uc"], [urows, dn]), tile("uacc"), vec_bytes=8)
        for p in range(bm // 16):
            r.add("onehot", index=tile("sidx", [p * 16, 0], [16, 1]), dst=tile("oh"), row0="ur",
                  col0=f"n0 + {p * 16}", limit="N")
            r.ldmatrix(x_block(p) if x_block else tile("sX", [p * 16, "uc"], [16, dn], slot=slot), tile("xb"),
                       trans=True)
            r.mma_sync(tile("oh"), tile("xb"), tile("uacc"))
        r.sts(tile("uacc"), tile("ssum", ["ur", "uc"], [urows, dn]), vec_bytes=8, id="store_sums")


def held_blocks(kmax: int, d: int, warps: int, urows: int) -> int:
    """Accumulator blocks each warp holds in registers for the whole kernel (`sums="regs"`): the sums'
    (kmax / urows) x (d / UPDATE_DN) blocks dealt over the warps, block u to warp u % warps. A warp's blocks
    then share their columns (warps a multiple of d / UPDATE_DN), so one X fragment feeds all of them."""
    blocks = (kmax // urows) * (d // UPDATE_DN)
    if kmax % urows or blocks % warps or warps % (d // UPDATE_DN):
        raise ValueError(f"sums in registers deal (kmax / urows) x (d / {UPDATE_DN}) = {blocks} blocks evenly over "
                         f"{warps} warps, the same columns per warp (kmax={kmax}, urows={urows}, d={d})")
    held = blocks // warps
    if held * urows * UPDATE_DN // 32 > HELD_REGS:
        raise ValueError(f"sums in registers take {held * urows * UPDATE_DN // 32} f32 registers per lane at kmax={kmax}, "
                         f"{warps} warps (at most {HELD_REGS}, beside the argmin's): more warps (bm) or a smaller kmax")
    return held


HELD_REGS = 128     # the held sums' registers per lane: the rest of the 255 go to the argmin and the operands


def declare_held_sums(kb, kmax: int, d: int, warps: int, urows: int) -> int:
    """The per-warp register blocks `uacc0 ..` of `sums="regs"` (UPDATE_DN / 2 x urows / 16 f32 registers
    per lane each: K x d x 4 / threads bytes per thread in all)."""
    held = held_blocks(kmax, d, warps, urows)
    for j in range(held):
        kb.buffer(f"uacc{j}", "reg", "f32", [urows, UPDATE_DN], layout="mma_acc", scope="warp")
    return held


def zero_held_sums(r, d: int, warps: int, urows: int, held: int) -> None:
    """Where a warp's blocks sit in the sums (`ur0 ..` rows, `uc` columns), and zeroed accumulators."""
    dn = UPDATE_DN
    r.let("uc", f"(role_warp % {d // dn}) * {dn}")
    for j in range(held):
        r.let(f"ur{j}", f"((role_warp + {j * warps}) / {d // dn}) * {urows}")
        r.fill(f"uacc{j}", 0.0)


def _update_held(r, bm: int, held: int, x_block) -> None:
    """The tensor-core update of `_update_mma` into accumulators that stay in registers across the point
    tiles (`sums="regs"`): no load / store of the sums per tile (K x d x 8 bytes of shared-memory traffic),
    and each X fragment is loaded once for all of the warp's blocks (they share its columns). Blocks at
    or past K skip the product (their one-hot would be all zero)."""
    r.sts(tile("bi"), tile("sidx", ["wm0", 0], [16, 1]), vec_bytes=4, id="stage_targets")
    r.sync("syncthreads")   # every warp reads every warp's targets
    for p in range(bm // 16):
        r.ldmatrix(x_block(p), tile("xb"), trans=True)
        for j in range(held):
            with r.if_(f"ur{j} < K"):
                r.add("onehot", index=tile("sidx", [p * 16, 0], [16, 1]), dst=tile("oh"), row0=f"ur{j}",
                      col0=f"n0 + {p * 16}", limit="N")
                r.mma_sync(tile("oh"), tile("xb"), tile(f"uacc{j}"))


def flush_held_sums(r, urows: int, held: int) -> None:
    """After the point loop: each warp adds its register blocks straight into the global workspace (red_add
    from an mma_acc tile: no shared-memory sums at all, which leaves their 136 KB to the centroids)."""
    for j in range(held):
        with r.if_(f"ur{j} < K"):
            r.add("red_add", id="flush_held_sums" if j == 0 else None, src=tile(f"uacc{j}"),
                  dst=tile("WS", [f"b * K + ur{j}", "uc"], [urows, UPDATE_DN]), row_limit=f"K - ur{j}")


def _update(r, update: str, bm: int, d: int, warps: int, sums: dict, slot, cas_batch=None,
            urows: int = 16, x_block=None, held: int = 0) -> None:
    """Aggregate the tile's points into the CTA's sums and counts (the counts stay one red.shared per
    point: 1/d of the sums' adds)."""
    if update == "mma" and held:
        _update_held(r, bm, held, x_block or (lambda p: tile("sX", [p * 16, "uc"], [16, UPDATE_DN], slot=slot)))
    elif update == "mma":
        _update_mma(r, bm, d, warps, slot, urows, x_block)
    else:
        r.add("scatter_add", id="sum_points", index=tile("bi"), src=tile("sX", ["wm0", 0], [16, d], slot=slot),
              dst=sums, row0="n0 + wm0",
              row_limit="N", **({"batch": cas_batch} if cas_batch is not None else {}))
    r.add("scatter_add", id="count_points", index=tile("bi"), dst=tile("scnt"), row0="n0 + wm0", row_limit="N")


def kmeans_fused(kmax: int = 128, d: int = 128, bm: int = 64, bn: int = 64, ctas: int = 64, rows: int = 8,
                 update: str = "atomic", urows: int = 16, norms: str = "tile", xstages: int = 1, arch: str = "sm_80"):
    """Fused Lloyd iteration for K <= kmax (the per-CTA partial sums [kmax, d] f32 live in smem).
    `update` / `urows`: see `_update_mma`. `norms`: "tile" recomputes each centroid tile's squared
    norms per point tile (a reduce and a CTA barrier per centroid tile); "once" computes all K norms
    once per CTA, before the point loop, into an smem vector the argmin reads.
    `xstages` 2 (norms "once"): the next point tile and its first centroid tile load during the last
    centroid tile of this one (sX double-buffered), so no point tile waits for its own loads (with 1,
    each point tile's loads are exposed: one CTA per SM has nothing else to run meanwhile)."""
    assert norms in ("tile", "once"), norms
    assert xstages in (1, 2) and (xstages == 1 or norms == "once"), "xstages 2 needs norms 'once'"
    assert d == 128, "the finishing pass is written for D = 128 (one element per thread per row)"
    warps = bm // 16
    threads = 32 * warps
    suffix = (f"_mma{urows}" if update == "mma" else "") + ("_n1" if norms == "once" else "") \
        + ("_x2" if xstages == 2 else "")
    kb = KernelBuilder(f"kmeans_fused_k{kmax}_d{d}_{bm}x{bn}{suffix}", arch=arch, grid=["min(P, cdiv(N, BM))", "B"],
                       threads=threads, note="one Lloyd iteration: fused argmin assignment + smem-aggregated update")
    kb.const(BM=bm, BN=bn, D=d, KMAX=kmax, P=ctas, RB=rows)
    levels = [("m", rows, "RB"), ("t", 1, None)]
    _declare_io(kb, kmax)
    kb.buffer("sX", "smem", "f16", [bm, d], pad=8, **({"stages": 2} if xstages == 2 else {}))
    kb.buffer("sC", "smem", "f16", [bn, d], pad=8, stages=2)
    kb.buffer("cn", "smem", "f32", [kmax if norms == "once" else bn])
    _declare_update(kb, kmax, d, bm, update, urows=urows)
    kb.buffer("scnt", "smem", "f32", [kmax, 1])
    fscope = _declare_finish(kb, threads)
    _declare_registers(kb, d, bn, levels, fscope)
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("wm0", "role_warp * 16")
        _zero_partials(r, d, threads, "KMAX / 8")
        if norms == "once":
            with r.for_("t0", 0, "cdiv(K, BN)", id="centroid_norms_once"):
                r.sync("syncthreads")   # the previous tile's norm readers are done with slot 0
                r.copy("cp_async", tile("C", ["b * K + t0 * BN", 0], [bn, d]), tile("sC", slot=0), oob="zfill")
                r.sync("cp_async_commit")
                r.sync("cp_async_wait", n=0)
                r.sync("syncthreads")
                r.reduce("sum_sq", tile("sC", slot=0), tile("cn", ["t0 * BN"], [bn]), id="centroid_norms")
        if xstages == 2:
            def load_x(row, slot, id=None):
                r.copy("cp_async", tile("X", [row, 0], [bm, d]), tile("sX", slot=slot), oob="zfill", id=id)

            def load_c(row, slot):
                r.copy("cp_async", tile("C", [row, 0], [bn, d]), tile("sC", slot=slot), oob="zfill")

            def score(t, xslot, cslot):
                with r.if_(f"{t} == 0"):
                    r.ldmatrix(tile("sX", ["wm0", 0], [16, d], slot=xslot), tile("fa"))
                r.fill("acc", 0.0)
                for kk in range(d // 16):
                    r.ldmatrix(tile("sC", [0, kk * 16], [bn, 16], slot=cslot), tile("fb"))
                    r.mma_sync(tile("fa", [0, kk * 16], [16, 16]), tile("fb"), tile("acc"))
                r.add("topk", id="argmin", kind="min", k=1, src=tile("acc"), vals=tile("bv"), idx=tile("bi"),
                      col=f"{t} * BN", limit="K", scale=-2.0, col_bias=tile("cn", [f"{t} * BN"], [bn]))
            point_loop_prefetched(r, load_x, load_c, score,
                                  lambda slot: _update(r, update, bm, d, warps, tile("ssum"), slot=slot, urows=urows))
        else:
            with r.for_("it", 0, "cdiv(cdiv(N, BM) - bid.x, nbid.x)", id="point_tiles"):
                r.let("n0", "(bid.x + it * nbid.x) * BM")
                r.sync("syncthreads")   # the previous tile's readers of sX / sC are done
                r.copy("cp_async", tile("X", ["b * N + n0", 0], [bm, d]), tile("sX"), oob="zfill", id="load_points")
                r.copy("cp_async", tile("C", ["b * K", 0], [bn, d]), tile("sC", slot=0), oob="zfill")
                r.sync("cp_async_commit")
                r.sync("cp_async_wait", n=0)
                r.sync("syncthreads")
                r.ldmatrix(tile("sX", ["wm0", 0], [16, d]), tile("fa"))
                r.fill("bv", BIG)
                r.fill("bi", -1)
                with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
                    r.sync("cp_async_wait", n=0)
                    r.sync("syncthreads")
                    with r.if_("t + 1 < cdiv(K, BN)"):
                        r.copy("cp_async", tile("C", ["b * K + (t + 1) * BN", 0], [bn, d]), tile("sC", slot="(t + 1) % 2"),
                               oob="zfill")
                    r.sync("cp_async_commit")
                    if norms == "tile":
                        r.reduce("sum_sq", tile("sC", slot="t % 2"), tile("cn"), id="centroid_norms")
                        r.sync("syncthreads")
                    r.fill("acc", 0.0)
                    for kk in range(d // 16):
                        r.ldmatrix(tile("sC", [0, kk * 16], [bn, 16], slot="t % 2"), tile("fb"))
                        r.mma_sync(tile("fa", [0, kk * 16], [16, 16]), tile("fb"), tile("acc"))
                    # rows of C beyond K (the next batch's centroids or zero fill) are skipped by limit
                    r.add("topk", id="argmin", kind="min", k=1, src=tile("acc"), vals=tile("bv"), idx=tile("bi"),
                          col="t * BN", limit="K", scale=-2.0,
                          col_bias=tile("cn", ["t * BN"], [bn]) if norms == "once" else tile("cn"))
                r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
                r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
                _update(r, update, bm, d, warps, tile("ssum"), slot=None, urows=urows)
        _flush_and_finish(r, kmax, d, 1, levels, fscope)
    return kb.build()


def point_loop_prefetched(r, load_x, load_c, score, update, fence: bool = False) -> None:
    """A streamed k-means kernel's point loop with sX double-buffered (xstages 2): centroid tiles are
    numbered across point tiles (it * T + t, T = cdiv(K, BN): their ring slot alternates whatever T is);
    at a point tile's last centroid tile the next point tile's X and its first centroid tile start
    loading, so the next point tile finds them landed. One commit per centroid tile keeps wait_group 0
    exact. The kernel supplies load_x(row, slot, id), load_c(row, slot), score(t, x slot, c slot) (the
    distances and the argmin), update(x slot); `fence`: the tiles are read by wgmma (async proxy)."""
    r.let("ntile", "cdiv(cdiv(N, BM) - bid.x, nbid.x)")
    r.sync("syncthreads")       # the norm pass's readers of slot 0 are done
    load_x("b * N + bid.x * BM", 0, "load_first_points")
    load_c("b * K", 0)
    r.sync("cp_async_commit")
    with r.for_("it", 0, "ntile", id="point_tiles"):
        r.let("n0", "(bid.x + it * nbid.x) * BM")
        r.let("g0", "it * cdiv(K, BN)")
        r.fill("bv", BIG)
        r.fill("bi", -1)
        with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):   # (the bounds prover reads the stop)
            r.sync("cp_async_wait", n=0)
            if fence:
                r.fence("proxy_async")
            r.sync("syncthreads")   # tile t (and at t = 0 the points) landed; slot (g0 + t + 1) % 2 is free
            with r.if_("t + 1 < cdiv(K, BN)"):
                load_c("b * K + (t + 1) * BN", "(g0 + t + 1) % 2")
            with r.if_("t + 1 == cdiv(K, BN) && it + 1 < ntile"):    # the next point tile's loads
                load_x("b * N + n0 + nbid.x * BM", "(it + 1) % 2", "prefetch_points")
                load_c("b * K", "(g0 + t + 1) % 2")
            r.sync("cp_async_commit")
            score("t", "it % 2", "(g0 + t) % 2")
        r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
        r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
        update("it % 2")
    r.sync("cp_async_wait", n=0)


def kmeans_resident(kmax: int = 128, d: int = 128, bm: int = 64, bn: int = 64, ctas: int = 132, rows: int = 8,
                    big: int = 16, cas_batch: int = 8, private: bool = False, update: str = "atomic",
                    urows: int = 16, arch: str = "sm_80"):
    """Fused Lloyd iteration with the batch's centroids resident in shared memory: each CTA loads all
    K <= kmax centroids (and their squared norms) once, then streams its point tiles through a
    two-stage cp.async buffer (tile i + 1 loads while tile i is scored and aggregated). Per point
    tile only X moves; the seed above reloads every centroid tile and recomputes its norms per point
    tile with the load latency exposed. Update as in `kmeans_fused`; the finish walks the clusters in
    chunks of `big`, then `rows`, then 1 rows (each chunk is a few dependent global round trips, and
    it runs after every other CTA of the batch is done).

    The point sums are f32 shared-memory adds, which the GPU does as compare-and-swap loops:
    `cas_batch` adds are issued together (cake.cuh red_add_shared_f32xn), and `private` gives every
    warp its own [kmax, d] sums (no CAS ever loses to another warp; the flush adds all copies), for
    few clusters, where the warps of a CTA keep hitting the same rows. `update="mma"` replaces those
    adds with the tensor-core product (`_update_mma`; `cas_batch` / `private` then do not apply)."""
    assert big % rows == 0
    assert d == 128, "the finishing pass is written for D = 128 (one element per thread per row)"
    bn = min(bn, kmax)
    warps = bm // 16
    threads = 32 * warps
    kb = KernelBuilder(f"kmeans_resident_k{kmax}_d{d}_{bm}x{bn}_p{ctas}" + (f"_mma{urows}" if update == "mma" else ""),
                       arch=arch,
                       grid=["min(P, cdiv(N, BM))", "B"], threads=threads,
                       note="one Lloyd iteration: resident centroids, double-buffered points, fused argmin + "
                            "smem-aggregated update")
    kb.const(BM=bm, BN=bn, D=d, KMAX=kmax, P=ctas, RB=rows, RBB=big)
    levels = [("b", big, "RBB"), ("m", rows, "RB"), ("t", 1, None)]
    _declare_io(kb, kmax)
    kb.buffer("sX", "smem", "f16", [bm, d], pad=8, stages=2)
    kb.buffer("sC", "smem", "f16", [kmax, d], pad=8)
    kb.buffer("cn", "smem", "f32", [kmax])
    copies = warps if private and update == "atomic" else 1
    _declare_update(kb, kmax, d, bm, update, copies, urows)
    kb.buffer("scnt", "smem", "f32", [kmax, 1])
    fscope = _declare_finish(kb, threads)
    _declare_registers(kb, d, bn, levels, fscope)
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("wm0", "role_warp * 16")
        r.let("ntile", "cdiv(cdiv(N, BM) - bid.x, nbid.x)")
        _zero_partials(r, d, threads, f"{copies} * KMAX / 8")
        # rows of C beyond K (the next batch's centroids or zero fill) are never chosen: topk's limit
        r.copy("cp_async", tile("C", ["b * K", 0], [kmax, d]), tile("sC"), oob="zfill", id="load_centroids")
        r.copy("cp_async", tile("X", ["b * N + bid.x * BM", 0], [bm, d]), tile("sX", slot=0), oob="zfill",
               id="load_first_points")
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.sync("syncthreads")
        r.reduce("sum_sq", tile("sC"), tile("cn"), id="centroid_norms")
        with r.for_("it", 0, "ntile", id="point_tiles"):
            r.let("n0", "(bid.x + it * nbid.x) * BM")
            r.sync("cp_async_wait", n=0)     # tile it has landed
            r.sync("syncthreads")            # every warp is done with tile it - 1 (its slot is reloaded next)
            with r.if_("it + 1 < ntile"):
                r.copy("cp_async", tile("X", ["b * N + n0 + nbid.x * BM", 0], [bm, d]), tile("sX", slot="(it + 1) % 2"),
                       oob="zfill", id="prefetch_points")
            r.sync("cp_async_commit")
            r.ldmatrix(tile("sX", ["wm0", 0], [16, d], slot="it % 2"), tile("fa"))
            r.fill("bv", BIG)
            r.fill("bi", -1)
            with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
                r.fill("acc", 0.0)
                for kk in range(d // 16):
                    r.ldmatrix(tile("sC", ["t * BN", kk * 16], [bn, 16]), tile("fb"))
                    r.mma_sync(tile("fa", [0, kk * 16], [16, 16]), tile("fb"), tile("acc"))
                r.add("topk", id="argmin", kind="min", k=1, src=tile("acc"), vals=tile("bv"), idx=tile("bi"),
                      col="t * BN", limit="K", scale=-2.0, col_bias=tile("cn", ["t * BN"], [bn]))
            r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
            r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
            _update(r, update, bm, d, warps, tile("ssum", ["role_warp * KMAX" if copies > 1 else 0, 0], [kmax, d]),
                    slot="it % 2", cas_batch=cas_batch, urows=urows)
        _flush_and_finish(r, kmax, d, copies, levels, fscope)
    return kb.build()


SEEDS = {
    "kmeans_fused_sm80": lambda: kmeans_fused(),
    "kmeans_fused_k256_sm90a": lambda: kmeans_fused(kmax=256, arch="sm_90a"),
    "kmeans_resident_sm80": lambda: kmeans_resident(),
    "kmeans_resident_mma_sm80": lambda: kmeans_resident(big=16, update="mma"),
}

def _update_ok(p: dict) -> bool:
    """urows only shapes the tensor-core update (with atomics another value is the same program)."""
    return p.get("update", "atomic") == "mma" or p.get("urows", 16) == 16


FAMILIES = {
    "kmeans_fused_sm80": {
        "make": kmeans_fused,
        "defaults": signature_defaults(kmeans_fused),
        "space": {"kmax": [128, 256], "bm": [32, 64, 128], "bn": [32, 64, 128], "ctas": [16, 32, 64, 128, 264],
                  "update": ["atomic", "mma"], "urows": [16, 32], "norms": ["tile", "once"], "xstages": [1, 2]},
        "check": lambda p: p["bm"] % 16 == 0 and p["bn"] % 16 == 0 and _update_ok(p)
        and (p.get("xstages", 1) == 1 or p.get("norms") == "once"),
        "tactics": {"retile": ["bm", "bn"], "update_mechanism": ["update", "urows"]},
    },
    "kmeans_resident_sm80": {
        "make": kmeans_resident,
        "defaults": signature_defaults(kmeans_resident),
        "space": {"kmax": [32, 64, 128, 256], "bm": [32, 64, 128], "bn": [32, 64, 128], "ctas": [33, 66, 132, 264],
                  "big": [8, 16, 32], "update": ["atomic", "mma"], "urows": [16, 32]},
        "check": lambda p: p["bm"] % 16 == 0 and p["bn"] % 16 == 0 and not (p["kmax"] == 256 and p["bm"] == 64)
        and _update_ok(p),
        "tactics": {"retile": ["bm", "bn"], "update_mechanism": ["update", "urows"]},
    },
}
# the tensor-core update seed: the resident family with its own defaults (big 16 keeps E-RES-05's budget)
FAMILIES["kmeans_resident_mma_sm80"] = {**FAMILIES["kmeans_resident_sm80"],
                                        "defaults": {**FAMILIES["kmeans_resident_sm80"]["defaults"], "big": 16,
                                                     "update": "mma"}}

# the wgmma kernels (sm_90a, tasks/kmeans/wgmma.py) register their seed and family in SEEDS / FAMILIES;
# imported last: they build on this module's helpers
from . import wgmma  # noqa: E402,F401
