"""Merge the per-GPU prefill results of bench/kda_device.sh into one kda-prefill-h200.json (rows of
every part, the first part's env, each part's resources) and print the table over all shapes.

    python bench/merge_prefill.py OUT/g0/kda-prefill-h200.json OUT/g1/kda-prefill-h200.json \\
        --out bench/results/kda-prefill-h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from kda_prefill import summarize
    from tasks.kda.shapes import PREFILL_BENCH
    docs = [json.load(open(p)) for p in args.parts]
    merged = dict(docs[0])
    merged["rows"] = [r for d in docs for r in d["rows"]]
    merged["parts"] = [{"path": p, "env": d.get("env"), "resources": d.get("resources")} for p, d in zip(args.parts, docs)]
    g = summarize(merged["rows"], PREFILL_BENCH)
    merged["geomean_speedup_over_fla"] = g
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1, default=str)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
