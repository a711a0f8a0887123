"""KDA decode on the GPU: the CAKE IR decode kernel (tasks/kda_decode/programs.py, every `vw` of its
family) against fla's `fused_recurrent_kda` kernel, checked and timed in the same process.

    python bench/kda_decode.py [--reps 200] [--out bench/results]

Per shape of the task's bench set (B = 1, 16, 64, 256, H = HV = 32, both gate forms) and both state
layouts: fresh seeded inputs from the task, outputs poisoned with NaN, the float64 recurrence on the
host (tasks/kda/reference.py), rel RMSE <= 5e-3 for o and the updated pool, then timed two ways, L2
flushed before every repetition, median of CUDA-event times:
- `per_call`: events around one call from Python (launch overhead included, no CUDA graph), the way
  the anchors in ../shared/anchors/h200.json were measured; CAKE launches with prepared arguments
  (what a serving loop or cakelib does), fla through its Triton launcher;
- `graph`: the same call captured once in a CUDA graph and replayed (what serving engines do).
Writes kda-decode-h200.json; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

TOL = 5e-3


def graph_of(fn):
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--variants", default="8x1,8x2,8x4,16x1,16x2",
                    help="decode-family variants to time, vw x vsplit (value columns per warp x CTAs per head)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    import torch

    from agent.baselines import kda_decode_fla
    from examples import compile_variants, env_info, l2_flusher, rel_rmse, timed, to_torch
    from tasks.kda.task import DECODE_TASK as task
    from tasks.kda_decode.programs import kda_decode

    dev = torch.device("cuda")
    flush = l2_flusher()
    points = [tuple(int(v) for v in var.split("x")) for var in args.variants.split(",")]
    kernels = compile_variants({f"cake_vw{vw}_vs{vs}": kda_decode(vw=vw, vsplit=vs, arch="sm_90a") for vw, vs in points})
    shapes = [dict(s, VK=vk) for s in task.bench_shapes for vk in (1, 0)]
    rows = []
    for shape in shapes:
        x = task.make_inputs(shape, seed=11)
        ref = task.reference(x, shape)
        specs = {t.name: t for t in task.inputs(shape)}
        ti = {n: to_torch(a, specs[n].dtype, dev) for n, a in x.items()}
        scal = task.scalars(shape)
        impls = {}
        for name, (ck, _res) in kernels.items():
            o = torch.full(tuple(ti["v"].shape), float("nan"), dtype=torch.bfloat16, device=dev)
            so = torch.full(tuple(ti["state"].shape), float("nan"), dtype=torch.float32, device=dev)
            prep = ck.prepare({**ti, "o": o, "state_out": so}, scal)
            # the stream is read per call: under CUDA-graph capture torch's current stream is the capture stream
            impls[name] = (lambda ck=ck, prep=prep: ck.launch_prepared(prep, torch.cuda.current_stream().cuda_stream),
                           {"o": o, "state_out": so})
        box = {}

        def fla_call():
            box.update(kda_decode_fla(ti, shape))
        impls["fla_fused_recurrent_kda"] = (fla_call, box)
        for name, (fn, outs) in impls.items():
            row = {"shape": shape, "impl": name}
            try:
                fn()
                torch.cuda.synchronize()
                errs = {n: rel_rmse(outs[n], ref[n]) for n in ("o", "state_out")}
                row["rel_rmse"] = errs
                row["correct"] = all(e <= TOL for e in errs.values())
                if row["correct"]:
                    row["per_call"] = timed(fn, flush, args.reps, warmup=10)
                    g = graph_of(fn)
                    row["graph"] = timed(g.replay, flush, args.reps, warmup=10)
                    for n in ("o", "state_out"):       # the replay itself must produce the outputs
                        outs[n].fill_(float("nan"))
                    g.replay()
                    torch.cuda.synchronize()
                    after = {n: rel_rmse(outs[n], ref[n]) for n in ("o", "state_out")}
                    row["correct"] = all(e <= TOL for e in after.values())
                    row["rel_rmse_after_graph_replay"] = after
            except Exception as e:  # noqa: BLE001
                row["correct"] = False
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            pc = row.get("per_call", {}).get("ms_median")
            gr = row.get("graph", {}).get("ms_median")
            print(f"B={shape['B']:3d} SAFE={shape['SAFE']} VK={shape['VK']} {name:26s} ok={row['correct']} "
                  f"per_call={pc} graph={gr} err={row.get('rel_rmse')} {row.get('error', '')}", flush=True)
        del ti, impls
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    doc = {"env": env_info(("torch", "triton", "fla-core", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/kda_decode.py"),
           "tolerance": TOL, "reps": args.reps,
           "resources": {n: r for n, (_ck, r) in kernels.items()}, "rows": rows}
    path = os.path.join(args.out, "kda-decode-h200.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"\nwrote {path}\n")
    print(f"{'B':>4} {'SAFE':>4} {'VK':>2} | {'fla per_call':>12} {'best CAKE per_call':>24} | {'fla graph':>9} "
          f"{'best CAKE graph':>22} | all CAKE correct")
    for shape in shapes:
        rs = [r for r in rows if r["shape"] == shape]
        fla = next(r for r in rs if r["impl"].startswith("fla"))
        cake = [r for r in rs if r["impl"].startswith("cake") and r["correct"]]

        def best(mode):
            if not cake:
                return "-"
            r = min(cake, key=lambda r: r[mode]["ms_median"])
            return f"{r[mode]['ms_median']:.4f} ({r['impl'][5:]})"
        fp = fla.get("per_call", {}).get("ms_median", float("nan"))
        fg = fla.get("graph", {}).get("ms_median", float("nan"))
        allok = all(r["correct"] for r in rs if r["impl"].startswith("cake"))
        print(f"{shape['B']:>4} {shape['SAFE']:>4} {shape['VK']:>2} | {fp:12.4f} {best('per_call'):>24} | {fg:9.4f} "
              f"{best('graph'):>22} | {allok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
