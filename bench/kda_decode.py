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

    python bench/kda_decode.py --pool [--layouts vk,kv] [--batches 1,2,...,256] [--heads 32]

The library's pool modes instead (`pool_main`): cakelib.kda_decode in place (its plan and each listed
program variant: kda_decode's vw x vsplit, the [K, V] layout's staged and lanes-along-V forms) and copying, against fla's fused_recurrent_kda kernel in place (ht = h0, how
serving engines launch it) and into a separate pool, per B and state layout at H = HV; every impl
checked against the float64 step on the GPU (tasks/kda/torch_ref.py) at the timed shape before it
is timed. Writes kda-decode-pool-h200.json; prints a table last.
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
    ap.add_argument("--pool", action="store_true", help="time cakelib.kda_decode's pool modes (pool_main)")
    ap.add_argument("--layouts", default="vk,kv")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--heads", default="32", help="H = HV values")
    ap.add_argument("--pool-variants", default="8x4,4x8,16x2,8x4s,c2w8b2,c1w8b4,c4w8b2,c2w8b3,c2w16b2",
                    help="program variants timed in place beside the plan: vw x vsplit, s = stage_kv (kv only); "
                         "cVwWbB = kda_decode_kv, V columns per lane, W warps, B CTAs per SM (kv only)")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds: skip the remaining shapes after")
    args = ap.parse_args()
    if args.pool:
        return pool_main(args)
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


# ----------------------------------------------------------------------------- the library's pool modes

def pool_inputs(B: int, H: int, vk: int, safe: int, seed: int = 3) -> dict:
    """Decode inputs on the GPU at serving magnitudes (raw bf16 q, k, v, g, beta logits; the task's
    A_log / dt_bias init; pool states O(0.1 - 1)), pool of P = B slots, idx a permutation."""
    import numpy as np
    import torch

    from tasks.kda.task import gate_params
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(bf)
    A_log, dt_bias = gate_params(H, np.random.default_rng(seed))
    pool = torch.randn(B, H, 128, 128, generator=gen, device=dev) * 0.5
    return {"q": randn(B, H, 128, scale=3.0), "k": randn(B, H, 128, scale=3.0), "v": randn(B, H, 128),
            "g": randn(B, H, 128, scale=1.5), "beta": randn(B, H, scale=2.0),
            "A_log": torch.from_numpy(A_log).to(dev), "dt_bias": torch.from_numpy(dt_bias).to(dev),
            "state": pool, "idx": torch.randperm(B, generator=gen, device=dev).to(torch.int32)}


def pool_reference(x: dict, vk: int, safe: int):
    """float64 (o [B, HV, V], new states of rows idx in the pool's layout) from the torch recurrence."""
    from tasks.kda import torch_ref
    q, k, v, decay, beta = torch_ref.activate(x, x["A_log"], x["dt_bias"], bool(safe))
    S = x["state"][x["idx"].long()].double()
    S, o = torch_ref.step(S if vk else S.transpose(-1, -2), q, k, v, decay, beta)
    return o, (S if vk else S.transpose(-1, -2))


def fla_pool_call(x: dict, vk: int, safe: int, inplace: bool):
    """fla's fused_recurrent_kda kernel as fused_recurrent_kda_fwd launches it for a state pool
    (ssm_state_indices, INPLACE_FINAL_STATE): in place (ht = h0) or into a separate pool."""
    import torch
    import triton
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd_kernel

    from tasks.kda.reference import LOWER_BOUND
    q, k, v, g, beta, state = (x[n] for n in ("q", "k", "v", "g", "beta", "state"))
    B, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    idx = x["idx"].long()
    ht = state if inplace else state.clone()      # the separate pool: rows outside idx as in the input

    def call():
        o = torch.empty_like(v)
        fused_recurrent_kda_fwd_kernel[(triton.cdiv(V, 32) * B * HV,)](
            q=q, k=k, v=v, g=g, beta=beta, A_log=x["A_log"], dt_bias=x["dt_bias"], o=o, h0=state, ht=ht,
            cu_seqlens=None, ssm_state_indices=idx, num_accepted_tokens=None,
            lower_bound=LOWER_BOUND if safe else None, scale=K ** -0.5, N=B, T=1, H=H, HV=HV, K=K, V=V,
            BK=triton.next_power_of_2(K), BV=32, stride_init_state_token=state.stride(0),
            stride_final_state_token=ht.stride(0), stride_indices_seq=1, stride_indices_tok=1,
            IS_BETA_HEADWISE=False, USE_QK_L2NORM_IN_KERNEL=True, INPLACE_FINAL_STATE=True,
            USE_GATE_IN_KERNEL=True, APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False,
            STATE_V_FIRST=bool(vk), num_warps=4, num_stages=2)
        return o, ht
    return call


def pool_impls(x: dict, vk: int, safe: int, variants) -> dict:
    """name -> call returning (o, pool written): cakelib in place (plan, then each variant), copying, fla."""
    from cakelib import kda_decode
    layout = "vk" if vk else "kv"
    args = [x[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]

    def lib(inplace, plan=None):
        return lambda: kda_decode(*args, x["state"], x["idx"], safe_gate=bool(safe), state_layout=layout,
                                  inplace=inplace, plan=plan)
    impls = {"cake_inplace": lib(True), "cake_copy": lib(False)}
    for var in variants:
        plan = pool_variant_plan(var)
        if vk and (plan.get("stage_kv") or plan.get("form") == "cols"):
            continue                                   # the [K, V] layout's forms
        impls[f"cake_inplace_{var}"] = lib(True, plan)
    impls["fla_inplace"] = fla_pool_call(x, vk, safe, True)
    impls["fla_out"] = fla_pool_call(x, vk, safe, False)
    return impls


def pool_variant_plan(var: str) -> dict:
    """A variant's plan: "8x4" / "8x4s" = kda_decode vw x vsplit (s: stage_kv), "c2w8b2" =
    kda_decode_kv with 2 columns per lane, 8 warps, 2 CTAs per SM (the [K, V] layout's cols form)."""
    if var.startswith("c"):
        vec, rest = var[1:].split("w")
        warps, blocks = rest.split("b")
        return {"form": "cols", "vec": int(vec), "warps": int(warps), "blocks": int(blocks)}
    vw, vs = (int(t) for t in var.rstrip("s").split("x"))
    return {"vw": vw, "vsplit": vs, "stage_kv": var.endswith("s")}


def check_pool_impl(fn, x: dict, snap, ref) -> dict:
    """Run once from the snapshot pool; rel RMSE of o and of the rows idx (vs the float64 step), and
    whether the rows outside idx of the pool it wrote kept the snapshot's values."""
    import torch

    from examples import rel_rmse
    x["state"].copy_(snap)
    o, pool = fn()
    torch.cuda.synchronize()
    rows = x["idx"].long()
    errs = {"o": rel_rmse(o, ref[0]), "rows": rel_rmse(pool[rows], ref[1])}
    rest = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    rest[rows] = False
    kept = bool(torch.equal(pool[rest], snap[rest]))
    untouched = pool is x["state"] or bool(torch.equal(x["state"], snap))     # a copying impl: input intact
    return {"rel_rmse": errs, "rest_kept": kept, "input_untouched": untouched,
            "correct": all(e <= TOL for e in errs.values()) and kept and untouched}


def pool_shape_rows(B: int, H: int, vk: int, args, flush) -> list:
    """Check, then time, every impl at one shape (safe gate)."""
    import time

    import torch

    from cakelib.kda_attention import decode_plan
    from examples import timed
    x = pool_inputs(B, H, vk, safe=1)
    snap = x["state"].clone()
    ref = pool_reference(x, vk, 1)
    rows = []
    for name, fn in pool_impls(x, vk, 1, args.pool_variants.split(",")).items():
        row = {"B": B, "H": H, "layout": "vk" if vk else "kv", "impl": name}
        if name in ("cake_inplace", "cake_copy"):
            row["plan"] = decode_plan(B, H, row["layout"], torch.cuda.get_device_properties(0).multi_processor_count)
        t0 = time.time()
        try:
            row.update(check_pool_impl(fn, x, snap, ref))
            if row["correct"]:
                row["time"] = timed(fn, flush, args.reps, warmup=5)
        except Exception as e:  # noqa: BLE001
            row.update(correct=False, error=f"{type(e).__name__}: {e}"[:400])
        row["wall_s"] = round(time.time() - t0, 2)
        rows.append(row)
        ms = row.get("time", {}).get("ms_median")
        print(f"B={B:3d} H={H} {row['layout']} {name:22s} ok={row['correct']} ms={ms} "
              f"err={row.get('rel_rmse')} {row.get('error', '')}", flush=True)
    del x, snap, ref
    torch.cuda.empty_cache()
    return rows


def pool_main(args) -> int:
    """Shapes in the given order until the deadline; the JSON is rewritten after every shape, so a run
    cut short by the caller's timeout keeps what it measured."""
    import time

    from examples import env_info, l2_flusher
    t_end = time.time() + args.deadline
    flush = l2_flusher()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "kda-decode-pool-h200.json")
    doc = {"env": env_info(("torch", "triton", "fla-core", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/kda_decode.py"),
           "tolerance": TOL, "reps": args.reps, "gate": "safe", "skipped_by_deadline": [], "rows": []}
    for H in (int(h) for h in args.heads.split(",")):
        for layout in args.layouts.split(","):
            for B in (int(b) for b in args.batches.split(",")):
                if time.time() > t_end:
                    doc["skipped_by_deadline"].append({"B": B, "H": H, "layout": layout})
                else:
                    doc["rows"] += pool_shape_rows(B, H, int(layout == "vk"), args, flush)
                with open(path, "w") as f:
                    json.dump(doc, f, indent=1, default=str)
    print(f"\nwrote {path}  (skipped by deadline: {len(doc['skipped_by_deadline'])})\n")
    print_pool_table(doc["rows"])
    return 0


def print_pool_table(rows) -> None:
    """Per shape: ms of cakelib in place / copy / best variant, fla in place / out, and the speedup of
    cakelib in place over fla in place; all-correct flag."""
    def ms(rs, name):
        r = next((r for r in rs if r["impl"] == name and r.get("correct")), None)
        return r["time"]["ms_median"] if r else float("nan")
    print(f"{'H':>3} {'lay':>3} {'B':>4} | {'cake_inpl':>9} {'cake_copy':>9} {'best variant':>22} | "
          f"{'fla_inpl':>8} {'fla_out':>8} | {'fla/cake':>8} | ok")
    keys = sorted({(r["H"], r["layout"], r["B"]) for r in rows}, key=lambda k: (k[0], k[1] != "vk", k[2]))
    for H, lay, B in keys:
        rs = [r for r in rows if (r["H"], r["layout"], r["B"]) == (H, lay, B)]
        var = [r for r in rs if r["impl"].startswith("cake_inplace_") and r.get("correct")]
        best = min(var, key=lambda r: r["time"]["ms_median"]) if var else None
        bs = f"{best['time']['ms_median']:.4f} ({best['impl'][13:]})" if best else "-"
        ci, fi = ms(rs, "cake_inplace"), ms(rs, "fla_inplace")
        print(f"{H:>3} {lay:>3} {B:>4} | {ci:9.4f} {ms(rs, 'cake_copy'):9.4f} {bs:>22} | {fi:8.4f} "
              f"{ms(rs, 'fla_out'):8.4f} | {fi / ci:8.2f} | {all(r.get('correct') for r in rs)}")


if __name__ == "__main__":
    sys.exit(main())
