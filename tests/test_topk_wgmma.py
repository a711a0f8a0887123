"""`topk` over a `wgmma_acc` score tile (sm_90a): a warpgroup's [64, N] wgmma accumulator, each warp
keeping the lists of its own 16 rows (mma_rows [16, k]), the row bias indexed by the warpgroup row.
CPU: it verifies clean, lowers with the warp's row offset and compiles for sm_90a; E-TOPK-01 names the
wrong list shape and a tile of more than one warpgroup; the sync simulator wants the barrier and the
proxy fence between the cp.async fills and the wgmma. GPU (marked): the lists against numpy, k = 1
and k = 4, with a row bias and a limit inside the tile."""
import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

from test_mma_chain import _run_on_gpu


def topk_wgmma(arch="sm_90a", k=4, n=64, d=64, list_rows=16, acc_rows=64):
    """V/I [64, k]: per row r of A, the k smallest -2 A[r].B[j] + RB[r] over columns j < M of B [n, d]."""
    kb = KernelBuilder(f"topk_wgmma_k{k}", arch=arch, grid=[1], threads=128)
    kb.scalar("M", min=1)
    kb.tensor("A", "f16", [64, d])
    kb.tensor("B", "f16", [n, d])
    kb.tensor("RB", "f32", [1, 64])
    kb.tensor("I", "i32", [64, k], access="write")
    kb.tensor("V", "f32", [64, k], access="write")
    kb.buffer("sA", "smem", "f16", [64, d], layout="swizzle_128B")
    kb.buffer("sB", "smem", "f16", [n, d], layout="swizzle_128B")
    kb.buffer("rb", "smem", "f32", [1, 64])
    kb.buffer("acc", "reg", "f32", [acc_rows, n], layout="wgmma_acc", scope="warpgroup")
    kb.buffer("tv", "reg", "f32", [list_rows, k], layout="mma_rows", scope="warp")
    kb.buffer("ti", "reg", "i32", [list_rows, k], layout="mma_rows", scope="warp")
    with kb.role("main", warps=(0, 4)) as r:
        r.copy("cp_async", tile("A"), tile("sA"))
        r.copy("cp_async", tile("B"), tile("sB"))
        r.copy("cp_async", tile("RB"), tile("rb"))
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.fence("proxy_async")             # cp.async wrote sA / sB in the generic proxy; wgmma reads async
        r.sync("syncthreads")
        r.sync("wgmma_fence")
        r.wgmma([64, n, 16], tile("sA", [0, 0], [64, d]), tile("sB"), tile("acc"), accumulate=False)
        r.sync("wgmma_commit")
        r.sync("wgmma_wait", n=0)
        r.fill("tv", 3.0e38)
        r.fill("ti", -1)
        r.add("topk", kind="min", k=k, src=tile("acc"), vals=tile("tv"), idx=tile("ti"), col="0", limit="M",
              scale=-2.0, row_bias=tile("rb"), id="select")
        r.add("topk_merge", kind="min", vals=tile("tv"), idx=tile("ti"))
        r.stg(tile("tv"), tile("V", ["role_warp * 16", 0], [16, k]), vec_bytes=4, id="store_vals")
        r.stg(tile("ti"), tile("I", ["role_warp * 16", 0], [16, k]), vec_bytes=4, id="store_idx")
    return kb.build()


@pytest.mark.parametrize("k", [1, 4])
def test_topk_over_wgmma_acc_verifies_lowers_and_compiles(k):
    kern = topk_wgmma(k=k)
    v = verify(kern)
    assert v.ok and not [d for d in v.diagnostics if d.code.startswith("E-")], [d.short() for d in v.diagnostics]
    r = compile_kernel(kern, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    # the row bias of the warp's rows: 16 x (warp in the warpgroup) + the lane's row in the fragment
    rows = [ln for ln in r.cuda_source.splitlines() if "16 * (cake_wg_tid >> 5)" in ln and "cake_lane >> 2" in ln]
    assert len(rows) == 2, rows                                            # two row halves per lane
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in r.cuda_source


def test_wrong_list_shape_and_multi_warpgroup_tile_are_reported():
    bad = verify(topk_wgmma(list_rows=64))                 # lists of the whole warpgroup tile
    hits = [d for d in bad.diagnostics if d.code == "E-TOPK-01"]
    assert any(h.node.endswith("/body/13/vals/buf") and "expected [16, 4]" in h.message for h in hits), \
        [d.short() for d in bad.diagnostics]
    bad = verify(topk_wgmma(acc_rows=128))
    hits = [d for d in bad.diagnostics if d.code == "E-TOPK-01"]
    assert any(h.node.endswith("/body/13/src/buf") and "128 rows" in h.message for h in hits), \
        [d.short() for d in bad.diagnostics]


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 4])
def test_topk_over_wgmma_acc_on_gpu(k):
    from gpu_backend.driver import arch_of, gpu_available, properties
    if gpu_available() and not arch_of(properties(0)).startswith("sm_90"):
        pytest.skip("wgmma needs sm_90a")
    rng = np.random.default_rng(11)
    n, d, limit = 64, 64, 50                               # columns 50..63 must never enter
    A = rng.standard_normal((64, d)).astype(np.float16)
    B = rng.standard_normal((n, d)).astype(np.float16)
    RB = rng.standard_normal((1, 64)).astype(np.float32)
    out = _run_on_gpu(lambda a: topk_wgmma(a, k, n, d), {"A": (A, "f16"), "B": (B, "f16"), "RB": (RB, "f32")},
                      {"V": (np.full((64, k), np.nan, np.float32), "f32"), "I": (np.full((64, k), -7, np.int32), "i32")},
                      {"M": limit})
    S = -2.0 * (A.astype(np.float64) @ B.astype(np.float64).T)[:, :limit] + RB[0][:, None]
    ref_i = np.argsort(S, axis=1, kind="stable")[:, :k]
    assert np.array_equal(out["I"], ref_i), np.argwhere(out["I"] != ref_i)[:5]
    np.testing.assert_allclose(out["V"], np.take_along_axis(S, ref_i, axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("drop,code", [("syncthreads", "E-SYN-06"), ("fence", "E-SYN-08")])
def test_wgmma_after_cp_async_needs_the_barrier_and_the_proxy_fence(drop, code):
    """cp.async writes shared memory in the generic proxy and its wait covers the waiting thread only: a
    wgmma (async proxy, the whole warpgroup's tile) reading it needs a CTA barrier and fence.proxy.async."""
    import json

    from cake_ir.io import dumps, load
    doc = json.loads(dumps(topk_wgmma()))
    body = doc["roles"][0]["body"]
    del body[next(i for i, st in enumerate(body) if st["op"] == drop)]
    k, _ = load(doc)
    errs = [d for d in verify(k).diagnostics if d.severity == "error"]
    at = f"/roles/0/body/{next(i for i, st in enumerate(body) if st['op'] == 'wgmma')}"
    for buf in ("sA", "sB"):      # reported at the wgmma (E-SYN-06) or at the copy, naming the wgmma (E-SYN-08)
        assert any(d.code == code and f"{buf} " in d.message and at in (d.node, *d.related, d.message)
                   for d in errs), [d.short() for d in errs]
