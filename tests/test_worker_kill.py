"""An evaluation worker killed (SIGKILL from outside) while a campaign is running.

Design (gpu_backend/worker.py, docs/evaluation.md): the pool notices the dead worker, records the job
it was running as status "crash", error_class "worker_killed_sigkill" (not retried: the same candidate
could kill the next worker too), restarts the worker and serves the next job. The campaign stores
that record like any other stage result and goes on.

- pool level (CPU, worker doubles): a busy worker killed mid-job, and an idle worker killed between
  two runs;
- campaign level (CPU): `python -m agent.run --gpus 0` with the fake GPU job function
  (tests/agent_doubles.py) wrapped by `marked_eval` below, which writes a marker per job (so the test
  knows the worker's pid and which candidate it is running) and holds the chosen job busy until the
  test kills the worker;
- the same on a real GPU (marked gpu, skipped without one): the chosen job keeps evaluating the
  candidate on the device (a live CUDA context, kernels in flight) until it is killed.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ job functions for the workers
def _mark(job: dict) -> tuple[int, bool]:
    """Write this job's marker; True when it is the job the test will kill (CAKE_TEST_KILL_AT-th)."""
    d = Path(os.environ["CAKE_TEST_MARKERS"])
    d.mkdir(parents=True, exist_ok=True)
    n = len(list(d.iterdir())) + 1
    stage = "profile" if job.get("profile", True) else "test"
    (d / f"{n:03d}-{os.getpid()}-{stage}-{job.get('name')}").write_text(json.dumps({"pid": os.getpid()}))
    return n, n == int(os.environ.get("CAKE_TEST_KILL_AT", "0"))


def marked_eval(job, progress=None):
    """agent_doubles.fake_eval with a marker per candidate job; the chosen job never returns."""
    from agent_doubles import fake_eval
    if "baseline" in job or job.get("hello"):
        return fake_eval(job, progress)
    _, target = _mark(job)
    if target:
        if progress:
            progress("test" if not job.get("profile", True) else "profile")
        time.sleep(10**6)
    return fake_eval(job, progress)


def marked_gpu_eval(job, progress=None):
    """The real GPU job function; the chosen job re-evaluates its candidate on the device in a loop
    (marker written after the first evaluation, so the context is live) until the worker is killed."""
    from agent.baselines import dispatch
    if "baseline" in job or job.get("hello"):
        return dispatch(job, progress)
    d = Path(os.environ["CAKE_TEST_MARKERS"])
    n = len(list(d.iterdir())) + 1 if d.exists() else 1
    if n != int(os.environ.get("CAKE_TEST_KILL_AT", "0")):
        _mark(job)
        return dispatch(job, progress)
    rec = dispatch(job, progress)
    _mark(job)
    while True:
        rec = dispatch(job, progress)


# ------------------------------------------------------------------------------ pool level
def test_pool_busy_and_idle_worker_killed_from_outside():
    import worker_doubles
    from gpu_backend.worker import WorkerPool
    with WorkerPool(gpus=[0], job_fn=worker_doubles.dispatch, deadline_s=60) as pool:
        pool.wait_ready(60)
        pid0 = pool.pids()[0]
        it = pool.run_iter([{"kind": "ok", "sleep": 30, "name": "victim"}, {"kind": "ok", "name": "after"}])
        t0 = time.monotonic()
        # the first job is dispatched on the first step of the generator; kill the worker while it runs
        import threading
        threading.Timer(1.0, os.kill, (pid0, signal.SIGKILL)).start()
        recs, first_at = {}, None
        for idx, rec in it:
            recs[idx] = rec
            first_at = first_at or time.monotonic() - t0
        assert first_at < 25                   # noticed at once, not when the 30 s job would have ended
        assert recs[0].status == "crash" and recs[0].error_class == "worker_killed_sigkill", recs[0]
        assert recs[0].candidate == "victim" and recs[0].worker_pid == pid0
        assert recs[1].status == "ok" and recs[1].worker_pid != pid0
        assert pool.stats["restarts"] == 1 and pool.stats["died"] == 1
        # an idle worker killed between two runs: the next run restarts it and serves the job
        pid1 = pool.pids()[0]
        os.kill(pid1, signal.SIGKILL)
        time.sleep(0.5)
        rec = pool.evaluate({"kind": "ok", "name": "later"})
        assert rec.status == "ok" and rec.worker_pid not in (pid0, pid1)
        assert pool.stats["restarts"] == 2


# ------------------------------------------------------------------------------ campaign level
def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp / "home"), CAKE_LIBRARY_DIR=str(tmp / "lib"), CAKE_CACHE_DIR=str(tmp / "cubin"),
               CAKE_TEST_MARKERS=str(tmp / "markers"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _campaign_with_a_worker_kill(tmp: Path, args: list, env: dict, kill_at: int, timeout: float) -> dict:
    markers = tmp / "markers"
    log = open(tmp / "run.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "agent.run", *args], cwd=tmp, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + timeout
        victim = None
        while victim is None and time.monotonic() < t_end and proc.poll() is None:
            hits = sorted(markers.glob(f"{kill_at:03d}-*")) if markers.exists() else []
            if hits:
                victim = hits[0].name
            time.sleep(0.02)
        assert victim is not None, f"the chosen job never started:\n{(tmp / 'run.log').read_text()[-3000:]}"
        _, pid, stage, name = victim.split("-", 3)
        time.sleep(0.3)                       # well inside the job (it never returns by itself)
        os.kill(int(pid), signal.SIGKILL)
        rc = proc.wait(max(10.0, t_end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp / "run.log").read_text()
    assert rc == 0, out[-4000:]
    return {"pid": int(pid), "stage": stage, "name": name, "out": out}


def _check_db(tmp: Path, run: str, k: dict, max_candidates: int) -> None:
    con = sqlite3.connect(tmp / "home" / "cake.db")
    assert con.execute("select status, stop_reason from runs where id=?", (run,)).fetchone() == \
        ("finished", f"max candidates reached ({max_candidates})")
    it, slot = (int(x) for x in k["name"].split("."))
    cid, h = con.execute("select id, hash from candidates where run_id=? and iteration=? and slot=?",
                         (run, it, slot)).fetchone()
    # the killed job is that candidate's result for the stage: a crash, recorded once, not retried
    ev = con.execute("select id, status, error_class, executor from evaluations where candidate_id=? and stage=?",
                     (cid, k["stage"])).fetchall()
    assert len(ev) == 1, ev
    ev_id, status, cls, executor = ev[0]
    assert (status, cls) == ("crash", "worker_killed_sigkill"), ev
    assert executor == f"gpu:0:{k['pid']}"
    assert con.execute("select status, stage from candidates where id=?", (cid,)).fetchone() == ("failed", k["stage"])
    assert con.execute("select count(*) from failures where candidate_id=? and stage=? and code='worker_killed_sigkill'",
                       (cid, k["stage"])).fetchone()[0] == 1
    if k["stage"] == "test":
        assert con.execute("select count(*) from evaluations where candidate_id=? and stage='profile'",
                           (cid,)).fetchone()[0] == 0
    # later candidates were evaluated on the GPU by the restarted worker
    later = con.execute("select e.stage, e.status, e.executor from evaluations e join candidates c on "
                        "e.candidate_id=c.id where c.run_id=? and e.id > ? and e.stage in ('test','profile')",
                        (run, ev_id)).fetchall()
    assert len(later) >= 2 and any(s == "profile" and st == "ok" for s, st, _ in later), later
    pids = {e.rsplit(":", 1)[1] for _, _, e in later}
    assert str(k["pid"]) not in pids and len(pids) == 1, pids
    assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    summary = json.loads(con.execute("select summary from runs where id=?", (run,)).fetchone()[0])
    assert summary["failures_by_code"].get("worker_killed_sigkill") == 1
    con.close()


def test_campaign_survives_its_gpu_worker_killed_mid_job(tmp_path):
    run = "wk1"
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="test_worker_kill:marked_eval", CAKE_TEST_KILL_AT="4")
    k = _campaign_with_a_worker_kill(tmp_path, ["--task", "softmax", "--gpus", "0", "--max-candidates", "8",
                                                "--batch", "2", "--plain", "--run-id", run, "--deadline", "120"],
                                     env, 4, 180)
    assert "worker_killed_sigkill" in k["out"]
    _check_db(tmp_path, run, k, 8)


def _gpu() -> bool:
    from gpu_backend.driver import gpu_available
    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_campaign_survives_its_gpu_worker_killed_mid_job_on_the_gpu(tmp_path):
    run = "wkgpu"
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="test_worker_kill:marked_gpu_eval", CAKE_TEST_KILL_AT="4")
    k = _campaign_with_a_worker_kill(tmp_path, ["--task", "softmax", "--gpus", "0", "--max-candidates", "6",
                                                "--batch", "2", "--plain", "--run-id", run, "--deadline", "300"],
                                     env, 4, 540)
    _check_db(tmp_path, run, k, 6)


# ------------------------------------------------------------------------------ probe and the long-run bench
def test_probe_answers_between_jobs_without_creating_a_cuda_context():
    import worker_doubles
    from gpu_backend.worker import WorkerPool
    with WorkerPool(gpus=[0, None], job_fn=worker_doubles.dispatch, deadline_s=60) as pool:
        pool.run([{"kind": "ok"}, {"kind": "ok"}])
        probes = pool.probe()
        assert [p["pid"] for p in probes] == pool.pids()
        for p in probes:
            assert p["rss_bytes"] > 1 << 20 and p["hwm_bytes"] >= p["rss_bytes"] and p["fds"] > 0
            assert p["cuda_context"] is False and p["device_used_bytes"] is None
        assert pool.run([{"kind": "ok"}])[0].status == "ok"      # still serving after a probe


def test_long_worker_bench_self_test(tmp_path):
    out = tmp_path / "lw.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "long_worker.py"), "--self-test", "--n", "150",
                        "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    a = res["flat"]["analysis"]
    assert res["ok"] and a["flat"] and not res["flat"]["mismatches"]
    assert [s["jobs"] for s in res["flat"]["samples"]] == [0, 50, 100, 150]
    assert len({s["pid"] for s in res["flat"]["samples"]}) == 1          # one worker all along
    assert res["faults"]["ok"] and res["faults"]["restarts"] >= 3
    assert res["kill"]["killed"]["error_class"] == "worker_killed_sigkill" and res["kill"]["ok"]
    assert not res["self_test_leak"]["analysis"]["flat"]                 # a leak is called growing
    assert "verdict: flat" in p.stdout
