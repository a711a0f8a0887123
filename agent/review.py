"""python -m agent.review: review promotion proposals like pull requests.

    python -m agent.review list [--status proposed]
    python -m agent.review show ID              # the diff against HEAD and the evidence
    python -m agent.review test ID [--timeout 300]
    python -m agent.review accept ID [--force]  # merge the branch (or copy the files); the rule is live next run
    python -m agent.review reject ID --reason "why"

Proposals are written by agent/evolve.py (knowledge/proposals.py): a branch cake/proposal/<id> in a
git repository, else knowledge/proposals/<id>/. Proposed code is never imported here: `test`
materialises the proposal in a temporary directory (git archive of the branch, or a copy of the repo
with the files laid over it) and runs its tests with `python -m pytest` in a subprocess with a time
limit. Exit status: 0 ok, 1 failed (tests, merge, state), 2 bad usage or unknown id.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Optional

DEFAULT_TIMEOUT = 300.0
COPY_IGNORE = shutil.ignore_patterns(".git", ".cake", "__pycache__", "*.pyc", ".pytest_cache", "venv", ".venv",
                                     "*.egg-info", ".ci-venv", "proposals")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.review", description="Review promotion proposals.")
    p.add_argument("--repo", help="the project checkout (default: the git top level of the current directory)")
    p.add_argument("--db", help="SQLAlchemy URL of the knowledge DB (default: CAKE_DB_URL or CAKE_HOME/cake.db)")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="list proposals")
    ls.add_argument("--status", help="only proposals with this status (proposed | accepted | rejected)")
    for name, hlp in (("show", "print the diff and the evidence"), ("test", "run the proposal's tests"),
                      ("accept", "merge and activate"), ("reject", "reject, with a reason")):
        sp = sub.add_parser(name, help=hlp)
        sp.add_argument("id")
        if name == "test":
            sp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds (default 300)")
        if name == "accept":
            sp.add_argument("--force", action="store_true", help="accept even though its tests failed or never ran")
            sp.add_argument("--comment", help="a note kept with the decision")
        if name == "reject":
            sp.add_argument("--reason", required=True)
    return p


def repo_root(arg: Optional[str]) -> Path:
    from knowledge.proposals import git_root
    base = Path(arg or os.getcwd()).resolve()
    return base if arg else (git_root(base) or base)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


# ------------------------------------------------------------------ commands
def cmd_list(store, repo: Path, args, out) -> int:
    from sqlmodel import select

    from knowledge.models import ClusterRow, ProposalRow
    with store.session() as s:
        q = select(ProposalRow).order_by(ProposalRow.created_at)
        if args.status:
            q = q.where(ProposalRow.status == args.status)
        rows = list(s.exec(q))
        sizes = {c.id: c.count for c in s.exec(select(ClusterRow))}
    if not rows:
        out.write("no proposals\n")
        return 0
    out.write(f"{'id':<22} {'kind':<12} {'status':<9} {'cluster':>7} {'tests':<6} title\n")
    for r in rows:
        size = sizes.get(r.cluster_id, "-") if r.cluster_id else "-"
        t = "-" if not r.test_result else ("pass" if r.test_result.get("ok") else "FAIL")
        out.write(f"{r.id:<22} {r.kind:<12} {r.status:<9} {size!s:>7} {t:<6} {r.title}\n")
    return 0


def cmd_show(store, repo: Path, row, args, out) -> int:
    out.write(f"proposal {row.id} ({row.kind}) - {row.status}\n{row.title}\n")
    out.write(f"where: {('branch ' + row.branch) if row.branch else row.path}\n")
    if row.reason:
        out.write(f"reason: {row.reason}\n")
    if row.test_result:
        tr = row.test_result
        out.write(f"tests: {'pass' if tr.get('ok') else 'FAIL'} ({tr.get('seconds', 0):.1f} s: {tr.get('command')})\n")
    out.write("\n")
    out.write(diff(row, repo))
    out.write("\n== evidence\n" + json.dumps(row.evidence or {}, indent=1, sort_keys=True, default=str) + "\n")
    return 0


def diff(row, repo: Path) -> str:
    from knowledge.proposals import git, git_root, proposal_files
    top = git_root(repo)
    if row.branch and top is not None and git(top, "rev-parse", "--verify", "-q", row.branch, check=False):
        return git(top, "diff", f"HEAD...{row.branch}", check=False) + "\n"
    files = proposal_files(row, repo)
    chunks = []
    for path, text in sorted(files.items()):
        cur = repo / path
        old = cur.read_text().splitlines(True) if cur.exists() else []
        chunks += difflib.unified_diff(old, text.splitlines(True), f"a/{path}" if old else "/dev/null", f"b/{path}")
    return "".join(chunks) or "(no changes against the working tree)\n"


def materialise(row, repo: Path, dest: Path) -> None:
    """The repo as it would be after accepting the proposal, in `dest` (the proposal stays data here)."""
    from knowledge.proposals import git_root, proposal_files
    top = git_root(repo)
    if row.branch and top is not None:
        data = subprocess.run(["git", "-C", str(top), "archive", "--format=tar", row.branch],
                              capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            try:
                tf.extractall(dest, filter="data")
            except TypeError:   # Python without extraction filters
                tf.extractall(dest)  # noqa: S202 - our own git archive
        return
    shutil.copytree(repo, dest, ignore=COPY_IGNORE, dirs_exist_ok=True)
    for path, text in proposal_files(row, repo).items():
        p = dest / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_files(row, root: Path) -> list[str]:
    files = [f for f in row.files or [] if f.startswith("tests/") and Path(f).name.startswith("test_")
             and f.endswith(".py")]
    if any(f.startswith("rules/") for f in row.files or []) and (root / "tests/test_rules.py").exists():
        files.append("tests/test_rules.py")   # a new rule must also pass the repo's rule tests
    return files


def test_pythonpath(root: Path, repo: Path) -> str:
    """The proposal's copy first, then the caller's other PYTHONPATH entries (a --target site of wheels,
    as on the GPU machine) without the checkout under review, whose modules the copy replaces."""
    keep = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if e and Path(e).resolve() != Path(repo).resolve()]
    return os.pathsep.join([str(root), *keep])


def run_tests(row, repo: Path, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"cake-review-{row.id}-") as td:
        root = Path(td) / "repo"
        root.mkdir()
        materialise(row, repo, root)
        files = test_files(row, root)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
        if not files:
            return {"ok": True, "returncode": 0, "seconds": 0.0, "command": "(the proposal has no tests)",
                    "output": "", "timed_out": False, "tested_at": _now().isoformat()}
        env = {**os.environ, "PYTHONPATH": test_pythonpath(root, repo), "PYTHONDONTWRITEBYTECODE": "1",
               "CAKE_HOME": str(Path(td) / "home")}
        env.pop("CAKE_DB_URL", None)   # the proposal's tests never see the real knowledge DB
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the whole group: pytest and whatever it started
            text, _ = proc.communicate()
            timed_out = True
        output = text.decode(errors="replace")
        rc = proc.returncode
        return {"ok": rc == 0 and not timed_out, "returncode": rc, "seconds": round(time.monotonic() - t0, 2),
                "command": "python -m pytest -q " + " ".join(files), "output": output[-4000:],
                "timed_out": timed_out, "tested_at": _now().isoformat()}


def cmd_test(store, repo: Path, row, args, out) -> int:
    from knowledge.models import ProposalRow
    result = run_tests(row, repo, args.timeout)
    with store.session() as s:
        r = s.get(ProposalRow, row.id)
        r.test_result = result
        s.add(r)
        s.commit()
    out.write(result["output"][-2000:])
    why = "timed out" if result["timed_out"] else f"exit {result['returncode']}"
    out.write(f"\n{row.id}: tests {'passed' if result['ok'] else 'FAILED (' + why + ')'} in {result['seconds']} s\n")
    return 0 if result["ok"] else 1


def cmd_accept(store, repo: Path, row, args, out) -> int:
    from knowledge.models import ClusterRow, ProposalRow
    from knowledge.proposals import git, git_root, proposal_files
    if row.status != "proposed":
        out.write(f"{row.id} is {row.status}; only proposed proposals can be accepted\n")
        return 1
    if not row.test_result and not args.force:
        out.write(f"{row.id}: its tests have not run; run `python -m agent.review test {row.id}` first "
                  f"(or accept with --force)\n")
        return 1
    if row.test_result and not row.test_result.get("ok") and not args.force:
        out.write(f"{row.id}: its tests failed; fix them or accept with --force\n")
        return 1
    top = git_root(repo)
    if row.branch:
        if top is None:
            out.write(f"{row.id} is a git branch but {repo} is not a git repository\n")
            return 1
        rel = repo.relative_to(top).as_posix() if repo != top else ""
        paths = [(rel + "/" + f) if rel else f for f in row.files or []]
        dirty = git(top, "status", "--porcelain", "--", *paths, check=False)
        if dirty:
            out.write(f"the working tree has changes to the proposal's paths; commit or remove them first:\n{dirty}\n")
            return 1
        from knowledge.proposals import _commit_env
        r = subprocess.run(["git", "-C", str(top), "merge", "--no-edit", "-m", f"accept cake proposal {row.id}",
                            row.branch], capture_output=True, text=True, env={**os.environ, **_commit_env(top)})
        if r.returncode != 0:
            subprocess.run(["git", "-C", str(top), "merge", "--abort"], capture_output=True)
            out.write(f"merge of {row.branch} failed:\n{r.stdout}{r.stderr}\n")
            return 1
        git(top, "branch", "-d", row.branch, check=False)   # merged: the commit stays in history
    else:
        for path, text in proposal_files(row, repo).items():
            p = repo / path
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists() or p.read_text() != text:
                p.write_text(text)
    hook = _hook(row.kind)
    if hook is not None:
        hook(repo, row, store=store)   # e.g. calibration: record the active constants in the DB
    with store.session() as s:
        r = s.get(ProposalRow, row.id)
        r.status, r.decided_at = "accepted", _now()
        if args.comment:
            r.reason = args.comment
        s.add(r)
        if r.cluster_id is not None and (c := s.get(ClusterRow, r.cluster_id)) is not None:
            c.status = "covered"
            s.add(c)
        s.commit()
    out.write(f"{row.id}: accepted ({'merged ' + row.branch if row.branch else 'files copied into ' + str(repo)}); "
              f"active from the next run\n")
    return 0


def _hook(kind: str):
    """The promoter's own on_accept (reviewed project code, not proposal code), if it has one."""
    from agent.evolve import promoter
    return getattr(promoter(kind), "on_accept", None)


def cmd_reject(store, repo: Path, row, args, out) -> int:
    from knowledge.models import ClusterRow, ProposalRow
    from knowledge.proposals import git, git_root
    if row.status != "proposed":
        out.write(f"{row.id} is {row.status}; only proposed proposals can be rejected\n")
        return 1
    with store.session() as s:
        r = s.get(ProposalRow, row.id)
        r.status, r.reason, r.decided_at = "rejected", args.reason, _now()
        s.add(r)
        if r.cluster_id is not None and (c := s.get(ClusterRow, r.cluster_id)) is not None and c.status != "covered":
            c.status = "blocked"   # its fingerprint is kept: the same proposal never comes back
            s.add(c)
        s.commit()
    top = git_root(repo)
    if row.branch and top is not None:
        git(top, "branch", "-D", row.branch, check=False)   # the evidence stays in the DB
    out.write(f"{row.id}: rejected ({args.reason})\n")
    return 0


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from knowledge.models import ProposalRow
    from knowledge.store import Store
    store = Store(url=args.db) if args.db else Store()
    repo = repo_root(args.repo)
    try:
        if args.cmd == "list":
            return cmd_list(store, repo, args, out)
        with store.session() as s:
            row = s.get(ProposalRow, args.id)
        if row is None:
            sys.stderr.write(f"error: no proposal {args.id!r} (see: python -m agent.review list)\n")
            return 2
        return {"show": cmd_show, "test": cmd_test, "accept": cmd_accept, "reject": cmd_reject}[args.cmd](
            store, repo, row, args, out)
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
