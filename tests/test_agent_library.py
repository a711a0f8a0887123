"""The library export (agent/library.py `export_best`): the best kernel per timed shape.

Runs are built directly in a knowledge store in a temporary directory, the way the graph stores them
(candidate rows, profile evaluations with one timing per timed shape; tests/agent_doubles.py style
fake numbers, no GPU). The task is kmeans: two bench shapes, no shape classes, so a run times both;
the candidates are its seed programs (real IR: the library checks an entry's IR hash against its meta).
"""
import json

import pytest

from agent import config as C
from agent import library
from agent.report import library_lines, library_table


@pytest.fixture
def kit(tmp_path):
    from cake_ir.io import ir_hash, to_dict
    from knowledge.store import Store
    from tasks.registry import get

    entry = get("kmeans")
    s0, s1 = entry.timed_shapes()
    assert s0 == entry.bench_shape and s0 != s1
    kernels = {n: k for n, k in entry.seeds().items()}
    cands = [{"name": n, "hash": ir_hash(k), "ir": to_dict(k)} for n, k in kernels.items()]
    assert len({c["hash"] for c in cands}) == len(cands) == 5   # distinct programs: the 5 kmeans seeds (one on wgmma)
    store = Store(url=f"sqlite:///{tmp_path / 'cake.db'}")
    return {"entry": entry, "s0": s0, "s1": s1, "cands": cands, "store": store, "root": tmp_path / "lib"}


def _run(kit, run_id: str, timed: list, dry_run: bool = False):
    """Store a run: `timed` is [(candidate index, status, {shape index: ms}, strategy)]. Returns the
    RunConfig and the graph's end state (state["best"] as reflect builds it: the fastest passing
    candidate at the run's shape, with the baseline's speedup)."""
    store, shapes = kit["store"], (kit["s0"], kit["s1"])
    cfg = C.RunConfig(run_id=run_id, task="kmeans", dry_run=dry_run)
    store.create_run(run_id, "kmeans", proposer="search", dry_run=dry_run, config=cfg.to_dict())
    base_ms = 2.0
    best = {}
    for i, status, ms, strategy in timed:
        c = kit["cands"][i]
        timings = [{"shape": shapes[j], "ms_min": m * 0.98, "ms_median": m, "ms_max": m * 1.05, "reps": 5,
                    "warmup": 1} for j, m in sorted(ms.items())]
        metrics = {"max_rel_rmse": 0.002}
        if status == "ok" and 0 in ms:
            metrics.update(seconds=ms[0] * 1e-3, ms_median=ms[0], roofline_frac=0.5,
                           speedup={"torch": base_ms / ms[0]})
        result = {"ok": status == "ok", "status": status, "device": "FakeGPU", "timings": timings,
                  "metrics": metrics, "error_class": None if status == "ok" else "wrong_result",
                  "shapes": [{"shape": shapes[0], "run": 0, "ok": True}]}
        cand = {**c, "tactic": "seed", "strategy": strategy, "proposer": "seed", "predicted_s": 1e-4,
                "status": "ok" if status == "ok" else "failed", "stage": "profile"}
        if status == "ok" and 0 in ms:
            cand["measured_s"] = ms[0] * 1e-3
        store.record_stage(run_id, cand, "profile", status, metrics=metrics, timings=timings, result=result,
                           executor="gpu:0:1")
        if status == "ok" and 0 in ms and (not best or ms[0] * 1e-3 < best["score_s"]):
            best = {"hash": c["hash"], "name": c["name"], "score_s": ms[0] * 1e-3, "measured": True,
                    "strategy": strategy, "tactic": "seed", "params": None, "predicted_s": 1e-4,
                    "profile": {k: v for k, v in result.items() if k != "timings"}}
    if best:
        best["speedup"], best["speedup_vs"] = base_ms * 1e-3 / best["score_s"], "torch"
    return cfg, {"best": best}


def _meta(kit, shape):
    return json.loads((kit["root"] / "kmeans" / "library" / f"{kit['entry'].shape_key(shape)}.meta.json").read_text())


def test_each_shape_gets_its_own_fastest_candidate(kit):
    cfg, state = _run(kit, "r1", [(0, "ok", {0: 1.0, 1: 3.0}, "seed"),
                                  (1, "ok", {0: 1.5, 1: 2.0}, "bandit")])
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    assert [e["status"] for e in lib["entries"]] == ["written", "written"] and lib["n_written"] == 2
    assert [e["timed"] for e in lib["entries"]] == [True, False]
    m0, m1 = _meta(kit, kit["s0"]), _meta(kit, kit["s1"])
    assert m0["hash"] == kit["cands"][0]["hash"] and m1["hash"] == kit["cands"][1]["hash"]
    assert m1["shape"] == kit["s1"] and m1["shape_key"] == kit["entry"].shape_key(kit["s1"])
    assert m1["ms_median"] == 2.0 and m1["seconds"] == pytest.approx(2e-3) and m1["measured"] is True
    # no baseline was timed at the other shape: no speedups, said so; the seed at that shape is the reference
    assert m1["speedups"] is None and "baselines only there" in m1["note"]
    assert m1["speedup"] == pytest.approx(1.5) and m1["speedup_vs"] == "best seed"
    assert m1["device"] == "FakeGPU" and m1["predicted_s"] is None and m1["strategy"] == "bandit"
    assert m1["run_shape_key"] == kit["entry"].shape_key() and m1["candidates_timed"] == 2
    from cake_ir.io import ir_hash, load_file
    k, _ = load_file(kit["root"] / "kmeans" / "library" / f"{kit['entry'].shape_key(kit['s1'])}.json")
    assert ir_hash(k) == m1["hash"]


def test_the_run_shape_entry_is_the_runs_best_as_before(kit):
    """The run's own shape: exactly what the single-shape export wrote (the run's best and speedups)."""
    cfg, state = _run(kit, "r2", [(0, "ok", {0: 1.0, 1: 3.0}, "seed"), (1, "ok", {0: 1.5, 1: 2.0}, "bandit")])
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    assert lib["written"] is True and lib["reason"] == "new library entry"
    assert lib["path"].endswith(f"{kit['entry'].shape_key()}.json")
    m0 = _meta(kit, kit["s0"])
    assert list(m0) == ["task", "shape", "shape_key", "run", "hash", "name", "measured", "seconds", "ms_median",
                        "predicted_s", "speedup", "speedup_vs", "speedups", "roofline_frac", "device", "target",
                        "library_pick", "arch", "strategy", "tactic", "recipe", "lineage", "ir_version", "date", "note"]
    best = state["best"]
    assert m0["hash"] == best["hash"] and m0["seconds"] == best["score_s"] and m0["ms_median"] == 1.0
    assert m0["speedup"] == pytest.approx(2.0) and m0["speedup_vs"] == "torch"
    assert m0["speedups"] == {"torch": 2.0} and m0["roofline_frac"] == 0.5 and m0["predicted_s"] == 1e-4
    assert m0["note"] is None and m0["shape_key"] == kit["entry"].shape_key()


def test_a_candidate_that_failed_is_never_exported(kit):
    # candidate 2 is the fastest at both shapes, but its profile stage failed (wrong outputs when timed)
    cfg, state = _run(kit, "r3", [(0, "ok", {0: 1.0, 1: 3.0}, "seed"), (2, "fail", {0: 0.1, 1: 0.1}, "bandit"),
                                  (1, "ok", {0: 1.5, 1: 2.0}, "evolve")])
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    bad = kit["cands"][2]["hash"]
    assert all(e["hash"] != bad for e in lib["entries"])
    assert _meta(kit, kit["s1"])["hash"] == kit["cands"][1]["hash"]
    assert _meta(kit, kit["s1"])["candidates_timed"] == 2
    # a shape where every timed candidate failed gets no entry, and says why
    cfg, state = _run(kit, "r3b", [(0, "ok", {0: 1.0}, "seed"), (2, "fail", {0: 0.5, 1: 0.1}, "bandit")])
    root2 = kit["root"].parent / "lib2"
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, root2)
    other = lib["entries"][1]
    assert other["status"] == "none" and "all failed" in other["reason"]
    assert not (root2 / "kmeans" / "library" / f"{kit['entry'].shape_key(kit['s1'])}.json").exists()


def test_an_existing_faster_entry_is_kept(kit):
    cfg, state = _run(kit, "r4", [(1, "ok", {0: 1.5, 1: 2.0}, "seed")])
    library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    before = _meta(kit, kit["s1"])
    # a later run: faster at the run's shape, slower at the other one (same device)
    cfg, state = _run(kit, "r5", [(0, "ok", {0: 1.0, 1: 3.0}, "seed")])
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    assert [e["status"] for e in lib["entries"]] == ["written", "kept"] and (lib["n_written"], lib["n_kept"]) == (1, 1)
    kept = lib["entries"][1]
    assert kept["library_ms"] == pytest.approx(2.0) and "as fast or faster" in kept["reason"]
    assert _meta(kit, kit["s1"]) == before                                   # untouched
    assert _meta(kit, kit["s0"])["hash"] == kit["cands"][0]["hash"]
    text = "\n".join(library_lines(lib))
    assert text.startswith("library: 1 entry written, 1 kept in ") and "kept (the library's 2.000 ms" in text
    assert "written (faster than the library entry)" in text and "*B32" in text
    html = library_table(lib)
    assert html.count("<tr") == 3 and "the run&#39;s shape" in html


def test_dry_run_writes_the_run_shape_only_unmeasured(kit):
    cfg, _ = _run(kit, "r6", [])
    c = kit["cands"][0]
    state = {"best": {"hash": c["hash"], "name": c["name"], "score_s": 1e-4, "measured": False, "strategy": "seed",
                      "tactic": "seed", "predicted_s": 1e-4, "speedup": 1.0, "speedup_vs": "best seed (predicted)"}}
    kit["store"].upsert_candidate("r6", {**c, "strategy": "seed", "tactic": "seed", "status": "ok", "stage": "compile"})
    cfg.dry_run = True
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    assert len(lib["entries"]) == 1 and lib["written"]
    m0 = _meta(kit, kit["s0"])
    assert m0["measured"] is False and m0["target"] == cfg.target and "not measured" in m0["note"]
    assert not (kit["root"] / "kmeans" / "library" / f"{kit['entry'].shape_key(kit['s1'])}.json").exists()
    lines = library_lines(lib, dry_run=True)
    assert "unmeasured" in lines[0] and "(predicted)" in lines[1] and len(lines) == 2


def test_no_candidate_passed(kit):
    cfg, state = _run(kit, "r7", [(2, "fail", {0: 0.5}, "seed")])
    lib = library.export_best(kit["entry"], kit["store"], state, cfg, kit["root"])
    assert lib["written"] is False and lib["reason"] == "no candidate passed" and lib["n_written"] == 0
    assert all(e["status"] == "none" for e in lib["entries"])
    assert "no entry for" in library_lines(lib)[-1]


def test_shape_key_and_labels():
    from agent.report import shape_labels
    from tasks.registry import get
    e = get("kda").for_shape("SAFE=1")
    shapes = e.timed_shapes()
    assert e.shape_key() == e.shape_key(shapes[0]) == "T8192_N1_H32_HV32_SAFE1_VK1_H01_PACK0"
    labels = shape_labels(shapes)
    assert labels[0] == "T8192_N1_H32_HV32_PACK0" and len(set(labels)) == len(shapes)
    assert shape_labels([{"M": 16384}]) == ["M16384"]
