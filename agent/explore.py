"""The explore strategy (opt-in: `--proposer search,explore`): aggressive parameter mutation.

The search strategies stay inside each seed family's declared parameter space and its `check` (the
combinations the generator's author validated) and rank by the cost model. Explore deliberately does
not: it re-instantiates a population member's family with 1-3 parameters drawn from a widened space
(the declared values plus their halves and doubles: tile sizes, warps, stages, consumers, vector
widths) without the family check, then applies one random IR tactic (stages, swizzle, register
split, vector width, unroll, min_blocks ...) half of the time, and takes the draws in random order
instead of the cost model's. The verifier still judges every result. Its purpose is to find what the
verifier does not know yet: programs that fail in NVRTC/ptxas or on the GPU, which failure
clustering and rule promotion (agent/evolve.py) then turn into verifier rules.
Deterministic for a given run seed and iteration (the context's CRC-seeded RNG).
"""
from __future__ import annotations

from .candidates import ProposeContext
from .search import collect

IR_TACTIC_P = 0.5
MAX_MUTATED = 3


def widened(values: list) -> list:
    """The declared values plus halves and doubles of the integer ones."""
    out = set(values)
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            out.update(x for x in (v // 2, v * 2) if x >= 1)
    return sorted(out, key=lambda x: (str(type(x)), x))


class ExploreStrategy:
    proposer = "search"

    def __init__(self, name: str = "explore"):
        self.name = name

    def propose(self, st: dict, n: int, ctx: ProposeContext) -> tuple[list[dict], list[dict]]:
        pool = collect(self, st, ctx, n, 30 * n + 30, lambda wide: self._draw(st, ctx), active=bool(st["pop"]))
        return pool, []

    def _draw(self, st: dict, ctx: ProposeContext):
        from tactics import load_tactics
        from tactics.family import family, instantiate, replay
        rng = ctx.rng
        parent = rng.choice(st["pop"])
        g = parent["genome"]
        recipe = g.get("recipe")
        fam = family(recipe)
        params: dict = {}
        ir, new_recipe = g["ir"], recipe
        if fam is not None:
            cur = {**fam["defaults"], **(recipe.get("params") or {})}
            names = sorted(fam["space"])
            for name in rng.sample(names, min(len(names), rng.randint(1, MAX_MUTATED))):
                params[name] = rng.choice([v for v in widened(fam["space"][name]) if v != cur.get(name)]
                                          or fam["space"][name])
            full = {**cur, **params}
            ir = instantiate(fam, full)   # no fam["check"]: exploring past the generator's validated space
            ir, kept, _ = replay(ir, recipe.get("steps", []))
            new_recipe = {**recipe, "params": full, "steps": kept}
        tname = "explore"
        if fam is None or rng.random() < IR_TACTIC_P:
            usable = [t for t in load_tactics() if t.kind == "ir" and t.applicable({"ir": ir, "recipe": new_recipe}) is None]
            if usable:
                t = rng.choice(sorted(usable, key=lambda t: t.name))
                choice = rng.choice(t.choices({"ir": ir, "recipe": new_recipe}))
                genome = t.apply({"ir": ir, "recipe": new_recipe}, choice)
                params = {**params, t.name: choice}
                ir, new_recipe = genome["ir"], genome.get("recipe", new_recipe)
        if not params:
            return None
        return parent, tname, params, {"ir": ir, "recipe": new_recipe}
