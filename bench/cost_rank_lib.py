"""How well the cost model ranks the library's variants: Spearman correlation, per training shape,
between `cake_ir.cost.estimate` and the H200 sweep times committed in bench/results (no GPU needed).

    python bench/cost_rank_lib.py [--out bench/results/cost-rank-lib-cpu.json] [--sass]

--sass: instruction counts from each variant's compiled SASS (NVRTC + nvdisasm) instead of the model's.
--ptxas: registers per thread from each variant's compiled kernel (ptxas) instead of the model's estimate
from register tiles (occupancy).
Besides the per-shape rank correlation it reports, for variants timed at two ks on the same (Q, M), the
measured and predicted time ratio between the larger k and k = 10 (kNN; the lists' registers).
"""
import argparse
import collections
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def k_ratios(preds: dict) -> dict:
    """For each variant timed at k = 10 and a larger k on the same (Q, M): the measured time ratio and the
    model's; how well the model ranks and sizes them (the cost of the lists' registers)."""
    rows = []
    for (s, v), (p, ms) in preds.items():
        shape = json.loads(s)
        if shape.get("k", 10) == 10:
            continue
        base = json.dumps({**shape, "k": 10}, sort_keys=True)
        if (base, v) in preds:
            p10, ms10 = preds[(base, v)]
            rows.append({"shape": shape, "variant": v, "measured": ms / ms10, "predicted": p / p10})
    if not rows:
        return {"pairs": 0}
    err = [abs(np.log(r["predicted"] / r["measured"])) for r in rows]
    return {"pairs": len(rows), "spearman": spearman([r["predicted"] for r in rows], [r["measured"] for r in rows]),
            "geomean_abs_log_error": float(np.exp(np.mean(err))), "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sass", action="store_true", help="count instructions in the compiled SASS")
    ap.add_argument("--ptxas", action="store_true", help="registers per thread from the compiled kernels")
    ap.add_argument("--ops", default="kmeans,knn", help="the operations to rank, comma-separated")
    args = ap.parse_args()
    from cake_ir.cost import estimate
    from cakelib.variants import kmeans_kernel, knn_kernel
    out = {}
    for op in args.ops.split(","):
        d = json.load(open(os.path.join(RESULTS, f"lib-sweep-{op}-h200.json")))["ops"][op]
        by = collections.defaultdict(list)
        for r in d["rows"]:
            if r["ok"]:
                by[json.dumps(r["shape"], sort_keys=True)].append(r)
        kernels, sass, compiled, per_shape, preds = {}, {}, {}, [], {}
        for s, rows in sorted(by.items()):
            shape = json.loads(s)
            if len(rows) < 4:
                continue
            pred = []
            for r in rows:
                p = d["variants"][r["variant"]]
                key = (r["variant"], shape.get("k", 10))         # kNN kernels are built per k
                if key not in kernels:
                    kernels[key] = (kmeans_kernel(p, "sm_90a") if op == "kmeans"
                                    else knn_kernel(p, shape.get("k", 10), "l2", 128, "sm_90a"))
                if args.sass and key not in sass:
                    from cake_ir.analysis.sass import sass_profile
                    sass[key] = {n.path: n.count for n in sass_profile(kernels[key]).nodes}
                if args.ptxas and key not in compiled:
                    from cake_ir.compiler import compile_ir
                    compiled[key] = compile_ir(kernels[key])
                env = shape if op == "kmeans" else {"Q": shape["Q"], "M": shape["M"]}
                pred.append(estimate(kernels[key], env, sass=sass.get(key), compiled=compiled.get(key)).seconds)
                preds[(s, r["variant"])] = (pred[-1], r["ms"])
            per_shape.append({"shape": shape, "variants": len(rows), "spearman": spearman(pred, [r["ms"] for r in rows])})
        rho = [x["spearman"] for x in per_shape]
        out[op] = {"shapes": len(rho), "median_spearman": statistics.median(rho), "min": min(rho), "max": max(rho),
                   "per_shape": per_shape}
        print(f"{op}: {len(rho)} shapes, median Spearman {statistics.median(rho):.3f} (min {min(rho):.3f}, "
              f"max {max(rho):.3f})")
        if op == "knn":
            out[op]["k_ratios"] = k_ratios(preds)
            kr = out[op]["k_ratios"]
            if kr["pairs"]:
                print(f"knn: {kr['pairs']} (variant, Q, M) timed at k = 10 and a larger k: measured / predicted "
                      f"time ratio, Spearman {kr['spearman']:.3f}; geomean |log error| {kr['geomean_abs_log_error']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python bench/cost_rank_lib.py --out " + args.out + (" --sass" if args.sass else "")
                       + (" --ptxas" if args.ptxas else "") + (f" --ops {args.ops}" if args.ops != "kmeans,knn" else ""),
                       **out}, f, indent=1)


if __name__ == "__main__":
    main()
