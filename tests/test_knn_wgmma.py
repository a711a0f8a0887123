"""The wgmma kNN search (tasks/knn/wgmma.py, sm_90a): every sweep variant verifies without errors
(the sync simulator runs: the cp.async ring, the proxy fence and the per-tile barrier) and compiles
for sm_90a without spills (the 128-register caps with the shared bound: 16 B at most); the library
refuses it off sm_90a and for shapes its merge cannot deal;
the database / query norms kernels and the search form one Program. GPU (marked): cakelib.knn with
each wgmma variant against float64 through the task's checks (partial query and database tiles,
the split path, inner product, k = 1 / 10 / 16 / 32)."""
import re
import sys
from pathlib import Path

import pytest

from cake_ir.compiler import compile_ir, compiled_parts
from cake_ir.nodes import Program
from cake_ir.verifier import verify
from tasks.knn.wgmma import knn_wgmma

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from lib_grid import knn_variants  # noqa: E402

WG = [p for p in knn_variants() if p.get("mma") == "wgmma"]


def test_sweep_has_wgmma_variants_with_distinct_names():
    from cakelib.variants import knn_name
    names = [knn_name(p) for p in WG]
    assert len(WG) >= 8 and len(set(names)) == len(names) and \
        all(n.split("_sd")[0].endswith(("_wg", "_wg_ov")) for n in names)   # (_sd{F}: the sampled bound)
    assert sum(n.endswith("_ov") for n in names) >= 4
    assert len({knn_name(p) for p in knn_variants()}) == len(knn_variants())


@pytest.mark.parametrize("p", WG, ids=lambda p: f"bq{p['bq']}_bn{p['bn']}_s{p['split']}_p{p['stages']}"
                         + ("_ov" if p.get("overlap") else ""))
def test_wgmma_variants_verify_and_compile_without_spills(p):
    from cakelib.variants import knn_kernel
    k = 16 if p["split"] > 1 else 10
    ir = knn_kernel(p, k, "l2", 128, "sm_90a")
    assert isinstance(ir, Program) and [x.name for x in ir.kernels][:2] == ["knn_db_norms_d128", "knn_xq_norms_d128"]
    v = verify(ir)
    assert not [d for d in v.diagnostics if d.severity == "error"], [d.short() for d in v.diagnostics]
    assert not [d for d in v.diagnostics if d.code == "N-SYN-01"], "the sync simulation must run"
    res = compile_ir(ir, arch="sm_90a")
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    notes = [d.message for part in compiled_parts(res) for d in part.diagnostics if d.code == "N-BACKEND-RESOURCES"]
    spills = [int(re.search(r"(\d+) B spill stores", n).group(1)) for n in notes]
    # norms, query norms, (the sample and its merge,) the search, (its merge kernel)
    search = next(i for i, x in enumerate(ir.kernels) if x.name == ir.name)
    assert len(notes) == len(ir.kernels) and "wgmma.mma_async" in compiled_parts(res)[search].cuda_source, notes
    if p.get("minb", 1) > 1 and p["split"] > 1:
        # capped at 128 registers (minb 2): without the shared bound and the queue at most 8 B of spill (the
        # last-CTA merge's bitonic networks; 0 with its insertions); the bound's cache and reset word cost
        # 16 B more, the fitted queue (T = 2 at k = 16: its 8 registers) 16 B more, measured 1.5x faster at
        # M = 100K all the same; the rolled insertion (the default)
        # 16 B more again, measured 1.12-1.40x faster at the capped split picks all the same
        # (bench/results/topk-rolled-ab-h200.json: Q = 1024-10000, k = 10 / 16)
        off = compile_ir(knn_kernel({**p, "share": False, "queue": 0}, k, "l2", 128, "sm_90a"), arch="sm_90a")
        off_spills = [int(re.search(r"(\d+) B spill stores", d.message).group(1)) for part in compiled_parts(off)
                      for d in part.diagnostics if d.code == "N-BACKEND-RESOURCES"]
        assert off.ok and max(off_spills) <= 8, off_spills
        assert max(spills) <= 56, notes
    else:
        assert spills == [0] * len(ir.kernels), notes


def test_wgmma_search_needs_sm90a_and_whole_warpgroups():
    from cakelib.variants import knn_supports
    p = WG[0]
    assert knn_supports(p, {"Q": 256, "M": 1 << 20, "k": 10, "arch": "sm_90a"})
    assert not knn_supports(p, {"Q": 256, "M": 1 << 20, "k": 10, "arch": "sm_80"})
    assert not knn_supports({**p, "bq": 32}, {"Q": 256, "M": 1 << 20, "k": 10, "arch": "sm_90a"})
    with pytest.raises(ValueError, match="sm_90a"):
        knn_wgmma(arch="sm_80")
    with pytest.raises(ValueError, match="multiple of 64"):
        knn_wgmma(bq=32)
    with pytest.raises(ValueError, match="even"):
        knn_wgmma(split=3)


def test_inner_product_search_is_one_kernel():
    ir = knn_wgmma(metric="ip", bq=128, bn=64, stages=4)
    assert not isinstance(ir, Program)
    assert not [d for d in verify(ir).diagnostics if d.severity == "error"]


def test_removing_the_loop_barrier_is_reported():
    """Without the loop's syncthreads the simulator reports both races of the ring: the prefetch overwrites
    the slot another warpgroup's wgmma read in the previous tile, and a wgmma reads a tile other threads'
    cp.async filled (wgmma accesses count in the same-role barrier check)."""
    import json

    from cake_ir.io import dumps, load
    ir = knn_wgmma(bq=128, bn=64, stages=3, split=8)
    assert not [d for d in verify(ir).diagnostics if d.severity == "error"]
    doc = json.loads(dumps(ir))
    body = doc["kernels"][2]["roles"][0]["body"]
    loop = next(st for st in body if st.get("id") == "db_loop")
    i = next(i for i, st in enumerate(loop["body"]) if st["op"] == "syncthreads")
    del loop["body"][i]
    bad, _ = load(doc)
    errs = [d for d in verify(bad).diagnostics if d.severity == "error"]
    short = [d.short() for d in errs]
    # the prefetch overwrites the slot the other warpgroup's wgmma read (write-after-read) ...
    assert any(d.code == "E-SYN-11" and d.node.endswith("/then/0") and "write-after-read hazard on sB" in d.message
               for d in errs), short
    # ... and the wgmma reads tiles the other threads' cp.async filled (their wait covers only them)
    assert any(d.code == "E-SYN-06" and "reads sB" in d.message and "[distances]" in d.short() for d in errs), short


@pytest.mark.parametrize("overlap", [False, True])
def test_tile_norms_need_no_norms_kernel_and_their_barrier(overlap):
    """norms "tile": the database norms reduced from each staged tile (swizzle atoms summed one by one)
    while its wgmma runs; no norms kernel and no XN workspace. Without the barrier after the reduction the
    simulator reports the select reading norms other threads wrote (E-SYN-11)."""
    import json

    from cake_ir.io import dumps, load
    ir = knn_wgmma(bq=128, bn=64, stages=4, split=8, overlap=overlap, norms="tile")
    assert [x.name for x in ir.kernels] == ["knn_xq_norms_d128", "knn_l2_k10_d128_128x64_wt_s8_p4" +
                                            ("_ov" if overlap else "") + "_sb"]
    assert [w.name for w in ir.workspace] == ["QN"]
    v = verify(ir)
    assert not [d for d in v.diagnostics if d.severity == "error" or d.code == "N-SYN-01"], \
        [d.short() for d in v.diagnostics]
    assert compile_ir(ir, arch="sm_90a").ok
    doc = json.loads(dumps(ir))
    loop = next(st for st in doc["kernels"][1]["roles"][0]["body"] if st.get("id") == "db_loop")
    if overlap:      # the last tile's barrier (the others' is the next tile's arrival), in both steps

        def drop(body):
            for st in body:
                if st["op"] == "if" and ">= nt" in json.dumps(st["cond"]):
                    st["then"] = [x for x in st["then"] if x["op"] != "syncthreads"]
                elif st["op"] == "if":
                    drop(st["then"])
        drop(loop["body"])
    else:
        i = max(i for i, st in enumerate(loop["body"]) if st["op"] == "syncthreads")
        del loop["body"][i]
    bad, _ = load(doc)
    errs = [d for d in verify(bad).diagnostics if d.severity == "error"]
    assert any(d.code == "E-SYN-11" and "hazard on cn" in d.message for d in errs), [d.short() for d in errs]


needs_gpu = pytest.mark.skipif("not __import__('gpu_backend.driver', fromlist=['x']).gpu_available()",
                               reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,name", [
    ("l2", 130, 4099, 10, "bq64_bn128_s1_p3_wg"), ("l2", 200, 20_001, 32, "bq128_bn128_s1_p3_wg"),
    ("ip", 70, 9_999, 10, "bq128_bn64_s1_p4_wg"), ("l2", 37, 60_001, 16, "bq64_bn128_s8_p3_mw_wg"),
    ("l2", 300, 100_003, 10, "bq64_bn128_s32_p3_mw_wg"), ("l2", 1, 300_001, 1, "bq64_bn128_s128_p3_mw_wg"),
    ("ip", 129, 50_001, 16, "bq128_bn128_s8_p3_mw_wg"), ("l2", 257, 70_001, 10, "bq128_bn64_s128_p4_mw_wg"),
    ("l2", 64, 1000, 16, "bq128_bn64_s8_p4_b2_mw_wg"), ("l2", 10_001, 40_000, 10, "bq128_bn64_s8_p4_mw_wg"),
    # the overlapped ones (two accumulators): odd tile counts, a chunk of one tile, k = 1
    ("l2", 333, 77_777, 10, "bq128_bn64_s8_p4_mw_wg_ov"), ("ip", 65, 5_000, 1, "bq128_bn64_s1_p4_wg_ov"),
    ("l2", 7, 300, 16, "bq64_bn64_s256_p4_mw_wg_ov")])
def test_cakelib_knn_wgmma_variants_match_float64(metric, Q, M, k, name):
    from cakelib.variants import knn_name
    variant = next(p for p in WG if knn_name(p) == "knn_" + name)      # (by name: the list grows)
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    check_cakelib_knn(metric, Q, M, k, variant, seed=9)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("norms", ["tile", "global"])
@pytest.mark.parametrize("Q,M,k,extra", [(130, 4099, 10, {}), (37, 60_001, 16, {"overlap": True}),
                                         (64, 100_003, 1, {"overlap": True}), (300, 20_001, 32, {})])
def test_cakelib_knn_wgmma_norms_match_float64(norms, Q, M, k, extra):
    """Both database-norm forms against float64 (partial tiles, the overlapped loop's last-tile barrier)."""
    from gpu_backend.driver import arch_of, properties
    if arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    p = {"bq": 128, "bn": 64, "split": 8, "stages": 4, "mma": "wgmma", "merge": "kernel", "norms": norms, **extra}
    check_cakelib_knn("l2", Q, M, k, p, seed=5)


def test_overlap_reloading_the_in_flight_slot_is_reported(monkeypatch):
    """Overlapped, the prefetch must skip the slot the still-running wgmma of the previous tile reads:
    with one tile more in flight (the plain kernel's distance) the simulator reports the prefetch's race
    with that wgmma (E-SYN-10) and the top-k reading a column-norm slot still loading (E-SYN-06)."""
    import tasks.knn.wgmma as W
    ok = W.knn_wgmma(overlap=True, bq=128, bn=64, stages=4, split=8)
    assert not [d for d in verify(ok).diagnostics if d.severity == "error"]
    monkeypatch.setattr(W, "prefetch_distance", lambda stages, overlap: stages - 1)
    errs = [d for d in verify(W.knn_wgmma(overlap=True, bq=128, bn=64, stages=4, split=8)).diagnostics
            if d.severity == "error"]
    assert any(d.code == "E-SYN-10" and "race on sB" in d.message and "wgmma" in d.message for d in errs), \
        [d.short() for d in errs]
    assert any(d.code == "E-SYN-06" and "reads cn" in d.message for d in errs), [d.short() for d in errs]


def test_per_call_form_reduces_norms_per_tile_only_where_the_database_bytes_bind():
    """knn_wgmma_norms (the norms A/B): tile norms at k = 1 with <= 128 queries; a norms kernel at
    k > 1 or with more queries; a variant's explicit norms and the mma.sync kernels untouched."""
    from cakelib.variants import KNN_WGMMA_TILE_NORMS as lim, knn_name, knn_wgmma_norms
    wg = {"bq": 64, "bn": 128, "split": 128, "stages": 3, "mma": "wgmma", "merge": "wide"}
    q, k = lim["q_max"], lim["k_max"]
    assert knn_wgmma_norms(wg, {"Q": q, "M": 1 << 20, "k": k})["norms"] == "tile"
    assert "_tn" in knn_name(knn_wgmma_norms(wg, {"Q": q, "M": 1 << 20, "k": k}))
    for shape in ({"Q": q + 1, "M": 1 << 20, "k": k}, {"Q": 1, "M": 1 << 20, "k": k + 1}):
        assert "norms" not in knn_wgmma_norms(wg, shape)
    assert knn_wgmma_norms({**wg, "norms": "global"}, {"Q": 1, "M": 1000, "k": 1})["norms"] == "global"
    sync = {k_: v for k_, v in wg.items() if k_ != "mma"}
    assert knn_wgmma_norms(sync, {"Q": 1, "M": 1000, "k": 1}) == sync


def test_long_variant_names_fit_the_identifier_limit_and_stay_distinct():
    """A capped, queued, seeded split with the merge kernel tags its kernels past 48 characters
    (knn_l2_k10_d128_128x64_wg_s16_p4_b2_q2_mk_sb_smp8): the builder shortens them by a hash."""
    from cake_ir.builder import IDENT_MAX, fit_ident
    from cakelib.variants import knn_kernel
    p = {"bq": 128, "bn": 64, "split": 16, "stages": 4, "mma": "wgmma", "minb": 2, "merge": "kernel", "seed": 8}
    q2, q4 = ({kern.name for kern in knn_kernel({**p, "queue": q}, 10, "l2", 128, "sm_90a").kernels} for q in (2, 4))
    assert all(len(n) <= IDENT_MAX for n in q2 | q4), q2 | q4
    assert len(q2 - q4) == 2, (q2, q4)   # the sample and the search differ by their queue; the rest is shared
    assert fit_ident("a" * IDENT_MAX) == "a" * IDENT_MAX
    assert fit_ident("a" * 60) != fit_ident("a" * 61) and len(fit_ident("a" * 60)) == IDENT_MAX
