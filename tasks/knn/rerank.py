"""Exact re-ranking of a kNN search's candidates (the library's `knn(..., rerank=True)`).

The search kernels score fp16 inputs on tensor cores, l2 as ||q||^2 + ||x||^2 - 2 q.x in fp32: right within
the rounding allowance the checks grant, but a near tie can come out in either order and the distances
carry the cancellation of that form. The re-ranking kernel takes the search's KC candidates per query (its
top KC by those scores, KC >= k), re-scores each in fp32 from the inputs in their own precision (f32 or
f16) -- l2 as the sum of squared differences, ip as the dot product -- and keeps the best k, ties to the
smaller index. A warp per query: lane j gathers candidate j's row (its index read at run time, `ld`, the
kernel trapping on one outside [0, M)), D / CH chunks of CH elements each; the scores meet in shared
memory and lane 0 selects the k best (per-thread `topk` over the KC scores with their indices).
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, tile

CH = 16          # elements per gathered chunk (64 bytes of f32, 32 of f16: whole vector loads)
WARPS = 4        # queries per CTA


def knn_rerank(kc: int, k: int, metric: str = "l2", d: int = 128, dtype: str = "f32", arch: str = "sm_80"):
    """[Q, KC] candidate indices CI -> the best k of them (I [Q, k] int32, Dist [Q, k] f32, best first) by
    exact fp32 scores from Xq [Q, D] / Xb [M, D] of dtype `dtype`."""
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric is 'l2' or 'ip', not {metric!r}")
    if not 1 <= k <= kc <= 32:
        raise ValueError(f"1 <= k <= kc <= 32 (a lane per candidate), got k={k}, kc={kc}")
    if dtype not in ("f32", "f16") or d % CH:
        raise ValueError(f"dtype f32 / f16 and D a multiple of {CH} (got {dtype}, D={d})")
    kind = "min" if metric == "l2" else "max"
    vec = 16       # a chunk is 64 (f32) or 32 (f16) bytes

    def words(n: int) -> int:   # the widest vector an [1, n] row of 4-byte words at a row pitch of n takes
        return 16 if n % 4 == 0 else 8 if n % 2 == 0 else 4
    kb = KernelBuilder(f"knn_rerank_{metric}_k{k}_c{kc}_d{d}_{dtype}", arch=arch, grid=["cdiv(Q, QW)"],
                       threads=32 * WARPS,
                       note=f"exact {metric} re-ranking: a warp per query, a lane per candidate, fp32 from {dtype}")
    kb.const(KC=kc, KK=k, D=d, CH=CH, QW=WARPS)
    kb.scalar("Q", min=1)
    kb.scalar("M", min=kc)
    kb.tensor("Xq", dtype, ["Q", "D"])
    kb.tensor("Xb", dtype, ["M", "D"])
    kb.tensor("CI", "i32", ["Q", "KC"])
    kb.tensor("I", "i32", ["Q", "KK"], access="write")
    kb.tensor("Dist", "f32", ["Q", "KK"], access="write")
    kb.buffer("ssc", "smem", "f32", [WARPS, 32])          # each warp's candidate scores
    for n, dt, shape in (("xr", dtype, [1, CH]), ("qr", dtype, [1, CH]), ("pr", "f32", [1, CH]),
                         ("ps", "f32", [1, 1]), ("acc", "f32", [1, 1]), ("pv", "f32", [1, kc]),
                         ("pi", "i32", [1, kc]), ("mv", "f32", [1, k]), ("mi", "i32", [1, k])):
        kb.buffer(n, "reg", dt, shape, layout="row_major", scope="thread")
    term = "(qr - xr) * (qr - xr)" if metric == "l2" else "qr * xr"
    with kb.role("main", warps=(0, WARPS)) as r:
        r.let("q", "bid.x * QW + role_warp")      # the warp's query (warp-uniform)
        with r.if_("q < Q"):
            with r.if_("lane < KC"):
                r.let("xi", "ld(CI, q * KC + min(lane, KC - 1), 0, M - 1)")     # candidate `lane`'s row
                r.fill("acc", 0.0)
                with r.for_("c", 0, "D / CH", id="chunks"):
                    r.ldg(tile("Xb", ["xi", "c * CH"], [1, CH]), tile("xr"), vec_bytes=vec, id="gather")
                    r.ldg(tile("Xq", ["q", "c * CH"], [1, CH]), tile("qr"), vec_bytes=vec)
                    r.map("pr", term)
                    r.reduce("sum", "pr", "ps")
                    r.map("acc", "acc + ps")
                r.sts(tile("acc"), tile("ssc", ["role_warp", "lane"], [1, 1]), vec_bytes=4)
            r.sync("syncwarp")
            with r.if_("lane == 0"):
                r.lds(tile("ssc", ["role_warp", 0], [1, kc]), tile("pv"), vec_bytes=16 if kc % 4 == 0 else 4)
                r.ldg(tile("CI", ["q", 0], [1, kc]), tile("pi"), vec_bytes=words(kc))
                r.fill("mv", 3e38 if kind == "min" else -3e38)
                r.fill("mi", -1)
                r.add("topk", kind=kind, k=k, src=tile("pv"), src_idx=tile("pi"), vals=tile("mv"), idx=tile("mi"),
                      id="select")
                r.stg(tile("mv"), tile("Dist", ["q", 0], [1, k]), vec_bytes=words(k))
                r.stg(tile("mi"), tile("I", ["q", 0], [1, k]), vec_bytes=words(k))
    return kb.build()


def rerank_candidates(k: int, M: int) -> int:
    """How many candidates the search returns for re-ranking: twice k, at least k + 8, at most 32 (a lane
    each) and M."""
    return min(32, M, max(2 * k, k + 8))
