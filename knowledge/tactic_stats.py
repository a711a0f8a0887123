"""Tactic statistics per (tactic, task, arch): how often a tactic was applied, how often the result
worked and beat its parent, and by how much (knowledge.models.TacticStatRow).

`update_from_run` runs at the end of a run. It recomputes the rows of that run's task from every
run of the task (not an increment), so calling it twice, or again after a resumed run finishes,
gives the same rows. Definitions, per candidate made by a tactic (seeds excluded):

  applied   it reached evaluation (has at least one evaluation row)
  ok        its status is ok (passed every stage it reached; a dry run ends at compile)
  improved  ok, and its time beats its parent's by more than IMPROVE_EPS (measured times when both
            are measured, else the cost model's predictions for both)
  gains     parent/child - 1 for every ok candidate whose parent has a time, oldest first
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Optional

IMPROVE_EPS = 0.005
MAX_GAINS = 200          # the newest gains kept per row


def _arch(ir) -> str:
    return str(ir.get("arch") or "") if isinstance(ir, dict) else ""


def _times(row) -> tuple[Optional[float], Optional[float]]:
    return row["measured_s"], row["predicted_s"]


def compute(store, task: str) -> dict[tuple[str, str], dict]:
    """{(tactic, arch): {"applied", "ok", "improved", "gains"}} over every run of `task`."""
    from sqlmodel import select

    from .models import CandidateRow, EvaluationRow, RunRow, TaskRow
    with store.session() as s:
        task_row = s.exec(select(TaskRow).where(TaskRow.name == task)).first()
        if task_row is None:
            return {}
        run_ids = list(s.exec(select(RunRow.id).where(RunRow.task_id == task_row.id)))
        if not run_ids:
            return {}
        q = select(CandidateRow.id, CandidateRow.run_id, CandidateRow.hash, CandidateRow.parent_hash,
                   CandidateRow.tactic, CandidateRow.status, CandidateRow.predicted_s, CandidateRow.measured_s,
                   CandidateRow.ir).where(CandidateRow.run_id.in_(run_ids)).order_by(CandidateRow.id)
        rows = []
        for cid, run_id, h, parent, tactic, status, pred, meas, ir in s.exec(q):
            # the IR is read only for its arch and dropped at once (it can be tens of KB per candidate)
            rows.append({"id": cid, "run_id": run_id, "hash": h, "parent": parent, "tactic": tactic,
                         "status": status, "predicted_s": pred, "measured_s": meas, "arch": _arch(ir)})
        evaluated = set(s.exec(select(EvaluationRow.candidate_id).join(
            CandidateRow, EvaluationRow.candidate_id == CandidateRow.id).where(CandidateRow.run_id.in_(run_ids))))
    by_hash = {(r["run_id"], r["hash"]): r for r in rows}
    out: dict = defaultdict(lambda: {"applied": 0, "ok": 0, "improved": 0, "gains": []})
    for r in rows:
        if not r["tactic"] or r["tactic"] == "seed" or r["id"] not in evaluated:
            continue
        st = out[(r["tactic"], r["arch"])]
        st["applied"] += 1
        if r["status"] != "ok":
            continue
        st["ok"] += 1
        p = by_hash.get((r["run_id"], r["parent"])) if r["parent"] else None
        if p is None:
            continue
        cm, cp = _times(r)
        pm, pp = _times(p)
        child, parent = (cm, pm) if (cm and pm) else (cp, pp)
        if not child or not parent:
            continue
        st["gains"].append(round(parent / child - 1.0, 6))
        if child < parent * (1.0 - IMPROVE_EPS):
            st["improved"] += 1
    return dict(out)


def update_from_run(store, run_id: str) -> int:
    """Recompute the tactic_stats rows of `run_id`'s task; returns the number of rows written."""
    from sqlmodel import select

    from .models import RunRow, TacticStatRow, TaskRow, now
    with store.session() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            return 0
        task_row = s.get(TaskRow, run.task_id)
        task = task_row.name if task_row else ""
    fresh = compute(store, task)
    with store.session() as s:
        old = {(r.tactic, r.arch): r for r in s.exec(select(TacticStatRow).where(TacticStatRow.task == task))}
        for (tactic, arch), v in fresh.items():
            row = old.pop((tactic, arch), None) or TacticStatRow(tactic=tactic, task=task, arch=arch)
            row.applied, row.ok, row.improved = v["applied"], v["ok"], v["improved"]
            row.gains, row.updated_at = v["gains"][-MAX_GAINS:], now()
            s.add(row)
        for row in old.values():      # a tactic no run of this task uses any more (e.g. runs deleted)
            s.delete(row)
        s.commit()
    return len(fresh)


def summarize(applied: int, ok: int, improved: int, gains: list) -> dict:
    return {"applied": applied, "ok": ok, "improved": improved,
            "success_rate": ok / applied if applied else None,
            "improve_rate": improved / applied if applied else None,
            "median_gain": statistics.median(gains) if gains else None, "n_gains": len(gains)}


def stats(store, task: Optional[str] = None, arch: Optional[str] = None) -> dict[str, dict]:
    """{tactic: summary} over the rows matching task / arch (None: all, summed)."""
    from sqlmodel import select

    from .models import TacticStatRow
    with store.session() as s:
        q = select(TacticStatRow)
        if task:
            q = q.where(TacticStatRow.task == task)
        if arch:
            q = q.where(TacticStatRow.arch == arch)
        rows = list(s.exec(q))
    acc: dict = defaultdict(lambda: [0, 0, 0, []])
    for r in rows:
        a = acc[r.tactic]
        a[0] += r.applied
        a[1] += r.ok
        a[2] += r.improved
        a[3] += list(r.gains or [])
    return {t: summarize(*v) for t, v in sorted(acc.items())}


def by_arch(store, task: str) -> dict[str, dict[str, dict]]:
    """{arch: {tactic: summary}} for one task (the search proposer's prior)."""
    from sqlmodel import select

    from .models import TacticStatRow
    with store.session() as s:
        rows = list(s.exec(select(TacticStatRow).where(TacticStatRow.task == task)))
    out: dict = defaultdict(dict)
    for r in rows:
        out[r.arch][r.tactic] = summarize(r.applied, r.ok, r.improved, list(r.gains or []))
    return dict(out)
