"""Whole campaigns as a user runs them (`python -m agent.run` in a subprocess, in a temporary working
directory with its own CAKE_HOME and library, so nothing is written into the repository):

- the offline dry run of the issue (gemm, 30 candidates): DB rows, HTML report, library entry;
- a library entry per timed shape (kmeans, two bench shapes, worker double);
- the GPU path (test and profile through the worker pool) with a worker test double standing in for
  the GPU (tests/agent_doubles.py: fake timings, clearly not measurements);
- kill -9 in the middle of a node and at a random point, then --resume: no evaluated candidate lost
  or duplicated.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp / "home"), CAKE_LIBRARY_DIR=str(tmp / "lib"), CAKE_CACHE_DIR=str(tmp / "cubin"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _agent(tmp: Path, *args, env=None, timeout=240, check=True):
    p = subprocess.run([sys.executable, "-m", "agent.run", *args], cwd=tmp, env=env or _env(tmp),
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"agent.run {' '.join(args)} exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


def _db(tmp: Path):
    return sqlite3.connect(tmp / "home" / "cake.db")


def test_dry_run_gemm_30_candidates_offline(tmp_path):
    repo_lib = ROOT / "tasks" / "gemm" / "library"
    before = sorted(repo_lib.iterdir()) if repo_lib.exists() else None
    p = _agent(tmp_path, "--task", "gemm", "--dry-run", "--max-candidates", "30", "--run-id", "dry1")
    out = p.stdout
    assert "DRY RUN" in out and "unmeasured" in out and "max candidates reached (30)" in out
    con = _db(tmp_path)
    assert con.execute("select status, stop_reason, dry_run from runs where id='dry1'").fetchone()[:2] == \
        ("finished", "max candidates reached (30)")
    n, distinct = con.execute("select count(*), count(distinct hash) from candidates where run_id='dry1'").fetchone()
    assert n == distinct == 30
    stages = dict(con.execute("select stage, count(*) from evaluations group by stage").fetchall())
    assert stages["verify"] == 30 and 2 <= stages["compile"] <= 30 and "test" not in stages
    # every candidate names its origin; non-seeds name a parent, a tactic and a strategy
    rows = con.execute("select strategy, tactic, parent_hash, ir from candidates where run_id='dry1'").fetchall()
    assert sum(r[0] == "seed" for r in rows) == 2
    assert {r[0] for r in rows} == {"seed", "bandit", "evolve"}
    assert all(r[1] and r[2] and json.loads(r[3])["roles"] for r in rows if r[0] != "seed")
    fails = con.execute("select stage, code, node from failures where run_id='dry1'").fetchall()
    assert fails and all(code and stage in ("verify", "compile") for stage, code, _ in fails)
    # the report: self-contained HTML with inline SVG charts and the best IR
    html = (tmp_path / "home" / "reports" / "dry1.html").read_text()
    assert html.count("<svg") >= 3 and "Dry run" in html and "Best kernel IR" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "<script src" not in html
    assert "/roles/" in html                      # printer output with node paths
    # the library entry: IR + metadata, labelled unmeasured
    lib = tmp_path / "lib" / "gemm" / "library"
    meta = json.loads((lib / "M4096_N4096_K4096.meta.json").read_text())
    assert meta["measured"] is False and meta["run"] == "dry1" and meta["hash"]
    from cake_ir.io import ir_hash, load_file
    k, d = load_file(lib / "M4096_N4096_K4096.json")
    assert k is not None and ir_hash(k) == meta["hash"]
    assert (sorted(repo_lib.iterdir()) if repo_lib.exists() else None) == before   # the repo is untouched
    assert not (ROOT / ".cake" / "reports" / "dry1.html").exists()


def test_gpu_path_with_a_worker_double(tmp_path):
    """test/profile through gpu_backend's WorkerPool (one worker per --gpus entry), baselines via the
    hook, speedups and a measured library entry; the job function is a double (no GPU here)."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval")
    p = _agent(tmp_path, "--task", "softmax", "--gpus", "0", "--max-candidates", "8", "--run-id", "gpu1", env=env)
    assert "baseline torch.softmax: 1.0000 ms on FakeGPU" in p.stdout
    con = _db(tmp_path)
    stages = dict(con.execute("select stage, count(*) from evaluations group by stage").fetchall())
    assert stages["test"] >= 1 and stages["profile"] >= 1
    ex = {r[0] for r in con.execute("select executor from evaluations where stage in ('test','profile')")}
    assert all(e.startswith("gpu:0:") for e in ex)
    assert con.execute("select count(*) from candidates where run_id='gpu1' and measured_s is not null").fetchone()[0] >= 1
    summary = json.loads(con.execute("select summary from runs where id='gpu1'").fetchone()[0])
    assert summary["best"]["measured"] is True and summary["best"]["speedup_vs"] == "torch.softmax"
    assert summary["baseline"]["torch.softmax"]["ms"] == 1.0
    meta = json.loads((tmp_path / "lib" / "softmax" / "library" / "M16384.meta.json").read_text())
    assert meta["measured"] is True and meta["device"] == "FakeGPU" and meta["speedups"]["torch.softmax"] > 0
    assert "library: 1 entry written, 0 kept in " in p.stdout and "\n     M16384  " in p.stdout
    html = (tmp_path / "home" / "reports" / "gpu1.html").read_text()
    assert "Dry run" not in html and "(measured)" in html


def test_gpu_path_exports_the_best_kernel_per_timed_shape(tmp_path):
    """With --timed-shapes class, kmeans times both its bench shapes: the worker double reports a timing
    per shape, and the run writes one library entry per shape (the run's own shape: the run's best,
    with baseline speedups; the other: the fastest candidate there, no baseline speedups), listed in
    the final summary."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval")
    p = _agent(tmp_path, "--task", "kmeans", "--gpus", "0", "--max-candidates", "4", "--plain", "--no-vectors",
               "--timed-shapes", "class", "--run-id", "shapes1", env=env)
    assert "library: 2 entries written, 0 kept in " in p.stdout, p.stdout[-3000:]
    assert "*B32_N16384_K100" in p.stdout and "\n     B8_N65536_K128 " in p.stdout
    lib = tmp_path / "lib" / "kmeans" / "library"
    own = json.loads((lib / "B32_N16384_K100.meta.json").read_text())
    other = json.loads((lib / "B8_N65536_K128.meta.json").read_text())
    con = _db(tmp_path)
    summary = json.loads(con.execute("select summary from runs where id='shapes1'").fetchone()[0])
    assert own["hash"] == summary["best"]["hash"] and own["speedups"]
    assert other["shape"] == {"B": 8, "N": 65536, "K": 128} and other["measured"] is True
    assert other["speedups"] is None and other["run_shape_key"] == "B32_N16384_K100"
    # the other shape's entry is the fastest passing candidate at that shape, by its own median there
    ms = []
    for status, timings, h in con.execute("select e.status, e.timings, c.hash from evaluations e join candidates c "
                                          "on e.candidate_id = c.id where c.run_id = 'shapes1' and e.stage = 'profile'"):
        ms += [(t["ms_median"], h) for t in json.loads(timings) if status == "ok" and t["shape"] == other["shape"]]
    assert other["ms_median"] == min(ms)[0] and other["hash"] in {h for m, h in ms if m == min(ms)[0]}
    html = (tmp_path / "home" / "reports" / "shapes1.html").read_text()
    assert "Library: best kernel per timed shape" in html and "B8_N65536_K128" in html


def _snapshot(tmp: Path, run: str):
    con = _db(tmp)
    ev = con.execute("select e.id, c.hash, e.stage, e.status, e.created_at from evaluations e join candidates c "
                     "on e.candidate_id = c.id where c.run_id = ?", (run,)).fetchall()
    cands = con.execute("select id, hash, iteration, slot from candidates where run_id = ?", (run,)).fetchall()
    con.close()
    return {(h, s): (i, st, t) for i, h, s, st, t in ev}, cands


def test_kill_mid_node_and_resume_loses_nothing(tmp_path):
    run = "kill1"
    args = ["--task", "softmax", "--dry-run", "--max-candidates", "12", "--batch", "2", "--plain"]
    # 1) the process kills itself with SIGKILL right after storing the 5th compile result: the compile
    #    node of the third batch is half done and its checkpoint was never written
    p = _agent(tmp_path, *args, "--run-id", run, env=_env(tmp_path, CAKE_FAULT_AFTER="compile:5"), check=False)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    ev1, c1 = _snapshot(tmp_path, run)
    assert sum(1 for (_, s) in ev1 if s == "compile") == 5
    # 2) resume, and kill it again from outside at whatever point it has reached
    proc = subprocess.Popen([sys.executable, "-m", "agent.run", "--resume", run, "--plain"], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_end = time.monotonic() + 120
    while time.monotonic() < t_end and proc.poll() is None:
        ev, _ = _snapshot(tmp_path, run)
        if sum(1 for (_, s) in ev if s == "compile") >= 8:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    ev2, c2 = _snapshot(tmp_path, run)
    # 3) resume to the end
    p = _agent(tmp_path, "--resume", run, "--plain")
    assert "resuming" in p.stdout and "max candidates reached (12)" in p.stdout, p.stdout[-3000:]
    ev3, c3 = _snapshot(tmp_path, run)
    # nothing stored before a kill was lost or redone: same rows, same ids, same timestamps
    for before in (ev1, ev2):
        for key, val in before.items():
            assert ev3[key] == val, key
    assert {c[1] for c in c1} <= {c[1] for c in c2} <= {c[1] for c in c3}
    for c in c1 + c2:
        assert c in c3                                   # candidate rows kept their ids and slots
    # nothing duplicated: 12 distinct candidates, one verify each, compile only after a passed verify
    assert len(c3) == len({c[1] for c in c3}) == 12
    assert sorted({(c[2], c[3]) for c in c3}) == sorted((c[2], c[3]) for c in c3)
    verify_ok = {h for (h, s), (_, st, _) in ev3.items() if s == "verify" and st == "ok"}
    assert {h for (h, s) in ev3 if s == "verify"} == {c[1] for c in c3}
    assert {h for (h, s) in ev3 if s == "compile"} == verify_ok
    # the graph state agrees with the DB
    from agent import campaign
    os.environ["CAKE_HOME"] = str(tmp_path / "home")
    try:
        st = campaign.checkpoint_values(run)
    finally:
        os.environ.pop("CAKE_HOME")
    assert json.loads(json.dumps(st)) == st                 # the graph state is plain JSON
    assert st["n_proposed"] == st["n_evaluated"] == 12
    assert sorted(st["seen"]) == sorted(c[1] for c in c3)
    assert st["funnel"]["verify"] == len(verify_ok)
    assert st["funnel"]["compile"] == sum(1 for (h, s), (_, stt, _) in ev3.items() if s == "compile" and stt == "ok")
    con = _db(tmp_path)
    assert con.execute("select status from runs where id=?", (run,)).fetchone()[0] == "finished"
