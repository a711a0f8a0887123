"""The search proposer: tactics applied to seed programs and the best candidates so far.

Two strategies share this code and differ in how they pick what to try next:

- bandit: UCB1 over tactic names (reward 1 when the child beats its parent, 0.25 when it works but is
  slower, 0 when it fails), applied to the strategy's best candidate (60 %) or another population
  member; other strategies' notes count as half-weight pseudo-observations.
- evolve: tournament selection (size 3) over the strategy's population, a random applicable tactic
  (avoiding tactic+params that other strategies' notes report as failing on the same family), and
  crossover (25 %) of two members of the same seed family (parameters mixed, IR steps merged).

Both use the tactic statistics of earlier runs (knowledge/tactic_stats.py: per task and arch, how
often a tactic worked, beat its parent, and its median gain) as a prior: the bandit counts them as
pseudo-observations, evolve weights its random choice by them. The prior is read from the DB once
per run and kept in the strategy's checkpointed state, so a resumed run proposes the same batches.

Both also repair: a candidate that failed verification with a diagnostic carrying a JSON-Patch fix is
retried through the `verifier_fix` tactic. Each step draws several times more children than it needs,
drops those whose IR hash was seen before, and keeps the best by the cost model's prediction (plus a
random quarter, so the model's blind spots still get measured).
"""
from __future__ import annotations

import copy
import math
from .candidates import ProposeContext, make_candidate, prerank

OVERSAMPLE = 4
UCB_C = 0.8
NOTE_WEIGHT = 0.5
CROSSOVER_P = 0.25
REPAIR_P = 0.15
PRIOR_WEIGHT = 0.3        # one earlier application counts as 0.3 of an observation in this run ...
PRIOR_MAX = 10            # ... and at most 10 of them (3 pseudo-observations) per tactic
GAIN_CLIP = 0.2           # the median gain's share of the prior reward, clipped to +-20 %


def load_prior(task: str) -> dict:
    """{arch: {tactic: [pseudo-count, pseudo-reward sum]}} from the tactic statistics of `task`.
    The reward is the bandit's (1 improved, 0.25 ok but slower, 0 failed) plus the clipped median gain."""
    try:
        from knowledge.store import Store
        from knowledge.tactic_stats import by_arch
        store = Store()
        try:
            rows = by_arch(store, task)
        finally:
            store.close()
    except Exception:  # noqa: BLE001 - no statistics (no DB, old schema) means no prior, not a failed run
        return {}
    return {arch: {t: prior_arm(v) for t, v in per.items() if v["applied"]} for arch, per in rows.items()}


def prior_arm(v: dict) -> list:
    n = v["applied"]
    reward = (v["improved"] + 0.25 * (v["ok"] - v["improved"])) / n
    if v.get("median_gain") is not None:
        reward += max(-GAIN_CLIP, min(GAIN_CLIP, v["median_gain"]))
    reward = max(0.0, min(1.0, reward))
    w = PRIOR_WEIGHT * min(n, PRIOR_MAX)
    return [round(w, 4), round(w * reward, 4)]


def collect(strategy, st: dict, ctx: ProposeContext, want: int, limit: int, draw, active: bool = True) -> list[dict]:
    """Up to `want` new candidates from at most `limit` calls of `draw()` -> (parent, tactic, params,
    genome) or None. A draw that raises (a tactic or generator refusing its parameters) or yields a
    hash seen before is skipped. Sets st["exhausted"] (consecutive steps without a candidate)."""
    pool, hashes = [], set()
    for _ in range(limit if active else 0):
        if len(pool) >= want:
            break
        try:
            got = draw()
        except Exception:  # noqa: BLE001 - a broken tactic must not stop the search
            continue
        if got is None:
            continue
        parent, tname, params, genome = got
        cand, _ = make_candidate(genome, ctx, strategy=strategy.name, proposer=strategy.proposer, tactic=tname,
                                 params=params, parent=parent)
        if cand is None or cand["hash"] in ctx.seen or cand["hash"] in hashes:
            continue
        hashes.add(cand["hash"])
        pool.append(cand)
    st["exhausted"] = 0 if pool else st.get("exhausted", 0) + 1
    return pool


class SearchStrategy:
    proposer = "search"

    def __init__(self, name: str, mode: str):
        self.name, self.mode = name, mode

    # ------------------------------------------------------------------ proposing
    def propose(self, st: dict, n: int, ctx: ProposeContext) -> tuple[list[dict], list[dict]]:
        from tactics import load_tactics
        tactics = {t.name: t for t in load_tactics()}
        if "prior" not in st:
            # a campaign (ctx.cfg set) reads the DB; callers without a run may pass one in ctx.extra
            if "tactic_prior" in ctx.extra:
                st["prior"] = ctx.extra["tactic_prior"]
            else:
                st["prior"] = load_prior(ctx.cfg.task) if ctx.cfg is not None else {}
        pool = collect(self, st, ctx, n * OVERSAMPLE, 40 * n + 40, lambda: self._draw(st, tactics, ctx),
                       active=bool(st["pop"] or st["repair"]))
        return prerank(pool, n, ctx.rng), []

    def _draw(self, st: dict, tactics: dict, ctx: ProposeContext):
        pick = self._pick(st, tactics, ctx)
        if pick is None:
            return None
        parent, tname, params, genome_fn = pick
        return parent, tname, params, genome_fn()

    def _pick(self, st: dict, tactics: dict, ctx: ProposeContext):
        rng = ctx.rng
        if st["repair"] and rng.random() < REPAIR_P:
            parent = rng.choice(st["repair"])
            t = tactics.get("verifier_fix")
            if t is not None and t.applicable(parent["genome"]) is None:
                params = rng.choice(t.choices(parent["genome"]))
                return parent, t.name, params, lambda: t.apply(parent["genome"], params)
        if not st["pop"]:
            return None
        if self.mode == "evolve":
            parent = self._tournament(st["pop"], rng)
            if rng.random() < CROSSOVER_P:
                x = self._crossover(st["pop"], parent, ctx)
                if x is not None:
                    return x
        else:
            parent = st["pop"][0] if rng.random() < 0.6 else rng.choice(st["pop"])
        g = parent["genome"]
        usable = [t for t in tactics.values() if t.kind != "repair" and t.applicable(g) is None]
        if not usable:
            return None
        arch = g["ir"].get("arch") or ""
        prior = (st.get("prior") or {}).get(arch, {})
        t = self._ucb(st, usable, ctx, prior) if self.mode == "bandit" else self._weighted(usable, prior, rng)
        choices = t.choices(g)
        family = (g.get("recipe") or {}).get("family") or parent.get("name")
        taboo = {str(nt["params"]) for nt in ctx.notes
                 if nt.get("outcome") == "failed" and nt.get("tactic") == t.name and nt.get("family") == family}
        fresh = [c for c in choices if str(c) not in taboo] or choices
        params = rng.choice(fresh)
        return parent, t.name, params, lambda: t.apply(g, params)

    @staticmethod
    def _tournament(pop: list, rng, k: int = 3) -> dict:
        group = rng.sample(pop, min(k, len(pop)))
        return min(group, key=lambda m: m["score"] if m.get("score") is not None else math.inf)

    @staticmethod
    def _weighted(usable: list, prior: dict, rng):
        """A random tactic, weighted by its prior mean reward (an unknown tactic weighs like an
        average one, so nothing is excluded)."""
        if not prior:
            return rng.choice(usable)
        means = [p[1] / p[0] for p in prior.values() if p[0] > 0]
        default = sum(means) / len(means) if means else 0.5
        ws = [0.1 + (prior[t.name][1] / prior[t.name][0] if prior.get(t.name, [0])[0] > 0 else default) for t in usable]
        return rng.choices(usable, weights=ws, k=1)[0]

    def _ucb(self, st: dict, usable: list, ctx: ProposeContext, runs_prior: dict | None = None):
        prior: dict[str, list] = {t: list(v) for t, v in (runs_prior or {}).items()}
        for nt in ctx.notes:
            if nt.get("strategy") == self.name:
                continue
            r = {"improved": 1.0, "slower": 0.25}.get(nt.get("outcome"), 0.0)
            p = prior.setdefault(nt["tactic"], [0.0, 0.0])
            p[0] += NOTE_WEIGHT
            p[1] += NOTE_WEIGHT * r
        stats = {}
        for t in usable:
            n, s = st["arms"].get(t.name, [0, 0.0])
            pn, ps = prior.get(t.name, [0.0, 0.0])
            stats[t.name] = (n + pn, s + ps)
        untried = [t for t in usable if stats[t.name][0] == 0]
        if untried:
            return ctx.rng.choice(untried)
        total = sum(v[0] for v in stats.values())
        return max(usable, key=lambda t: (stats[t.name][1] / stats[t.name][0]
                                          + UCB_C * math.sqrt(math.log(total + 1) / stats[t.name][0]),
                                          ctx.rng.random()))

    def _crossover(self, pop: list, p1: dict, ctx: ProposeContext):
        from tactics.family import family, instantiate, replay
        r1 = p1["genome"].get("recipe")
        fam = family(r1)
        if fam is None:
            return None
        mates = [m for m in pop if m["hash"] != p1["hash"] and (m["genome"].get("recipe") or {}).get("family") == r1["family"]]
        if not mates:
            return None
        p2 = ctx.rng.choice(mates)
        r2 = p2["genome"]["recipe"]
        rng = ctx.rng
        params = {k: (r1["params"].get(k) if rng.random() < 0.5 else r2["params"].get(k, r1["params"].get(k)))
                  for k in r1["params"]}
        if not fam.get("check", lambda p: True)(params):
            return None
        keys = {(s["tactic"], str(sorted(s["params"].items()))) for s in r1.get("steps", [])}
        steps = copy.deepcopy(r1.get("steps", [])) + [copy.deepcopy(s) for s in r2.get("steps", [])
                                                      if (s["tactic"], str(sorted(s["params"].items()))) not in keys
                                                      and s["tactic"] not in {x["tactic"] for x in r1.get("steps", [])}]

        def genome():
            ir = instantiate(fam, params)
            ir, kept, dropped = replay(ir, steps)
            return {"ir": ir, "recipe": {**r1, "params": params, "steps": kept}, "dropped": dropped}

        return p1, "crossover", {"with": p2["hash"]}, genome
