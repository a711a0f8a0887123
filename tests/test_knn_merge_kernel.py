"""The split search's merge as a kernel of its own (`merge="kernel"`, `_mk`): the search
kernel stores its partial lists and stops; `knn_merge` follows with a warp per query row (lanes merge
lists l, l + 32, ..., then a tree through shared memory). ncu had shown the last-CTA merge running on one
SM for ~190 of the 248 us of a Q = 128, M = 100K, k = 10 search. CPU: the Programs, verification, the
tree's rounds, the rules seeing the reset in the later kernel. GPU (marked gpu): every family with the
merge kernel against float64, with the sampled bound, back-to-back launches."""
import pytest

from test_knn_bound import search_near_and_far, wgmma_ok
from test_knn_fast import check_cakelib_knn, needs_gpu

from cake_ir.verifier import verify
from cake_ir.walk import statements
from tasks.knn.programs import knn_fused, knn_merge
from tasks.knn.wgmma import knn_wgmma


def _ops(kernel, op):
    return [s.node for s in statements(kernel) if getattr(s.node, "op", None) == op]


BUILDS = [
    lambda **kw: knn_fused("l2", k=10, bq=16, bn=32, split=128, stages=4, merge="kernel", ws=4, **kw),
    lambda **kw: knn_fused("ip", k=16, bq=64, bn=64, split=8, merge="kernel", **kw),
    lambda **kw: knn_fused("l2", k=16, bq=16, bn=32, split=32, stages=4, merge="kernel", norms="global", **kw),
    lambda **kw: knn_wgmma("l2", k=10, bq=128, bn=64, split=128, stages=4, merge="kernel", **kw),
    lambda **kw: knn_wgmma("ip", k=32, bq=64, bn=64, split=8, stages=4, merge="kernel", overlap=True, **kw)]


@pytest.mark.parametrize("make", BUILDS)
def test_merge_kernel_follows_the_search(make):
    prog = make()
    search, merge = prog.kernels[-2], prog.kernels[-1]
    assert "_mk" in search.name and merge.name.startswith("knn_merge_") and prog.name == search.name
    assert not _ops(search, "last_cta"), "the search no longer merges"
    assert [a for a in _ops(search, "stg") if a.dst.buf == "PV"]
    assert not [a for a in _ops(search, "stg") if a.dst.buf in ("I", "Dist")]
    assert {a.dst.buf for a in _ops(merge, "stg")} >= {"I", "Dist", "PV", "PI", "TH"}
    assert not [d for d in verify(prog).diagnostics if d.severity == "error"]


@pytest.mark.parametrize("make", BUILDS)
def test_seeded_merge_kernels(make):
    """With the sampled bound: sample, its merge (storing bounds, no results), search, its merge."""
    prog = make(seed=8)
    names = [k.name for k in prog.kernels]
    assert names[-4].endswith("_smp8") and names[-3].endswith("_bound") and names[-2].endswith("_sd8") \
        and names[-1].startswith("knn_merge_") and not names[-1].endswith("_bound")
    smerge = prog.kernels[-3]
    assert [b.mode for b in _ops(smerge, "topk_bound")] == ["store"]
    assert {"I", "Dist"}.isdisjoint(p.name for p in smerge.params)
    assert not [d for d in verify(prog).diagnostics if d.severity == "error"]


def test_tree_rounds_follow_the_lists_a_warp_holds():
    """Lanes hold min(split, 32) lists after the first pass: the tree halves them (16, 8, 4, 2, 1 at
    32 or more splits; 4, 2, 1 at 8); a 2-way split needs one round, and every round's reader takes the
    list its partner wrote the round before."""
    got = {sp: [int(s.node.cond.split("< ")[1]) for s in statements(knn_merge(10, 64, sp))
                if getattr(s.node, "op", None) == "if" and s.node.cond.startswith("lane < ")] for sp in (2, 8, 64, 128)}
    assert got == {2: [1], 8: [4, 2, 1], 64: [16, 8, 4, 2, 1], 128: [16, 8, 4, 2, 1]}


def test_rules_see_the_reset_in_the_merge_kernel():
    """E-TOPK-03 accepts the shared bound's reset in a later kernel of the program; the search alone
    (no merge kernel after it) is reported."""
    prog = knn_wgmma("l2", k=16, bq=128, bn=64, split=16, stages=4, merge="kernel")
    assert not [d for d in verify(prog).diagnostics if d.code == "E-TOPK-03"]
    alone = verify(prog.kernels[-2])
    assert [d for d in alone.diagnostics if d.code == "E-TOPK-03" and "resets" in d.message]


def test_variant_names_know_the_merge_kernel():
    from cakelib.variants import knn_kernel, knn_name, knn_tile_registers
    p = {"mma": "wgmma", "bq": 128, "bn": 64, "split": 64, "stages": 4}
    assert knn_name({**p, "merge": "kernel"}) == knn_name({**p, "merge": "wide"}).replace("_mw", "_mk")
    assert knn_tile_registers({**p, "merge": "kernel"}, 16, 128) == knn_tile_registers({**p, "merge": "wide"}, 16, 128) - 64
    assert knn_kernel({**p, "merge": "kernel"}, 16, "l2", 128, "sm_90a").kernels[-1].name == "knn_merge_k16_bq128_s64"


WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "merge": "kernel"}
WG = {"mma": "wgmma", "bq": 128, "bn": 64, "stages": 4, "merge": "kernel"}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 1_000_003, 16, WS4), ("ip", 3, 300_001, 10, {**WS4, "split": 8}),
    ("l2", 37, 200_001, 16, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "norms": "global", "merge": "kernel"}),
    ("l2", 50, 70_001, 10, {"bq": 64, "bn": 64, "split": 8, "stages": 2, "merge": "kernel"}),
    ("l2", 129, 100_003, 10, {**WG, "split": 128}), ("l2", 128, 100_000, 1, {**WG, "split": 128}),
    ("ip", 300, 100_003, 32, {**WG, "split": 16, "queue": 4}),
    ("l2", 200, 90_001, 16, {**WG, "bq": 64, "split": 8, "overlap": True}),
    ("l2", 129, 500_001, 16, {**WG, "split": 64, "seed": 8}), ("l2", 5, 300_001, 16, {**WS4, "seed": 8})])
def test_merge_kernel_variants_match_float64_on_gpu(metric, Q, M, k, variant):
    if not wgmma_ok(variant):
        pytest.skip("wgmma needs sm_90a")
    check_cakelib_knn(metric, Q, M, k, variant, seed=31)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", [WS4, {**WG, "split": 16}, {**WG, "split": 16, "seed": 8}])
def test_merge_kernel_leaves_workspace_and_bounds_clean_on_gpu(variant):
    """Near, far, near databases with the same variant, then the last-CTA merge on the far one: the merge
    kernel must zero every partial row (padded queries' too) and every bound word it leaves."""
    if not wgmma_ok(variant):
        pytest.skip("wgmma needs sm_90a")
    wide = {**variant, "merge": "wide"}
    wide.pop("seed", None)
    search_near_and_far("l2", [("near", variant), ("far", variant), ("near", variant), ("far", wide)], seed=37)


@pytest.mark.parametrize("k,kind", [(10, "min"), (16, "max"), (32, "min")])
def test_merge_kernel_merges_stored_lists_by_the_bitonic_network(k, kind):
    """Every list the merge kernel reads is sorted, so each goes through one bitonic merge
    (cake::topk_merge_sorted: 34 -> ~10 us at Q = 1, k = 16), never k insertions; the cost
    model counts the network, under half the k insertions of ~6 k instructions each at k >= 8."""
    from cake_ir.compiler import compile_ir
    from cake_ir.cost import topk_merge_instrs
    merge = knn_merge(k, 128, 64, kind=kind, arch="sm_90a")
    assert all(t.src_sorted for t in _ops(merge, "topk"))
    out = compile_ir(merge, emit="cuda")
    assert out.ok, [d.short() for d in out.diagnostics]
    src = out.cuda_source.split("knn_merge_")[-1]   # (the kernel, not the runtime header)
    # the lanes' lists, then the tree's 5 unrolled rounds (32 lanes)
    assert src.count(f"cake::topk_merge_sorted<{k}, {'true' if kind == 'min' else 'false'}>") == 1 + 5
    assert "cake::topk_insert" not in src
    assert topk_merge_instrs(k) < 6 * k * k / 2 and topk_merge_instrs(16) == 3 * 16 + 5 * 8 * 4


def test_sorted_merge_tactic_marks_the_list_merges_and_verifies():
    """topk_sorted_merge on the unsorted-merge form of a last-CTA merge search puts src_sorted back on
    every merge of stored lists (and only there); the result verifies; the tactic library finds it."""
    import json
    from cake_ir.io import load
    from tactics import get_tactic
    from tactics.base import retrieve
    ir = json.loads(knn_fused("l2", k=16, bq=16, bn=32, split=32, stages=4).model_dump_json(exclude_none=True))
    marked = [st for st in _ops(load(ir)[0], "topk") if st.src_sorted]
    assert marked
    plain = json.loads(json.dumps(ir).replace('"src_sorted": true', '"src_sorted": false'))
    t = get_tactic("topk_sorted_merge")
    g = {"ir": plain, "recipe": None}
    assert t.applicable(g) is None
    new = t.apply(g, t.choices(g)[0])["ir"]
    k, diags = load(new)
    assert k is not None, diags
    assert [st.src_sorted for st in _ops(k, "topk")] == [st.src_sorted for st in _ops(load(ir)[0], "topk")]
    assert verify(k).ok
    assert t.applicable({"ir": new, "recipe": None}) is not None      # nothing left to mark
    assert "topk_sorted_merge" in [x.name for x in retrieve("merge partial top-k lists faster", k=5)]
