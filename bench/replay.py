"""Measured replay of the learning loop: does promoting failure clusters into verifier rules move
failures from compile / GPU to verify?

    python bench/replay.py --dry-run --n 40                     # offline: compile failures via NVRTC
    python bench/replay.py --n 60 --gpus 0                      # on a GPU machine: test/profile failures too
    python bench/replay.py --dry-run --ablate E-RES-05          # knock a rule out first, watch it be re-learned

Steps (all in a temporary copy of this checkout, never in the checkout itself):
 1. copy the working tree (tracked + untracked, not ignored) to /tmp/cake-replay-*/repo and commit it
    there as a fresh git repository (optionally without the --ablate rules);
 2. campaign 1: `python -m agent.run` of --n candidates from an empty CAKE_HOME A;
 3. `python -m agent.evolve --kinds rule`, then `python -m agent.review test` and `accept` for each rule
    proposal (git merge in the copy);
 4. campaign 2: the same command, same seed and size, from an empty CAKE_HOME B, with the accepted rules;
 5. per campaign: failing candidates by the stage that caught them, the share caught at verify, and the
    compile seconds and GPU seconds (test + profile evaluation seconds) spent on failing candidates.
Writes bench/results/replay-<gpu>.json (replay-dry-cpu.json for --dry-run) with the command and versions.
Deterministic for a given --seed (the search is CRC-seeded per run seed and iteration).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
LATE = ("compile", "test", "profile", "confirm")
IDENT = {"GIT_AUTHOR_NAME": "cake-replay", "GIT_AUTHOR_EMAIL": "replay@localhost",
         "GIT_COMMITTER_NAME": "cake-replay", "GIT_COMMITTER_EMAIL": "replay@localhost"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="softmax")
    p.add_argument("--n", type=int, default=40, help="candidates per campaign (default 40)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proposer", default="search,explore", help="strategies (default search,explore)")
    p.add_argument("--dry-run", action="store_true", help="no GPU: verify + compile + cost model")
    p.add_argument("--gpus", help="GPU ids for the campaigns (default: every local GPU)")
    p.add_argument("--min-count", type=int, default=2)
    p.add_argument("--min-candidates", type=int, default=2)
    p.add_argument("--ablate", default="", help="rule codes to remove from the copy first, e.g. E-RES-05")
    p.add_argument("--campaign-timeout", type=float, default=3600.0)
    p.add_argument("--campaign-args", default="", help="more agent.run arguments for both campaigns, e.g. "
                                                        "'--no-baselines --deadline 60'")
    p.add_argument("--out", help="result JSON (default bench/results/replay-<gpu|dry-cpu>.json)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return p


def sh(cmd: list, cwd: Path, env: dict, timeout: float, log: Path) -> tuple[int, str]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    text = r.stdout + r.stderr
    log.write_text(f"$ {' '.join(map(str, cmd))}\n{text}\n[exit {r.returncode}, {time.monotonic() - t0:.1f} s]\n")
    return r.returncode, text


def copy_checkout(dst: Path, ablate: list[str]) -> list[str]:
    """The working tree (tracked and untracked, minus ignored) as a fresh one-commit git repo."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True)
    if r.returncode == 0:
        rels = list(filter(None, r.stdout.decode().split("\0")))
    else:  # a copy of the tree without .git (the GPU machine gets one): everything but local state and caches
        skip = {".git", ".cake", ".whl", ".ci-venv", "__pycache__", ".pytest_cache", ".hypothesis"}
        rels = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    for rel in rels:
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    removed = []
    for code in ablate:
        mod = dst / "rules" / (code.lower().replace("-", "_") + ".py")
        if mod.exists():
            # the module stays importable (other rules use its helpers) but stops being a rule: no `check`
            mod.write_text(mod.read_text() + "\n\n# ablated by bench/replay.py: not a rule in this copy\ndel check\n")
            shutil.rmtree(dst / "rules" / "fixtures" / code, ignore_errors=True)
            removed.append(code)
    env = {**os.environ, **IDENT}
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "replay base"]):
        subprocess.run(["git", "-C", str(dst), *cmd], check=True, env=env, capture_output=True)
    return removed


def metrics(home: Path, run_id: str) -> dict:
    db = sqlite3.connect(home / "cake.db")
    try:
        n = db.execute("select count(*) from candidates where run_id=?", (run_id,)).fetchone()[0]
        by_stage = dict(db.execute("select stage, count(*) from candidates where run_id=? and status='failed' "
                                   "group by stage", (run_id,)).fetchall())
        secs = {}
        for status in ("failed", "ok"):
            rows = db.execute("select e.stage, sum(e.seconds) from evaluations e join candidates c on c.id=e.candidate_id "
                              "where c.run_id=? and c.status=? group by e.stage", (run_id, status)).fetchall()
            secs[status] = {s: round(v or 0.0, 3) for s, v in rows}
        codes = db.execute("select c.stage, f.code, count(distinct c.id) from candidates c join failures f on "
                           "f.candidate_id=c.id and f.stage=c.stage where c.run_id=? and c.status='failed' "
                           "group by c.stage, f.code order by 3 desc", (run_id,)).fetchall()
        learned = db.execute("select count(distinct c.id) from candidates c join failures f on f.candidate_id=c.id "
                             "where c.run_id=? and f.code like 'E-LRN-%'", (run_id,)).fetchone()[0]
    finally:
        db.close()
    failed = sum(by_stage.values())
    f = secs["failed"]
    return {"run": run_id, "candidates": n, "failed": failed, "failed_by_stage": by_stage,
            "caught_at_verify": by_stage.get("verify", 0), "escaped_verify": sum(by_stage.get(s, 0) for s in LATE),
            "share_caught_at_verify": round(by_stage.get("verify", 0) / failed, 4) if failed else None,
            "caught_by_learned_rules": learned,
            "failing_compile_s": f.get("compile", 0.0),
            "failing_gpu_s": round(sum(f.get(s, 0.0) for s in ("test", "profile", "confirm")), 3),
            "failing_verify_s": f.get("verify", 0.0), "passing_seconds": secs["ok"],
            "failure_codes": [{"stage": s, "code": c, "candidates": k} for s, c, k in codes]}


def proposals(home: Path) -> list[dict]:
    db = sqlite3.connect(home / "cake.db")
    try:
        return [dict(zip(("id", "kind", "status", "title"), r))
                for r in db.execute("select id, kind, status, title from proposals order by created_at")]
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def gpu_name() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        name = r.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return ""
    return name


def versions(repo: Path) -> dict:
    v = {"python": platform.python_version(), "platform": platform.platform()}
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    v["cake_commit"] = r.stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
    v["cake_dirty"] = bool(dirty.stdout.strip())
    r = subprocess.run([PY, "-c", "from cake_ir.nvrtc import nvrtc_version; print(nvrtc_version())"],
                       cwd=repo, capture_output=True, text=True)
    v["nvrtc"] = r.stdout.strip() or None
    v["gpu"] = gpu_name() or None
    return v


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cake-replay-"))
    repo, logs = work / "repo", work / "logs"
    repo.mkdir()
    logs.mkdir()
    try:
        removed = copy_checkout(repo, [c.strip() for c in args.ablate.split(",") if c.strip()])
        base = {k: v for k, v in os.environ.items() if k != "CAKE_DB_URL"}
        # the copy first; keep other entries (site dirs such as the GPU machine's wheel target) but not this tree
        keep = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if e and Path(e).resolve() != ROOT.resolve()]
        base.update(PYTHONPATH=os.pathsep.join([str(repo), *keep]), CAKE_LIBRARY_DIR=str(work / "library"), PYTHONDONTWRITEBYTECODE="1")

        def env_for(home: Path) -> dict:
            return {**base, "CAKE_HOME": str(home), "CAKE_CACHE_DIR": str(home / "cubin")}

        run_cmd = [PY, "-m", "agent.run", "--task", args.task, "--max-candidates", str(args.n), "--seed",
                   str(args.seed), "--proposer", args.proposer, "--plain", "--quiet", "--no-vectors"]
        run_cmd += ["--dry-run"] if args.dry_run else (["--gpus", args.gpus] if args.gpus else [])
        run_cmd += args.campaign_args.split()
        result: dict = {"command": " ".join([Path(PY).name, "bench/replay.py", *(argv if argv is not None else sys.argv[1:])]),
                        "campaign_command": " ".join(map(str, run_cmd[1:])) + " --run-id replay-<1|2>",
                        "config": {k: v for k, v in vars(args).items() if k not in ("keep", "out")},
                        "ablated": removed, "versions": versions(repo), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        home_a, home_b = work / "home-a", work / "home-b"
        steps = {}

        def campaign(n: int, home) -> dict:
            t0 = time.monotonic()
            log = logs / f"campaign{n}.log"
            rc, _ = sh(run_cmd + ["--run-id", f"replay-{n}"], repo, env_for(home), args.campaign_timeout, log)
            steps[f"campaign{n}_s"] = round(time.monotonic() - t0, 1)
            if rc != 0:
                raise SystemExit(f"campaign {n} failed (exit {rc}); see {log}")
            return metrics(home, f"replay-{n}")

        result["campaign1"] = campaign(1, home_a)

        rc, text = sh([PY, "-m", "agent.evolve", "--kinds", "rule", "--min-count", str(args.min_count),
                       "--min-candidates", str(args.min_candidates), "--repo", str(repo)], repo, env_for(home_a),
                      600, logs / "evolve.log")
        result["evolve"] = {"exit": rc, "output": text[-3000:]}
        accepted = []
        for p in proposals(home_a):
            if p["kind"] != "rule" or p["status"] != "proposed":
                continue
            rt, out = sh([PY, "-m", "agent.review", "--repo", str(repo), "test", p["id"]], repo, env_for(home_a), 900,
                         logs / f"test-{p['id']}.log")
            p["tests_passed"] = rt == 0
            if rt == 0:
                ra, _ = sh([PY, "-m", "agent.review", "--repo", str(repo), "accept", p["id"]], repo, env_for(home_a),
                           120, logs / f"accept-{p['id']}.log")
                p["accepted"] = ra == 0
                if ra == 0:
                    accepted.append(p["id"])
            else:
                p["test_output"] = out[-1500:]
        result["proposals"] = proposals(home_a)
        result["accepted"] = accepted
        result["learned_rules"] = sorted(p.name for p in (repo / "rules").glob("e_lrn_*.py"))

        result["campaign2"] = campaign(2, home_b)
        result["wall_s"] = steps
        c1, c2 = result["campaign1"], result["campaign2"]
        result["summary"] = {k: [c1[k], c2[k]] for k in ("candidates", "failed", "caught_at_verify", "escaped_verify",
                                                         "share_caught_at_verify", "failing_compile_s", "failing_gpu_s")}
        tag = "dry-cpu" if args.dry_run else (result["versions"]["gpu"] or "gpu").lower().replace("nvidia ", "").split()[0]
        out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"replay-{tag}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"accepted rules: {accepted or 'none'}")
        print(f"{'':<28}{'campaign 1':>12}{'campaign 2':>12}")
        for k, (a, b) in result["summary"].items():
            print(f"{k:<28}{a!s:>12}{b!s:>12}")
        print(f"written {out}")
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
