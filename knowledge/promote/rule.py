"""Promote a recurring failure cluster into a verifier rule.

For each recurring cluster at compile / test / profile (failures that escaped the verifier) we learn a
predicate over IR features (rules/_features.py): a conjunction of at most MAX_TESTS simple tests
(equality for strings/booleans, thresholds for numbers), chosen greedily like decision stumps. It must
match every failing candidate of the cluster (or, failing that, at least MIN_SHARE of them: the share
is reported) and NO candidate that passed every stage in the DB. Thresholds are the tightest that
cover the failing candidates, so the rule is as conservative as the evidence allows.

The proposal is data: rules/e_lrn_<nn>.py (code E-LRN-<nn>) carrying the cluster's code, message
template and node path, fixtures rules/fixtures/E-LRN-<nn>/{fail,pass}.json taken from real recorded
candidates, a test file, and evidence (cluster size, example diagnostics, candidates it would have
caught and the compile / GPU seconds spent on them). Nothing here imports the generated code.
Clusters with no separating predicate get no proposal; why is in SKIPPED (agent/evolve.py prints it).
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from sqlmodel import select

from rules._features import describe, features, match, test as run_test

from ..models import CandidateRow, EvaluationRow, ProposalRow
from .base import Proposal, PromoteConfig, fingerprint

STAGES = ("compile", "test", "profile", "confirm")      # escapes past the verifier
MAX_TESTS = 4
MIN_SHARE = 0.8
SKIPPED: list[dict] = []                      # clusters without a proposal in the last propose(), and why
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ learning
def _tests(fs: list[dict]) -> list[list]:
    """Candidate tests from the failing side: equality on strings/bools, thresholds at observed numbers."""
    keys = sorted({k for f in fs for k in f})
    out = []
    for k in keys:
        vals = [f[k] for f in fs if k in f]
        if not vals:
            continue
        if all(isinstance(v, bool) or isinstance(v, str) for v in vals):
            for v in sorted(set(vals), key=str):
                out.append([k, "==", v])
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            # every observed value is a threshold candidate (the tightest for a subset of the failures)
            for v in sorted(set(vals))[:64]:
                out.append([k, ">=", v])
                out.append([k, "<=", v])
    return out


def learn(fail: list[dict], ok: list[dict], min_share: float = MIN_SHARE) -> tuple[Optional[list], dict]:
    """(predicate, info) or (None, info with the reason)."""
    if not fail:
        return None, {"reason": "no failing candidate with IR features"}
    if not ok:
        return None, {"reason": "no passing candidate to contrast with: a rule would reject everything"}
    for share in (1.0, min_share):
        need = max(1, math.ceil(share * len(fail) - 1e-9))
        covered, left, pred = list(range(len(fail))), list(range(len(ok))), []
        while left and len(pred) < MAX_TESTS:
            best = None
            for t in _tests([fail[i] for i in covered]):
                cov = [i for i in covered if run_test(t, fail[i])]
                if len(cov) < need:
                    continue
                rest = [j for j in left if run_test(t, ok[j])]
                key = (len(left) - len(rest), len(cov), t[1] == "==", -len(str(t[0])))
                if best is None or key > best[0]:
                    best = (key, t, cov, rest)
            if best is None or best[0][0] == 0:
                break
            _, t, covered, left = best
            pred.append(t)
        if not left and pred:
            arch = {fail[i].get("arch") for i in covered}
            if len(arch) == 1 and None not in arch and not any(t[0] == "arch" for t in pred):
                pred.insert(0, ["arch", "==", arch.pop()])   # scope the rule to the arch it was learned on
            return pred, {"share": round(len(covered) / len(fail), 4), "matched_failing": len(covered),
                          "failing": len(fail), "passing_checked": len(ok), "passing_matched": 0,
                          "full_cover": share == 1.0}
    return None, {"reason": f"no conjunction of {MAX_TESTS} feature tests covers {min_share:.0%} of the "
                            f"{len(fail)} failing candidates without matching one of the {len(ok)} passing ones"}


# ------------------------------------------------------------------ evidence from the DB
def _passing(store, cfg: PromoteConfig) -> dict[str, CandidateRow]:
    with store.session() as s:
        rows = s.exec(select(CandidateRow).where(CandidateRow.status == "ok").order_by(CandidateRow.id))
        return {r.hash: r for r in rows if r.ir}


def _stage_seconds(store, cand_ids: list[int]) -> dict[str, float]:
    out = {"verify_s": 0.0, "compile_s": 0.0, "gpu_s": 0.0}
    if not cand_ids:
        return out
    with store.session() as s:
        for e in s.exec(select(EvaluationRow).where(EvaluationRow.candidate_id.in_(cand_ids))):
            k = "gpu_s" if e.stage in ("test", "profile", "confirm") else f"{e.stage}_s"
            out[k] = round(out.get(k, 0.0) + float(e.seconds or 0.0), 4)
    return out


def _used_numbers(store, repo: Path) -> set[int]:
    pat = re.compile(r"rules/e_lrn_(\d+)\.py$")
    used = {int(m.group(1)) for p in (repo / "rules").glob("e_lrn_*.py") if (m := pat.search(p.as_posix()))}
    with store.session() as s:
        for p in s.exec(select(ProposalRow).where(ProposalRow.kind == "rule", ProposalRow.status != "rejected")):
            for f in p.files or []:
                if m := pat.search(f):
                    used.add(int(m.group(1)))
    return used


def _resolves(ir: Any, node: Optional[str]) -> bool:
    from cake_ir.walk import resolve
    return bool(node) and resolve(ir, node) is not None


def _clean(ir: dict) -> bool:
    """The current verifier reports no error on this IR (a usable passing fixture)."""
    from cake_ir.io import load
    from cake_ir.verifier import verify
    k, diags = load(ir)
    return k is not None and verify(k).ok


# ------------------------------------------------------------------ proposals
def propose(store, cfg: Optional[PromoteConfig] = None, repo: Optional[Path] = None) -> list[Proposal]:
    from ..clusters import cluster, members, recurring
    cfg = cfg or PromoteConfig()
    repo = Path(repo or REPO)
    SKIPPED.clear()
    cluster(store, cfg)
    passing = _passing(store, cfg)
    ok_feats = {h: features(r.ir) for h, r in passing.items()}
    with store.session() as s:
        known = {p.fingerprint for p in s.exec(select(ProposalRow))}
    used = _used_numbers(store, repo)
    out = []
    for c in recurring(store, cfg):
        if c.stage not in STAGES or c.status == "covered":
            continue
        fp = fingerprint("rule", c.signature)
        if fp in known:
            continue
        mem = members(store, c.id)
        fails: dict[str, CandidateRow] = {}
        for f, cand in mem:
            if cand is not None and cand.ir and cand.hash not in passing:
                fails.setdefault(cand.hash, cand)
        if len(fails) < cfg.min_candidates:
            SKIPPED.append({"cluster": c.id, "signature": c.signature, "reason": "too few failing candidates with IR"})
            continue
        hashes = list(fails)
        f_feats = [features(fails[h].ir) for h in hashes]
        pred, info = learn(f_feats, list(ok_feats.values()))
        if pred is None:
            SKIPPED.append({"cluster": c.id, "signature": c.signature, "code": c.code, **info})
            continue
        nn = next(i for i in range(1, 1000) if i not in used)
        used.add(nn)
        p = _proposal(store, c, mem, fails, hashes, f_feats, pred, info, passing, ok_feats, nn, fp)
        if p is None:
            SKIPPED.append({"cluster": c.id, "signature": c.signature, "reason": "no usable fixtures"})
            continue
        out.append(p)
    return out


def _proposal(store, c, mem, fails, hashes, f_feats, pred, info, passing, ok_feats, nn, fp) -> Optional[Proposal]:
    code = f"E-LRN-{nn:02d}"
    nodes = Counter(f.node for f, _ in mem if f.node)
    node = nodes.most_common(1)[0][0] if nodes else None
    matched = [h for h, ff in zip(hashes, f_feats) if match(pred, ff)]
    fail_h = next((h for h in matched if _fixture_ok(fails[h].ir)), None)
    if fail_h is None:
        return None
    fail_ir = fails[fail_h].ir
    expect_node = node if _resolves(fail_ir, node) else "/"
    # the passing fixture: a recorded passing candidate, clean under today's rules, most alike the failing one
    ff = features(fail_ir)
    order = sorted(passing, key=lambda h: (-sum(ok_feats[h].get(k) == v for k, v in ff.items()), passing[h].id))
    pass_h = next((h for h in order[:20] if _clean(passing[h].ir)), None)
    if pass_h is None:
        return None
    msg = (f"learned from {c.count} {c.stage} failures ({c.code}) over {c.candidates} candidates: "
           f"{c.template}; matches {describe(pred)}")
    files = {
        f"rules/e_lrn_{nn:02d}.py": _rule_source(code, c, pred, node, msg),
        f"rules/fixtures/{code}/fail.json": json.dumps({"expect": {"code": code, "node": expect_node},
                                                         "kernel": fail_ir}, indent=1, sort_keys=True) + "\n",
        f"rules/fixtures/{code}/pass.json": json.dumps({"kernel": passing[pass_h].ir}, indent=1,
                                                         sort_keys=True) + "\n",
        f"tests/test_e_lrn_{nn:02d}.py": _test_source(code),
    }
    # what the rule would have saved: every recorded candidate it matches that failed after verify
    with store.session() as s:
        late = list(s.exec(select(CandidateRow).where(CandidateRow.status == "failed",
                                                      CandidateRow.stage.in_(STAGES))))
    caught = [r for r in late if r.ir and match(pred, features(r.ir))]
    ids = sorted({r.id for r in caught})
    evidence = {
        "code": code,
        "cluster": {"id": c.id, "signature": c.signature, "stage": c.stage, "code": c.code, "node_kind": c.node_kind,
                    "template": c.template, "count": c.count, "candidates": c.candidates, "runs": c.runs,
                    "tasks": c.tasks},
        "predicate": pred, "predicate_text": describe(pred), **info,
        "examples": [{"candidate": cand.hash if cand else None, "run": f.run_id, "stage": f.stage, "code": f.code,
                      "node": f.node, "message": f.message[:400]} for f, cand in mem[:3]],
        "fixtures": {"fail": fail_h, "pass": pass_h, "node": expect_node},
        "would_catch": {"candidates": len({r.hash for r in caught}), "hashes": sorted({r.hash for r in caught})[:50],
                        "seconds_saved": _stage_seconds(store, ids)},
        "unmatched_failing": [h for h in hashes if h not in matched][:20],
    }
    title = f"{code}: reject {c.code} at {c.stage} ({c.count}x, {c.candidates} candidates) when {describe(pred)}"
    return Proposal(kind="rule", title=title[:200], fingerprint=fp, files=files, evidence=evidence,
                    cluster_id=c.id)


def _fixture_ok(ir: dict) -> bool:
    from cake_ir.io import load
    return load(ir)[0] is not None


def _rule_source(code: str, c, pred: list, node: Optional[str], msg: str) -> str:
    return f'''"""{code}: learned by knowledge/promote/rule.py from failure cluster {c.signature}.

{c.count} failures at stage {c.stage} ({c.code}) over {c.candidates} distinct candidates escaped the
verifier. This predicate over IR features (rules/_features.py) matched those candidates and none of
the candidates that passed every stage:

    {describe(pred)}

Message template of the cluster: {c.template!r}
"""
from rules._features import features, match

CODE = {code!r}
TITLE = {("learned: " + c.code + " at " + c.stage + " (" + (c.node_kind or "kernel") + ")")!r}
STAGE = "source"
PREDICATE = {pred!r}
NODE = {node!r}
MESSAGE = {msg!r}


def check(ctx):
    from cake_ir.io import to_dict
    from cake_ir.walk import resolve

    ir = to_dict(ctx.source)
    if match(PREDICATE, features(ir)):
        node = NODE if NODE and resolve(ir, NODE) is not None else "/"
        yield ctx.report(node, MESSAGE)
'''


def _test_source(code: str) -> str:
    return f'''"""Learned rule {code}: its fixtures are real recorded candidates (one that failed after the
verifier, one that passed every stage)."""
import json
import pathlib

from cake_ir.io import load
from cake_ir.verifier import load_rules, verify

CODE = {code!r}
FIX = pathlib.Path(__file__).resolve().parent.parent / "rules" / "fixtures" / CODE


def _verify(name):
    doc = json.loads((FIX / name).read_text())
    k, diags = load(doc["kernel"])
    assert k is not None, [d.short() for d in diags]
    return doc, verify(k)


def test_rule_is_loaded():
    assert CODE in [r.code for r in load_rules()]


def test_failing_candidate_is_rejected():
    doc, res = _verify("fail.json")
    hits = [d for d in res.diagnostics if d.code == CODE]
    assert hits and any(d.node == doc["expect"]["node"] for d in hits), [d.short() for d in res.diagnostics]
    assert not any(d.code == "E-VERIFY-INTERNAL" for d in res.diagnostics)


def test_passing_candidate_is_clean():
    _, res = _verify("pass.json")
    assert res.ok and not [d for d in res.diagnostics if d.code == CODE], [d.short() for d in res.diagnostics]
'''
