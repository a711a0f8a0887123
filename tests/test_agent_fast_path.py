"""What makes `agent.run` usable on a GPU, checked on the CPU with the worker double
(tests/agent_doubles.py: fake timings, no measurement): the time budget counted from the process start,
progress lines while jobs run, baselines kept in the knowledge store between runs, a new best only after
the confirm stage (the full matrix on fresh inputs), and clear refusals (no GPU driver, bad numbers)."""
import json
import sqlite3
import subprocess
import sys
import time

from test_agent_campaign import _db, _env


def _run(tmp, *args, env=None, timeout=300):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "agent.run", *args], cwd=tmp, env=env or _env(tmp),
                       capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def test_budget_counts_from_the_start_and_is_kept(tmp_path):
    """Every fake job takes 0.4 s: the search would go on for minutes; the command ends within 10 % of
    --budget-minutes (its start-up, worker start, first step and summary included)."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval", CAKE_FAKE_EVAL_SLEEP="0.4")
    budget_s = 24.0
    p, wall = _run(tmp_path, "--task", "softmax", "--gpus", "0", "--budget-minutes", str(budget_s / 60),
                   "--max-candidates", "1000", "--plain", "--no-vectors", "--run-id", "budget1", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"time budget reached ({budget_s / 60:g} min)" in p.stdout
    assert wall <= 1.1 * budget_s, (wall, p.stdout[-2000:])
    summary = json.loads(_db(tmp_path).execute("select summary from runs where id='budget1'").fetchone()[0])
    assert 0.7 * budget_s <= summary["elapsed_s"] <= budget_s
    assert summary["n_evaluated"] >= 4 and set(summary["node_s"]) >= {"propose", "compile", "test", "profile"}


def test_progress_lines_while_jobs_run(tmp_path):
    """Jobs of 1.5 s and a 0.5 s tick: lines name the node and what the GPU worker is doing."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval", CAKE_FAKE_EVAL_SLEEP="1.5",
               CAKE_PROGRESS_TICK_S="0.5")
    p, _ = _run(tmp_path, "--task", "softmax", "--gpus", "0", "--max-candidates", "2", "--plain", "--no-vectors",
                "--run-id", "tick1", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    busy = [ln for ln in p.stdout.splitlines() if "| test: GPU 0 " in ln or "| profile: GPU 0 " in ln]
    assert busy, p.stdout[-3000:]
    assert any("| baselines: GPU 0 torch.softmax " in ln for ln in p.stdout.splitlines()), p.stdout[-3000:]


def test_baselines_are_kept_in_the_knowledge_store(tmp_path):
    """The second run on the same GPU and versions reuses the first run's baseline timing;
    --retime-baselines times it again."""
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval")
    args = ["--task", "softmax", "--gpus", "0", "--max-candidates", "2", "--plain", "--no-vectors"]
    first, _ = _run(tmp_path, *args, "--run-id", "base1", env=env)
    second, _ = _run(tmp_path, *args, "--run-id", "base2", env=env)
    third, _ = _run(tmp_path, *args, "--run-id", "base3", "--retime-baselines", env=env)
    assert "baseline torch.softmax: 1.0000 ms on FakeGPU (timed in" in first.stdout
    assert "baseline torch.softmax: 1.0000 ms on FakeGPU (cached from 20" in second.stdout
    assert "baseline torch.softmax: 1.0000 ms on FakeGPU (timed in" in third.stdout
    con = _db(tmp_path)
    rows = con.execute("select task, name, device, status, run_id, versions from baselines").fetchall()
    assert len(rows) == 1 and rows[0][:5] == ("softmax", "torch.softmax", "FakeGPU", "ok", "base3")
    assert "task" in json.loads(rows[0][5]) and "torch" in json.loads(rows[0][5])
    summary = json.loads(con.execute("select summary from runs where id='base2'").fetchone()[0])
    assert summary["best"]["speedup_vs"] == "torch.softmax" and summary["best"]["speedups"]["torch.softmax"] > 0


def _confirm_rows(con, run):
    return con.execute("select c.hash, e.status from evaluations e join candidates c on e.candidate_id = c.id "
                       "where c.run_id = ? and e.stage = 'confirm'", (run,)).fetchall()


def test_a_new_best_must_pass_the_confirm_stage(tmp_path):
    """Only a candidate that passes the confirm stage (the full matrix on fresh inputs) becomes the
    best. When every confirm fails, nothing is best however fast it was timed, and every timed
    candidate was a would-be best; normally only the few that beat the best so far are re-tested."""
    args = ["--task", "gemm", "--gpus", "0", "--max-candidates", "16", "--plain", "--no-vectors"]
    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval", CAKE_FAKE_CONFIRM_FAIL="all")
    p, _ = _run(tmp_path, *args, "--run-id", "conf0", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    con = _db(tmp_path)
    rows = _confirm_rows(con, "conf0")
    summary = json.loads(con.execute("select summary from runs where id='conf0'").fetchone()[0])
    assert summary["best"] == {} and "best -" in p.stdout and "no entry for" in p.stdout
    assert rows and all(st == "fail" for _, st in rows) and len(rows) == summary["funnel"]["profile"]

    env = _env(tmp_path, CAKE_EVAL_JOB_FN="agent_doubles:fake_eval")
    p, _ = _run(tmp_path, *args, "--run-id", "conf1", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _confirm_rows(con, "conf1")
    summary = json.loads(con.execute("select summary from runs where id='conf1'").fetchone()[0])
    passed = {h for h, st in rows if st == "ok"}
    assert summary["best"]["hash"] in passed and summary["funnel"]["confirm"] == len(passed)
    assert len(rows) < summary["funnel"]["profile"]


def test_no_gpu_driver_exits_nonzero_with_the_cause(tmp_path):
    """Without a usable driver (this machine, CI) the workers' start-up check fails: exit 1, the cause
    said, nothing evaluated."""
    p, _ = _run(tmp_path, "--task", "softmax", "--gpus", "0", "--max-candidates", "2", "--plain",
                "--run-id", "nodrv1")
    assert p.returncode == 1, (p.returncode, p.stdout[-1500:], p.stderr[-1500:])
    assert "the evaluation workers cannot start: GPU 0: no_device: cannot open a CUDA device" in p.stderr
    con = sqlite3.connect(tmp_path / "home" / "cake.db")
    assert con.execute("select status from runs where id='nodrv1'").fetchone()[0] == "failed"
    assert con.execute("select count(*) from evaluations").fetchone()[0] == 0


def test_numbers_that_cannot_be_are_refused(tmp_path):
    for args, needle in ((["--budget-minutes", "-1"], "--budget-minutes: -1 must be greater than 0"),
                         (["--max-candidates", "0"], "--max-candidates: 0 must be greater than 0"),
                         (["--max-candidates", "2.5"], "--max-candidates: '2.5' is not an integer"),
                         (["--llm-timeout", "0"], "--llm-timeout: 0 must be greater than 0")):
        p, _ = _run(tmp_path, "--task", "softmax", "--dry-run", *args)
        assert p.returncode == 2 and needle in p.stderr, (args, p.stderr)
