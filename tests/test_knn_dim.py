"""kNN at any D in [1, 1024]: the any-D variants cakelib.variants.knn_dk_pick picks (sm_90a: the D-chunked wgmma
search, tasks/knn/wgmma.py `dk`; sm_80: mma.sync with whole staged rows, tasks/knn/programs.py knn_fused) verify
with the sync simulation and compile for their archs (the mma.sync ones for sm_80 and sm_90a) at D = 32 / 100 /
384 / 768 / 1024 and k = 1 / 10 / 32 (the whole-row step, the chunked ring, the split path with its merge kernel,
tile norms); the norms kernels for any D; the domain (D > 1024, k > 32) refused with a ValueError naming the
legal values. GPU (marked): cakelib.knn against float64 at small shapes, odd D too."""
import re

import numpy as np
import pytest

from cake_ir.compiler import compile_ir, compiled_parts
from cake_ir.verifier import verify

DS = [32, 100, 384, 768, 1024]
KS = [1, 10, 32]
SHAPES = [(1, 100_000), (128, 1_000_000), (10_000, 1_000_000)]   # the split stream, mid Q, many queries
# the GPU tests' (Q, M, k, D): partial query and database tiles, odd D (padded), the split path, k = 1 / 10 / 32
# (bench/knn_dim_device.sh precompiles their kernels)
GPU_SHAPES = [(1, 20_001, 10, 100), (37, 5_003, 32, 384), (130, 9_999, 10, 768), (300, 4_099, 1, 1024),
              (64, 30_001, 10, 33), (200, 7_001, 32, 960), (5, 50_000, 32, 256)]
SYNC_GPU_SHAPES = [(20, 9_001, 10, 100), (70, 3_001, 32, 384), (5, 40_000, 1, 770)]   # mma.sync, run on sm_90a


def picks(D: int, k: int, arch: str = "sm_90a") -> list:
    """The distinct variants the dispatcher's rule picks at D, k over SHAPES."""
    from cakelib.variants import knn_dk_pick, knn_name
    out = {}
    for Q, M in SHAPES:
        p = knn_dk_pick({"Q": Q, "M": M, "k": k, "D": D, "arch": arch})
        assert p, (Q, M, k, D)
        out[knn_name(p)] = p
    return list(out.values())


def errors(ir) -> list:
    v = verify(ir)
    assert not [d for d in v.diagnostics if d.code == "N-SYN-01"], "the sync simulation must run"
    return [d.short() for d in v.diagnostics if d.severity == "error"]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("D", DS)
def test_dk_picks_verify_and_compile_for_sm90a(D, k):
    from cakelib.variants import knn_kernel
    for p in picks(D, k):
        for metric in ("l2", "ip"):
            ir = knn_kernel(p, k, metric, D, "sm_90a")
            assert not errors(ir), (p, metric)
        res = compile_ir(knn_kernel(p, k, "l2", D, "sm_90a"), arch="sm_90a")
        assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
        src = "".join(part.cuda_source for part in compiled_parts(res))
        assert "wgmma.mma_async" in src


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("D", DS)
def test_sync_picks_verify_and_compile_for_sm80_and_sm90a(D, k):
    from cakelib.variants import knn_kernel
    for p in picks(D, k, "sm_80"):
        assert p.get("mma", "sync") == "sync" and p["dk"] == 0
        for arch in ("sm_80", "sm_90a"):
            ir = knn_kernel(p, k, "l2", D, arch)
            assert not errors(ir), (p, arch)
            res = compile_ir(ir, arch=arch)
            assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
        assert not errors(knn_kernel(p, k, "ip", D, "sm_80"))


def test_chunked_search_has_one_step_loop_and_no_spills_at_d1024_k10():
    """D = 1024 in [128, 128] chunks: the tile's steps are an IR loop (not unrolled: ptxas spilled 280 B with
    eight copies of the step), the kernel compiles without spills."""
    from tasks.knn.wgmma import knn_wgmma
    ir = knn_wgmma(d=1024, dk=128, bn=128, stages=3)
    assert "_dk128" in ir.name and not errors(ir)
    res = compile_ir(ir, arch="sm_90a")
    notes = [d.message for part in compiled_parts(res) for d in part.diagnostics if d.code == "N-BACKEND-RESOURCES"]
    assert len(notes) == 3 and int(re.search(r"(\d+) B spill stores", notes[2]).group(1)) == 0, notes


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("D", [2, 32, 100, 384, 1024])
def test_norms_kernel_any_even_d(D, arch):
    from tasks.knn.programs import knn_db_norms, vec_bytes
    from tasks.knn.wgmma import norm_rows
    ir = knn_db_norms(D, rows=norm_rows(D), arch=arch)
    assert not errors(ir)
    assert compile_ir(ir, arch=arch).ok
    assert vec_bytes(D) == (16 if D % 8 == 0 else 8 if D % 4 == 0 else 4)


def test_chunked_prefetch_of_the_in_flight_slot_is_reported(monkeypatch):
    """A chunked D keeps one wgmma group in flight past each step: the prefetch must skip its slot (one step
    fewer ahead, `prefetch_distance` as with overlap). With every other slot loading ahead the simulator reports
    the prefetch's race with that wgmma (E-SYN-10); the tile norms' form passes as built."""
    import tasks.knn.wgmma as W
    assert not errors(W.knn_wgmma(d=384, dk=128, stages=4, split=8, merge="kernel"))
    assert not errors(W.knn_wgmma(d=768, dk=128, stages=4, split=8, merge="kernel", norms="tile"))
    monkeypatch.setattr(W, "prefetch_distance", lambda stages, overlap: stages - 1)
    errs = [d for d in verify(W.knn_wgmma(d=384, dk=128, stages=4, split=8, merge="kernel")).diagnostics
            if d.severity == "error"]
    assert any(d.code == "E-SYN-10" and "race on sB" in d.message for d in errs), [d.short() for d in errs]


def test_builder_refuses_odd_d_and_chunked_overlap():
    from tasks.knn.wgmma import knn_wgmma
    with pytest.raises(ValueError, match="d even"):
        knn_wgmma(d=101)
    with pytest.raises(ValueError, match="no overlap"):
        knn_wgmma(d=384, dk=128, overlap=True, stages=4)
    with pytest.raises(ValueError, match="stages >= 3"):
        knn_wgmma(d=384, dk=128, stages=2)


def test_domain_refusals_name_the_legal_values():
    from cakelib.knn_search import _route
    with pytest.raises(ValueError, match=r"1 <= D <= 1024"):
        _route({"Q": 10, "M": 1000, "k": 10, "D": 1025, "arch": "sm_90a"}, False)
    assert _route({"Q": 10, "M": 1000, "k": 33, "D": 384, "arch": "sm_90a"}, False) == ("large_k", None)
    path, p = _route({"Q": 10, "M": 1000, "k": 10, "D": 384, "arch": "sm_80"}, False)
    assert path == "fused" and p.get("mma", "sync") == "sync"
    with pytest.raises(ValueError, match="multiple of 16"):
        _route({"Q": 10, "M": 1000, "k": 10, "D": 100, "arch": "sm_90a"}, True)
    path, p = _route({"Q": 10, "M": 1000, "k": 10, "D": 100, "arch": "sm_90a"}, False)   # the passing case
    assert path == "fused" and p["mma"] == "wgmma" and "dk" in p


def test_dk_supports_guards_arch_smem_and_k():
    from cakelib.variants import knn_supports
    p = {"mma": "wgmma", "bq": 64, "bn": 128, "split": 1, "stages": 3, "dk": 128}
    s = {"Q": 100, "M": 10_000, "k": 10, "D": 1024, "arch": "sm_90a"}
    assert knn_supports(p, s)
    assert not knn_supports(p, {**s, "arch": "sm_80"})
    sync = {"bq": 16, "bn": 32, "split": 1, "stages": 2, "qfrag": "smem", "norms": "global", "dk": 0}
    assert knn_supports(sync, {**s, "arch": "sm_80"})
    assert not knn_supports({**sync, "qfrag": "reg"}, {**s, "arch": "sm_80"})          # all of D in registers
    assert not knn_supports({**sync, "bq": 64, "bn": 64}, {**s, "arch": "sm_80"})     # 264 KB of staged rows
    assert not knn_supports(p, {**s, "k": 33}) and not knn_supports(p, {**s, "D": 1026})
    assert not knn_supports({**p, "bq": 128, "stages": 4}, s)        # 256 KB of resident queries: E-RES-01
    assert not knn_supports({"bq": 64, "bn": 64, "split": 1, "stages": 2}, {**s, "D": 384})   # the D-whole ones


def test_odd_d_is_padded_with_a_zero_column():
    from cakelib.knn_search import _even_columns
    a = np.ones((3, 5), np.float32)
    b = _even_columns(a, "x")
    assert b.shape == (3, 6) and (b[:, 5] == 0).all() and (b[:, :5] == 1).all()
    assert _even_columns(np.ones((3, 4)), "x").shape == (3, 4)
    assert _even_columns(np.ones((3, 1025)), "x").shape == (3, 1025)   # (refused later, naming the limit)


needs_gpu = pytest.mark.skipif("not __import__('gpu_backend.driver', fromlist=['x']).gpu_available()",
                               reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("Q,M,k,D", GPU_SHAPES)
def test_cakelib_knn_any_d_matches_float64(Q, M, k, D):
    import sys
    from pathlib import Path
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("the D-chunked kernels need sm_90a")
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from lib_grid import knn_check, knn_reference
    from cakelib import knn
    g = torch.Generator(device="cuda").manual_seed(Q + M + D)
    xb = (torch.randn(M, D, device="cuda", generator=g)).half()
    xq = (xb[torch.randint(0, M, (Q,), device="cuda", generator=g)].float()
          + 0.1 * torch.randn(Q, D, device="cuda", generator=g)).half()
    I, Dist = knn(xq, xb, k)
    ok, msg = knn_check(xq, xb, I, Dist, k, knn_reference(xq, xb, k))
    assert ok, msg


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("Q,M,k,D", SYNC_GPU_SHAPES)
def test_cakelib_knn_any_d_sync_matches_float64(Q, M, k, D):
    """The mma.sync any-D picks (sm_80's) run on any GPU: forced here through `variant`."""
    import sys
    from pathlib import Path
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from lib_grid import knn_check, knn_reference
    from cakelib import knn
    from cakelib.variants import knn_dk_pick
    p = knn_dk_pick({"Q": Q, "M": M, "k": k, "D": D, "arch": "sm_80"})
    g = torch.Generator(device="cuda").manual_seed(Q + M + D)
    xb = torch.randn(M, D, device="cuda", generator=g).half()
    xq = (xb[torch.randint(0, M, (Q,), device="cuda", generator=g)].float()
          + 0.1 * torch.randn(Q, D, device="cuda", generator=g)).half()
    I, Dist = knn(xq, xb, k, variant=p)
    ok, msg = knn_check(xq, xb, I, Dist, k, knn_reference(xq, xb, k))
    assert ok, msg
