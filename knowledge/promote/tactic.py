"""Promote tactic sequences that improved candidates on several tasks or shapes into macro tactics.

Evidence: candidates with status "ok" whose lineage (parent chain within the run, down to a root with
no parent, i.e. a seed) consists of 2..MAX_STEPS applications of known, non-repair tactics. The
sequence of tactic names is the macro; the step parameters of each occurrence are its variants.

An occurrence counts as an improvement when the candidate beats both its root and its parent by more
than MIN_GAIN (0.5 %): measured times when all three were measured, else the cost model's predictions.
(Beating the parent too means the last step contributed; a sequence ending in a no-op is not a macro.)
A sequence is promoted when its improving occurrences span >= cfg.min_tasks distinct contexts
(task, shape), and only with the occurrences whose variant re-applies to the root and verifies.

Files: tactics/<name>.py (a tactics.macro.MacroTactic: steps, observed variants, precondition of the
first step), a fixture with the roots (seed names from the task registry, or the root program) and
variants, and a test that the tactic loads through tactics.base.load_tactics, applies to those seeds
and yields programs that verify.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from .base import Proposal, PromoteConfig, fingerprint

MIN_GAIN = 0.005        # 0.5 %: the agent's improvement threshold
MAX_STEPS = 4
MAX_VARIANTS = 16
ROOT = Path(__file__).resolve().parents[2]


def _rows(store, task: Optional[str]) -> list:
    from sqlmodel import select

    from ..models import CandidateRow, RunRow, TaskRow

    with store.session() as s:
        q = (select(CandidateRow, TaskRow.name, RunRow.config).join(RunRow, CandidateRow.run_id == RunRow.id)
             .join(TaskRow, RunRow.task_id == TaskRow.id).order_by(CandidateRow.id))
        if task:
            q = q.where(TaskRow.name == task)
        return list(s.exec(q))


def _measured(row) -> bool:
    return row.measured_s is not None and row.measured_s > 0


def _shape_key(task: str, config) -> str:
    shape = (config or {}).get("shape") if isinstance(config, dict) else None
    if not isinstance(shape, dict):
        try:
            from tasks import registry
            shape = registry.get(task).bench_shape
        except Exception:  # noqa: BLE001
            shape = {}
    return "_".join(f"{k}{v}" for k, v in shape.items())


def _usable_tactics() -> dict:
    from tactics.base import load_tactics
    from tactics.macro import MacroTactic

    return {t.name: t for t in load_tactics() if t.kind != "repair" and not isinstance(t, MacroTactic)}


def occurrences(store, cfg: PromoteConfig) -> dict[tuple, list[dict]]:
    """tactic-name sequence -> improving occurrences {run, task, shape, cand, root, steps, gain_root, ...}."""
    known = _usable_tactics()
    rows = _rows(store, cfg.task)
    by_run: dict[str, dict] = {}
    meta: dict[str, tuple] = {}
    for c, task, config in rows:
        by_run.setdefault(c.run_id, {})[c.hash] = c
        meta[c.run_id] = (task, _shape_key(task, config))
    out: dict[tuple, list[dict]] = {}
    for c, task, _ in rows:
        if c.status != "ok" or not c.parent_hash:
            continue
        run = by_run[c.run_id]
        chain, cur, seen = [c], c, {c.hash}
        while cur.parent_hash and len(chain) <= MAX_STEPS + 1:
            cur = run.get(cur.parent_hash)
            if cur is None or cur.hash in seen:
                break
            chain.append(cur)
            seen.add(cur.hash)
        root = chain[-1]
        if root.parent_hash or not 3 <= len(chain) <= MAX_STEPS + 1:
            continue       # broken lineage, or fewer than two steps
        chain.reverse()    # root first
        steps = [(x.tactic, x.params or {}) for x in chain[1:]]
        if any(t not in known for t, _ in steps):
            continue
        parent = chain[-2]
        measured = _measured(c) and _measured(root) and _measured(parent)
        if measured:
            sc, sr, sp = c.measured_s, root.measured_s, parent.measured_s
        else:
            sc, sr, sp = c.predicted_s, root.predicted_s, parent.predicted_s
        if not (sc and sr and sp) or min(sc, sr, sp) <= 0:
            continue
        g_root, g_parent = sr / sc - 1.0, sp / sc - 1.0
        if g_root <= MIN_GAIN or g_parent <= MIN_GAIN:
            continue
        out.setdefault(tuple(t for t, _ in steps), []).append({
            "run": c.run_id, "task": meta[c.run_id][0], "shape": meta[c.run_id][1], "candidate": c.hash,
            "root": root.hash, "root_ir": root.ir, "root_recipe": root.recipe, "steps": [p for _, p in steps],
            "gain_root": g_root, "gain_parent": g_parent, "basis": "measured" if measured else "predicted"})
    return out


def _seed_names(tasks: set) -> dict[str, tuple[str, str]]:
    """IR hash -> (task, seed name) for the registry seeds of `tasks`."""
    from cake_ir.io import ir_hash, load
    from tasks import registry

    out = {}
    for t in sorted(tasks):
        try:
            genomes = registry.get(t).seed_genomes()
        except Exception:  # noqa: BLE001 - a task gone from the registry has no seeds to match
            continue
        for g in genomes:
            k, _ = load(g["ir"])
            if k is not None:
                out[ir_hash(k)] = (t, g["name"])
    return out


def _reapplies(names: tuple, genome: dict, variant: list) -> bool:
    """The variant applied step by step to the root gives a program that verifies."""
    from cake_ir.io import load
    from cake_ir.verifier import verify
    from tactics.base import get_tactic

    try:
        g = {"ir": genome["ir"], "recipe": genome.get("recipe")}
        for n, p in zip(names, variant):
            g = get_tactic(n).apply(g, dict(p))
        k, _ = load(g["ir"])
        return k is not None and verify(k).ok
    except Exception:  # noqa: BLE001 - a step that no longer applies: this occurrence is not evidence
        return False


def macro_name(names: tuple) -> str:
    return "macro_" + "_".join(names)


def _module_text(name: str, names: tuple, variants: list, description: str, keywords: list, kind: str) -> str:
    return f'''"""Macro tactic {name}: {" -> ".join(names)}.

Promoted by knowledge/promote/tactic.py (evidence in the proposal); the variants are the step
parameters observed on candidates that improved.
"""
from .macro import MacroTactic

TACTICS = [MacroTactic(
    name={name!r},
    description={description!r},
    kind={kind!r},
    keywords={tuple(keywords)!r},
    steps={tuple(names)!r},
    variants={variants!r},
)]
'''


def _test_text(name: str) -> str:
    return f'''"""Generated by knowledge/promote/tactic.py for the macro tactic {name!r}: it loads through
tactics.base.load_tactics, applies to the seeds of the tasks in its evidence and yields programs that
verify."""
import json
from pathlib import Path

from cake_ir.io import load
from cake_ir.verifier import verify
from tactics.base import load_tactics

DATA = json.loads((Path(__file__).parent / "fixtures" / "tactics" / "{name}.json").read_text())


def _tactic():
    found = {{t.name: t for t in load_tactics()}}
    assert {name!r} in found
    return found[{name!r}]


def _root(ctx):
    if ctx.get("seed"):
        from tasks import registry
        return next(g for g in registry.get(ctx["task"]).seed_genomes() if g["name"] == ctx["seed"])
    return ctx["root"]


def test_loads_with_its_steps():
    assert list(_tactic().steps) == DATA["steps"]


def test_applies_to_the_seeds_and_verifies():
    t = _tactic()
    assert len({{c["task"] + "/" + c["shape"] for c in DATA["contexts"]}}) >= DATA["min_tasks"]
    for ctx in DATA["contexts"]:
        g = _root(ctx)
        assert t.applicable(g) is None, (ctx["task"], t.applicable(g))
        params = {{"steps": ctx["variant"]}}
        assert params in t.choices(g)
        out = t.apply(g, params)
        kernel, diags = load(out["ir"])
        assert kernel is not None, [d.message for d in diags]
        res = verify(kernel)
        assert res.ok, [(d.code, d.node, d.message) for d in res.diagnostics if d.severity == "error"]
'''


def _existing_names() -> set:
    from tactics.base import load_tactics

    files = {f.stem for f in (ROOT / "tactics").glob("*.py")}
    return files | {t.name for t in load_tactics()}


def propose(store, cfg: PromoteConfig) -> list[Proposal]:
    occ = occurrences(store, cfg)
    if not occ:
        return []
    known = _usable_tactics()
    seeds = _seed_names({o["task"] for os_ in occ.values() for o in os_})
    taken = _existing_names()
    out = []
    for names, items in sorted(occ.items()):
        contexts = {(o["task"], o["shape"]) for o in items}
        if len(contexts) < cfg.min_tasks:
            continue
        items = sorted(items, key=lambda o: -o["gain_root"])
        # Keep occurrences whose variant still re-applies to their root and verifies.
        checked: dict[tuple, dict] = {}
        for o in items:
            key = (o["task"], o["shape"])
            if key in checked:
                continue
            root = {"ir": o["root_ir"], "recipe": o["root_recipe"]}
            if _reapplies(names, root, o["steps"]):
                checked[key] = o
        if len(checked) < cfg.min_tasks:
            continue
        fp = fingerprint("tactic", list(names))
        name = macro_name(names)
        if name in taken:
            name = f"{name}_{fp[:6]}"
        taken.add(name)
        variants: list = []
        for o in items:
            if o["steps"] not in variants and len(variants) < MAX_VARIANTS:
                variants.append(o["steps"])
        gains = [o["gain_root"] for o in items]
        tasks = sorted({o["task"] for o in items})
        steps_t = [known[n] for n in names]
        kind = "family" if any(t.kind == "family" for t in steps_t) else "ir"
        keywords = sorted({k for t in steps_t for k in t.keywords} | set(names) | {"macro"})
        description = (f"Macro: {' then '.join(names)} in one step. Improved candidates on "
                       f"{len(contexts)} task/shape contexts ({', '.join(tasks)}; median gain "
                       f"{100 * statistics.median(gains):.1f}%). First step: {steps_t[0].description}")
        contexts_fx = []
        for (task, shape), o in sorted(checked.items()):
            seed = seeds.get(o["root"])
            ctx = {"task": task, "shape": shape, "variant": o["steps"], "candidate": o["candidate"],
                   "seed": seed[1] if seed and seed[0] == task else None}
            if ctx["seed"] is None:
                ctx["root"] = {"ir": o["root_ir"], "recipe": o["root_recipe"]}
            contexts_fx.append(ctx)
        fixture = {"name": name, "steps": list(names), "min_tasks": cfg.min_tasks, "contexts": contexts_fx}
        evidence = {
            "name": name, "steps": list(names), "contexts": sorted(f"{t}/{s}" for t, s in contexts),
            "tasks": tasks, "runs": sorted({o["run"] for o in items}), "occurrences": len(items),
            "median_gain": statistics.median(gains), "max_gain": max(gains),
            "variants": variants,
            "examples": [{k: o[k] for k in ("run", "task", "shape", "candidate", "root", "steps", "gain_root",
                                            "gain_parent", "basis")} for o in items[:10]]}
        files = {f"tactics/{name}.py": _module_text(name, names, variants, description, keywords, kind),
                 f"tests/fixtures/tactics/{name}.json": json.dumps(fixture, indent=1, sort_keys=True) + "\n",
                 f"tests/test_tactic_{name}.py": _test_text(name)}
        title = (f"macro tactic {name}: {' -> '.join(names)} improved {len(items)} candidates on "
                 f"{len(contexts)} tasks/shapes")
        out.append(Proposal(kind="tactic", title=title, fingerprint=fp, files=files, evidence=evidence))
    return out
