"""IR features the chunked KDA prefill brought in, each on a small kernel: a scan down the rows of a
blocked warp tile (the cumulative gate over the tokens of a chunk), lds of an smem matrix into an mma
accumulator (explicit Gram blocks joining a tensor-core product) and ldmatrix from an n-d smem tile
(E-CPY-05 compares smem / register shapes without their size-1 dims). Verified and compiled here;
checked numerically on a GPU (marked)."""
import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

from test_mma_chain import _bf16, _run_on_gpu, _stage


def cumsum_rows(arch="sm_80", cols=128):
    kb = KernelBuilder("cumsum_rows", arch=arch, grid=[1], threads=32)
    kb.tensor("X", "f32", [16, cols])
    kb.tensor("Y", "f32", [16, cols], access="write")
    kb.buffer("x", "reg", "f32", [16, cols], layout="blocked", vec=4, scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.ldg(tile("X", [0, 0], [16, cols]), tile("x"), vec_bytes=16)
        r.scan("sum", "x", "x", axis=0)
        r.stg(tile("x"), tile("Y", [0, 0], [16, cols]), vec_bytes=16)
    return kb.build()


def acc_from_smem(arch="sm_80"):
    kb = KernelBuilder("acc_from_smem", arch=arch, grid=[1], threads=32)
    kb.tensor("X", "f32", [16, 16])
    kb.tensor("O", "f32", [16, 16], access="write")
    kb.buffer("sX", "smem", "f32", [16, 16])
    kb.buffer("acc", "reg", "f32", [16, 16], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _stage(r, (("X", "sX", [16, 16]),))
        r.lds(tile("sX"), tile("acc"), vec_bytes=4)
        r.map("acc", "acc + select(col() < row(), 1, 0)")
        r.stg(tile("acc"), tile("O", [0, 0], [16, 16]), vec_bytes=8)
    return kb.build()


def ldmatrix_3d(arch="sm_80", a_tile=(16, 1, 16)):
    kb = KernelBuilder("ldmatrix_3d", arch=arch, grid=[1], threads=32)
    kb.tensor("A", "bf16", [16, 1, 16])
    kb.tensor("B", "bf16", [8, 16])
    kb.tensor("O", "f32", [16, 8], access="write")
    kb.buffer("sA", "smem", "bf16", [16, 1, 16])
    kb.buffer("sB", "smem", "bf16", [8, 16])
    kb.buffer("fa", "reg", "bf16", [16, 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "bf16", [8, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, 8], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _stage(r, (("A", "sA", [16, 1, 16]), ("B", "sB", [8, 16])))
        r.ldmatrix(tile("sA", [0, 0, 0], list(a_tile)), tile("fa"))
        r.ldmatrix(tile("sB"), tile("fb"))
        r.fill("acc", 0.0)
        r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
        r.stg(tile("acc"), tile("O", [0, 0], [16, 8]), vec_bytes=8)
    return kb.build()


def test_scan_down_rows_compiles_to_a_per_lane_running_sum():
    k = cumsum_rows()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_80")
    assert r.ok and "x[cake_c * 4 + cake_r]" in r.cuda_source


def test_scan_down_rows_needs_rows_that_split_over_the_warp():
    r = compile_kernel(cumsum_rows(cols=64), arch="sm_80")     # a 64-wide row covers half the warp
    assert not r.ok and any("split evenly" in d.message for d in r.diagnostics)


def test_lds_into_an_accumulator_compiles():
    k = acc_from_smem()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_80")
    assert r.ok and "cake_row) * 64" in r.cuda_source


def test_ldmatrix_reads_an_nd_tile_without_its_unit_dims():
    k = ldmatrix_3d()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    assert compile_kernel(k, arch="sm_80").ok
    bad = ldmatrix_3d(a_tile=(8, 1, 32))               # an [8, 1, 32] tile is not the [16, 16] fragment
    assert [d for d in verify(bad).diagnostics if d.code == "E-CPY-05" and "shapes differ" in d.message]


@pytest.mark.gpu
def test_scan_down_rows_on_gpu():
    x = np.random.default_rng(1).standard_normal((16, 128)).astype(np.float32)
    out = _run_on_gpu(cumsum_rows, {"X": (x, "f32")}, {"Y": (np.full_like(x, np.nan), "f32")})
    np.testing.assert_allclose(out["Y"], np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_lds_into_an_accumulator_on_gpu():
    x = np.random.default_rng(2).standard_normal((16, 16)).astype(np.float32)
    out = _run_on_gpu(acc_from_smem, {"X": (x, "f32")}, {"O": (np.full_like(x, np.nan), "f32")})
    np.testing.assert_array_equal(out["O"], x + np.tril(np.ones((16, 16), np.float32), -1))


@pytest.mark.gpu
def test_ldmatrix_3d_on_gpu():
    a, b = _bf16(np.random.default_rng(3), (16, 1, 16), (8, 16))
    out = _run_on_gpu(ldmatrix_3d, {"A": (a, "bf16"), "B": (b, "bf16")},
                      {"O": (np.full((16, 8), np.nan, np.float32), "f32")})
    np.testing.assert_allclose(out["O"], a[:, 0, :] @ b.T, rtol=1e-4, atol=1e-4)
