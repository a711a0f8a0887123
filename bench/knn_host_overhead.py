"""Host-side cost of one library call at small kNN shapes, where the grid's timings are bound by the
launch path rather than the GPU: per shape, cakelib.knn / flashlib / torch called N times back to back
(warm, outputs reused), the host's wall time per call (perf_counter, no synchronisation inside the loop)
against the GPU's (CUDA events around the same loop); then a cProfile of cakelib.knn's calls, top
functions by own time. Prints a table last and writes JSON.
    python bench/knn_host_overhead.py [--out FILE] [--calls N]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [{"Q": 1, "M": 100000, "k": 1}, {"Q": 8, "M": 100000, "k": 10}, {"Q": 16, "M": 262144, "k": 16}]


def loop_times(fn, calls: int) -> dict:
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / calls
    end.record()
    torch.cuda.synchronize()
    return {"host_ms_per_call": host, "gpu_ms_per_call": start.elapsed_time(end) / calls}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/knn-host-overhead-h200.json")
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    from bench.examples import env_info
    from bench.lib_grid import knn_baselines, knn_inputs
    from cakelib import knn
    base = knn_baselines()
    rows = []
    for shape in SHAPES:
        xq, xb = knn_inputs(shape)
        k = shape["k"]
        row = {"shape": shape, "impls": {}}
        out = knn(xq, xb, k)
        row["impls"]["cake"] = loop_times(lambda: knn(xq, xb, k, out=out), a.calls)
        for name, fn in base.items():
            try:
                row["impls"][name] = loop_times(lambda: fn(xq, xb, k), a.calls)
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run here is reported
                row["impls"][name] = {"error": f"{type(e).__name__}: {e}"[:200]}
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            knn(xq, xb, k, out=out)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        row["profile_tottime"] = s.getvalue()
        rows.append(row)
        print(shape, {n: {m: round(v, 4) for m, v in r.items() if isinstance(v, float)} for n, r in row["impls"].items()},
              flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    json.dump({"env": env_info(("torch", "flashlib", "cuda-bindings"), "bench/knn_host_overhead.py"),
               "command": " ".join(sys.argv), "calls": a.calls, "rows": rows}, open(a.out, "w"), indent=1)
    for r in rows:
        print(f"\n== {r['shape']} (cakelib.knn, {a.calls} calls, by own time)")
        print("\n".join(r["profile_tottime"].splitlines()[:40]))
    print(f"\n{'shape':28s} {'impl':10s} {'host ms/call':>13s} {'gpu ms/call':>12s}")
    for r in rows:
        s = r["shape"]
        for n, t in r["impls"].items():
            print(f"Q={s['Q']:<4d} M={s['M']:<7d} k={s['k']:<3d}{'':8s} {n:10s} {t.get('host_ms_per_call', float('nan')):13.4f} "
                  f"{t.get('gpu_ms_per_call', float('nan')):12.4f}")


if __name__ == "__main__":
    main()
