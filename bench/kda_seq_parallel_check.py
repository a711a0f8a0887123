"""The sequence-parallel KDA prefill's workspace against float64 (a diagnostic, GPU): runs the Program
once on a small single sequence and compares, per segment, what the ends kernel wrote (B: the end
state from S = 0; M: the transition, from S = I with v = 0) and the start states the starts kernel
chained (S_{j+1} = M_j S_j + B_j) with the token recurrence of tasks/kda/reference.py, then o per
segment. Prints one line per quantity: relative error (Frobenius), and the largest entries.
  python bench/kda_seq_parallel_check.py [segments] [T] [SAFE]"""
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def main() -> int:
    import torch
    from cuda.bindings import driver

    from examples import compile_variants, to_torch
    from tasks.kda import reference as R
    from tasks.kda.two_pass import kda_two_pass
    from tasks.registry import get

    seg = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    safe = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    task = get("kda").task
    shape = dict(T=T, N=1, H=1, HV=1, VK=0, H0=1, PACK=0, SAFE=safe)
    x = task.make_inputs(shape, seed=3)
    prog = kda_two_pass(arch="sm_90a", segments=seg, safe=bool(safe))
    ck, _ = compile_variants({"p": prog})["p"]
    dev = torch.device("cuda")
    specs = {t.name: t for t in task.inputs(shape)}
    ti = {n: to_torch(a, specs[n].dtype, dev) for n, a in x.items()}
    o = torch.full(tuple(ti["v"].shape), float("nan"), dtype=torch.bfloat16, device=dev)
    ht = torch.full(tuple(ti["h0"].shape), float("nan"), dtype=torch.float32, device=dev)
    prepared = ck.prepare({**ti, "o": o, "ht": ht}, task.scalars(shape))
    ck.launch_prepared(prepared)
    torch.cuda.synchronize()

    def ws(name):
        ptr, shp = prepared[1][name]
        out = np.empty(shp, np.float32)
        driver.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)
        return out.astype(np.float64)

    E, S = ws("wsE"), ws("wsS")
    K = 128
    q, k = R.l2norm(x["q"]), R.l2norm(x["k"])
    g = R.kda_gate(x["g"], x["A_log"], x["dt_bias"], bool(safe))
    beta = R.sigmoid(np.asarray(x["beta"], np.float64))
    v = np.asarray(x["v"], np.float64)
    sc = K ** -0.5
    L = seg * 16
    nsg = math.ceil(T / L)
    Sj = np.asarray(x["h0"], np.float64)[0]          # [HV, K, V], kv layout (VK = 0)

    def rel(a, b):
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    o_ref, _ = R.recurrent_sequence(q, k, v, g, beta, Sj, sc)
    if os.environ.get("OUT"):            # everything, for a look offline
        np.savez_compressed(os.path.join(os.environ["OUT"], f"seqpar-seg{seg}-T{T}-safe{safe}.npz"), E=E, S=S,
                            h0=np.asarray(x["h0"]), q=q, k=k, v=v, g=g, beta=beta, o=o.float().cpu().numpy())
    o_gpu = o.float().cpu().numpy().astype(np.float64)
    for j in range(nsg):
        s = slice(j * L, min((j + 1) * L, T))
        got_S = S[j * K:(j + 1) * K]
        print(f"seg {j}: start state rel err {rel(got_S, Sj[0]):.3e} (|ref| max {np.abs(Sj).max():.3e}, "
              f"|gpu| max {np.abs(got_S).max():.3e}); o rel err {rel(o_gpu[s], o_ref[s]):.3e}")
        if j + 1 < nsg:
            _, M = R.recurrent_sequence(q[s], k[s], np.zeros_like(v[s]), g[s], beta[s], np.eye(K)[None], sc)
            _, B = R.recurrent_sequence(q[s], k[s], v[s], g[s], beta[s], np.zeros_like(Sj), sc)
            gB, gM = E[j * K:(j + 1) * K, :K], E[j * K:(j + 1) * K, K:]
            print(f"        B rel err {rel(gB, B[0]):.3e} (|B| max {np.abs(B).max():.3e}); M rel err {rel(gM, M[0]):.3e} "
                  f"(|M| max {np.abs(M).max():.3e}, |gpu M| max {np.abs(gM).max():.3e}, M^T rel err {rel(gM, M[0].T):.3e})")
            Sj = M @ Sj + B
    return 0




def probe_starts() -> None:
    """The starts kernel alone on synthetic segment ends (M = a known matrix, B = 0 or random) for one
    head and sequence of 3 segments: S_1 must be M S_0 + B."""
    import torch

    from examples import compile_variants
    from tasks.kda.seq_parallel import kda_segment_starts
    dev = torch.device("cuda")
    K, seg = 128, 2
    T = 3 * seg * 16
    ker = kda_segment_starts("sm_90a", seg)
    ck, _ = compile_variants({"s": ker})["s"]
    rows = (T // (seg * 16) + 1 + 1) * 1 * K
    rng = np.random.default_rng(0)
    S0 = rng.standard_normal((K, K)).astype(np.float32)
    ones = np.ones((K, K), np.float32)
    for name, M, B, S0 in (("M = 0, B = 0", np.zeros((K, K)), np.zeros((K, K)), S0),
                           ("M = I/2, B = 0, S0 = 1", np.eye(K) / 2, np.zeros((K, K)), ones),
                           ("M = 1/128, B = 0, S0 = I", np.full((K, K), 1 / 128), np.zeros((K, K)), np.eye(K, dtype=np.float32)),
                           ("M = I/2, B = 0", np.eye(K) / 2, np.zeros((K, K)), S0),
                       ("M = random/100, B = random", rng.standard_normal((K, K)) / 100, rng.standard_normal((K, K)), S0)):
        E = np.zeros((rows, 2 * K), np.float32)
        E[:K, :K], E[:K, K:] = B, M
        E[K:2 * K, :K], E[K:2 * K, K:] = B, M
        t = {"h0": torch.from_numpy(np.asarray(S0, np.float32)[None, None]).to(dev), "cu_seqlens": torch.tensor([0, T], dtype=torch.int32, device=dev),
             "wsE": torch.from_numpy(E).to(dev), "wsS": torch.full((rows, K), float("nan"), device=dev)}
        ck(t, {"T": T, "N": 1, "H": 1, "HV": 1, "VK": 0, "H0": 1})
        torch.cuda.synchronize()
        got = t["wsS"].cpu().numpy().astype(np.float64)
        S1 = M @ S0 + B
        S2 = M @ S1 + B
        for j, want in ((0, S0), (1, S1), (2, S2)):
            g = got[j * K:(j + 1) * K]
            print(f"probe {name}: S_{j} rel err {np.linalg.norm(g - want) / max(np.linalg.norm(want), 1e-30):.3e}")
            if j == 1:
                np.set_printoptions(precision=3, linewidth=200, suppress=True)
                print(g[:10, :10]); print("want", want[:3, :6])
                print("rows with |err| > 1e-3:", np.nonzero(np.abs(g - want).max(axis=1) > 1e-3)[0][:40])
                print("cols with |err| > 1e-3:", np.nonzero(np.abs(g - want).max(axis=0) > 1e-3)[0][:40])


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe_starts()
        sys.exit(0)
    sys.exit(main())
