"""Host-side cost of one library call at small kNN and k-means shapes, where a call is bound by the launch
path rather than the GPU: cakelib (a repeated call's launch plan, with and without out=, and the general
path, forced by passing the variant the table picks) against flashlib, side by side.

    python bench/knn_host_overhead.py check --out FILE          # correctness first (float64 references)
    python bench/knn_host_overhead.py time --check FILE --out FILE [--calls N] [--deadline-s S]
    python bench/knn_host_overhead.py --out FILE                # both (the check in a child process)

`check` runs each cakelib form (general path, planned, planned with out=, planned with fresh input
tensors) against float64 references (bench/lib_grid.py knn_check / kmeans_check; k-means at iters=10 against
the general path). `time` times only what passed, per implementation:
  host_us  perf_counter over N back-to-back calls, no synchronisation (the host's cost of a call), the
           median of HOST_REPEATS such loops
  loop_us  CUDA events around the same loop (throughput: the larger of host and GPU time per call)
  gpu_us   CUDA events around N calls enqueued behind torch.cuda._sleep (the GPU busy while the host
           enqueues): the device's own time per call, back to back, warm L2
  e2e_us   median over calls of call + synchronize (the end-to-end view of one blocking call)
per kNN shape the planned out= call's parts in loops of their own (the plan's cuLaunchKernel calls alone,
as the plan fires them (from C where built), through cuda.bindings and through ctypes; cuCtxSetCurrent; two torch.empty; the raw stream
read), and a cProfile of cakelib.knn's planned calls (top functions by own time). JSON is rewritten after
each row; the table prints last.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KNN = [(4096, 33, 128, 10), (3, 50, 128, 10), (1, 100000, 128, 1), (8, 100000, 128, 10)]
KMEANS = [(1, 4096, 128, 8), (1, 1024, 128, 16)]
ITERS = (1, 10)


# ------------------------------------------------------------------------------------ checks
def _plans():
    from cakelib.runtime import _RUNTIMES
    rt = _RUNTIMES.get(0)
    return rt.plans if rt is not None else {}


def _planned_count() -> int:
    return sum(1 for p in _plans().values() if getattr(p, "launch", None) is not None
               or getattr(p, "first", None) is not None)


def check_knn(Q, M, D, k) -> dict:
    import torch
    from bench.lib_grid import knn_check, knn_inputs, knn_reference
    from cakelib import knn
    xq, xb = knn_inputs({"Q": Q, "M": M})
    ref = knn_reference(xq, xb, k)
    res, before = {}, _planned_count()
    res["general"] = knn_check(xq, xb, *knn(xq, xb, k), k, ref)
    res["planned_recorded"] = _planned_count() > before
    res["planned"] = knn_check(xq, xb, *knn(xq, xb, k), k, ref)
    out = (torch.empty(Q, k, dtype=torch.int32, device="cuda"), torch.empty(Q, k, dtype=torch.float32, device="cuda"))
    knn(xq, xb, k, out=out)
    out[0].fill_(-1)
    out[1].fill_(float("nan"))
    I, Dist = knn(xq, xb, k, out=out)
    res["planned_out"] = knn_check(xq, xb, I, Dist, k, ref) if I is out[0] else (False, "out= not returned")
    xq2, xb2 = xq.clone(), xb.clone()        # new pointers, same plan
    res["planned_new_inputs"] = knn_check(xq2, xb2, *knn(xq2, xb2, k), k, ref)
    torch.cuda.synchronize()
    return res


def check_kmeans(B, N, D, K) -> dict:
    import torch
    from bench.lib_grid import kmeans_check, kmeans_inputs
    from cakelib import kmeans
    x, c = kmeans_inputs({"B": B, "N": N, "K": K})
    res, before = {}, _planned_count()
    C, A = kmeans(x, K, 1, init=c)
    res["general_1"] = kmeans_check(x, c, A, C)
    res["planned_recorded"] = _planned_count() > before
    C, A = kmeans(x, K, 1, init=c)
    res["planned_1"] = kmeans_check(x, c, A, C)
    Cg, Ag = kmeans(x, K, 10, init=c)        # general path (records the iters=10 plan)
    Cp, Ap = kmeans(x, K, 10, init=c.clone())
    agree = float((Ag == Ap).float().mean())
    rel = float(torch.linalg.vector_norm(Cg - Cp) / torch.linalg.vector_norm(Cg).clamp_min(1e-30))
    # reported, not gating the timing: the update's float atomics may order sums differently run to run
    res["planned_10_vs_general"] = {"ok": agree >= 0.999 and rel <= 1e-3,
                                    "msg": f"assignments agree {agree:.5f}, centroids rel {rel:.2e}"}
    torch.cuda.synchronize()
    return res


def run_checks(out_path: str) -> None:
    rows = []
    for Q, M, D, k in KNN:
        rows.append(_guarded("knn", {"Q": Q, "M": M, "D": D, "k": k}, lambda: check_knn(Q, M, D, k)))
        _dump(out_path, {"rows": rows})
    for B, N, D, K in KMEANS:
        rows.append(_guarded("kmeans", {"B": B, "N": N, "D": D, "K": K}, lambda: check_kmeans(B, N, D, K)))
        _dump(out_path, {"rows": rows})
    for r in rows:
        print(f"check {r['op']:6s} {list(r['shape'].values())} ok={r['ok']} {r.get('error', '')}"
              f"{json.dumps(r.get('results', ''))[:400]}", flush=True)


def _guarded(op, shape, fn) -> dict:
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001 - recorded; the timing skips what did not pass
        return {"op": op, "shape": shape, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    ok = all(v[0] for v in res.values() if isinstance(v, tuple))   # the float64 checks; the rest is reported
    return {"op": op, "shape": shape, "ok": ok, "results": {n: list(v) if isinstance(v, tuple) else v
                                                            for n, v in res.items()}}


# ------------------------------------------------------------------------------------ timing
HOST_REPEATS = 7   # host_us: the median of this many loops (one loop of 100 calls swings ~30% on a VM)


def host_loop_us(fn, calls: int) -> float:
    """perf_counter over `calls` back-to-back calls, from an idle GPU (us per call)."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return dt


def times(fn, calls: int, cycles_per_us: float) -> dict:
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    first = (time.perf_counter() - t0) * 1e6 / calls
    end.record()
    torch.cuda.synchronize()
    loop = start.elapsed_time(end) * 1e3 / calls
    host = statistics.median([first] + [host_loop_us(fn, calls) for _ in range(HOST_REPEATS - 1)])
    torch.cuda._sleep(int(min(2e9, 2.0 * host * calls * cycles_per_us + 1e5)))   # busy while the host enqueues
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) * 1e3 / calls
    e2e = []
    for _ in range(max(20, calls // 4)):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        e2e.append((time.perf_counter() - t) * 1e6)
    return {"host_us": host, "loop_us": loop, "gpu_us": gpu, "e2e_us": statistics.median(e2e)}


def knn_impls(Q, M, D, k, ok: bool) -> dict:
    import torch
    from bench.lib_grid import knn_inputs
    from cakelib import knn
    from cakelib.runtime import choose, runtime
    xq, xb = knn_inputs({"Q": Q, "M": M})
    impls = {}
    if ok:
        _, p = choose("knn", {"Q": Q, "M": M, "k": k, "D": D, "arch": runtime(0).arch})
        out = (torch.empty(Q, k, dtype=torch.int32, device="cuda"), torch.empty(Q, k, dtype=torch.float32, device="cuda"))
        impls["cake"] = lambda: knn(xq, xb, k)
        impls["cake_out"] = lambda: knn(xq, xb, k, out=out)
        impls["cake_general"] = lambda: knn(xq, xb, k, variant=p, out=out)
    try:
        from flashlib import flash_knn
        impls["flashlib"] = lambda: flash_knn(xq, xb, k)
    except Exception as e:  # noqa: BLE001
        print(f"flashlib knn unavailable: {e}", flush=True)
    return impls


def kmeans_impls(B, N, D, K, iters, ok: bool) -> dict:
    import torch
    from bench.lib_grid import kmeans_inputs
    from cakelib import kmeans
    from cakelib.runtime import choose, runtime
    x, c = kmeans_inputs({"B": B, "N": N, "K": K})
    impls = {}
    if ok:
        _, p = choose("kmeans", {"B": B, "N": N, "K": K, "D": D, "arch": runtime(0).arch})
        out = (torch.empty(B, K, D, dtype=torch.float32, device="cuda"), torch.empty(B, N, dtype=torch.int32, device="cuda"))
        impls["cake"] = lambda: kmeans(x, K, iters, init=c)
        impls["cake_out"] = lambda: kmeans(x, K, iters, init=c, out=out)
        impls["cake_general"] = lambda: kmeans(x, K, iters, init=c, variant=p, out=out)
    try:
        from flashlib import flash_kmeans as fl
        c_fl = c.clone()   # its own start (flashlib may write init_centroids)
        impls["flashlib"] = lambda: fl(x, K, max_iters=iters, tol=-1.0, init_centroids=c_fl)
    except Exception as e:  # noqa: BLE001
        print(f"flashlib kmeans unavailable: {e}", flush=True)
    return impls


def knn_breakdown(Q, M, D, k, calls: int) -> dict:
    """The planned out= call's parts, each in a loop of its own (host us per call): the driver launches
    alone (the plan's fire: from C where its C form was built, `native`; and through cuda.bindings, per
    kernel of the plan, into the same live buffers),
    cuCtxSetCurrent, the two torch.empty a call without out= makes, as an A/B one allocation unbound into both
    (_paired_outputs), and the raw stream read."""
    import torch
    from bench.lib_grid import knn_inputs
    from cakelib import fast_calls, knn
    from cakelib.launch_plan import Torch, set_context
    from cakelib.runtime import _RUNTIMES
    xq, xb = knn_inputs({"Q": Q, "M": M})
    out = (torch.empty(Q, k, dtype=torch.int32, device="cuda"), torch.empty(Q, k, dtype=torch.float32, device="cuda"))
    knn(xq, xb, k, out=out)
    knn(xq, xb, k, out=out)
    rt = _RUNTIMES[0]
    plan = rt.plans.get(fast_calls._knn_key(xq, xb, k, "l2", out, Torch.raw_stream(0)))
    if plan is None or plan.launch is None:
        return {"error": "no plan"}

    def per_call(fn):
        fn()
        return statistics.median(host_loop_us(fn, calls) for _ in range(HOST_REPEATS))
    dev = xq.device
    try:
        ctypes_fire = _ctypes_fire(plan.launch.calls)
        ctypes_us = per_call(ctypes_fire)
    except Exception as e:  # noqa: BLE001 - an A/B that cannot run here is reported
        ctypes_us = f"{type(e).__name__}: {e}"[:120]
    launch = plan.launch
    return {"kernels": len(launch.calls), "native": launch.native is not None, "fire_us": per_call(launch.fire),
            "fire_bindings_us": per_call(launch.fire_bindings),
            "fire_ctypes_us": ctypes_us,
            "set_context_us": per_call(lambda: set_context(rt.ctx)),
            "two_empty_us": per_call(lambda: (torch.empty((Q, k), dtype=torch.int32, device=dev),
                                              torch.empty((Q, k), dtype=torch.float32, device=dev))),
            "paired_empty_us": per_call(lambda: _paired_outputs((Q, k), dev)),
            **alloc_forms((Q, k), dev, per_call),
            "raw_stream_us": per_call(lambda: Torch.raw_stream(0)),
            "call_out_us": per_call(lambda: knn(xq, xb, k, out=out)),
            "call_us": per_call(lambda: knn(xq, xb, k)),
            "empty_loop_us": per_call(lambda: None)}


def alloc_forms(shape, dev, per_call) -> dict:
    """Other ways to make the two fresh results (host us per pair): new_empty of a template of each dtype,
    empty_like of a template of the results' shape (dense, and the library's one element expanded),
    torch.empty with the device as an index; views of one allocation of 32 results per dtype (unbind),
    handed out in turn; one result alone by torch.empty and by new_empty."""
    import torch
    ti, tf = torch.empty(0, dtype=torch.int32, device=dev), torch.empty(0, dtype=torch.float32, device=dev)
    li, lf = torch.empty(shape, dtype=torch.int32, device=dev), torch.empty(shape, dtype=torch.float32, device=dev)
    one = (1,) * len(shape)   # the library's templates: one element expanded to the shape
    ei = torch.empty(one, dtype=torch.int32, device=dev).expand(*shape)
    ef = torch.empty(one, dtype=torch.float32, device=dev).expand(*shape)
    i32, f32, idx = torch.int32, torch.float32, dev.index
    empty, empty_like = torch.empty, torch.empty_like
    pool = []

    def pooled(R=32):   # R results of each dtype per allocation, handed out one view each
        if not pool:
            pool.extend(zip(empty((R,) + shape, dtype=i32, device=dev).unbind(0),
                            empty((R,) + shape, dtype=f32, device=dev).unbind(0)))
        return pool.pop()
    return {"pooled_views_us": per_call(pooled),
            "two_new_empty_us": per_call(lambda: (ti.new_empty(shape), tf.new_empty(shape))),
            "two_empty_like_us": per_call(lambda: (empty_like(li), empty_like(lf))),
            "two_empty_like_expanded_us": per_call(lambda: (empty_like(ei), empty_like(ef))),
            "two_empty_index_us": per_call(lambda: (empty(shape, dtype=i32, device=idx),
                                                    empty(shape, dtype=f32, device=idx))),
            "one_empty_us": per_call(lambda: empty(shape, dtype=i32, device=dev)),
            "one_new_empty_us": per_call(lambda: ti.new_empty(shape))}


def _paired_outputs(shape, device):
    """Both results from one allocation: torch.empty of [2, *shape] int32, unbind, a float32 view of the second
    (the A/B against the library's two torch.empty)."""
    import torch
    both = torch.empty((2,) + shape, dtype=torch.int32, device=device).unbind(0)
    return both[0], both[1].view(torch.float32)


def _ctypes_fire(calls):
    """The same launches through libcuda's cuLaunchKernel by ctypes (an A/B of cuda.bindings' wrapper
    cost per launch; the library launches through cuda.bindings)."""
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuLaunchKernel
    u = ctypes.c_uint
    f.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = ctypes.c_int
    raw = [(int(fn), gx, gy, gz, bx, by, bz, smem, int(stream), addr, None)
           for fn, gx, gy, gz, bx, by, bz, smem, stream, addr, _ in calls]

    def fire():
        for a in raw:
            err = f(*a)
            if err:
                raise RuntimeError(f"cuLaunchKernel (ctypes) returned {err}")
    return fire


def knn_profile(Q, M, D, k, calls: int) -> str:
    from bench.lib_grid import knn_inputs
    from cakelib import knn
    xq, xb = knn_inputs({"Q": Q, "M": M})
    knn(xq, xb, k)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        knn(xq, xb, k)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    return s.getvalue()


def run_timing(a) -> None:
    import torch
    from bench.examples import env_info
    from gpu_backend.driver import properties
    t0 = time.time()
    passed = _passed(a.check)
    cycles_per_us = properties(0)["clock_khz"] / 1e3
    env = env_info(("torch", "flashlib", "cuda-bindings", "triton"), "bench/knn_host_overhead.py")
    res = {"env": env, "command": " ".join(sys.argv), "calls": a.calls, "check": a.check, "rows": [], "skipped": []}
    jobs = [("knn", {"Q": Q, "M": M, "D": D, "k": k}, lambda Q=Q, M=M, D=D, k=k, ok=None: knn_impls(Q, M, D, k, ok))
            for Q, M, D, k in KNN]
    jobs += [("kmeans", {"B": B, "N": N, "D": D, "K": K, "iters": it},
              lambda B=B, N=N, D=D, K=K, it=it, ok=None: kmeans_impls(B, N, D, K, it, ok))
             for B, N, D, K in KMEANS for it in ITERS]
    for op, shape, make in jobs:
        if time.time() - t0 > a.deadline_s:
            res["skipped"].append({"op": op, "shape": shape, "why": "deadline"})
            continue
        ok = passed.get((op, tuple(v for n, v in shape.items() if n != "iters")), False)
        row = {"op": op, "shape": shape, "cake_checked": ok, "impls": {}}
        for name, fn in make(ok=ok).items():
            if time.time() - t0 > a.deadline_s:
                row["impls"][name] = {"error": "deadline"}
                continue
            try:
                row["impls"][name] = times(fn, a.calls, cycles_per_us)
            except Exception as e:  # noqa: BLE001 - an implementation that cannot run here is reported
                row["impls"][name] = {"error": f"{type(e).__name__}: {e}"[:200]}
                torch.cuda.synchronize()
        if op == "knn" and ok and time.time() - t0 < a.deadline_s:
            try:
                row["breakdown"] = knn_breakdown(*shape.values(), a.calls)
            except Exception as e:  # noqa: BLE001
                row["breakdown"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        res["rows"].append(row)
        _dump(a.out, res)
        print(op, shape, {n: round(t.get("host_us", float("nan")), 1) for n, t in row["impls"].items()}, flush=True)
    if time.time() - t0 < a.deadline_s and passed.get(("knn", (3, 50, 128, 10))):
        res["profile_knn_3x50"] = knn_profile(3, 50, 128, 10, a.calls)
        _dump(a.out, res)
        print("\n== cakelib.knn Q=3 M=50 k=10, planned calls, by own time")
        print("\n".join(res["profile_knn_3x50"].splitlines()[:30]))
    print_table(res)


def _passed(path: str) -> dict:
    try:
        rows = json.load(open(path))["rows"]
    except Exception as e:  # noqa: BLE001 - no check file: cakelib is not timed
        print(f"no check results ({e}): cakelib rows skipped", flush=True)
        return {}
    return {(r["op"], tuple(r["shape"].values())): bool(r["ok"]) for r in rows}


def print_table(res: dict) -> None:
    print(f"\n{'op':6s} {'shape':26s} {'impl':13s} {'host us':>8s} {'loop us':>8s} {'gpu us':>8s} {'e2e us':>8s}")
    for r in res["rows"]:
        s = r["shape"]
        label = (f"Q={s['Q']} M={s['M']} k={s['k']}" if r["op"] == "knn"
                 else f"N={s['N']} K={s['K']} it={s['iters']}")
        for n, t in r["impls"].items():
            if "error" in t:
                print(f"{r['op']:6s} {label:26s} {n:13s} {t['error'][:60]}")
                continue
            print(f"{r['op']:6s} {label:26s} {n:13s} {t['host_us']:8.1f} {t['loop_us']:8.1f} {t['gpu_us']:8.1f} "
                  f"{t['e2e_us']:8.1f}")
    print("\ncakelib.knn planned out= call, parts in loops of their own (host us per call):")
    for r in res["rows"]:
        b = r.get("breakdown")
        if b:
            print(f"  Q={r['shape']['Q']} M={r['shape']['M']} k={r['shape']['k']}: "
                  + ", ".join(f"{n}={v:.2f}" if isinstance(v, float) else f"{n}={v}" for n, v in b.items()))
    for s in res["skipped"]:
        print(f"skipped {s}")


def _dump(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    json.dump(obj, open(tmp, "w"), indent=1)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="all", choices=("check", "time", "all"),
                    help="all: check (in a child process, its JSON next to --out) then time")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", default="", help="time: the check run's JSON (cakelib rows only where it passed)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--deadline-s", type=float, default=40.0)
    a = ap.parse_args()
    if a.mode == "check":
        run_checks(a.out)
        return
    if a.mode == "all":
        import subprocess
        a.check = a.check or os.path.splitext(a.out)[0] + "-check.json"
        subprocess.run([sys.executable, os.path.abspath(__file__), "check", "--out", a.check], check=False)
    run_timing(a)


if __name__ == "__main__":
    main()
