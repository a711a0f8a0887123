"""One-call GPU check of the evaluation layer (run it on the GPU machine):

    python3 bench/gpu_suite.py [--skip-tests] [--reps 30] [--out DIR]

1. runs the gpu-marked tests (`python3 -m pytest -m gpu tests/`): device memory, timing, the seeds
   evaluated in-process and through the worker pool, and the fault corpus (crashes, hangs, cheats,
   wrong results, each caught while the pool keeps serving);
2. evaluates every seed program on its task through a WorkerPool over all visible GPUs (honest
   protocol: fresh seeded inputs, poisoned outputs, float64 host reference, L2-flushed CUDA-event
   timing with re-checked outputs) and, with 2+ GPUs, the same batch on one GPU vs all of them;
3. prints a short table last and writes $OUT/gpu-suite-<gpu>.json (bench/results/ without $OUT),
   with the fault-corpus records from step 1 beside it.

Needs python3, numpy, pydantic, cuda-python (cuda-bindings, cuda-core, NVRTC) and pytest; not torch.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run_gpu_tests() -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfEs", "--durations=8", "-p", "no:cacheprovider",
           "tests/test_gpu_examples.py", "tests/test_gpu_eval.py", "tests/test_fault_corpus.py"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = p.stdout + p.stderr
    print(out[-6000:], flush=True)
    print(f"[gpu tests: exit {p.returncode} in {time.time() - t0:.0f} s]", flush=True)
    return p.returncode, out


def seed_jobs(reps: int, warmup: int) -> list[dict]:
    from tasks.base import TASK_NAMES, get_task
    jobs = []
    for tname in TASK_NAMES:
        task = get_task(tname)
        seeds_dir = os.path.join(ROOT, "tasks", tname, "seeds")
        for fn in sorted(os.listdir(seeds_dir)):
            if fn.endswith(".json"):
                with open(os.path.join(seeds_dir, fn)) as f:
                    jobs.append({"candidate": f.read(), "task": task.name, "name": fn[:-5], "reps": reps,
                                 "warmup": warmup})
    return jobs


def gpu_count() -> int:
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        return 0
    from cuda.bindings import driver
    return int(driver.cuDeviceGetCount()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--scale-copies", type=int, default=2, help="copies of the seed batch for the 1-vs-N GPU comparison")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    test_rc, test_out = (None, "") if args.skip_tests else run_gpu_tests()
    corpus = os.path.join(ROOT, ".cake", "fault_corpus_records.json")
    if os.path.exists(corpus):
        shutil.copy(corpus, os.path.join(args.out, "fault_corpus_records.json"))

    n = gpu_count()
    if n == 0:
        print("no CUDA GPU visible: nothing to evaluate")
        return 1
    from gpu_backend.driver import properties
    from gpu_backend.timing import copy_ceiling_tbps
    from gpu_backend.worker import WorkerPool
    props = properties(0)
    copy_tbps = copy_ceiling_tbps(1 << 30, 0)
    print(f"[device-to-device copy ceiling on GPU 0: {copy_tbps:.2f} TB/s]", flush=True)
    gpus = list(range(n))
    jobs = seed_jobs(args.reps, args.warmup)
    t0 = time.time()
    with WorkerPool(gpus=gpus) as pool:
        pool.wait_ready()
        t_ready = time.time()
        recs = pool.run(jobs)
    wall_all = time.time() - t_ready
    print(f"[seeds through the pool on GPUs {gpus}: {wall_all:.1f} s after {t_ready - t0:.1f} s start-up]")

    scaling = None
    if n > 1:   # the same batch (x2) on one GPU, then on all of them; compile caches are warm
        batch = jobs * args.scale_copies
        walls = {}
        for g in ([0], gpus):
            with WorkerPool(gpus=g) as pool:
                pool.wait_ready()
                ts = time.time()
                rs = pool.run(batch)
                walls[len(g)] = time.time() - ts
            assert all(r.ok for r in rs), [r.short() for r in rs if not r.ok]
        scaling = {"jobs": len(batch), "wall_s": walls, "speedup": walls[1] / walls[n]}

    rows = []
    for r in recs:
        t = r.timings[0] if r.timings else None
        rows.append({"shape": t.shape if t else None, "impl": r.candidate, "task": r.task, "status": r.status,
                     "error_class": r.error_class, "correct": r.ok, "max_rel_rmse": r.max_rel_rmse,
                     "ms_median": t.ms_median if t else None, "ms_min": t.ms_min if t else None,
                     "ms_max": t.ms_max if t else None, "TFLOPs": t.tflops if t else None,
                     "TBps": t.tbps if t else None, "reps": t.reps if t else None, "seed": r.seed,
                     "registers": r.compile.get("registers"), "speedup_vs": {}, "message": r.message[:300],
                     "frac_of_copy": (t.tbps / copy_tbps) if t and t.tbps and r.task == "softmax" else None})
    import cuda.bindings
    import numpy
    import pydantic
    result = {"gpu": props["name"], "device": props, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "versions": {"cuda_bindings": cuda.bindings.__version__, "numpy": numpy.__version__,
                           "pydantic": pydantic.__version__, "python": platform.python_version()},
              "command": "python3 bench/gpu_suite.py" + (" --skip-tests" if args.skip_tests else ""),
              "ceilings": {"copy_TBps": copy_tbps}, "gpu_tests_exit": test_rc, "gpus": gpus, "scaling": scaling, "rows": rows,
              "records": [r.model_dump() for r in recs]}
    name = "gpu-suite-" + props["name"].lower().replace("nvidia ", "").replace(" ", "-") + ".json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(result, f, indent=1, default=str)

    if os.path.exists(corpus):
        with open(corpus) as f:
            crecs = json.load(f)["records"]
        print("\nfault corpus (case -> status/error_class [node]; the job after each must be ok):")
        for i in range(0, len(crecs) - 1, 2):
            c, nxt = crecs[i], crecs[i + 1]
            print(f"  {c['candidate']:24s} {c['stage']:8s} {c['status']:8s} {str(c['error_class']):18s} "
                  f"{c.get('node') or '':34s} next: {nxt['status']}")
    print(f"\n{'candidate':22s} {'task':8s} {'status':7s} {'shape':32s} {'ms med':>9s} {'ms min':>9s} "
          f"{'rate':>24s} {'rel err':>9s}")
    for r in rows:
        rate = (f"{r['TFLOPs']:.0f} TFLOP/s" if r["task"] == "gemm" and r["TFLOPs"] else
                f"{r['TBps']:.2f} TB/s" if r["TBps"] else "")
        if r.get("frac_of_copy"):
            rate += f" ({100 * r['frac_of_copy']:.0f}% copy)"
        ms = f"{r['ms_median']:9.4f} {r['ms_min']:9.4f}" if r["ms_median"] else f"{'-':>9s} {'-':>9s}"
        err = f"{r['max_rel_rmse']:9.2e}" if r["max_rel_rmse"] is not None else f"{'-':>9s}"
        status = r["status"] if r["correct"] else f"{r['status']}:{r['error_class']}"
        print(f"{r['impl']:22s} {r['task']:8s} {status:7s} {json.dumps(r['shape']):32s} {ms} {rate:>24s} {err}")
    if scaling:
        print(f"\npool scaling: {scaling['jobs']} jobs, 1 GPU {scaling['wall_s'][1]:.1f} s, {n} GPUs "
              f"{scaling['wall_s'][n]:.1f} s -> {scaling['speedup']:.2f}x")
    print(f"gpu tests exit: {test_rc}; results: {os.path.join(args.out, name)}")
    bad = [r for r in recs if not r.ok]
    return 1 if bad or (test_rc not in (None, 0)) else 0


if __name__ == "__main__":
    sys.exit(main())
