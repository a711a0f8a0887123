"""Write promotion proposals out for review, like pull requests.

    submit(store, proposal, repo_root) -> ProposalRow | None     (None: the fingerprint is known)

In a git repository each proposal becomes branch `cake/proposal/<id>` holding exactly one commit on
top of HEAD: the proposal's files plus `knowledge/proposals/<id>/evidence.json`. The commit is built
with plumbing (a temporary index, hash-object, write-tree, commit-tree, update-ref), so the working
tree, the real index and the current branch are never touched. Outside git the same tree goes to
`knowledge/proposals/<id>/files/...` with `evidence.json` next to it.

Generic over kinds (rule, primitive, calibration, tactic): a proposal is files + evidence. The code
in a proposal is only ever written as bytes, never imported (agent/review.py tests it in a
subprocess). A rejected proposal keeps its row, so its fingerprint can never be submitted again.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from sqlmodel import select

from .models import ClusterRow, ProposalRow
from .promote.base import Proposal

BRANCH_PREFIX = "cake/proposal/"
IDENTITY = {"GIT_AUTHOR_NAME": "cake-evolve", "GIT_AUTHOR_EMAIL": "cake-evolve@localhost",
            "GIT_COMMITTER_NAME": "cake-evolve", "GIT_COMMITTER_EMAIL": "cake-evolve@localhost"}


def evidence_path(pid: str) -> str:
    return f"knowledge/proposals/{pid}/evidence.json"


def git(repo: Path, *args: str, env: Optional[dict] = None, input: Optional[bytes] = None,
        check: bool = True) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                       env={**os.environ, **(env or {})})
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout.decode(errors="replace").strip()


def git_root(repo: Path) -> Optional[Path]:
    """The top of the git work tree containing `repo`, or None outside git (or without a commit)."""
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    top = Path(r.stdout.strip())
    ok = subprocess.run(["git", "-C", str(top), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True)
    return top if ok.returncode == 0 else None


def _commit_env(repo: Path) -> dict:
    """Use the repository's identity when it has one, else a neutral bot identity."""
    env = {}
    for var, key in (("NAME", "user.name"), ("EMAIL", "user.email")):
        v = git(repo, "config", key, check=False)
        for who in ("AUTHOR", "COMMITTER"):
            env[f"GIT_{who}_{var}"] = v or IDENTITY[f"GIT_{who}_{var}"]
    return env


def write_branch(repo: Path, branch: str, files: dict[str, str], message: str) -> str:
    """One commit on top of HEAD with `files` added/replaced, as `branch`; returns the commit id."""
    with tempfile.TemporaryDirectory() as td:
        env = {"GIT_INDEX_FILE": str(Path(td) / "index")}
        git(repo, "read-tree", "HEAD", env=env)
        for path, text in sorted(files.items()):
            blob = git(repo, "hash-object", "-w", "--stdin", input=text.encode())
            git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env)
    head = git(repo, "rev-parse", "HEAD")
    commit = git(repo, "commit-tree", tree, "-p", head, "-m", message, env=_commit_env(repo))
    git(repo, "update-ref", f"refs/heads/{branch}", commit)
    return commit


def _safe(path: str) -> str:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or not path:
        raise ValueError(f"proposal file path must be relative and inside the repo: {path!r}")
    return p.as_posix()


def submit(store, proposal: Proposal, repo_root) -> Optional[ProposalRow]:
    repo = Path(repo_root).resolve()
    with store.session() as s:
        if s.exec(select(ProposalRow).where(ProposalRow.fingerprint == proposal.fingerprint)).first():
            return None   # proposed before (maybe rejected): never again
    pid = proposal.id
    files = {_safe(k): v for k, v in proposal.files.items()}
    ev_path = evidence_path(pid)
    evidence = {"id": pid, "kind": proposal.kind, "title": proposal.title, "fingerprint": proposal.fingerprint,
                "cluster_id": proposal.cluster_id, "files": sorted(files), **(proposal.evidence or {})}
    tree = {**files, ev_path: json.dumps(evidence, indent=1, sort_keys=True, default=str) + "\n"}
    branch = path = None
    top = git_root(repo)
    if top is not None:
        branch = BRANCH_PREFIX + pid
        rel = repo.relative_to(top).as_posix() if repo != top else ""
        tree = {(f"{rel}/{k}" if rel else k): v for k, v in tree.items()}
        body = json.dumps({k: v for k, v in evidence.items() if k in ("cluster_id", "fingerprint")})
        write_branch(top, branch, tree, f"cake proposal {pid}: {proposal.title}\n\n{body}\n")
    else:
        base = repo / "knowledge" / "proposals" / pid
        for k, v in files.items():
            dst = base / "files" / k
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(v)
        (base / "evidence.json").write_text(tree[ev_path])
        path = str(base.relative_to(repo))
    row = ProposalRow(id=pid, kind=proposal.kind, title=proposal.title, fingerprint=proposal.fingerprint,
                      status="proposed", cluster_id=proposal.cluster_id, branch=branch, path=path,
                      files=sorted(files) + [ev_path], evidence=evidence)
    with store.session() as s:
        s.add(row)
        if proposal.cluster_id is not None:
            c = s.get(ClusterRow, proposal.cluster_id)
            if c is not None and c.status == "open":
                c.status = "proposed"
                s.add(c)
        s.commit()
    return row


def proposal_files(row: ProposalRow, repo_root) -> dict[str, str]:
    """The proposal's files (repo-relative path -> text), read from its branch or directory as data."""
    repo = Path(repo_root).resolve()
    out = {}
    if row.branch:
        top = git_root(repo) or repo
        rel = repo.relative_to(top).as_posix() if repo != top else ""
        for f in row.files or []:
            r = subprocess.run(["git", "-C", str(top), "show", f"{row.branch}:{(rel + '/' + f) if rel else f}"],
                               capture_output=True)
            if r.returncode == 0:
                out[f] = r.stdout.decode(errors="replace")
    else:
        base = repo / (row.path or "")
        for f in row.files or []:
            src = base / "evidence.json" if f == evidence_path(row.id) else base / "files" / f
            if src.exists():
                out[f] = src.read_text()
    return out
