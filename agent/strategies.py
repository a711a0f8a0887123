"""Strategies that run side by side in one campaign, and how effort moves between them.

Each strategy (bandit and evolve search, llm) keeps its own population, statistics and budget in
`state["strategies"][name]` (plain JSON). Strategies share only *conclusions*: short notes of what
worked or failed (`state["notes"]`), e.g. "stages {S: 5} on gemm_wgmma_sm90a: -7.9% (predicted)".
The search strategies bias their tactic choice with other strategies' notes; the LLM reads them.

Effort: every propose step has `batch` slots. Each active strategy earns credit in proportion to its
weight; slots go to the strategies with most credit. A strategy whose own best has not improved for
`plateau` of its candidates is on a plateau and its weight drops to PLATEAU_WEIGHT; strategies that
improved recently get a bonus, so effort shifts to the strategy that is improving.
"""
from __future__ import annotations

import math
from typing import Optional

PLATEAU_WEIGHT = 0.25
RECENT = 10                 # window of recent outcomes for the improvement bonus
IMPROVE_EPS = 0.005         # a score must drop by 0.5 % to count as an improvement
POP_SIZE = 8
ARCHIVE_SIZE = 64
MAX_NOTES = 60


def new_strategy_state(name: str, kind: str) -> dict:
    return {"name": name, "kind": kind, "active": True, "inactive_reason": None, "weight": 1.0, "credit": 0.0,
            "proposed": 0, "evaluated": 0, "ok": 0, "improved": 0, "since_improve": 0, "plateau": False,
            "best_s": None, "best_hash": None, "recent": [], "pop": [], "repair": [], "arms": {},
            "proposer_failures": 0, "consecutive_failures": 0, "exhausted": 0}


def weight(st: dict, plateau: int) -> float:
    if not st.get("active", True):
        return 0.0
    w = PLATEAU_WEIGHT if st.get("since_improve", 0) >= plateau else 1.0
    return w * (1.0 + sum(st.get("recent", [])[-RECENT:]))


def allocate(strategies: dict, slots: int, plateau: int) -> dict[str, int]:
    """Slots per strategy for this step; mutates credits in `strategies` (the caller's copy)."""
    ws = {n: weight(s, plateau) for n, s in strategies.items()}
    total = sum(ws.values())
    out = {n: 0 for n in strategies}
    if total <= 0 or slots <= 0:
        return out
    for n, s in strategies.items():
        s["weight"] = round(ws[n] / total, 4)
        s["credit"] = s.get("credit", 0.0) + slots * ws[n] / total
    for _ in range(slots):
        n = max((n for n in strategies if ws[n] > 0), key=lambda n: (strategies[n]["credit"], n))
        out[n] += 1
        strategies[n]["credit"] -= 1.0
    return out


def better(a: Optional[float], b: Optional[float]) -> bool:
    """Is score a (seconds) an improvement over b?"""
    if a is None:
        return False
    return b is None or a < b * (1.0 - IMPROVE_EPS)


def add_member(st: dict, member: dict) -> None:
    """Into the population (the best POP_SIZE); members pushed out go to the archive (the newest
    ARCHIVE_SIZE), where the search looks for parents once the population's neighbours are used up."""
    pop = [m for m in st["pop"] if m["hash"] != member["hash"]] + [member]
    pop.sort(key=lambda m: (m["score"] if m.get("score") is not None else math.inf, m["hash"]))
    st["pop"] = pop[:POP_SIZE]
    out = {m["hash"] for m in pop[POP_SIZE:]}
    kept = {m["hash"] for m in st["pop"]}
    arch = [m for m in st.get("archive", []) if m["hash"] not in out | kept] + [slim(m) for m in pop[POP_SIZE:]]
    st["archive"] = arch[-ARCHIVE_SIZE:]


def slim(member: dict) -> dict:
    """An archived member without its IR when its recipe rebuilds it (the checkpointed state stays
    small: a KDA program is ~35 KB of JSON); `search.full_member` rebuilds it."""
    from tactics.family import family
    recipe = (member.get("genome") or {}).get("recipe")
    if family(recipe) is None:
        return member
    return {**member, "genome": {"ir": None, "recipe": recipe}}


def observe(st: dict, cand: dict, plateau: int) -> list[str]:
    """Update a strategy's statistics with one evaluated candidate; returns event lines."""
    events = []
    st["evaluated"] += 1
    ok = cand.get("status") == "ok"
    score = cand.get("score_s")
    tactic = cand.get("tactic") or "?"
    if ok:
        st["ok"] += 1
        reward = 1.0 if better(score, cand.get("parent_score")) else 0.25
    else:
        reward = 0.0
    arm = st["arms"].setdefault(tactic, [0, 0.0])
    arm[0] += 1
    arm[1] = round(arm[1] + reward, 4)
    was_plateau = st.get("plateau", False)
    if ok and better(score, st.get("best_s")):
        st["best_s"], st["best_hash"] = score, cand["hash"]
        st["since_improve"] = 0
        st["improved"] += 1
        st["recent"] = (st["recent"] + [1])[-RECENT:]
    else:
        st["since_improve"] += 1
        st["recent"] = (st["recent"] + [0])[-RECENT:]
    if ok:
        add_member(st, member_of(cand))
    elif cand.get("stage") == "verify" and cand.get("tactic") != "verifier_fix" \
            and any(d.get("fix") for d in cand.get("diagnostics") or []):
        # one repair per lineage: a fix whose result fails again (a fix trading one rule for another) is
        # not chased further (on the KDA seeds such chains cost a third of a run's slots)
        st["repair"] = ([m for m in st["repair"] if m["hash"] != cand["hash"]] + [member_of(cand, with_diags=True)])[-4:]
    st["plateau"] = st["since_improve"] >= plateau
    if st["plateau"] and not was_plateau:
        events.append(f"plateau: {st['name']} has not improved for {st['since_improve']} candidates; "
                      f"its share of the batch drops")
    elif was_plateau and not st["plateau"]:
        events.append(f"{st['name']} improved again; it gets its share back")
    return events


def member_of(cand: dict, with_diags: bool = False) -> dict:
    m = {"hash": cand["hash"], "name": cand.get("name"), "score": cand.get("score_s"), "cost": cand.get("cost"),
         "genome": {"ir": cand["ir"], "recipe": cand.get("recipe")}}
    if with_diags:
        m["genome"]["diagnostics"] = cand.get("diagnostics") or []
    return m


def conclusion(cand: dict, measured: bool) -> Optional[dict]:
    """A short note of what one candidate taught (shared between strategies)."""
    tactic = cand.get("tactic")
    if not tactic or tactic == "seed":
        return None
    family = (cand.get("recipe") or {}).get("family") or cand.get("parent_name") or "program"
    params = cand.get("params") or {}
    label = "measured" if measured else "predicted"
    if cand.get("status") == "ok":
        ps, s = cand.get("parent_score"), cand.get("score_s")
        delta = (s / ps - 1.0) if (ps and s) else None
        outcome = "improved" if better(s, ps) else "slower"
        d = f"{delta * 100:+.1f}%" if delta is not None else "n/a"
        text = f"{tactic} {_short(params)} on {family}: {d} ({label})"
        return {"strategy": cand.get("strategy"), "family": family, "tactic": tactic, "params": params,
                "outcome": outcome, "delta": delta, "text": text}
    fail = cand.get("fail") or {}
    text = (f"{tactic} {_short(params)} on {family}: failed {fail.get('stage', '?')} "
            f"{fail.get('code', '')} {('at ' + fail['node']) if fail.get('node') else ''}").strip()
    return {"strategy": cand.get("strategy"), "family": family, "tactic": tactic, "params": params,
            "outcome": "failed", "code": fail.get("code"), "text": text}


def _short(params: dict) -> str:
    p = {k: v for k, v in params.items() if k not in ("fix",)}
    s = ", ".join(f"{k}={v}" for k, v in p.items())
    return "{" + s[:80] + "}"


def add_note(notes: list, note: Optional[dict]) -> list:
    if not note:
        return notes
    key = (note["family"], note["tactic"], str(note["params"]), note["outcome"])
    kept = [n for n in notes if (n["family"], n["tactic"], str(n["params"]), n["outcome"]) != key]
    return (kept + [note])[-MAX_NOTES:]
