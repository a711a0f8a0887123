"""The deferred top-k insertion: the queue width as the library picks it (cakelib.variants.knn_queue) and
as bench/topk_queue_ab.py fits it, E-TOPK-02 on the kNN builders' own programs, the family tactic; on a
GPU, queued variants against float64 (marked gpu)."""
import json

import pytest

from test_knn_fast import needs_gpu

from cake_ir.verifier import verify
from cakelib import variants as V


def test_explicit_queue_wins_and_k1_has_none():
    p = {"bq": 128, "bn": 64, "split": 1, "stages": 2, "norms": "global"}
    assert V.knn_queue({**p, "queue": 4}, 32) == 4
    assert V.knn_queue({**p, "queue": 0}, 32) == 0
    assert V.knn_queue({**p, "queue": 4}, 1) == 0


def test_table_lookup_takes_the_largest_listed_k_below(monkeypatch):
    monkeypatch.setattr(V, "_queue_table", lambda: {"knn_bq64_bn64_s1_p2": {"16": 2, "32": 4}})
    p = {"bq": 64, "bn": 64, "split": 1, "stages": 2}
    assert [V.knn_queue(p, k) for k in (2, 10, 15, 16, 20, 32, 64)] == [0, 0, 0, 2, 2, 4, 4]
    assert V.knn_queue({**p, "bq": 32}, 32) == 0          # a variant the table does not list


def test_committed_table_names_sweep_variants_whose_queued_builds_fit():
    from bench.lib_grid import knn_variants
    by_name = {V.knn_name(p): p for p in knn_variants()}
    table = V._queue_table()
    assert table, "cakelib/tables/topk_queue/knn.json is missing"
    for name, by_k in table.items():   # (a seeded form `_sd{F}` keeps its own entry: knn_queue_key)
        base, _, f = name.partition("_sd")
        assert base in by_name, name
        p = {**by_name[base], **({"seed": int(f)} if f else {})}
        assert V.knn_queue_key(p) == name
        for k, t in by_k.items():
            if t:
                assert V.knn_registers_fit(p, int(k), 128), (name, k, t)


def test_fit_keeps_a_width_only_when_its_geomean_beats_the_margin(tmp_path):
    from bench.topk_queue_ab import fit

    def row(variant, k, ms):
        return {"shape": {"Q": 1, "M": 100, "k": k}, "variant": variant,
                "builds": {str(q): ({"ok": True, "ms": m} if m else {"ok": False}) for q, m in ms.items()}}
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps({"rows": [
        row("a", 16, {0: 1.0, 2: 0.8, 4: 0.9}), row("a", 16, {0: 1.0, 2: 1.1, 4: 0.95}),   # 2: 0.938, 4: 0.925
        row("b", 16, {0: 1.0, 2: 0.98}),                                                   # inside the margin
        row("c", 32, {0: 1.0, 2: 0.5, 4: None}),                                           # 4 failed once
        row("c", 32, {0: 1.0, 2: 0.6, 4: 0.1})]}))
    doc = fit([str(ab)], str(tmp_path / "q.json"))
    assert doc["queues"] == {"a": {"16": 4}, "b": {"16": 0}, "c": {"32": 2}}
    assert json.loads((tmp_path / "q.json").read_text())["queues"] == doc["queues"]
    again = tmp_path / "ab2.json"   # a later run re-measures ("a", 16): its rows replace the earlier ones
    again.write_text(json.dumps({"rows": [row("a", 16, {0: 1.0, 2: 1.2, 4: 1.1})]}))
    assert fit([str(ab), str(again)], str(tmp_path / "q2.json"))["queues"]["a"] == {"16": 0}


@pytest.mark.parametrize("builder", ["sync", "wgmma"])
def test_builders_emit_a_flushing_merge(builder):
    """The queued programs verify clean; without the merge's queue E-TOPK-02 names the topk."""
    from tasks.knn.programs import knn_fused
    from tasks.knn.wgmma import knn_wgmma
    make = (lambda: knn_fused("ip", k=16, bq=64, bn=64, queue=2, arch="sm_90a")) if builder == "sync" else \
        (lambda: knn_wgmma("ip", k=16, bq=128, bn=64, stages=4, queue=2))
    k = make()
    assert not [d.short() for d in verify(k).diagnostics if d.severity == "error"]
    merge = next(s for s in k.roles[0].body if getattr(s, "op", None) == "topk_merge")
    merge.queue_vals = merge.queue_idx = None
    hits = [d for d in verify(k).diagnostics if d.code == "E-TOPK-02"]
    assert hits and "no later topk_merge" in hits[0].message, [d.short() for d in verify(k).diagnostics]


GN = {"bq": 64, "bn": 64, "split": 1, "stages": 2, "norms": "global"}
GN_SPLIT = {"bq": 16, "bn": 32, "split": 8, "stages": 4, "norms": "global", "merge": "wide"}
WS4 = {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4}
WG = {"mma": "wgmma", "bq": 128, "bn": 128, "stages": 3}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,Q,M,k,variant", [
    # mma.sync: split, unsplit, k = 32, the few-query stream, 4 rows per lane (wm 32)
    ("l2", 37, 20_001, 16, {**GN_SPLIT, "queue": 4}), ("ip", 50, 7001, 10, {**GN, "queue": 2}),
    ("l2", 70, 9999, 32, {"bq": 64, "bn": 64, "split": 1, "stages": 2, "queue": 4}),
    ("l2", 1, 1_000_003, 16, {**WS4, "queue": 4}),
    ("l2", 90, 40_001, 10, {**WS4, "bq": 32, "wm": 32, "stages": 3, "split": 8, "queue": 2}),
    # wgmma: unsplit k = 32, split, overlapped, one warpgroup with T = 8
    ("l2", 200, 20_001, 32, {**WG, "split": 1, "queue": 4}),
    ("ip", 129, 50_001, 16, {**WG, "split": 8, "merge": "wide", "queue": 4}),
    ("l2", 333, 77_777, 10, {"mma": "wgmma", "bq": 64, "bn": 64, "split": 8, "stages": 4, "merge": "wide",
                             "overlap": True, "queue": 2}),
    ("l2", 4100, 33_333, 16, {"mma": "wgmma", "bq": 64, "bn": 128, "split": 1, "stages": 3, "queue": 8})])
def test_queued_variants_match_float64_on_gpu(metric, Q, M, k, variant):
    from gpu_backend.driver import arch_of, properties
    if variant.get("mma") == "wgmma" and arch_of(properties(0)) != "sm_90a":
        pytest.skip("wgmma needs sm_90a")
    from test_knn_fast import check_cakelib_knn
    check_cakelib_knn(metric, Q, M, k, variant, seed=11)


@pytest.mark.parametrize("seed", ["knn_l2_mma_sm80", "knn_l2_wgmma_sm90a"])
def test_topk_queue_family_tactic_builds_a_verified_queued_search(seed):
    """The search proposer's way to the deferred insertion: the family tactic re-instantiates the kNN
    seed with a queue; the program verifies clean and its merge flushes the queue."""
    from cake_ir.io import load
    from tactics.base import get_tactic
    from tasks.registry import get
    tac = get_tactic("topk_queue")
    g = {x["name"]: x for x in get("knn").seed_genomes()}[seed]
    assert {"queue": 2} in tac.choices(g)
    out = tac.apply(g, {"queue": 2})
    assert out["recipe"]["params"]["queue"] == 2
    k, _ = load(out["ir"])
    res = verify(k)
    assert res.ok, [d.short() for d in res.diagnostics if d.severity == "error"]
    doc = json.dumps(out["ir"])
    assert doc.count('"queue_idx"') >= 2 and '"qv"' in doc


def test_topk_queue_tactic_is_found_by_its_problem():
    from tactics.base import retrieve
    assert retrieve("lanes of a warp diverge while selecting the best candidates", k=1)[0].name == "topk_queue"
    # slow at large k: the three selection tactics that measured (the sorted merge 1.31x at k = 16, the queue
    # 1.1-1.6x on unseeded splits, the rolled insertion 1.7-1.8x at k = 32), ahead of
    # everything else
    assert {t.name for t in retrieve("nearest neighbour search slow at large k", k=3)} == {
        "topk_queue", "topk_sorted_merge", "topk_rolled_insertion"}


def test_queue_ab_refuses_an_unknown_named_variant(monkeypatch):
    """bench/topk_queue_ab.py --variant names variants of bench/lib_grid.py knn_variants; a typo stops the A/B
    before anything compiles, naming it."""
    import sys
    from bench import topk_queue_ab
    monkeypatch.setattr(sys, "argv", ["topk_queue_ab.py", "--compile-only", "--arch", "sm_90a", "--shapes",
                                      '[{"Q": 16384, "M": 16384, "k": 16}]', "--variant",
                                      "knn_bq128_bn64_s1_p4_wg,knn_bq128_bn64_s1_p4_wgg"])
    with pytest.raises(SystemExit, match="knn_bq128_bn64_s1_p4_wgg"):
        topk_queue_ab.main()
