"""`topk` rolled (k > 1 over mma / wgmma accumulators): a row's passing scores go through one rolled loop
over a bit mask instead of an unrolled insertion per column (every kNN kernel's default:
1.0-2.3x less time, bench/results/topk-rolled-ab-h200.json). CPU: the lowering's shape (a mask per row,
one loop, one insertion site per row instead of one per column), the static code it saves (SASS, the
search loop), the refusals that name the node; the variant name. GPU (marked): rolled kNN variants against
float64 (split and unsplit, mma.sync and wgmma, queue and none, ragged database ends)."""
import json

import pytest

from test_knn_fast import needs_gpu

from cake_ir.compiler import compile_ir, compile_kernel
from cake_ir.io import dumps, load
from cake_ir.verifier import verify
from cakelib.variants import knn_kernel, knn_name
from tasks.knn.programs import knn_fused
from tasks.knn.wgmma import knn_wgmma


def _search(ir):
    return ir.kernels[-1] if hasattr(ir, "kernels") else ir


@pytest.mark.parametrize("queue", [0, 2])
def test_rolled_lowering_inserts_from_one_loop_per_row(queue):
    plain = knn_fused("l2", k=32, bq=64, bn=64, queue=queue, arch="sm_90a", rolled=False)
    rolled = knn_fused("l2", k=32, bq=64, bn=64, queue=queue, arch="sm_90a")          # the default
    assert not [d.short() for d in verify(rolled).diagnostics if d.severity == "error"]
    a = compile_kernel(_search(plain), emit="cuda").cuda_source.split("__global__")[-1]
    b = compile_kernel(_search(rolled), emit="cuda").cuda_source.split("__global__")[-1]
    assert "cake_m" not in a
    assert b.count("for (; cake_m != 0u; cake_m &= cake_m - 1u)") == 2          # a loop per row slot
    assert b.count("if (cake_i == cake_j) cake_sv = cake_s[") == 2            # the select chain
    on_spot = "cake::topk_insert<32, true>(cake_tv, cake_ti, cake_v, cake_cb + cake_c);"
    # (unrolled by the compiler: the plain form's site runs once per column, the rolled one's once per loop trip)
    assert a.count(on_spot) == b.count(on_spot) == 2
    assert "#pragma unroll 1" in b


def test_rolled_search_loop_is_a_fraction_of_the_code():
    """The k = 32 wgmma build's search loop in SASS: the unrolled insertions were ~9200 instructions (ncu:
    the instruction cache stalls); rolled, about a fifth, with the hot path (no score passes)
    a few instructions longer (the mask) and no spills."""
    from cake_ir.analysis.sass import find_nvdisasm
    if find_nvdisasm() is None:
        pytest.skip("needs nvdisasm (nvidia-cuda-nvdisasm)")
    from bench.sass_hot_path import measure
    p = {"bq": 128, "bn": 64, "split": 1, "stages": 4, "mma": "wgmma", "queue": 2}
    a = measure(_search(knn_kernel({**p, "rolled": False}, 32, "l2", 128, "sm_90a")), "sm_90a")
    b = measure(_search(knn_kernel(p, 32, "l2", 128, "sm_90a")), "sm_90a")
    assert b["loop_static"] * 3 < a["loop_static"], (a["loop_static"], b["loop_static"])
    assert b["hot"] <= a["hot"] + 12 and b["spill_bytes"] == 0, (a["hot"], b["hot"], b["spill_bytes"])


def test_rolled_is_refused_where_it_has_no_meaning():
    k1 = knn_wgmma("l2", k=1, bq=64, bn=64, stages=3)
    doc = json.loads(dumps(_search(k1)))

    def topks(node):
        if isinstance(node, dict):
            if node.get("op") == "topk":
                yield node
            for v in node.values():
                yield from topks(v)
        elif isinstance(node, list):
            for v in node:
                yield from topks(v)
    node = next(topks(doc))
    node["rolled"] = True
    r = compile_ir(load(doc)[0], arch="sm_90a", emit="cuda")
    bad = [d for d in r.diagnostics if d.severity == "error"]
    assert not r.ok and "rolled is for k > 1" in bad[0].message and bad[0].node.startswith("/roles/"), bad


def test_rolled_is_the_library_default_and_the_old_form_is_named():
    """Every kNN variant runs rolled (the builders' default) under its old name, the committed tables' names;
    the unrolled form is `_ur`; the builders default to rolled (the library and the agent's seeds)."""
    from tasks.base import signature_defaults
    assert signature_defaults(knn_fused)["rolled"] is True and signature_defaults(knn_wgmma)["rolled"] is True
    p = {"bq": 128, "bn": 64, "split": 1, "stages": 4, "mma": "wgmma"}
    assert knn_name({**p, "rolled": True}) == knn_name(p) == "knn_bq128_bn64_s1_p4_wg"
    assert knn_name({**p, "rolled": False}) == knn_name(p) + "_ur"
    # one queue-table entry for both forms: an A/B of the insertion compares the insertion, not the queue
    from cakelib.variants import knn_queue, knn_queue_key
    assert knn_queue_key({**p, "rolled": False}) == knn_queue_key({**p, "rolled": True}) == knn_queue_key(p)
    assert knn_queue({**p, "rolled": False}, 32) == knn_queue(p, 32) == 2      # the committed table's fit
    src = compile_kernel(_search(knn_kernel(p, 16, "l2", 128, "sm_90a")), emit="cuda").cuda_source
    assert "for (; cake_m != 0u; cake_m &= cake_m - 1u)" in src
    assert "cake_m" not in compile_kernel(_search(knn_kernel({**p, "rolled": False}, 16, "l2", 128, "sm_90a")),
                                          emit="cuda").cuda_source


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 70, 9999, 32, {"bq": 64, "bn": 64, "split": 1, "stages": 2, "queue": 2, "rolled": True}),
    ("ip", 37, 20_001, 16, {"bq": 16, "bn": 32, "split": 8, "stages": 4, "norms": "global", "merge": "wide",
                            "rolled": True}),
    ("l2", 1, 1_000_003, 16, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4, "queue": 2,
                              "rolled": True}),
    ("l2", 200, 20_001, 32, {"mma": "wgmma", "bq": 128, "bn": 64, "split": 1, "stages": 4, "queue": 2, "rolled": True}),
    ("l2", 333, 77_777, 10, {"mma": "wgmma", "bq": 64, "bn": 64, "split": 8, "stages": 4, "merge": "wide",
                             "overlap": True, "rolled": True}),
    ("l2", 4100, 33_333, 16, {"mma": "wgmma", "bq": 128, "bn": 64, "split": 1, "stages": 4, "minb": 2, "queue": 2,
                              "rolled": True})])
def test_rolled_variants_match_float64_on_gpu(metric, Q, M, k, variant):
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    check_cakelib_knn(metric, Q, M, k, variant, seed=13)


def test_rolled_insertion_tactic_is_in_the_families_and_found_by_its_symptom():
    from tasks.knn.programs import FAMILIES
    from tactics.base import get_tactic, retrieve
    for fam in FAMILIES.values():
        assert fam["tactics"]["topk_rolled_insertion"] == ["rolled"] and fam["space"]["rolled"] == [True, False]
        assert fam["defaults"]["rolled"] is True
    assert get_tactic("topk_rolled_insertion") is not None
    names = [t.name for t in retrieve("the top-k search loop stalls on the instruction cache (no instruction): "
                                      "the unrolled insertion code is too large", k=3)]
    assert "topk_rolled_insertion" in names
