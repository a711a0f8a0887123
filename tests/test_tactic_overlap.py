"""wgmma_overlap turns the seed's drain-every-step loop into wait(1) + deferred release; the result
verifies clean (no W-PERF-04 any more) and compiles."""
import json
import pathlib

from cake_ir.compiler import compile_kernel
from cake_ir.io import load
from cake_ir.verifier import verify
from tactics import get_tactic

SEED = pathlib.Path(__file__).resolve().parent.parent / "tasks/gemm/seeds/gemm_wgmma_sm90a.json"


def test_overlap_applies_verifies_and_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    ir = json.loads(SEED.read_text())
    t = get_tactic("wgmma_overlap")
    g = {"ir": ir, "recipe": None}
    assert t.applicable(g) is None
    new = t.apply(g, t.choices(g)[0])["ir"]
    k, diags = load(new)
    assert k is not None, diags
    res = verify(k)
    codes = {d.code for d in res.diagnostics}
    assert res.ok and "W-PERF-04" not in codes, [d.short() for d in res.diagnostics]
    assert "W-PERF-04" in {d.code for d in verify(load(ir)[0]).diagnostics}
    assert compile_kernel(k, use_cache=False).ok
    # applying it again is not possible: the loop no longer drains every step
    assert t.applicable({"ir": new, "recipe": None}) is not None


def test_overlap_precondition_rejects_other_kernels():
    sm80 = json.loads((SEED.parent / "gemm_mma_sm80.json").read_text())
    assert get_tactic("wgmma_overlap").applicable({"ir": sm80, "recipe": None}) is not None


def test_register_split_that_hung_on_the_h200_is_rejected():
    """Regression: producer 32 / consumers 240 on the seed (384 threads, launch count 168) passed the
    verifier and hung on the H200; the block can only redistribute its launch allocation."""
    from cake_ir.io import load
    ir = json.loads(SEED.read_text())
    ir["roles"][0]["regs"], ir["roles"][1]["regs"] = 32, 240
    res = verify(load(ir)[0])
    hits = [d for d in res.diagnostics if d.code == "E-RES-03"]
    assert hits and hits[0].node == "/roles/1/regs" and 232 in hits[0].legal and 240 not in hits[0].legal
    ir["roles"][0]["regs"], ir["roles"][1]["regs"] = 24, 232   # ran correctly on the H200
    assert not [d for d in verify(load(ir)[0]).diagnostics if d.code == "E-RES-03"]
