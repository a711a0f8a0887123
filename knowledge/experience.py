"""What a finished run leaves for later runs: experience notes, tactic statistics, embedded failures.

`end_of_run(store, run_id)` is called once the agent loop stops (agent/graph.py). It
  1. writes experience notes (NoteRow, keyed per run) for notable outcomes: the best improvements a
     tactic made over its parent, and failure codes that recurred in the run;
  2. recomputes the task's tactic statistics (knowledge/tactic_stats.py);
  3. embeds the run's notes into the Chroma "experiences" collection and its failures into
     "failures" (knowledge/vectors.py), in one batch at the end so the loop itself never waits on it.
Every step is keyed (notes by run + key, Chroma ids by run + key), so running it again after a
resume changes nothing.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Optional

MAX_IMPROVEMENT_NOTES = 8
RECURRING = 3            # a failure code seen this often in one run gets a note
MAX_FAILURES_EMBEDDED = 400


def _run_info(store, run_id: str) -> tuple[str, bool]:
    from .models import RunRow, TaskRow
    with store.session() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            return "", False
        task = s.get(TaskRow, run.task_id)
        return (task.name if task else ""), not run.dry_run


def _short(params) -> str:
    p = {k: v for k, v in (params or {}).items() if k != "fix"}
    return "{" + ", ".join(f"{k}={v}" for k, v in p.items())[:80] + "}"


def notes_for_run(store, run_id: str) -> list[dict]:
    """The run's notable outcomes as note dicts {key, task, arch, kind, text}."""
    task, measured = _run_info(store, run_id)
    cands = store.candidates(run_id)
    by_hash = {c.hash: c for c in cands}
    arch_of = {c.id: (c.ir or {}).get("arch", "") if isinstance(c.ir, dict) else "" for c in cands}
    label = "measured" if measured else "predicted by the cost model"
    gains = []
    for c in cands:
        p = by_hash.get(c.parent_hash) if c.parent_hash else None
        if c.status != "ok" or p is None or not c.tactic or c.tactic == "seed":
            continue
        child, parent = (c.measured_s, p.measured_s) if (c.measured_s and p.measured_s) else (c.predicted_s, p.predicted_s)
        if child and parent and child < parent * 0.995:
            gains.append((parent / child - 1.0, c, p))
    gains.sort(key=lambda x: -x[0])
    notes = []
    for g, c, p in gains[:MAX_IMPROVEMENT_NOTES]:
        family = (c.recipe or {}).get("family") if isinstance(c.recipe, dict) else None
        notes.append({"key": f"improved:{c.hash}", "task": task, "arch": arch_of[c.id], "kind": "success",
                      "text": f"{c.tactic} {_short(c.params)} on {family or p.name or 'program'} ({task}, "
                              f"{arch_of[c.id] or '?'}): {100 * g:.1f}% faster than its parent ({label})"})
    fails = store.failures(run_id)
    counts = Counter(f.code for f in fails)
    tactics_by_code: dict = defaultdict(Counter)
    example: dict = {}
    cand_by_id = {c.id: c for c in cands}
    arch_by_code: dict = defaultdict(Counter)
    for f in fails:
        c = cand_by_id.get(f.candidate_id)
        tactics_by_code[f.code][(c.tactic if c else None) or "reply"] += 1
        arch_by_code[f.code][arch_of.get(f.candidate_id, "")] += 1
        example.setdefault(f.code, f)
    for code, n in counts.most_common():
        if n < RECURRING:
            break
        f = example[code]
        via = ", ".join(f"{t} x{k}" for t, k in tactics_by_code[code].most_common(3))
        arch = arch_by_code[code].most_common(1)[0][0]
        where = f" at {f.node}" if f.node else ""
        notes.append({"key": f"failure:{code}", "task": task, "arch": arch, "kind": "failure",
                      "text": f"{code} ({f.stage}) recurred {n} times in a {task} run (via {via}){where}: "
                              f"{(f.message or '').strip()[:240]}"})
    return notes


def write_notes(store, run_id: str, notes: list[dict]) -> None:
    from sqlmodel import select

    from .models import NoteRow
    with store.session() as s:
        have = {r.key: r for r in s.exec(select(NoteRow).where(NoteRow.run_id == run_id))}
        for n in notes:
            row = have.get(n["key"])
            if row is None:
                s.add(NoteRow(run_id=run_id, **n))
            else:
                row.text, row.task, row.arch, row.kind = n["text"], n["task"], n["arch"], n["kind"]
                s.add(row)
        s.commit()


def embed_run(store, run_id: str, vectors=None) -> dict:
    """Upsert the run's notes and failures into Chroma; returns how many were embedded."""
    from sqlmodel import select

    from .models import NoteRow
    from .vectors import default_store
    vs = vectors or default_store()
    task, _ = _run_info(store, run_id)
    with store.session() as s:
        notes = list(s.exec(select(NoteRow).where(NoteRow.run_id == run_id)))
    n_notes = vs.upsert("experiences", [{"id": f"{run_id}:{n.key}", "text": n.text,
                                         "meta": {"run": run_id, "task": n.task, "arch": n.arch, "kind": n.kind}}
                                        for n in notes])
    cands = {c.id: c for c in store.candidates(run_id)}
    items = []
    for f in store.failures(run_id)[-MAX_FAILURES_EMBEDDED:]:
        c = cands.get(f.candidate_id)
        arch = (c.ir or {}).get("arch", "") if c is not None and isinstance(c.ir, dict) else ""
        text = f"{f.stage} {f.code}{(' at ' + f.node) if f.node else ''}: {(f.message or '')[:600]}"
        items.append({"id": f"{run_id}:{f.key}", "text": text,
                      "meta": {"run": run_id, "task": task, "arch": arch, "code": f.code, "stage": f.stage,
                               "tactic": c.tactic if c is not None else "reply", "strategy": f.strategy}})
    n_fail = vs.upsert("failures", items)
    return {"experiences": n_notes, "failures": n_fail}


def end_of_run(store, run_id: str, vectors=None, embed: bool = True) -> dict:
    """Notes, statistics and embeddings of a finished run (idempotent)."""
    from .tactic_stats import update_from_run
    notes = notes_for_run(store, run_id)
    write_notes(store, run_id, notes)
    out = {"notes": len(notes), "tactic_stats": update_from_run(store, run_id)}
    if embed:
        out.update(embed_run(store, run_id, vectors))
    return out


def recent_notes(store, task: Optional[str], limit: int = 20) -> list:
    """NoteRows of earlier runs, newest first (the fallback when Chroma is not available)."""
    from sqlmodel import select

    from .models import NoteRow
    with store.session() as s:
        q = select(NoteRow)
        if task:
            q = q.where(NoteRow.task == task)
        return list(s.exec(q.order_by(NoteRow.id.desc()).limit(limit)))
