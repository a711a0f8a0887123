"""Kimi Delta Attention from your own code: `kda_prefill` (a packed batch of sequences, the chunked
tensor-core kernels of tasks/kda/chunked.py) and `kda_decode` (one token per sequence, states gathered
from and scattered back to a pool by index, tasks/kda_decode/programs.py). torch CUDA tensors in and
out, launched on torch's current stream; the gate, the q / k L2 norms and beta's sigmoid are applied
in the kernels (raw inputs, as fla's `use_gate_in_kernel` / `use_qk_l2norm_in_kernel` /
`use_beta_sigmoid_in_kernel`).

    o, final = kda_prefill(q, k, v, g, beta, A_log, dt_bias, cu_seqlens=cu, safe_gate=True)
    o, pool = kda_decode(q1, k1, v1, g1, beta1, A_log, dt_bias, pool, idx, safe_gate=True)

Shapes (K = V = 128): q, k [T, H, K] bf16; v [T, HV, V]; g [T, HV, K] (raw gate input); beta [T, HV]
(logits); A_log [HV] f32; dt_bias [HV, K] f32; cu_seqlens [N + 1] int32 (None: one sequence); states
fp32 [N, HV, V, K] (state_layout "vk", fla's state_v_first) or [N, HV, K, V] ("kv"). HV is a multiple
of H (grouped value heads). The safe gate is lower_bound * sigmoid(exp(A_log) (g + dt_bias)) with
lower_bound = -5; the softplus gate -exp(A_log) softplus(g + dt_bias).

Which kernel runs (`prefill_plan`): the chunked kernel of the gate form, with a V-slice of 32 columns
per CTA when HV * N * 4 CTAs fit the GPU in one wave, else 64 (bench/results/kda-prefill-h200.json:
vs 32 best at T = 8192, H = 32; vs 64 at H = 64 / 96 and the packed batches); on an sm_8x part the
safe gate's vs 32 kernel (the only one whose shared memory fits) and the recurrent kernel for the
softplus gate. Decode: the vw 8 x vsplit 4 kernel (bench/results/kda-decode-h200.json).
"""
from __future__ import annotations

from typing import Optional

K = V = 128


def prefill_plan(H: int, HV: int, N: int, safe: bool, arch: str, sms: int) -> tuple[str, dict]:
    """(builder, params) of the prefill kernel for a problem: "chunked" with kda_chunk16_ws's params, or
    "recurrent" with kda_recurrent's."""
    if HV % H:
        raise ValueError(f"HV = {HV} must be a multiple of H = {H}")
    hopper = arch.startswith("sm_9")
    if not hopper:
        if safe:
            return "chunked", {"vs": 32, "safe": True}
        return "recurrent", {"vw": 8, "vsplit": 4, "chunk": 32}
    vs = 32 if HV * N * (V // 32) <= sms else 64
    return "chunked", {"vs": vs, "safe": bool(safe)}


def _check(name: str, t, shape: tuple, dtype) -> None:
    if not getattr(t, "is_cuda", False):
        raise TypeError(f"{name}: a CUDA torch tensor is expected")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: dtype {t.dtype}, expected {dtype}")


def _state_shape(N: int, HV: int, layout: str) -> tuple:
    if layout not in ("vk", "kv"):
        raise ValueError(f"state_layout must be 'vk' or 'kv', not {layout!r}")
    return (N, HV, V, K) if layout == "vk" else (N, HV, K, V)


def kda_prefill(q, k, v, g, beta, A_log, dt_bias, *, cu_seqlens=None, initial_state=None,
                safe_gate: bool = True, state_layout: str = "vk", plan: Optional[tuple] = None):
    """-> (o [T, HV, V] bf16, final states fp32 in `state_layout`). `plan` overrides `prefill_plan`."""
    import torch

    from .runtime import runtime
    T, H, Kq = q.shape
    if Kq != K or v.shape[-1] != V:
        raise ValueError(f"K = V = {K} only (q has K = {Kq}, v has V = {v.shape[-1]})")
    HV = v.shape[1]
    dev = q.device
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, T], dtype=torch.int32, device=dev)
    N = cu_seqlens.numel() - 1
    bf = torch.bfloat16
    for name, t, shape, dt in (("q", q, (T, H, K), bf), ("k", k, (T, H, K), bf), ("v", v, (T, HV, V), bf),
                               ("g", g, (T, HV, K), bf), ("beta", beta, (T, HV), bf),
                               ("A_log", A_log, (HV,), torch.float32), ("dt_bias", dt_bias, (HV, K), torch.float32),
                               ("cu_seqlens", cu_seqlens, (N + 1,), torch.int32)):
        _check(name, t, shape, dt)
    sshape = _state_shape(N, HV, state_layout)
    if initial_state is not None:
        _check("initial_state", initial_state, sshape, torch.float32)
    rt = runtime(dev.index or 0)
    kind, params = plan or prefill_plan(H, HV, N, safe_gate, rt.arch, rt.props.get("sms", 132))

    def build(arch):
        if kind == "chunked":
            from tasks.kda.chunked import kda_chunk16_ws
            return kda_chunk16_ws(arch=arch, **params)
        from tasks.kda.programs import kda_recurrent
        return kda_recurrent(arch=arch, **params)
    kern = rt.kernel(("kda_prefill", kind, tuple(sorted(params.items()))), build)
    o = torch.empty(T, HV, V, dtype=bf, device=dev)
    ht = torch.empty(sshape, dtype=torch.float32, device=dev)
    h0 = initial_state if initial_state is not None else torch.empty(sshape, dtype=torch.float32, device=dev)
    tensors = {"q": q.contiguous(), "k": k.contiguous(), "v": v.contiguous(), "g": g.contiguous(),
               "beta": beta.contiguous(), "A_log": A_log, "dt_bias": dt_bias, "h0": h0.contiguous(),
               "cu_seqlens": cu_seqlens, "o": o, "ht": ht}
    scalars = {"T": T, "N": N, "H": H, "HV": HV, "SAFE": int(bool(safe_gate)), "VK": int(state_layout == "vk"),
               "H0": int(initial_state is not None)}
    rt.launch(kern, tensors, scalars, torch.cuda.current_stream(dev).cuda_stream)
    return o, ht


def kda_decode(q, k, v, g, beta, A_log, dt_bias, state_pool, idx, *, safe_gate: bool = True,
               state_layout: str = "vk"):
    """One token per sequence: q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV]; sequence b
    reads its state from state_pool[idx[b]] and the returned pool (a new tensor, the input untouched)
    holds the updated states at the same rows. -> (o [B, HV, V] bf16, new pool)."""
    import torch

    from .runtime import runtime
    B, H, Kq = q.shape
    if Kq != K or v.shape[-1] != V:
        raise ValueError(f"K = V = {K} only (q has K = {Kq}, v has V = {v.shape[-1]})")
    HV = v.shape[1]
    bf = torch.bfloat16
    P = state_pool.shape[0]
    for name, t, shape, dt in (("q", q, (B, H, K), bf), ("k", k, (B, H, K), bf), ("v", v, (B, HV, V), bf),
                               ("g", g, (B, HV, K), bf), ("beta", beta, (B, HV), bf),
                               ("A_log", A_log, (HV,), torch.float32), ("dt_bias", dt_bias, (HV, K), torch.float32),
                               ("state_pool", state_pool, _state_shape(P, HV, state_layout), torch.float32),
                               ("idx", idx, (B,), torch.int32)):
        _check(name, t, shape, dt)
    if HV % H:
        raise ValueError(f"HV = {HV} must be a multiple of H = {H}")
    dev = q.device
    rt = runtime(dev.index or 0)

    def build(arch):
        from tasks.kda_decode.programs import kda_decode as program
        return program(vw=8, vsplit=4, arch=arch)
    kern = rt.kernel(("kda_decode", 8, 4), build)
    o = torch.empty(B, HV, V, dtype=bf, device=dev)
    out = state_pool.clone()        # rows not in idx keep their states
    tensors = {"q": q.contiguous(), "k": k.contiguous(), "v": v.contiguous(), "g": g.contiguous(),
               "beta": beta.contiguous(), "A_log": A_log, "dt_bias": dt_bias, "state": state_pool.contiguous(),
               "idx": idx, "o": o, "state_out": out}
    scalars = {"B": B, "H": H, "HV": HV, "SAFE": int(bool(safe_gate)), "VK": int(state_layout == "vk")}
    rt.launch(kern, tensors, scalars, torch.cuda.current_stream(dev).cuda_stream)
    return o, out
