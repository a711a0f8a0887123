"""The KDA token recurrence of tasks/kda/reference.py in float64 torch, for the GPU (the numpy
reference takes minutes at T = 8192 x 96 heads): activation of the raw inputs, one token step, and a
packed batch. States are kept per head as S^T [V, K] (the [N, HV, V, K] serving layout).
`KdaPrefillTask.reference` uses it for large shapes when a CUDA torch is there (the harness's timed
shapes); bench/kda_prefill.py checks it against the numpy reference in every run, and
tests/test_kda_torch_ref.py on the CPU."""
from __future__ import annotations

from tasks.kda.reference import L2_EPS, LOWER_BOUND


def activate(x, A_log, dt_bias, safe: bool):
    """What the kernels do to their raw inputs, in float64: (q * K^-0.5, k) L2-normalised and expanded
    to the value heads, v, the decay exp(g) of the chosen gate form, beta = sigmoid(logit)."""
    import torch
    d = {n: x[n].double() for n in ("q", "k", "v", "g", "beta")}
    HV, K = d["g"].shape[-2:]

    def l2(t):
        t = t / torch.sqrt((t * t).sum(-1, keepdim=True) + L2_EPS)
        return t.repeat_interleave(HV // t.shape[-2], dim=-2)      # value head hv reads qk head hv // (HV / H)
    a = torch.exp(A_log.double()).view(HV, 1)
    f = d["g"] + dt_bias.double().view(HV, K)
    g = LOWER_BOUND * torch.sigmoid(a * f) if safe else -a * torch.nn.functional.softplus(f)
    return l2(d["q"]) * K ** -0.5, l2(d["k"]), d["v"], torch.exp(g), torch.sigmoid(d["beta"])


def step(S, q, k, v, decay, beta):
    """One token on states S [..., HV, V, K]: decay, delta rule, output -> (S, o [..., HV, V])."""
    import torch
    S = S * decay.unsqueeze(-2)
    u = beta.unsqueeze(-1) * (v - torch.einsum("...vk,...k->...v", S, k))
    S = S + u.unsqueeze(-1) * k.unsqueeze(-2)
    return S, torch.einsum("...vk,...k->...v", S, q)


def prefill(x, A_log, dt_bias, cu, safe: bool, h0=None):
    """A packed batch (cu: sequence offsets) from raw inputs, initial states h0 [N, HV, V, K] or zeros
    -> (o [T, HV, V], final states [N, HV, V, K]), float64."""
    import torch
    q, k, v, dec, beta = activate(x, A_log, dt_bias, safe)
    T, HV, V = v.shape
    o = torch.empty(T, HV, V, dtype=torch.float64, device=v.device)
    cu, hts = [int(c) for c in cu], []
    for i, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        S = h0[i].double() if h0 is not None else torch.zeros(HV, V, q.shape[-1], dtype=torch.float64, device=v.device)
        for t in range(s, e):
            S, o[t] = step(S, q[t], k[t], v[t], dec[t], beta[t])
        hts.append(S)
    return o, torch.stack(hts)


def reference_tensors(x: dict, shape: dict, device: str = "cuda"):
    """The task's reference outputs as float64 torch tensors on `device` (o [T, HV, V], ht in the
    shape's state layout) from its numpy inputs, computed by `prefill`."""
    import torch
    d = {n: torch.as_tensor(a).to(device) for n, a in x.items() if n != "cu_seqlens"}
    h0 = None
    if shape["H0"]:
        h0 = d["h0"] if shape["VK"] else d["h0"].transpose(-1, -2)             # to [N, HV, V, K]
    o, ht = prefill(d, d["A_log"], d["dt_bias"], x["cu_seqlens"], bool(shape["SAFE"]), h0)
    return o, (ht if shape["VK"] else ht.transpose(-1, -2))


def reference_on_device(x: dict, shape: dict, device: str = "cuda") -> dict:
    """`reference_tensors` as the task's numpy reference dict {"o", "ht"}."""
    o, ht = reference_tensors(x, shape, device)
    return {"o": o.cpu().numpy(), "ht": ht.contiguous().cpu().numpy()}


def cuda_torch() -> bool:
    """Whether torch is importable and sees a GPU (never raises)."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, or a broken install: the numpy path
        return False
