"""The library's own host work per small knn / kmeans call, on the CPU: the call runs against the doubles
of tests/launch_doubles.py (a minimal torch, a driver whose cuLaunchKernel only returns success), so the
time is cakelib's Python between the call and the driver, without torch's or the driver's own costs
(bench/host_overhead_device.sh measures those on the GPU). Run it on two trees to compare:
    PYTHONPATH=/work/main python bench/host_path_cpu.py --label before
    PYTHONPATH=$PWD python bench/host_path_cpu.py --label after
The double's torch.empty hands out a fresh pointer per tensor (no caching allocator), so the general
path's prepared-launch cache (keyed by pointers) misses on every call that allocates its outputs; the
out= rows (and "general", the general path forced by an explicit variant, with out=) compare like with like.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

KNN = [(4096, 33, 128, 10), (3, 50, 128, 10), (1, 100000, 128, 1), (8, 100000, 128, 10)]
KMEANS = [(1, 4096, 128, 8, 1), (1, 4096, 128, 8, 10), (1, 1024, 128, 16, 1), (1, 1024, 128, 16, 10)]


def per_call_us(fn, calls: int) -> float:
    fn()
    fn()
    return min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from launch_doubles import FakeTensor, install

    import cakelib
    from cakelib import kmeans, knn
    from cakelib.runtime import choose
    _, torch = install(setattr, lambda d, k, v: d.__setitem__(k, v), record=False)
    rows = []
    for Q, M, D, k in KNN:
        xq, xb = FakeTensor((Q, D), torch.float16), FakeTensor((M, D), torch.float16)
        out = (FakeTensor((Q, k), torch.int32), FakeTensor((Q, k), torch.float32))
        rows.append({"op": "knn", "shape": [Q, M, D, k], "form": "fresh outputs", "us": per_call_us(lambda: knn(xq, xb, k), a.calls)})
        rows.append({"op": "knn", "shape": [Q, M, D, k], "form": "out=",
                     "us": per_call_us(lambda: knn(xq, xb, k, out=out), a.calls)})
        _, p = choose("knn", {"Q": Q, "M": M, "k": k, "D": D, "arch": "sm_90a"})
        rows.append({"op": "knn", "shape": [Q, M, D, k], "form": "general out=",
                     "us": per_call_us(lambda: knn(xq, xb, k, variant=p, out=out), a.calls)})
    for B, N, D, K, iters in KMEANS:
        x, c = FakeTensor((B, N, D), torch.float16), FakeTensor((B, K, D), torch.float16)
        rows.append({"op": "kmeans", "shape": [B, N, D, K], "iters": iters,
                     "us": per_call_us(lambda: kmeans(x, K, iters, init=c), a.calls)})
    res = {"label": a.label, "note": __doc__, "cakelib": cakelib.__file__, "calls": a.calls, "rows": rows}
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    for r in rows:
        extra = r["form"] if r["op"] == "knn" else f"iters={r['iters']}"
        print(f"{a.label:8s} {r['op']:7s} {str(r['shape']):24s} {extra:14s} {r['us']:8.2f} us/call")


if __name__ == "__main__":
    main()
