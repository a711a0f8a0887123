"""Measure this GPU, fit the cost model's constants, write calibration/data/<gpu>.json.

    python -m calibration.run [--gpu h200] [--out calibration/data/h200.json] [--quick]
                              [--only hbm,l2,...] [--no-refine] [--reps N]

1. every microbenchmark of calibration.micro (CAKE IR kernels) is compiled, checked (copies
   bitwise, outputs fully written) and timed: CUDA events around one launch, median of `reps`,
   L2 flushed before each repetition for the memory-bound ones;
2. the refinement set (calibration.variants.refine_set: GEMM / softmax variants at shapes that
   bench/rank_variants.py does not use) is checked against float64 references and timed;
3. calibration.fit converts the measurements (direct) and refines group factors (log least squares
   of cost.estimate against the refinement set);
4. the file is written with a version one higher than the existing file's, the raw measurements,
   device, versions, date and command; a short table is printed last.

GPU time: about a minute on an H200 (--quick: ~30 s); the refinement fit runs on the CPU after.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    from cake_ir.cost import GPU_ARCH

    low = name.lower().replace("nvidia", "").strip()
    for tok in re.split(r"[\s\-_/]+", low):
        if tok in GPU_ARCH:
            return tok
    for key in sorted(GPU_ARCH, key=len, reverse=True):
        if key in low.replace(" ", ""):
            return key
    return re.sub(r"[^a-z0-9]+", "", low) or "gpu"


def self_consistency(micros, records, spec) -> list:
    """cost.estimate of each microbenchmark with the final constants, next to its measured time."""
    from cake_ir.cost import estimate

    by = {r["name"]: r for r in records}
    out = []
    for m in micros:
        r = by.get(m.name)
        if not r or not r.get("seconds"):
            continue
        try:
            e = estimate(m.kernel, m.shapes, spec)
            out.append({"name": m.name, "measured": r["seconds"], "predicted": e.seconds, "bound": e.bound,
                        "ratio": e.seconds / r["seconds"]})
        except Exception as ex:  # noqa: BLE001
            out.append({"name": m.name, "error": f"{type(ex).__name__}: {ex}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default=None, help="GPU name for the file (default: from the device name)")
    ap.add_argument("--out", default=None, help="output JSON (default calibration/data/<gpu>.json)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    ap.add_argument("--only", default=None, help="comma-separated microbenchmark families (modules)")
    ap.add_argument("--no-refine", action="store_true", help="skip the refinement set and fit")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per measurement")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile processes")
    args = ap.parse_args(argv)
    t_start = time.time()
    command = "python -m calibration.run " + " ".join(argv if argv is not None else sys.argv[1:])

    from cake_ir import arch as _arch
    from cake_ir.cost import GPU_ARCH

    from . import fit as F
    from .measure import (InputCache, Timer, compile_checked, device_info, run_micro, run_variant, versions,
                          warm_compile_cache)
    from .micro import all_micros
    from .report import constants_table, micro_table, refine_table
    from .variants import refine_set

    try:
        dev = device_info(0)
    except Exception as e:  # noqa: BLE001
        print(f"[calibration] no usable CUDA device ({type(e).__name__}: {e}); run this on the GPU machine",
              file=sys.stderr)
        return 2
    gpu = (args.gpu or gpu_slug(dev["name"])).lower()
    arch = GPU_ARCH.get(gpu) or {(9, 0): "sm_90a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89"}.get(
        tuple(dev.get("cc", ())), "sm_90a")
    out_path = Path(args.out) if args.out else ROOT / "calibration" / "data" / f"{gpu}.json"
    only = set(args.only.split(",")) if args.only else None
    micros = all_micros(int(dev["sms"]), args.quick, only)
    variants = [] if args.no_refine else refine_set()
    print(f"[calibration] {dev['name']} ({gpu}, {arch}), {dev['sms']} SMs; {len(micros)} microbenchmarks, "
          f"{len(variants)} refinement kernels; writing {out_path}", flush=True)

    kernels = [m.kernel for m in micros] + [v.kernel() for v in variants]
    t0 = time.time()
    warm_compile_cache(kernels, args.jobs)
    print(f"[calibration] compiled {len(kernels)} kernels in {time.time() - t0:.1f} s", flush=True)

    from gpu_backend.timing import L2Flusher
    reps = args.reps or (5 if args.quick else 10)
    timer = Timer(reps=reps, warmup=2, flusher=L2Flusher.for_device(0))
    measured = {"device": dev, "versions": versions(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "command": command, "quick": bool(args.quick), "reps": reps, "micro": [], "refine_samples": []}

    def save_partial():
        p = out_path.with_name(out_path.stem + ".partial.json")
        F.write_json(p, {"arch": arch, "gpu": gpu, "measured": measured, "partial": True})
        print(f"[calibration] partial results in {p}", flush=True)

    context_ok = True
    for m in micros:
        try:
            rec = run_micro(m, timer, on_timeout=save_partial)
        except Exception as e:  # noqa: BLE001 - record, and stop touching a faulted context
            rec = dict(m.describe(), seconds=None, correct=False, error=f"{type(e).__name__}: {e}")
            context_ok = _context_usable()
        measured["micro"].append(rec)
        t = rec.get("seconds")
        print(f"  {m.name:24s} {'%.4f ms' % (t * 1e3) if t else 'FAILED':>12s}  {'' if rec.get('correct') else 'check FAILED: '}"
              f"{rec.get('error') or '; '.join(rec.get('checks', []))[:100]}", flush=True)
        if not context_ok:
            print("[calibration] CUDA context lost; remaining measurements skipped", flush=True)
            break

    # Reference point (not CAKE IR, not fitted): the driver's device-to-device copy, same protocol.
    if context_ok and (only is None or "hbm" in only):
        try:
            import gpu_backend.timing as GT
            if hasattr(GT, "copy_ceiling_tbps"):
                measured["reference"] = {"cuMemcpyDtoD_TBps": GT.copy_ceiling_tbps(1 << 30 if not args.quick else 1 << 28)}
                print(f"  {'cuMemcpyDtoD (reference)':24s} {measured['reference']['cuMemcpyDtoD_TBps']:.3f} TB/s",
                      flush=True)
        except Exception as e:  # noqa: BLE001
            measured["reference"] = {"error": f"{type(e).__name__}: {e}"}
            context_ok = _context_usable()

    if context_ok and variants:
        inputs = InputCache()
        try:
            for v in variants:
                k = v.kernel()
                r, errs, _ = compile_checked(k)
                for shape in v.shapes:
                    if not r.ok:
                        rec = {"name": v.name, "family": v.family, "shapes": shape, "seconds": None,
                               "correct": False, "error": "; ".join(errs[:3])}
                    else:
                        try:
                            rec = run_variant(v.name, v.family, k, r, shape, inputs, timer, on_timeout=save_partial)
                        except Exception as e:  # noqa: BLE001
                            rec = {"name": v.name, "family": v.family, "shapes": shape, "seconds": None,
                                   "correct": False, "error": f"{type(e).__name__}: {e}"}
                            context_ok = _context_usable()
                    measured["refine_samples"].append(rec)
                    t = rec.get("seconds")
                    print(f"  {v.name:34s} {json.dumps(shape):32s} {'%.4f ms' % (t * 1e3) if t else 'FAILED':>12s} "
                          f"{'ok' if rec.get('correct') else 'WRONG/FAILED ' + str(rec.get('error'))[:80]}", flush=True)
                    if not context_ok:
                        break
                if not context_ok:
                    break
        finally:
            if context_ok:
                inputs.free()
    measured["gpu_wall_s"] = time.time() - t_start

    # ---- fit
    t0 = time.time()
    samples = [] if args.no_refine else F._samples_from_records(
        [r for r in measured["refine_samples"] if r.get("correct")])
    res = F.fit_all(measured["micro"], samples, arch=arch, device=dev)
    d, rr = res["direct"], res["refine"]
    measured["direct"] = {"derivations": d.derivations, "conversions": d.conversions, "info": d.info,
                          "values": d.values}
    measured["refine"] = rr.to_dict() if rr is not None else None
    measured["self_consistency"] = self_consistency(micros, measured["micro"], res["spec"])
    measured["fit_s"] = time.time() - t0
    notes = list(d.notes)
    bad = [r["name"] for r in measured["micro"] if not r.get("correct")]
    if bad:
        notes.append("microbenchmarks that failed or failed their check (not used): " + ", ".join(bad))
    notes.append("constants: direct conversion of microbenchmarks, then group factors fitted to the "
                 "refinement kernels (measured.refine); see calibration/fit.py")
    version = F.next_version(out_path)
    doc = F.calibration_document(res["spec"], res["fitted"], arch, gpu, version, measured, notes)
    F.write_json(out_path, doc)
    if os.environ.get("OUT"):      # the GPU runner brings back only what is under $OUT
        F.write_json(Path(os.environ["OUT"]) / f"calibration-{gpu}.json", doc)

    # ---- tables (constants last)
    sc = {x["name"]: x for x in measured["self_consistency"] if "ratio" in x}
    print()
    print(micro_table(measured["micro"], d.conversions))
    print("  model/measured with the final constants: " + ", ".join(
        f"{n} {x['ratio']:.2f}" for n, x in sc.items()))
    if d.info:
        print("  " + "; ".join(f"{k} {v:.1f}x" for k, v in d.info.items()))
    print()
    print(refine_table(measured["refine"]))
    print()
    print(f"wrote {out_path} (version {version}); GPU phase {measured['gpu_wall_s']:.0f} s, fit {measured['fit_s']:.0f} s")
    print(constants_table(_arch.spec(arch), res["spec_direct"], res["spec"], res["fitted"]))
    return 0 if not bad else 1


def _context_usable() -> bool:
    try:
        from cuda.bindings import driver
        return driver.cuCtxSynchronize()[0] == driver.CUresult.CUDA_SUCCESS
    except Exception:  # noqa: BLE001
        return False


if __name__ == "__main__":
    raise SystemExit(main())
