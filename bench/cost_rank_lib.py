"""How well the cost model ranks the library's variants: Spearman correlation, per training shape,
between `cake_ir.cost.estimate` and the H200 sweep times committed in bench/results (no GPU needed).

    python bench/cost_rank_lib.py [--out bench/results/cost-rank-lib-cpu.json] [--sass]

--sass: instruction counts from each variant's compiled SASS (NVRTC + nvdisasm) instead of the model's.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sass", action="store_true", help="count instructions in the compiled SASS")
    args = ap.parse_args()
    from cake_ir.cost import estimate
    from cakelib.variants import kmeans_kernel, knn_kernel
    out = {}
    for op in ("kmeans", "knn"):
        d = json.load(open(os.path.join(RESULTS, f"lib-sweep-{op}-h200.json")))["ops"][op]
        by = collections.defaultdict(list)
        for r in d["rows"]:
            if r["ok"]:
                by[json.dumps(r["shape"], sort_keys=True)].append(r)
        kernels, sass, per_shape = {}, {}, []
        for s, rows in sorted(by.items()):
            shape = json.loads(s)
            if len(rows) < 4:
                continue
            pred = []
            for r in rows:
                p = d["variants"][r["variant"]]
                if r["variant"] not in kernels:
                    kernels[r["variant"]] = (kmeans_kernel(p, "sm_90a") if op == "kmeans"
                                             else knn_kernel(p, shape.get("k", 10), "l2", 128, "sm_90a"))
                if args.sass and r["variant"] not in sass:
                    from cake_ir.analysis.sass import sass_profile
                    sass[r["variant"]] = {n.path: n.count for n in sass_profile(kernels[r["variant"]]).nodes}
                env = shape if op == "kmeans" else {"Q": shape["Q"], "M": shape["M"]}
                pred.append(estimate(kernels[r["variant"]], env, sass=sass.get(r["variant"])).seconds)
            per_shape.append({"shape": shape, "variants": len(rows), "spearman": spearman(pred, [r["ms"] for r in rows])})
        rho = [x["spearman"] for x in per_shape]
        out[op] = {"shapes": len(rho), "median_spearman": statistics.median(rho), "min": min(rho), "max": max(rho),
                   "per_shape": per_shape}
        print(f"{op}: {len(rho)} shapes, median Spearman {statistics.median(rho):.3f} (min {min(rho):.3f}, "
              f"max {max(rho):.3f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python bench/cost_rank_lib.py --out " + args.out + (" --sass" if args.sass else ""),
                       **out}, f, indent=1)


if __name__ == "__main__":
    main()
