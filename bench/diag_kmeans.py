"""Diagnose the kmeans seeds' timed re-check failure (docs/tasks-kmeans-knn.md): is it the shape, the
number of back-to-back launches, or the fresh-input reruns? Prints one line per experiment.

    python bench/diag_kmeans.py [--out results.json]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    from gpu_backend.evaluate import evaluate
    from tasks.registry import get
    task = get("kmeans").task
    rows = []
    seeds = [("kmeans_fused_sm80", "tasks/kmeans/seeds/kmeans_fused_sm80.json"),
             ("kmeans_fused_k256_sm90a", "tasks/kmeans/seeds/kmeans_fused_k256_sm90a.json")]
    bench = {"B": 32, "N": 16384, "K": 100}
    small = {"B": 3, "N": 4099, "K": 100}
    mid = {"B": 8, "N": 16384, "K": 100}
    one = {"B": 1, "N": 16384, "K": 100}
    experiments = [
        ("test bench shape, 4 reruns", dict(shapes=[bench], profile=False, reruns=4)),
        ("test B=1 N=16384", dict(shapes=[one], profile=False, reruns=2)),
        ("test B=8 N=16384", dict(shapes=[mid], profile=False, reruns=2)),
        ("profile bench, warmup 0 reps 1", dict(shapes=[small], bench_shapes=[bench], warmup=0, reps=1)),
        ("profile bench, warmup 0 reps 2", dict(shapes=[small], bench_shapes=[bench], warmup=0, reps=2)),
        ("profile bench, warmup 3 reps 20", dict(shapes=[small], bench_shapes=[bench], warmup=3, reps=20)),
        ("profile small shape, reps 20", dict(shapes=[small], bench_shapes=[small], warmup=3, reps=20)),
    ]
    for name, path in seeds:
        ir = open(path).read()
        for label, kw in experiments:
            t0 = time.time()
            rec = evaluate(ir, task, seed=7, name=name, **kw)
            d = rec.model_dump() if hasattr(rec, "model_dump") else rec.__dict__
            msg = (d.get("message") or "")[:160]
            row = {"seed": name, "experiment": label, "status": d.get("status"), "error_class": d.get("error_class"),
                   "max_rel_rmse": d.get("max_rel_rmse"), "message": msg,
                   "ms": [t.get("ms_median") for t in d.get("timings") or []], "s": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"{name:26s} {label:34s} {row['status']:6s} {str(row['error_class']):16s} {msg}", flush=True)
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
