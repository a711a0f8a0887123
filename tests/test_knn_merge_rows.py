"""The split search's last-CTA merge over the tile's real query rows (`merge="rows"`, `_mr`): one launch,
where the merge kernel (`_mk`) is a second. The last CTA's threads spread over nr = min(BQ, Q - q0) rows,
tpr = threads / nr each; a thread merges lists sub, sub + tpr, ..., then a tree per row through smem.
CPU: verification, the mapping's conditions, the names and domain, both archs compile. GPU (marked gpu):
float64 checks at every real-row count shape (1, 3, 8, 16 and a second tile of 1), and workspace and
bound words left clean for the next launch of any merge form."""
import pytest

from test_knn_bound import search_near_and_far
from test_knn_fast import check_cakelib_knn, needs_gpu

from cake_ir.verifier import verify
from cake_ir.walk import statements
from tasks.knn.programs import knn_fused

WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "merge": "rows"}


def _conds(kernel) -> list[str]:
    return [s.node.cond for s in statements(kernel) if getattr(s.node, "op", None) == "if"]


@pytest.mark.parametrize("metric,k,kw", [("l2", 10, dict(bq=16, bn=32, split=128, stages=4, ws=4, minb=4)),
                                         ("ip", 16, dict(bq=16, bn=64, split=64, ws=4)),
                                         ("l2", 1, dict(bq=16, bn=32, split=128, stages=4, ws=4)),
                                         ("l2", 10, dict(bq=64, bn=64, split=8))])
def test_rows_merge_is_one_kernel_that_verifies(metric, k, kw):
    ir = knn_fused(metric, k=k, merge="rows", **kw)
    assert ir.name.endswith(("_mr_ws4_sb", "_mr_ws4", "_mr_sb")) and not hasattr(ir, "kernels"), ir.name
    assert not [d.short() for d in verify(ir).diagnostics if d.severity == "error"]
    conds = _conds(ir)
    threads = 32 * (kw["bq"] // 16) * kw.get("ws", 1)
    # the tree: rounds h = threads / 2 ... 1, each reader's partner inside its row
    rounds = [int(c.split("sub < ")[1].split(" ")[0]) for c in conds if "sub + " in c]
    assert rounds == [threads >> i for i in range(1, threads.bit_length())]
    assert "row < nr && sub == 0" in conds


def test_rows_merge_refuses_a_sampled_bound_and_other_merges_keep_their_names():
    with pytest.raises(ValueError, match="rows merge"):
        knn_fused("l2", k=10, bq=16, bn=32, split=128, stages=4, ws=4, merge="rows", seed=8)
    from cakelib.variants import knn_name, knn_queue_key, knn_supports
    assert knn_name(WS4) == knn_name({**WS4, "merge": "kernel"}).replace("_mk", "_mr")
    assert knn_queue_key(WS4) == knn_queue_key({**WS4, "merge": "wide"})   # the same search, the same queue
    shape = {"Q": 8, "M": 100_000, "k": 10, "D": 128, "arch": "sm_90a"}
    assert knn_supports(WS4, shape)
    assert not knn_supports({**WS4, "seed": 8}, shape)
    # its [threads, k] smem lists do not fit sm_80 beside a 4-stage ring at k = 32
    assert not knn_supports({**WS4, "split": 32}, {**shape, "k": 32, "arch": "sm_80"})
    assert knn_supports({**WS4, "split": 32}, {**shape, "k": 32})


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_rows_merge_compiles(arch):
    from cake_ir.compiler import compile_ir
    out = compile_ir(knn_fused("l2", k=10, bq=16, bn=32, split=128, stages=4, ws=4, minb=4, merge="rows", arch=arch),
                     arch=arch)
    assert out.ok, [d.short() for d in out.diagnostics if d.severity == "error"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    ("l2", 1, 100_003, 10, WS4), ("l2", 3, 300_001, 16, WS4), ("ip", 8, 100_000, 10, WS4),
    ("l2", 16, 200_001, 10, {**WS4, "minb": 4}), ("l2", 17, 70_001, 16, {**WS4, "bn": 64, "split": 64, "stages": 2}),
    ("l2", 8, 100_000, 1, WS4), ("l2", 37, 90_001, 10, {"bq": 64, "bn": 64, "split": 8, "merge": "rows"})])
def test_rows_merge_matches_float64_on_gpu(metric, Q, M, k, variant):
    check_cakelib_knn(metric, Q, M, k, variant, seed=41)


@pytest.mark.gpu
@needs_gpu
def test_rows_merge_leaves_workspace_and_bounds_clean_on_gpu():
    """Near, far, near with the rows merge, then the merge kernel and the wide merge on the far database: every
    partial row (the padded rows' too) and bound word must be left zeroed for whichever form runs next."""
    kern, wide = {**WS4, "merge": "kernel"}, {**WS4, "merge": "wide"}
    search_near_and_far("l2", [("near", WS4), ("far", WS4), ("near", WS4), ("far", kern), ("near", WS4),
                               ("far", wide)], seed=43, Q=5)


def test_split_options_take_the_rows_merge_for_few_query_streams(monkeypatch):
    """A fitted `merge_rows` range turns a few-query stream pick (ws > 1) at Q <= max_Q into the rows merge;
    larger Q, unsplit-warp picks (ws 1) and seeded forms keep theirs; no range, no change."""
    from cakelib import variants
    base = {"merge_kernel_k": ["k>1"], "seed": {"F": 8, "mma": "wgmma", "min_M": 262144, "min_k": 2}}
    pick = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "merge": "wide"}
    wg = {"mma": "wgmma", "bq": 128, "bn": 64, "split": 128, "stages": 4, "merge": "wide"}
    shape = {"Q": 8, "M": 100_000, "k": 10, "D": 128, "arch": "sm_90a"}
    monkeypatch.setattr(variants, "_split_table", lambda: base)
    assert variants.knn_split_options(pick, shape)["merge"] == "kernel"
    monkeypatch.setattr(variants, "_split_table", lambda: {**base, "merge_rows": {"max_Q": 16}})
    assert variants.knn_split_options(pick, shape)["merge"] == "rows"
    assert variants.knn_split_options(pick, {**shape, "k": 1})["merge"] == "rows"
    assert variants.knn_split_options(pick, {**shape, "Q": 17})["merge"] == "kernel"
    assert variants.knn_split_options(wg, {**shape, "Q": 8})["merge"] == "kernel"


def test_fit_merge_rows_takes_the_largest_q_range_that_is_not_slower(tmp_path):
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from topk_queue_ab import fit_merge_form
    ws4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "ws": 4, "merge": "kernel"}

    def row(Q, kern, rows, params=ws4):
        return {"shape": {"Q": Q, "M": 100000, "k": 10}, "params": params,
                "builds": {"kernel": {"ok": True, "ms": kern}, "rows": {"ok": True, "ms": rows}}}
    ab = tmp_path / "ab.json"
    table = tmp_path / "split.json"
    table.write_text(json.dumps({"merge_kernel_k": ["k>1"]}))
    ab.write_text(json.dumps({"rows": [row(1, 0.040, 0.037), row(8, 0.041, 0.040), row(16, 0.043, 0.045),
                                       row(32, 0.046, 0.044), row(128, 0.08, 0.07, {"bq": 128, "ws": 1})]}))
    out = fit_merge_form(str(ab), str(table), "rows")
    assert out["merge_rows"] == {"max_Q": 8, "max_k": 10} and out["merge_kernel_k"] == ["k>1"]   # 16: 1.05x, ends
    assert json.loads(table.read_text())["merge_rows"] == {"max_Q": 8, "max_k": 10}
    ab.write_text(json.dumps({"rows": [row(1, 0.040, 0.042)]}))
    assert fit_merge_form(str(ab), str(table), "rows")["merge_rows"] is None


def test_family_space_offers_the_rows_merge_only_where_it_builds():
    from tasks.knn.programs import FAMILIES
    fam = FAMILIES["knn_l2_mma_sm80"]
    assert "rows" in fam["space"]["merge"]
    ok = {**fam["defaults"], **WS4, "k": 10}
    assert fam["check"](ok) and not fam["check"]({**ok, "seed": 8})
    fam["make"](**{n: v for n, v in ok.items() if n != "metric"}, metric="l2")   # builds
