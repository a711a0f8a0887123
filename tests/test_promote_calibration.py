"""Calibration promotion: candidates (real seeds and tactic children) whose measured times come from a
known ground truth (the cost model with HBM and L2 bandwidth at 40 % of the calibrated values, as if
the calibration were off) form a large-error cluster; the refit recovers the factor, writes version + 1
and a test that re-checks the error drop with the cost model once merged."""
import json
import math
from dataclasses import replace

import pytest

from cake_ir.cost import CALIBRATION_DIR, estimate, load_constants
from cake_ir.io import ir_hash, load
from knowledge.promote import calibration as C
from knowledge.promote.base import PromoteConfig
from knowledge.store import Store
from test_promote_primitive import child, run_generated_tests, seed

SPEC = load_constants("h200")
TRUTH = replace(SPEC, hbm_bw=SPEC.hbm_bw * 0.4, l2_bw=SPEC.l2_bw * 0.4)
SMALL = {"M": 1024, "N": 1024, "K": 1024}


def programs():
    sm = seed("softmax", "softmax_row_n4096")
    wg = seed("gemm", "gemm_wgmma_sm90a")
    return [("softmax", sm, None), ("softmax", child(sm, "cta_warps", {"warps": 4}), None),
            ("softmax", child(sm, "vector_width", {"target": "blocked", "value": 4}), None),
            ("gemm", wg, None), ("gemm", child(wg, "retile", {"bn": 128, "bk": 64}), None),
            ("gemm", child(wg, "warp_split", {"consumers": 1, "bm": 64}), SMALL)]


def populate(store, truth=TRUTH, scale=1.0, device="NVIDIA H200"):
    """Candidates with predicted_s from the current constants and measured_s from `truth` x scale; the
    last gemm one was timed on a small shape (named by its profile record)."""
    from tasks import registry
    for i, (task, g, shape) in enumerate(programs()):
        k, _ = load(g["ir"])
        run = f"{task}-run"
        store.create_run(run, task)
        sh = shape or registry.get(task).bench_shape
        pred = estimate(k, sh, SPEC).seconds
        meas = estimate(k, sh, truth).seconds * scale
        cand = {"hash": ir_hash(k), "name": k.name, "ir": g["ir"], "status": "ok", "stage": "profile",
                "predicted_s": pred, "measured_s": meas, "cost": {"bound": "memory"}}
        store.record_stage(run, cand, "profile", "ok", metrics={"seconds": meas},
                           result={"device": device, "timings": [{"shape": sh, "ms_median": meas * 1e3}]})


@pytest.fixture
def store(tmp_path):
    s = Store(url=f"sqlite:///{tmp_path / 'k.db'}")
    yield s
    s.close()


def test_large_error_cluster_is_refit_into_a_new_version(store, tmp_path):
    populate(store)
    props = C.propose(store, PromoteConfig(min_count=3, max_error=0.5))
    assert len(props) == 1
    p = props[0]
    ev = p.evidence
    assert p.kind == "calibration" and ev["version"] == ev["previous_version"] + 1
    assert ev["flagged"] == ["memory/simt", "memory/wgmma"] and ev["samples"] == 6
    # The refit recovers the ground truth's factor on the memory constants, and nothing else moves.
    assert ev["scales"]["memory"] == pytest.approx(0.4, rel=0.05)
    assert set(ev["changed"]) == {"hbm_bw", "l2_bw"}
    for name in ev["flagged"]:
        c = ev["clusters"][name]
        assert c["median_abs_before"] > 0.5 and c["median_abs_after"] < 0.1
    e = ev["median_abs_log_error"]
    assert e["flagged_after"] < e["flagged_before"] and e["all_after"] <= e["all_before"]
    json.dumps(ev)

    doc = json.loads(p.files["calibration/data/h200.json"])
    old = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    assert doc["version"] == old["version"] + 1
    assert doc["hbm_bw"] == pytest.approx(old["hbm_bw"] * ev["scales"]["memory"])
    assert doc["wgmma_flops"] == old["wgmma_flops"] and doc["measured"] == old["measured"]
    assert doc["provenance"][-1]["source"] == f"promotion:{p.id}" and doc["provenance"][-1]["version"] == doc["version"]
    data = json.loads(p.files[f"calibration/evidence/h200_v{doc['version']}.json"])
    assert len(data["samples"]) == 6 and all(s["ir"] for s in data["samples"])
    assert {tuple(sorted(s["shapes"].items())) for s in data["samples"]} >= {tuple(sorted(SMALL.items()))}

    res = run_generated_tests(p.files, tmp_path / "checkout")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


def test_refit_file_loads_through_load_constants(store, tmp_path):
    populate(store)
    p = C.propose(store, PromoteConfig())[0]
    f = tmp_path / "h200.json"
    f.write_text(p.files["calibration/data/h200.json"])
    spec = load_constants(str(f))                   # "provenance" is not a constant
    assert spec.hbm_bw == pytest.approx(SPEC.hbm_bw * p.evidence["scales"]["memory"])
    # The honest after-error: the cost model with the file's constants nearly matches the truth.
    for task, g, shape in programs():
        from tasks import registry
        k, _ = load(g["ir"])
        sh = shape or registry.get(task).bench_shape
        assert abs(math.log(estimate(k, sh, spec).seconds / estimate(k, sh, TRUTH).seconds)) < 0.1


def test_no_proposal_when_errors_are_small(store):
    populate(store, truth=SPEC, scale=1.3)          # 26 % off everywhere: below max_error = 0.5
    assert C.propose(store, PromoteConfig(max_error=0.5)) == []


def test_no_proposal_when_clusters_are_too_small(store):
    populate(store)                                 # 3 members per cluster
    assert C.propose(store, PromoteConfig(min_count=4)) == []


def test_measurements_from_another_gpu_are_not_evidence(store):
    populate(store, device="NVIDIA A100-SXM4-80GB")
    assert C.measured_samples(store, PromoteConfig(gpu="h200")) == []
    assert C.propose(store, PromoteConfig(gpu="h200")) == []


def test_no_proposal_without_measurements(store):
    from tasks import registry
    for task, g, _ in programs()[:3]:
        k, _ = load(g["ir"])
        store.create_run("dry", task)
        store.upsert_candidate("dry", {"hash": ir_hash(k), "name": k.name, "ir": g["ir"], "status": "ok",
                                       "predicted_s": estimate(k, registry.get(task).bench_shape, SPEC).seconds})
    assert C.measured_samples(store, PromoteConfig()) == []
    assert C.propose(store, PromoteConfig()) == []


def test_on_accept_records_the_active_calibration(store, tmp_path):
    from types import SimpleNamespace

    from sqlmodel import select

    from knowledge.models import CalibrationRow

    populate(store)
    p = C.propose(store, PromoteConfig())[0]
    repo = tmp_path / "repo"
    (repo / "calibration" / "data").mkdir(parents=True)
    (repo / "calibration" / "data" / "h200.json").write_text(p.files["calibration/data/h200.json"])
    with store.session() as s:
        s.add(CalibrationRow(gpu="h200", version=1, constants={}, source="microbench", active=True))
        s.commit()
    row = SimpleNamespace(id=p.id, evidence=p.evidence)
    assert C.on_accept(repo, row) is None               # no store: the merged file alone is the activation
    rid = C.on_accept(repo, row, store=store)
    assert C.on_accept(repo, row, store=store) == rid   # idempotent
    with store.session() as s:
        rows = {r.version: r for r in s.exec(select(CalibrationRow))}
    assert rows[1].active is False and rows[p.evidence["version"]].active is True
    assert rows[p.evidence["version"]].source == f"promotion:{p.id}"
    assert rows[p.evidence["version"]].constants["hbm_bw"] == pytest.approx(p.evidence["changed"]["hbm_bw"]["after"])
