"""The distance block of the large-k kNN: S = Xq Xb^T for a chunk of queries against the whole database
(fp16 in, fp32 out, mma.sync tensor cores, D looped in BK-wide steps), written to a workspace that
tasks/knn/select.py reads, and the squared row norms the l2 scores add (QN, XN).

Both read rows of DP columns (DP: D rounded up to 8, so every 16-byte cp.async chunk of a row is whole;
the library pads rows of other D with zero columns, which change no dot product or norm). Rows past the
tensor (the last query / database tile) and columns past DP are zero-filled, so the padded entries of
S and the norms are zeros the selection never reads as candidates (it stops at M).
"""
from cake_ir.builder import KernelBuilder, bar, tile

DIST_BM, DIST_BN = 128, 128   # S and the norms are padded to these tiles (the selection's shapes)


def knn_dist_tile(dp: int, bk: int = 32, stages: int = 4, norms: bool = False, bm: int = DIST_BM, arch: str = "sm_80"):
    """S [R, cdiv(M, BN) BN] = Xq [R, DP] Xb [M, DP]^T: the seed GEMM's tiling (4 warps of
    64 x 64, a `stages`-deep cp.async ring of 64-byte-swizzled k slices, ldmatrix + mma.sync m16n8k16).
    norms: the CTAs of the first query tile also sum the squared norms of their database rows from the staged
    slices into XN [1, cdiv(M, BN) BN] (the l2 scores' column terms, without a pass of their own over the
    database: the first query chunk's launch). bm = 32 (a few queries: a quarter of the padded rows' mma work):
    the 4 warps side by side along the database rows, 32 x 32 each."""
    bn = DIST_BN
    warps_m = 2 if bm == 128 else 1
    wm, wn = bm // warps_m, bn // (4 // warps_m)
    name = f"knn_dist_tile_d{dp}" + ("_xn" if norms else "") + (f"_m{bm}" if bm != DIST_BM else "")
    kb = KernelBuilder(name, arch=arch, grid=["cdiv(M, BN)", "cdiv(R, BM)"], threads=128,
                       note="fp32 dot products of a query chunk against the database (large-k kNN)")
    kb.const(BM=bm, BN=bn, BK=bk, NS=stages, WM=wm, WN=wn, DP=dp, KT=-(-dp // bk))
    kb.scalar("R", min=1)
    kb.scalar("M", min=1)
    kb.tensor("Xq", "f16", ["R", "DP"])
    kb.tensor("Xb", "f16", ["M", "DP"])
    kb.tensor("S", "f32", ["R", "cdiv(M, BN) * BN"], access="write")
    if norms:
        kb.tensor("XN", "f32", [1, "cdiv(M, BN) * BN"], access="write")
        kb.buffer("nb", "smem", "f32", [bn])
        kb.buffer("nr", "reg", "f32", [1, 1], layout="row_major", scope="thread")
    swz = {32: "swizzle_64B", 64: "swizzle_128B"}[bk]
    kb.buffer("sA", "smem", "f16", [bm, bk], layout=swz, stages=stages)
    kb.buffer("sB", "smem", "f16", [bn, bk], layout=swz, stages=stages)
    kb.buffer("fa", "reg", "f16", [wm, 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "f16", [wn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [wm, wn], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 4)) as r:
        r.let("m0", "bid.y * BM")
        r.let("n0", "bid.x * BN")
        r.let("wm0", f"(role_warp / {4 // warps_m}) * WM")
        r.let("wn0", f"(role_warp % {4 // warps_m}) * WN")
        r.fill("acc", 0.0)
        with r.for_("s", 0, "NS - 1", unroll=True, id="prefill"):
            r.copy("cp_async", tile("Xq", ["m0", "s * BK"], [bm, bk]), tile("sA", slot="s"), oob="zfill")
            r.copy("cp_async", tile("Xb", ["n0", "s * BK"], [bn, bk]), tile("sB", slot="s"), oob="zfill")
            r.sync("cp_async_commit")
        with r.for_("kt", 0, "KT", id="mainloop"):
            r.sync("cp_async_wait", n=stages - 2)
            r.sync("syncthreads")
            with r.if_("kt + NS - 1 < KT"):
                r.copy("cp_async", tile("Xq", ["m0", "(kt + NS - 1) * BK"], [bm, bk]),
                       tile("sA", slot="(kt + NS - 1) % NS"), oob="zfill")
                r.copy("cp_async", tile("Xb", ["n0", "(kt + NS - 1) * BK"], [bn, bk]),
                       tile("sB", slot="(kt + NS - 1) % NS"), oob="zfill")
            r.sync("cp_async_commit")
            if norms:   # row tid of the slice by thread tid, every step (the same thread accumulates its row)
                with r.if_("bid.y == 0"):
                    with r.if_("kt == 0"):
                        r.reduce("sum_sq", tile("sB", slot="kt % NS"), tile("nb"), id="db_norms_first")
                    with r.else_():
                        r.reduce("sum_sq", tile("sB", slot="kt % NS"), tile("nb"), accumulate=True, id="db_norms")
            with r.for_("kk", 0, bk // 16, unroll=True):
                r.ldmatrix(tile("sA", ["wm0", "kk * 16"], [wm, 16], slot="kt % NS"), tile("fa"))
                r.ldmatrix(tile("sB", ["wn0", "kk * 16"], [wn, 16], slot="kt % NS"), tile("fb"))
                r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
        r.sync("cp_async_wait", n=0)
        if norms:
            r.sync("syncthreads")
            with r.if_("bid.y == 0"):
                r.lds(tile("nb", ["tid"], [1]), tile("nr"), vec_bytes=4)
                r.stg(tile("nr"), tile("XN", [0, "n0 + tid"], [1, 1]), oob="mask", vec_bytes=4, id="store_norms")
        r.stg(tile("acc"), tile("S", ["m0 + wm0", "n0 + wn0"], [wm, wn]), oob="mask", vec_bytes=8, id="store_dots")
    return kb.build()


def knn_row_norms(dp: int, src: str = "Xb", n: str = "M", dst: str = "XN", rows: int = 128, arch: str = "sm_80"):
    """dst [1, cdiv(n, 128) 128] = the squared norms of src's rows [n, DP], a row per thread, summed over
    64-column slices staged in smem (rows past n: zero)."""
    bc = 64
    kb = KernelBuilder(f"knn_{src.lower()}_sqnorms_d{dp}", arch=arch, grid=[f"cdiv({n}, BR)"], threads=rows,
                       note=f"squared norms of the rows of {src} (large-k kNN scores)")
    kb.const(BR=rows, DP=dp, BC=bc, NC=-(-dp // bc))
    kb.scalar(n, min=1)
    kb.tensor(src, "f16", [n, "DP"])
    kb.tensor(dst, "f32", [1, f"cdiv({n}, 128) * 128"], access="write")
    kb.buffer("sX", "smem", "f16", [rows, bc], pad=8)
    kb.buffer("nv", "smem", "f32", [rows])
    kb.buffer("nr", "reg", "f32", [1, 1], layout="row_major", scope="thread")
    with kb.role("main", warps=(0, rows // 32)) as r:
        r.let("m0", "bid.x * BR")
        with r.for_("c", 0, "NC", id="slices"):
            r.copy("cp_async", tile(src, ["m0", "c * BC"], [rows, bc]), tile("sX"), oob="zfill", id="load_rows")
            r.sync("cp_async_commit")
            r.sync("cp_async_wait", n=0)
            r.sync("syncthreads")
            with r.if_("c == 0"):
                r.reduce("sum_sq", tile("sX"), tile("nv"), id="first_slice")
            with r.else_():
                r.reduce("sum_sq", tile("sX"), tile("nv"), accumulate=True, id="next_slice")
            r.sync("syncthreads")
        r.lds(tile("nv", ["tid"], [1]), tile("nr"), vec_bytes=4)
        r.stg(tile("nr"), tile(dst, [0, "m0 + tid"], [1, 1]), oob="mask", vec_bytes=4, id="store_norms")
    return kb.build()


def knn_pad_rows(d: int, src: str = "X", dst: str = "XP", arch: str = "sm_80"):
    """dst [N, DP] = src [N, d] with zero columns d..DP (DP = d rounded up to 8): rows of any d become rows of
    whole 16-byte chunks for the distance tile's and the norms' cp.async. An element per thread, a warp per
    32 columns of a row."""
    dp = -(-d // 8) * 8
    kb = KernelBuilder(f"knn_pad_rows_d{d}", arch=arch, grid=["cdiv(N, 8)", "cdiv(DP, 32)"], threads=256,
                       note=f"rows of {d} fp16 values padded with zeros to {dp}")
    kb.const(D=d, DP=dp)
    kb.scalar("N", min=1)
    kb.tensor(src, "f16", ["N", "D"])
    kb.tensor(dst, "f16", ["N", "DP"], access="write")
    kb.buffer("v", "reg", "f16", [1, 1], layout="row_major", scope="thread")
    with kb.role("main", warps=(0, 8)) as r:   # warp w: 32 columns of row bid.x * 8 + w (no flat index: N DP >= 2^31)
        r.let("rr", "bid.x * 8 + tid / 32")
        r.let("cc", "bid.y * 32 + tid % 32")
        r.ldg(tile(src, ["rr", "cc"], [1, 1]), tile("v"), oob="zfill", vec_bytes=2, id="load_elem")
        r.stg(tile("v"), tile(dst, ["rr", "cc"], [1, 1]), oob="mask", vec_bytes=2, id="store_elem")
    return kb.build()


def knn_dist_tile_wgmma(dp: int, bn: int = 128, stages: int = 4, arch: str = "sm_90a"):
    """The same S on Hopper (DP a multiple of 64): the seed wgmma GEMM's pipeline (a TMA producer warp fills a
    `stages`-deep mbarrier ring of 128-byte-swizzled [rows, 64] k slices; two consumer warpgroups own 64 query
    rows each, wgmma m64nBNk16 into registers). TMA zero-fills the rows past R and M."""
    bm, bk = DIST_BM, 64
    if dp % bk:
        raise ValueError("the wgmma distance tile reads whole 64-column k slices (DP % 64 == 0)")
    kb = KernelBuilder(f"knn_dist_wgmma_d{dp}_n{bn}", arch="sm_90a", grid=["cdiv(M, BN)", "cdiv(R, BM)"], threads=384,
                       note="fp32 dot products of a query chunk against the database on wgmma (large-k kNN)")
    kb.const(BM=bm, BN=bn, BK=bk, NS=stages, DP=dp, KT=dp // bk)
    kb.scalar("R", min=1)
    kb.scalar("M", min=1)
    kb.tensor("Xq", "f16", ["R", "DP"], tma={"box": [bm, bk], "swizzle": "128B"})
    kb.tensor("Xb", "f16", ["M", "DP"], tma={"box": [bn, bk], "swizzle": "128B"})
    kb.tensor("S", "f32", ["R", "cdiv(M, BN) * BN"], access="write")
    kb.buffer("sA", "smem", "f16", [bm, bk], layout="swizzle_128B", stages=stages)
    kb.buffer("sB", "smem", "f16", [bn, bk], layout="swizzle_128B", stages=stages)
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup", role="consumer")
    kb.pipeline("ab", stages=stages, mechanism="tma", producer="producer", consumers=["consumer"], buffers=["sA", "sB"])
    with kb.role("producer", warps=(0, 4), regs=40) as r:
        with r.if_("role_warp == 0 && elect_one()"):
            with r.for_("kt", 0, "KT", id="load_loop"):
                r.pipe("acquire", "ab", "kt")
                r.copy("tma_load", tile("Xq", ["bid.y * BM", "kt * BK"], [bm, bk]), tile("sA", slot="kt % NS"),
                       barrier=bar("ab_full", "kt % NS"), scope="thread", id="tma_queries")
                r.copy("tma_load", tile("Xb", ["bid.x * BN", "kt * BK"], [bn, bk]), tile("sB", slot="kt % NS"),
                       barrier=bar("ab_full", "kt % NS"), scope="thread", id="tma_database")
                r.pipe("commit", "ab", "kt")
    with kb.role("consumer", warps=(4, 8), regs=232) as r:
        with r.for_("kt", 0, "KT", id="mma_loop"):
            r.pipe("wait", "ab", "kt")
            r.sync("wgmma_fence")
            r.wgmma([64, bn, 16], tile("sA", ["64 * wg", 0], [64, bk], slot="kt % NS"),
                    tile("sB", [0, 0], [bn, bk], slot="kt % NS"), tile("acc"), accumulate="kt > 0", id="mma")
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=1)        # this step's wgmma stays in flight; the previous one's slot is free
            with r.if_("kt > 0"):
                r.pipe("release", "ab", "kt - 1")
        r.sync("wgmma_wait", n=0)
        r.stg(tile("acc"), tile("S", ["bid.y * BM + 64 * wg", "bid.x * BN"], [64, bn]), oob="mask", vec_bytes=8,
              id="store_dots")
    return kb.build()
