"""The knowledge store: engine setup (SQLite WAL + foreign keys, or CAKE_DB_URL) and idempotent writes.

Every write is keyed so that re-running a graph node after a crash (the LangGraph checkpoint resumes
the node from its start) neither duplicates nor loses rows: candidates by (run, hash), evaluations by
(candidate, stage), failures by (run, key). `stage_result` lets a re-run node reuse the evaluation a
killed process already stored instead of redoing the work.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional

from sqlalchemy import event
from sqlmodel import Session, SQLModel, create_engine, select

from .models import CandidateRow, EvaluationRow, FailureRow, RunRow, TaskRow, now


def default_url(home: Optional[str] = None) -> str:
    url = os.environ.get("CAKE_DB_URL")
    if url:
        return url
    home = home or os.environ.get("CAKE_HOME") or os.path.join(os.getcwd(), ".cake")
    Path(home).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{os.path.abspath(os.path.join(home, 'cake.db'))}"


def make_engine(url: str):
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    SQLModel.metadata.create_all(engine)
    return engine


class Store:
    def __init__(self, url: Optional[str] = None, home: Optional[str] = None):
        self.url = url or default_url(home)
        self.engine = make_engine(self.url)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # ------------------------------------------------------------------ tasks and runs
    def ensure_task(self, name: str, description: str = "", meta: Any = None) -> int:
        with self.session() as s:
            row = s.exec(select(TaskRow).where(TaskRow.name == name)).first()
            if row is None:
                row = TaskRow(name=name, description=description, meta=meta)
                s.add(row)
            else:
                row.description, row.meta = description or row.description, meta if meta is not None else row.meta
            s.commit()
            return row.id

    def create_run(self, run_id: str, task: str, **fields) -> RunRow:
        task_id = self.ensure_task(task, fields.pop("task_description", ""), fields.pop("task_meta", None))
        with self.session() as s:
            row = s.get(RunRow, run_id)
            if row is None:
                row = RunRow(id=run_id, task_id=task_id, **fields)
                s.add(row)
                s.commit()
            return row

    def get_run(self, run_id: str) -> Optional[RunRow]:
        with self.session() as s:
            return s.get(RunRow, run_id)

    def update_run(self, run_id: str, **fields) -> None:
        with self.session() as s:
            row = s.get(RunRow, run_id)
            if row is None:
                return
            for k, v in fields.items():
                setattr(row, k, v)
            row.updated_at = now()
            s.add(row)
            s.commit()

    def runs(self) -> list[RunRow]:
        with self.session() as s:
            return list(s.exec(select(RunRow).order_by(RunRow.started_at)))

    # ------------------------------------------------------------------ candidates and stages
    @staticmethod
    def _candidate(s: Session, run_id: str, h: str) -> Optional[CandidateRow]:
        return s.exec(select(CandidateRow).where(CandidateRow.run_id == run_id, CandidateRow.hash == h)).first()

    def upsert_candidate(self, run_id: str, cand: dict, s: Optional[Session] = None) -> int:
        own = s is None
        s = s or self.session()
        try:
            row = self._candidate(s, run_id, cand["hash"])
            if row is None:
                row = CandidateRow(run_id=run_id, hash=cand["hash"], name=cand.get("name", ""), ir=cand.get("ir"),
                                   parent_hash=cand.get("parent"), tactic=cand.get("tactic"),
                                   params=cand.get("params"), proposer=cand.get("proposer", ""),
                                   strategy=cand.get("strategy", ""), recipe=cand.get("recipe"),
                                   iteration=int(cand.get("iteration", 0)), slot=int(cand.get("slot", 0)),
                                   predicted_s=cand.get("predicted_s"), cost=cand.get("cost"))
            row.status, row.stage = cand.get("status", row.status), cand.get("stage", row.stage)
            if cand.get("measured_s") is not None:
                row.measured_s = cand["measured_s"]
            row.updated_at = now()
            s.add(row)
            s.flush()
            if own:
                s.commit()
            return row.id
        finally:
            if own:
                s.close()

    def stage_result(self, run_id: str, h: str, stage: str) -> Optional[EvaluationRow]:
        """The stored evaluation of (run, hash, stage), if a previous attempt already made it."""
        with self.session() as s:
            row = self._candidate(s, run_id, h)
            if row is None:
                return None
            return s.exec(select(EvaluationRow).where(EvaluationRow.candidate_id == row.id,
                                                      EvaluationRow.stage == stage)).first()

    def record_stage(self, run_id: str, cand: dict, stage: str, status: str, *, error_class: Optional[str] = None,
                     metrics: Any = None, timings: Any = None, result: Any = None, seconds: float = 0.0,
                     executor: Optional[str] = None, failures: Iterable[dict] = ()) -> int:
        """One transaction: the candidate row (created or updated), its evaluation for `stage` (kept if
        it exists: the first stored result wins) and the stage's failure rows (replaced)."""
        with self.session() as s:
            cid = self.upsert_candidate(run_id, cand, s)
            ev = s.exec(select(EvaluationRow).where(EvaluationRow.candidate_id == cid,
                                                    EvaluationRow.stage == stage)).first()
            if ev is None:
                s.add(EvaluationRow(candidate_id=cid, stage=stage, status=status, error_class=error_class,
                                    metrics=metrics, timings=timings, result=result, seconds=float(seconds or 0.0),
                                    executor=executor))
            prefix = f"{cid}:{stage}:"
            for old in s.exec(select(FailureRow).where(FailureRow.run_id == run_id, FailureRow.candidate_id == cid,
                                                       FailureRow.stage == stage)):
                s.delete(old)
            s.flush()
            for i, f in enumerate(failures):
                s.add(FailureRow(run_id=run_id, candidate_id=cid, key=f"{prefix}{i}", stage=stage,
                                 code=str(f.get("code") or "?"), node=f.get("node"),
                                 message=str(f.get("message") or "")[:4000], strategy=cand.get("strategy")))
            s.commit()
            return cid

    def add_failure(self, run_id: str, key: str, stage: str, code: str, message: str, node: Optional[str] = None,
                    strategy: Optional[str] = None) -> None:
        """A failure without a candidate (e.g. an LLM reply that never became a program); idempotent by key."""
        with self.session() as s:
            row = s.exec(select(FailureRow).where(FailureRow.run_id == run_id, FailureRow.key == key)).first()
            if row is None:
                s.add(FailureRow(run_id=run_id, key=key, stage=stage, code=code, node=node,
                                 message=message[:4000], strategy=strategy))
                s.commit()

    # ------------------------------------------------------------------ reading back
    def candidates(self, run_id: str) -> list[CandidateRow]:
        with self.session() as s:
            return list(s.exec(select(CandidateRow).where(CandidateRow.run_id == run_id).order_by(CandidateRow.id)))

    def evaluations(self, run_id: str) -> list[EvaluationRow]:
        with self.session() as s:
            q = (select(EvaluationRow).join(CandidateRow, EvaluationRow.candidate_id == CandidateRow.id)
                 .where(CandidateRow.run_id == run_id).order_by(EvaluationRow.id))
            return list(s.exec(q))

    def failures(self, run_id: str) -> list[FailureRow]:
        with self.session() as s:
            return list(s.exec(select(FailureRow).where(FailureRow.run_id == run_id).order_by(FailureRow.id)))

    def close(self) -> None:
        self.engine.dispose()
