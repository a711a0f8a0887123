"""The large-k kNN on the GPU (cakelib.knn at k > 32 / any D): correctness against float64 first, then
CUDA-event timing beside flashlib's flash_knn and torch's chunked matmul + topk (bench/lib_grid.py
knn_baselines), on the same inputs in the same process. One phase per process (bench/knn_topk_device.sh),
so that a fault in one leaves the others' rows:

    python bench/knn_topk_bench.py compile            # NVRTC builds of every kernel the grid needs (CPU, parallel)
    python bench/knn_topk_bench.py check OUT.json     # small shapes: k in {33, 100, 1024} x D in {64, 100, 768}, l2 + ip
    python bench/knn_topk_bench.py time OUT.json [--held] [--min-q Q] [--deadline-s S] [--check CHECK.json]
    python bench/knn_topk_bench.py warm NAME Q M D K  # one baseline call (the timing runs flashlib's first in a child)

Rows are appended to OUT.json's "rows" as they finish (the file is rewritten after each one).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GRID = [dict(Q=Q, M=M, D=D, k=k) for M in (100_000, 1_000_000) for D in (128, 768) for Q in (1, 64, 1024, 10000)
        for k in (64, 100, 256, 1024)]
# ~20 of the 64: every k and Q at least once per (M, D), the two reference points, the largest corners
PICK = [(1, 64), (64, 1024), (1024, 100), (10000, 256)]
MAIN = [s for s in GRID if (s["Q"], s["k"]) in PICK] + \
    [dict(Q=10000, M=1_000_000, D=128, k=100), dict(Q=4096, M=1_000_000, D=768, k=64),
     dict(Q=10000, M=1_000_000, D=768, k=1024), dict(Q=64, M=1_000_000, D=768, k=1024)]
MAIN = [s for i, s in enumerate(MAIN) if s not in MAIN[:i]]
HELD = [dict(Q=1000, M=1_000_000, D=384, k=50), dict(Q=100, M=1_000_000, D=384, k=500),
        dict(Q=5000, M=100_000, D=384, k=500), dict(Q=16, M=1_000_000, D=384, k=50),
        dict(Q=2000, M=500_000, D=96, k=200, metric="ip")]
CHECKS = [dict(Q=Q, M=M, D=D, k=k, metric=m) for k in (33, 100, 1024) for D in (64, 100, 768) for m in ("l2", "ip")
          for Q, M in ((5, 3000), (300, 40000))]
CHECK_ROWS = 128     # query rows checked against float64 at the timed shapes (the reference is Q x M float64)


def env() -> dict:
    import torch
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    for mod in ("flashlib", "triton"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable: {e}"
    from bench.examples import TIMING
    out["timing"] = TIMING
    return out


def save(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


# A baseline's first call at a shape (Triton build + autotune) runs in a child first, bounded by this: flashlib's
# build at k = 1024 took 14-16 s per shape and at Q = 64, M = 1M longer than a whole timing phase. The child's
# Triton cache on disk serves the parent's call after it.
WARM_S = float(os.environ.get("KNN_WARM_S", 45))   # (a run of the large shapes only can afford more)
WARMED = ("flashlib",)   # the Triton baselines (torch's first call is quick; a child costs ~5 s to start)


def warm_child(name: str, s: dict) -> None:
    """`warm NAME Q M D k`: one call of baseline NAME at the shape (inputs as the timing makes them)."""
    import torch
    from bench.knn_topk_check import make_inputs
    from bench.lib_grid import knn_baselines
    xq, xb = make_inputs(s["Q"], s["M"], s["D"])
    knn_baselines()[name](xq, xb, s["k"])
    torch.cuda.synchronize()


def warmed(name: str, s: dict, timeout: float = WARM_S) -> str:
    """'' when baseline NAME's first call at shape s finished in a child within `timeout`, else why not."""
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "warm", name] + [str(s[d]) for d in ("Q", "M", "D", "k")]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"first call (build) over {timeout:.0f} s"
    return "" if r.returncode == 0 else f"first call failed: {r.stderr.strip()[-200:]}"


def compile_all() -> None:
    """Every kernel the phases launch, built for sm_90a in parallel (the cubin cache serves the runs)."""
    from concurrent.futures import ProcessPoolExecutor
    jobs = sorted({("dist", -(-s["D"] // 8) * 8) for s in CHECKS + MAIN + HELD}
                  | {("dist_xn", -(-s["D"] // 8) * 8) for s in CHECKS + MAIN + HELD}
                  | {("dist32", -(-s["D"] // 8) * 8, n) for s in CHECKS + MAIN + HELD if s["Q"] <= 32 for n in (0, 1)}
                  | {("wgmma", -(-s["D"] // 8) * 8) for s in CHECKS + MAIN + HELD if s["D"] % 64 == 0}
                  | {("norms", -(-s["D"] // 8) * 8, "Xq") for s in CHECKS + MAIN + HELD}
                  | {("pad", s["D"]) for s in CHECKS + MAIN + HELD if s["D"] % 8}
                  | {("select", s["k"], s.get("metric", "l2"), mg) for s in CHECKS + MAIN + HELD for mg in (0, 1)},
                  key=str)
    t0 = time.time()
    with ProcessPoolExecutor(max(1, (os.cpu_count() or 4) - 2)) as ex:
        bad = [r for r in ex.map(_compile_one, jobs) if r]
    print(f"compiled {len(jobs)} kernels in {time.time() - t0:.1f} s; failures: {bad}", flush=True)


def _compile_one(job) -> str:
    from cake_ir.compiler import compile_ir
    from tasks.knn.dist_tile import knn_dist_tile, knn_dist_tile_wgmma, knn_pad_rows, knn_row_norms
    from tasks.knn.select import knn_select
    a = "sm_90a"
    ir = {"dist": lambda: knn_dist_tile(job[1], arch=a), "dist_xn": lambda: knn_dist_tile(job[1], norms=True, arch=a),
          "dist32": lambda: knn_dist_tile(job[1], norms=bool(job[-1]), bm=32, arch=a), "wgmma": lambda: knn_dist_tile_wgmma(job[1], arch=a),
          "norms": lambda: knn_row_norms(job[1], arch=a) if job[2] == "Xb" else knn_row_norms(job[1], "Xq", "R", "QN", arch=a),
          "pad": lambda: knn_pad_rows(job[1], arch=a),
          "select": lambda: knn_select(job[1], job[2], merge=bool(job[3]), arch=a)}[job[0]]()
    res = compile_ir(ir, arch=a)
    return "" if res.ok else f"{job}: {[d.short() for d in res.diagnostics][:2]}"


def check(path: str) -> None:
    """Every CHECKS shape with the default distance tile; the wgmma-eligible ones (D % 64 == 0) again with
    the mma.sync tile (cakelib.knn_large_k.DIST_WGMMA off), so that the timing can fall back to it."""
    import torch
    import cakelib
    import cakelib.knn_large_k as lk
    from bench.knn_topk_check import check_knn, make_inputs
    doc = {"env": env(), "phase": "check", "rows": []}
    runs = [(s, True) for s in CHECKS] + [(s, False) for s in CHECKS if s["D"] % 64 == 0]
    runs += [(dict(s, chunked=True), True) for s in CHECKS if s["Q"] == 300 and s["k"] != 33]
    ws = lk.KNN_LARGE_WS_WORDS
    for s, wg in runs:
        lk.DIST_WGMMA = wg
        # chunked: a workspace of 2^22 words, so that Q = 300 runs as query chunks of 128, 128 and 44 rows
        lk.KNN_LARGE_WS_WORDS = (1 << 22) if s.get("chunked") else ws
        xq, xb = make_inputs(s["Q"], s["M"], s["D"], seed=s["k"])
        row = dict(s, dist="wgmma" if wg and s["D"] % 64 == 0 and s["Q"] > 32 else "mma")
        try:
            I, Dist = cakelib.knn(xq, xb, s["k"], s["metric"])
            torch.cuda.synchronize()
            row["correct"], row["why"] = check_knn(xq, xb, I, Dist, s["k"], s["metric"])
        except Exception as e:  # noqa: BLE001
            row["correct"], row["why"] = False, f"{type(e).__name__}: {e}"[:300]
        doc["rows"].append(row)
        save(path, doc)
        print(f"check {row['dist']} {s} -> {row['correct']} {row['why']}", flush=True)
    lk.KNN_LARGE_WS_WORDS = ws


def wgmma_passed(check_path: str) -> bool:
    """Whether the check phase found the wgmma distance tile correct wherever it ran (and it ran)."""
    try:
        rows = [r for r in json.load(open(check_path))["rows"] if r.get("dist") == "wgmma"]
    except Exception:  # noqa: BLE001
        return False
    return bool(rows) and all(r["correct"] for r in rows)


def time_grid(path: str, shapes: list, deadline: float) -> None:
    import torch
    import cakelib
    from bench.knn_topk_check import check_knn, make_inputs
    from bench.lib_grid import Timer, knn_baselines
    import cakelib.knn_large_k as lk
    doc = {"env": {**env(), "dist_wgmma": lk.DIST_WGMMA}, "phase": "time", "rows": []}
    timer, base = Timer(), knn_baselines()
    shapes = sorted(shapes, key=lambda s: s["Q"] * s["M"] * s["D"])   # the cheapest first (a deadline cuts the rest)
    db_key, xb = None, None
    for s in shapes:
        row = dict(s)
        metric = s.get("metric", "l2")
        if time.time() > deadline:
            row["skipped"] = "deadline"
            doc["rows"].append(row)
            save(path, doc)
            continue
        try:
            if db_key != (s["M"], s["D"]):
                xb = None
                torch.cuda.empty_cache()
                xq, xb = make_inputs(s["Q"], s["M"], s["D"])
                db_key = (s["M"], s["D"])
            else:
                xq, _ = make_inputs(s["Q"], s["M"], s["D"], seed=s["Q"], queries_only=xb)
            k = s["k"]
            I, Dist = cakelib.knn(xq, xb, k, metric)
            torch.cuda.synchronize()
            # the first and the last rows: the first and the last query chunk (their distance tiles differ)
            h = CHECK_ROWS // 2
            rows = torch.unique(torch.cat([torch.arange(min(h, s["Q"])), torch.arange(max(s["Q"] - h, 0), s["Q"])])).cuda()
            row["correct"], row["why"] = check_knn(xq[rows], xb, I[rows], Dist[rows], k, metric)
            row["checked_rows"] = int(rows.numel())
            row["lib_ms"] = timer(lambda: cakelib.knn(xq, xb, k, metric))["ms"]
            print(f"  {s} lib {row['lib_ms']:.3f} ms correct={row['correct']}", flush=True)
            if metric == "l2":
                for name, fn in base.items():
                    why = warmed(name, s) if name in WARMED else ""
                    if why:   # the row has no time for this baseline: the table reports it apart
                        row[f"{name}_error"] = why
                        print(f"  {s} {name}: {why}", flush=True)
                        continue
                    try:
                        t1 = time.time()
                        row[f"{name}_ms"] = timer(lambda: fn(xq, xb, k))["ms"]
                        print(f"  {s} {name} {row[f'{name}_ms']:.3f} ms ({time.time() - t1:.0f} s wall)", flush=True)
                    except Exception as e:  # noqa: BLE001
                        row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        doc["rows"].append(row)
        save(path, doc)
        print(f"time {row}", flush=True)


def main() -> None:
    phase = sys.argv[1]
    if phase == "compile":
        return compile_all()
    if phase == "warm":
        Q, M, D, k = (int(x) for x in sys.argv[3:7])
        return warm_child(sys.argv[2], {"Q": Q, "M": M, "D": D, "k": k})
    path = sys.argv[2]
    if phase == "check":
        return check(path)
    deadline = float(sys.argv[sys.argv.index("--deadline-s") + 1]) if "--deadline-s" in sys.argv else 1e9
    if "--check" in sys.argv:   # the wgmma tile only where the check phase passed it
        import cakelib.knn_large_k as lk
        lk.DIST_WGMMA = wgmma_passed(sys.argv[sys.argv.index("--check") + 1])
        print(f"wgmma distance tile: {lk.DIST_WGMMA}", flush=True)
    shapes = HELD if "--held" in sys.argv else MAIN
    if "--min-q" in sys.argv:   # only the shapes with at least this many queries (a phase of their own)
        min_q = int(sys.argv[sys.argv.index("--min-q") + 1])
        shapes = [s for s in shapes if s["Q"] >= min_q]
    time_grid(path, shapes, time.time() + deadline)


if __name__ == "__main__":
    main()
