"""wgmma with A from registers and B MN-major (`wgmma` a: an mma_a fragment per warp; `b_major` "mn"),
and red_add from a wgmma accumulator: the k-means update on wgmma (tasks/kmeans/wgmma.py sums "wgmma")
is built from them. CPU: the verifier's rules (E-MMA-03 shapes, E-SYN-07 for a fragment rewritten
while its wgmma is in flight) and the lowering; GPU (marked): one warpgroup's product against numpy, B
stored K-major and MN-major, and a red_add of the accumulator with a row limit."""
import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

from test_mma_chain import _run_on_gpu


def wgmma_regs(arch="sm_90a", b_major="mn", rewrite_in_flight=False):
    """O [64, N] = A [64, 16] B [16, N] on one warpgroup, A through ldmatrix into each warp's fragment,
    B in a 128B-swizzled tile ([16, 64] MN-major; "mn2": N = 128 as two [16, 64] atoms 16 rows apart,
    b_atom_rows; or [64 N, 64] K-major using its first 16 columns); R [64, N] += the same product with
    rows >= 50 left out (red_add)."""
    n = 128 if b_major == "mn2" else 64
    kb = KernelBuilder(f"wgmma_regs_{b_major}", arch=arch, grid=[1], threads=128)
    kb.tensor("A", "f16", [64, 16])
    kb.tensor("B", "f16", {"mn": [16, 64], "mn2": [32, 64], "k": [64, 64]}[b_major])
    kb.tensor("O", "f32", [64, n], access="write")
    kb.tensor("R", "f32", [64, n], access="readwrite")
    kb.buffer("sA", "smem", "f16", [64, 16], pad=8)
    kb.buffer("sB", "smem", "f16", {"mn": [16, 64], "mn2": [32, 64], "k": [64, 64]}[b_major], layout="swizzle_128B")
    kb.buffer("fa", "reg", "f16", [16, 16], layout="mma_a", scope="warp")
    kb.buffer("acc", "reg", "f32", [64, n], layout="wgmma_acc", scope="warpgroup")
    with kb.role("main", warps=(0, 4)) as r:
        r.copy("cp_async", tile("A"), tile("sA"))
        r.copy("cp_async", tile("B"), tile("sB"))
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.fence("proxy_async")
        r.sync("syncthreads")
        r.ldmatrix(tile("sA", ["16 * role_warp", 0], [16, 16]), tile("fa"))
        r.fill("acc", 0.0)
        r.sync("wgmma_fence")
        b = tile("sB") if b_major == "mn" else tile("sB", [0, 0], [16, 64] if b_major == "mn2" else [64, 16])
        r.wgmma([64, n, 16], tile("fa"), b, tile("acc"), b_major="k" if b_major == "k" else "mn", id="product",
                b_atom_rows=16 if b_major == "mn2" else None)
        r.sync("wgmma_commit")
        if rewrite_in_flight:
            r.ldmatrix(tile("sA", ["16 * role_warp", 0], [16, 16]), tile("fa"), id="rewrite")
        r.sync("wgmma_wait", n=0)
        r.stg(tile("acc"), tile("O"), vec_bytes=8)
        r.add("red_add", src=tile("acc"), dst=tile("R"), row_limit=50)
    return kb.build()


@pytest.mark.parametrize("b_major", ["mn", "mn2", "k"])
def test_wgmma_with_register_a_verifies_and_lowers(b_major):
    k = wgmma_regs(b_major=b_major)
    res = verify(k)
    assert res.ok, [d.short() for d in res.diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    tb = 0 if b_major == "k" else 1
    n = 128 if b_major == "mn2" else 64
    assert f"cake_wgmma_rs_m64n{n}k16_f16_t{tb}(&acc[0], &fa[0], " in r.cuda_source
    assert f"{{%{n // 2}, %{n // 2 + 1}, %{n // 2 + 2}, %{n // 2 + 3}}}, %{n // 2 + 4}, p, 1, 1, {tb};" in r.cuda_source
    if b_major == "mn2":                                # LBO: the second atom 16 rows x 128 bytes on
        assert ", 2048, 1024, 1), (unsigned)(" in r.cuda_source     # the descriptor: LBO = the atoms' distance
    assert "if ((cake_row + 16 * (cake_wg_tid >> 5)) >= (int)(50)) continue;" in r.cuda_source


def test_a_fragment_rewritten_while_its_wgmma_is_in_flight_is_reported():
    bad = verify(wgmma_regs(rewrite_in_flight=True))
    assert any(d.code in ("E-SYN-07", "E-PIP-04") and "A fragment" in d.message for d in bad.diagnostics), \
        [d.short() for d in bad.diagnostics]


def test_mn_major_b_needs_register_a_and_one_atom_wide_tile():
    import json

    from cake_ir.io import dumps, load
    doc = json.loads(dumps(wgmma_regs()))
    body = doc["roles"][0]["body"]
    prod = next(n for n in body if n.get("id") == "product")
    prod["b"]["shape"] = [16, 32]
    prod["shape"] = [64, 32, 16]
    doc["buffers"].append({"name": "acc2", "space": "reg", "dtype": "f32", "shape": [64, 32], "layout": "wgmma_acc",
                           "scope": "warpgroup"})
    prod["acc"] = {"buf": "acc2"}
    diags = verify(load(doc)[0]).diagnostics
    assert any(d.code == "E-MMA-03" and "one 128-byte swizzle row" in d.message for d in diags), \
        [d.short() for d in diags]


@pytest.mark.gpu
@pytest.mark.parametrize("b_major", ["mn", "mn2", "k"])
def test_wgmma_with_register_a_matches_numpy(b_major):
    rng = np.random.default_rng(3)
    n = 128 if b_major == "mn2" else 64
    A = rng.standard_normal((64, 16)).astype(np.float16).astype(np.float32)
    Bm = rng.standard_normal((16, n)).astype(np.float16).astype(np.float32)     # [K, N]
    if b_major == "k":
        B = np.concatenate([Bm.T, np.zeros((64, 48), np.float32)], axis=1)        # [N, K | pad]
    else:
        B = np.concatenate([Bm[:, a * 64:(a + 1) * 64] for a in range(n // 64)], axis=0)   # atoms stacked by rows
    R0 = rng.standard_normal((64, n)).astype(np.float32)
    out = _run_on_gpu(lambda a: wgmma_regs(a, b_major), {"A": (A, "f16"), "B": (B, "f16")},
                      {"O": (np.full((64, n), np.nan, np.float32), "f32"), "R": (R0.copy(), "f32")})
    ref = A.astype(np.float64) @ Bm.astype(np.float64)
    assert np.allclose(out["O"], ref, rtol=1e-3, atol=1e-3), np.abs(out["O"] - ref).max()
    want = R0 + np.where(np.arange(64)[:, None] < 50, ref, 0.0)
    assert np.allclose(out["R"], want, rtol=1e-3, atol=1e-3), np.abs(out["R"] - want).max()
