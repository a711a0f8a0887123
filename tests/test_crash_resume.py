"""Crash safety of a campaign: SIGKILL at many random points, --resume each time, and compare with an
uninterrupted run.

The search campaign is deterministic for a given --seed (CRC-seeded RNG per strategy and iteration,
compile results are a function of the IR), so a run that is killed and resumed any number of times
must end with exactly the candidates, stage evaluations, failures and graph summary of a reference run
made in one go. On top of that: nothing stored before a kill is redone (same row id and timestamp),
no (run, hash) or (candidate, stage) appears twice, both SQLite files pass integrity_check and
foreign_key_check, and the killed processes' compile workers do not outlive them.

Kill points (seeded RNG, so a failure reproduces):
- "progress": wait until the DB shows a new evaluation from this process, then a random delay in the
  span where batches are verified / compiled / reflected (a kill at a random wall-clock time would
  mostly land in interpreter start-up);
- "fault": CAKE_FAULT_AFTER=<stage>:<n>, the process kills itself right after storing its n-th
  evaluation of that stage, i.e. inside a node, before the node's checkpoint;
- "early": a random time after launch, which can land in start-up, while the resumed process reads
  its checkpoint, or in the first node.
"""
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = "crash"
N_KILLS = 9
ARGS = ["--task", "softmax", "--dry-run", "--max-candidates", "16", "--batch", "2", "--seed", "3",
        "--compile-workers", "1", "--plain"]


def _env(tmp: Path, home: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update(CAKE_HOME=str(tmp / home), CAKE_LIBRARY_DIR=str(tmp / home / "lib"),
               CAKE_CACHE_DIR=str(tmp / "cubin"),          # shared: the reference run warms NVRTC's cache
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _launch(tmp: Path, home: str, args: list, log, **extra) -> subprocess.Popen:
    # a new session: its id is the pid, so leftover worker processes can be found afterwards
    return subprocess.Popen([sys.executable, "-m", "agent.run", *args], cwd=tmp, env=_env(tmp, home, **extra),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _con(tmp: Path, home: str, name: str = "cake.db") -> sqlite3.Connection:
    return sqlite3.connect(tmp / home / name, timeout=30)


def _n_evals(tmp: Path, home: str) -> int:
    try:
        con = _con(tmp, home)
        try:
            return con.execute("select count(*) from evaluations").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:      # not created yet
        return 0


def _evals(tmp: Path, home: str) -> dict:
    con = _con(tmp, home)
    rows = con.execute("select c.hash, e.stage, e.id, e.status, e.created_at from evaluations e join candidates c "
                       "on e.candidate_id = c.id where c.run_id = ?", (RUN,)).fetchall()
    con.close()
    return {(h, s): (i, st, t) for h, s, i, st, t in rows}


def _session_procs(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _checkpoint(tmp: Path, home: str) -> dict:
    from agent import campaign
    old = os.environ.get("CAKE_HOME")
    os.environ["CAKE_HOME"] = str(tmp / home)
    try:
        return campaign.checkpoint_values(RUN) or {}
    finally:
        if old is None:
            os.environ.pop("CAKE_HOME", None)
        else:
            os.environ["CAKE_HOME"] = old


def _mid_node(tmp: Path, home: str, evals: dict) -> bool:
    """True when the DB holds stage results for the checkpointed batch that the checkpoint does not
    know yet: the kill landed inside a node (after it stored work, before its checkpoint)."""
    st = _checkpoint(tmp, home)
    known = set()
    for c in st.get("batch") or []:
        for s in c.get("passed") or []:
            known.add((c["hash"], s))
        if c.get("status") == "failed":
            known.add((c["hash"], c.get("stage")))
    hashes = {c["hash"] for c in st.get("batch") or []}
    return any(h in hashes and (h, s) not in known for (h, s) in evals)


def _final(tmp: Path, home: str) -> dict:
    con = _con(tmp, home)
    q = lambda sql: con.execute(sql, (RUN,)).fetchall()  # noqa: E731
    out = {
        "run": q("select status, stop_reason, best_hash from runs where id = ?"),
        "candidates": sorted(q("select hash, status, stage, iteration, slot, parent_hash, tactic, strategy "
                               "from candidates where run_id = ?")),
        "evaluations": sorted(q("select c.hash, e.stage, e.status, e.error_class from evaluations e join candidates c "
                                "on e.candidate_id = c.id where c.run_id = ?")),
        "failures": sorted(q("select coalesce(c.hash, ''), f.stage, f.code, coalesce(f.node, ''), f.key like 'propose:%' "
                             "from failures f left join candidates c on f.candidate_id = c.id where f.run_id = ?")),
        "dup_candidates": q("select hash, count(*) from candidates where run_id = ? group by hash having count(*) > 1"),
        "dup_evaluations": q("select e.candidate_id, e.stage, count(*) from evaluations e join candidates c on "
                             "e.candidate_id = c.id where c.run_id = ? group by e.candidate_id, e.stage "
                             "having count(*) > 1"),
    }
    con.close()
    st = _checkpoint(tmp, home)
    out["state"] = {k: st.get(k) for k in ("iteration", "n_proposed", "n_evaluated", "seen", "funnel",
                                            "failures_by_code", "stop", "seed_best_s", "notes")}
    out["state"]["best"] = (st.get("best") or {}).get("hash")
    return out


def _integrity(path: Path) -> None:
    con = sqlite3.connect(path)
    try:
        assert con.execute("pragma integrity_check").fetchall() == [("ok",)], path
        assert con.execute("pragma foreign_key_check").fetchall() == [], path
    finally:
        con.close()


def test_sigkill_at_random_points_and_resume_matches_an_uninterrupted_run(tmp_path):
    t_start = time.monotonic()
    # the reference: the same campaign in one go
    with open(tmp_path / "ref.log", "w") as log:
        ref = _launch(tmp_path, "ref", ARGS + ["--run-id", RUN], log)
        assert ref.wait(240) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    want = _final(tmp_path, "ref")
    assert want["run"][0][0] == "finished" and len(want["candidates"]) == 16

    rng = random.Random(4242)
    # a fixed mix, shuffled: >= 3 "fault" kills land inside a node whatever the machine's speed
    schedule = ["fault"] * 3 + ["progress"] * 3 + ["early"] * 2
    rng.shuffle(schedule)
    schedule = ["progress"] + schedule + ["progress"] * (3 * N_KILLS)
    kills, mid_node, snapshots, sessions, modes = 0, 0, [], [], []
    started, finished, launches = False, False, 0
    log = open(tmp_path / "kill.log", "w")
    while kills < N_KILLS and not finished:
        launches += 1
        assert launches <= 3 * N_KILLS, "the killed campaign makes no progress"
        args = (["--resume", RUN, "--plain"] if started else ARGS + ["--run-id", RUN])
        mode = schedule[launches - 1] if started else "progress"
        extra = {}
        if mode == "fault":
            extra["CAKE_FAULT_AFTER"] = f"{rng.choice(['verify', 'compile'])}:{rng.randint(1, 3)}"
        n0 = _n_evals(tmp_path, "kill")
        log.write(f"\n### launch {launches}: {mode} {extra} {' '.join(args)}\n")
        log.flush()
        proc = _launch(tmp_path, "kill", args, log, **extra)
        sessions.append(proc.pid)
        if mode == "fault":
            rc = proc.wait(240)
            assert rc in (0, -signal.SIGKILL), f"exit {rc}: {(tmp_path / 'kill.log').read_text()[-3000:]}"
        else:
            cap = 10 ** 9
            if mode == "progress":
                t_end = time.monotonic() + 240
                while proc.poll() is None and _n_evals(tmp_path, "kill") <= n0 and time.monotonic() < t_end:
                    time.sleep(0.02)
                delay = rng.uniform(0.0, 0.6)
                # at most two more evaluations: a resumed launch compiles from the reference's warm cache,
                # and where that is fast 0.6 s stored a dozen of them, so the campaign ended in 5 kills
                cap = _n_evals(tmp_path, "kill") + 2
            else:
                delay = rng.uniform(0.3, 4.0)
            t_end = time.monotonic() + delay
            while proc.poll() is None and time.monotonic() < t_end and _n_evals(tmp_path, "kill") < cap:
                time.sleep(0.01)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            rc = proc.wait(60)
            assert rc in (0, -signal.SIGKILL), f"exit {rc}: {(tmp_path / 'kill.log').read_text()[-3000:]}"
        if rc == 0:
            finished = True
            break
        kills += 1
        modes.append(mode)
        if not started:
            con = _con(tmp_path, "kill")
            started = con.execute("select count(*) from runs where id = ?", (RUN,)).fetchone()[0] == 1
            con.close()
        ev = _evals(tmp_path, "kill") if started else {}
        snapshots.append(ev)
        mid_node += _mid_node(tmp_path, "kill", ev) if started else 0
    # resume to the end (no more kills)
    if not finished:
        log.write("\n### final resume\n")
        log.flush()
        proc = _launch(tmp_path, "kill", ["--resume", RUN, "--plain"], log)
        sessions.append(proc.pid)
        assert proc.wait(240) == 0, (tmp_path / "kill.log").read_text()[-3000:]
    log.close()
    text = (tmp_path / "kill.log").read_text()
    assert "max candidates reached (16)" in text, text[-3000:]

    # the kills were many and landed where work happens
    assert kills >= 8, (kills, modes, text[-3000:])
    assert mid_node >= 3, (mid_node, modes)

    got = _final(tmp_path, "kill")
    # nothing duplicated
    assert got["dup_candidates"] == [] and got["dup_evaluations"] == []
    # nothing lost, nothing different: the same outcome as the uninterrupted run
    assert got["run"] == want["run"]
    assert got["candidates"] == want["candidates"]
    assert got["evaluations"] == want["evaluations"]
    assert got["failures"] == want["failures"]
    assert got["state"] == want["state"]
    # every candidate has exactly one evaluation for each stage up to the one it reached
    order = ["verify", "compile", "test", "profile"]
    evs = {(h, s) for h, s, _, _ in got["evaluations"]}
    for h, status, stage, *_ in got["candidates"]:
        reached = order[: order.index(stage) + 1]
        assert {s for (hh, s) in evs if hh == h} == set(reached), (h, stage)
    # nothing stored before a kill was redone or rewritten: same row id, status and timestamp
    final = _evals(tmp_path, "kill")
    for snap in snapshots:
        for key, val in snap.items():
            assert final.get(key) == val, key
    # both SQLite files are intact
    _integrity(tmp_path / "kill" / "cake.db")
    _integrity(tmp_path / "kill" / "checkpoints.sqlite")
    # the killed campaigns' compile workers exit (they see EOF on their pipe) instead of lingering
    t_end = time.monotonic() + 20
    left = [p for s in sessions for p in _session_procs(s)]
    while left and time.monotonic() < t_end:
        time.sleep(0.2)
        left = [p for s in sessions for p in _session_procs(s)]
    assert not left, f"processes of killed campaigns still running: {left}"
    print(f"\n{kills} kills ({', '.join(modes)}), {mid_node} inside a node, {launches + 1} launches, "
          f"{time.monotonic() - t_start:.0f} s")
