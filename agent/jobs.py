"""Job functions that run inside evaluation workers (gpu_backend.worker.WorkerPool processes or Ray
actors). A job function takes (job dict, progress callback) and returns an EvalRecord-shaped dict.

compile_job: CPU only. Compiles a verified IR program for its own arch with NVRTC (disk cache in
CAKE_CACHE_DIR) and returns diagnostics and the resource report (registers, spills, shared memory).
With `sass_cost` ({"shape", "target"}: what a dry run sends) and nvdisasm installed it also predicts
the time from the compiled code's instruction counts (cake_ir.cost with `sass`), which ranks variants
better than the modelled counts (bench/results/cost-rank-lib-sass-cpu.json).
A Program compiles every kernel; its report takes the largest registers / shared memory and sums
spills, stack and the SASS-based prediction over the kernels.
"""
from __future__ import annotations

import os
import time


def cpu_job(job: dict, progress=None) -> dict:
    """The CPU workers' job function: a verify job ({"verify_only": true}), a cost estimate
    ({"estimate": {"shape", "target"}}) or a compile job."""
    if job.get("verify_only"):
        return verify_job(job, progress)
    if job.get("estimate"):
        return estimate_job(job, progress)
    return compile_job(job, progress)


def verify_job(job: dict, progress=None) -> dict:
    """Load + verify one program: {"status", "result": {"ok", "seconds", "diagnostics", "n_errors",
    "n_warnings"}} (what the graph's verify node stores)."""
    t0 = time.perf_counter()
    from cake_ir.io import load
    from cake_ir.verifier import verify
    kernel, diags = load(job["ir"])
    if kernel is not None:
        diags = verify(kernel).diagnostics
    errs = [d for d in diags if d.severity == "error"]
    warns = [d for d in diags if d.severity == "warning"]
    result = {"ok": not errs, "seconds": time.perf_counter() - t0,
              "diagnostics": [d.model_dump(exclude_none=True) for d in (errs + warns)[:12]],
              "n_errors": len(errs), "n_warnings": len(warns)}
    return {"candidate": job.get("name", "?"), "task": job.get("task", "?"), "stage": "compile", "status": "ok",
            "worker_pid": os.getpid(), "compile": {"verify": result}, "wall_s": result["seconds"]}


def estimate_job(job: dict, progress=None) -> dict:
    """The cost model's summary of one program (agent.candidates.cost_of) for the proposers."""
    from cake_ir.io import load

    from .candidates import cost_of
    t0 = time.perf_counter()
    want = job["estimate"]
    kernel, _ = load(job["ir"])
    cost = cost_of(kernel, want["shape"], _spec(want["target"])) if kernel is not None else {"seconds": None}
    return {"candidate": job.get("name", "?"), "task": job.get("task", "?"), "stage": "compile", "status": "ok",
            "worker_pid": os.getpid(), "compile": {"cost": cost}, "wall_s": time.perf_counter() - t0}


_SPECS: dict = {}


def _spec(target: str):
    if target not in _SPECS:
        from .campaign import _spec as load_spec
        _SPECS[target] = load_spec(target)
    return _SPECS[target]


def compile_job(job: dict, progress=None) -> dict:
    t0 = time.perf_counter()
    if progress:
        progress("compile")
    from cake_ir.compiler import compile_ir, resource_summary
    from cake_ir.io import load

    rec = {"job_id": job.get("job_id"), "candidate": job.get("name", "?"), "task": job.get("task", "?"),
           "stage": "compile", "worker_pid": os.getpid()}
    kernel, diags = load(job["ir"])
    if kernel is None:
        rec.update(status="fail", error_class="parse_error", diagnostics=[d.model_dump(exclude_none=True) for d in diags][:20],
                   message="; ".join(d.short() for d in diags[:3]), node=diags[0].node if diags else None)
        rec["wall_s"] = time.perf_counter() - t0
        return rec
    res = compile_ir(kernel, verify_first=bool(job.get("verify", False)))
    keep = [d for d in res.diagnostics if d.severity in ("error", "warning")]
    rec["diagnostics"] = [d.model_dump(exclude_none=True) for d in keep][:20]
    r = resource_summary(res)
    rec["compile"] = {"arch": res.arch, "registers": r["registers"],
                      "spill_bytes": r["spill_store_bytes"] + r["spill_load_bytes"], "stack_bytes": r["stack_bytes"],
                      "smem_bytes": r["smem_bytes"], "cached": res.cached, "seconds": res.seconds,
                      "kernel_name": r["kernel_name"]}
    if res.ok:
        rec["status"] = "ok"
        if job.get("sass_cost"):
            rec["compile"].update(_sass_cost(kernel, job["sass_cost"], res))
    else:
        errs = [d for d in res.diagnostics if d.severity == "error"]
        rec.update(status="fail", error_class="compile_error",
                   message="; ".join(d.short() for d in errs[:3]) or "compile failed",
                   node=errs[0].node if errs else None)
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _sass_cost(kernel, want: dict, compiled) -> dict:
    """{"sass_instructions", "predicted_sass_s"}, {} without nvdisasm, {"sass_error"} on a failure (the
    compile result stands either way)."""
    try:
        from cake_ir.analysis.sass import find_nvdisasm, sass_profile
        if find_nvdisasm() is None:
            return {}
        from cake_ir.cost import estimate, load_constants
        prof = sass_profile(kernel, lowered=compiled)      # its CUDA source: no second lowering
        rep = estimate(kernel, want.get("shape") or {}, load_constants(want.get("target") or kernel.arch),
                       sass={n.path: n.count for n in prof.nodes}, compiled=compiled)   # ptxas's registers
        return {"sass_instructions": prof.total, "predicted_sass_s": rep.seconds}
    except Exception as e:  # noqa: BLE001
        return {"sass_error": f"{type(e).__name__}: {e}"[:200]}
