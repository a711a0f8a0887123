"""KDA layer, serving-level: the CAKE KDA prefill and decode kernels inside a Kimi Delta Attention layer
with random weights, checked at every step against a float64 token recurrence.

    python bench/kda_layer.py [--out DIR] [--lens 37,300,1,64,129] [--steps 16] [--no-fla]

Per gate form (SAFE = 1 lower-bound gate, SAFE = 0 softplus gate):
- prefill: N packed sequences (cu_seqlens) through the layer. CAKE prefill kernel (by default
  cakelib.kda_prefill, the library call, which runs the program its prefill_plan picks; --prefill-variant
  two_pass for the vs 32 two-pass program of tasks/kda/two_pass.py, chunked for the single
  kernel of tasks/kda/chunked.py, 8x4x32 for the recurrent
  tasks/kda/programs.py; H0 = 0 with a NaN h0 that must not be read, VK = 1: states [N, H, V, K]) against the float64
  recurrence started from zeros: layer output y [T, D], core output o, final states;
- decode: --steps token-by-token steps for all N sequences at once, each path continuing from its own
  prefill states. States live in a pool arranged by slot (sequence b in slot idx[b], idx a fixed random
  permutation); the CAKE decode kernel (tasks/kda_decode/programs.py) gathers and scatters by idx. y, o
  and the whole pool are compared after every step;
- harness: the float64 path's decode outputs and pool must equal a float64 prefill of the sequences
  extended by the decoded tokens (conv cache, pool arrangement and state hand-off are right).
The part of the layer before the core depends on x only (the conv cache too), so it is computed once
and both paths get bit-identical bf16 kernel inputs; the output part (per-head RMSNorm, sigmoid
output gate, o_proj) runs in float64 for every path, so y differs only through the cores.
Pass: every CAKE rel RMSE <= 5e-3, no NaN. fla (chunk_kda + fused_recurrent_kda, agent/baselines.py)
runs as a third path for information when importable. Writes kda-layer-h200.json into --out;
exit code 0 on pass, 1 on fail.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.examples import env_info, rel_rmse  # noqa: E402  (stdlib only; torch is imported lazily)

TOL = 5e-3
K = V = 128
CONV = 4              # short-convolution width (fla ShortConvolution, conv_size=4)
NORM_EPS = 1e-5


# --------------------------------------------------------------------------- the layer around the core
def conv_prefill(p, w, cu):
    """Depthwise causal conv + SiLU per packed sequence (zero history at each start), float32.
    Returns the activations and each sequence's last CONV - 1 inputs, the decode cache [N, CONV-1, C]."""
    import torch
    out, caches = torch.empty_like(p), []
    for s, e in zip(cu[:-1], cu[1:]):
        xs = torch.cat([p.new_zeros(CONV - 1, p.shape[1]), p[s:e]])
        out[s:e] = torch.nn.functional.silu(sum(w[:, j] * xs[j:j + e - s] for j in range(CONV)))
        caches.append(xs[xs.shape[0] - (CONV - 1):])       # zero-padded when the sequence is short
    return out, torch.stack(caches)


def conv_step(p, w, cache):
    """One token per sequence (p [N, C]) with the cache; the same sum order as conv_prefill, so a
    decode step reproduces the prefill of the extended sequence bit for bit."""
    import torch
    xs = torch.cat([cache, p[:, None]], 1)
    return torch.nn.functional.silu(sum(w[:, j] * xs[:, j] for j in range(CONV))), xs[:, 1:]


class KdaLayer:
    """fla KimiDeltaAttention in shape (num_v_heads = num_heads, head dims 128, conv 4, low-rank f and
    output gates of rank 128); bf16 weights ~ N(0, 1 / fan_in) so activations are O(1)."""

    def __init__(self, D: int, H: int, seed: int, dev):
        import numpy as np
        import torch
        from tasks.kda.task import gate_params
        gen = torch.Generator().manual_seed(seed)
        C = H * K

        def lin(i, o):
            return (torch.randn(o, i, generator=gen) / math.sqrt(i)).to(dev, torch.bfloat16)
        self.D, self.H = D, H
        self.w = {"q": lin(D, C), "k": lin(D, C), "v": lin(D, C), "f1": lin(D, K), "f2": lin(K, C),
                  "b": lin(D, H), "g1": lin(D, V), "g2": lin(V, C), "o": lin(C, D)}
        self.conv = {n: (torch.randn(C, CONV, generator=gen) / math.sqrt(CONV)).to(dev, torch.bfloat16)
                     for n in "qkv"}
        self.norm_w = torch.ones(V, dtype=torch.bfloat16, device=dev)
        A_log, dt_bias = gate_params(H, np.random.default_rng(seed))     # Kimi Linear's init
        self.A_log, self.dt_bias = torch.from_numpy(A_log).to(dev), torch.from_numpy(dt_bias).to(dev)

    def _mm(self, x, *names):
        """bf16 weights, float32 math (a chain for the low-rank projections)."""
        x = x.float()
        for n in names:
            x = x @ self.w[n].float().T
        return x

    def project(self, x, cu=None, cache=None):
        """x [T, D] packed by cu (prefill) or [N, D] with the conv cache (decode) -> the bf16 kernel inputs
        {q, k, v [n, H, 128], g (raw gate input f) [n, H, 128], beta logits [n, H]}, the output-gate
        input [n, H, V] (float32) and the new conv cache."""
        import torch
        n, bf = x.shape[0], torch.bfloat16
        act, new_cache = {}, {}
        for c in "qkv":
            p, w = self._mm(x, c), self.conv[c].float()
            act[c], new_cache[c] = conv_prefill(p, w, cu) if cache is None else conv_step(p, w, cache[c])
        kin = {c: act[c].to(bf).view(n, self.H, K) for c in "qkv"}
        kin["g"] = self._mm(x, "f1", "f2").to(bf).view(n, self.H, K)
        kin["beta"] = self._mm(x, "b").to(bf).contiguous()
        return kin, self._mm(x, "g1", "g2").view(n, self.H, V), new_cache

    def output(self, o, gate):
        """Per-head RMSNorm of o, gated by sigmoid(gate), then o_proj; float64 whatever o's dtype."""
        import torch
        o = o.double()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.norm_w.double()
        return (o * torch.sigmoid(gate.double())).flatten(1) @ self.w["o"].double().T


# --------------------------------------------------------------------------- cores: one interface
class ReferenceCore:
    """The float64 token recurrence (tasks/kda/torch_ref.py); prefill from zeros, decode from its own pool."""

    def prefill(self, x, A_log, dt_bias, cu, safe):
        from tasks.kda.torch_ref import prefill
        return prefill(x, A_log, dt_bias, cu.tolist(), safe)

    def decode(self, x, A_log, dt_bias, pool, idx, safe):
        from tasks.kda.torch_ref import activate, step
        S, o = step(pool[idx.long()], *activate(x, A_log, dt_bias, safe))
        out = pool.clone()
        out[idx.long()] = S
        return o, out


def _nan(shape, dtype):
    import torch
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


class CakeCore:
    """The CAKE kernels, state layout VK = 1; outputs poisoned with NaN so an unwritten value fails."""

    def __init__(self, arch: str, prefill: str, decode: str):
        from gpu_backend.candidate import compile_candidate
        from gpu_backend.runner import CompiledKernel
        from tasks.kda.programs import kda_recurrent
        from tasks.kda_decode.programs import kda_decode

        def build(ir):           # a Kernel or a Program (the two-pass prefill)
            comp = compile_candidate(ir, arch)
            if not comp.ok:
                raise RuntimeError(f"{ir.name}: " + "; ".join(f"{d['code']} at {d['node']}: {d['message']}"
                                                              for d in comp.diagnostics[:3]))
            return CompiledKernel.from_spec(comp.spec)
        self.plan = prefill == "plan"
        if self.plan:                   # what a user gets: cakelib.kda_prefill and its prefill_plan
            self.pre = None
        elif prefill == "two_pass":       # prepare + recurrence per gate form (tasks/kda/two_pass.py)
            from tasks.kda.two_pass import kda_two_pass
            self.pre = {safe: build(kda_two_pass(arch=arch, vs=32, safe=bool(safe))) for safe in (0, 1)}
        elif prefill == "chunked":        # the chunked kernels, one per gate form (tasks/kda/chunked.py)
            from tasks.kda.chunked import kda_chunk16_ws
            self.pre = {safe: build(kda_chunk16_ws(arch=arch, vs=32, safe=bool(safe))) for safe in (0, 1)}
        else:
            vw, vs, ch = (int(a) for a in prefill.split("x"))
            rec = build(kda_recurrent(vw=vw, vsplit=vs, chunk=ch, arch=arch))
            self.pre = {0: rec, 1: rec}
        vw, vs = (int(a) for a in decode.split("x"))
        self.dec = build(kda_decode(vw=vw, vsplit=vs, arch=arch))

    def prefill(self, x, A_log, dt_bias, cu, safe):
        import torch
        (T, H, _), N = x["q"].shape, cu.numel() - 1
        if self.plan:
            from cakelib import kda_prefill
            return kda_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log, dt_bias, cu_seqlens=cu,
                               safe_gate=bool(safe), state_layout="vk")
        o, ht = _nan((T, H, V), torch.bfloat16), _nan((N, H, V, K), torch.float32)
        self.pre[int(safe)]({**x, "A_log": A_log, "dt_bias": dt_bias, "h0": _nan((N, H, V, K), torch.float32),
                  "cu_seqlens": cu, "o": o, "ht": ht},
                 {"T": T, "N": N, "H": H, "HV": H, "SAFE": int(safe), "VK": 1, "H0": 0},
                 stream=torch.cuda.current_stream().cuda_stream)
        return o, ht

    def decode(self, x, A_log, dt_bias, pool, idx, safe):
        import torch
        B, H, _ = x["q"].shape
        o, out = _nan((B, H, V), torch.bfloat16), _nan(tuple(pool.shape), torch.float32)
        self.dec({**x, "A_log": A_log, "dt_bias": dt_bias, "state": pool, "idx": idx, "o": o, "state_out": out},
                 {"B": B, "H": H, "HV": H, "SAFE": int(safe), "VK": 1},
                 stream=torch.cuda.current_stream().cuda_stream)
        return o, out


class FlaCore:
    """fla-core's chunk_kda (prefill) and fused_recurrent_kda kernel (decode), launched as in
    agent/baselines.py (state_v_first, so the same pool layout); information only."""

    def prefill(self, x, A_log, dt_bias, cu, safe):
        from agent.baselines import kda_chunk_fla
        # the baselines take index tensors as float (the task harness's convention)
        r = kda_chunk_fla({**x, "A_log": A_log, "dt_bias": dt_bias, "cu_seqlens": cu.float()},
                          {"SAFE": int(safe), "VK": 1, "H0": 0, "N": cu.numel() - 1})
        return r["o"], r["ht"]

    def decode(self, x, A_log, dt_bias, pool, idx, safe):
        from agent.baselines import kda_decode_fla
        r = kda_decode_fla({**x, "A_log": A_log, "dt_bias": dt_bias, "state": pool, "idx": idx.float()},
                           {"SAFE": int(safe), "VK": 1})
        return r["o"], r["state_out"]


# --------------------------------------------------------------------------- the experiment
def run_gate(layer, cores: dict, lens: list, steps: int, safe: int, seed: int) -> tuple[list, dict]:
    """Prefill + decode for one gate form; rows of {step, <core>: {y, o, state}} and the harness check."""
    import torch
    dev, D, N = layer.A_log.device, layer.D, len(lens)
    cu_l = [0]
    for n in lens:
        cu_l.append(cu_l[-1] + n)
    cu = torch.tensor(cu_l, dtype=torch.int32, device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed + 1)     # the same tokens for both gate forms
    x = torch.randn(cu_l[-1], D, generator=gen, device=dev).to(torch.bfloat16)
    xd = [torch.randn(N, D, generator=gen, device=dev).to(torch.bfloat16) for _ in range(steps)]
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed + 2))
    idx = perm.to(dev, torch.int32)                               # sequence b -> pool slot idx[b]
    ap = (layer.A_log, layer.dt_bias)
    ref, others = cores["ref"], {n: c for n, c in cores.items() if n != "ref"}
    pools, rows, ys_ref = {}, [], []

    def to_pool(ht):
        pool = torch.empty_like(ht)
        pool[idx.long()] = ht
        return pool

    def compare(step, kin, gate, call):
        """Runs every core for one step (reference first) and records rel RMSE against it."""
        o_r, s_r = call(ref, "ref", kin)
        y_r = layer.output(o_r, gate)
        row = {"step": step}
        for name, core in list(others.items()):
            try:
                o, s = call(core, name, kin)
                row[name] = {"y": rel_rmse(layer.output(o, gate), y_r), "o": rel_rmse(o, o_r),
                             "state": rel_rmse(s, s_r)}
            except Exception as e:  # noqa: BLE001  (a broken path is recorded and dropped)
                row[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
                del others[name]
        rows.append(row)
        return y_r

    def pre(core, name, kin):
        o, ht = core.prefill(kin, *ap, cu, safe)
        pools[name] = to_pool(ht)
        return o, pools[name]

    def dec(core, name, kin):
        o, pools[name] = core.decode(kin, *ap, pools[name], idx, safe)
        return o, pools[name]

    kin, gate, cache = layer.project(x, cu=cu_l)
    compare("prefill", kin, gate, pre)
    for t in range(steps):
        kin, gate, cache = layer.project(xd[t], cache=cache)
        ys_ref.append(compare(t + 1, kin, gate, dec))
    if not steps:
        return rows, {}
    # harness: the float64 decode chain equals a float64 prefill of the extended sequences
    ext = torch.cat([torch.cat([x[s:e], torch.stack([xt[b] for xt in xd])])
                     for b, (s, e) in enumerate(zip(cu_l[:-1], cu_l[1:]))])
    cu_e = [c + i * steps for i, c in enumerate(cu_l)]
    kin, gate, _ = layer.project(ext, cu=cu_e)
    o, ht = ref.prefill(kin, *ap, torch.tensor(cu_e, dtype=torch.int32, device=dev), safe)
    y = layer.output(o, gate)
    tail = torch.cat([y[e - steps:e] for e in cu_e[1:]])              # sequence-major, [N * steps, D]
    harness = {"y": rel_rmse(torch.stack(ys_ref, 1).reshape(N * steps, D), tail),
               "state": rel_rmse(pools["ref"], to_pool(ht))}
    return rows, harness


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size D")
    ap.add_argument("--heads", type=int, default=8, help="heads H (= value heads; head dims 128)")
    ap.add_argument("--lens", default="37,300,1,64,129", help="packed sequence lengths")
    ap.add_argument("--steps", type=int, default=16, help="decode steps after the prefill")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill-variant", default="plan",
                    help="'plan' (cakelib.kda_prefill: the kernel its prefill_plan picks for the batch), "
                         "'two_pass' (tasks/kda/two_pass.py, vs 32), 'chunked' (tasks/kda/chunked.py), per gate form, "
                         "or kda_recurrent vw x vsplit x chunk")
    ap.add_argument("--decode-variant", default="8x4", help="kda_decode vw x vsplit")
    ap.add_argument("--fla", action=argparse.BooleanOptionalAction, default=True,
                    help="also run fla's kernels (information only; skipped when fla is not importable)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    import torch
    from gpu_backend.driver import arch_of, context, properties
    if not torch.cuda.is_available():
        print("kda_layer: needs a CUDA GPU")
        return 2
    torch.zeros(1, device="cuda")          # torch creates the primary context, the CAKE runner shares it
    context(0)
    arch = arch_of(properties(0))
    lens = [int(n) for n in args.lens.split(",")]
    layer = KdaLayer(args.hidden, args.heads, args.seed, torch.device("cuda"))
    cores, fla_note = {"ref": ReferenceCore(), "cake": CakeCore(arch, args.prefill_variant, args.decode_variant)}, None
    if args.fla:
        try:
            import fla.ops.kda  # noqa: F401
            cores["fla"] = FlaCore()
        except Exception as e:  # noqa: BLE001
            fla_note = f"fla unavailable: {type(e).__name__}: {e}"[:300]
    results, ok = {}, True
    with torch.no_grad():
        for safe in (1, 0):
            rows, harness = run_gate(layer, cores, lens, args.steps, safe, args.seed)
            cake = [r.get("cake", {}) for r in rows]
            vals = [v for c in cake for v in (c.get("y"), c.get("o"), c.get("state"))] + list(harness.values())
            passed = all(v is not None and v <= TOL for v in vals)         # inf (NaN) and errors fail
            ok = ok and passed
            results["safe" if safe else "softplus"] = {"SAFE": safe, "rows": rows, "harness": harness, "pass": passed}
    doc = {"env": {**env_info(("torch", "triton", "fla-core", "cuda-bindings"), "bench/kda_layer.py"), "arch": arch}, "tolerance": TOL, "pass": ok, "fla_note": fla_note,
           "config": {"D": args.hidden, "H": args.heads, "K": K, "V": V, "lens": lens, "steps": args.steps,
                      "seed": args.seed, "conv": CONV, "state_layout": "VK [N, H, V, K]",
                      "prefill_variant": args.prefill_variant, "decode_variant": args.decode_variant},
           "results": results}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "kda-layer-h200.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)

    def fmt(d, k):
        v = (d or {}).get(k)
        return f"{v:9.2e}" if v is not None else f"{'-':>9}"
    print(f"{'gate':8} {'step':>8} | {'cake y':>9} {'cake o':>9} {'cake S':>9} | {'fla y':>9} {'fla o':>9} "
          f"{'fla S':>9}   (rel RMSE vs float64; S: the whole state pool after the step)")
    for gname, res in results.items():
        for r in res["rows"]:
            err = " ".join(f"{n}: {r[n]['error']}" for n in ("cake", "fla") if "error" in r.get(n, {}))
            print(f"{gname:8} {r['step']:>8} | {fmt(r.get('cake'), 'y')} {fmt(r.get('cake'), 'o')} "
                  f"{fmt(r.get('cake'), 'state')} | {fmt(r.get('fla'), 'y')} {fmt(r.get('fla'), 'o')} "
                  f"{fmt(r.get('fla'), 'state')} {err[:200]}")
        h = res["harness"]
        print(f"{gname:8} {'harness':>8} | {fmt(h, 'y')} {'':9} {fmt(h, 'state')} | (float64 decode chain vs "
              f"prefill of the extended sequences)")
    if fla_note:
        print(fla_note)
    print(f"\nwrote {path}")
    print(("PASS" if ok else "FAIL") + f": every CAKE rel RMSE <= {TOL} and finite, {len(lens)} sequences "
          f"{lens}, {args.steps} decode steps, both gate forms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
