"""Same-run A/B of the runtime's top-k insertion: every kNN kernel here built twice, once with
the runtime header as it is (`cake::topk_insert` as a shift with independent compares) and once with the
header's previous insertion (a bubble of dependent swaps, kept below as the baseline), each checked
against float64 (bench/lib_grid.py `knn_check`) and timed with CUDA events (median, L2 flushed), the two
builds alternating per shape. Prints a table last and writes JSON with the GPU and versions.
    python bench/topk_insert_ab.py [--out FILE] [--deadline-s S]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the runtime's previous insertion (cake.cuh version 3): the baseline
BUBBLE = """template <int K, bool MIN> __device__ __forceinline__ void topk_insert(float* vals, int* idx, float v, int i) {
  if (!topk_better<MIN>(v, i, vals[K - 1], idx[K - 1])) return;   // the threshold test: one compare
  vals[K - 1] = v; idx[K - 1] = i;
#pragma unroll
  for (int q = K - 1; q > 0; --q) {
    const bool s = topk_better<MIN>(vals[q], idx[q], vals[q - 1], idx[q - 1]);
    const float tv = vals[q - 1]; const int ti = idx[q - 1];
    vals[q - 1] = s ? vals[q] : tv; idx[q - 1] = s ? idx[q] : ti;
    vals[q] = s ? tv : vals[q]; idx[q] = s ? ti : idx[q];
  }
}
"""

WG = {"mma": "wgmma", "bq": 128, "bn": 64, "stages": 4}
# (shape, variant): the grid's build, batch and search regimes, with the kernels the table picks there
CASES = [({"Q": 65536, "M": 65536, "k": 8}, {**WG, "split": 1}),
         ({"Q": 65536, "M": 65536, "k": 16}, {**WG, "split": 1}),
         ({"Q": 32768, "M": 32768, "k": 32}, {**WG, "split": 1}),
         ({"Q": 16384, "M": 16384, "k": 16}, {"bq": 32, "bn": 64, "split": 1, "stages": 2, "norms": "global"}),
         ({"Q": 10000, "M": 1 << 20, "k": 10}, {"bq": 32, "bn": 64, "split": 1, "stages": 2, "norms": "global"}),
         ({"Q": 1024, "M": 1 << 20, "k": 10}, {**WG, "split": 16, "merge": "wide"}),
         ({"Q": 1024, "M": 1 << 20, "k": 16}, {**WG, "split": 16, "merge": "wide"}),
         ({"Q": 256, "M": 1 << 20, "k": 16}, {**WG, "split": 64, "merge": "wide"}),
         ({"Q": 64, "M": 1 << 20, "k": 16}, {"bq": 16, "bn": 32, "split": 32, "stages": 4, "merge": "wide", "ws": 4}),
         ({"Q": 1, "M": 1 << 20, "k": 16}, {"bq": 16, "bn": 32, "split": 128, "stages": 4, "merge": "wide", "ws": 4})]


def bubble_header(text: str) -> str:
    new, n = re.subn(r"template <int K, bool MIN> __device__ __forceinline__ void topk_insert\(.*?\n}\n", BUBBLE,
                     text, count=1, flags=re.S)
    assert n == 1, "topk_insert not found in the runtime header"
    return new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/topk-insert-ab-h200.json")
    ap.add_argument("--deadline-s", type=float, default=1e9)
    a = ap.parse_args()
    import torch
    from bench.examples import env_info
    from bench.lib_grid import Timer, knn_inputs, knn_reference, run_knn_variant
    import cake_ir.lower as lower
    import cake_ir.lower.emit as emit
    from cakelib.runtime import runtime
    shift_text = emit.header_text()
    headers = {"shift": shift_text, "bubble": bubble_header(shift_text)}
    t0 = time.time()
    timer, rows = Timer(), []
    for shape, p in CASES:
        if time.time() - t0 > a.deadline_s:
            print(f"deadline: {len(rows)} of {len(CASES)} shapes", flush=True)
            break
        xq, xb = knn_inputs(shape)
        k = shape["k"]
        ref = knn_reference(xq, xb, k)
        row = {"shape": shape, "variant": p}
        for impl in ("bubble", "shift"):
            emit.header_text = lower.header_text = (lambda t: (lambda: t))(headers[impl])
            runtime()._kernels.clear()          # this build, not the other one loaded for the same key
            ok, why, t = run_knn_variant(timer, xq, xb, k, p, ref)   # checked on poisoned outputs, then timed
            row[impl] = {"ok": ok, "why": why, **(t or {})}
        if row["bubble"]["ok"] and row["shift"]["ok"]:
            row["speedup"] = row["bubble"]["ms"] / row["shift"]["ms"]
        rows.append(row)
        print(shape, {i: (round(row[i].get("ms", float("nan")), 3), row[i]["ok"]) for i in ("bubble", "shift")},
              round(row.get("speedup", float("nan")), 3), flush=True)
        del xq, xb
        torch.cuda.empty_cache()
    emit.header_text = lower.header_text = lambda: shift_text
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    json.dump({"env": env_info(("torch", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/topk_insert_ab.py"), "rows": rows}, open(a.out, "w"), indent=1)
    print(f"\n{'shape':34s} {'variant':38s} {'bubble ms':>10s} {'shift ms':>10s} {'x':>6s}")
    for r in rows:
        s = r["shape"]
        print(f"Q={s['Q']:<6d} M={s['M']:<8d} k={s['k']:<3d}{'':12s} {json.dumps(r['variant'])[:38]:38s} "
              f"{r['bubble'].get('ms', float('nan')):10.3f} {r['shift'].get('ms', float('nan')):10.3f} "
              f"{r.get('speedup', float('nan')):6.2f}")


if __name__ == "__main__":
    main()
