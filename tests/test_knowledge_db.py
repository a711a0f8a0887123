"""The knowledge DB on both backends (SQLite file, real Postgres server; see conftest's `db_url`):
every table's rows, JSON columns, unique keys and foreign keys; the store's idempotent writes; the
additive migration of an old DB; the integrity report."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import SQLModel, select

from knowledge.migrate import migrate
from knowledge.models import (BaselineRow, CalibrationRow, CandidateRow, ClusterRow, EvaluationRow, FailureRow, NoteRow,
                              ProposalRow, RunRow, TacticStatRow, TaskRow)
from knowledge.store import Store

# Nested, unicode, float, bool and null values: what JSON/JSONB must give back unchanged.
J = {"a": [1, 2.5, None, True], "b": {"ü": "∑", "deep": [[{"x": -3}]]}, "s": "it's \"quoted\""}


@pytest.fixture
def store(db_url):
    st = Store(url=db_url)
    yield st
    st.close()


def _parents(st: Store) -> dict:
    """One task, run, candidate and cluster to hang child rows on."""
    st.create_run("r1", "gemm", proposer="search", config=J)
    cid = st.record_stage("r1", {"hash": "h1", "ir": J}, "verify", "ok")
    with st.session() as s:
        cl = ClusterRow(signature="sig-1", stage="verify", code="E-X", tasks=["gemm"])
        s.add(cl)
        s.commit()
        return {"task": st.get_run("r1").task_id, "run": "r1", "cand": cid, "cluster": cl.id}


# For every table: a valid new row (given the parents), its JSON columns, and its unique keys.
def _rows(p: dict) -> dict:
    return {
        "tasks": (TaskRow(name="softmax", meta=J), ["meta"], [("name",)]),
        "runs": (RunRow(id="r2", task_id=p["task"], config=J, summary=J), ["config", "summary"], [("id",)]),
        "candidates": (CandidateRow(run_id="r1", hash="h2", ir=J, params=J, recipe=J, cost=J),
                       ["ir", "params", "recipe", "cost"], [("run_id", "hash")]),
        "evaluations": (EvaluationRow(candidate_id=p["cand"], stage="compile", status="ok", metrics=J, timings=J,
                                      result=J), ["metrics", "timings", "result"], [("candidate_id", "stage")]),
        "failures": (FailureRow(run_id="r1", candidate_id=p["cand"], key="k1", stage="compile", code="E",
                                signature="sig-1", node_kind="wgmma", features=J, cluster_id=p["cluster"]),
                     ["features"], [("run_id", "key")]),
        "clusters": (ClusterRow(signature="sig-2", tasks=J), ["tasks"], [("signature",)]),
        "proposals": (ProposalRow(id="rule-1", kind="rule", fingerprint="fp1", cluster_id=p["cluster"], files=J,
                                  evidence=J, test_result=J), ["files", "evidence", "test_result"],
                      [("id",), ("fingerprint",)]),
        "tactic_stats": (TacticStatRow(tactic="t", task="gemm", arch="sm_90a", gains=J), ["gains"],
                         [("tactic", "task", "arch")]),
        "calibrations": (CalibrationRow(gpu="h200", version=1, constants=J, evidence=J), ["constants", "evidence"],
                         [("gpu", "version")]),
        "notes": (NoteRow(run_id="r1", key="n1", text="worked", kind="success"), [], [("run_id", "key")]),
        "baselines": (BaselineRow(key="b1", task="gemm", name="torch.matmul", device="H200", shape=J, versions=J,
                                  status="ok", result=J), ["shape", "versions", "result"], [("key",)]),
    }


def test_every_table_round_trips_rows_and_json(store):
    p = _parents(store)
    rows = _rows(p)
    assert set(rows) == set(SQLModel.metadata.tables), "a new table needs a case here"
    with store.session() as s:
        for row, _, _ in rows.values():
            s.add(row)
        s.commit()
        keys = {name: (type(r), r.id) for name, (r, _, _) in rows.items()}
    with store.session() as s:                       # a new session: values come from the DB
        for name, (model, pk) in keys.items():
            got = s.get(model, pk)
            assert got is not None, name
            for col in rows[name][1]:
                assert getattr(got, col) == J, f"{name}.{col}"
            assert all(getattr(got, c) is not None for c in ("created_at", "updated_at", "started_at")
                       if hasattr(got, c)), name
    assert store.integrity_report() == []


def test_every_unique_key_is_enforced(store):
    p = _parents(store)
    rows = _rows(p)
    with store.session() as s:
        for row, _, _ in rows.values():
            s.add(row)
        s.commit()
    n = 0
    for name, (row, _, uniques) in rows.items():
        for cols in uniques:
            # copy every other unique key's value from a fresh value so only `cols` collides
            dup = row.model_dump()
            for other in uniques:
                for c in other:
                    if c not in cols:
                        dup[c] = f"{dup[c]}-other"
            if isinstance(dup.get("id"), int):
                dup.pop("id")                                   # a serial key: let the DB number it
            with store.session() as s:
                s.add(type(row)(**dup))
                with pytest.raises(IntegrityError):
                    s.commit()
            n += 1
    assert n == 12


def test_every_foreign_key_is_enforced(store):
    p = _parents(store)
    rows = _rows(p)
    fks = [(t.name, fk.parent.name) for t in SQLModel.metadata.sorted_tables for fk in t.foreign_keys]
    assert len(fks) == 8
    for table, col in fks:
        row = rows[table][0]
        bad = row.model_dump()
        bad[col] = "no-such" if isinstance(bad[col], str) else 987654
        if not isinstance(bad.get("id"), str):
            bad.pop("id", None)
        with store.session() as s:
            s.add(type(row)(**bad))
            with pytest.raises(IntegrityError):
                s.commit()
    assert store.integrity_report() == []


def test_store_writes_are_idempotent(store, db_url):
    st = store
    st.create_run("r1", "gemm", proposer="search")
    st.create_run("r1", "gemm", proposer="other")               # the first run row stays
    assert st.get_run("r1").proposer == "search" and len(st.runs()) == 1
    cand = {"hash": "abc", "ir": {"x": 1}, "status": "running", "stage": "verify", "strategy": "bandit"}
    a = st.record_stage("r1", cand, "verify", "ok", failures=[{"code": "W", "node": "/", "message": "m"}])
    b = st.record_stage("r1", {**cand, "status": "failed", "stage": "compile"}, "compile", "fail",
                        failures=iter([{"code": "E-BACKEND-COMPILE", "node": "/roles/0", "message": "boom"}]))
    st.record_stage("r1", {**cand, "status": "failed", "stage": "compile"}, "compile", "error",
                    failures=[{"code": "E-BACKEND-COMPILE", "node": "/roles/0", "message": "boom"}])
    st.add_failure("r1", "propose:1:llm:0", "propose", "E-PROPOSER-REPLY", "bad")
    st.add_failure("r1", "propose:1:llm:0", "propose", "E-PROPOSER-REPLY", "bad")
    assert a == b and len(st.candidates("r1")) == 1 and st.candidates("r1")[0].stage == "compile"
    assert [(e.stage, e.status) for e in st.evaluations("r1")] == [("verify", "ok"), ("compile", "fail")]
    assert st.stage_result("r1", "abc", "compile").status == "fail"      # first stored result wins
    assert st.stage_result("r1", "abc", "test") is None and st.stage_result("r1", "zzz", "verify") is None
    assert sorted(f.code for f in st.failures("r1")) == ["E-BACKEND-COMPILE", "E-PROPOSER-REPLY", "W"]
    st.update_run("r1", status="finished", summary=J)
    assert st.get_run("r1").status == "finished" and st.get_run("r1").summary == J
    assert st.upsert_candidate("r1", {"hash": "abc", "measured_s": 1e-4}) == a
    assert st.candidates("r1")[0].measured_s == 1e-4
    with pytest.raises(IntegrityError):
        st.record_stage("no-such-run", {"hash": "x"}, "verify", "ok")      # foreign keys are on
    if db_url.startswith("sqlite"):
        con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        assert con.execute("pragma journal_mode").fetchone()[0] == "wal"
        con.close()
    assert st.integrity_report() == []


# ------------------------------------------------------------------ additive migration
def _old_schema(url: str) -> None:
    """The knowledge DB as the previous schema made it: failures without signature / node_kind /
    features / cluster_id, tactic_stats without improved / gains, and no clusters, proposals, notes or
    calibrations tables."""
    eng = create_engine(url)
    pg = eng.dialect.name == "postgresql"
    pk = "SERIAL PRIMARY KEY" if pg else "INTEGER PRIMARY KEY"
    ts = "TIMESTAMP WITH TIME ZONE" if pg else "DATETIME"
    md = SQLModel.metadata
    with eng.begin() as c:
        md.create_all(c, tables=[md.tables[n] for n in ("tasks", "runs", "candidates", "evaluations")])
        c.exec_driver_sql(f"""CREATE TABLE failures (id {pk}, run_id VARCHAR NOT NULL REFERENCES runs(id),
            candidate_id INTEGER REFERENCES candidates(id), key VARCHAR NOT NULL, stage VARCHAR NOT NULL,
            code VARCHAR NOT NULL, node VARCHAR, message VARCHAR NOT NULL, strategy VARCHAR,
            created_at {ts} NOT NULL, CONSTRAINT uq_failure_run_key UNIQUE (run_id, key))""")
        c.exec_driver_sql(f"""CREATE TABLE tactic_stats (id {pk}, tactic VARCHAR NOT NULL, task VARCHAR NOT NULL,
            arch VARCHAR NOT NULL, applied INTEGER NOT NULL, ok INTEGER NOT NULL, updated_at {ts} NOT NULL,
            CONSTRAINT uq_tactic_stat UNIQUE (tactic, task, arch))""")
        c.exec_driver_sql(f"INSERT INTO tasks (name, description, created_at) VALUES ('gemm', '', {_now(pg)})")
        c.exec_driver_sql(f"INSERT INTO runs (id, task_id, proposer, dry_run, status, started_at, updated_at) "
                          f"VALUES ('old', 1, 'search', {_false(pg)}, 'finished', {_now(pg)}, {_now(pg)})")
        c.exec_driver_sql(f"INSERT INTO candidates (run_id, hash, name, proposer, strategy, iteration, slot, status,"
                          f" stage, created_at, updated_at) VALUES ('old', 'h0', 'k', 'seed', 'seed', 0, 0, 'failed',"
                          f" 'compile', {_now(pg)}, {_now(pg)})")
        c.exec_driver_sql(f"INSERT INTO failures (run_id, candidate_id, key, stage, code, node, message, created_at) "
                          f"VALUES ('old', 1, '1:compile:0', 'compile', 'E-OLD', '/roles/0', 'old boom', {_now(pg)})")
        c.exec_driver_sql(f"INSERT INTO tactic_stats (tactic, task, arch, applied, ok, updated_at) "
                          f"VALUES ('split_k', 'gemm', 'sm_90a', 3, 2, {_now(pg)})")
    eng.dispose()


def _now(pg: bool) -> str:
    return "now()" if pg else "CURRENT_TIMESTAMP"


def _false(pg: bool) -> str:
    return "false" if pg else "0"


def test_old_db_gains_new_tables_and_columns_and_keeps_its_rows(db_url):
    _old_schema(db_url)
    st = Store(url=db_url)
    try:
        insp = inspect(st.engine)
        assert set(SQLModel.metadata.tables) <= set(insp.get_table_names())
        cols = {c["name"]: c for c in insp.get_columns("failures")}
        assert {"signature", "node_kind", "features", "cluster_id"} <= set(cols)
        assert all(cols[c]["nullable"] for c in ("signature", "node_kind", "features", "cluster_id"))
        assert "ix_failures_signature" in {i["name"] for i in insp.get_indexes("failures")}
        assert {"improved", "gains"} <= {c["name"] for c in insp.get_columns("tactic_stats")}
        assert migrate(st.engine) == []                              # the second time there is nothing to do
        old = st.failures("old")
        assert [(f.key, f.code, f.message, f.signature, f.cluster_id) for f in old] == \
            [("1:compile:0", "E-OLD", "old boom", None, None)]
        with st.session() as s:
            stat = s.exec(select(TacticStatRow)).one()
            assert (stat.applied, stat.ok, stat.improved, stat.gains) == (3, 2, 0, None)   # NOT NULL DEFAULT 0
            cl = ClusterRow(signature="sig", code="E-OLD")
            s.add(cl)
            s.flush()
            f = s.get(FailureRow, old[0].id)
            f.signature, f.cluster_id, f.features = "sig", cl.id, J
            s.add(f)
            s.commit()
        assert st.failures("old")[0].features == J
        st.record_stage("old", {"hash": "h1"}, "verify", "fail", failures=[{"code": "E-NEW", "message": "m"}])
        assert len(st.candidates("old")) == 2 and len(st.failures("old")) == 2
        with st.session() as s:                                        # the added FK column is enforced
            f = s.get(FailureRow, old[0].id)
            f.cluster_id = 424242
            s.add(f)
            with pytest.raises(IntegrityError):
                s.commit()
        assert st.integrity_report() == []
    finally:
        st.close()


# ------------------------------------------------------------------ integrity report
def test_integrity_report_finds_orphans_and_duplicates(db_url):
    st = Store(url=db_url)
    try:
        st.create_run("r1", "gemm")
        st.record_stage("r1", {"hash": "h"}, "verify", "fail", failures=[{"code": "E"}])
        with st.session() as s:                  # run-less notes: a NULL in a unique key is no duplicate
            s.add_all([NoteRow(key="k", text="a"), NoteRow(key="k", text="b")])
            s.commit()
        assert st.integrity_report() == []
        pg = st.engine.dialect.name == "postgresql"
        # what a DB written with constraints off (or before they existed) can hold
        if pg:
            with st.engine.begin() as c:
                c.exec_driver_sql("SET LOCAL session_replication_role = replica")   # FK triggers off
                c.exec_driver_sql("INSERT INTO failures (run_id, key, stage, code, message, created_at) "
                                  "VALUES ('gone', 'k', 'propose', 'E', '', now())")
                c.exec_driver_sql("DROP INDEX ix_tasks_name")
                c.exec_driver_sql("INSERT INTO tasks (name, description, created_at) VALUES ('gemm', '', now())")
        else:
            con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
            con.execute("PRAGMA foreign_keys=OFF")
            con.execute("INSERT INTO failures (run_id, key, stage, code, message, created_at) "
                        "VALUES ('gone', 'k', 'propose', 'E', '', CURRENT_TIMESTAMP)")
            con.execute("DROP INDEX ix_tasks_name")
            con.execute("INSERT INTO tasks (name, description, created_at) VALUES ('gemm', '', CURRENT_TIMESTAMP)")
            con.commit()
            con.close()
        rep = st.integrity_report()
        assert any(r.startswith("orphans: 1 failures.run_id") for r in rep), rep
        assert any(r.startswith("duplicates: 1 keys of tasks(name)") for r in rep), rep
        if not pg:
            assert any(r.startswith("foreign_key_check: failures") for r in rep), rep
    finally:
        st.close()
    eng = create_engine(db_url)
    with eng.connect() as c:                                   # the report only reads
        assert c.execute(text("SELECT count(*) FROM failures")).scalar_one() == 2
    eng.dispose()
