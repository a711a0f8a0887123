"""bench/lib_grid.py's restricted sweeps: the shape and variant filters and the kernels such a sweep
compiles (its training shapes' ks and the probe's, for the matching variants only)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import lib_grid  # noqa: E402


def test_shape_filter_matches_every_named_dimension():
    f = lib_grid.shape_filter("Q=1,k=16")
    assert f({"Q": 1, "M": 10, "k": 16}) and not f({"Q": 2, "M": 10, "k": 16}) and not f({"Q": 1, "k": 10})
    assert lib_grid.shape_filter(None)({"anything": 3})
    h = lib_grid.shape_filter("k=1;Q=4096|32768,k=16")
    assert h({"Q": 7, "M": 9, "k": 1}) and h({"Q": 4096, "M": 9, "k": 16}) and not h({"Q": 4096, "M": 9, "k": 10})
    g = lib_grid.shape_filter("B=16|32,K=160")
    assert g({"B": 32, "N": 1, "K": 160}) and not g({"B": 4, "N": 1, "K": 160}) and not g({"B": 16, "K": 100})
    with pytest.raises(ValueError):
        lib_grid.shape_filter("k16")


def test_restricted_sweep_compiles_the_matching_variants_at_the_training_and_probe_ks():
    jobs = lib_grid.sweep_jobs("knn", "sm_90a", only="k=16", pattern="_s(16|64)_p4_b2_mw_wg$")
    from cakelib.variants import knn_name
    names = sorted({knn_name(p) for _, p, _, _ in jobs})
    base = ["knn_bq128_bn64_s16_p4_b2_mw_wg", "knn_bq128_bn64_s64_p4_b2_mw_wg"]
    # and their per-call forms at the training shapes (the merge kernel at k > 1; the sampled bound at
    # M >= 256K), the kernels the sweep times
    tuned = [n.replace("_mw_wg", "_mk_wg") + sd for n in base for sd in ("", "_sd8")]
    assert names == sorted(base + tuned)
    assert {k for _, p, k, _ in jobs if p.get("merge") == "kernel"} == {16}    # trained at k = 16 only
    assert sorted({k for _, _, k, _ in jobs}) == [10, 16]          # k = 16 trains, the probe also runs k = 10
    full = lib_grid.sweep_jobs("knn", "sm_90a")
    assert len(full) > len(jobs) and {j[2] for j in full} == {1, 2, 10, 16, 32}
    # the split path runs k = 32 (KNN_K_MAX_SPLIT): its variants are compiled there too
    assert any(p["split"] > 1 and k == 32 for _, p, k, _ in full)


def test_merge_later_wins_replaces_the_retimed_shapes(tmp_path):
    import json

    def part(name, rows):
        p = tmp_path / name
        p.write_text(json.dumps({"mode": "grid", "command": name, "ops": {"kmeans": {"rows": rows}}}))
        return str(p)

    def row(B, x):
        return {"shape": {"B": B, "N": 1, "K": 8}, "ok": True, "cake_ms": 1.0, "best_baseline_ms": x, "speedup": x}
    a = part("a.json", [row(1, 2.0), row(2, 0.5)])
    b = part("b.json", [row(2, 1.5)])
    with pytest.raises(SystemExit):          # without the flag a shape in two parts is an error
        lib_grid.merge(str(tmp_path / "m.json"), [a, b])
    lib_grid.merge(str(tmp_path / "m.json"), [a, b], later_wins=True)
    m = json.loads((tmp_path / "m.json").read_text())
    assert {r["shape"]["B"]: r["speedup"] for r in m["ops"]["kmeans"]["rows"]} == {1: 2.0, 2: 1.5}
    assert [p["rows_kept"]["kmeans"] for p in m["parts"]] == [1, 1]


def test_merge_warns_when_the_parts_were_timed_differently(tmp_path, capsys):
    """A grid file timed before the spin kernel (no `timing` in its env) and one timed with it: the
    merge still writes the file but says the rows are not comparable; parts of one method say nothing."""
    import json
    from bench.examples import TIMING, timing_of

    def part(name, env, B):
        p = tmp_path / name
        row = {"shape": {"B": B, "N": 1, "K": 8}, "ok": True, "cake_ms": 1.0, "best_baseline_ms": 1.0, "speedup": 1.0}
        p.write_text(json.dumps({"mode": "grid", "env": env, "ops": {"kmeans": {"rows": [row]}}}))
        return str(p)
    old, new, new2 = part("o.json", {"date": "x"}, 1), part("n.json", {"timing": TIMING}, 2), part("m.json", {"timing": TIMING}, 3)
    assert timing_of({"date": "x"}) != TIMING
    lib_grid.merge(str(tmp_path / "a.json"), [new, new2])
    assert "WARNING" not in capsys.readouterr().out
    lib_grid.merge(str(tmp_path / "b.json"), [old, new])
    assert "different methods" in capsys.readouterr().out
    merged = json.loads((tmp_path / "b.json").read_text())
    assert [p["rows_kept"]["kmeans"] for p in merged["parts"]] == [1, 1]


def test_prior_rows_are_rescaled_by_the_shapes_median_ratio():
    """A restricted sweep's prior rows go on this run's clock: x the median (this run / prior) of the
    variants timed in both at that shape; a shape with no such variant keeps its rows."""
    s1, s2 = {"B": 1, "N": 8, "K": 4}, {"B": 2, "N": 8, "K": 4}
    old = [{"shape": s1, "variant": v, "ok": True, "ms": ms} for v, ms in (("a", 2.0), ("b", 4.0), ("c", 1.0), ("x", 8.0))]
    old += [{"shape": s2, "variant": "x", "ok": True, "ms": 3.0}]
    new = [{"shape": s1, "variant": v, "ok": True, "ms": ms} for v, ms in (("a", 1.0), ("b", 3.0), ("c", 0.9))]
    kept = [r for r in old if r["variant"] == "x"]
    out = lib_grid.rescale_prior(kept, new, old)
    assert out[0]["ms"] == pytest.approx(8.0 * 0.75) and out[0]["prior_ms"] == 8.0      # ratios 0.5, 0.75, 0.9
    assert out[1] == kept[1]                                                           # nothing re-timed at s2


def test_changed_shapes_lists_the_grid_shapes_two_tables_pick_apart(tmp_path):
    import json
    table = json.loads((Path(lib_grid.__file__).parents[1] / "cakelib/tables/kmeans.json").read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps(table))
    assert lib_grid.changed_shapes("kmeans", str(same), str(same)) == ""
    # one leaf: the pick at K = 256 everywhere; the shapes the table already gives it are left out
    from cakelib.dispatch import DispatchTable
    big = DispatchTable.load(str(same)).pick({"B": 1, "N": 1 << 22, "K": 256, "D": 128, "arch": "sm_90a"})
    (tmp_path / "one.json").write_text(json.dumps(dict(table, tree={"variant": big, "alternates": [], "loss": 0.0,
                                                                     "n": 1})))
    spec = lib_grid.changed_shapes("kmeans", str(same), str(tmp_path / "one.json"))
    shapes = [s for s in lib_grid.kmeans_grid() if lib_grid.shape_filter(spec)(s)]
    assert 0 < len(shapes) < len(lib_grid.kmeans_grid()) and spec.startswith("B=")
    assert {"B": 1, "N": 1 << 22, "K": 256} not in shapes and {"B": 1, "N": 4096, "K": 8} in shapes


def test_rows_that_ran_a_per_call_form_do_not_set_the_prior_rescale():
    """A re-timed row that ran its per-call form (`ran`: e.g. the merge kernel where the prior timed the
    last-CTA merge) is another kernel: only same-form rows give the shape's ratio."""
    s1 = {"Q": 1, "M": 8, "k": 10}
    old = [{"shape": s1, "variant": v, "ok": True, "ms": ms} for v, ms in (("a", 2.0), ("split", 4.0), ("x", 8.0))]
    new = [{"shape": s1, "variant": "a", "ok": True, "ms": 1.0},
           {"shape": s1, "variant": "split", "ran": "split_mk", "ok": True, "ms": 0.4}]
    out = lib_grid.rescale_prior([old[2]], new, old)
    assert out[0]["ms"] == pytest.approx(8.0 * 0.5)                 # a's ratio alone, not split's 0.1


def test_rows_outside_a_variants_current_domain_count_as_not_run():
    """A sweep row timed before a domain rule (here the capped kernels at k = 32, which spill) joins the fit
    as not run: a refit must not pick the variant there."""
    capped = {"bq": 128, "bn": 64, "split": 8, "stages": 4, "mma": "wgmma", "merge": "wide", "minb": 2}
    vmap = {"capped": capped, "plain": {**capped, "minb": 1}}
    raw = [{"shape": {"Q": 4096, "M": 1 << 20, "k": k}, "variant": v, "ok": True, "ms": 1.0}
           for k in (16, 32) for v in vmap]
    got = {(m.variant, m.shape["k"]): m.ok for m in lib_grid.measurements("knn", raw, vmap)}
    assert got == {("capped", 16): True, ("plain", 16): True, ("capped", 32): False, ("plain", 32): True}


def test_runs_snapshots_name_the_shapes_a_table_change_moves(monkeypatch):
    """`runs` lists what the library runs at every grid shape (the per-call params and the kNN queue); a
    changed queue table moves exactly the shapes whose pick it lists (`runs_changed`)."""
    from cakelib import variants
    before = lib_grid.runs("knn")
    assert len(before) == len(lib_grid.knn_grid()) and all("queue" in p for p in before.values())
    spec, p = next((s, p) for s, p in before.items() if p.get("split", 1) > 1 and "=16" in s.split(",")[-1])
    key = variants.knn_queue_key(p)
    table = {**variants._queue_table(), key: {"16": 4 if p["queue"] != 4 else 2}}
    monkeypatch.setattr(variants, "_queue_table", lambda: table)
    after = lib_grid.runs("knn")
    moved = lib_grid.runs_changed(before, after).split(";")
    assert spec in moved
    assert all(variants.knn_queue_key(before[s]) == key and int(s.split("k=")[1]) >= 16 for s in moved)
    assert lib_grid.runs_changed(before, before) == ""


def test_committed_sweep_pins_rest_on_its_own_run(tmp_path):
    """The refit's pins come from the sweep's own rows only (`fresh_rows`: the --prior's carry a mark):
    every pin of the committed kNN table sits on a shape the committed sweep timed itself, past PIN_OVER."""
    import json
    rows = [{"shape": {"Q": 1}, "prior": True}, {"shape": {"Q": 2}}, {"shape": {"Q": 3}, "prior_ms": 1.0}]
    assert lib_grid.fresh_rows(rows) == rows[1:]
    sweep = Path(__file__).resolve().parents[1] / "bench/results/lib-sweep-knn-h200.json"
    d = json.loads(sweep.read_text())
    fresh = lib_grid.fresh_rows(d["ops"]["knn"]["rows"])
    assert 0 < len(fresh) < len(d["ops"]["knn"]["rows"])
    committed = json.loads((Path(__file__).resolve().parents[1] / "cakelib/tables/knn.json").read_text())
    fresh_shapes = {json.dumps(r["shape"], sort_keys=True) for r in fresh}
    new = [p for p in committed["pins"] if not p.get("kept")]
    assert new and all(json.dumps(p["shape"], sort_keys=True) in fresh_shapes for p in new)
    # pins kept by `refit --keep-tree` from the table's earlier sweep: their shape is no row of this one's own
    # run, and their variant was timed there by that earlier run (now this sweep's prior rows)
    prior = {(json.dumps(r["shape"], sort_keys=True), r["variant"]) for r in d["ops"]["knn"]["rows"] if r.get("prior")}
    for p in committed["pins"]:
        if p.get("kept"):
            key = json.dumps(p["shape"], sort_keys=True)
            assert key not in fresh_shapes and (key, p["variant"]) in prior, p
    assert all(p["slowdown"] is None or p["slowdown"] > lib_grid.PIN_OVER for p in committed["pins"])


def test_sweep_names_the_variants_that_run_without_a_fitted_queue():
    """A kNN variant with no queue-table entry runs T = 0 at k >= 16 while fitted ones run theirs: the sweep
    says so (an earlier sweep compared the wgmma builds with T = 0 against the mma.sync build's T = 2)."""
    from cakelib.variants import knn_name
    sync = {"bq": 128, "bn": 64, "split": 1, "stages": 2, "norms": "global"}     # fitted: T = 2 at k = 16 / 32
    wg = {"bq": 64, "bn": 64, "split": 1, "stages": 4, "mma": "wgmma", "overlap": True}   # no entry (the unsplit
    # 128-query wgmma builds have theirs)
    got = lib_grid.unqueued([sync, wg, {**wg, "queue": 2}], {10, 16, 32})
    assert got == {knn_name(wg): [16, 32]}
    assert lib_grid.unqueued([wg], {1, 10}) == {}


def test_refit_keep_tree_redoes_only_the_pins(tmp_path):
    """`refit SWEEP --keep-tree TABLE`: TABLE's tree unchanged; pins from the sweep's own rows (a shape where the
    tree's pick ran > PIN_OVER x the best); TABLE's pins at shapes the sweep did not time kept and marked; its
    pins at shapes the sweep timed redone (dropped when the pick is now within PIN_OVER)."""
    import json

    from cakelib.dispatch import DispatchTable
    root = Path(__file__).resolve().parents[1]
    table = DispatchTable.load(root / "cakelib/tables/knn.json")
    vmap = table.variants
    fast, slow = {"Q": 32768, "M": 32768, "k": 16}, {"Q": 16384, "M": 16384, "k": 32}
    pick_fast, pick_slow = table.tree_pick({**fast, "D": 128}), table.tree_pick({**slow, "D": 128})
    other = "knn_bq128_bn64_s1_p2_gn"
    assert other in vmap and other not in (pick_fast,) and pick_slow != "knn_bq128_bn64_s1_p4_wg"
    import dataclasses
    old = dataclasses.replace(table, pins=[{"shape": {"Q": 7, "M": 100000, "k": 10}, "variant": pick_fast,
                                            "slowdown": 1.2}, {"shape": fast, "variant": other, "slowdown": 1.3}])
    old.save(tmp_path / "old.json")
    rows = [{"shape": fast, "variant": pick_fast, "ok": True, "ms": 1.00},      # the pick within PIN_OVER: no pin
            {"shape": fast, "variant": other, "ok": True, "ms": 0.98},
            {"shape": slow, "variant": pick_slow, "ok": True, "ms": 2.0},       # the pick 2x the best: pinned
            {"shape": slow, "variant": "knn_bq128_bn64_s1_p4_wg", "ok": True, "ms": 1.0},
            {"shape": {"Q": 1, "M": 100000, "k": 10}, "variant": pick_fast, "ok": True, "ms": 5.0, "prior": True}]
    sweep = {"env": {"gpu": "test", "date": "2026-12-02"}, "command": "test",
             "ops": {"knn": {"variants": vmap, "rows": rows}}}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    lib_grid.refit(str(tmp_path / "sweep.json"), str(tmp_path / "out"), keep_tree=str(tmp_path / "old.json"))
    new = DispatchTable.load(tmp_path / "out" / "knn.json")
    assert new.tree == table.tree
    pins = {json.dumps(p["shape"], sort_keys=True): p for p in new.pins}
    assert set(pins) == {json.dumps(s, sort_keys=True) for s in ({"Q": 7, "M": 100000, "k": 10}, slow)}
    assert pins[json.dumps(slow, sort_keys=True)]["variant"] == "knn_bq128_bn64_s1_p4_wg"
    assert pins[json.dumps({"Q": 7, "M": 100000, "k": 10}, sort_keys=True)].get("kept") is True
    assert new.pick({**slow, "D": 128}) == "knn_bq128_bn64_s1_p4_wg" and new.pick({**fast, "D": 128}) == pick_fast
    with pytest.raises(SystemExit, match="pin-over"):
        lib_grid.refit(str(tmp_path / "sweep.json"), str(tmp_path / "out2"), pin_over=0,
                       keep_tree=str(tmp_path / "old.json"))
