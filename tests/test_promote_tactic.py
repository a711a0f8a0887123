"""Macro-tactic promotion: lineages of real tactic applications on real seeds (gemm and softmax) in a
temporary knowledge DB; a sequence that improved candidates on two tasks becomes tactics/<name>.py with
a test that passes once merged."""
import json

import pytest

from cake_ir.cost import estimate, load_constants
from cake_ir.io import ir_hash, load
from knowledge.promote import tactic as T
from knowledge.promote.base import PromoteConfig
from knowledge.store import Store
from test_promote_primitive import child, run_generated_tests, seed

SPEC = load_constants("h200")
SEQ = {"gemm": ("gemm_mma_sm80", [("min_blocks", {"min_blocks": 2}), ("vector_width", {"target": "cp_async", "value": 8})]),
       "softmax": ("softmax_row_n4096", [("min_blocks", {"min_blocks": 2}), ("vector_width", {"target": "blocked", "value": 4})])}


def add(store, run, task, g, measured=None, parent=None, tactic=None, params=None, status="ok"):
    from tasks import registry
    k, _ = load(g["ir"])
    h = ir_hash(k)
    store.create_run(run, task, config={"task": task})
    pred = estimate(k, registry.get(task).bench_shape, SPEC)
    store.upsert_candidate(run, {"hash": h, "name": k.name, "ir": g["ir"], "recipe": g.get("recipe"), "parent": parent,
                                 "tactic": tactic, "params": params, "status": status, "stage": "profile",
                                 "predicted_s": pred.seconds, "cost": {"bound": pred.bound}, "measured_s": measured})
    return h


def lineage(store, task, times, run=None, status="ok"):
    """Seed -> step 1 -> step 2 of SEQ[task], with measured times (root, step 1, step 2) or None."""
    name, steps = SEQ[task]
    g = seed(task, name)
    run = run or f"{task}-run"
    h = add(store, run, task, g, measured=times[0] if times else None)
    for i, (t, p) in enumerate(steps):
        g = child(g, t, p)
        h = add(store, run, task, g, measured=times[i + 1] if times else None, parent=h, tactic=t, params=p,
                status=status if i == len(steps) - 1 else "ok")
    return h


@pytest.fixture
def store(tmp_path):
    s = Store(url=f"sqlite:///{tmp_path / 'k.db'}")
    yield s
    s.close()


def test_sequence_improving_two_tasks_becomes_a_macro(store, tmp_path):
    lineage(store, "gemm", [1.0e-3, 1.0e-3, 0.9e-3])          # the 2nd step gains 10 %
    lineage(store, "softmax", [8.0e-5, 8.0e-5, 7.6e-5])       # ... 5 %
    props = T.propose(store, PromoteConfig(min_tasks=2))
    assert len(props) == 1
    p = props[0]
    ev = p.evidence
    assert p.kind == "tactic" and ev["name"] == "macro_min_blocks_vector_width"
    assert ev["steps"] == ["min_blocks", "vector_width"] and ev["tasks"] == ["gemm", "softmax"]
    assert ev["contexts"] == ["gemm/M4096_N4096_K4096", "softmax/M16384"]
    assert ev["median_gain"] == pytest.approx((1 / 0.9 - 1 + 8 / 7.6 - 1) / 2)
    assert all(e["basis"] == "measured" for e in ev["examples"])
    assert [["min_blocks", "vector_width"]] == [ev["steps"]]
    assert {json.dumps(v, sort_keys=True) for v in ev["variants"]} == \
        {json.dumps([s[1] for s in SEQ[t][1]], sort_keys=True) for t in SEQ}
    assert set(p.files) == {"tactics/macro_min_blocks_vector_width.py",
                            "tests/fixtures/tactics/macro_min_blocks_vector_width.json",
                            "tests/test_tactic_macro_min_blocks_vector_width.py"}
    fx = json.loads(p.files["tests/fixtures/tactics/macro_min_blocks_vector_width.json"])
    assert {c["seed"] for c in fx["contexts"]} == {"gemm_mma_sm80", "softmax_row_n4096"}
    json.dumps(ev)

    res = run_generated_tests(p.files, tmp_path / "checkout")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


def test_macro_tactic_behaves_like_its_steps(store):
    from tactics.macro import MacroTactic

    lineage(store, "gemm", [1.0e-3, 1.0e-3, 0.9e-3])
    lineage(store, "softmax", [8.0e-5, 8.0e-5, 7.6e-5])
    p = T.propose(store, PromoteConfig(min_tasks=2))[0]
    ns: dict = {}
    src = p.files["tactics/macro_min_blocks_vector_width.py"].replace("from .macro import", "from tactics.macro import")
    exec(compile(src, "macro", "exec"), ns)
    m = ns["TACTICS"][0]
    assert isinstance(m, MacroTactic) and m.kind == "ir" and "vector" in " ".join(m.keywords)
    g = seed("softmax", "softmax_row_n4096")
    choices = m.choices(g)
    assert choices == [{"steps": [s[1] for s in SEQ["softmax"][1]]}]   # the gemm variant does not apply here
    out = m.apply(g, choices[0])
    ref = child(child(g, *SEQ["softmax"][1][0]), *SEQ["softmax"][1][1])
    assert out["ir"] == ref["ir"]
    assert m.transform(g["ir"], choices[0], g) == ref["ir"]
    with pytest.raises(Exception):
        m.apply(g, {"steps": [{"min_blocks": 2}]})                  # wrong number of steps


def test_no_macro_from_a_single_task(store):
    lineage(store, "gemm", [1.0e-3, 1.0e-3, 0.9e-3])
    lineage(store, "gemm", [1.0e-3, 1.0e-3, 0.9e-3], run="gemm-run-2")   # same task and shape
    assert T.propose(store, PromoteConfig(min_tasks=2)) == []
    assert T.propose(store, PromoteConfig(min_tasks=1))


def test_no_macro_without_improvement(store):
    lineage(store, "gemm", [1.0e-3, 1.0e-3, 1.1e-3])          # slower
    lineage(store, "softmax", [8.0e-5, 8.0e-5, 7.6e-5])
    assert T.propose(store, PromoteConfig(min_tasks=2)) == []


def test_no_macro_when_the_last_step_adds_nothing(store):
    lineage(store, "gemm", [1.0e-3, 0.9e-3, 0.9e-3])          # better than the root, not than the parent
    lineage(store, "softmax", [8.0e-5, 7.6e-5, 7.6e-5])
    assert T.propose(store, PromoteConfig(min_tasks=2)) == []


def test_predictions_judge_when_nothing_was_measured(store):
    # The cost model predicts no gain from min_blocks + vector_width on either seed: no macro.
    lineage(store, "gemm", None)
    lineage(store, "softmax", None)
    occ = T.occurrences(store, PromoteConfig())
    assert occ == {}
    assert T.propose(store, PromoteConfig(min_tasks=2)) == []


def test_failed_candidates_are_not_evidence(store):
    lineage(store, "gemm", [1.0e-3, 1.0e-3, 0.9e-3], status="failed")
    lineage(store, "softmax", [8.0e-5, 8.0e-5, 7.6e-5])
    assert T.propose(store, PromoteConfig(min_tasks=2)) == []
