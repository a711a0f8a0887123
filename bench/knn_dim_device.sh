#!/bin/bash
# kNN at any D (the D-chunked wgmma variants, cakelib.variants knn_dk_pick) on one H200, results under $OUT/knn:
#   1. precompile (all cores) the picks of the grid's shapes and the GPU tests' kernels;
#   2. the GPU tests of tests/test_knn_dim.py (float64 reference, odd D too, the mma.sync forms) in a child process;
#   3. the grid: 24 training shapes (D 256 / 384 / 768 / 960 / 1024, Q 1 .. 10000, M 100K / 1M, k 10 / 32) and 6
#      held-out ones (D 512 / 640 / 100 / 33, never used to choose parameters): each checked against float64
#      (its first 256 queries: recall 1.0 allowing ties, distances within lib_grid's allowance) before
#      cakelib.knn, flashlib flash_knn and torch are timed side by side (lib_grid Timer: CUDA events, L2
#      flushed, median); rows -> $OUT/knn/dim-grid.json (lib_grid `summary` reads it);
#   4. with the time left, a sweep of neighbouring variants (bq, bn, dk, stages, split) on the training shapes
#      -> $OUT/knn/dim-sweep.json (rows: shape, variant, params, ms, ok), for refitting knn_dk_pick.
# A shape whose kernel faults kills only its child process: the grid resumes after it (recorded as crashed).
#     OUT=/some/dir bash bench/knn_dim_device.sh [DEADLINE_S=180]
. "$(dirname "$0")/device_env.sh"
DEADLINE=${1:-180}
export KD_OUT=$D KD_T0=$T0 KD_DEADLINE=$DEADLINE KD_NP=$NP
cat > $D/knn_dim_grid.py <<'EOF'
import json, os, sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
OUT, T0, DEADLINE, NP = os.environ["KD_OUT"], int(os.environ["KD_T0"]), int(os.environ["KD_DEADLINE"]), int(os.environ["KD_NP"])
TRAIN = [(256, 1, 1 << 20, 10), (256, 16, 100_000, 32), (256, 128, 1 << 20, 10), (256, 1024, 1 << 20, 32),
         (256, 10_000, 100_000, 10), (384, 1, 100_000, 32), (384, 16, 1 << 20, 10), (384, 128, 100_000, 10),
         (384, 1024, 1 << 20, 10), (384, 10_000, 100_000, 32), (768, 1, 1 << 20, 32), (768, 16, 100_000, 10),
         (768, 128, 1 << 20, 32), (768, 1024, 1 << 20, 10), (768, 10_000, 100_000, 10), (1024, 1, 100_000, 10),
         (1024, 16, 1 << 20, 32), (1024, 128, 100_000, 32), (1024, 1024, 100_000, 10), (1024, 10_000, 100_000, 32),
         (960, 1, 1 << 20, 10), (960, 128, 1 << 20, 10), (960, 1024, 1 << 20, 32), (960, 10_000, 100_000, 10)]
HELD = [(512, 64, 500_000, 10), (640, 1000, 300_000, 32), (100, 10_000, 1 << 20, 10), (100, 1, 1 << 20, 32),
        (512, 4096, 200_000, 10), (33, 256, 1 << 20, 10)]
CHECK_Q = 256   # queries checked against float64 (each query's reference is independent of the others)


def left() -> float:
    return DEADLINE - (time.time() - T0)


def shape_of(t, held):
    D, Q, M, k = t
    return {"D": D, "Q": Q, "M": M, "k": k, "held_out": held}


def pick(s):
    from cakelib.knn_search import _route
    return _route({"Q": s["Q"], "M": s["M"], "k": s["k"], "D": s["D"] + s["D"] % 2, "arch": "sm_90a"}, False)[1]


def compile_job(job):
    from cake_ir.compiler import compile_ir
    from cakelib.variants import knn_kernel
    p, k, d = job
    try:
        res = compile_ir(knn_kernel(p, k, "l2", d, "sm_90a"), arch="sm_90a")
        return "" if res.ok else "compile failed"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:200]


def precompile(jobs):
    from concurrent.futures import ProcessPoolExecutor
    uniq = {json.dumps(j, sort_keys=True): j for j in jobs}
    with ProcessPoolExecutor(NP) as ex:
        errs = [e for e in ex.map(compile_job, list(uniq.values())) if e]
    print(f"precompiled {len(uniq)} builds, {len(errs)} failed {errs[:3]}", flush=True)


def inputs(D, Q, M, seed=0):
    """lib_grid's kNN inputs (clustered database, duplicate rows, queries near and on rows) at any D."""
    from lib_grid import knn_inputs
    return knn_inputs({"Q": Q, "M": M}, seed, D)


def key(s):
    return f"D{s['D']}_Q{s['Q']}_M{s['M']}_k{s['k']}"


def run_grid(path):
    import torch
    from cakelib import knn
    from cakelib.variants import knn_name
    from lib_grid import Timer, knn_baselines, knn_check, knn_reference, time_baselines
    done, started = set(), set()
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            (started if "start" in r else done).add(r.get("start") or key(r["shape"]))
    shapes = [shape_of(t, False) for t in TRAIN] + [shape_of(t, True) for t in HELD]
    shapes = shapes[0::3] + shapes[1::3] + shapes[2::3]   # a spread first: a run cut by the deadline covers every D
    timer, base = Timer(), knn_baselines()
    with open(path, "a") as f:
        for s in shapes:
            kk = key(s)
            if kk in done:
                continue
            if kk in started:   # the child died on it
                f.write(json.dumps({"shape": s, "ok": False, "why": "crashed (the process died)"}) + "\n")
                f.flush()
                continue
            if left() < 8:
                print(f"deadline: stopping before {kk}", flush=True)
                return
            f.write(json.dumps({"start": kk}) + "\n")
            f.flush()
            row = {"shape": s}
            try:
                p = pick(s)
                row["variant"], row["params"] = knn_name(p), p
                xq, xb = inputs(s["D"], s["Q"], s["M"])
                k = s["k"]
                I, Dv = knn(xq, xb, k)
                n = min(CHECK_Q, s["Q"])
                row["ok"], row["why"] = knn_check(xq[:n], xb, I[:n], Dv[:n], k, knn_reference(xq[:n], xb, k))
                row["lib_ms"] = timer(lambda: knn(xq, xb, k))["ms"] if row["ok"] else None
                time_baselines(timer, {b: (lambda f=f: f(xq, xb, k)) for b, f in base.items()}, row, row.get("lib_ms"))
                row["floor_ms"] = 2 * s["Q"] * s["M"] * s["D"] / 600e12 * 1e3
                del xq, xb
            except Exception as e:  # noqa: BLE001
                row["ok"], row["why"] = False, f"{type(e).__name__}: {e}"[:300]
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            print(f"{kk:28s} {row.get('variant', '-'):40s} ok={row.get('ok')} lib={row.get('lib_ms')} "
                  f"base={row.get('baselines')} x{row.get('speedup', float('nan')):.2f} t={time.time() - T0:.0f}s "
                  f"{row.get('why', '')}", flush=True)
            torch.cuda.empty_cache()


def neighbours(p, s):
    """Variants next to the pick (one parameter changed), within the domain."""
    from cakelib.variants import knn_supports
    out = []
    alts = {"bq": (64, 128), "bn": (64, 128, 256), "dk": (64, 128), "stages": (3, 4),
            "split": tuple(x for x in (p["split"] // 2, p["split"] * 2) if x >= 1), "norms": ("global", "tile")}
    shp = {"Q": s["Q"], "M": s["M"], "k": s["k"], "D": s["D"] + s["D"] % 2, "arch": "sm_90a"}
    for f, vals in alts.items():
        for v in vals:
            if v == p.get(f, "global"):
                continue
            q = {**p, f: v}
            if q["split"] > 1:
                q.setdefault("merge", "kernel")
            else:
                q.pop("merge", None)
            if knn_supports(q, shp):
                out.append(q)
    return out


def run_sweep(path):
    import torch
    from cakelib import knn
    from cakelib.variants import knn_name
    from lib_grid import Timer
    timer = Timer()
    with open(path, "a") as f:
        for t in TRAIN:
            s = shape_of(t, False)
            if left() < 10:
                print("sweep: deadline", flush=True)
                return
            p = pick(s)
            xq, xb = inputs(s["D"], s["Q"], s["M"])
            for q in [p] + neighbours(p, s):
                if left() < 5:
                    return
                row = {"shape": s, "variant": knn_name(q), "params": q, "picked": q == p}
                try:
                    I, Dv = knn(xq, xb, s["k"], variant=q)
                    n = min(64, s["Q"])
                    from lib_grid import knn_check, knn_reference
                    row["ok"], row["why"] = knn_check(xq[:n], xb, I[:n], Dv[:n], s["k"], knn_reference(xq[:n], xb, s["k"]))
                    row["ms"] = timer(lambda: knn(xq, xb, s["k"], variant=q))["ms"] if row["ok"] else None
                except Exception as e:  # noqa: BLE001
                    row["ok"], row["why"] = False, f"{type(e).__name__}: {e}"[:200]
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()
                print(f"sweep {key(s):28s} {row['variant']:40s} {row.get('ms')} {row.get('why', '')}", flush=True)
            del xq, xb
            torch.cuda.empty_cache()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compile":   # the grid's picks and the GPU tests' kernels
        from cakelib.variants import knn_dk_pick
        sys.path.insert(0, "tests")
        from test_knn_dim import GPU_SHAPES, SYNC_GPU_SHAPES
        shapes = [shape_of(t, False) for t in TRAIN] + [shape_of(t, True) for t in HELD]
        jobs = [(pick(s), s["k"], s["D"] + s["D"] % 2) for s in shapes]
        for (Q, M, k, Dm), arch in [(x, "sm_90a") for x in GPU_SHAPES] + [(x, "sm_80") for x in SYNC_GPU_SHAPES]:
            d = Dm + Dm % 2
            jobs.append((knn_dk_pick({"Q": Q, "M": M, "k": k, "D": d, "arch": arch}), k, d))
        precompile(jobs)
    elif mode == "compile_sweep":
        jobs = []
        for t in TRAIN:
            s = shape_of(t, False)
            jobs += [(q, s["k"], s["D"]) for q in neighbours(pick(s), s)]
        precompile(jobs)
    elif mode == "grid":
        run_grid(os.path.join(OUT, "dim-grid.jsonl"))
    elif mode == "sweep":
        run_sweep(os.path.join(OUT, "dim-sweep.jsonl"))
    elif mode == "report":
        import math, torch
        from bench.examples import env_info
        path = os.path.join(OUT, "dim-grid.jsonl")
        rows = [r for r in map(json.loads, open(path)) if "start" not in r] if os.path.exists(path) else []
        print(f"{len(rows)} grid rows")
        sweep = [json.loads(l) for l in open(os.path.join(OUT, "dim-sweep.jsonl"))] \
            if os.path.exists(os.path.join(OUT, "dim-sweep.jsonl")) else []
        info = {"gpu": torch.cuda.get_device_name(0), "env": env_info(("torch", "triton", "flashlib", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/knn_dim_device.sh"),
                "command": "bash bench/knn_dim_device.sh"}
        json.dump({**info, "ops": {"knn": {"rows": rows}}}, open(os.path.join(OUT, "dim-grid.json"), "w"), indent=1)
        json.dump({**info, "rows": sweep}, open(os.path.join(OUT, "dim-sweep.json"), "w"), indent=1)
        print(f"\n{'shape':30s} {'variant':40s} ok    lib_ms  best_base       x   floor")
        for r in rows:
            print(f"{key(r['shape']) + (' (held)' if r['shape']['held_out'] else ''):30s} {r.get('variant', '-'):40s} "
                  f"{str(r.get('ok')):5s} {r.get('lib_ms') or 0:7.3f} {r.get('best_baseline', '-'):>8s} "
                  f"{r.get('best_baseline_ms') or 0:7.3f} {r.get('speedup') or 0:5.2f} {r.get('floor_ms') or 0:6.3f}")
        for held in (False, True):
            sp = [r["speedup"] for r in rows if r.get("speedup") and r["shape"]["held_out"] == held]
            bad = sum(1 for r in rows if r["shape"]["held_out"] == held and not r.get("ok"))
            if sp:
                print(f"{'held-out' if held else 'training'}: {len(sp)} timed, {bad} not ok, geomean "
                      f"{math.exp(sum(map(math.log, sp)) / len(sp)):.3f}x, worst {min(sp):.3f}x, "
                      f"<0.95x: {sum(x < 0.95 for x in sp)}")
EOF
timeout 50 $PY $D/knn_dim_grid.py compile 2>&1 | tail -3
stamp "compiled"
gpu_tests 30 tests/test_knn_dim.py
for attempt in 1 2 3; do      # a faulting kernel kills the child: resume after its shape
  rem=$(( DEADLINE - $(date +%s) + T0 ))
  [ $rem -lt 10 ] && break
  timeout $(( rem + 10 )) $PY $D/knn_dim_grid.py grid 2>&1 | tee -a $D/grid.log | grep -v "^sweep" | cut -c1-220
  [ ${PIPESTATUS[0]} -eq 0 ] && break
  stamp "grid child died (attempt $attempt)"
done
stamp "grid done"
rem=$(( DEADLINE - $(date +%s) + T0 ))
if [ $rem -gt 40 ]; then
  timeout 30 $PY $D/knn_dim_grid.py compile_sweep 2>&1 | tail -1
  rem=$(( DEADLINE - $(date +%s) + T0 ))
  [ $rem -gt 15 ] && timeout $(( rem + 5 )) $PY $D/knn_dim_grid.py sweep > $D/sweep.log 2>&1
  stamp "sweep rc=$?: $(grep -c ms $D/sweep.log 2>/dev/null) rows"
fi
timeout 20 $PY $D/knn_dim_grid.py report
stamp done
