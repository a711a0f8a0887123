"""`onehot`: the transposed one-hot fragment that turns a scatter-add into a tensor-core product,
S[row0 + m, :] = sum_j [T[j] == row0 + m] X[j, :] (columns j >= limit dropped). CPU: it lowers and
compiles for sm_80 / sm_90a, and the verifier's race check sees its index read; GPU (marked): the
sums against numpy, f16 and bf16, several fragment blocks, a row offset, a limit and negative targets."""
import json
import pathlib

import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel
from cake_ir.io import load
from cake_ir.verifier import verify

from test_mma_chain import _run_on_gpu

FIX = pathlib.Path(__file__).resolve().parent.parent / "rules" / "fixtures" / "E-HOT-01" / "pass.json"


def scatter_mma(arch="sm_80", dtype="f16", rows=32, cols=32, d=16, row0=16, limit=29):
    """S [rows, d] f32 = onehot(T - row0)^T X over `cols` source rows, in one warp."""
    kb = KernelBuilder(f"onehot_{dtype}", arch=arch, grid=[1], threads=32)
    kb.tensor("T", "i32", [cols, 1])
    kb.tensor("X", dtype, [cols, d])
    kb.tensor("S", "f32", [rows, d], access="write")
    kb.buffer("sidx", "smem", "i32", [cols, 1])
    kb.buffer("sx", "smem", dtype, [cols, d], pad=8)
    kb.buffer("oh", "reg", dtype, [rows, cols], layout="mma_a", scope="warp")
    kb.buffer("xb", "reg", dtype, [d, cols], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [rows, d], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.copy("sync", tile("T"), tile("sidx"), scope="warp", vec_bytes=4)
        r.copy("sync", tile("X"), tile("sx"), scope="warp", vec_bytes=16)
        r.sync("syncwarp")
        r.add("onehot", index=tile("sidx"), dst=tile("oh"), row0=row0, col0=0, limit=limit)
        for kt in range(cols // 16):
            r.ldmatrix(tile("sx", [kt * 16, 0], [16, d]), tile("xb", [0, kt * 16], [d, 16]), trans=True)
        r.fill("acc", 0.0)
        r.mma_sync(tile("oh"), tile("xb"), tile("acc"))
        r.stg(tile("acc"), tile("S"), vec_bytes=8)
    return kb.build()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_onehot_lowers_and_compiles(arch, dtype):
    k = scatter_mma(arch, dtype)
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch=arch)
    assert r.ok, [d.short() for d in r.diagnostics]
    # one f16x2 compare per register against its row offset (bf16: 1.0's bits converted)
    packs = [ln for ln in r.cuda_source.splitlines() if ln.lstrip().startswith("oh[")]
    assert len(packs) == 2 * 2 * 4 and all("cake::heq2(" in ln for ln in packs), packs   # MT x KT x 4 registers
    assert all(("cake::h1_to_bf1(" in ln) == (dtype == "bf16") for ln in packs)
    assert {ln.split("0x")[1][:8] for ln in packs} == {"00000000", "48004800", "4C004C00", "4E004E00"}  # 0, 8, 16, 24


def test_onehot_fragment_rows_are_bounded_by_the_f16_compare():
    """The lowering compares row offsets as f16 (exact below 256): E-HOT-01 names a taller fragment."""
    k = scatter_mma("sm_80", "f16", rows=272)
    hits = [d for d in verify(k).diagnostics if d.code == "E-HOT-01"]
    assert hits and hits[0].node.endswith("/dst/buf") and "256" in hits[0].message, [d.short() for d in verify(k).diagnostics]
    assert not [d for d in verify(scatter_mma("sm_80", "f16", rows=256)).diagnostics if d.code == "E-HOT-01"]


def test_onehot_index_read_needs_the_barrier():
    doc = json.loads(FIX.read_text())["kernel"]
    k, _ = load(doc)
    assert verify(k).ok
    del doc["roles"][0]["body"][2]            # the syncwarp between the index copy and the onehot
    k, _ = load(doc)
    hits = [d for d in verify(k).diagnostics if d.code == "E-SYN-11" and d.node == "/roles/0/body/2"]
    assert hits and "sidx" in hits[0].message, [d.short() for d in verify(k).diagnostics]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_onehot_scatter_sums_on_gpu(dtype):
    from gpu_backend.memory import round_to_bf16
    rng = np.random.default_rng(7)
    rows, cols, d, row0, limit = 32, 32, 16, 16, 29
    T = rng.integers(0, 56, size=(cols, 1)).astype(np.int32)       # targets below, inside and above the block
    T[3] = -1
    X = rng.standard_normal((cols, d)).astype(np.float32)
    X = round_to_bf16(X) if dtype == "bf16" else X.astype(np.float16).astype(np.float32)
    out = _run_on_gpu(lambda a: scatter_mma(a, dtype, rows, cols, d, row0, limit), {"T": (T, "i32"), "X": (X, dtype)},
                      {"S": (np.full((rows, d), np.nan, np.float32), "f32")})["S"]
    ref = np.zeros((rows, d))
    for j in range(limit):
        if row0 <= T[j, 0] < row0 + rows:
            ref[T[j, 0] - row0] += X[j]
    assert np.allclose(out, ref, rtol=1e-6, atol=1e-6), np.abs(out - ref).max()
    assert (out != 0).any(axis=1).sum() >= 8                        # the draw hits many of the block's rows


def test_update_mechanism_tactic_switches_kmeans_to_the_tensor_core_update():
    """The family tactic the agent (and the tactic library) sees: the atomic k-means seed becomes the
    onehot + mma update, verified clean; from the mma seed it offers the atomic update back."""
    from tactics.base import get_tactic
    from tasks.registry import get
    tac = get_tactic("update_mechanism")
    seeds = {g["name"]: g for g in get("kmeans").seed_genomes()}
    g = seeds["kmeans_resident_sm80"]
    assert {"update": "mma", "urows": 16} in tac.choices(g)
    out = tac.apply(g, {"update": "mma", "urows": 16})
    k, _ = load(out["ir"])
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics if d.severity == "error"]
    doc = json.dumps(out["ir"])
    assert doc.count('"op": "onehot"') == 4 and '"sum_points"' not in doc    # one per 16 points; no CAS adds
    assert {"update": "atomic", "urows": 16} in tac.choices(seeds["kmeans_resident_mma_sm80"])
