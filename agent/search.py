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
import json
import math
from typing import Optional

from .candidates import ProposeContext, estimate_pool, load_genome, make_candidate, prerank

OVERSAMPLE = 4
DRAWS_PER_SLOT = 100      # draws a step may make per slot (a repeated draw costs a dict lookup)
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
    """Up to `want` new candidates from at most `limit` calls of `draw(wide)` -> (parent, tactic,
    params, genome) or None; `wide` turns true for the second half of the draws (parents from the
    archive too: the population's neighbours may all be seen). A draw that raises (a tactic or
    generator refusing its parameters) or yields a hash seen before is skipped; the hash is checked
    before the cost model runs, and a draw the strategy has made before (same parent, tactic and
    parameters: `strategy.made`) is not built again. Sets st["exhausted"] (consecutive steps without
    a candidate)."""
    pool, hashes = [], set()
    made = getattr(strategy, "made", None)
    if made is None:
        made = strategy.made = {}
    for i in range(limit if active else 0):
        if len(pool) >= want:
            break
        try:
            got = draw(i >= limit // 2)
        except Exception:  # noqa: BLE001 - a broken tactic must not stop the search
            continue
        if got is None:
            continue
        parent, tname, params, genome = got
        key = _draw_key(parent, tname, params)
        if key is not None and made.get(key) in ctx.seen | hashes:
            continue
        try:
            genome = genome() if callable(genome) else genome
        except Exception:  # noqa: BLE001
            continue
        loaded = load_genome(genome)
        if loaded[0] is None:
            continue
        if key is not None:
            made[key] = loaded[1]
        if loaded[1] in ctx.seen or loaded[1] in hashes:
            continue
        cand, _ = make_candidate(genome, ctx, strategy=strategy.name, proposer=strategy.proposer, tactic=tname,
                                 params=params, parent=parent, loaded=loaded, estimate=False)
        hashes.add(cand["hash"])
        pool.append(cand)
    st["exhausted"] = 0 if pool else st.get("exhausted", 0) + 1
    estimate_pool(pool, ctx)
    return pool


def _draw_key(parent, tname: str, params) -> Optional[tuple]:
    """What determines a draw's program: its parent's hash, the tactic and the parameters (None for
    crossover and explore, whose programs also depend on what they mix or mutate)."""
    if tname in ("crossover", "explore") or not parent or not parent.get("hash"):
        return None
    return parent["hash"], tname, json.dumps(params, sort_keys=True, default=str)


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
        pool = collect(self, st, ctx, n * OVERSAMPLE, DRAWS_PER_SLOT * (n + 1),
                       lambda wide: self._pick(st, tactics, ctx, wide), active=bool(st["pop"] or st["repair"]))
        return prerank(pool, n, ctx.rng), []

    def _pick(self, st: dict, tactics: dict, ctx: ProposeContext, wide: bool = False):
        """(parent, tactic, params, genome builder) or None; `collect` builds the genome when needed.
        `wide`: parents from the archive as well as the population."""
        rng = ctx.rng
        if st["repair"] and rng.random() < REPAIR_P:
            parent = rng.choice(st["repair"])
            t = tactics.get("verifier_fix")
            if t is not None and t.applicable(parent["genome"]) is None:
                params = rng.choice(t.choices(parent["genome"]))
                return parent, t.name, params, lambda: t.apply(parent["genome"], params)
        if not st["pop"]:
            return None
        pop = st["pop"] + (st.get("archive") or []) if wide else st["pop"]
        if self.mode == "evolve":
            parent = self._tournament(pop, rng)
            if rng.random() < CROSSOVER_P:
                x = self._crossover(pop, parent, ctx)
                if x is not None:
                    return x
        else:
            parent = pop[0] if rng.random() < 0.6 else rng.choice(pop)
        parent = self.full_member(parent)
        if parent is None:
            return None
        g = parent["genome"]
        usable = self._usable(parent, tactics)
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

    def full_member(self, m: dict) -> Optional[dict]:
        """`m` with its IR (an archived member's is rebuilt from its recipe and checked against its hash;
        None when it does not rebuild to the same program)."""
        if m["genome"].get("ir") is not None:
            return m
        cache = self.__dict__.setdefault("rebuilt", {})
        if m["hash"] not in cache:
            from tactics.family import family, instantiate, replay
            recipe = m["genome"]["recipe"]
            try:
                ir, _, _ = replay(instantiate(family(recipe), recipe["params"]), recipe.get("steps", []))
                kernel, h = load_genome({"ir": ir})
            except Exception:  # noqa: BLE001 - a family that no longer builds it
                kernel, h = None, None
            cache[m["hash"]] = {**m, "genome": {"ir": ir, "recipe": recipe}} if kernel is not None and h == m["hash"] else None
        return cache[m["hash"]]

    def _usable(self, parent: dict, tactics: dict) -> list:
        """The non-repair tactics applicable to a population member (they depend on its program only,
        so they are worked out once per member and process)."""
        cache = self.__dict__.setdefault("usable_by_hash", {})
        key = parent.get("hash")
        if key is None:
            return [t for t in tactics.values() if t.kind != "repair" and t.applicable(parent["genome"]) is None]
        if key not in cache:
            cache[key] = [t.name for t in tactics.values() if t.kind != "repair" and t.applicable(parent["genome"]) is None]
        return [tactics[n] for n in cache[key] if n in tactics]

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
