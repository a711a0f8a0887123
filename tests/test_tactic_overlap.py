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

