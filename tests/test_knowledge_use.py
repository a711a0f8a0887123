"""Use of the knowledge: tactic statistics from runs, experience notes and embedded failures at the
end of a run, the search proposer's prior, and the LLM prompt's retrieved knowledge under a budget."""
import random
from collections import Counter

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CAKE_DB_URL", raising=False)
    monkeypatch.delenv("CAKE_CHROMA_URL", raising=False)
    return tmp_path / "home"


def _cand(h, tactic, parent=None, status="ok", pred=None, meas=None, arch="sm_90a", params=None):
    return {"hash": h, "name": f"k_{h}", "ir": {"name": f"k_{h}", "arch": arch}, "parent": parent, "tactic": tactic,
            "params": params or {}, "proposer": "search", "strategy": "bandit", "recipe": {"family": "gemm_fam"},
            "iteration": 1, "slot": 0, "predicted_s": pred, "cost": None, "status": status,
            "stage": "compile" if status == "ok" else "verify", **({"measured_s": meas} if meas else {})}


def _make_run(store, run_id="r1", task="gemm"):
    store.create_run(run_id, task, proposer="search", dry_run=True, config={})
    rec = store.record_stage
    rec(run_id, _cand("seed", "seed", pred=1.0), "verify", "ok")
    rec(run_id, _cand("a", "stages", "seed", pred=0.90, params={"S": 3}), "verify", "ok")    # +11 %
    rec(run_id, _cand("b", "stages", "seed", pred=1.10, params={"S": 6}), "verify", "ok")    # -9 %
    rec(run_id, _cand("c", "stages", "a", pred=0.80, params={"S": 4}), "verify", "ok")       # +12.5 % over a
    for i in range(3):                                                                       # recurring failure
        rec(run_id, _cand(f"f{i}", "swizzle", "seed", status="failed", pred=0.9), "verify", "fail",
            failures=[{"code": "E-CPY-02", "node": "/params/0/tma", "message": f"TMA box {i} does not match the swizzle"}])
    rec(run_id, _cand("o", "unroll", "seed", pred=1.0, arch="sm_80"), "verify", "ok")        # no change, other arch
    return run_id


def test_tactic_stats_from_runs_are_idempotent(home):
    from knowledge.store import Store
    from knowledge.tactic_stats import stats, update_from_run
    store = Store()
    _make_run(store)
    assert update_from_run(store, "r1") == 3
    first = stats(store, task="gemm", arch="sm_90a")
    assert update_from_run(store, "r1") == 3 and stats(store, task="gemm", arch="sm_90a") == first
    st = first["stages"]
    assert (st["applied"], st["ok"], st["improved"]) == (3, 3, 2)
    assert st["success_rate"] == 1.0 and abs(st["median_gain"] - (1 / 0.9 - 1)) < 1e-6
    sw = first["swizzle"]
    assert (sw["applied"], sw["ok"], sw["improved"], sw["median_gain"]) == (3, 0, 0, None)
    assert "unroll" not in first and stats(store, task="gemm", arch="sm_80")["unroll"]["improved"] == 0
    # a second run of the task adds to the same rows
    store.create_run("r2", "gemm", proposer="search", dry_run=True, config={})
    store.record_stage("r2", _cand("seed", "seed", pred=1.0), "verify", "ok")
    store.record_stage("r2", _cand("z", "stages", "seed", pred=0.5), "verify", "ok")
    update_from_run(store, "r2")
    assert stats(store, task="gemm", arch="sm_90a")["stages"]["applied"] == 4
    assert stats(store, task="softmax") == {}


def test_end_of_run_notes_and_embeddings(home):
    from knowledge.experience import end_of_run
    from knowledge.models import NoteRow
    from knowledge.store import Store
    from knowledge.vectors import default_store
    from sqlmodel import select
    store = Store()
    _make_run(store)
    r = end_of_run(store, "r1")
    assert r["notes"] == 3 and r["experiences"] == 3 and r["failures"] == 3 and r["tactic_stats"] == 3
    with store.session() as s:
        notes = {n.key: n for n in s.exec(select(NoteRow))}
    assert set(notes) == {"improved:a", "improved:c", "failure:E-CPY-02"}
    assert "stages {S=3}" in notes["improved:a"].text and "11.1% faster" in notes["improved:a"].text
    assert "recurred 3 times" in notes["failure:E-CPY-02"].text and "swizzle x3" in notes["failure:E-CPY-02"].text
    again = end_of_run(store, "r1")                  # a resumed run finishing again: nothing new
    assert again["experiences"] == 0 and again["failures"] == 0
    vs = default_store()
    assert vs.count("experiences") == 3 and vs.count("failures") == 3
    hit = vs.query("experiences", "a deeper software pipeline made the matrix multiply faster", k=1, task="gemm")
    assert hit[0]["id"].startswith("r1:improved:")
    assert vs.query("failures", "swizzle mode disagrees with the TMA box", k=1)[0]["meta"]["code"] == "E-CPY-02"


# ------------------------------------------------------------------------------ search prior
def _bandit_picks(prior, mode="bandit", n=300):
    from agent.candidates import ProposeContext
    from agent.search import SearchStrategy
    from agent.strategies import member_of, new_strategy_state
    from cake_ir import arch
    from tactics import load_tactics
    from tasks.registry import get
    entry = get("gemm")
    g = next(g for g in entry.seed_genomes() if g["ir"]["arch"] == "sm_90a")
    st = new_strategy_state(mode, "search")
    st["pop"].append(member_of({"hash": "s", "name": g["name"], "score_s": 1e-3, "ir": g["ir"], "recipe": g["recipe"]}))
    st["prior"] = prior
    usable = [t.name for t in load_tactics() if t.kind != "repair" and t.applicable(g) is None]
    st["arms"] = {t: [2, 0.5] for t in usable}          # every tactic tried twice in this run, the same outcome
    s = SearchStrategy(mode, mode)
    rng = random.Random(3)
    ctx = ProposeContext(rng=rng, seen=set(), notes=[], iteration=1, entry=entry, spec=arch.spec("sm_90a"),
                         shape=entry.bench_shape, dry_run=True)
    tactics = {t.name: t for t in load_tactics()}
    picks = Counter()
    for _ in range(n):
        p = s._pick(st, tactics, ctx)
        if p is not None and p[1] != "crossover":
            picks[p[1]] += 1
    return picks, usable


def test_statistics_bias_the_search():
    from agent.search import prior_arm
    good = prior_arm({"applied": 10, "ok": 10, "improved": 9, "median_gain": 0.15})
    bad = prior_arm({"applied": 10, "ok": 2, "improved": 0, "median_gain": -0.3})
    assert good[1] / good[0] > 0.9 and bad[1] / bad[0] < 0.1
    picks0, usable = _bandit_picks({})
    assert "stages" in usable and "unroll" in usable
    prior = {"sm_90a": {t: (good if t == "stages" else bad) for t in usable}}
    picks1, _ = _bandit_picks(prior)
    # UCB: with equal arms the choice is spread; the prior makes stages the exploited arm
    assert picks1["stages"] > 0.6 * sum(picks1.values()) > 0
    assert picks0["stages"] < 0.4 * sum(picks0.values())
    e0, _ = _bandit_picks({}, mode="evolve")
    e1, _ = _bandit_picks(prior, mode="evolve")
    assert e1["stages"] / sum(e1.values()) > 2 * e0["stages"] / sum(e0.values())
    # a prior for another arch changes nothing
    other, _ = _bandit_picks({"sm_80": prior["sm_90a"]})
    assert other == picks0


# ------------------------------------------------------------------------------ LLM knowledge
def test_knowledge_section_respects_the_budget():
    from agent.prompts import knowledge_section
    from tactics.base import retrieve
    ts = retrieve("avoid shared memory bank conflicts", k=4)
    stats = {"swizzle": {"applied": 7, "success_rate": 0.5, "improve_rate": 0.25, "median_gain": 0.031}}
    notes = [f"note {i}: swizzle_128B on gemm_wgmma made ldmatrix {i}% faster" for i in range(6)]
    full = knowledge_section(ts, stats, notes, 100000)
    assert "- swizzle: XOR-permute" in full and "applied 7, worked 50%, beat the parent 25%, median gain +3.1%" in full
    assert all(n in full for n in notes)
    for budget in (0, 150, 700, 1500, 4000):
        text = knowledge_section(ts, stats, notes, budget)
        assert len(text) <= budget
    mid = knowledge_section(ts, stats, notes, 1200)
    assert "- swizzle:" in mid and "note 0:" in mid          # the best of both kinds get in first


def test_llm_prompt_gets_retrieved_tactics_and_notes(home):
    from agent import prompts
    from agent.candidates import ProposeContext
    from agent.config import RunConfig
    from agent.llm import LLMStrategy
    from cake_ir import arch
    from knowledge.experience import end_of_run
    from knowledge.store import Store
    from tasks.registry import get
    store = Store()
    _make_run(store)
    end_of_run(store, "r1")
    entry = get("gemm")
    g = next(g for g in entry.seed_genomes() if g["ir"]["arch"] == "sm_90a")
    member = {"hash": "h", "score": 1e-3, "genome": {"ir": g["ir"], "recipe": None}, "cost": {"bound": "memory"}}
    failures = [{"hash": "x", "tactic": "swizzle", "stage": "verify", "code": "E-CPY-02",
                 "message": "the TMA box does not match the swizzle", "diagnostics": []}]
    cfg = RunConfig(run_id="x", task="gemm", knowledge_chars=1500)
    ctx = ProposeContext(rng=random.Random(0), seen=set(), notes=[], iteration=1, entry=entry,
                         spec=arch.spec("sm_90a"), shape=entry.bench_shape, dry_run=True, cfg=cfg)
    text = LLMStrategy().knowledge(ctx, member, failures)
    assert 0 < len(text) <= 1500
    assert "- swizzle:" in text and "applied 3, worked 0%" in text          # stats of this task and arch
    assert "## Experience from earlier runs" in text and "E-CPY-02" in text and "recurred 3 times" in text
    msgs, meta = prompts.build(entry, member, measured=False, spec_name="h200", dry_run=True, failures=failures,
                               notes=[], context_tokens=20000, knowledge=text)
    assert text in msgs[1]["content"] and "tactics" in meta["sections"]
