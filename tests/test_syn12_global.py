"""E-SYN-12 (intra-CTA global-memory conflicts): the k-means last_cta bug the H200 found, its fixed
seeds, blocked vs per-thread mappings, atomics, loops, and no false positives on seeds / pass fixtures."""
import copy
import glob
import json
import pathlib

import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.io import load, to_dict
from cake_ir.verifier import verify

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE = "E-SYN-12"


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    from cake_ir.analysis import sync
    monkeypatch.setattr(sync, "STRICT", True)  # analysis bugs raise here instead of silencing the rule


def _hits(kernel):
    if isinstance(kernel, dict):
        kernel, diags = load(kernel)
        assert kernel is not None, [d.short() for d in diags]
    res = verify(kernel)
    assert not [d for d in res.diagnostics if d.code in ("E-VERIFY-INTERNAL", "W-VERIFY-SKIPPED")]
    return [d for d in res.diagnostics if d.code == CODE]


SEEDS = sorted(glob.glob(str(ROOT / "tasks" / "*" / "seeds" / "*.json")))
PASS = sorted(glob.glob(str(ROOT / "rules" / "fixtures" / "*" / "pass.json")))


@pytest.mark.parametrize("path", SEEDS + PASS, ids=lambda p: "/".join(p.split("/")[-3:]))
def test_no_false_positives(path):
    doc = json.loads(pathlib.Path(path).read_text())
    assert not _hits(doc.get("kernel", doc) if "kernel" in doc else doc), path


def _kmeans_docs():
    return sorted(glob.glob(str(ROOT / "tasks" / "kmeans" / "seeds" / "*.json")))


@pytest.mark.parametrize("path", _kmeans_docs(), ids=lambda p: p.split("/")[-1])
def test_kmeans_seed_clean_and_barrier_needed(path):
    doc = json.loads(pathlib.Path(path).read_text())
    kd = doc.get("kernel", doc)
    res = verify(load(kd)[0])
    assert res.ok, [d.short() for d in res.diagnostics]
    body = kd["roles"][0]["body"]
    fi = next(i for i, s in enumerate(body) if s.get("op") == "last_cta")
    loop = body[fi]["body"][0]          # the full-chunk finishing loop (K / RB iterations)
    si = next(i for i, s in enumerate(loop["body"]) if s.get("op") == "syncthreads")
    ldg = next(i for i, s in enumerate(loop["body"]) if s.get("op") == "ldg" and s["src"]["buf"] == "WC")
    stg = next(i for i, s in enumerate(loop["body"]) if s.get("op") == "stg" and s["dst"]["buf"] == "WC")
    bad = copy.deepcopy(kd)
    del bad["roles"][0]["body"][fi]["body"][0]["body"][si]
    hits = _hits(bad)
    base = f"/roles/0/body/{fi}/body/0/body"
    assert [(d.node, d.related) for d in hits] == [(f"{base}/{stg - 1}", [f"{base}/{ldg}"])], \
        [d.short() for d in hits]
    assert "WC" in hits[0].message and "syncthreads" in hits[0].message
    assert hits[0].fix == [{"op": "add", "path": f"{base}/{stg - 1}", "value": {"op": "syncthreads"}}]


# ------------------------------------------------------------------------------ small kernels
def _kernel(build):
    kb = KernelBuilder("g", arch="sm_80", grid=["P", "B"], threads=128)
    kb.const(P=4)
    kb.scalar("B", min=1)
    kb.tensor("WS", "f32", ["B * 8", 128], access="readwrite")
    kb.tensor("WC", "f32", ["B * 8", 1], access="readwrite")
    kb.tensor("WT", "i32", ["B", 1], access="readwrite")
    kb.buffer("fs", "reg", "f32", [8, 128], layout="blocked", vec=1, scope="cta")
    kb.buffer("fv", "reg", "f32", [8, 128], layout="blocked", vec=4, scope="cta")
    kb.buffer("fc", "reg", "f32", [8, 1])
    kb.buffer("ss", "smem", "f32", [8, 128])
    with kb.role("main", warps=(0, 4)) as r:
        build(r)
    return to_dict(kb.build())


WS = lambda row="bid.y * 8": tile("WS", [row, 0], [8, 128])  # noqa: E731
WC = lambda row="bid.y * 8": tile("WC", [row, 0], [8, 1])  # noqa: E731


def test_blocked_same_mapping_is_clean():
    """Each element of a cta-blocked tile belongs to one thread: reading then zeroing it is per thread."""
    def b(r):
        r.ldg(WS(), tile("fs"), vec_bytes=4)
        r.fill("fs", 0.0)
        r.stg(tile("fs"), WS(), vec_bytes=4)
    assert not _hits(_kernel(b))


def test_blocked_different_mapping_conflicts():
    def b(r):
        r.ldg(WS(), tile("fs"), vec_bytes=4)
        r.fill("fv", 0.0)
        r.stg(tile("fv"), WS(), vec_bytes=16)    # vec 4 chunks: other threads own the elements
    hits = _hits(_kernel(b))
    assert [d.node for d in hits] == ["/roles/0/body/2"] and "write-after-read" in hits[0].message


def test_per_thread_read_then_write_needs_barrier():
    def b(r, sync):
        r.ldg(WC(), tile("fc"), vec_bytes=4)
        if sync:
            r.sync("syncthreads")
        r.fill("fc", 0.0)
        r.stg(tile("fc"), WC(), vec_bytes=4)
    assert [d.node for d in _hits(_kernel(lambda r: b(r, False)))] == ["/roles/0/body/2"]
    assert not _hits(_kernel(lambda r: b(r, True)))


def test_one_thread_reads_and_writes_is_clean():
    def b(r):
        with r.if_("tid == 0"):
            r.ldg(WC(), tile("fc"), vec_bytes=4)
            r.map("fc", "fc + 1")
            r.stg(tile("fc"), WC(), vec_bytes=4)
    assert not _hits(_kernel(b))


def test_atomics_do_not_conflict_but_need_a_barrier_before_reads():
    def b(r, between):
        r.add("red_add", src=tile("ss"), dst=WS())
        r.add("red_add", src=tile("ss"), dst=WS())
        if between == "last_cta":
            fin = r.add("last_cta", counter=tile("WT", ["bid.y", 0], [1, 1]), count="nbid.x", body=[])
            with r._nest(fin["body"]):
                r.ldg(WS(), tile("fs"), vec_bytes=4)
            return
        if between == "sync":
            r.sync("syncthreads")
        r.ldg(WS(), tile("fs"), vec_bytes=4)
    hits = _hits(_kernel(lambda r: b(r, None)))
    assert sorted(d.node for d in hits) == ["/roles/0/body/2"], [d.short() for d in hits]
    assert "read-after-write" in hits[0].message
    assert not _hits(_kernel(lambda r: b(r, "sync")))
    assert not _hits(_kernel(lambda r: b(r, "last_cta")))


def test_loop_carried_conflict():
    """Iteration i zeroes row i + 1, which iteration i + 1 reads (every thread, per-thread tile): a
    barrier at the top of the body orders them; within an iteration the rows differ."""
    def b(r, sync):
        with r.for_("i", 0, 4):
            if sync:
                r.sync("syncthreads")
            r.ldg(tile("WC", ["bid.y * 8 + i", 0], [1, 1]), tile("fc", [0, 0], [1, 1]), vec_bytes=4)
            r.fill("fc", 0.0)
            r.stg(tile("fc", [0, 0], [1, 1]), tile("WC", ["bid.y * 8 + i + 1", 0], [1, 1]), vec_bytes=4)
    hits = _hits(_kernel(lambda r: b(r, False)))
    assert [d.node for d in hits] == ["/roles/0/body/0/body/0"], [d.short() for d in hits]
    assert "read-after-write" in hits[0].message and hits[0].related == ["/roles/0/body/0/body/2"]
    assert not _hits(_kernel(lambda r: b(r, True)))
