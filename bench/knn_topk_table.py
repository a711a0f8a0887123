"""The short table of bench/knn_topk_device.sh: correctness counts, then per timed shape cakelib.knn's ms,
each baseline's, and the speedup over the best baseline; the geomean per file (main grid, held out)."""
import json
import math
import sys


def main(paths) -> None:
    for p in paths:
        try:
            doc = json.load(open(p))
        except Exception as e:  # noqa: BLE001
            print(f"{p}: unreadable ({e})")
            continue
        rows = doc["rows"]
        if doc.get("phase") == "check":
            bad = [r for r in rows if not r.get("correct")]
            print(f"{p}: {len(rows) - len(bad)}/{len(rows)} correct" + "".join(
                f"\n  FAIL {r['Q']}x{r['M']} D={r['D']} k={r['k']} {r['metric']} {r.get('dist', '')}"
                f"{' chunked' if r.get('chunked') else ''}: {r.get('why')}" for r in bad[:6]))
            continue
        print(f"{p}:")
        print(f"{'Q':>6} {'M':>8} {'D':>4} {'k':>5} {'ok':>3} {'lib ms':>9} {'flash ms':>9} {'torch ms':>9} {'x best':>7}")
        sp = []
        for r in rows:
            if "lib_ms" not in r:
                print(f"{r['Q']:>6} {r['M']:>8} {r['D']:>4} {r['k']:>5}  -- {r.get('skipped') or r.get('error', '')[:60]}")
                continue
            b = [r[c] for c in ("flashlib_ms", "torch_ms") if c in r]
            x = min(b) / r["lib_ms"] if b else float("nan")
            # a baseline that did not run (its build past the limit, an error) leaves the row out of the geomean
            missing = [c for c in ("flashlib", "torch") if f"{c}_error" in r]
            if b and r.get("correct") and not missing:
                sp.append(x)
            print(f"{r['Q']:>6} {r['M']:>8} {r['D']:>4} {r['k']:>5} {'y' if r.get('correct') else 'N':>3} "
                  f"{r['lib_ms']:>9.3f} {r.get('flashlib_ms', float('nan')):>9.3f} {r.get('torch_ms', float('nan')):>9.3f}"
                  f" {x:>7.2f}" + (f"  {r.get('why')}" if not r.get("correct") else "")
                  + "".join(f"  ({c}: {r[c + '_error'][:50]})" for c in missing))
        if sp:
            print(f"  geomean x best baseline over {len(sp)} correct shapes with every baseline timed: "
                  f"{math.exp(sum(map(math.log, sp)) / len(sp)):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
