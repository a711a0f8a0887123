"""Proposals as pull requests: the writer (git branch or directory) and `python -m agent.review`.
Proposed code must never be imported by the harness: only `review test` (a subprocess) runs it."""
import os
import subprocess
import sys

import pytest

from agent import evolve, review
from knowledge.models import ClusterRow, ProposalRow
from knowledge.promote.base import Proposal, fingerprint
from knowledge.proposals import submit
from knowledge.store import Store

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo, *args):
    import os
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def make_repo(path, use_git=True):
    (path / "rules").mkdir(parents=True)
    (path / "rules" / "__init__.py").write_text("")
    (path / "README.md").write_text("tiny project\n")
    if use_git:
        git(path, "init", "-q", "-b", "main")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "base")
    return path


def sentinel_proposal(sentinel, name="e_lrn_99", test_body="assert mod.CODE == 'E-LRN-99'", kind="rule"):
    """A plugin whose module writes `sentinel` when imported, with a test that imports it."""
    module = (f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('imported')\n"
              f"CODE = 'E-LRN-99'\nTITLE = 'sentinel'\n\ndef check(ctx):\n    return []\n")
    test = f"import importlib\n\n\ndef test_it():\n    mod = importlib.import_module('rules.{name}')\n    {test_body}\n"
    return Proposal(kind=kind, title=f"sentinel {name}", fingerprint=fingerprint("test", name, test_body),
                    files={f"rules/{name}.py": module, f"tests/test_{name}.py": test},
                    evidence={"cluster": {"count": 7}, "note": "made by a test"})


@pytest.fixture(autouse=True)
def _lean_pytest(monkeypatch):
    # the proposals' tests here are plain; skipping installed plugins cuts each subprocess to ~1 s
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def env(tmp_path):
    db = f"sqlite:///{tmp_path / 'cake.db'}"
    store = Store(url=db)
    with store.session() as s:
        c = ClusterRow(signature="sig-1", stage="compile", code="E-X", count=7, candidates=3)
        s.add(c)
        s.commit()
        cid = c.id
    yield store, db, cid
    store.close()


def cli(repo, db, *args):
    import io
    out = io.StringIO()
    rc = review.main(["--repo", str(repo), "--db", db, *args], out=out)
    return rc, out.getvalue()


def test_git_proposal_is_one_commit_on_a_branch_and_the_harness_never_imports_it(tmp_path, env):
    store, db, cid = env
    repo = make_repo(tmp_path / "repo")
    sentinel = tmp_path / "SENTINEL"
    head = git(repo, "rev-parse", "HEAD")
    p = sentinel_proposal(sentinel)
    p.cluster_id = cid
    row = submit(store, p, repo)
    assert row.branch == f"cake/proposal/{p.id}" and row.path is None
    # exactly one commit on top of HEAD, holding the files and the evidence; nothing else touched
    assert git(repo, "rev-list", "--count", f"HEAD..{row.branch}") == "1"
    assert git(repo, "rev-parse", f"{row.branch}~1") == head
    changed = git(repo, "diff", "--name-only", "HEAD", row.branch).splitlines()
    assert sorted(changed) == sorted([f"knowledge/proposals/{p.id}/evidence.json", "rules/e_lrn_99.py",
                                      "tests/test_e_lrn_99.py"])
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    assert git(repo, "branch", "--show-current") == "main" and not (repo / "rules/e_lrn_99.py").exists()
    assert submit(store, p, repo) is None                       # same fingerprint: skipped

    rc, out = cli(repo, db, "list")
    assert rc == 0 and p.id in out and "proposed" in out and " 7 " in out
    rc, out = cli(repo, db, "show", p.id)
    assert rc == 0 and "+++ b/rules/e_lrn_99.py" in out and '"note": "made by a test"' in out
    assert evolve.main(["--db", db, "--repo", str(repo), "--kinds", "rule", "--force"]) == 0
    # the verifier in that checkout loads its rules package: the proposal is not in it
    v = subprocess.run([sys.executable, "-c", "from cake_ir.verifier import load_rules; "
                        "print(sorted(r.code for r in load_rules('rules', entry_points=False)))"],
                       cwd=repo, capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.strip() == "[]", v.stderr
    assert not sentinel.exists(), "list/show/evolve/verifier imported proposed code"

    rc, out = cli(repo, db, "test", p.id)
    assert rc == 0, out
    assert sentinel.exists()                                    # only the test subprocess imported it
    with store.session() as s:
        assert s.get(ProposalRow, p.id).test_result["ok"] is True

    rc, out = cli(repo, db, "accept", p.id)
    assert rc == 0, out
    assert (repo / "rules/e_lrn_99.py").exists() and git(repo, "status", "--porcelain") == ""
    assert git(repo, "branch", "--list", row.branch) == ""      # merged and removed
    with store.session() as s:
        assert s.get(ProposalRow, p.id).status == "accepted" and s.get(ClusterRow, cid).status == "covered"
    assert cli(repo, db, "accept", p.id)[0] == 1                # not twice


def test_reject_records_why_and_the_proposal_never_comes_back(tmp_path, env):
    store, db, cid = env
    repo = make_repo(tmp_path / "repo")
    p = sentinel_proposal(tmp_path / "S")
    p.cluster_id = cid
    row = submit(store, p, repo)
    assert cli(repo, db, "reject", p.id)[0] == 2               # --reason is required
    rc, out = cli(repo, db, "reject", p.id, "--reason", "too broad")
    assert rc == 0 and "rejected" in out
    with store.session() as s:
        r = s.get(ProposalRow, p.id)
        assert (r.status, r.reason) == ("rejected", "too broad") and r.decided_at
        assert s.get(ClusterRow, cid).status == "blocked"
    assert git(repo, "branch", "--list", row.branch) == ""
    assert submit(store, p, repo) is None                       # same evidence, same fingerprint: blocked
    assert cli(repo, db, "accept", p.id)[0] == 1
    assert cli(repo, db, "show", "rule-nope")[0] == 2 and cli(repo, db, "bogus")[0] == 2


def test_failing_or_hanging_tests_block_accept(tmp_path, env):
    store, db, _ = env
    repo = make_repo(tmp_path / "repo")
    bad = sentinel_proposal(tmp_path / "S1", name="e_lrn_98", test_body="assert False, 'learned rule is wrong'")
    submit(store, bad, repo)
    rc, out = cli(repo, db, "test", bad.id)
    assert rc == 1 and "learned rule is wrong" in out
    assert cli(repo, db, "accept", bad.id)[0] == 1 and not (repo / "rules/e_lrn_98.py").exists()
    slow = sentinel_proposal(tmp_path / "S2", name="e_lrn_97", test_body="import time; time.sleep(60)")
    submit(store, slow, repo)
    rc, out = cli(repo, db, "test", slow.id, "--timeout", "3")
    assert rc == 1 and "timed out" in out
    with store.session() as s:
        assert s.get(ProposalRow, slow.id).test_result["timed_out"] is True


def test_accept_refuses_a_dirty_working_tree_for_its_paths(tmp_path, env):
    store, db, _ = env
    repo = make_repo(tmp_path / "repo")
    p = sentinel_proposal(tmp_path / "S")
    submit(store, p, repo)
    rc, out = cli(repo, db, "accept", p.id)
    assert rc == 1 and "its tests have not run" in out and not (repo / "rules/e_lrn_99.py").exists()
    assert cli(repo, db, "test", p.id)[0] == 0
    (repo / "rules/e_lrn_99.py").write_text("# local work in progress\n")
    rc, out = cli(repo, db, "accept", p.id)
    assert rc == 1 and "working tree" in out
    assert (repo / "rules/e_lrn_99.py").read_text() == "# local work in progress\n"


def test_directory_mode_outside_git(tmp_path, env):
    store, db, cid = env
    repo = make_repo(tmp_path / "plain", use_git=False)
    sentinel = tmp_path / "SENTINEL"
    p = sentinel_proposal(sentinel)
    row = submit(store, p, repo)
    assert row.branch is None and row.path == f"knowledge/proposals/{p.id}"
    assert (repo / row.path / "files/rules/e_lrn_99.py").exists() and (repo / row.path / "evidence.json").exists()
    assert not (repo / "rules/e_lrn_99.py").exists()
    rc, out = cli(repo, db, "show", p.id)
    assert rc == 0 and "+++ b/rules/e_lrn_99.py" in out
    assert not sentinel.exists()
    assert cli(repo, db, "test", p.id)[0] == 0 and sentinel.exists()
    assert not (repo / "rules/e_lrn_99.py").exists()            # testing happened in a copy
    assert cli(repo, db, "accept", p.id)[0] == 0
    assert (repo / "rules/e_lrn_99.py").read_text() == p.files["rules/e_lrn_99.py"]


def test_proposal_tests_keep_the_callers_other_import_paths(tmp_path, monkeypatch):
    """A wheel site on PYTHONPATH (the GPU machine installs pydantic there) stays importable in the
    proposal's test run; the checkout under review does not, so the proposal's copy is what imports."""
    from agent.review import test_pythonpath
    site, repo, root = tmp_path / "site", tmp_path / "repo", tmp_path / "copy"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(repo)]))
    assert test_pythonpath(root, repo).split(os.pathsep) == [str(root), str(site)]
    monkeypatch.delenv("PYTHONPATH")
    assert test_pythonpath(root, repo) == str(root)
