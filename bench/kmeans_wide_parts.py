"""Where a wide k-means iteration's time goes: the GPU time of each kernel (norms, assignment + scatter,
finalize) from CUPTI (torch.profiler), per shape, for the rule's pick and any variants given as JSON.

    python bench/kmeans_wide_parts.py --shape 1 1048576 1024 1024 [--variant '{"kind": "wide", ...}'] [--reps 5]
    python bench/kmeans_wide_parts.py --shape ... --ncu      # two one-iteration calls only (ncu skips the first)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmeans_wide_bench import make_inputs  # noqa: E402


def kernel_times(x, c0, K: int, variant, reps: int) -> dict:
    """kernel name -> mean GPU microseconds per launch over `reps` one-iteration calls (after a
    warm call), as CUPTI records them."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from cakelib import kmeans
    kmeans(x, K, 1, init=c0, variant=variant)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            kmeans(x, K, 1, init=c0, variant=variant)
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count:
            us = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            out[ev.key] = {"us_per_launch": round(us / ev.count, 1), "launches": ev.count}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=4, required=True, metavar=("B", "N", "D", "K"))
    ap.add_argument("--variant", action="append", default=[], help="a variant's params as JSON (repeatable)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ncu", action="store_true", help="only launch: a warm call and one iteration")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import torch
    from cakelib import kmeans
    from cakelib.variants import kmeans_name, kmeans_wide_params
    B, N, D, K = a.shape
    x, c0 = make_inputs(B, N, D, K)
    variants = [json.loads(v) for v in a.variant] or [kmeans_wide_params({"B": B, "N": N, "K": K, "D": D,
                                                                          "arch": "sm_90a"})]
    if a.ncu:
        for _ in range(2):
            kmeans(x, K, 1, init=c0, variant=variants[0])
        torch.cuda.synchronize()
        return
    rows = []
    for v in variants:
        times = kernel_times(x, c0, K, v, a.reps)
        rows.append({"shape": a.shape, "variant": kmeans_name(v), "params": v, "kernels": times})
        total = sum(t["us_per_launch"] for t in times.values())
        print(f"{tuple(a.shape)} {kmeans_name(v)}: " + ", ".join(f"{k[:48]} {t['us_per_launch']:.0f} us"
                                                               for k, t in times.items()) + f" | sum {total:.0f} us")
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                                     "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
