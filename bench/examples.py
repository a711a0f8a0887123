"""Run the example kernels (row softmax, mma.sync GEMM, wgmma GEMM) on the GPU: correctness against
a float64 reference, then CUDA-event timing side by side with torch in the same process.

    python bench/examples.py [--quick] [--out bench/results/examples-h200.json]

Honesty rules (docs/evaluation): fresh seeded inputs, outputs poisoned with NaN before each checked
launch, float64 reference on the GPU computed apart from the candidate, L2 flushed before every timed
repetition, median of many CUDA-event timings, baselines timed in the same run on the same inputs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# GPU cycles of the spin kernel queued before each timed repetition (~1 ms at the H200's 1.98 GHz)
BLOCK_CYCLES = 2_000_000
# how `timed` measures, recorded in every result file's env (`timing`): results of different methods
# must not be compared or joined row by row (bench/lib_grid.py warns). Files written before the field
# existed record none: those of device calls 4-6 in bench/results/logs/session15 (and the `*-session15-call4` to
# `-call6` grids) used the spin kernel, everything earlier did not.
TIMING = "events, L2 flush, spin kernel"
TIMING_UNRECORDED = "unrecorded"


def timing_of(env: dict | None) -> str:
    """The timing method a result file's env records."""
    return (env or {}).get("timing", TIMING_UNRECORDED)


def timed(fn, flush, reps: int, warmup: int = 5, min_reps: int = 0, budget_ms: float = float("inf")):
    """Median of CUDA-event times, L2 flushed before each repetition. `reps` repetitions, or fewer once
    `min_reps` have run and their total passed `budget_ms` (slow calls in a large grid).

    A spin kernel (torch.cuda._sleep, ~1 ms) is queued after the flush and before the start event,
    so the host has queued the whole call before the GPU reaches the start event (nvbench's blocking
    kernel): the time is the GPU's, not the host's launch path. Without it, a call whose host side takes
    longer than the flush (~0.1 ms: Python, argument packing, several launches) measured the host, and
    the same kernels timed 2-4x apart on two machines (small kNN shapes; the host cost is
    measured on its own: bench/knn_host_overhead.py). Both sides of a comparison are timed alike."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    while len(times) < reps and (len(times) < min_reps or sum(times) < budget_ms):
        flush()
        torch.cuda._sleep(BLOCK_CYCLES)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return {"ms_median": statistics.median(times), "ms_min": min(times), "ms_max": max(times), "reps": len(times)}


def l2_flusher(mib: int = 512):
    """A function that writes `mib` MiB on the current GPU (more than the H200's 50 MB L2): called
    before every timed repetition so no input is read from cache."""
    import torch
    buf = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    return lambda: buf.fill_(1)


def to_torch(arr, dtype: str, dev):
    """A task's numpy input (bf16 values held as float32, f32, i32) as a torch tensor of its CAKE dtype."""
    import torch
    dt = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}[dtype]
    return torch.from_numpy(arr).to(dev).to(dt)


def compile_variants(irs: dict, arch: str = "sm_90a") -> dict:
    """name -> (CompiledKernel or CompiledProgram, compile info: registers, smem, spills, per-kernel
    details for a Program) for each IR that compiles; the others are reported."""
    from gpu_backend.candidate import compile_candidate
    from gpu_backend.runner import CompiledKernel
    out = {}
    for name, ir in irs.items():
        comp = compile_candidate(ir, arch)
        if comp.ok:
            out[name] = (CompiledKernel.from_spec(comp.spec), comp.info)
        else:
            print(f"{name}: does not compile:", [f"{d['code']} at {d['node']}: {d['message']}"
                                                  for d in comp.diagnostics if d.get("severity") == "error"][:3],
                  flush=True)
    return out


def rel_rmse(out, ref):
    """||out - ref|| / ||ref|| in float64 (torch tensors, or a numpy reference moved to out's device);
    inf when either holds a non-finite value."""
    import torch
    out64 = out.double()
    ref = torch.as_tensor(ref, device=out64.device).double()
    if not (torch.isfinite(out64).all() and torch.isfinite(ref).all()):
        return float("inf")
    return (torch.linalg.vector_norm(out64 - ref) / torch.linalg.vector_norm(ref)).item()


def env_info(packages, script: str) -> dict:
    """What a result file records about where it ran: python, date, the command line, package
    versions (None when absent) and, when a GPU answers, its name, driver and SM count."""
    import importlib.metadata as md
    info = {"python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join(["python", script] + sys.argv[1:]), "timing": TIMING}
    for pkg in packages:
        try:
            info[pkg] = md.version(pkg)
        except Exception:  # noqa: BLE001
            info[pkg] = None
    try:
        from gpu_backend.driver import properties
        p = properties(0)
        info["gpu"], info["driver"], info["sms"] = p["name"], p["driver"], p["sms"]
    except Exception:  # noqa: BLE001
        pass
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "examples-h200.json"))
    args = ap.parse_args()
    import torch

    from cake_ir.compiler import compile_kernel
    from gpu_backend.driver import properties
    from gpu_backend.runner import CompiledKernel
    from tasks.gemm.programs import gemm_mma_sm80, gemm_wgmma_sm90a
    from tasks.softmax.programs import softmax_row

    torch.manual_seed(1234)
    dev = torch.device("cuda")
    props = properties(0)
    flush = l2_flusher()

    reps = 10 if args.quick else 50
    rows = []

    # ------------------------------------------------------------------ copy ceiling
    n_copy = 2**30 // 2  # 1 GiB of bf16 read, 1 GiB written
    src = torch.randn(n_copy, device=dev, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), flush, reps)
    copy_tbps = 2 * src.numel() * 2 / (t["ms_median"] * 1e-3) / 1e12
    rows.append({"shape": {"elems": n_copy}, "impl": "torch_copy", **t, "TBps": copy_tbps, "correct": True})
    del src, dst

    # ------------------------------------------------------------------ softmax
    M, N = (8192, 4096) if args.quick else (65536, 4096)
    k = softmax_row(N)
    res = compile_kernel(k, use_cache=False)
    ck = CompiledKernel(k, res)
    X = torch.randn(M, N, device=dev, dtype=torch.float32).mul_(3).to(torch.bfloat16)
    Y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
    ref = torch.softmax(X.double(), dim=-1)
    keep = ck({"X": X, "Y": Y}, {"M": M})
    torch.cuda.synchronize()
    err = rel_rmse(Y, ref)
    ok = err <= 1e-2 and not torch.isnan(Y).any().item()
    t = timed(lambda: ck({"X": X, "Y": Y}, {"M": M}), flush, reps)
    err_after = rel_rmse(Y, ref)
    bytes_moved = 2 * M * N * 2
    rows.append({"shape": {"M": M, "N": N}, "impl": "cake_softmax_row", **t, "rel_rmse": err, "rel_rmse_after_timing": err_after,
                 "correct": bool(ok and err_after <= 1e-2), "TBps": bytes_moved / (t["ms_median"] * 1e-3) / 1e12,
                 "frac_of_copy": bytes_moved / (t["ms_median"] * 1e-3) / 1e12 / copy_tbps,
                 "registers": res.resources.get("registers")})
    tt2 = timed(lambda: torch.softmax(X, dim=-1), flush, reps)
    rows.append({"shape": {"M": M, "N": N}, "impl": "torch_softmax", **tt2, "correct": True,
                 "TBps": bytes_moved / (tt2["ms_median"] * 1e-3) / 1e12})
    rows[-2]["speedup_vs"] = {"torch_softmax": tt2["ms_median"] / t["ms_median"]}
    del X, Y, ref

    # ------------------------------------------------------------------ GEMMs
    sizes = [4096] if args.quick else [4096, 8192]
    for S in sizes:
        A = torch.randn(S, S, device=dev, dtype=torch.float32).to(torch.bfloat16)
        B = torch.randn(S, S, device=dev, dtype=torch.float32).to(torch.bfloat16)
        ref = A.double() @ B.double().T
        flops = 2 * S ** 3
        tb = timed(lambda: torch.matmul(A, B.T), flush, reps)
        torch_row = {"shape": {"M": S, "N": S, "K": S}, "impl": "torch_matmul", **tb, "correct": True,
                     "TFLOPs": flops / (tb["ms_median"] * 1e-3) / 1e12,
                     "rel_rmse": rel_rmse(torch.matmul(A, B.T), ref)}
        rows.append(torch_row)
        for name, make, arch in (("cake_gemm_wgmma", gemm_wgmma_sm90a, None), ("cake_gemm_mma_sync", gemm_mma_sm80, "sm_90a")):
            k = make()
            res = compile_kernel(k, arch=arch, use_cache=False)
            if not res.ok:
                rows.append({"shape": {"M": S, "N": S, "K": S}, "impl": name, "correct": False,
                             "error": [d.short() for d in res.diagnostics][:5]})
                continue
            ck = CompiledKernel(k.model_copy(update={"arch": arch}) if arch else k, res)
            C = torch.full((S, S), float("nan"), device=dev, dtype=torch.bfloat16)
            args_t, args_s = {"A": A, "B": B, "C": C}, {"M": S, "N": S, "K": S}
            ck(args_t, args_s)
            torch.cuda.synchronize()
            err = rel_rmse(C, ref)
            t = timed(lambda: ck(args_t, args_s), flush, reps)
            err2 = rel_rmse(C, ref)
            rows.append({"shape": {"M": S, "N": S, "K": S}, "impl": name, **t, "rel_rmse": err,
                         "rel_rmse_after_timing": err2, "correct": bool(err <= 1e-2 and err2 <= 1e-2),
                         "TFLOPs": flops / (t["ms_median"] * 1e-3) / 1e12,
                         "speedup_vs": {"torch_matmul": tb["ms_median"] / t["ms_median"]},
                         "registers": res.resources.get("registers"), "smem_bytes": res.smem_bytes})
        del A, B, ref

    import cuda.bindings
    result = {
        "gpu": props["name"], "device": props, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "versions": {"torch": torch.__version__, "cuda_bindings": cuda.bindings.__version__,
                     "python": platform.python_version()},
        "command": "python bench/examples.py" + (" --quick" if args.quick else ""),
        "ceilings": {"copy_TBps": copy_tbps},
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\n{'impl':24s} {'shape':28s} {'ms':>9s} {'rate':>12s} {'ok':>4s} {'err':>9s}  vs")
    for r in rows:
        rate = f"{r['TFLOPs']:.0f} TFLOP/s" if "TFLOPs" in r else (f"{r['TBps']:.2f} TB/s" if "TBps" in r else "")
        print(f"{r['impl']:24s} {json.dumps(r['shape']):28s} {r.get('ms_median', float('nan')):9.4f} {rate:>12s} "
              f"{str(r.get('correct')):>4s} {r.get('rel_rmse', 0):9.2e}  {r.get('speedup_vs', r.get('error', ''))}")


if __name__ == "__main__":
    main()
