"""Does the cost model rank real variants the way the GPU does?

    python bench/rank_variants.py [--quick] [--out bench/results/rank-variants-h200.json]
                                  [--calibration calibration/data/h200.json] [--dry-run]

Builds the GEMM (mma.sync tiles / stages / warp grids, wgmma bn 128/256 x stages 3-5 x consumers
1-2) and softmax (row 2048/4096/8192 x warps 4/8/16 x vec 4/8) variants of calibration.variants,
compiles each for sm_90a (a variant that is illegal or does not compile is skipped and listed), then
on the GPU: checks each against a float64 reference (outputs poisoned first; GEMM every element,
softmax every element written and finite plus rel RMSE / max-abs on the first and last 4096 rows; rel
RMSE <= 1e-2), times it (CUDA events, median, L2 flushed and output poisoned before every repetition,
output re-checked after timing), and predicts it with cake_ir.cost.estimate using the arch table's
constants and, when the file exists, the calibration file's.

Reports Spearman rank correlation (average ranks for ties) of predicted vs measured time: over all
rows, over the GEMM rows (and per GEMM shape), over the softmax rows; for both constant sets.
Target: >= 0.8. Writes bench/results/rank-variants-<gpu>.json and prints a table last.

--dry-run: no GPU; compile and predict only (prints the predicted ranking).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET = 0.8


def shape_key(shape: dict) -> str:
    return "x".join(str(shape[k]) for k in ("M", "N", "K") if k in shape)


def spearman_report(rows, predictors=("table", "calibrated")) -> dict:
    """spearman[group][predictor] over rows with a correct measurement and a prediction."""
    from calibration.stats import spearman

    groups = {"overall": lambda r: True, "gemm": lambda r: r["family"] == "gemm",
              "softmax": lambda r: r["family"] == "softmax"}
    for sk in sorted({shape_key(r["shapes"]) for r in rows if r["family"] == "gemm"}):
        groups[f"gemm@{sk}"] = (lambda r, sk=sk: r["family"] == "gemm" and shape_key(r["shapes"]) == sk)
    for impl in ("wgmma", "mma_sync"):
        groups[f"gemm_{impl}"] = (lambda r, impl=impl: r["family"] == "gemm" and r.get("impl") == impl)
    out = {}
    for g, sel in groups.items():
        out[g] = {"n": 0}
        for p in predictors:
            pick = [r for r in rows if sel(r) and r.get("correct") and r.get("seconds") and r.get(f"pred_{p}_s")]
            out[g]["n"] = max(out[g]["n"], len(pick))
            out[g][p] = spearman([r[f"pred_{p}_s"] for r in pick], [r["seconds"] for r in pick]) \
                if len(pick) >= 2 else None
    return out


def build(args):
    """Variants, compile results, skipped list, prediction specs."""
    from cake_ir import arch as _arch
    from cake_ir.cost import load_constants
    from calibration.measure import compile_checked, warm_compile_cache
    from calibration.variants import GEMM_SHAPES, SOFTMAX_M, all_variants

    gemm_shapes = GEMM_SHAPES[:1] if args.quick else GEMM_SHAPES
    variants = all_variants(gemm_shapes, SOFTMAX_M)
    skipped, compiled = [], []
    todo = [v for v in variants if not v.skip_reason]
    if not args.no_parallel:
        warm_compile_cache([v.kernel() for v in todo], args.jobs)
    for v in variants:
        if v.skip_reason:
            skipped.append({"name": v.name, "reason": "illegal: " + v.skip_reason, "params": v.params})
            continue
        if not v.shapes:
            skipped.append({"name": v.name, "reason": "no problem shape fits its tile", "params": v.params})
            continue
        k = v.kernel()
        r, errs, _ = compile_checked(k)
        if not r.ok:
            skipped.append({"name": v.name, "reason": "does not compile: " + "; ".join(errs[:3]),
                            "params": v.params})
            continue
        compiled.append((v, k, r))
    specs = {"table": _arch.spec("sm_90a")}
    cal_path = Path(args.calibration) if args.calibration else ROOT / "calibration" / "data" / f"{args.gpu}.json"
    cal_info = None
    if cal_path.is_file():
        specs["calibrated"] = load_constants(cal_path)
        try:
            doc = json.loads(cal_path.read_text())
            cal_info = {"path": str(cal_path), "version": doc.get("version"), "date": doc.get("measured", {}).get("date")}
        except ValueError:
            cal_info = {"path": str(cal_path)}
    return compiled, skipped, specs, cal_info


def predict(rows_in, specs):
    from cake_ir.cost import estimate

    for row, k in rows_in:
        for name, spec in specs.items():
            rep = estimate(k, row["shapes"], spec)
            row[f"pred_{name}_s"] = rep.seconds
            row[f"pred_{name}_bound"] = rep.bound


def rate(row) -> str:
    s = row.get("seconds")
    if not s:
        return ""
    sh = row["shapes"]
    if row["family"] == "gemm":
        return f"{2 * sh['M'] * sh['N'] * sh['K'] / s / 1e12:.0f} TFLOP/s"
    n = row["params"]["n"]
    return f"{2 * 2 * sh['M'] * n / s / 1e12:.2f} TB/s"


def print_table(rows, sp, skipped, dry_run=False):
    print(f"\n{'variant':36s} {'shape':16s} {'measured':>11s} {'rate':>14s} {'pred table':>11s} "
          f"{'pred cal':>11s} {'ok':>3s}")
    for r in sorted(rows, key=lambda r: (r["family"], shape_key(r["shapes"]), r.get("seconds") or 1e9)):
        ms = f"{r['seconds'] * 1e3:.4f} ms" if r.get("seconds") else "-"
        pt = f"{r['pred_table_s'] * 1e3:.4f}" if r.get("pred_table_s") else "-"
        pc = f"{r['pred_calibrated_s'] * 1e3:.4f}" if r.get("pred_calibrated_s") else "-"
        ok = "yes" if r.get("correct") else ("-" if r.get("seconds") is None and "error" not in r else "NO")
        print(f"{r['name']:36s} {shape_key(r['shapes']):16s} {ms:>11s} {rate(r):>14s} {pt:>11s} {pc:>11s} {ok:>3s}")
    for s in skipped:
        print(f"  skipped {s['name']}: {s['reason'][:110]}")
    print(f"\nSpearman rank correlation, predicted vs measured time (target >= {TARGET}):"
          + ("\n  DRY RUN: 'measured' is the table prediction, so these are a self-check, not results" if dry_run else ""))
    for g, v in sp.items():
        def f(x):
            return "   -  " if x is None else f"{x:+.3f}"
        print(f"  {g:28s} n={v['n']:3d}  table {f(v.get('table'))}  calibrated {f(v.get('calibrated'))}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="rank GEMM / softmax variants: cost model vs GPU")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--quick", action="store_true", help="GEMM at 4096^3 only, fewer repetitions")
    ap.add_argument("--out", default=None)
    ap.add_argument("--calibration", default=None, help="calibration JSON (default calibration/data/<gpu>.json)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: compile and predict only")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--no-parallel", action="store_true", help="compile in this process only")
    args = ap.parse_args(argv)
    t_start = time.time()
    command = "python bench/rank_variants.py " + " ".join(argv if argv is not None else sys.argv[1:])

    compiled, skipped, specs, cal_info = build(args)
    n_variants = len(compiled)
    print(f"[rank] {n_variants} variants compile, {len(skipped)} skipped; predictors: {', '.join(specs)}"
          f"{' (' + cal_info['path'] + ' v' + str(cal_info.get('version')) + ')' if cal_info else ''}", flush=True)
    rows, pairs = [], []
    for v, k, r in compiled:
        for shape in v.shapes:
            row = {"name": v.name, "family": v.family, "impl": v.params.get("impl", v.family), "params": v.params,
                   "shapes": dict(shape), "seconds": None, "correct": False,
                   "registers": r.resources.get("registers"), "smem_bytes": r.smem_bytes}
            rows.append(row)
            pairs.append((row, k))
    predict(pairs, specs)

    result = {"gpu": args.gpu, "command": command, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "calibration": cal_info, "target": TARGET, "variants": n_variants, "skipped": skipped}
    if args.dry_run:
        result["dry_run"] = True
    else:
        from calibration.measure import InputCache, Timer, device_info, run_variant, versions
        from gpu_backend.timing import L2Flusher

        try:
            dev = device_info(0)
        except Exception as e:  # noqa: BLE001
            print(f"[rank] no usable CUDA device ({type(e).__name__}: {e}); use --dry-run on a CPU", file=sys.stderr)
            return 2
        result.update({"gpu": dev["name"], "device": dev})
        reps = args.reps or (5 if args.quick else 20)
        timer = Timer(reps=reps, warmup=3 if not args.quick else 1, flusher=L2Flusher.for_device(0))
        result["reps"] = reps
        inputs = InputCache()
        out_path = _out_path(args)

        def save_partial():
            _write(out_path.with_name(out_path.stem + ".partial.json"), dict(result, rows=rows, partial=True))

        lost = False
        for i, (row, k) in enumerate(pairs):
            v, _, r = next(c for c in compiled if c[0].name == row["name"])
            try:
                got = run_variant(row["name"], row["family"], k, r, row["shapes"], inputs, timer,
                                  on_timeout=save_partial)
            except Exception as e:  # noqa: BLE001
                got = {"seconds": None, "correct": False, "error": f"{type(e).__name__}: {e}"}
                from calibration.run import _context_usable
                lost = not _context_usable()
            row.update({kk: vv for kk, vv in got.items() if kk not in ("name", "family", "shapes")})
            t = row.get("seconds")
            print(f"  [{i + 1}/{len(pairs)}] {row['name']:36s} {shape_key(row['shapes']):16s} "
                  f"{'%.4f ms' % (t * 1e3) if t else 'FAILED':>12s} {rate(row):>14s} "
                  f"{'ok' if row.get('correct') else 'WRONG/FAILED ' + str(row.get('error'))[:90]}", flush=True)
            if lost:
                print("[rank] CUDA context lost; remaining variants not measured", flush=True)
                break
        if not lost:
            inputs.free()
    if not result.get("versions"):
        from calibration.measure import versions
        result["versions"] = versions()
    result["rows"] = rows
    result["spearman"] = spearman_report(rows if not args.dry_run else
                                         [dict(r, seconds=r["pred_table_s"], correct=True) for r in rows],
                                         tuple(specs))
    if args.dry_run:
        result["spearman_note"] = "dry run: 'measured' = the table prediction (a self-check, not a result)"
    result["wall_s"] = time.time() - t_start
    out_path = _out_path(args)
    if not args.dry_run:
        _write(out_path, result)
        if os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() != out_path.parent.resolve():
            _write(Path(os.environ["OUT"]) / out_path.name, result)
    print_table(rows, result["spearman"], skipped, args.dry_run)
    print(f"\n{n_variants} variants ({len(rows)} rows), {len(skipped)} skipped; wall {result['wall_s']:.0f} s"
          + ("" if args.dry_run else f"; wrote {out_path}"))
    return 0


def _out_path(args) -> Path:
    """--out, else bench/results/rank-variants-<gpu>.json (also copied into $OUT when that is set)."""
    if args.out:
        return Path(args.out)
    return ROOT / "bench" / "results" / f"rank-variants-{args.gpu}.json"


def _write(path: Path, doc: dict) -> None:
    from calibration.fit import write_json
    write_json(path, doc)


if __name__ == "__main__":
    raise SystemExit(main())
