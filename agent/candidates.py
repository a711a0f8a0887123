"""Candidates as plain JSON (graph state), and the cost-model pre-ranking every proposer shares."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ProposeContext:
    rng: random.Random
    seen: set
    notes: list
    iteration: int
    entry: Any                    # tasks.registry.TaskEntry
    spec: Any                     # cake_ir.arch.ArchSpec used by the cost model
    shape: dict                   # the bench shape the cost model and the profile stage use
    dry_run: bool
    cfg: Any = None               # agent.config.RunConfig
    extra: dict = field(default_factory=dict)


def cost_summary(kernel, ctx: ProposeContext) -> dict:
    return cost_of(kernel, ctx.shape, ctx.spec)


def cost_of(kernel, shape: dict, spec) -> dict:
    """The cost model's summary of `kernel` at `shape` (a ranking guide for the proposers)."""
    from cake_ir.cost import estimate
    try:
        rep = estimate(kernel, shape, spec)
    except Exception as e:  # noqa: BLE001 - estimate never should, but ranking must not crash
        return {"seconds": None, "error": f"{type(e).__name__}: {e}"[:200]}
    return {"seconds": rep.seconds, "bound": rep.bound, "binding_path": rep.binding_path,
            "dram_bytes": rep.dram_bytes, "efficiency": rep.efficiency, "roofline_s": rep.roofline_s,
            "flops": rep.totals.get("flops"), "blocks_per_sm": rep.blocks_per_sm, "waves": rep.waves,
            "smem_bytes": rep.smem_bytes,
            # a ranking hint only (the verifier judges): does the shared memory fit a block at all?
            "fits": rep.smem_bytes <= getattr(spec, "smem_per_block_max", rep.smem_bytes)}


def load_genome(genome: dict):
    """(kernel, IR hash), or (None, schema diagnostics as dicts) when the IR does not load."""
    from cake_ir.io import ir_hash, load
    kernel, diags = load(genome["ir"])
    if kernel is None:
        return None, [d.model_dump(exclude_none=True) for d in diags]
    return kernel, ir_hash(kernel)


def make_candidate(genome: dict, ctx: ProposeContext, *, strategy: str, proposer: str, tactic: Optional[str],
                   params: Optional[dict] = None, parent: Optional[dict] = None,
                   loaded: Optional[tuple] = None, estimate: bool = True) -> tuple[Optional[dict], Optional[list]]:
    """(candidate, None) or (None, schema diagnostics) when the IR does not load. `loaded`: the
    genome's `load_genome` result when the caller already has it (the search checks the hash first).
    `estimate=False` leaves the cost model to `estimate_pool` (many candidates at once)."""
    from cake_ir.io import to_dict
    kernel, h = loaded if loaded is not None else load_genome(genome)
    if kernel is None:
        return None, h
    cost = cost_summary(kernel, ctx) if estimate else {}
    cand = {
        "hash": h, "name": kernel.name, "ir": to_dict(kernel), "recipe": genome.get("recipe"),
        "parent": parent["hash"] if parent else None, "parent_name": parent.get("name") if parent else None,
        "parent_score": parent.get("score") if parent else None,
        "tactic": tactic, "params": params or {}, "strategy": strategy, "proposer": proposer,
        "iteration": ctx.iteration, "slot": 0, "predicted_s": cost.get("seconds"), "cost": cost,
        "status": "alive", "stage": "propose", "fail": None, "diagnostics": [], "score_s": None, "measured": False,
    }
    if genome.get("dropped"):
        cand["dropped_steps"] = genome["dropped"]
    return cand, None


def estimate_pool(pool: list[dict], ctx: ProposeContext) -> None:
    """Fill in each candidate's cost summary and predicted time: through `ctx.extra["estimator"]` (the
    run's CPU worker pool, in parallel) when there is one, else here one by one."""
    todo = [c for c in pool if not c.get("cost")]
    if not todo:
        return
    est = ctx.extra.get("estimator")
    if est is not None:
        costs = est(todo)
    else:
        from cake_ir.io import load
        costs = [cost_summary(load(c["ir"])[0], ctx) for c in todo]
    for c, cost in zip(todo, costs):
        c["cost"], c["predicted_s"] = cost, cost.get("seconds")


def prerank(pool: list[dict], n: int, rng: random.Random, explore: float = 0.25) -> list[dict]:
    """The n best by predicted time (programs whose shared memory cannot fit a block last), with about
    `explore` of the slots given to random others (the cost model is a guide, not the judge)."""
    if len(pool) <= n:
        return sorted(pool, key=_pred)
    ranked = sorted(pool, key=_pred)
    k_explore = int(n * explore) if n >= 2 else (1 if rng.random() < explore else 0)
    picked = ranked[: n - k_explore]
    rest = ranked[n - k_explore:]
    picked += rng.sample(rest, k_explore)
    return picked


def _pred(c: dict) -> tuple:
    p = c.get("predicted_s")
    fits = (c.get("cost") or {}).get("fits", True)
    return (0 if fits else 1, p if p is not None else float("inf"))


# ---------------------------------------------------------------------------- a candidate through the stages
def mark_failed(c: dict, stage: str, code: str, node: Optional[str], message: str) -> None:
    c["status"], c["stage"] = "failed", stage
    c["fail"] = {"stage": stage, "code": code, "node": node, "message": (message or "")[:2000]}


def db_fields(c: dict) -> dict:
    """The candidate fields the DB keeps (the IR once, at verify)."""
    keys = ("hash", "name", "ir", "parent", "tactic", "params", "proposer", "strategy", "recipe", "iteration",
            "slot", "predicted_s", "cost", "status", "stage")
    d = {k: c.get(k) for k in keys}
    if c.get("measured"):
        d["measured_s"] = c.get("score_s")
    if d["status"] == "alive":
        d["status"] = "running"
    return d


def stored_result(rt, c: dict, stage: str) -> Optional[dict]:
    """The result a stage already stored for this candidate in this run (a node re-run after a crash
    reuses it instead of evaluating again), or None."""
    row = rt.store.stage_result(rt.cfg.run_id, c["hash"], stage)
    return row.result if row is not None and row.result is not None else None
