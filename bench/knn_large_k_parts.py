"""Where a large-k kNN call's time goes: the GPU time of each kernel (distance tile, selection, merge,
norms) from CUPTI (torch.profiler), per shape, next to the call's time (bench/examples.py `timed`: median of CUDA events, L2 flushed).

    python bench/knn_large_k_parts.py --shape 1000 1048576 384 50 --shape 10000 1048576 768 1024 [--out F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def kernel_times(call, reps: int) -> dict:
    """kernel name -> mean GPU microseconds per call and launches per call, over `reps` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count:
            us = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            out[ev.key] = {"us_per_call": round(us / reps, 1), "launches_per_call": ev.count / reps}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=4, action="append", required=True, metavar=("Q", "M", "D", "k"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import torch
    from bench.examples import l2_flusher, timed
    from bench.lib_grid import knn_inputs
    from cakelib import knn
    rows, flush = [], l2_flusher()
    for Q, M, D, k in a.shape:
        xq, xb = knn_inputs({"Q": Q, "M": M, "k": k}, d=D)
        call = lambda: knn(xq, xb, k)   # noqa: E731
        ms = timed(call, flush, a.reps, warmup=1)["ms_median"]
        times = kernel_times(call, a.reps)
        rows.append({"shape": {"Q": Q, "M": M, "D": D, "k": k}, "call_ms": round(ms, 3), "kernels": times})
        gemm_ms = 2 * Q * M * D / 650e12 * 1e3
        print(f"Q={Q} M={M} D={D} k={k}: {ms:.2f} ms a call (distance GEMM floor ~{gemm_ms:.2f} ms) | "
              + ", ".join(f"{n[:40]} {t['us_per_call'] / 1e3:.2f} ms x{t['launches_per_call']:g}"
                          for n, t in times.items()))
        del xq, xb
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
