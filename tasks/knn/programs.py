"""Seed programs for exact kNN: a distance GEMM on tensor cores (mma.sync, sm_80+) whose epilogue keeps
a running top-k per query in registers (threshold test, sorted insertion), so the Q x M distance matrix
is never written. `python -m tasks.export_seeds` writes them to seeds/*.json."""
from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, tile

BIG = 3.0e38   # list sentinel: worse than any finite score


def knn_fused(metric: str = "l2", k: int = 10, d: int = 128, bq: int = 64, bn: int = 64, arch: str = "sm_80"):
    """One CTA per block of `bq` queries streams the whole database in `bn`-row tiles (cp.async double
    buffer). Each warp owns 16 queries, keeps their A fragments (all of D) in registers, computes a
    [16, bn] score tile with mma.sync and folds it into per-lane top-k lists; the 4 lanes of each
    quad merge at the end. L2 scores are ||q||^2 + ||x||^2 - 2 q.x (squared norms from smem rows,
    computed as the tiles arrive); inner product keeps the k largest q.x."""
    warps = bq // 16
    l2 = metric == "l2"
    kb = KernelBuilder(f"knn_{metric}_k{k}_d{d}_{bq}x{bn}", arch=arch, grid=["cdiv(Q, BQ)"], threads=32 * warps,
                       note=f"exact kNN ({metric}), top-{k} fused into the mma.sync distance GEMM")
    kb.const(BQ=bq, BN=bn, D=d, KK=k)
    kb.scalar("Q", min=1)
    kb.scalar("M", min=k)
    kb.tensor("Xq", "f16", ["Q", "D"])
    kb.tensor("Xb", "f16", ["M", "D"])
    kb.tensor("I", "i32", ["Q", "KK"], access="write")
    kb.tensor("Dist", "f32", ["Q", "KK"], access="write")
    kb.buffer("sQ", "smem", "f16", [bq, d], pad=8)
    kb.buffer("sB", "smem", "f16", [bn, d], pad=8, stages=2)
    if l2:
        kb.buffer("qn", "smem", "f32", [bq])
        kb.buffer("cn", "smem", "f32", [bn])
    kb.buffer("fa", "reg", "f16", [16, d], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "f16", [bn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, bn], layout="mma_acc", scope="warp")
    kb.buffer("tv", "reg", "f32", [16, k], layout="mma_rows", scope="warp")
    kb.buffer("ti", "reg", "i32", [16, k], layout="mma_rows", scope="warp")
    kind = "min" if l2 else "max"
    with kb.role("main", warps=(0, warps)) as r:
        r.let("q0", "bid.x * BQ")
        r.let("wq0", "role_warp * 16")
        r.copy("cp_async", tile("Xq", ["q0", 0], [bq, d]), tile("sQ"), oob="zfill", id="load_queries")
        r.copy("cp_async", tile("Xb", [0, 0], [bn, d]), tile("sB", slot=0), oob="zfill")
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.sync("syncthreads")
        r.ldmatrix(tile("sQ", ["wq0", 0], [16, d]), tile("fa"), id="query_fragments")
        if l2:
            r.reduce("sum_sq", tile("sQ"), tile("qn"), id="query_norms")
        r.fill("tv", -BIG if not l2 else BIG)
        r.fill("ti", -1)
        with r.for_("t", 0, "cdiv(M, BN)", id="db_loop"):
            r.sync("cp_async_wait", n=0)
            r.sync("syncthreads")
            with r.if_("t + 1 < cdiv(M, BN)"):
                r.copy("cp_async", tile("Xb", ["(t + 1) * BN", 0], [bn, d]), tile("sB", slot="(t + 1) % 2"),
                       oob="zfill", id="prefetch")
            r.sync("cp_async_commit")
            if l2:
                r.reduce("sum_sq", tile("sB", slot="t % 2"), tile("cn"), id="db_norms")
                r.sync("syncthreads")
            r.fill("acc", 0.0)
            for kk in range(d // 16):
                r.ldmatrix(tile("sB", [0, kk * 16], [bn, 16], slot="t % 2"), tile("fb"))
                r.mma_sync(tile("fa", [0, kk * 16], [16, 16]), tile("fb"), tile("acc"))
            topk = dict(kind=kind, k=k, src=tile("acc"), vals=tile("tv"), idx=tile("ti"), col="t * BN", limit="M")
            if l2:
                topk.update(scale=-2.0, row_bias=tile("qn", ["wq0"], [16]), col_bias=tile("cn"))
            r.add("topk", id="select", **topk)
        r.add("topk_merge", kind=kind, vals=tile("tv"), idx=tile("ti"), id="merge")
        r.stg(tile("tv"), tile("Dist", ["q0 + wq0", 0], [16, k]), oob="mask", vec_bytes=4, id="store_dist")
        r.stg(tile("ti"), tile("I", ["q0 + wq0", 0], [16, k]), oob="mask", vec_bytes=4, id="store_idx")
    return kb.build()


SEEDS = {"knn_l2_mma_sm80": lambda: knn_fused("l2")}   # the inner-product seed is tasks/knn_ip

FAMILIES = {
    "knn_l2_mma_sm80": {
        "make": knn_fused,
        "defaults": {**signature_defaults(knn_fused), "metric": "l2"},
        "space": {"bq": [32, 64, 128], "bn": [32, 64, 128], "k": [1, 10, 32, 64], "d": [64, 128]},
        "check": lambda p: p["bq"] % 16 == 0 and p["bn"] % 16 == 0,
        "tactics": {"retile": ["bq", "bn"]},
    },
}
