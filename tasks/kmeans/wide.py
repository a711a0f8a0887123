"""Lloyd's k-means for large K and any D (32 .. 1024, a multiple of 32): three kernels per iteration.

1. `kmeans_wide_norms`: ||c||^2 of every centroid row, once per iteration, into CN [1, B*K];
2. `kmeans_wide_assign`: a tile of `bm` points stays in shared memory (all of D, zero-filled to a
   multiple of the chunk `dc`) while the batch's centroid tiles [bn, dc] stream past through a
   `stages`-deep cp.async ring numbered across tiles and chunks (FlashAttention-style); each warp's 16
   points accumulate x.c over the chunks on mma.sync (fp16 in, fp32 accumulate), then the running argmin
   (`topk` k = 1) of ||c||^2 - 2 x.c takes the tile -- the N x K distance matrix is never written
   (`kmeans_wide_assign_wgmma`, sm_90a: the same stream of 64-dim swizzle atoms on warpgroup MMA). The
   CTA then adds its points into per-cluster global fp32 sums WS [B*K, D] and counts WC (`scatter_add`:
   red.global per point and dim; a quad's lanes cover 8 consecutive dims, one 32-byte sector, per
   instruction) -- the K x D sums do not fit in shared memory;
3. `kmeans_wide_finalize`: new centroid = sum / count (an empty cluster keeps its centroid), fp32 out and an
   fp16 copy for the next iteration's assignment; it leaves WS / WC zeroed for the next launch.

Tensors are 2-d with the batch folded into rows (X [B*N, D], C [B*K, D]) as in programs.py.
"""
from cake_ir.builder import KernelBuilder, tile

BIG = 3.0e38
K_MAX = 65536      # the scatter's target tile spans the batch's clusters (at most K_MAX rows)
D_MIN, D_MAX = 32, 1024
SMEM_BYTES = {"sm_90a": 227 * 1024, "sm_80": 163 * 1024}


def chunk_of(d: int) -> int:
    """The D chunk one ring stage holds: the widest of 128 / 64 / 32 dividing D (no padding), else 32
    (D zero-filled up to a multiple of 32)."""
    return next((c for c in (128, 64, 32) if d % c == 0), 32)


def padded(d: int, dc: int) -> int:
    return -(-d // dc) * dc


def assign_smem_bytes(d: int, bm: int, bn: int, dc: int, stages: int, mma: str = "sync") -> int:
    """Shared memory of `kmeans_wide_assign`: the point tile, the centroid ring and the norms ring (mma.sync:
    rows padded by 8 halves; wgmma: unpadded 128-byte swizzle atoms, dc = 64), plus 1 KB of alignment."""
    pad = 8 if mma == "sync" else 0
    return 2 * bm * (padded(d, dc) + pad) + stages * (2 * bn * (dc + pad) + 4 * bn) + (1024 if mma == "wgmma" else 0)


def check_d(d: int) -> None:
    if not D_MIN <= d <= D_MAX or d % 32:
        raise ValueError(f"kmeans (wide): D must be a multiple of 32 in [{D_MIN}, {D_MAX}] (the finalize deals a row's "
                         f"dims evenly over a warp), got {d}")


def kmeans_wide_norms(d: int = 128, arch: str = "sm_80"):
    """CN[0, r] = ||C[r]||^2 (fp16 rows, fp32 sums): a row per thread, `rows` per CTA."""
    check_d(d)
    rows = 128 if d <= 256 else 64 if d <= 512 else 32
    kb = KernelBuilder(f"kmeans_wide_norms_d{d}", arch=arch, grid=["cdiv(R, BR)"], threads=rows,
                       note="squared norms of the centroid rows (read by the wide k-means assignment)")
    kb.const(BR=rows, D=d)
    kb.scalar("R", min=1)
    kb.tensor("C", "f16", ["R", "D"])
    kb.tensor("CN", "f32", [1, "R"], access="write")
    kb.buffer("sC", "smem", "f16", [rows, d], pad=8)
    kb.buffer("nv", "smem", "f32", [rows])
    kb.buffer("nr", "reg", "f32", [1, 1], layout="row_major", scope="thread")
    with kb.role("main", warps=(0, rows // 32)) as r:
        r.let("m0", "bid.x * BR")
        r.copy("cp_async", tile("C", ["m0", 0], [rows, d]), tile("sC"), oob="zfill", id="load_rows")
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.sync("syncthreads")
        r.reduce("sum_sq", tile("sC"), tile("nv"), id="centroid_norms")
        r.sync("syncthreads")
        r.lds(tile("nv", ["tid"], [1]), tile("nr"), vec_bytes=4)
        r.stg(tile("nr"), tile("CN", [0, "m0 + tid"], [1, 1]), oob="mask", vec_bytes=4, id="store_norms")
    return kb.build()


def _declare_assign_io(kb, d: int, copies: int = 1, tma: dict | None = None) -> None:
    """The assignment kernels' interface (every form): scalars, points, centroids and their norms, the
    assignments, and the per-cluster sums and counts they add into (`copies` of them, zeroed again by the
    finalize). tma: "X" / "C" -> the TMA box of a form that loads them by TMA."""
    tma = tma or {}
    kb.const(P=copies)
    if copies > 1:
        kb.const(FR=finalize_rows(d))
    kb.scalar("B", min=1)
    kb.scalar("N", min=1)
    kb.scalar("K", min=1, max=K_MAX)
    kb.tensor("X", "f16", ["B * N", "D"], tma=tma.get("X"))
    kb.tensor("C", "f16", ["B * K", "D"], tma=tma.get("C"))
    kb.tensor("CN", "f32", [1, "B * K"])
    kb.tensor("A", "i32", ["B", "N"], access="write")
    rows = f"P * ({COPY_ROWS})" if copies > 1 else "B * K"
    kb.tensor("WS", "f32", [rows, "D"], access="readwrite")
    kb.tensor("WC", "f32", [rows, 1], access="readwrite")


def _declare_assign(kb, d: int, bm: int, bn: int, dc: int, stages: int, copies: int) -> None:
    _declare_assign_io(kb, d, copies)
    kb.buffer("sX", "smem", "f16", [bm, padded(d, dc)], pad=8)
    kb.buffer("sC", "smem", "f16", [bn, dc], pad=8, stages=stages)
    kb.buffer("cn", "smem", "f32", [1, bn], stages=stages)
    kb.buffer("fa", "reg", "f16", [16, 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "f16", [bn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, bn], layout="mma_acc", scope="warp")
    kb.buffer("bv", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    kb.buffer("bi", "reg", "i32", [16, 1], layout="mma_rows", scope="warp")


def _load_step(r, g: str, bn: int, dc: int, stages: int) -> None:
    """Stage ring step `g` (centroid tile g / NCH, chunk g % NCH) into slot g % stages; a tile's first
    chunk brings its norms too (norm slot: the tile's number % stages)."""
    r.copy("cp_async", tile("C", [f"b * K + (({g}) / NCH) * BN", f"(({g}) % NCH) * DC"], [bn, dc]),
           tile("sC", slot=f"({g}) % {stages}"), oob="zfill")
    with r.if_(f"({g}) % NCH == 0"):
        r.copy("cp_async", tile("CN", [0, f"b * K + (({g}) / NCH) * BN"], [1, bn]),
               tile("cn", slot=f"(({g}) / NCH) % {stages}"), oob="zfill", vec_bytes=4)


def suffix(red: int, copies: int, lv: bool = False, sorted_sums: bool = False) -> str:
    """The assignment kernels' name suffix: vector reds `_r{red}`, copies of the sums `_p{copies}`, the
    scatter's points read 4 halves per load `_lv`, the sums left to a counting sort `_ss`."""
    return (f"_r{red}" if red > 1 else "") + (f"_p{copies}" if copies > 1 else "") + ("_lv" if lv else "") \
        + ("_ss" if sorted_sums else "")


def check_sorted_sums(sorted_sums: bool, copies: int) -> None:
    """The counting sort's sums (tasks.kmeans.sorted_sums) read one copy of the counts."""
    if sorted_sums and copies != 1:
        raise ValueError(f"kmeans (wide): sorted_sums counts into one copy of the sums (got copies={copies})")


def count_points(r, index: str, copies: int, row0: str) -> None:
    """WC[a_j] += 1 for the warp's 16 points (`index`: their clusters; rows past N skipped)."""
    r.add("scatter_add", id="count_points", index=tile(index), dst=tile("WC", [sums_row(copies), 0], [K_MAX, 1]),
          row0=row0, row_limit="N")


def slice_of(red: int) -> int:
    """Dims per scatter slice: a quad's 4 lanes add `red` consecutive floats each (red 4: 16 dims, two
    32-byte sectors per row and instruction), else 8 (one sector)."""
    return 4 * red if red == 4 else 8


SCATTER_BATCHES = (1, 2, 4, 8)


def check_batch(sb: int, red: int, d: int) -> None:
    """sb > 1 (a scatter slice of sb groups of 4-float reds per lane: every group's loads issued before its
    reds) needs red 4 and D a multiple of the slice."""
    if sb not in SCATTER_BATCHES or (sb > 1 and (red != 4 or d % (slice_of(red) * sb))):
        raise ValueError(f"kmeans (wide): sb (scatter batch) one of {SCATTER_BATCHES}, above 1 with red 4 and D a "
                         f"multiple of {slice_of(4)} sb (got sb={sb}, red={red}, D={d})")


COPIES = (1, 2, 4, 8)


def copy_stride(rows: str, per_cta: str) -> str:
    """Rows per copy of the sums (an index expression): `rows` clusters rounded up to the finalize's rows per
    CTA, so that no finalize CTA's block reaches into the next copy (its zeroing would race with that copy's
    reader). `copy_rows` is the same count on the host."""
    return f"cdiv({rows}, {per_cta}) * {per_cta}"


COPY_ROWS = copy_stride("B * K", "FR")      # in the assignment kernels (FR = finalize_rows(D))


def sums_row(copies: int) -> str:
    """The first row of the sums a CTA adds into: its batch's block of copy bid.x % P (copies of the sums
    spread a cluster's adds over P addresses: with few clusters, the same-address reds serialize in L2)."""
    return "b * K" if copies == 1 else f"(bid.x % P) * ({COPY_ROWS}) + b * K"


def copy_rows(r: int, d: int, copies: int) -> int:
    """Rows of the sums workspace for r = B K clusters at D = d (copy_stride per copy)."""
    if copies == 1:
        return r
    fr = finalize_rows(d)
    return copies * (-(-r // fr) * fr)


def check_copies(copies: int) -> None:
    if copies not in COPIES:
        raise ValueError(f"kmeans (wide): copies of the sums is one of {COPIES} (got {copies})")


def check_red(red: int, arch: str, lv: bool = False) -> None:
    if red not in (1, 2, 4) or (red > 1 and arch != "sm_90a"):
        raise ValueError(f"kmeans (wide): red is 1, or 2 / 4 floats per vector red on sm_90a (got {red} on {arch})")
    if lv and red != 4:
        raise ValueError(f"kmeans (wide): lv (the scatter's 4 halves per load) goes with red 4 (got red {red})")


def _scatter_points(r, d: int, red: int, copies: int, lv: bool = False) -> None:
    """WS[a_j] += X[j], WC[a_j] += 1 for the warp's 16 points (skipping rows past N): slices of 8 dims
    (red 4: 16), a quad's 4 lanes adding into one row's consecutive floats per instruction."""
    w = slice_of(red)
    # a rolled loop over the slices: unrolled, the compiler hoists the loads of all of them (D = 1024 spilled)
    with r.for_("sc", 0, d // w, id="scatter_slices"):
        r.add("scatter_add", id="sum_points", index=tile("bi"), src=tile("sX", ["wm0", f"sc * {w}"], [16, w]),
              dst=tile("WS", [sums_row(copies), f"sc * {w}"], [K_MAX, w]), row0="n0 + wm0", row_limit="N",
              vec=red, load_vec=lv)
    count_points(r, "bi", copies, "n0 + wm0")


def kmeans_wide_assign(d: int = 128, bm: int = 128, bn: int = 64, dc: int = 0, stages: int = 3,
                       arch: str = "sm_80", red: int = 1, copies: int = 1, lv: bool = False):
    """Assignment (streamed centroid tiles, D in chunks) + global scatter of the sums; grid
    (cdiv(N, BM), B), a CTA per point tile. dc = 0: `chunk_of(d)`; red: floats per global red (2 / 4:
    vector reds, sm_90a); copies: of the sums (sums_row); lv: the scatter reads its points 4 halves per load
    (scatter_add load_vec, red 4)."""
    check_d(d)
    check_red(red, arch, lv)
    check_copies(copies)
    dc = dc or chunk_of(d)
    if bm % 16 or not 16 <= bm <= 256 or bn % 16 or not 16 <= bn <= 128 or dc not in (32, 64, 128) or stages < 2:
        raise ValueError(f"kmeans_wide_assign: bm a multiple of 16 in [16, 256], bn a multiple of 16 in [16, 128], "
                         f"dc in 32 / 64 / 128, stages >= 2 (got bm={bm}, bn={bn}, dc={dc}, stages={stages})")
    smem = assign_smem_bytes(d, bm, bn, dc, stages)
    if smem > SMEM_BYTES.get(arch, SMEM_BYTES["sm_80"]):
        raise ValueError(f"kmeans_wide_assign: {smem} B of shared memory at d={d}, bm={bm}, bn={bn}, dc={dc}, "
                         f"stages={stages} exceed {arch}'s {SMEM_BYTES.get(arch, SMEM_BYTES['sm_80'])}")
    nch = padded(d, dc) // dc
    warps = bm // 16
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_c{dc}_s{stages}" + suffix(red, copies, lv), arch=arch, grid=["cdiv(N, BM)", "B"],
                       threads=32 * warps,
                       note="wide k-means assignment: streamed centroid chunks, mma.sync argmin, global scatter")
    kb.const(BM=bm, BN=bn, D=d, DC=dc, NCH=nch)
    _declare_assign(kb, d, bm, bn, dc, stages, copies)
    steps = "cdiv(K, BN) * NCH"
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("n0", "bid.x * BM")
        r.let("wm0", "role_warp * 16")
        # rows past the batch (the next batch's points or zero fill) are scored and never stored / added
        r.copy("cp_async", tile("X", ["b * N + n0", 0], [bm, padded(d, dc)]), tile("sX"), oob="zfill",
               id="load_points")
        for s in range(stages - 1):     # the ring's first stages - 1 steps, a commit group each
            with r.if_(f"{s} < {steps}"):
                _load_step(r, str(s), bn, dc, stages)
            r.sync("cp_async_commit")
        r.fill("bv", BIG)
        r.fill("bi", -1)
        with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
            r.fill("acc", 0.0)
            for ch in range(nch):
                g = f"t * NCH + {ch}"
                r.sync("cp_async_wait", n=stages - 2)   # step g has landed (this thread's copies)
                r.sync("syncthreads")                   # everyone's copies; step g - 1's slot is free
                with r.if_(f"{g} + {stages - 1} < {steps}"):
                    _load_step(r, f"{g} + {stages - 1}", bn, dc, stages)
                r.sync("cp_async_commit")
                for kk in range(dc // 16):
                    r.ldmatrix(tile("sX", ["wm0", ch * dc + kk * 16], [16, 16]), tile("fa"))
                    r.ldmatrix(tile("sC", [0, kk * 16], [bn, 16], slot=f"({g}) % {stages}"), tile("fb"))
                    r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
            # columns past K (the next batch's centroids or zero fill) are skipped by limit
            r.add("topk", id="argmin", kind="min", k=1, src=tile("acc"), vals=tile("bv"), idx=tile("bi"),
                  col="t * BN", limit="K", scale=-2.0, col_bias=tile("cn", [0, 0], [1, bn], slot=f"t % {stages}"))
        r.sync("cp_async_wait", n=0)
        r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
        r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
        _scatter_points(r, d, red, copies, lv)
    return kb.build()


def finalize_threads(d: int) -> int:
    """The finalize's CTA: a row's dims dealt evenly over its threads (the counts' row broadcast needs every
    thread to hold whole columns of each row)."""
    return next(t for t in (256, 128, 64, 32) if d % t == 0)


def finalize_rows(d: int) -> int:
    """Centroid rows per finalize CTA: about 16 elements per thread and buffer."""
    return max(1, 16 * finalize_threads(d) // d)


def kmeans_wide_finalize(d: int = 128, arch: str = "sm_80", copies: int = 1):
    """Cnew = (sum of the WS copies) / (sum of the WC copies) per row (a count of 0: the row of C), C16 = Cnew
    in fp16; every copy of WS and WC left zeroed."""
    check_d(d)
    check_copies(copies)
    rows, threads = finalize_rows(d), finalize_threads(d)
    kb = KernelBuilder(f"kmeans_wide_finalize_d{d}" + (f"_p{copies}" if copies > 1 else ""), arch=arch,
                       grid=["cdiv(R, RB)"], threads=threads,
                       note="wide k-means update: mean of each cluster's points, fp32 + fp16 copy; zeroes the sums")
    kb.const(D=d, RB=rows, P=copies)
    kb.scalar("R", min=1)
    kb.tensor("C", "f16", ["R", "D"])
    rows_all = f"P * ({copy_stride('R', 'RB')})" if copies > 1 else "R"
    kb.tensor("WS", "f32", [rows_all, "D"], access="readwrite")
    kb.tensor("WC", "f32", [rows_all, 1], access="readwrite")
    kb.tensor("Cnew", "f32", ["R", "D"], access="write")
    kb.tensor("C16", "f16", ["R", "D"], access="write")
    kb.buffer("fs", "reg", "f32", [rows, d], layout="blocked", vec=1, scope="cta")
    kb.buffer("fo", "reg", "f32", [rows, d], layout="blocked", vec=1, scope="cta")
    kb.buffer("fc", "reg", "f32", [rows, 1])
    if copies > 1:
        kb.buffer("ft", "reg", "f32", [rows, d], layout="blocked", vec=1, scope="cta")
        kb.buffer("ftc", "reg", "f32", [rows, 1])
    with kb.role("main", warps=(0, threads // 32)) as r:
        r.let("k0", "bid.x * RB")
        if copies > 1:
            r.let("rp", copy_stride("R", "RB"))
        r.ldg(tile("WS", ["k0", 0], [rows, d]), tile("fs"), oob="zfill", vec_bytes=4)
        r.ldg(tile("WC", ["k0", 0], [rows, 1]), tile("fc"), oob="zfill", vec_bytes=4)
        for c in range(1, copies):
            r.ldg(tile("WS", [f"{c} * rp + k0", 0], [rows, d]), tile("ft"), oob="zfill", vec_bytes=4)
            r.ldg(tile("WC", [f"{c} * rp + k0", 0], [rows, 1]), tile("ftc"), oob="zfill", vec_bytes=4)
            r.map("fs", "fs + ft")
            r.map("fc", "fc + ftc")
        r.ldg(tile("C", ["k0", 0], [rows, d]), tile("fo"), oob="zfill", vec_bytes=2)
        r.map("fs", "select(fc > 0.5, fs * recip(max(fc, 1)), fo)", id="centroid_means")
        r.stg(tile("fs"), tile("Cnew", ["k0", 0], [rows, d]), oob="mask", vec_bytes=4)
        r.stg(tile("fs"), tile("C16", ["k0", 0], [rows, d]), oob="mask", vec_bytes=2)
        # every thread reads every count of the block (fc is per thread): a fast warp must not zero WC first
        r.sync("syncthreads")
        r.fill("fs", 0.0)
        r.fill("fc", 0.0)
        for c in range(copies):
            row = f"{c} * rp + k0" if c else "k0"
            r.stg(tile("fs"), tile("WS", [row, 0], [rows, d]), oob="mask", vec_bytes=4, id="zero_sums" if c == 0 else None)
            r.stg(tile("fc"), tile("WC", [row, 0], [rows, 1]), oob="mask", vec_bytes=4,
                  id="zero_counts" if c == 0 else None)
    return kb.build()


ATOM = 64   # f16 elements per 128-byte swizzle row: the wgmma form's D chunk


def kmeans_wide_assign_wgmma(d: int = 128, bm: int = 128, bn: int = 128, stages: int = 4, minb: int = 1,
                             arch: str = "sm_90a", red: int = 1, copies: int = 1, lv: bool = False,
                             acc2: bool = False, sorted_sums: bool = False):
    """The assignment of `kmeans_wide_assign` on Hopper's warpgroup MMA: the point tile is stored as D / 64
    swizzle atoms (atom a: dims [64 a, 64 a + 64) of the bm points; D zero-filled to a multiple of 64) and
    each ring step stages one atom of a centroid tile [bn, 64]; per step every warpgroup issues one
    m64 n{bn} k64 wgmma chain of its 64 points into a [64, bn] accumulator, both operands read from shared
    memory; within a tile one chain stays in flight across the next step's barrier (stages >= 3: the ring then
    loads stages - 2 steps ahead, into a slot whose chain has retired). The argmin and scatter are the
    mma.sync form's (the scatter reads the points from the swizzled tile). minb: CTAs per SM the registers
    and shared memory must allow (2: one CTA's scatter and argmin run under the other's wgmma). red, copies, lv:
    as in `kmeans_wide_assign`. acc2: two distance accumulators, a tile's argmin under the next tile's first
    chain (`_centroid_pairs`; stages >= 3). sorted_sums: only the counts, the sums left to a counting sort
    (tasks.kmeans.sorted_sums)."""
    check_d(d)
    check_red(red, arch, lv)
    check_copies(copies)
    check_sorted_sums(sorted_sums, copies)
    if minb not in (1, 2) or minb * assign_smem_bytes(d, bm, bn, ATOM, stages, "wgmma") > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_wgmma: minb is 1 or 2, and minb CTAs' shared memory fits sm_90a "
                         f"(got minb={minb} at d={d}, bm={bm}, bn={bn}, stages={stages})")
    if arch != "sm_90a":
        raise ValueError("kmeans_wide_assign_wgmma needs sm_90a (wgmma)")
    if bm % 64 or not 64 <= bm <= 256 or bn % 16 or not 16 <= bn <= 256 or stages < 2:
        raise ValueError(f"kmeans_wide_assign_wgmma: bm a multiple of 64 up to 256, bn a multiple of 16 up to 256, "
                         f"stages >= 2 (got bm={bm}, bn={bn}, stages={stages})")
    smem = assign_smem_bytes(d, bm, bn, ATOM, stages, "wgmma")
    if smem > SMEM_BYTES["sm_90a"]:
        raise ValueError(f"kmeans_wide_assign_wgmma: {smem} B of shared memory at d={d}, bm={bm}, bn={bn}, "
                         f"stages={stages} exceed sm_90a's {SMEM_BYTES['sm_90a']}")
    if acc2 and stages < 3:
        raise ValueError(f"kmeans_wide_assign_wgmma: acc2 keeps a chain in flight at every step: stages >= 3 "
                         f"(got {stages})")
    atoms = padded(d, ATOM) // ATOM
    warps = bm // 16
    kb = KernelBuilder(f"kmeans_wide_d{d}_{bm}x{bn}_s{stages}_wg" + (f"_b{minb}" if minb > 1 else "")
                       + ("_a2" if acc2 else "") + suffix(red, copies, lv, sorted_sums), arch=arch,
                       grid=["cdiv(N, BM)", "B"], threads=32 * warps, min_blocks_per_sm=minb,
                       note="wide k-means assignment: streamed centroid atoms, wgmma argmin, global scatter")
    kb.const(BM=bm, BN=bn, D=d, DC=ATOM, NCH=atoms)
    _declare_assign_wgmma(kb, d, bm, bn, atoms, stages, copies, 2 if acc2 else 1)
    # acc2: the tiles in pairs, the second of a pair past K scored against zero-filled centroids and masked
    steps = "cdiv(K, 2 * BN) * 2 * NCH" if acc2 else "cdiv(K, BN) * NCH"
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("n0", "bid.x * BM")
        r.let("wm0", "role_warp * 16")
        for a in range(atoms):   # rows past the batch are scored and never stored / added
            r.copy("cp_async", tile("X", ["b * N + n0", a * ATOM], [bm, ATOM]), tile("sX", [a * bm, 0], [bm, ATOM]),
                   oob="zfill", id="load_points" if a == 0 else None)
        # lag: wgmma groups left in flight at the end of a step within a tile (the next step's barrier and issue
        # then run under it); the ring loads `ahead` steps ahead into the slot of step g - 1 - lag, retired
        lag = 1 if stages >= 3 else 0
        ahead = stages - 1 - lag
        for s in range(ahead):
            with r.if_(f"{s} < {steps}"):
                _load_step(r, str(s), bn, ATOM, stages)
            r.sync("cp_async_commit")
        r.fill("bv", BIG)
        r.fill("bi", -1)
        if acc2:
            _centroid_pairs(r, atoms, bm, bn, stages, ahead, steps)
        else:
            _centroid_tiles(r, atoms, bm, bn, stages, lag, ahead, steps)
        r.sync("cp_async_wait", n=0)
        r.add("topk_merge", kind="min", vals=tile("bv"), idx=tile("bi"))
        r.stg(tile("bi"), tile("A", ["b", "n0 + wm0"], [1, 16]), oob="mask", vec_bytes=4, id="store_assign")
        if sorted_sums:
            count_points(r, "bi", copies, "n0 + wm0")
        else:
            _scatter_points_atoms(r, d, bm, red, copies, lv)
    return kb.build()


def await_and_refill(r, g: str, ahead: int, steps: str, load) -> None:
    """The cp.async ring's step g on wgmma: wait until its slot has landed and is visible to the tensor cores,
    then refill the ring `ahead` steps on (load(step)), the slot of a step whose chain has retired."""
    r.sync("cp_async_wait", n=ahead - 1)    # step g has landed (this thread's copies) ...
    r.fence("proxy_async")                  # ... visible to the tensor cores' async proxy
    r.sync("syncthreads")                   # everyone's copies; step g - 1 - lag's wgmma has retired
    with r.if_(f"{g} + {ahead} < {steps}"):
        load(f"{g} + {ahead}")
    r.sync("cp_async_commit")


def _ring_step(r, g: str, a: int, bm: int, bn: int, stages: int, ahead: int, steps: str, acc: str,
               wait: int) -> None:
    """Ring step g (atom a of a centroid tile): wait for its slot, refill the ring `ahead` steps on, issue the
    warpgroup's m64 n{bn} k64 chain into `acc` and leave `wait` chains in flight."""
    await_and_refill(r, g, ahead, steps, lambda step: _load_step(r, step, bn, ATOM, stages))
    r.sync("wgmma_fence")
    r.wgmma([64, bn, 16], tile("sX", [f"{a * bm} + 64 * wg", 0], [64, ATOM]),
            tile("sC", [0, 0], [bn, ATOM], slot=f"({g}) % {stages}"), tile(acc), accumulate=a > 0,
            id="distances" if a == 0 and acc in ("acc", "acc0") else None)
    r.sync("wgmma_commit")
    r.sync("wgmma_wait", n=wait)


def argmin_tile(r, acc: str, t: str, bn: int, stages: int, first: bool = True) -> None:
    """The running argmin over centroid tile t's distances in `acc` (norms from slot t % stages)."""
    t = t if t.isidentifier() else f"({t})"
    r.add("topk", id="argmin" if first else None, kind="min", k=1, src=tile(acc), vals=tile("bv"), idx=tile("bi"),
          col=f"{t} * BN", limit="K", scale=-2.0, col_bias=tile("cn", [0, 0], [1, bn], slot=f"{t} % {stages}"))


def _centroid_tiles(r, atoms: int, bm: int, bn: int, stages: int, lag: int, ahead: int, steps: str) -> None:
    """One accumulator: a tile's chains, then (nothing in flight) its argmin."""
    with r.for_("t", 0, "cdiv(K, BN)", id="centroid_loop"):
        for a in range(atoms):      # the tile's last step: the argmin reads acc
            _ring_step(r, f"t * NCH + {a}", a, bm, bn, stages, ahead, steps, "acc", lag if a + 1 < atoms else 0)
        argmin_tile(r, "acc", "t", bn, stages)


def _centroid_pairs(r, atoms: int, bm: int, bn: int, stages: int, ahead: int, steps: str) -> None:
    """Two accumulators, tiles 2u (acc0) and 2u + 1 (acc1) per iteration: tile 2u's argmin runs after tile
    2u + 1's first chain is issued (its wait leaves that chain in flight), under it; tile 2u + 1's after the
    pair's last wait. No chain crosses the loop's back edge and no wgmma is conditional (ptxas keeps them
    asynchronous: W-BACKEND-WGMMA-SERIAL)."""
    with r.for_("u", 0, "cdiv(K, 2 * BN)", id="centroid_loop"):
        for h in (0, 1):
            for a in range(atoms):
                last = h == 1 and a + 1 == atoms
                _ring_step(r, f"(2 * u + {h}) * NCH + {a}", a, bm, bn, stages, ahead, steps, f"acc{h}",
                           0 if last else 1)
                if h == 1 and a == 0:
                    argmin_tile(r, "acc0", "2 * u", bn, stages)
        argmin_tile(r, "acc1", "2 * u + 1", bn, stages, first=False)


def _scatter_points_atoms(r, d: int, bm: int, red: int, copies: int, lv: bool = False) -> None:
    """`_scatter_points` from the swizzled point tile: atom by atom, each a rolled loop over its slices
    (the sums' columns 64 a + w sc)."""
    w = slice_of(red)
    for a in range(padded(d, ATOM) // ATOM):
        with r.for_(f"sc{a}", 0, min(ATOM, d - a * ATOM) // w, id="scatter_slices" if a == 0 else None):
            r.add("scatter_add", id="sum_points" if a == 0 else None, index=tile("bi"),
                  src=tile("sX", [f"{a * bm} + wm0", f"sc{a} * {w}"], [16, w]),
                  dst=tile("WS", [sums_row(copies), f"{a * ATOM} + sc{a} * {w}"], [K_MAX, w]), row0="n0 + wm0",
                  row_limit="N", vec=red, load_vec=lv)
    count_points(r, "bi", copies, "n0 + wm0")


def _declare_assign_wgmma(kb, d: int, bm: int, bn: int, atoms: int, stages: int, copies: int,
                          accs: int = 1) -> None:
    _declare_assign_io(kb, d, copies)
    kb.buffer("sX", "smem", "f16", [atoms * bm, ATOM], layout="swizzle_128B")
    kb.buffer("sC", "smem", "f16", [bn, ATOM], layout="swizzle_128B", stages=stages)
    kb.buffer("cn", "smem", "f32", [1, bn], stages=stages)
    for name in (["acc"] if accs == 1 else ["acc0", "acc1"]):
        kb.buffer(name, "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")
    kb.buffer("bv", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    kb.buffer("bi", "reg", "i32", [16, 1], layout="mma_rows", scope="warp")
