"""python -m agent.evolve: between campaigns, cluster the recorded failures and run the promoters.

    python -m agent.evolve [--min-count 3] [--min-candidates 2] [--kinds rule,primitive,calibration,tactic]
                           [--task gemm] [--gpu h200] [--repo PATH] [--force]

Clusters failures (knowledge/clusters.py), runs `knowledge.promote.<kind>.propose(store, cfg)` for each
kind whose module exists, and submits every proposal for review (knowledge/proposals.py: a git branch
per proposal, or knowledge/proposals/<id>/). Proposals are made only between campaigns: while a run
in the DB has status "running" it refuses (exit 1) unless --force (a run killed with -9 stays
"running" until resumed). Review with `python -m agent.review list`.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from knowledge.promote.base import KINDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.evolve", description="Cluster failures and propose plugins.")
    p.add_argument("--min-count", type=int, default=3, help="a cluster recurs when seen this often (default 3)")
    p.add_argument("--min-candidates", type=int, default=2, help="... across this many distinct candidates (default 2)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"promoters to run (default {','.join(KINDS)})")
    p.add_argument("--task", help="only evidence from this task")
    p.add_argument("--gpu", default="h200", help="calibration target (default h200)")
    p.add_argument("--repo", help="where proposals are written (default: the git top level of the current directory)")
    p.add_argument("--db", help="SQLAlchemy URL of the knowledge DB (default: CAKE_DB_URL or CAKE_HOME/cake.db)")
    p.add_argument("--force", action="store_true", help="run even though a run is marked running")
    return p


def promoter(kind: str):
    """The promoter module of a kind, or None when it does not exist (yet)."""
    name = f"knowledge.promote.{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        sys.stderr.write(f"error: unknown kinds {bad}; use {', '.join(KINDS)}\n")
        return 2
    from sqlmodel import select

    from agent.review import repo_root
    from knowledge.clusters import cluster, recurring
    from knowledge.models import RunRow
    from knowledge.promote.base import PromoteConfig
    from knowledge.proposals import submit
    from knowledge.store import Store

    store = Store(url=args.db) if args.db else Store()
    try:
        with store.session() as s:
            running = [r.id for r in s.exec(select(RunRow).where(RunRow.status == "running"))]
        if running and not args.force:
            sys.stderr.write(f"error: runs in progress ({', '.join(running)}); proposals are made only between "
                             f"campaigns (--force if they are dead)\n")
            return 1
        cfg = PromoteConfig(min_count=args.min_count, min_candidates=args.min_candidates, task=args.task, gpu=args.gpu)
        repo = repo_root(args.repo)
        clusters = cluster(store, cfg)
        rec = recurring(store, cfg)
        out.write(f"{len(clusters)} failure clusters, {len(rec)} recurring (>= {cfg.min_count} failures over "
                  f">= {cfg.min_candidates} candidates)\n")
        for c in rec[:20]:
            out.write(f"  #{c.id:<4} {c.count:>4}x {c.candidates:>3} cand  {c.stage:<8} {c.code:<22} "
                      f"{(c.node_kind or '-'):<16} {c.status:<8} {c.template[:70]}\n")
        status = 0
        made = 0
        for kind in kinds:
            mod = promoter(kind)
            if mod is None:
                out.write(f"{kind}: no promoter (knowledge/promote/{kind}.py) yet; skipped\n")
                continue
            try:
                proposals = mod.propose(store, cfg)
            except Exception as e:  # noqa: BLE001 - one broken promoter must not stop the others
                out.write(f"{kind}: promoter failed: {type(e).__name__}: {e}\n")
                status = 1
                continue
            for p in proposals:
                row = submit(store, p, repo)
                if row is None:
                    out.write(f"{kind}: {p.id} was proposed before; skipped\n")
                    continue
                made += 1
                out.write(f"{kind}: proposed {row.id} ({row.branch or row.path}): {row.title}\n")
            for sk in getattr(mod, "SKIPPED", []) or []:
                out.write(f"{kind}: no proposal for cluster #{sk.get('cluster')}: {sk.get('reason')}\n")
        out.write(f"{made} new proposals; review with: python -m agent.review list\n")
        return status
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
