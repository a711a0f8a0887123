"""CPU benchmark (not a test): verify, lowering and NVRTC times for every seed program.

    python bench/compile_speed.py [--reps 20]

Prints median milliseconds per stage; NVRTC is measured with the artifact cache off.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from cake_ir import io
    from cake_ir.lower import lower
    from cake_ir.nvrtc import nvrtc_compile
    from cake_ir.verifier import load_rules, verify

    load_rules()
    rows = []
    for path in sorted(ROOT.glob("tasks/*/seeds/*.json")):
        k, _ = io.load_file(path)
        text = path.read_text()
        tl, tv, tlow, tn = [], [], [], []
        for i in range(args.reps):
            t0 = time.perf_counter(); k, _ = io.load(text); t1 = time.perf_counter()
            res = verify(k); t2 = time.perf_counter()
            low = lower(res.expanded); t3 = time.perf_counter()
            tl.append(t1 - t0); tv.append(t2 - t1); tlow.append(t3 - t2)
            if i < 3:
                nv = nvrtc_compile(low.source, k.arch, low.line_map, low.kernel_name, use_cache=False)
                tn.append(time.perf_counter() - t3)
        rows.append({"program": path.stem, "arch": k.arch, "rules": len(load_rules()),
                     "load_ms": 1e3 * statistics.median(tl), "verify_ms": 1e3 * statistics.median(tv),
                     "lower_ms": 1e3 * statistics.median(tlow), "nvrtc_ms": 1e3 * statistics.median(tn),
                     "lower_plus_nvrtc_s": statistics.median(tlow) + statistics.median(tn)})
    if args.json:
        print(json.dumps(rows, indent=1))
    print(f"{'program':22s} {'arch':7s} {'load ms':>8s} {'verify ms':>10s} {'lower ms':>9s} {'nvrtc ms':>9s}")
    for r in rows:
        print(f"{r['program']:22s} {r['arch']:7s} {r['load_ms']:8.2f} {r['verify_ms']:10.2f} {r['lower_ms']:9.2f} {r['nvrtc_ms']:9.1f}")


if __name__ == "__main__":
    main()
