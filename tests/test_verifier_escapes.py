"""Verifier escapes found on the H200 or in ptxas, each now caught by a rule, and rules ptxas showed too strict (regression tests)."""
import json
import pathlib

from cake_ir.compiler import compile_kernel
from cake_ir.io import load
from cake_ir.verifier import verify

SEED = pathlib.Path(__file__).resolve().parent.parent / "tasks/gemm/seeds/gemm_wgmma_sm90a.json"


def test_register_split_that_hung_on_the_h200_is_rejected():
    """Regression: producer 32 / consumers 240 on the seed (384 threads, launch count 168) passed the
    verifier and hung on the H200; the block can only redistribute its launch allocation."""
    ir = json.loads(SEED.read_text())
    ir["roles"][0]["regs"], ir["roles"][1]["regs"] = 32, 240
    res = verify(load(ir)[0])
    hits = [d for d in res.diagnostics if d.code == "E-RES-03"]
    assert hits and hits[0].node == "/roles/1/regs" and 232 in hits[0].legal and 240 not in hits[0].legal
    ir["roles"][0]["regs"], ir["roles"][1]["regs"] = 24, 232   # ran correctly on the H200
    assert not [d for d in verify(load(ir)[0]).diagnostics if d.code == "E-RES-03"]



def test_wgmma_accumulator_over_the_launch_cap_is_rejected_before_ptxas(tmp_path, monkeypatch):
    """3 consumer warpgroups (512 threads, launch cap 128) with m64n256 accumulators and regs 152 passed
    the budget check and failed in ptxas (C7602); E-RES-05 now checks the launch cap."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    from tasks.gemm.programs import gemm_wgmma_sm90a
    k = gemm_wgmma_sm90a(bm=192, consumers=3)
    k = k.model_copy(update={"roles": [r.model_copy(update={"regs": 152}) if r.name == "consumer" else r
                                       for r in k.roles]})
    hits = [d for d in verify(k).diagnostics if d.code == "E-RES-05"]
    assert hits and hits[0].node == "/buffers/2"
    out = compile_kernel(k, verify_first=False, use_cache=False)   # what happens without the rule
    assert not out.ok and any("C7602" in d.message for d in out.diagnostics), [d.short() for d in out.diagnostics]
    assert not [d for d in verify(gemm_wgmma_sm90a()).diagnostics if d.code == "E-RES-05"]


def test_blocked_tile_that_does_not_split_is_rejected_before_lowering(tmp_path, monkeypatch):
    """Found by the explore strategy on the H200 (softmax, 1024 threads, 8-element chunks of a 4096-element
    row): it verified clean and failed in lowering. E-RES-06 now rejects it at verify."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    from tasks.softmax.programs import softmax_row
    k = softmax_row(warps=32, vec=8)
    hits = [d for d in verify(k).diagnostics if d.code == "E-RES-06"]
    assert hits and hits[0].legal == [1, 2, 4]
    out = compile_kernel(k, verify_first=False, use_cache=False)   # what happens without the rule
    assert not out.ok and any(d.code == "E-LOWER-UNSUPPORTED" for d in out.diagnostics), \
        [d.short() for d in out.diagnostics]
    ok = softmax_row(warps=32, vec=4)
    assert not [d for d in verify(ok).diagnostics if d.code == "E-RES-06"]
    assert compile_kernel(ok, use_cache=False).ok


def test_register_tiles_with_disjoint_live_ranges_share_registers(tmp_path, monkeypatch):
    """E-RES-05 once summed every register tile of a role, so the split kNN search at k = 32 (its
    lists 64 + 64, the accumulator 32, the last CTA's merge lists 6 x 32) was refused at ~300 registers.
    The search lists die before the merge lists are born and ptxas builds it in under 255 without spills;
    the rule now counts live ranges. Tiles live at once still add up: the 32-row stream at k = 32 stays
    refused."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path))
    from rules._res_util import _exclusive_saving, _live_peak, role_reg_buffers, buffer_regs
    from tasks.knn.programs import knn_fused
    from tasks.knn.wgmma import knn_wgmma
    prog = knn_wgmma(metric="l2", k=32, d=128, bq=128, bn=64, split=16, stages=4, arch="sm_90a")
    search = prog.kernels[-1]
    parts = [(bi, buffer_regs(search, search.buffers[bi], search.roles[0])) for bi in role_reg_buffers(search, 0)]
    summed = sum(r for _, r in parts) - _exclusive_saving(search, 0, parts)
    assert summed + 16 > 255 and _live_peak(search, 0, parts) + 16 <= 255, (summed, _live_peak(search, 0, parts))
    assert not [d for d in verify(prog).diagnostics if d.code == "E-RES-05"]
    out = compile_kernel(search, use_cache=False)
    assert out.ok, [d.short() for d in out.diagnostics]
    assert out.resources["registers"] <= 255 and out.resources.get("spill_store_bytes", 0) == 0, out.resources
    wide = knn_fused(metric="l2", k=32, d=128, bq=32, bn=32, split=64, stages=3, arch="sm_90a", norms="tile",
                     merge="wide", wm=32, ws=4)
    assert [d for d in verify(wide).diagnostics if d.code == "E-RES-05"]
    # merge lists touched before the search loop are live across it: the tiles add up again
    doc = json.loads(search.model_dump_json(by_alias=True, exclude_none=True))
    for buf in ("mv", "mi", "pv0", "pi0"):
        doc["roles"][0]["body"].insert(0, {"op": "fill", "dst": {"buf": buf}, "value": 0.0})
    early, diags = load(doc)
    assert early is not None, diags
    assert [d for d in verify(early).diagnostics if d.code == "E-RES-05"]
