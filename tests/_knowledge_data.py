"""A small knowledge DB with a real escape: softmax programs of 1024 threads x 8-element vectors
pass the verifier but the lowering cannot split a 4096-element row into them (E-LOWER-UNSUPPORTED
at compile), next to softmax programs that passed. Shared by the clustering / promotion / review tests."""
from __future__ import annotations

from cake_ir.io import ir_hash, load, to_dict

LOWER_MSG = "tile of 4096 elements does not split into 1024 threads x 8-element chunks"


def softmax_ir(warps: int, vec: int, tag: str = "") -> dict:
    from tasks.softmax.programs import softmax_row
    ir = to_dict(softmax_row(4096, warps=warps, vec=vec))
    if tag:
        ir["name"] = f"{ir['name']}_{tag}"   # a distinct program (hash) with the same features
    return ir


def cand(ir: dict, **kw) -> dict:
    k, _ = load(ir)
    return {"hash": ir_hash(k), "name": ir["name"], "ir": ir, "strategy": kw.pop("strategy", "explore"),
            "proposer": "search", "tactic": "explore", **kw}


def populate(store, run_id: str = "r1", task: str = "softmax", n_fail: int = 3, compile_s: float = 1.5) -> dict:
    """Run `run_id`: n_fail escapes (compile failures) and 5 passing programs; returns their hashes."""
    store.create_run(run_id, task)
    out = {"fail": [], "ok": []}
    for i in range(n_fail):
        c = cand(softmax_ir(32, 8, f"x{i}"), status="failed", stage="compile")
        store.record_stage(run_id, c, "verify", "ok", seconds=0.01)
        store.record_stage(run_id, c, "compile", "fail", seconds=compile_s, error_class="compile_error",
                           failures=[{"code": "E-LOWER-UNSUPPORTED", "node": "/roles/0/body/0", "message": LOWER_MSG}])
        out["fail"].append(c["hash"])
    for warps, vec in ((8, 8), (16, 8), (32, 4), (4, 8), (16, 4)):
        c = cand(softmax_ir(warps, vec), status="ok", stage="compile")
        store.record_stage(run_id, c, "verify", "ok", seconds=0.01)
        store.record_stage(run_id, c, "compile", "ok", seconds=1.0)
        out["ok"].append(c["hash"])
    # a verify-stage failure (already caught by the verifier: never promoted) on two candidates
    for i in range(2):
        bad = softmax_ir(8, 8, f"v{i}")
        bad["launch"]["threads"] = 250
        c = cand(bad, status="failed", stage="verify")
        store.record_stage(run_id, c, "verify", "fail", seconds=0.01,
                           failures=[{"code": "E-RES-02", "node": "/launch/threads",
                                      "message": "launch.threads = 250 must be a multiple of 32 and at most 1024"}]
                           * 2)
    store.update_run(run_id, status="finished")
    return out
