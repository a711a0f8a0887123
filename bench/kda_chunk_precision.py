"""Which operand precisions can a chunked KDA prefill kernel use and still meet rel RMSE <= 5e-3?
A CPU study (numpy), run before writing the tensor-core kernel.

    python bench/kda_chunk_precision.py [--T 512] [--H 4] [--out bench/results]

The chunked algorithm of tasks/kda/reference.py (`chunked_sequence`) is replayed with every mma
operand rounded to the format a kernel would feed the tensor cores (bf16, fp16 or tf32; fp32
accumulation), the exponentials and the diagonal sub-blocks in fp32 (token-parallel FMA work, as fla
and FlashKDA do), and the state kept in fp32 between chunks. Inputs are the task's adversarial inputs
(tasks/kda/task.py make_inputs: very negative gates, gates at the bound, near-zero decay, beta near 0
and 1, q/k norms from 1e-2 to 30), both gate forms; the error is against the float64 token recurrence,
o rounded to bf16 as a kernel writes it. Writes kda-chunk-precision-cpu.json and prints a table.

Policies (what is rounded to what):
- `bf16`: every mma operand bf16 (FlashKDA's choice: mma.sync m16n8k16 bf16);
- `fp16`: every mma operand fp16 (3 more mantissa bits; every anchored factor is <= 1 and the state
  stays O(1), so fp16's range suffices);
- `inv_f32`: bf16 operands, but the inverse (I + Akk)^-1 by fp32 forward substitution;
- `state_tf32`: bf16 intra-chunk operands, the products with the state (W S, Q S, K^T Vn) in tf32.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.join(ROOT, "bench"))

from examples import env_info  # noqa: E402
from gpu_backend.memory import round_to_bf16  # noqa: E402


def rnd(x, fmt: str):
    """Round to a storage format (round to nearest even), returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    if fmt == "f64":
        return x
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float64)
    f = x.astype(np.float32)
    if fmt == "f32":
        return f.astype(np.float64)
    if fmt == "bf16":
        return round_to_bf16(f).astype(np.float64)
    drop = {"tf32": 13}[fmt]          # tf32: 10 mantissa bits, round to nearest even
    b = f.view(np.uint32).astype(np.uint64)
    b = (b + ((1 << (drop - 1)) - 1) + ((b >> drop) & 1)) >> drop << drop
    return (b.astype(np.uint32).view(np.float32)).astype(np.float64)


def mm(a, b, fmt):
    """An mma: operands in `fmt`, products and sums in fp32 (the result rounded to fp32)."""
    return rnd(np.matmul(rnd(a, fmt), rnd(b, fmt)), "f32")


def gram(a, b, G, strict, sub, fmt):
    """The decayed Gram matrix of reference._decayed_gram, off-diagonal sub-blocks as anchored mmas in
    `fmt`, diagonal sub-blocks token-parallel in fp32 (e^{G_r - G_c} per channel, every exponent <= 0)."""
    Bt, C, K = a.shape
    out = np.zeros((Bt, C, C))
    for i in range(0, C, sub):
        ri = slice(i, min(i + sub, C))
        for j in range(0, i, sub):
            cj = slice(j, min(j + sub, C))
            n = cj.stop - 1
            rows = rnd(a[:, ri] * rnd(np.exp(G[:, ri] - G[:, n:n + 1]), "f32"), "f32")
            cols = rnd(b[:, cj] * rnd(np.exp(G[:, n:n + 1] - G[:, cj]), "f32"), "f32")
            out[:, ri, cj] = mm(rows, np.swapaxes(cols, -1, -2), fmt)
        Gi = G[:, ri]
        d = Gi[:, :, None, :] - Gi[:, None, :, :]
        e = rnd(np.exp(np.minimum(d, 0.0)), "f32")
        blk = rnd((a[:, ri][:, :, None, :] * b[:, ri][:, None, :, :] * e).sum(-1), "f32")
        s = ri.stop - ri.start
        out[:, ri, ri] = np.where(np.tril(np.ones((s, s), bool), -1 if strict else 0), blk, 0.0)
    return out


def inverse(Akk, fmt, how):
    """(I + Akk)^-1 for strictly lower-triangular Akk: fp32 forward substitution, or the product
    (I - L)(I + L^2)(I + L^4)... with mmas in `fmt` (L^C = 0)."""
    Bt, C, _ = Akk.shape
    eye = np.broadcast_to(np.eye(C), Akk.shape)
    if how == "substitution":
        return rnd(np.linalg.solve(eye + Akk, eye), "f32")
    inv = rnd(eye - Akk, "f32")
    p = Akk
    steps = 1
    while steps < C:
        p = mm(p, p, fmt)                       # L^2, L^4, ...
        inv = mm(inv, eye + p, fmt)
        steps *= 2
    return inv


def pieces(kk, qq, vv, gg, bb, scale, sub, op, inv_how):
    """A chunk's prepared pieces (kk, qq [HV, C, K], vv [HV, C, V], gg the log gates [HV, C, K], bb beta
    [HV, C, 1]), every exponent anchored at the chunk's start: A' (rows of A' applied: U), W, Aqk, QG, KD
    and the decay e^{G_C}, each in fp32 as the prepare step leaves it."""
    Gc = rnd(np.cumsum(gg, axis=1), "f32")
    eG = rnd(np.exp(Gc), "f32")
    Akk = rnd(bb * gram(kk, kk, Gc, True, sub, op), "f32")
    A = inverse(Akk, op, inv_how)
    Ab = rnd(A * np.swapaxes(bb, -1, -2), "f32")                 # A' = (I + Akk)^-1 Diag(beta)
    KG = rnd(kk * eG, "f32")
    W = mm(Ab, KG, op)
    Aqk = rnd(scale * gram(qq, kk, Gc, False, sub, op), "f32")
    Glast = Gc[:, -1:, :]
    return dict(A=Ab, W=W, Aqk=Aqk, QG=rnd(scale * qq * eG, "f32"), KG=KG, KD=rnd(kk * np.exp(Glast - Gc), "f32"),
                D=rnd(np.exp(Glast[:, 0, :]), "f32"))


def pieces_from_halves(kk, qq, vv, gg, bb, scale, sub, op, inv_how):
    """A 32-token chunk's pieces as the two-pass prepare kernel builds them (tasks/kda/two_pass.py
    HalfSink / cross_terms): two 16-token halves prepared alone, then their cross terms, with the
    kernel's roundings (KG2 D1 rounded to bf16 twice, the rest once)."""
    h = [pieces(*(x[:, i * 16:(i + 1) * 16] for x in (kk, qq, vv, gg, bb)), scale, sub, op, inv_how)
         for i in (0, 1)]
    D1, D2 = h[0]["D"][:, None, :], h[1]["D"][:, None, :]
    KD1 = h[0]["KD"]
    G21 = mm(h[1]["KG"], np.swapaxes(KD1, -1, -2), op)
    Aqk21 = mm(h[1]["QG"], np.swapaxes(KD1, -1, -2), op)
    P = mm(h[1]["A"], G21, op)
    A21 = mm(-P, h[0]["A"], op)
    KG2 = rnd(rnd(h[1]["KG"], op) * D1, "f32")
    W2 = rnd(mm(h[1]["A"], KG2, op) - mm(P, h[0]["W"], op), "f32")
    z = np.zeros(A21.shape)
    return dict(A=np.concatenate([np.concatenate([h[0]["A"], z], -1), np.concatenate([A21, h[1]["A"]], -1)], -2),
                W=np.concatenate([h[0]["W"], W2], -2),
                Aqk=np.concatenate([np.concatenate([h[0]["Aqk"], z], -1), np.concatenate([Aqk21, h[1]["Aqk"]], -1)], -2),
                QG=np.concatenate([h[0]["QG"], rnd(h[1]["QG"] * D1, "f32")], -2),
                KD=np.concatenate([rnd(KD1 * D2, "f32"), h[1]["KD"]], -2),
                D=rnd(h[0]["D"] * h[1]["D"], "f32"))


def chunked(q, k, v, g, beta, S0, scale, C, sub, policy, halves: bool = False):
    """One sequence, all heads: q, k [L, HV, K] (normalised), v [L, HV, V], g [L, HV, K], beta [L, HV].
    `halves` (C = 32): the chunk's pieces from two 16-token halves (pieces_from_halves)."""
    op = {"bf16": "bf16", "fp16": "f16", "inv_f32": "bf16", "state_tf32": "bf16", "f32": "f32"}[policy]
    sop = "tf32" if policy == "state_tf32" else op
    inv_how = "substitution" if policy == "inv_f32" else "product"
    L, HV, V = v.shape
    n = -(-L // C)
    pad = n * C - L

    def chunks(x):
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:])]) if pad else x
        return np.moveaxis(x.reshape((n, C) + x.shape[1:]), 1, 2)          # [n, HV, C, ...]
    qc, kc, vc, gc, bc = (chunks(np.asarray(x, np.float64)) for x in (q, k, v, g, beta))
    if halves:
        S = np.array(S0, dtype=np.float64)
        o = np.empty((n, HV, C, V))
        for c in range(n):
            pc = pieces_from_halves(kc[c], qc[c], vc[c], gc[c], bc[c][:, :, None], scale, sub, op, inv_how)
            U = mm(pc["A"], vc[c], op)
            Vn = rnd(U - mm(pc["W"], S, sop), "f32")
            o[c] = rnd(mm(pc["QG"], S, sop) + mm(pc["Aqk"], Vn, op), "f32")
            S = rnd(pc["D"][:, :, None] * S + mm(np.swapaxes(pc["KD"], -1, -2), Vn, sop), "f32")
        return np.moveaxis(o, 2, 1).reshape(n * C, HV, V)[:L], S
    G = rnd(np.cumsum(gc, axis=2), "f32")
    eG = rnd(np.exp(G), "f32")
    S = np.array(S0, dtype=np.float64)
    o = np.empty((n, HV, C, V))
    for c in range(n):
        kk, qq, vv, Gc, bb = kc[c], qc[c], vc[c], G[c], bc[c][:, :, None]
        Akk = rnd(bb * gram(kk, kk, Gc, True, sub, op), "f32")
        A = inverse(Akk, op, inv_how)
        W = mm(A, rnd(bb * kk * eG[c], "f32"), op)
        U = mm(A, rnd(bb * vv, "f32"), op)
        Aqk = rnd(scale * gram(qq, kk, Gc, False, sub, op), "f32")
        Vn = rnd(U - mm(W, S, sop), "f32")
        o[c] = rnd(mm(rnd(scale * qq * eG[c], "f32"), S, sop) + mm(Aqk, Vn, op), "f32")
        Glast = Gc[:, -1:, :]
        kd = rnd(kk * np.exp(Glast - Gc), "f32")
        S = rnd(np.exp(Glast[:, 0, :])[:, :, None] * S + mm(np.swapaxes(kd, -1, -2), Vn, sop), "f32")
    return np.moveaxis(o, 2, 1).reshape(n * C, HV, V)[:L], S


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--chunks", default="16,64", help="chunk sizes; 32h: 32-token chunks from two 16-token "
                    "halves as the two-pass prepare kernel builds them (tasks/kda/two_pass.py, chunk=32)")
    ap.add_argument("--policies", default="bf16,fp16,inv_f32,state_tf32")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    from tasks.kda import reference as R
    from tasks.kda.task import TASK

    rows = []
    for safe in (1, 0):
        shape = {"T": args.T, "N": 1, "H": args.H, "HV": args.H, "SAFE": safe, "VK": 0, "H0": 1, "PACK": 0}
        x = TASK.make_inputs(shape, seed=7)
        ref = TASK.reference(x, shape, method="recurrent")
        g = R.kda_gate(x["g"], x["A_log"], x["dt_bias"], bool(safe))
        q, k = R.l2norm(x["q"]), R.l2norm(x["k"])
        beta = R.sigmoid(np.asarray(x["beta"], np.float64))
        K = q.shape[-1]
        for ch in args.chunks.split(","):
            C, halves = int(ch.rstrip("h")), ch.endswith("h")
            for policy in args.policies.split(","):
                o, S = chunked(q, k, x["v"], g, beta, x["h0"][0].astype(np.float64), K ** -0.5, C, 16, policy,
                               halves)
                o = round_to_bf16(o.astype(np.float32)).astype(np.float64)
                eo = float(np.linalg.norm(o - ref["o"]) / np.linalg.norm(ref["o"]))
                es = float(np.linalg.norm(S - ref["ht"][0]) / np.linalg.norm(ref["ht"][0]))
                rows.append({"gate": "safe" if safe else "softplus", "chunk": ch, "policy": policy,
                             "rel_rmse_o": eo, "rel_rmse_state": es, "finite": bool(np.isfinite(o).all())})
                print(f"{rows[-1]['gate']:8s} C={ch:>4s} {policy:10s} o {eo:.2e}  state {es:.2e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "kda-chunk-precision-cpu.json")
    with open(path, "w") as f:
        json.dump({**env_info(("numpy",), "bench/kda_chunk_precision.py"), "T": args.T, "H": args.H,
                   "tolerance": 5e-3, "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
