"""KDA prefill on the GPU: the CAKE IR prefill family (tasks/kda/programs.py) against fla `chunk_kda`
(and FlashKDA where it is installed), checked and timed in the same process.

    python bench/kda_prefill.py [--reps 20] [--variants 8x4x32,...] [--shapes 0,1,...] [--out DIR]

Per shape of the issue's benchmark set (tasks/kda/shapes.py PREFILL_BENCH, both gate forms): fresh
seeded task inputs, outputs poisoned with NaN, a float64 reference of the token recurrence computed on
the GPU with torch (checked against the numpy reference of tasks/kda/reference.py on a small shape in
the same run), rel RMSE <= 5e-3 for o and ht; then the median of CUDA-event times per call from Python
with the L2 flushed before each repetition (CAKE launches with prepared arguments). Writes
kda-prefill-h200.json and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

TOL = 5e-3


def reference_gpu(x: dict, shape: dict, device: str = "cuda"):
    """The float64 token recurrence (tasks/kda/torch_ref.py) on the task's numpy inputs, states in the
    shape's layout: (o [T, HV, V], ht) as torch tensors on `device`."""
    from tasks.kda.torch_ref import reference_tensors
    return reference_tensors(x, shape, device)


def self_check(device: str = "cuda") -> float:
    """The torch float64 reference against the numpy one: a varlen softplus shape with h0 in each state
    layout, and a varlen safe-gate shape without h0 (grouped value heads in both packs)."""
    import numpy as np
    from tasks.kda.shapes import PREFILL_TEST
    from tasks.kda.task import TASK
    worst = 0.0
    for shape in (PREFILL_TEST[0], PREFILL_TEST[2], PREFILL_TEST[3]):
        x = TASK.make_inputs(shape, seed=3)
        ref = TASK.reference(x, shape, method="recurrent")
        o, ht = reference_gpu(x, shape, device)
        for a, b in ((o, ref["o"]), (ht, ref["ht"])):
            worst = max(worst, float(np.linalg.norm(a.cpu().numpy() - b) / np.linalg.norm(b)))
    return worst


def summarize(rows: list, shapes: list) -> float:
    """Print the per-shape table (fla, the fastest correct CAKE kernel, speedup) and return the
    geometric-mean speedup over fla chunk_kda (nan if no shape has both)."""
    import math
    print(f"{'T':>6} {'N':>2} {'H':>3} {'gate':>8} | {'fla ms':>7} {'best CAKE ms':>26} {'speedup':>7} | "
          f"{'plan ms':>7} {'plan x':>6} | all CAKE correct")
    logs, plan_logs = [], []
    for shape in shapes:
        rs = [r for r in rows if r["shape"] == shape]
        if not rs:
            continue
        fla = next((r for r in rs if r["impl"] == "fla_chunk_kda" and r.get("timing")), None)
        cake = [r for r in rs if r["impl"].startswith("cake") and r["correct"]]
        b = min(cake, key=lambda r: r["timing"]["ms_median"]) if cake else None
        fms = fla["timing"]["ms_median"] if fla else float("nan")
        bms = b["timing"]["ms_median"] if b else float("nan")
        if fla and b:
            logs.append(math.log(fms / bms))
        plan = next((r for r in cake if r["impl"].startswith("cake_plan_")), None)
        pms = plan["timing"]["ms_median"] if plan else float("nan")
        if fla and plan:
            plan_logs.append(math.log(fms / pms))
        allok = all(r["correct"] for r in rs if r["impl"].startswith("cake"))
        print(f"{shape['T']:>6} {shape['N']:>2} {shape['H']:>3} {'safe' if shape['SAFE'] else 'softplus':>8} | "
              f"{fms:7.3f} {bms:9.3f} ({b['impl'][5:] if b else '-':>15}) {fms / bms:7.2f} | "
              f"{pms:7.3f} {fms / pms:6.2f} | {allok}")
    if logs:
        print(f"geomean speedup over fla chunk_kda: {math.exp(sum(logs) / len(logs)):.2f}x over {len(logs)} shapes")
    if plan_logs:
        print(f"geomean speedup of the library's plan (cakelib.kda_prefill) over fla chunk_kda: "
              f"{math.exp(sum(plan_logs) / len(plan_logs)):.2f}x over {len(plan_logs)} shapes")
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="8x2x32,8x4x32",
                    help="recurrent prefill-family points to time, vw x vsplit x chunk (the chunked kernels are "
                         "timed at vs 32 / 64 / 128 (safe gate) and 32 / 64 (softplus) unless --no-chunked)")
    ap.add_argument("--shapes", default="", help="indices into PREFILL_BENCH (default: all)")
    ap.add_argument("--extra", default="", help="more single-sequence shapes T:H[:SAFE];... outside the issue's set "
                    "(e.g. 32768:8 for the sequence-parallel form's small-H case); both gates unless SAFE given")
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument("--no-chunked", action="store_true", help="skip the chunked kernels (tasks/kda/chunked.py)")
    ap.add_argument("--splits", default="", help="extra chunked points, producers x consumers (e.g. 2x2,3x4), "
                                                   "at every V-slice where they build")
    ap.add_argument("--two-pass", default="32x1x3x4,32x2x4x4,32x1x2x4,64x1x3x4,64x1x2x4,128x1x2x8",
                    help="two-pass points (tasks/kda/two_pass.py), vs x prepare warps x stages x consumers [x segment "
                         "chunks: the sequence-parallel form, tasks/kda/seq_parallel.py][:copy mechanism, e.g. :bulk]"
                         "[@chunk: tokens per chunk, 16 (default) or 32, e.g. 32x2x2x2:bulk@32 or 64x1x2x4@32]; "
                         "the first also times its prepare kernel alone (part_, not a candidate)")
    ap.add_argument("--plan", action="store_true",
                    help="also time, per shape, the program cakelib.kda_prefill picks there (prefill_plan on this "
                         "GPU: what a user calling the library gets), as cake_plan_<program>")
    ap.add_argument("--no-baselines", action="store_true", help="CAKE kernels only (a quick check; no speedups)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    import torch

    from agent.baselines import kda_chunk_fla, kda_flashkda
    from examples import compile_variants, env_info, l2_flusher, rel_rmse, timed, to_torch
    from tasks.kda.programs import kda_recurrent
    from tasks.kda.shapes import PREFILL_BENCH
    from tasks.kda.task import TASK as task

    t_start = time.time()
    dev = torch.device("cuda")
    flush = l2_flusher()

    check = self_check()
    print(f"GPU float64 reference vs numpy reference: rel error {check:.2e}", flush=True)
    if not check < 1e-10:
        raise SystemExit("the torch float64 reference disagrees with tasks/kda/reference.py")
    irs = {}
    for var in filter(None, args.variants.split(",")):
        vw, vs, ch = (int(v) for v in var.split("x"))
        irs[f"cake_vw{vw}_vs{vs}_c{ch}"] = kda_recurrent(vw=vw, vsplit=vs, chunk=ch, arch="sm_90a")
    if not args.no_chunked:          # the chunked kernels, one gate form each: checked like the rest
        from tasks.kda.chunked import kda_chunk16_ws, point_problem
        splits = [(4, 4)] + [tuple(int(v) for v in sp.split("x")) for sp in filter(None, args.splits.split(","))]
        for vs, safe in ((32, True), (64, True), (128, True), (32, False), (64, False)):
            for p, c in splits:
                if point_problem(vs, safe, p, c) or p + c > 8:    # more than 8 warps: E-RES-05
                    continue
                ir = kda_chunk16_ws(arch="sm_90a", vs=vs, safe=safe, producers=p, consumers=c)
                irs["cake_" + ir.name.removeprefix("kda_")] = ir      # cake_chunk16_ws_vs64_softplus_p2c2
    from tasks.kda.two_pass import kda_two_pass, two_pass_problem
    for i, pt in enumerate(filter(None, args.two_pass.split(","))):
        pt, _, chunk = pt.partition("@")
        dims, _, copy = pt.partition(":")
        vs, w, st, nc, seg = ([int(v) for v in dims.split("x")] + [0])[:5]
        copy, chunk = copy or "cp_async", int(chunk or 16)
        for safe in (True, False):
            why = two_pass_problem(vs, safe, w, st, nc, seg, copy, "sm_90a", chunk)
            if why:
                print(f"two-pass point {pt}@{chunk} ({'safe' if safe else 'softplus'}) skipped: {why}", flush=True)
                continue
            prog = kda_two_pass(arch="sm_90a", vs=vs, safe=safe, warps=w, stages=st, consumers=nc, segments=seg,
                                copy=copy, chunk=chunk)
            irs["cake_" + prog.name.removeprefix("kda_")] = prog
            if i == 0:          # pass 1 alone: the recurrence's share is the difference
                irs["part_" + prog.kernels[0].name.removeprefix("kda_")] = prog.model_copy(
                    update={"name": prog.kernels[0].name, "kernels": prog.kernels[:1]})
    idx = [int(i) for i in args.shapes.split(",")] if args.shapes else range(len(PREFILL_BENCH))
    shapes = [PREFILL_BENCH[i] for i in idx] if (args.shapes or not args.extra) else []
    for spec in filter(None, args.extra.split(";")):
        T, H, *gate = (int(v) for v in spec.split(":"))
        shapes += [{"T": T, "N": 1, "H": H, "HV": H, "SAFE": sf, "VK": 1, "H0": 1, "PACK": 0}
                   for sf in (gate or [1, 0])]
    planned = {}         # shape index -> the plan's kernel name
    if args.plan:
        from cakelib.kda_attention import prefill_plan
        from gpu_backend.driver import properties
        sms = properties(0).get("sms", 132)
        for i, shape in enumerate(shapes):
            kind, params = prefill_plan(shape["H"], shape["HV"], shape["N"], bool(shape["SAFE"]), "sm_90a", sms,
                                        shape["T"])
            if kind != "two_pass":
                raise SystemExit(f"the sm_90a plan is a two-pass program, not {kind}")
            prog = kda_two_pass(arch="sm_90a", **params)
            planned[i] = "cake_plan_" + prog.name.removeprefix("kda_")
            irs[planned[i]] = prog
    kernels = compile_variants(irs)
    info = env_info(("torch", "triton", "fla-core", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/kda_prefill.py")

    def save() -> str:      # after every shape: a timeout keeps what was measured
        os.makedirs(args.out, exist_ok=True)
        doc = {"env": info, "tolerance": TOL, "reps": args.reps, "reference_self_check": check,
               "resources": {n: r for n, (_ck, r) in kernels.items()}, "rows": rows}
        path = os.path.join(args.out, "kda-prefill-h200.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        return path

    rows = []
    stream = 0
    for si, shape in enumerate(shapes):
        if time.time() - t_start > args.deadline_s:
            print("deadline reached; shapes left:", shape)
            break
        x = task.make_inputs(shape, seed=17)
        specs = {t.name: t for t in task.inputs(shape)}
        ti = {n: to_torch(a, specs[n].dtype, dev) for n, a in x.items()}
        ref_o, ref_ht = reference_gpu(x, shape)
        scal = task.scalars(shape)
        impls = {}
        for name, (ck, _r) in kernels.items():
            if name.startswith("cake_plan_") and planned.get(si) != name:
                continue                       # another shape's plan
            if (name.startswith(("cake_chunk16", "cake_two_pass", "cake_seq_parallel", "part_"))
                    and ("softplus" in name) == bool(shape["SAFE"])):
                continue                       # one gate form per chunked kernel (its SAFE fact)
            o = torch.full(tuple(ti["v"].shape), float("nan"), dtype=torch.bfloat16, device=dev)
            ht = torch.full(tuple(ti["h0"].shape), float("nan"), dtype=torch.float32, device=dev)
            prep = ck.prepare({**ti, "o": o, "ht": ht}, scal)
            impls[name] = (lambda ck=ck, prep=prep: ck.launch_prepared(prep, stream), {"o": o, "ht": ht})
        baselines = () if args.no_baselines else (("fla_chunk_kda", kda_chunk_fla), ("flashkda", kda_flashkda))
        for bname, fn in baselines:
            box = {}
            impls[bname] = (lambda fn=fn, box=box: box.update(fn(ti, shape)), box)
        for name, (fn, outs) in impls.items():
            row = {"shape": shape, "impl": name}
            try:
                fn()
                torch.cuda.synchronize()
                errs = {"o": rel_rmse(outs["o"], ref_o), "ht": rel_rmse(outs["ht"], ref_ht)}
                row["rel_rmse"] = errs
                row["correct"] = all(e <= TOL for e in errs.values())
                if name.startswith("part_"):       # writes no output: timed only
                    row["correct"], row["rel_rmse"] = None, None
                row["timing"] = timed(fn, flush, args.reps, warmup=3)
                if name.startswith("cake"):
                    fn()
                    torch.cuda.synchronize()
                    after = {"o": rel_rmse(outs["o"], ref_o), "ht": rel_rmse(outs["ht"], ref_ht)}
                    row["rel_rmse_after_timing"] = after
                    row["correct"] = row["correct"] and all(e <= TOL for e in after.values())
            except (ImportError, TypeError) as e:
                row["correct"], row["unavailable"] = None, f"{type(e).__name__}: {e}"[:300]
            except Exception as e:  # noqa: BLE001
                row["correct"], row["error"] = False, f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            ms = row.get("timing", {}).get("ms_median")
            print(f"T={shape['T']} N={shape['N']} H={shape['H']} SAFE={shape['SAFE']} {name:24s} ok={row['correct']} "
                  f"ms={ms} err={row.get('rel_rmse')} {row.get('error', row.get('unavailable', ''))[:120]}", flush=True)
        save()
        del ti, impls, ref_o, ref_ht
        torch.cuda.empty_cache()
    path = save()
    print(f"\nwrote {path}\n")
    summarize(rows, shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
