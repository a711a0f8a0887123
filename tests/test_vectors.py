"""knowledge/vectors.py: the Chroma store (real chromadb, persistent, in a temporary CAKE_HOME)."""
import dataclasses

import pytest


@pytest.fixture
def vs(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CAKE_CHROMA_URL", raising=False)
    from knowledge.vectors import VectorStore
    return VectorStore()


def test_upserts_are_idempotent_and_filtered(vs, tmp_path):
    items = [{"id": "r1:a", "text": "E-CPY-04 vector width 16 needs 16-byte alignment", "meta": {"task": "gemm", "arch": "sm_90a"}},
             {"id": "r1:b", "text": "E-RES-01 shared memory of 240 KB exceeds the block limit", "meta": {"task": "gemm", "arch": "sm_80"}},
             {"id": "r2:a", "text": "softmax rows reduce across warps", "meta": {"task": "softmax", "arch": "sm_90a", "x": None}}]
    assert vs.upsert("failures", items) == 3
    assert vs.upsert("failures", items) == 0 and vs.count("failures") == 3      # nothing re-embedded
    changed = [dict(items[0], text="E-CPY-04 misaligned 16-byte copy")]
    assert vs.upsert("failures", changed) == 1 and vs.count("failures") == 3
    hits = vs.query("failures", "the kernel needs too much on-chip storage", k=3)
    assert hits[0]["id"] == "r1:b" and -1.0 <= hits[-1]["similarity"] <= hits[0]["similarity"] <= 1.0
    assert [h["id"] for h in vs.query("failures", "alignment", k=5, task="gemm", arch="sm_90a")] == ["r1:a"]
    assert {h["meta"]["task"] for h in vs.query("failures", "alignment", k=5, task="softmax")} == {"softmax"}
    assert (tmp_path / "home" / "chroma").is_dir()


def test_persisted_collections_reopen_with_their_embedding(vs):
    vs.upsert("experiences", [{"id": "n1", "text": "stages S=3 on gemm: 4% faster", "meta": {"task": "gemm"}}])
    import chromadb
    from chromadb.config import Settings
    other = chromadb.PersistentClient(path=vs.where, settings=Settings(anonymized_telemetry=False))
    col = other.get_collection("experiences")           # rebuilt from the stored embedding-function config
    res = col.query(query_texts=["deeper pipeline helped the matrix multiply"], n_results=1)
    assert res["ids"][0] == ["n1"]


def test_tactics_index_only_what_changed(vs):
    from tactics import load_tactics
    ts = [t for t in load_tactics() if t.kind != "repair"]
    first = vs.index_tactics(ts)
    assert first >= len(ts) and vs.index_tactics(ts) == 0
    sw = next(t for t in ts if t.name == "swizzle")
    edited = dataclasses.replace(sw, description=sw.description + " Also works for epilogue tiles.")
    ts2 = [edited if t.name == "swizzle" else t for t in ts]
    n = vs.index_tactics(ts2)
    assert 1 <= n <= 6                           # only the swizzle passages
    ranked = vs.rank_tactics("avoid shared memory bank conflicts", ts2)
    assert ranked[0][0] == "swizzle"
    # a tactic that disappears leaves the collection
    vs.index_tactics([t for t in ts2 if t.name != "unroll"])
    assert not vs.collection("tactics").get(where={"tactic": "unroll"})["ids"]
