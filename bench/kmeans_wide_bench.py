"""The wide k-means family on the GPU (bench/kmeans_wide_device.sh runs it): precompile, then per shape a
checked single iteration (float64 on the GPU: sampled points' nearest centroid, the centroids the means of
the own assignment) before timing 10 Lloyd iterations from the same centroids for cakelib and the baselines
(bench/lib_grid.py kmeans_baselines: flashlib flash_kmeans, flash-kmeans, torch; tol=-1, none stops early).
Rows are appended to $OUT/kmeans_wide/rows.jsonl as they finish (a crash keeps the earlier ones; --resume
skips done shapes and runs a shape whose cakelib run crashed with the baselines only).

    python bench/kmeans_wide_bench.py precompile --procs 12
    python bench/kmeans_wide_bench.py bench --out DIR --deadline-s 150 [--resume]
    python bench/kmeans_wide_bench.py summary --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

M = 1 << 20
ITERS = 10
# (B, N, D, K): training shapes (the ones the rule may be read against) and held-out ones (reported apart,
# never used to choose parameters)
TRAIN = [(1, M, 128, 1024), (1, 4 * M, 128, 4096), (16, 262144, 128, 1024), (1, M, 128, 4096),
         (1, M, 768, 1024), (1, 262144, 1024, 16384), (1, M, 256, 65536), (1, M, 64, 512), (8, 65536, 32, 256),
         (1, M, 64, 256), (1, M, 32, 1024), (1, 262144, 128, 16384), (1, 500000, 256, 4096), (4, 262144, 96, 2048),
         (1, M, 1024, 1024), (1, 2 * M, 64, 8192), (2, 131072, 512, 4096), (1, 100000, 128, 65536),
         (32, 32768, 64, 512), (1, M, 128, 2048)]
HELD = [(1, 3 * M, 128, 2048), (1, 400000, 384, 8192), (4, 500000, 64, 1024), (1, 131072, 768, 32768),
        (2, M, 160, 4096)]
MIN_D = int(os.environ.get("KMEANS_MIN_D", "0"))   # a run of the shapes from this D only (a rule change there)
TORCH_MAX_BYTES = 48 << 30      # torch's baseline materialises the [B, N, K] distances in fp16 and fp32
CHECK_POINTS = 4096


def shapes():
    """The run order: the three reference shapes first, then a held-out shape after every fourth training one
    (a deadline cut then leaves both kinds measured)."""
    out, held = [], list(HELD)
    for i, s in enumerate(TRAIN):
        out.append((s, False))
        if i % 4 == 3 and held:
            out.append((held.pop(0), True))
    return out + [(s, True) for s in held]


def precompile(procs: int, tests_only: bool = False) -> None:
    """Every wide kernel the bench and the GPU tests launch (variants_used; tests_only: the GPU tests'),
    compiled in parallel into the NVRTC cubin cache ($CAKE_CACHE_DIR) that the library's runtime reads."""
    from concurrent.futures import ProcessPoolExecutor
    from cakelib.variants import kmeans_name, kmeans_wide_kernels
    jobs = {}
    for d, p in variants_used(tests_only):
        for part in kmeans_wide_kernels(p, d, "sm_90a"):
            key = (d, part, kmeans_name(p) if part == "assign" else p.get("copies", 1) if part == "finalize" else 0)
            jobs.setdefault(key, (d, part, p))
    t0 = time.time()
    with ProcessPoolExecutor(procs) as ex:
        for (d, part, p), err in zip(jobs.values(), ex.map(_compile_one, jobs.values())):
            if err:
                print(f"compile D={d} {part} ({p}): {err}", flush=True)
    print(f"precompiled {len(jobs)} kernels in {time.time() - t0:.1f} s", flush=True)


# tests/test_kmeans_wide.py test_wide_kmeans_matches_float64's shapes and forms (what its GPU run compiles)
TEST_SHAPES = [(1, 5000, 32, 1024), (2, 3001, 96, 300), (1, 4099, 768, 1030), (1, 2000, 1024, 129), (3, 999, 64, 77),
               (1, 20011, 128, 2048), (1, 9001, 64, 2500)]
TEST_STREAMED = {"kind": "wide", "mma": "wgmma", "points": "streamed", "dc": 64, "bm": 128, "bn": 128, "stages": 4,
                 "red": 4}
TEST_TMA = {"kind": "wide", "mma": "wgmma", "points": "tma", "dc": 64, "bm": 128, "bn": 256, "stages": 4, "red": 4}
TEST_PP = {"kind": "wide", "mma": "wgmma", "points": "pingpong", "dc": 64, "bm": 256, "bn": 128, "stages": 8, "red": 4}


def variants_used(tests_only: bool = False) -> list:
    """(D, variant) of every assignment the bench (pick, alt_forms) and the GPU tests run."""
    from cakelib.variants import kmeans_wide_params
    out = []
    for (B, N, D, K), _ in ([] if tests_only else [s for s in shapes() if s[0][2] >= MIN_D]):
        pick = kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"})
        out += [(D, pick), (D, {**pick, "copies": 1}), (D, previous_pick(B, N, D, K))] \
            + ([(D, paired_form(pick))] if pick["bm"] == 256 and D <= 128 and not pick.get("points") else [])
    for B, N, D, K in TEST_SHAPES:
        s = {"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}
        pick = kmeans_wide_params(s)
        out += [(D, kmeans_wide_params(s, "sync")), (D, pick), (D, {**pick, "red": 1, "sb": 1}), (D, TEST_STREAMED),
                (D, {**pick, "copies": 8 if D < 768 else 4, "sums": "reds"})] + ([(D, B2_FORM)] if D <= 256 else []) \
            + ([(D, TEST_TMA), (D, {**TEST_TMA, "bn": 128, "stages": 6, "copies": 4})] if D >= 64 else []) \
            + ([(D, TEST_PP), (D, {**TEST_PP, "bm": 128, "bn": 256, "stages": 4, "copies": 2}),
                (D, {**TEST_PP, "wgs": 3, "bm": 192}), (D, {**TEST_PP, "wgs": 4, "copies": 2}),
                (D, {**TEST_PP, "wgs": 4, "pt": 4}), (D, {**TEST_PP, "bm": 128, "pt": 2})] if D <= 512 else []) \
            + ([(D, {**pick, "lv": True})] if pick.get("red", 1) == 4 else []) \
            + ([(D, {**pick, "acc2": True, "stages": 4,
                     "bn": 64 if pick["bm"] == 256 or pick.get("minb", 1) > 1 else pick["bn"]})]
               if pick.get("mma") == "wgmma" and D < 768 else [])
    return out


def previous_pick(B: int, N: int, D: int, K: int) -> dict:
    """The rule before the counting-sort sums (kmeans_wide_params(sorted_sums=False): the batched scatter's reds),
    timed beside the pick as the A/B where they differ."""
    from cakelib.variants import kmeans_wide_params
    return kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}, sorted_sums=False)


def paired_form(pick: dict) -> dict:
    """The resident form at two CTAs of 128 points per SM (the rule's pick up to D = 128 and K = 2048)."""
    return {**pick, "bm": 128, "bn": 128, "stages": 4, "minb": 2}


def _compile_one(job) -> str:
    d, part, p = job
    try:
        from cake_ir.compiler import compile_ir
        from cakelib.variants import kmeans_wide_kernels
        r = compile_ir(kmeans_wide_kernels(p, d, "sm_90a")[part](), arch="sm_90a")
        return "" if r.ok else "; ".join(x.short() for x in r.diagnostics if x.severity == "error")
    except Exception as e:  # noqa: BLE001
        return repr(e)


def make_inputs(B, N, D, K, seed=0):
    """Clustered fp16 points (K/4 blob centres + noise) and K distinct points per batch as the centroids."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    centres = torch.randn(B, max(1, K // 4), D, device="cuda", generator=g) * 2
    pick = torch.randint(0, centres.shape[1], (B, N), device="cuda", generator=g)
    x = (torch.gather(centres, 1, pick[..., None].expand(-1, -1, D))
         + torch.randn(B, N, D, device="cuda", generator=g)).half()
    idx = torch.stack([torch.randperm(N, device="cuda", generator=g)[:K] for _ in range(B)])
    c0 = torch.gather(x, 1, idx[..., None].expand(-1, -1, D)).contiguous()
    return x, c0


def check_step(x, c0, A, Cn) -> str:
    """"" where one iteration from c0 is right: CHECK_POINTS sampled points per batch assigned a nearest
    centroid (float64, tolerance 2e-5 of the norms; their inertia within 1e-3 of the best) and every centroid
    the float64 mean of its assigned points (rel. error <= 1e-4; empty clusters keep c0)."""
    import torch
    B, N, D = x.shape
    K = c0.shape[1]
    A = A.reshape(B, N).long()
    if (A < 0).any() or (A >= K).any():
        return "assignment out of range"
    g = torch.Generator(device="cuda").manual_seed(1)
    for b in range(B):
        s = torch.randperm(N, device="cuda", generator=g)[:CHECK_POINTS]
        xs, cd = x[b, s].double(), c0[b].double()
        d = (xs * xs).sum(1)[:, None] + (cd * cd).sum(1)[None, :] - 2.0 * xs @ cd.T
        best, got = d.min(1).values, d.gather(1, A[b, s][:, None])[:, 0]
        tol = 2e-5 * ((xs * xs).sum(1) + (cd * cd).sum(1).max())
        if (got > best + tol).any():
            return f"batch {b}: {int((got > best + tol).sum())} sampled points not assigned a nearest centroid"
        rel = float((got.sum() - best.sum()) / best.sum().clamp_min(1e-300))
        if rel > 1e-3:
            return f"batch {b}: sampled inertia {rel:.3g} over float64's"
        cnt = torch.bincount(A[b], minlength=K).double()
        sums = torch.zeros(K, D, dtype=torch.float64, device="cuda").index_add_(0, A[b], x[b].double())
        own = torch.where(cnt[:, None] > 0, sums / cnt.clamp_min(1)[:, None], cd)
        r = float(torch.linalg.vector_norm(Cn.reshape(B, K, D)[b].double() - own)
                  / torch.linalg.vector_norm(own).clamp_min(1e-300))
        if not r <= 1e-4:
            return f"batch {b}: centroids rel error {r:.3g} vs the means of the own assignment"
    return ""


B2_FORM = {"kind": "wide", "mma": "wgmma", "bm": 128, "bn": 128, "dc": 64, "stages": 2, "minb": 2}   # the GPU tests' "b2"


def guarded(fn) -> str:
    """fn() (a check's verdict), or the error it raised; where the error left the CUDA context unusable (a
    kernel faulted) the process exits with status 3 and the shell resumes the run without this shape."""
    import torch
    try:
        out = fn()
        torch.cuda.synchronize()
        return out
    except Exception as e:  # noqa: BLE001
        msg = f"error: {type(e).__name__}: {str(e)[:200]}"
        print(msg, flush=True)
        context_or_exit()
        return msg


def context_or_exit() -> None:
    import torch
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").sum().item()
    except Exception as e:  # noqa: BLE001
        print(f"CUDA context unusable ({type(e).__name__}: {str(e)[:120]}): exiting for a resume", flush=True)
        os._exit(3)


def alt_forms(x, c0, row: dict, held: bool, deadline: float) -> dict:
    """On training shapes of the wide family while time allows: the previous rule's pick (previous_pick), the
    pick with one copy of the sums where it takes more, and where the pick takes 256-point tiles up to D = 128,
    two CTAs of 128 points per SM (paired_form), each checked like the pick ->
    {name: variant} of those that pass (row["check_alt"] records every check)."""
    from cakelib import kmeans
    from cakelib.variants import kmeans_name, kmeans_wide_params
    if held or row.get("family") != "wide" or time.time() > deadline - 60:
        return {}
    B, N, D = x.shape
    K = c0.shape[1]
    pick = kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"})
    prev = previous_pick(B, N, D, K)
    forms = {"cakelib-prev": prev} if prev != pick else {}
    if pick["copies"] > 1:      # the copies' A/B: the pick with one copy of the sums
        forms["cakelib-p1"] = {**pick, "copies": 1}
    if pick["bm"] == 256 and D <= 128 and not pick.get("points"):
        forms["cakelib-b2"] = paired_form(pick)     # a CTA's scatter runs under the other's wgmma
    out, row["check_alt"] = {}, {}
    for name, p in forms.items():
        row["check_alt"][name] = (kmeans_name(p), guarded(
            lambda p=p: check_step(x, c0, *reversed(kmeans(x, K, 1, init=c0, variant=p))) or "ok"))
        if row["check_alt"][name][1] == "ok":
            out[name] = p
    return out


def time_methods(x, c0, K: int, skip_cake: bool, deadline: float, alts=None) -> dict:
    """ms of 10 Lloyd iterations per method (median of CUDA-event times, L2 flushed before each; reps fewer
    for slow calls), an error string where a method failed; methods past the deadline are not run."""
    import torch
    from cakelib import kmeans
    from examples import l2_flusher, timed
    from lib_grid import kmeans_baselines
    B, N, D = x.shape
    flush = l2_flusher()
    Cb = torch.empty(B, K, D, device="cuda", dtype=torch.float32)
    Ab = torch.empty(B, N, device="cuda", dtype=torch.int32)
    methods = {} if skip_cake else {"cakelib": lambda: kmeans(x, K, ITERS, init=c0, out=(Cb, Ab))}
    for name, p in (alts or {}).items():     # other forms, timed beside the rule's pick
        methods[name] = (lambda p=p: kmeans(x, K, ITERS, init=c0, out=(Cb, Ab), variant=p))
    base = kmeans_baselines()
    for name in ("flashlib", "flash-kmeans", "torch"):
        if name in base:
            methods[name] = (lambda f=base[name]: f(x, c0, ITERS))
    out = {}
    for name, fn in methods.items():
        if name == "torch" and B * N * K * 6 > TORCH_MAX_BYTES:
            out[name] = f"skipped: the [B, N, K] distances take {B * N * K * 6 / 2**30:.0f} GiB"
            continue
        if time.time() > deadline:
            out[name] = "skipped: deadline"
            continue
        try:
            t0 = time.time()
            fn()
            torch.cuda.synchronize()
            first = (time.time() - t0) * 1e3
            reps = 5 if first < 200 else 3 if first < 1000 else 1
            out[name] = timed(fn, flush, reps=reps, warmup=0)["ms_median"]   # (the first call warmed it)
        except Exception as e:  # noqa: BLE001 - a method that fails (OOM, unsupported D) is recorded
            out[name] = f"error: {type(e).__name__}: {str(e)[:160]}"
            print(f"{name}: {out[name]}", flush=True)
            context_or_exit()
            torch.cuda.empty_cache()
    return out


def bench_shape(shape, held: bool, skip_cake: bool, deadline: float) -> dict:
    from cakelib import kmeans
    from cakelib.variants import kmeans_family, kmeans_name, kmeans_wide_params
    B, N, D, K = shape
    row = {"B": B, "N": N, "D": D, "K": K, "held_out": held, "iters": ITERS}
    x, c0 = make_inputs(B, N, D, K)
    if not skip_cake:
        s = {"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}
        row["family"] = kmeans_family(s)
        row["variant"] = kmeans_name(kmeans_wide_params(s)) if row["family"] == "wide" else "table"
        row["check"] = guarded(lambda: check_step(x, c0, *reversed(kmeans(x, K, 1, init=c0))) or "ok")
        skip_cake = row["check"] != "ok"      # a wrong result is not timed
    row["ms"] = time_methods(x, c0, K, skip_cake, deadline, alt_forms(x, c0, row, held, deadline))
    base = [v for k, v in row["ms"].items() if not k.startswith("cakelib") and isinstance(v, float)]
    row["best_baseline_ms"] = min(base) if base else None
    row["large"] = bool(base) and min(base) > 5.0
    cake = row["ms"].get("cakelib")
    row["speedup"] = (row["best_baseline_ms"] / cake) if base and isinstance(cake, float) else None
    return row


def bench(out: Path, deadline_s: float, resume: bool) -> None:
    import torch
    t_end = time.time() + deadline_s
    out.mkdir(parents=True, exist_ok=True)
    rows_f, mark_f = out / "rows.jsonl", out / "started.txt"
    done = {tuple(json.loads(ln)["shape"]) for ln in rows_f.read_text().splitlines()} if resume and rows_f.exists() else set()
    crashed = {tuple(json.loads(ln)) for ln in mark_f.read_text().splitlines()} - done if resume and mark_f.exists() else set()
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; {len(done)} shapes done, crashed: "
          f"{sorted(crashed)}", flush=True)
    for shape, held in shapes():
        if shape[2] < MIN_D:
            continue
        if shape in done:
            continue
        if time.time() > t_end:
            print(f"deadline: {shape} and later not run", flush=True)
            break
        with mark_f.open("a") as f:
            f.write(json.dumps(list(shape)) + "\n")
        if shape in crashed:    # a fault (cakelib's or a baseline's) killed the earlier attempt: not rerun
            row = {"B": shape[0], "N": shape[1], "D": shape[2], "K": shape[3], "held_out": held, "iters": ITERS,
                   "check": "crashed: a kernel faulted in an earlier attempt (see bench.log)", "ms": {},
                   "best_baseline_ms": None, "large": False, "speedup": None}
        else:
            row = bench_shape(shape, held, False, t_end)
            torch.cuda.empty_cache()     # (the shape's inputs are gone with bench_shape's frame)
        row["shape"] = list(shape)
        with rows_f.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def summary(out: Path) -> None:
    """rows.jsonl -> kmeans-wide.json (GPU, versions, command, rows) and the table, printed last."""
    import math
    rows = [json.loads(ln) for ln in (out / "rows.jsonl").read_text().splitlines()] if (out / "rows.jsonl").exists() else []
    vers = {}
    for mod in ("torch", "triton", "flashlib", "flash_kmeans"):
        try:
            vers[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            vers[mod] = f"unavailable: {type(e).__name__}"
    try:
        import torch
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        gpu = None
    doc = {"gpu": gpu, "versions": vers,
           "command": "bash bench/kmeans_wide_device.sh", "iters": ITERS, "rows": rows}
    (out / "kmeans-wide.json").write_text(json.dumps(doc, indent=1))

    def fmt(v):
        return f"{v:9.2f}" if isinstance(v, float) else f"{str(v)[:9]:>9}"
    print(f"{'B':>3} {'N':>8} {'D':>5} {'K':>6} {'check':>6} {'cakelib':>9} {'cake-prev':>9} {'cake-b2':>9} {'flashlib':>9} "
          f"{'flash-km':>9} {'torch':>9} {'speedup':>8}  large held")
    for r in rows:
        ms = r["ms"]
        print(f"{r['B']:>3} {r['N']:>8} {r['D']:>5} {r['K']:>6} {str(r.get('check', '-'))[:6]:>6} "
              + " ".join(fmt(ms.get(m, "-")) for m in ("cakelib", "cakelib-prev", "cakelib-b2", "flashlib", "flash-kmeans", "torch"))
              + f" {fmt(r['speedup']) if r['speedup'] else '        -'}  {'L' if r['large'] else ' '}     "
              + ("H" if r["held_out"] else " "))
    for held in (False, True):
        sp = [r["speedup"] for r in rows if r["held_out"] == held and r["speedup"]]
        big = [r["speedup"] for r in rows if r["held_out"] == held and r["speedup"] and r["large"]]
        gm = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")   # noqa: E731
        print(f"{'held-out' if held else 'training'}: geomean speedup vs best baseline {gm(sp):.2f}x over {len(sp)} "
              f"shapes; large (best baseline > 5 ms): {gm(big):.2f}x over {len(big)}, min {min(big) if big else float('nan'):.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["precompile", "bench", "summary"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "kmeans_wide")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=150)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--tests-only", action="store_true", help="precompile: the GPU tests' kernels only")
    a = ap.parse_args()
    if a.mode == "precompile":
        precompile(a.procs, a.tests_only)
    elif a.mode == "bench":
        bench(a.out, a.deadline_s, a.resume)
    else:
        summary(a.out)


if __name__ == "__main__":
    main()
