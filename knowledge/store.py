"""The knowledge store: engine setup (SQLite WAL + foreign keys, or CAKE_DB_URL) and idempotent writes.

Every write is keyed so that re-running a graph node after a crash (the LangGraph checkpoint resumes
the node from its start) neither duplicates nor loses rows: candidates by (run, hash), evaluations by
(candidate, stage), failures by (run, key). `stage_result` lets a re-run node reuse the evaluation a
killed process already stored instead of redoing the work.

Several processes may write at once (evaluation workers; SQLite in WAL mode, or Postgres). The
select-then-insert above is racy between processes, so every write runs through `_tx`: a transaction
that, on a unique violation (another writer inserted the same key first), a deadlock / serialization
failure or a locked SQLite DB, rolls back and runs again; the re-run finds the other writer's row and
keeps it, which is the same first-wins contract. Opening a store migrates the schema additively
(knowledge/migrate.py).
"""
from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, Iterable, Optional, TypeVar

from sqlalchemy import PrimaryKeyConstraint, UniqueConstraint, event, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlmodel import Session, SQLModel, create_engine, select

from . import home as cake_home
from .migrate import migrate
from .models import BaselineRow, CandidateRow, EvaluationRow, FailureRow, RunRow, TaskRow, now
from .sqlite_wal import enable_wal

T = TypeVar("T")
_ATTEMPTS = 12
# Postgres SQLSTATEs worth retrying: unique violation, serialization failure, deadlock.
_PG_RETRY = {"23505", "40001", "40P01"}


def default_url(home: Optional[str] = None) -> str:
    url = os.environ.get("CAKE_DB_URL")
    if url:
        return url
    d = cake_home(home)
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{os.path.abspath(d / 'cake.db')}"


def make_engine(url: str):
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            enable_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    migrate(engine)
    return engine


def _transient(e: DBAPIError) -> bool:
    """A conflict with a concurrent writer (retry) rather than a real error (FK violation, bad SQL...)."""
    code = getattr(e.orig, "sqlstate", None)
    if code is not None:
        return code in _PG_RETRY
    msg = str(e.orig).lower()
    return ("unique constraint failed" in msg or "database is locked" in msg or "database is busy" in msg)


class Store:
    def __init__(self, url: Optional[str] = None, home: Optional[str] = None):
        self.url = url or default_url(home)
        self.engine = make_engine(self.url)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def _tx(self, fn: Callable[[Session], T]) -> T:
        """Run fn(session) and commit, again on a conflict with a concurrent writer (see the top)."""
        for attempt in range(_ATTEMPTS):
            with self.session() as s:
                try:
                    out = fn(s)
                    s.commit()
                    return out
                except (IntegrityError, OperationalError) as e:
                    s.rollback()
                    if attempt == _ATTEMPTS - 1 or not _transient(e):
                        raise
            time.sleep(random.uniform(0.0, 0.01 * (attempt + 1)))   # jitter: let the other writer finish
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ tasks and runs
    def ensure_task(self, name: str, description: str = "", meta: Any = None) -> int:
        def fn(s: Session) -> int:
            row = s.exec(select(TaskRow).where(TaskRow.name == name)).first()
            if row is None:
                row = TaskRow(name=name, description=description, meta=meta)
            else:
                row.description, row.meta = description or row.description, meta if meta is not None else row.meta
            s.add(row)
            s.flush()
            return row.id
        return self._tx(fn)

    def create_run(self, run_id: str, task: str, **fields) -> RunRow:
        task_id = self.ensure_task(task, fields.pop("task_description", ""), fields.pop("task_meta", None))

        def fn(s: Session) -> RunRow:
            row = s.get(RunRow, run_id)
            if row is None:
                row = RunRow(id=run_id, task_id=task_id, **fields)
                s.add(row)
                s.flush()
            return row
        return self._tx(fn)

    def get_run(self, run_id: str) -> Optional[RunRow]:
        with self.session() as s:
            return s.get(RunRow, run_id)

    def update_run(self, run_id: str, **fields) -> None:
        def fn(s: Session) -> None:
            row = s.get(RunRow, run_id)
            if row is None:
                return
            for k, v in fields.items():
                setattr(row, k, v)
            row.updated_at = now()
            s.add(row)
        self._tx(fn)

    def runs(self) -> list[RunRow]:
        with self.session() as s:
            return list(s.exec(select(RunRow).order_by(RunRow.started_at)))

    # ------------------------------------------------------------------ baseline timings
    def baseline(self, key: str) -> Optional[BaselineRow]:
        with self.session() as s:
            return s.exec(select(BaselineRow).where(BaselineRow.key == key)).first()

    def save_baseline(self, key: str, **fields) -> None:
        """Insert or replace the timing stored under `key`."""
        def fn(s: Session) -> None:
            row = s.exec(select(BaselineRow).where(BaselineRow.key == key)).first() or BaselineRow(key=key)
            for k, v in fields.items():
                setattr(row, k, v)
            row.created_at = now()
            s.add(row)
        self._tx(fn)

    # ------------------------------------------------------------------ candidates and stages
    @staticmethod
    def _candidate(s: Session, run_id: str, h: str) -> Optional[CandidateRow]:
        return s.exec(select(CandidateRow).where(CandidateRow.run_id == run_id, CandidateRow.hash == h)).first()

    def upsert_candidate(self, run_id: str, cand: dict, s: Optional[Session] = None) -> int:
        """Create or update the (run, hash) candidate; inside `s` when given (the caller commits and
        retries), else in a transaction of its own."""
        if s is None:
            return self._tx(lambda s2: self.upsert_candidate(run_id, cand, s2))
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
        return row.id

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
        failures = list(failures)            # a retry must see them again

        def fn(s: Session) -> int:
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
            s.flush()
            return cid
        return self._tx(fn)

    def add_failure(self, run_id: str, key: str, stage: str, code: str, message: str, node: Optional[str] = None,
                    strategy: Optional[str] = None) -> None:
        """A failure without a candidate (e.g. an LLM reply that never became a program); idempotent by key."""
        def fn(s: Session) -> None:
            row = s.exec(select(FailureRow).where(FailureRow.run_id == run_id, FailureRow.key == key)).first()
            if row is None:
                s.add(FailureRow(run_id=run_id, key=key, stage=stage, code=code, node=node,
                                 message=message[:4000], strategy=strategy))
                s.flush()
        self._tx(fn)

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

    # ------------------------------------------------------------------ health
    def integrity_report(self) -> list[str]:
        """Problems found in the DB (empty = healthy): SQLite's own integrity and foreign-key checks, and
        on every backend orphaned foreign keys and duplicates of each unique key the models declare
        (these catch rows written while constraints were off or missing, e.g. in a migrated old DB)."""
        out: list[str] = []
        with self.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                rows = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]
                if rows != ["ok"]:
                    out += [f"integrity_check: {r}" for r in rows]
                for tbl, rowid, parent, _fk in conn.exec_driver_sql("PRAGMA foreign_key_check"):
                    out.append(f"foreign_key_check: {tbl} rowid {rowid} references a missing {parent} row")
            q = conn.dialect.identifier_preparer.quote
            for t in SQLModel.metadata.sorted_tables:
                for fk in t.foreign_keys:
                    c, p = fk.parent, fk.column
                    n = conn.execute(text(
                        f"SELECT count(*) FROM {q(t.name)} c LEFT JOIN {q(p.table.name)} p "
                        f"ON c.{q(c.name)} = p.{q(p.name)} WHERE c.{q(c.name)} IS NOT NULL AND p.{q(p.name)} IS NULL"
                    )).scalar_one()
                    if n:
                        out.append(f"orphans: {n} {t.name}.{c.name} -> missing {p.table.name}.{p.name}")
                for cols in _unique_keys(t):
                    cl = ", ".join(q(c) for c in cols)
                    nn = " AND ".join(f"{q(c)} IS NOT NULL" for c in cols)   # SQL unique keys let NULLs repeat
                    n = conn.execute(text(f"SELECT count(*) FROM (SELECT {cl} FROM {q(t.name)} WHERE {nn} "
                                          f"GROUP BY {cl} HAVING count(*) > 1) d")).scalar_one()
                    if n:
                        out.append(f"duplicates: {n} keys of {t.name}({', '.join(cols)}) occur more than once")
        return out

    def close(self) -> None:
        self.engine.dispose()


def _unique_keys(table) -> list[tuple[str, ...]]:  # noqa: ANN001
    """Column tuples that must be unique in `table`: primary key, unique constraints and indexes."""
    keys = {tuple(c.name for c in con.columns) for con in table.constraints
            if isinstance(con, (UniqueConstraint, PrimaryKeyConstraint))}
    keys |= {tuple(c.name for c in ix.columns) for ix in table.indexes if ix.unique}
    keys |= {(c.name,) for c in table.columns if c.unique}
    return sorted(k for k in keys if k)
