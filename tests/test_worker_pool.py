"""The worker pool and its watchdog on the CPU, with test-double jobs (tests/worker_doubles.py)."""
import json
import time

import pytest

import worker_doubles
from gpu_backend.record import EvalRecord
from gpu_backend.worker import WorkerPool


@pytest.fixture
def pool():
    p = WorkerPool(gpus=[0], job_fn=worker_doubles.dispatch, deadline_s=30)
    p.wait_ready(60)
    yield p
    p.close()


def test_hang_is_killed_and_next_job_served(pool):
    t0 = time.monotonic()
    first_pid = pool.pids()[0]
    recs = pool.run([{"kind": "hang", "deadline_s": 1.5, "name": "hangs"}, {"kind": "ok", "name": "fine"}])
    assert recs[0].status == "timeout" and recs[0].error_class == "hang"
    assert recs[0].stage == "test" and recs[0].candidate == "hangs"
    assert "watchdog" in recs[0].message
    assert recs[1].status == "ok" and recs[1].candidate == "fine"
    assert recs[1].worker_pid != first_pid          # served by the restarted worker
    assert time.monotonic() - t0 < 30
    assert pool.stats["timeouts"] == 1 and pool.stats["restarts"] == 1


def test_timeout_during_profile_is_too_slow(pool):
    rec = pool.evaluate({"kind": "slow_profile", "deadline_s": 1.0})
    assert rec.status == "timeout" and rec.error_class == "too_slow" and rec.stage == "profile"


def test_worker_exit_is_a_crash_and_worker_restarts(pool):
    recs = pool.run([{"kind": "exit"}, {"kind": "ok"}, {"kind": "ok"}])
    assert recs[0].status == "crash" and recs[0].error_class == "worker_died"
    assert "code 7" in recs[0].message
    assert [r.status for r in recs[1:]] == ["ok", "ok"]
    assert recs[1].worker_pid == recs[2].worker_pid != recs[0].worker_pid


def test_sticky_cuda_error_classified_and_worker_replaced(pool):
    recs = pool.run([{"kind": "ok"}, {"kind": "sticky"}, {"kind": "ok"}])
    assert recs[1].status == "crash" and recs[1].error_class == "illegal_address"
    assert recs[1].context_lost
    assert recs[2].status == "ok"
    assert recs[2].worker_pid != recs[0].worker_pid
    assert pool.stats["restarts"] == 1


def test_ordinary_exception_keeps_the_worker(pool):
    recs = pool.run([{"kind": "raise"}, {"kind": "ok"}])
    assert recs[0].status == "error" and recs[0].error_class == "internal_error"
    assert "a bug in the job" in recs[0].message
    assert recs[1].status == "ok" and recs[1].worker_pid == recs[0].worker_pid
    assert pool.stats["restarts"] == 0


def test_parallel_fan_out_over_two_gpus():
    with WorkerPool(gpus=[0, 1], job_fn=worker_doubles.dispatch, deadline_s=30) as p:
        p.wait_ready(60)
        t0 = time.monotonic()
        recs = p.run([{"kind": "ok", "sleep": 1.0, "name": f"c{i}"} for i in range(4)])
        wall = time.monotonic() - t0
    assert [r.candidate for r in recs] == ["c0", "c1", "c2", "c3"]   # input order
    assert all(r.status == "ok" for r in recs)
    assert wall < 3.5, wall                                           # ~2 s, not ~4 s
    assert {r.message for r in recs} == {"cvd=0", "cvd=1"}            # CUDA_VISIBLE_DEVICES per worker
    assert {r.gpu for r in recs} == {0, 1}
    assert len({r.worker_pid for r in recs}) == 2


def test_records_are_structured(pool):
    recs = pool.run([{"kind": "ok", "task": "softmax", "seed": 5}, {"kind": "hang", "deadline_s": 1.0,
                                                                    "task": "gemm"}])
    for r in recs:
        assert isinstance(r, EvalRecord)
        again = EvalRecord.model_validate(json.loads(r.model_dump_json()))
        assert again == r
        assert r.job_id and r.gpu == 0 and r.seed is not None and r.wall_s >= 0
    assert recs[0].seed == 5 and recs[0].task == "softmax"
    assert recs[1].task == "gemm" and recs[1].error_class == "hang"


def test_mixed_faults_in_one_run_all_recorded():
    jobs = [{"kind": k, "deadline_s": 1.5} for k in ("ok", "hang", "exit", "sticky", "ok", "ok")]
    with WorkerPool(gpus=[0, 1], job_fn=worker_doubles.dispatch) as p:
        recs = p.run(jobs)
    assert [(r.status, r.error_class) for r in recs] == [
        ("ok", None), ("timeout", "hang"), ("crash", "worker_died"), ("crash", "illegal_address"),
        ("ok", None), ("ok", None)]


def test_visible_devices_follow_the_parents_restriction(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with WorkerPool(gpus=[0, 1], job_fn=worker_doubles.dispatch) as p:
        recs = p.run([{"kind": "ok", "sleep": 0.5} for _ in range(4)])
    assert {r.message for r in recs} == {"cvd=3", "cvd=5"}
    assert __import__("os").environ["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_each_runs_one_copy_on_every_worker():
    """`each` (the agent's start-up check) reaches every worker, even when one would be free first."""
    with WorkerPool(gpus=[0, 1], job_fn=worker_doubles.dispatch, deadline_s=30) as p:
        recs = p.each({"kind": "ok", "name": "hello"})
        assert [r.status for r in recs] == ["ok", "ok"]
        assert sorted(r.message for r in recs) == ["cvd=0", "cvd=1"]
        assert len({r.worker_pid for r in recs}) == 2


def test_stop_skips_jobs_not_started_and_ticks_while_running(pool):
    """Once stop() is true nothing more is dispatched; the rest come back "skipped". on_tick sees the
    busy worker's job."""
    seen, t0 = [], time.monotonic()
    jobs = [{"kind": "ok", "sleep": 1.2, "name": f"j{i}"} for i in range(4)]
    out = dict(pool.run_iter(jobs, on_tick=lambda: seen.extend(pool.activity()),
                             stop=lambda: time.monotonic() - t0 > 0.6))
    assert out[0].status == "ok"
    assert [out[i].status for i in (1, 2, 3)] == ["skipped"] * 3
    assert all(out[i].candidate == f"j{i}" for i in (1, 2, 3))
    assert any(a["job"] == "j0" and a["gpu"] == 0 for a in seen)
    assert time.monotonic() - t0 < 4
