"""The split search's merge by the tile's last CTAs (`merge="tail"`, `_mt`, IR op `arrive_wait`): every CTA
stores its partial lists and arrives on its tile's counter; the last cdiv(BQ, warps) CTAs of the tile wait
for all SPLIT arrivals and merge a query row per warp, as the merge kernel does, in the same launch. CPU:
the builds (one kernel, the waiters, no last-CTA merge), verification, the lowering and NVRTC builds for
sm_80 and sm_90a, E-GRID-01 on `arrive_wait`. GPU (marked gpu): variants against float64, back-to-back
launches on different data (the counter and the workspace left as the next launch expects)."""
import pytest

from test_knn_bound import search_near_and_far
from test_knn_fast import check_cakelib_knn, needs_gpu

from cake_ir.nodes import ArriveWait, LastCta
from cake_ir.verifier import verify
from cake_ir.walk import statements
from tasks.knn.programs import knn_fused

WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "minb": 4, "merge": "tail"}
WIDE_TILE = {"bq": 64, "bn": 64, "split": 16, "stages": 2, "merge": "tail"}


def _ops(kernel, cls):
    return [s for s in statements(kernel) if isinstance(s.node, cls)]


def _build(p, k=10, metric="l2", arch="sm_90a"):
    from cakelib.variants import knn_kernel
    return knn_kernel(p, k, metric, 128, arch)


@pytest.mark.parametrize("p, waiters", [(WS4, 4), ({**WS4, "split": 8, "minb": 1}, 4), (WIDE_TILE, 16)])
@pytest.mark.parametrize("k", [1, 10])
def test_the_last_ctas_of_each_tile_merge_in_the_search_kernel(p, waiters, k):
    ir = _build(p, k)
    assert not hasattr(ir, "kernels"), "one kernel: no merge kernel after the search"
    assert "_mt" in ir.name
    (site,) = _ops(ir, ArriveWait)
    aw = site.node
    assert aw.when == f"bid.y >= (SPLIT - {waiters})" and aw.waiters == waiters and aw.count == "SPLIT"
    assert [s for s in _ops(ir, LastCta) if not isinstance(s.node, ArriveWait)] == []
    stores = [s for s in statements(ir) if getattr(s.node, "op", None) == "stg" and s.node.dst.buf in ("I", "Dist")]
    assert stores and all(s.path.startswith(site.path + "/body/") for s in stores)
    assert not [d.short() for d in verify(ir).diagnostics if d.severity == "error"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("p, k", [(WS4, 10), ({**WS4, "minb": 1, "split": 64, "stages": 2}, 16),
                                  (WIDE_TILE, 32)])
def test_tail_builds_compile_without_spills(arch, p, k):
    from cake_ir.compiler import compile_ir, compiled_parts
    res = compile_ir(_build(p, k, arch=arch), emit="cuda")
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    assert all(x.resources.get("spill_store_bytes", 0) == 0 for x in compiled_parts(res))
    src = res.cuda_source.split("__global__")[-1]     # (the kernel, not the runtime header)
    assert src.count("cake::arrive(") == 1 and src.count("cake::wait_arrivals(") == 1 \
        and src.count("cake::depart(") == 1


def test_builder_refuses_what_the_tail_cannot_do():
    with pytest.raises(ValueError, match="split >= cdiv"):
        knn_fused("l2", k=10, bq=64, bn=64, split=8, merge="tail")      # 16 waiting CTAs of 8
    with pytest.raises(ValueError, match="seed needs"):
        knn_fused("l2", k=10, bq=16, bn=32, split=32, stages=4, ws=4, merge="tail", seed=8)


def test_variants_name_and_bound_the_tail():
    from cakelib.variants import knn_name, knn_supports
    shape = {"Q": 8, "M": 100_000, "k": 10, "D": 128, "arch": "sm_90a"}
    assert knn_name(WS4) == knn_name({**WS4, "merge": "kernel"}).replace("_mk", "_mt")
    assert knn_supports(WS4, shape) and knn_supports(WIDE_TILE, shape)
    assert not knn_supports({**WIDE_TILE, "split": 8}, shape)
    assert not knn_supports({**WS4, "seed": 8}, shape)


def test_split_options_take_the_tail_merge_where_fitted(monkeypatch):
    """A fitted `merge_tail` range turns a few-query stream pick (ws > 1) with the merge kernel at Q <= max_Q
    into the tail merge, ahead of a rows range; larger Q, k = 1 (the wide merge: one launch already, and not
    what the tail was timed against) and wgmma picks keep theirs."""
    from cakelib import variants
    base = {"merge_kernel_k": ["k>1"]}
    pick = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "merge": "wide"}
    wg = {"mma": "wgmma", "bq": 128, "bn": 64, "split": 128, "stages": 4, "merge": "wide"}
    shape = {"Q": 8, "M": 100_000, "k": 10, "D": 128, "arch": "sm_90a"}
    monkeypatch.setattr(variants, "_split_table", lambda: {**base, "merge_tail": {"max_Q": 16},
                                                           "merge_rows": {"max_Q": 32}})
    assert variants.knn_split_options(pick, shape)["merge"] == "tail"
    assert variants.knn_split_options(pick, {**shape, "Q": 17})["merge"] == "rows"
    assert variants.knn_split_options(pick, {**shape, "Q": 33})["merge"] == "kernel"
    assert variants.knn_split_options(pick, {**shape, "k": 1})["merge"] == "rows"   # (k = 1 keeps no merge kernel)
    assert variants.knn_split_options(wg, shape)["merge"] == "kernel"
    monkeypatch.setattr(variants, "_split_table", lambda: {**base, "merge_tail": {"max_Q": 16, "max_k": 16}})
    assert variants.knn_split_options(pick, {**shape, "k": 16})["merge"] == "tail"
    assert variants.knn_split_options(pick, {**shape, "k": 32})["merge"] == "kernel"   # (beyond the k it was timed at)


def test_fit_takes_the_box_of_q_and_k_where_the_tail_is_not_slower(tmp_path):
    """A k = 32 shape where the tail loses (its smem lists cost occupancy) bounds k, not Q: the fit keeps
    every Q measured at k <= 16."""
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from topk_queue_ab import fit_merge_form

    def row(Q, k, kern, tail):
        return {"shape": {"Q": Q, "M": 100000, "k": k}, "params": WS4,
                "builds": {"kernel": {"ok": True, "ms": kern}, "tail": {"ok": True, "ms": tail}}}
    ab, table = tmp_path / "ab.json", tmp_path / "split.json"
    ab.write_text(json.dumps({"rows": [row(1, 10, 0.040, 0.039), row(1, 32, 0.070, 0.098), row(8, 16, 0.044, 0.041),
                                       row(32, 10, 0.047, 0.046), row(32, 32, 0.093, 0.121)]}))
    assert fit_merge_form(str(ab), str(table), "tail")["merge_tail"] == {"max_Q": 32, "max_k": 16}
    ab.write_text(json.dumps({"rows": [row(1, 10, 0.040, 0.045)]}))
    assert fit_merge_form(str(ab), str(table), "tail")["merge_tail"] is None


def _arrive_wait_kernel(when, waiters):
    """A minimal kernel: every CTA arrives, the CTAs where `when` holds wait and store a tile."""
    from cake_ir.builder import KernelBuilder, tile
    kb = KernelBuilder("aw_fx", arch="sm_80", grid=[8], threads=64)
    kb.const(W=2)
    kb.tensor("T", "i32", [1], access="readwrite")
    kb.tensor("Y", "f32", [1, 64], access="write")
    kb.buffer("y", "reg", "f32", [1, 64], layout="blocked", scope="cta")
    with kb.role("main", warps=(0, 2)) as r:
        r.fill("y", 1.0)
        fin = r.add("arrive_wait", counter=tile("T", [0], [1]), count="nbid.x", waiters=waiters, when=when, body=[])
        with r._nest(fin["body"]):
            r.stg(tile("y"), tile("Y", [0, 0], [1, 64]), vec_bytes=4)
    return kb.build()


def test_e_grid_01_wants_whole_ctas_and_a_waiter():
    ok = verify(_arrive_wait_kernel("bid.x >= nbid.x - W", 2))
    assert not [d for d in ok.diagnostics if d.code == "E-GRID-01"]
    per_thread = verify(_arrive_wait_kernel("tid < 32", 2))
    hits = [d for d in per_thread.diagnostics if d.code == "E-GRID-01"]
    assert hits and hits[0].node.endswith("/when") and "tid" in hits[0].message
    none = verify(_arrive_wait_kernel("bid.x >= nbid.x - W", 0))
    assert [d for d in none.diagnostics if d.code == "E-GRID-01" and d.node.endswith("/waiters")]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 1_000_003, 16, {**WS4, "minb": 1}), ("l2", 8, 100_000, 10, WS4), ("l2", 3, 300_001, 1, WS4),
    ("ip", 13, 300_001, 10, {**WS4, "split": 8, "minb": 1}), ("l2", 32, 70_001, 32, {**WS4, "minb": 1, "split": 64}),
    ("l2", 50, 70_001, 10, WIDE_TILE), ("l2", 37, 200_001, 16, {**WS4, "minb": 1, "norms": "global"})])
def test_tail_merge_matches_float64_on_gpu(metric, Q, M, k, variant):
    check_cakelib_knn(metric, Q, M, k, variant, seed=41)


@pytest.mark.gpu
@needs_gpu
def test_tail_merge_leaves_counter_workspace_and_bounds_clean_on_gpu():
    """Near, far, near databases with the tail merge, then the last-CTA merge on the far one: a counter not
    reset would let the next launch's waiters merge before the search ends; a partial row or bound word
    left over would replace or filter a later search's true neighbours."""
    v = {**WS4, "minb": 1}
    wide = {**v, "merge": "wide"}
    search_near_and_far("l2", [("near", v), ("far", v), ("near", v), ("far", v), ("far", wide)], seed=43)
