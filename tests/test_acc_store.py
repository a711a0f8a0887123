"""Storing a 16-bit mma accumulator tile (a bf16 `mma_acc` register tile, e.g. the hi half of an f32
accumulator split into bf16 hi + lo for a 3-product bf16 GEMM): the register tile holds raw bf16
storage, so the store must convert its elements before packing or widening them. Found by the
sequence-parallel KDA prefill's start-state kernel, whose bf16 hi half reached shared memory as the
integer values of its bits (1.0 -> 16256). CPU: the lowering converts; GPU (marked): the values."""
import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel

from test_mma_chain import _run_on_gpu


def split_store(arch="sm_80"):
    """X [16, 8] f32 -> mma_acc tile -> bf16 hi (Xh) and f32 lo (X - Xh); Xh stored to a bf16 and an f32
    tensor, the lo half to an f32 tensor."""
    kb = KernelBuilder("acc_store_bf16", arch=arch, grid=[1], threads=32)
    kb.tensor("X", "f32", [16, 8])
    for n, dt in (("Ob", "bf16"), ("Of", "f32"), ("Ol", "f32")):
        kb.tensor(n, dt, [16, 8], access="write")
    kb.buffer("A", "reg", "f32", [16, 8], layout="mma_acc", scope="warp")
    kb.buffer("Ah", "reg", "bf16", [16, 8], layout="mma_acc", scope="warp")
    kb.buffer("Al", "reg", "f32", [16, 8], layout="mma_acc", scope="warp")
    with kb.role("w", warps=(0, 1)) as r:
        r.ldg(tile("X", [0, 0], [16, 8]), tile("A"), vec_bytes=4)
        r.map("Ah", "A")
        r.map("Al", "A - Ah")
        r.stg(tile("Ah"), tile("Ob", [0, 0], [16, 8]), vec_bytes=4)
        r.stg(tile("Ah"), tile("Of", [0, 0], [16, 8]), vec_bytes=4)
        r.stg(tile("Al"), tile("Ol", [0, 0], [16, 8]), vec_bytes=4)
    return kb.build()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_bf16_accumulator_store_converts_its_elements(arch):
    r = compile_kernel(split_store(arch), arch=arch)
    assert r.ok, [d.short() for d in r.diagnostics]
    stores = [ln for ln in r.cuda_source.splitlines() if "Ah[cake_e" in ln and ("pack_bf16x2" in ln or "make_float2" in ln)]
    assert len(stores) == 4, stores            # two rows halves x (bf16 Ob, f32 Of)
    assert all("cake::bf2f(Ah[cake_e" in ln for ln in stores), stores


@pytest.mark.gpu
def test_bf16_accumulator_store_on_gpu():
    from gpu_backend.memory import round_to_bf16
    X = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    nan = np.full((16, 8), np.nan, np.float32)
    out = _run_on_gpu(split_store, {"X": (X, "f32")}, {"Ob": (nan, "bf16"), "Of": (nan, "f32"), "Ol": (nan, "f32")})
    hi = round_to_bf16(X)
    assert np.array_equal(out["Ob"], hi) and np.array_equal(out["Of"], hi)
    assert np.array_equal(out["Ol"], X - hi)          # exact in f32: hi is X rounded to bf16
