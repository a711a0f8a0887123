"""Seed GEMM programs. Convention: C[M,N] = A[M,K] * B[N,K]^T, bf16 in, fp32 accumulate, bf16 out."""
from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, bar, tile


def gemm_mma_sm80(bm=128, bn=128, bk=32, stages=4, warps_m=2, warps_n=2):
    """Ampere-style: one role of 4 warps (64x64 warp tiles; the best of 16 mma.sync variants measured on the H200), a multi-stage cp.async ring (commit/wait_group +
    __syncthreads), ldmatrix from 64B-swizzled tiles, mma.sync m16n8k16."""
    wm, wn = bm // warps_m, bn // warps_n
    warps = warps_m * warps_n
    kb = KernelBuilder(f"gemm_mma_{bm}x{bn}x{bk}_s{stages}", arch="sm_80", grid=["N / BN", "M / BM"],
                       threads=32 * warps, note="cp.async multistage + mma.sync GEMM")
    kb.const(BM=bm, BN=bn, BK=bk, S=stages, WM=wm, WN=wn)
    kb.scalar("M", min=bm, divisible_by=bm)
    kb.scalar("N", min=bn, divisible_by=bn)
    kb.scalar("K", min=bk * stages, divisible_by=bk)
    kb.tensor("A", "bf16", ["M", "K"])
    kb.tensor("B", "bf16", ["N", "K"])
    kb.tensor("C", "bf16", ["M", "N"], access="write")
    swz = {32: "swizzle_64B", 64: "swizzle_128B"}[bk]
    kb.buffer("sA", "smem", "bf16", [bm, bk], layout=swz, stages=stages)
    kb.buffer("sB", "smem", "bf16", [bn, bk], layout=swz, stages=stages)
    kb.buffer("fa", "reg", "bf16", [wm, 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "bf16", [wn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [wm, wn], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, warps)) as r:
        r.let("m0", "bid.y * BM")
        r.let("n0", "bid.x * BN")
        r.let("wm0", f"(role_warp / {warps_n}) * WM")
        r.let("wn0", f"(role_warp % {warps_n}) * WN")
        r.fill("acc", 0.0)
        with r.for_("s", 0, "S - 1", unroll=True, id="prefill"):
            r.copy("cp_async", tile("A", ["m0", "s * BK"], [bm, bk]), tile("sA", slot="s"), vec_bytes=16)
            r.copy("cp_async", tile("B", ["n0", "s * BK"], [bn, bk]), tile("sB", slot="s"), vec_bytes=16)
            r.sync("cp_async_commit")
        with r.for_("kt", 0, "K / BK", id="mainloop"):
            r.sync("cp_async_wait", n=stages - 2)
            r.sync("syncthreads")
            with r.if_(f"kt + S - 1 < K / BK"):
                r.copy("cp_async", tile("A", ["m0", "(kt + S - 1) * BK"], [bm, bk]),
                       tile("sA", slot="(kt + S - 1) % S"), vec_bytes=16)
                r.copy("cp_async", tile("B", ["n0", "(kt + S - 1) * BK"], [bn, bk]),
                       tile("sB", slot="(kt + S - 1) % S"), vec_bytes=16)
            r.sync("cp_async_commit")
            with r.for_("kk", 0, bk // 16, unroll=True):
                r.ldmatrix(tile("sA", ["wm0", "kk * 16"], [wm, 16], slot="kt % S"), tile("fa"))
                r.ldmatrix(tile("sB", ["wn0", "kk * 16"], [wn, 16], slot="kt % S"), tile("fb"))
                r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
        r.sync("cp_async_wait", n=0)
        r.stg(tile("acc"), tile("C", ["m0 + wm0", "n0 + wn0"], [wm, wn]), vec_bytes=4, id="epilogue")
    return kb.build()


def gemm_wgmma_sm90a(bm=128, bn=256, bk=64, stages=4, consumers=2):
    """Hopper: a TMA producer warpgroup (regs 40) fills a `stages`-deep mbarrier pipeline; `consumers`
    wgmma warpgroups (regs 232) each own 64 rows of the CTA tile and accumulate in registers."""
    threads = 128 * (1 + consumers)
    kb = KernelBuilder(f"gemm_wgmma_{bm}x{bn}x{bk}_s{stages}", arch="sm_90a", grid=["N / BN", "M / BM"],
                       threads=threads, note="TMA producer + wgmma consumers, mbarrier pipeline")
    kb.const(BM=bm, BN=bn, BK=bk, S=stages)
    kb.scalar("M", min=bm, divisible_by=bm)
    kb.scalar("N", min=bn, divisible_by=bn)
    kb.scalar("K", min=bk, divisible_by=bk)
    kb.tensor("A", "bf16", ["M", "K"], tma={"box": [bm, bk], "swizzle": "128B"})
    kb.tensor("B", "bf16", ["N", "K"], tma={"box": [bn, bk], "swizzle": "128B"})
    kb.tensor("C", "bf16", ["M", "N"], access="write")
    kb.buffer("sA", "smem", "bf16", [bm, bk], layout="swizzle_128B", stages=stages)
    kb.buffer("sB", "smem", "bf16", [bn, bk], layout="swizzle_128B", stages=stages)
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup", role="consumer")
    kb.pipeline("ab", stages=stages, mechanism="tma", producer="producer", consumers=["consumer"],
                buffers=["sA", "sB"])
    with kb.role("producer", warps=(0, 4), regs=40) as r:
        with r.if_("role_warp == 0 && elect_one()"):
            with r.for_("kt", 0, "K / BK", id="load_loop"):
                r.pipe("acquire", "ab", "kt")
                r.copy("tma_load", tile("A", ["bid.y * BM", "kt * BK"], [bm, bk]), tile("sA", slot="kt % S"),
                       barrier=bar("ab_full", "kt % S"), scope="thread", id="tmaA")
                r.copy("tma_load", tile("B", ["bid.x * BN", "kt * BK"], [bn, bk]), tile("sB", slot="kt % S"),
                       barrier=bar("ab_full", "kt % S"), scope="thread", id="tmaB")
                r.pipe("commit", "ab", "kt")
    with kb.role("consumer", warps=(4, 4 * consumers), regs=232) as r:
        with r.for_("kt", 0, "K / BK", id="mma_loop"):
            r.pipe("wait", "ab", "kt")
            r.sync("wgmma_fence")
            r.wgmma([64, bn, 16], tile("sA", ["64 * wg", 0], [64, bk], slot="kt % S"),
                    tile("sB", [0, 0], [bn, bk], slot="kt % S"), tile("acc"), accumulate="kt > 0", id="mma")
            r.sync("wgmma_commit")
            r.sync("wgmma_wait", n=0)
            r.pipe("release", "ab", "kt")
        r.stg(tile("acc"), tile("C", ["bid.y * BM + 64 * wg", "bid.x * BN"], [64, bn]), vec_bytes=4, id="epilogue")
    return kb.build()


SEEDS = {
    "gemm_mma_sm80": gemm_mma_sm80,
    "gemm_wgmma_sm90a": gemm_wgmma_sm90a,
}


# Parameter spaces of the seed generators, for family tactics (tactics/family.py): a candidate made
# from a family can be regenerated with other parameters. `check` rejects combinations the generator
# cannot build (the verifier still judges every result); `tactics` names the parameters each family
# tactic may change.
FAMILIES = {
    "gemm_mma_sm80": {
        "make": gemm_mma_sm80,
        "defaults": signature_defaults(gemm_mma_sm80),
        "space": {"bm": [64, 128, 256], "bn": [64, 128, 256], "bk": [32, 64], "stages": [2, 3, 4, 5],
                  "warps_m": [1, 2, 4], "warps_n": [1, 2, 4]},
        "check": lambda p: (p["bm"] % (16 * p["warps_m"]) == 0 and p["bn"] % (8 * p["warps_n"]) == 0
                            and p["warps_m"] * p["warps_n"] in (4, 8)),
        "tactics": {"retile": ["bm", "bn", "bk"], "warp_split": ["warps_m", "warps_n"]},
    },
    "gemm_wgmma_sm90a": {
        "make": gemm_wgmma_sm90a,
        "defaults": signature_defaults(gemm_wgmma_sm90a),
        "space": {"bm": [64, 128, 192, 256], "bn": [64, 128, 192, 256], "bk": [64], "stages": [2, 3, 4, 5, 6],
                  "consumers": [1, 2, 3, 4]},
        "check": lambda p: p["bm"] == 64 * p["consumers"],
        # each consumer warpgroup owns 64 rows, so BM moves with the consumer count
        "tactics": {"retile": ["bn", "bk"], "warp_split": ["consumers", "bm"]},
    },
}
