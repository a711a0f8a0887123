"""Failure clustering over a real SQLite knowledge DB."""
import pytest
from sqlmodel import select

from knowledge.clusters import cluster, recurring
from knowledge.models import ClusterRow, FailureRow
from knowledge.promote.base import PromoteConfig
from knowledge.store import Store

from _knowledge_data import LOWER_MSG, cand, populate, softmax_ir


@pytest.fixture
def store(tmp_path):
    s = Store(url=f"sqlite:///{tmp_path / 'cake.db'}")
    yield s
    s.close()


def test_failures_are_signed_and_grouped(store):
    populate(store, "r1", n_fail=3)
    rows = cluster(store, PromoteConfig())
    by = {(c.stage, c.code): c for c in rows}
    low = by[("compile", "E-LOWER-UNSUPPORTED")]
    assert (low.count, low.candidates, low.runs, low.tasks) == (3, 3, 1, ["softmax"])
    assert low.node_kind == "ldg" and "<n>" in low.template and "4096" not in low.template
    res = by[("verify", "E-RES-02")]
    assert (res.count, res.candidates) == (4, 2)      # two failures per candidate
    with store.session() as s:
        fs = list(s.exec(select(FailureRow)))
    assert all(f.signature and f.cluster_id for f in fs)
    assert all(f.features and f.features["arch"] == "sm_90a" for f in fs)


def test_clusters_accumulate_across_runs_and_reclustering_is_idempotent(store):
    populate(store, "r1", n_fail=2)
    first = {c.signature: c.count for c in cluster(store)}
    assert {c.signature: c.count for c in cluster(store)} == first   # re-running changes nothing
    # a second run repeats one failing program (same IR hash) and adds a new one
    store.create_run("r2", "softmax")
    for tag in ("x0", "y9"):
        c = cand(softmax_ir(32, 8, tag), status="failed", stage="compile")
        store.record_stage("r2", c, "compile", "fail", seconds=2.0,
                           failures=[{"code": "E-LOWER-UNSUPPORTED", "node": "/roles/0/body/0", "message": LOWER_MSG}])
    low = next(c for c in cluster(store) if c.code == "E-LOWER-UNSUPPORTED")
    assert (low.count, low.candidates, low.runs) == (4, 3, 2)       # x0 twice: one distinct candidate
    with store.session() as s:
        assert len(list(s.exec(select(ClusterRow)))) == len(first)


def test_recurring_needs_count_and_distinct_candidates(store):
    populate(store, "r1", n_fail=3)
    cluster(store)
    codes = lambda cfg: sorted(c.code for c in recurring(store, cfg))  # noqa: E731
    assert codes(PromoteConfig(min_count=3, min_candidates=2)) == ["E-LOWER-UNSUPPORTED", "E-RES-02"]
    assert codes(PromoteConfig(min_count=4, min_candidates=2)) == ["E-RES-02"]
    assert codes(PromoteConfig(min_count=3, min_candidates=3)) == ["E-LOWER-UNSUPPORTED"]
    assert codes(PromoteConfig(min_count=1, min_candidates=1, task="gemm")) == []


def test_proposer_failures_cluster_without_features(store):
    store.create_run("r1", "gemm")
    for i in range(3):
        store.add_failure("r1", f"propose:{i}:llm:0", "propose", "E-PROPOSER-REPLY", f"reply {i} is not JSON at line {i + 3}")
    (c,) = cluster(store)
    assert (c.stage, c.count, c.candidates, c.node_kind) == ("propose", 3, 3, None)
    assert recurring(store, PromoteConfig(min_count=3, min_candidates=3))[0].id == c.id
    with store.session() as s:
        assert all(f.features is None and f.cluster_id == c.id for f in s.exec(select(FailureRow)))
