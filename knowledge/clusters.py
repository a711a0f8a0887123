"""Failure clustering: sign every failure, group by signature, and find the clusters that recur.

    cluster(store, cfg)    signs unsigned FailureRows (lazily, from the candidate's IR), upserts one
                           ClusterRow per signature (count, distinct candidates by IR hash, runs, tasks)
                           and sets FailureRow.cluster_id; returns the clusters
    recurring(store, cfg)  clusters seen at least cfg.min_count times across cfg.min_candidates
                           distinct candidates (optionally only those seen on cfg.task)

Proposer failures (no candidate, no IR) cluster too: their signature has no node kind or features,
and each counts as its own "candidate" (they are distinct attempts).
Runs between campaigns (agent/evolve.py); it recomputes the aggregates from the failures each time,
so it is idempotent and safe to re-run.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from sqlmodel import select

from .models import CandidateRow, ClusterRow, FailureRow, RunRow, TaskRow, now
from .promote.base import PromoteConfig
from .signature import signature


def sign_failures(store) -> int:
    """Compute signature, node kind and features of failures that have none; returns how many."""
    n = 0
    with store.session() as s:
        rows = list(s.exec(select(FailureRow).where(FailureRow.signature.is_(None))))
        irs: dict[int, dict] = {}
        for f in rows:
            ir = None
            if f.candidate_id is not None:
                if f.candidate_id not in irs:
                    c = s.get(CandidateRow, f.candidate_id)
                    irs[f.candidate_id] = c.ir if c is not None else None
                ir = irs[f.candidate_id]
            sig, kind, _tmpl, feats = signature(f.stage, f.code, f.message, f.node, ir)
            f.signature, f.node_kind, f.features = sig, kind, feats or None
            s.add(f)
            n += 1
        s.commit()
    return n


def cluster(store, cfg: Optional[PromoteConfig] = None) -> list[ClusterRow]:
    sign_failures(store)
    with store.session() as s:
        q = (select(FailureRow, CandidateRow.hash, TaskRow.name)
             .join(CandidateRow, FailureRow.candidate_id == CandidateRow.id, isouter=True)
             .join(RunRow, FailureRow.run_id == RunRow.id)
             .join(TaskRow, RunRow.task_id == TaskRow.id))
        groups: dict[str, list] = defaultdict(list)
        for f, h, task in s.exec(q):
            groups[f.signature].append((f, h, task))
        existing = {c.signature: c for c in s.exec(select(ClusterRow))}
        out = []
        for sig, items in groups.items():
            f0 = items[0][0]
            row = existing.get(sig)
            if row is None:
                from .signature import template
                row = ClusterRow(signature=sig, stage=f0.stage, code=f0.code, node_kind=f0.node_kind,
                                 template=template(f0.message), first_seen=min(f.created_at for f, _, _ in items))
            row.count = len(items)
            row.candidates = len({h or f"{f.run_id}:{f.key}" for f, h, _ in items})
            row.runs = len({f.run_id for f, _, _ in items})
            row.tasks = sorted({t for _, _, t in items})
            row.last_seen = max((f.created_at for f, _, _ in items), default=now())
            s.add(row)
            s.flush()
            for f, _, _ in items:
                if f.cluster_id != row.id:
                    f.cluster_id = row.id
                    s.add(f)
            out.append(row)
        s.commit()
        return sorted(out, key=lambda c: (-c.count, c.id))


def recurring(store, cfg: Optional[PromoteConfig] = None) -> list[ClusterRow]:
    cfg = cfg or PromoteConfig()
    with store.session() as s:
        rows = s.exec(select(ClusterRow).where(ClusterRow.count >= cfg.min_count,
                                               ClusterRow.candidates >= cfg.min_candidates))
        out = [c for c in rows if not cfg.task or cfg.task in (c.tasks or [])]
    return sorted(out, key=lambda c: (-c.count, c.id))


def members(store, cluster_id: int) -> list[tuple[FailureRow, Optional[CandidateRow]]]:
    """The failures of a cluster with their candidates (None for proposer failures), oldest first."""
    with store.session() as s:
        q = (select(FailureRow, CandidateRow)
             .join(CandidateRow, FailureRow.candidate_id == CandidateRow.id, isouter=True)
             .where(FailureRow.cluster_id == cluster_id).order_by(FailureRow.id))
        return list(s.exec(q))
