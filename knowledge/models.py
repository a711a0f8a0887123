"""SQLModel tables of the knowledge DB (SQLite by default, any SQLAlchemy URL by CAKE_DB_URL).

tasks        one row per task name
runs         one row per agent run (a LangGraph thread id): config, status, stop reason, summary
candidates   every proposed program of a run: IR JSON, hash, parent hash, tactic, params, proposer
             strategy, recipe; unique per (run, hash)
evaluations  one row per (candidate, stage): verify / compile / test / profile, with status, metrics,
             timings
failures     what went wrong: stage, code, IR node path, message; candidate-less rows are proposer
             failures (an LLM reply that never became a program), keyed by `key` per run; each gets a
             normalised `signature` and, once clustered, a `cluster_id`
clusters     failures with one signature across runs: how often, over how many distinct candidates
proposals    promotion proposals (rule | primitive | calibration | tactic) and their review outcome;
             `fingerprint` is unique so a rejected proposal cannot come back
tactic_stats per (tactic, task, arch): times applied, successes, improvements and the relative gains
calibrations cost-model constant sets per GPU, versioned; at most one active per GPU
notes        experience notes (what worked / failed), also embedded in the vector store
baselines    library baselines timed on a GPU: one row per (task, shape, baseline, device, versions of the
             libraries and of the task's inputs), so a run reuses a timing instead of repeating it
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Optional

from sqlalchemy import JSON, Column, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel


def _json_col() -> Column:
    return Column(JSON().with_variant(JSONB(), "postgresql"))


def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


class TaskRow(SQLModel, table=True):
    __tablename__ = "tasks"
    id: Optional[int] = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    description: str = ""
    meta: Any = Field(default=None, sa_column=_json_col())
    created_at: _dt.datetime = Field(default_factory=now)


class RunRow(SQLModel, table=True):
    __tablename__ = "runs"
    id: str = Field(primary_key=True)
    task_id: int = Field(foreign_key="tasks.id", index=True)
    proposer: str = ""
    model: Optional[str] = None
    dry_run: bool = False
    config: Any = Field(default=None, sa_column=_json_col())
    status: str = "running"              # running | finished | interrupted | failed
    stop_reason: Optional[str] = None
    best_hash: Optional[str] = None
    summary: Any = Field(default=None, sa_column=_json_col())
    started_at: _dt.datetime = Field(default_factory=now)
    updated_at: _dt.datetime = Field(default_factory=now)
    finished_at: Optional[_dt.datetime] = None


class CandidateRow(SQLModel, table=True):
    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("run_id", "hash", name="uq_candidate_run_hash"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id", index=True)
    hash: str = Field(index=True)
    name: str = ""
    ir: Any = Field(default=None, sa_column=_json_col())
    parent_hash: Optional[str] = None
    tactic: Optional[str] = None
    params: Any = Field(default=None, sa_column=_json_col())
    proposer: str = ""                   # search | llm | seed
    strategy: str = ""                   # bandit | evolve | llm | seed ...
    recipe: Any = Field(default=None, sa_column=_json_col())
    iteration: int = 0
    slot: int = 0
    status: str = "proposed"             # proposed | ok | failed
    stage: str = "propose"               # last stage reached
    predicted_s: Optional[float] = None  # cost model, bench shape
    cost: Any = Field(default=None, sa_column=_json_col())      # cost-model summary (bound, DRAM bytes, ...)
    measured_s: Optional[float] = None   # median, bench shape
    created_at: _dt.datetime = Field(default_factory=now)
    updated_at: _dt.datetime = Field(default_factory=now)


class EvaluationRow(SQLModel, table=True):
    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("candidate_id", "stage", name="uq_evaluation_candidate_stage"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    candidate_id: int = Field(foreign_key="candidates.id", index=True)
    stage: str                           # verify | compile | test | profile
    status: str                          # ok | fail | error | timeout | crash
    error_class: Optional[str] = None
    metrics: Any = Field(default=None, sa_column=_json_col())
    timings: Any = Field(default=None, sa_column=_json_col())
    result: Any = Field(default=None, sa_column=_json_col())   # what the node applied to the candidate
    seconds: float = 0.0
    executor: Optional[str] = None       # local | pool:gpu0 | ray:<actor> ...
    created_at: _dt.datetime = Field(default_factory=now)


class FailureRow(SQLModel, table=True):
    __tablename__ = "failures"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_failure_run_key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id", index=True)
    candidate_id: Optional[int] = Field(default=None, foreign_key="candidates.id", index=True)
    key: str                             # idempotency key: "<candidate id>:<stage>:<n>" or "propose:<it>:<strategy>:<n>"
    stage: str                           # propose | verify | compile | test | profile
    code: str
    node: Optional[str] = None           # IR JSON pointer where known
    message: str = ""
    strategy: Optional[str] = None
    signature: Optional[str] = Field(default=None, index=True)   # knowledge.signature.signature()
    node_kind: Optional[str] = None      # IR statement kind at `node` ("wgmma", "copy", ...)
    features: Any = Field(default=None, sa_column=_json_col())   # IR features of the candidate
    cluster_id: Optional[int] = Field(default=None, foreign_key="clusters.id", index=True)
    created_at: _dt.datetime = Field(default_factory=now)


class ClusterRow(SQLModel, table=True):
    __tablename__ = "clusters"
    id: Optional[int] = Field(default=None, primary_key=True)
    signature: str = Field(index=True, unique=True)
    stage: str = ""
    code: str = ""
    node_kind: Optional[str] = None
    template: str = ""                   # the message with names and numbers abstracted
    count: int = 0                       # failures with this signature
    candidates: int = 0                  # distinct candidates (by IR hash) among them
    runs: int = 0                        # distinct runs
    tasks: Any = Field(default=None, sa_column=_json_col())     # task names seen
    status: str = "open"                 # open | proposed | covered (an accepted proposal handles it)
    first_seen: _dt.datetime = Field(default_factory=now)
    last_seen: _dt.datetime = Field(default_factory=now)


class ProposalRow(SQLModel, table=True):
    __tablename__ = "proposals"
    id: str = Field(primary_key=True)    # "<kind>-<short fingerprint>", e.g. "rule-3fa2c1d0"
    kind: str                            # rule | primitive | calibration | tactic
    title: str = ""
    fingerprint: str = Field(index=True, unique=True)   # what the proposal is about; blocks re-proposal
    status: str = "proposed"             # proposed | accepted | rejected
    reason: Optional[str] = None         # why rejected (or accepted with a comment)
    cluster_id: Optional[int] = Field(default=None, foreign_key="clusters.id")
    branch: Optional[str] = None         # git branch holding the proposal commit, when in a git repo
    path: Optional[str] = None           # knowledge/proposals/<id>/ otherwise
    files: Any = Field(default=None, sa_column=_json_col())     # repo-relative paths the proposal adds
    evidence: Any = Field(default=None, sa_column=_json_col())
    test_result: Any = Field(default=None, sa_column=_json_col())
    created_at: _dt.datetime = Field(default_factory=now)
    decided_at: Optional[_dt.datetime] = None


class TacticStatRow(SQLModel, table=True):
    __tablename__ = "tactic_stats"
    __table_args__ = (UniqueConstraint("tactic", "task", "arch", name="uq_tactic_stat"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    tactic: str = Field(index=True)
    task: str = ""
    arch: str = ""
    applied: int = 0                     # candidates produced by the tactic that reached evaluation
    ok: int = 0                          # ... that passed every stage they reached
    improved: int = 0                    # ... that beat their parent
    gains: Any = Field(default=None, sa_column=_json_col())     # relative gains (parent/child - 1), newest last
    updated_at: _dt.datetime = Field(default_factory=now)


class CalibrationRow(SQLModel, table=True):
    __tablename__ = "calibrations"
    __table_args__ = (UniqueConstraint("gpu", "version", name="uq_calibration_gpu_version"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    gpu: str = Field(index=True)
    version: int = 1
    constants: Any = Field(default=None, sa_column=_json_col())
    source: str = ""                     # microbench | promotion:<proposal id>
    evidence: Any = Field(default=None, sa_column=_json_col())
    active: bool = False
    created_at: _dt.datetime = Field(default_factory=now)


class NoteRow(SQLModel, table=True):
    __tablename__ = "notes"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_note_run_key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: Optional[str] = Field(default=None, foreign_key="runs.id", index=True)
    key: str = ""                        # idempotency key within the run
    task: str = ""
    arch: str = ""
    kind: str = "experience"             # experience | failure | success
    text: str = ""
    created_at: _dt.datetime = Field(default_factory=now)


class BaselineRow(SQLModel, table=True):
    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("key", name="uq_baseline_key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    key: str = Field(index=True)         # hash of (task, shape, name, device, versions); agent/baseline_cache.py
    task: str = ""
    name: str = ""                       # the baseline's name, e.g. "fla chunk_kda (Triton)"
    device: str = ""
    shape: Any = Field(default=None, sa_column=_json_col())
    versions: Any = Field(default=None, sa_column=_json_col())   # library versions and the task's input version
    status: str = ""                     # ok | fail (a measured verdict; unavailable baselines are not kept)
    result: Any = Field(default=None, sa_column=_json_col())     # what the run uses: ms, message, error class
    run_id: Optional[str] = None         # the run that timed it
    created_at: _dt.datetime = Field(default_factory=now)


TABLES = (TaskRow, RunRow, CandidateRow, EvaluationRow, ClusterRow, FailureRow, ProposalRow, TacticStatRow,
          CalibrationRow, NoteRow, BaselineRow)
