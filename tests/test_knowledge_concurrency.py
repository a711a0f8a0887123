"""Several evaluation workers writing one run at once lose no rows and duplicate none (SQLite in WAL
mode, and Postgres). Workers are separate processes (spawn) that start together behind a barrier, open
the store on the same fresh DB (so the schema migration races too), create the same run, and record
overlapping candidates: every hash is written by two workers, so the unique keys and the store's
retry-on-conflict are exercised, not just parallel inserts."""
from __future__ import annotations

import multiprocessing as mp
import traceback
from collections import defaultdict

from sqlmodel import select

from knowledge.models import EvaluationRow, TaskRow
from knowledge.store import Store

WORKERS, STEP, SPAN = 6, 10, 20            # worker i writes hashes [i*STEP, i*STEP+SPAN): each hash by 2 workers
STAGES = ("verify", "compile")
RUN = "conc"


def _hashes(i: int) -> range:
    return range(i * STEP, i * STEP + SPAN)


def _writer(url: str, i: int, barrier) -> None:  # noqa: ANN001
    try:
        barrier.wait(timeout=120)
        st = Store(url=url)
        st.create_run(RUN, "gemm", proposer=f"w{i}")
        for j in _hashes(i):
            cand = {"hash": f"h{j:04d}", "ir": {"j": j, "by": i}, "strategy": f"w{i}", "status": "ok", "stage": "verify"}
            for stage in STAGES:
                st.record_stage(RUN, cand, stage, f"ok-w{i}", metrics={"by": i}, executor=f"w{i}",
                                failures=[{"code": f"W{k}", "message": f"w{i}"} for k in range(2)])
            st.add_failure(RUN, f"propose:{j}", "propose", "E-PROPOSER-REPLY", f"w{i}")
        st.close()
    except BaseException:
        traceback.print_exc()
        raise


def test_concurrent_workers_lose_and_duplicate_nothing(db_url):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_writer, args=(db_url, i, barrier)) for i in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * WORKERS, "a worker failed (its traceback is above)"

    n = (WORKERS - 1) * STEP + SPAN                       # distinct hashes
    st = Store(url=db_url)
    try:
        cands = st.candidates(RUN)
        assert len(cands) == n and len({c.hash for c in cands}) == n
        evs = st.evaluations(RUN)
        assert len(evs) == n * len(STAGES)
        assert len({(e.candidate_id, e.stage) for e in evs}) == len(evs)
        for e in evs:                                     # each evaluation is one writer's, whole
            assert e.status == f"ok-w{e.metrics['by']}" and e.executor == f"w{e.metrics['by']}"
        fails = st.failures(RUN)
        per: dict = defaultdict(list)
        for f in fails:
            per[(f.candidate_id, f.stage)].append(f)
        assert len(per.pop((None, "propose"))) == n      # candidate-less failures, idempotent by key
        assert len(per) == n * len(STAGES)
        for rows in per.values():                         # replaced as a set: never a mix of two writers
            assert sorted(f.code for f in rows) == ["W0", "W1"] and len({f.message for f in rows}) == 1
        assert len({f.key for f in fails}) == len(fails)
        with st.session() as s:
            assert len(list(s.exec(select(TaskRow)))) == 1
            assert len(list(s.exec(select(EvaluationRow)))) == n * len(STAGES)
        assert len(st.runs()) == 1
        assert st.integrity_report() == []                # SQLite: integrity_check + foreign_key_check too
    finally:
        st.close()



def _open_and_write(path: str, barrier, errors) -> None:  # noqa: ANN001
    import sqlite3

    from knowledge.sqlite_wal import enable_wal
    try:
        barrier.wait(timeout=60)
        conn = sqlite3.connect(path, timeout=30)   # what make_engine's connect hook gets
        cur = conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        enable_wal(cur)
        cur.execute("BEGIN IMMEDIATE")             # then a write, as the migration does
        cur.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        conn.commit()
        conn.close()
    except BaseException as e:  # noqa: BLE001
        errors.put(repr(e))


def test_connections_racing_to_switch_a_fresh_sqlite_db_to_wal_all_open(tmp_path):
    """Several processes opening one new SQLite file at once: SQLite answers the switch to WAL with
    SQLITE_BUSY, without waiting, for some of them (CI saw 'database is locked' from the store's
    connect hook). Without enable_wal's retry about a quarter of these rounds fail on this machine,
    so 30 rounds catch a regression almost surely."""
    ctx = mp.get_context("fork")                   # cheap processes: many rounds in about a second
    errors = ctx.Queue()
    for r in range(30):
        barrier = ctx.Barrier(8)
        path = tmp_path / f"race{r}.db"
        procs = [ctx.Process(target=_open_and_write, args=(str(path), barrier, errors)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * 8
        assert errors.empty(), errors.get(timeout=5)
