"""Rule promotion: learning a separating predicate, and the generated rule + fixtures + evidence."""
import importlib.util
import json

import pytest

from cake_ir.io import load
from cake_ir.verifier import load_rules, verify
from knowledge.models import ClusterRow
from knowledge.promote import rule as R
from knowledge.promote.base import PromoteConfig
from knowledge.store import Store

from _knowledge_data import populate, softmax_ir


@pytest.fixture
def store(tmp_path):
    s = Store(url=f"sqlite:///{tmp_path / 'cake.db'}")
    yield s
    s.close()


def test_learn_finds_a_conjunction_that_keeps_every_passing_candidate():
    fail = [{"arch": "a", "t": 1024, "v": 8}, {"arch": "a", "t": 1024, "v": 16}]
    ok = [{"arch": "a", "t": 1024, "v": 4}, {"arch": "a", "t": 256, "v": 8}, {"arch": "b", "t": 2048, "v": 16}]
    pred, info = R.learn(fail, ok)
    assert pred and info["share"] == 1.0 and info["passing_matched"] == 0
    assert all(all(R.run_test(t, f) for t in pred) for f in fail)
    assert not any(all(R.run_test(t, f) for t in pred) for f in ok)
    assert ["arch", "==", "a"] in pred


def test_learn_reports_a_partial_cover_and_refuses_the_inseparable():
    # one failing program is indistinguishable from a passing one: 3 of 4 covered (>= 80 % is not enough)
    fail = [{"t": 1024}, {"t": 2048}, {"t": 4096}, {"t": 256}]
    ok = [{"t": 256}, {"t": 128}]
    pred, info = R.learn(fail, ok, min_share=0.75)
    assert pred == [["t", ">=", 1024]] and info["share"] == 0.75 and not info["full_cover"]
    assert R.learn(fail, ok)[0] is None          # default 80 %: no proposal
    pred, info = R.learn([{"t": 1}], [{"t": 1}])
    assert pred is None and "without matching" in info["reason"]
    assert R.learn([{"t": 1}], [])[0] is None    # nothing passed: a rule would reject everything


def _load_rule(tmp_path, source: str):
    p = tmp_path / "e_lrn_test.py"
    p.write_text(source)
    spec = importlib.util.spec_from_file_location("e_lrn_test", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from cake_ir.verifier import _rule_from_module
    return _rule_from_module(mod)


def test_propose_writes_rule_fixtures_test_and_evidence(store, tmp_path):
    hashes = populate(store, "r1", n_fail=3, compile_s=1.5)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "e_lrn_01.py").write_text("# taken\n")
    props = R.propose(store, PromoteConfig(min_count=3, min_candidates=2), repo=tmp_path)
    assert len(props) == 1, R.SKIPPED
    p = props[0]
    assert p.kind == "rule" and p.id.startswith("rule-") and p.cluster_id
    code = "E-LRN-02"                           # E-LRN-01 exists in this repo
    assert sorted(p.files) == ["rules/e_lrn_02.py", f"rules/fixtures/{code}/fail.json",
                               f"rules/fixtures/{code}/pass.json", "tests/test_e_lrn_02.py"]
    ev = p.evidence
    assert ev["cluster"]["count"] == 3 and ev["cluster"]["code"] == "E-LOWER-UNSUPPORTED"
    assert ev["share"] == 1.0 and ev["passing_checked"] == 5 and ev["passing_matched"] == 0
    assert ev["would_catch"]["candidates"] == 3 and sorted(ev["would_catch"]["hashes"]) == sorted(hashes["fail"])
    assert ev["would_catch"]["seconds_saved"]["compile_s"] == pytest.approx(4.5)
    assert ev["examples"][0]["message"].startswith("tile of 4096")
    # the verify-stage cluster (E-RES-02) is recurring too, but the verifier already catches it
    assert not any("E-RES-02" in x.get("code", "") for x in R.SKIPPED)

    # the generated rule, loaded from its text like the verifier would after accepting it
    rule = _load_rule(tmp_path, p.files["rules/e_lrn_02.py"])
    assert rule.code == code and rule.stage == "source"
    fail_doc = json.loads(p.files[f"rules/fixtures/{code}/fail.json"])
    pass_doc = json.loads(p.files[f"rules/fixtures/{code}/pass.json"])
    assert fail_doc["expect"] == {"code": code, "node": "/roles/0/body/0"}
    rules = load_rules() + [rule]
    res = verify(load(fail_doc["kernel"])[0], rules)
    hit = [d for d in res.diagnostics if d.code == code]
    assert hit and hit[0].node == "/roles/0/body/0" and "E-LOWER-UNSUPPORTED" in hit[0].message
    assert verify(load(pass_doc["kernel"])[0], rules).ok
    # no recorded passing candidate is rejected; a fresh program with the same flaw is
    for warps, vec in ((8, 8), (16, 8), (32, 4), (4, 8), (16, 4), (1, 8)):
        assert verify(load(softmax_ir(warps, vec))[0], rules).ok, (warps, vec)
    assert not verify(load(softmax_ir(32, 8, "fresh"))[0], rules).ok


def test_no_proposal_for_covered_or_already_proposed_clusters(store, tmp_path):
    populate(store, "r1", n_fail=3)
    (p,) = R.propose(store, PromoteConfig(), repo=tmp_path)
    from knowledge.proposals import submit
    assert submit(store, p, tmp_path) is not None
    assert R.propose(store, PromoteConfig(), repo=tmp_path) == []      # its fingerprint is known
    with store.session() as s:
        c = s.get(ClusterRow, p.cluster_id)
        assert c.status == "proposed"
        c.status = "covered"
        s.add(c)
        s.commit()
    assert R.propose(store, PromoteConfig(), repo=tmp_path) == []


def test_inseparable_cluster_is_skipped_with_a_reason(store, tmp_path):
    populate(store, "r1", n_fail=3)
    # a passing program with exactly the failing programs' features makes the cluster inseparable
    from _knowledge_data import cand
    c = cand(softmax_ir(32, 8, "twin"), status="ok", stage="compile")
    store.record_stage("r1", c, "compile", "ok", seconds=1.0)
    assert R.propose(store, PromoteConfig(), repo=tmp_path) == []
    (sk,) = R.SKIPPED
    assert sk["code"] == "E-LOWER-UNSUPPORTED" and "passing" in sk["reason"]
