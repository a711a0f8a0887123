"""Kimi Delta Attention from your own code: `kda_prefill` (a packed batch of sequences, the chunked
tensor-core programs of tasks/kda/two_pass.py and chunked.py) and `kda_decode` (one token per
sequence, states gathered from and scattered back to a pool by index, tasks/kda_decode/programs.py).
torch CUDA tensors in and out, launched on torch's current stream; the gate, the q / k L2 norms and
beta's sigmoid are applied in the kernels (raw inputs, as fla's `use_gate_in_kernel` /
`use_qk_l2norm_in_kernel` / `use_beta_sigmoid_in_kernel`).

    o, final = kda_prefill(q, k, v, g, beta, A_log, dt_bias, cu_seqlens=cu, safe_gate=True)
    o, pool = kda_decode(q1, k1, v1, g1, beta1, A_log, dt_bias, pool, idx, safe_gate=True, inplace=True)

Shapes (K = V = 128): q, k [T, H, K] bf16; v [T, HV, V]; g [T, HV, K] (raw gate input); beta [T, HV]
(logits); A_log [HV] f32; dt_bias [HV, K] f32; cu_seqlens [N + 1] int32 (None: one sequence); states
(prefill's N finals, decode's pool of P slots) fp32 [N, HV, V, K] (state_layout "vk", fla's
state_v_first) or [N, HV, K, V] ("kv"). HV is a multiple of H (grouped value heads). The safe gate is lower_bound * sigmoid(exp(A_log) (g + dt_bias)) with
lower_bound = -5; the softplus gate -exp(A_log) softplus(g + dt_bias).

Which kernel runs (`prefill_plan`): on Hopper the two-pass program of the gate form (tasks/kda/two_pass.py:
every chunk prepared in parallel, then the state recurrence), with a V-slice of 32 columns per CTA
(2 prepare warps, 2 consumers, the sm_90a bulk-copy loader) when its HV * N * V / 32 CTAs fit the GPU
in two waves, else 128 with 8 consumers (bench/results/kda-prefill-h200-session9-plan.json: vs 32 at
T = 8192, H = 32 and 64, 128 at H = 96 and the packed batches; 2.41x geomean over fla there); few sequences of 16k+ tokens that fill under half the GPU take the
sequence-parallel form (tasks/kda/seq_parallel.py); on an sm_8x part the
safe gate's vs 32 kernel (the only one whose shared memory fits) and the recurrent kernel for the
softplus gate. Decode (`decode_plan`): "vk" vw 8 x vsplit 4 (bench/results/kda-decode-h200.json), vw 4
at B <= 4, vw 16 x vsplit 2 at B >= 128 (HV = 32); "kv" the lanes-along-V program kda_decode_kv (2
columns per lane, 1 at B <= 4, 4 at B >= 128);
`inplace=True` updates the pool where it is (the serving path, no copy of the pool).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

K = V = 128


SEQ_PARALLEL_MIN_TOKENS = 16384     # tokens per sequence from which the segments pay (T = 32768 measured)


def prefill_plan(H: int, HV: int, N: int, safe: bool, arch: str, sms: int, T: int = 0) -> tuple[str, dict]:
    """(builder, params) of the prefill kernel for a problem of T tokens in N sequences: "two_pass" with
    kda_two_pass's params (segments > 0: the sequence-parallel form), "chunked" with kda_chunk16_ws's, or
    "recurrent" with kda_recurrent's."""
    if HV % H:
        raise ValueError(f"HV = {HV} must be a multiple of H = {H}")
    hopper = arch.startswith("sm_9")
    if not hopper:
        if safe:
            return "chunked", {"vs": 32, "safe": True}
        return "recurrent", {"vw": 8, "vsplit": 4, "chunk": 32}
    base = {"safe": bool(safe), "warps": 1, "stages": 2}
    from cake_ir.arch import has
    bulk = {"copy": "bulk"} if has(arch, "bulk_copy") else {}
    # few long sequences leave most SMs idle even at vs 32: the sequence-parallel form (T = 32768, H = 8:
    # 0.76 ms against 1.51 for the best two-pass point, measured on a shared GPU, indicative)
    if T >= SEQ_PARALLEL_MIN_TOKENS * max(N, 1) and HV * N * (V // 32) * 2 <= sms:
        return "two_pass", {"vs": 128, **base, "consumers": 8, "segments": 64, **bulk}
    # V-slice 32 while its CTAs fit two waves, else 128 with 8 consumers
    # (bench/results/kda-prefill-h200-session9-plan.json: at T = 8192 H = 64, two waves of vs 32, 0.811 /
    # 1.035 ms safe / softplus against 0.859 / 1.110 for vs 64, the earlier rule's one-wave pick; at H = 96
    # and the packed batches vs 128 c8 wins by 20-35%)
    if HV * N * (V // 32) <= 2 * sms:
        # the bulk-copy loader (0.554 / 0.644 ms against 0.661 / 0.789 at T = 8192, H = 32,
        # safe / softplus) and the searches' 2 prepare warps with 2 consumers (agent runs kda-safe1-h200,
        # 0.521 ms, and kda-safe0-h200, 0.644 ms)
        return "two_pass", {"vs": 32, **base, "warps": 2, "consumers": 2, **bulk}
    return "two_pass", {"vs": 128, **base, "consumers": 8}


_TORCH_DTYPES = {"bf16": "bfloat16", "f32": "float32", "i32": "int32"}


def _check_against(specs, given: dict) -> None:
    """Every given tensor against the task's TensorSpec of that name (tasks/kda/task.py: the interface
    the kernels are tested on): a CUDA torch tensor of that shape and dtype."""
    import torch
    for spec in specs:
        t = given.get(spec.name)
        if t is None:
            continue
        if not getattr(t, "is_cuda", False):
            raise TypeError(f"{spec.name}: a CUDA torch tensor is expected")
        if tuple(t.shape) != tuple(spec.shape):
            raise ValueError(f"{spec.name}: shape {tuple(t.shape)}, expected {tuple(spec.shape)}")
        want = getattr(torch, _TORCH_DTYPES[spec.dtype])
        if t.dtype != want:
            raise TypeError(f"{spec.name}: dtype {t.dtype}, expected {want}")


def _dims(q, v) -> tuple:
    if q.shape[-1] != K or v.shape[-1] != V:
        raise ValueError(f"K = V = {K} only (q has K = {q.shape[-1]}, v has V = {v.shape[-1]})")
    if v.shape[1] % q.shape[1]:
        raise ValueError(f"HV = {v.shape[1]} must be a multiple of H = {q.shape[1]}")
    return q.shape[0], q.shape[1], v.shape[1]


def _layout(state_layout: str) -> int:
    if state_layout not in ("vk", "kv"):
        raise ValueError(f"state_layout must be 'vk' or 'kv', not {state_layout!r}")
    return int(state_layout == "vk")


def kda_prefill(q, k, v, g, beta, A_log, dt_bias, *, cu_seqlens=None, initial_state=None,
                safe_gate: bool = True, state_layout: str = "vk", plan: Optional[tuple] = None):
    """-> (o [T, HV, V] bf16, final states fp32 in `state_layout`). `plan` overrides `prefill_plan`."""
    import torch

    from tasks.kda.task import TASK

    from .runtime import runtime
    T, H, HV = _dims(q, v)
    dev = q.device
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, T], dtype=torch.int32, device=dev)
    N = cu_seqlens.numel() - 1
    shape = {"T": T, "N": N, "H": H, "HV": HV, "SAFE": int(bool(safe_gate)), "VK": _layout(state_layout),
             "H0": int(initial_state is not None)}
    _check_against(TASK.inputs(shape), {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log,
                                        "dt_bias": dt_bias, "h0": initial_state, "cu_seqlens": cu_seqlens})
    sshape = next(o.shape for o in TASK.outputs(shape) if o.name == "ht")
    rt = runtime(dev.index or 0)
    kind, params = plan or prefill_plan(H, HV, N, safe_gate, rt.arch, rt.props.get("sms", 132), T)

    def build(arch):
        if kind == "two_pass":
            from tasks.kda.two_pass import kda_two_pass
            return kda_two_pass(arch=arch, **params)
        if kind == "chunked":
            from tasks.kda.chunked import kda_chunk16_ws
            return kda_chunk16_ws(arch=arch, **params)
        from tasks.kda.programs import kda_recurrent
        return kda_recurrent(arch=arch, **params)
    kern = rt.kernel(("kda_prefill", kind, tuple(sorted(params.items()))), build)
    o = torch.empty(T, HV, V, dtype=torch.bfloat16, device=dev)
    ht = torch.empty(sshape, dtype=torch.float32, device=dev)
    h0 = initial_state if initial_state is not None else torch.empty(sshape, dtype=torch.float32, device=dev)
    tensors = {"q": q.contiguous(), "k": k.contiguous(), "v": v.contiguous(), "g": g.contiguous(),
               "beta": beta.contiguous(), "A_log": A_log, "dt_bias": dt_bias, "h0": h0.contiguous(),
               "cu_seqlens": cu_seqlens, "o": o, "ht": ht}
    rt.launch(kern, tensors, TASK.scalars(shape), torch.cuda.current_stream(dev).cuda_stream)
    return o, ht


def decode_plan(B: int, HV: int, state_layout: str, sms: int = 132) -> dict:
    """Params of the decode program for B sequences of HV value heads (tasks/kda_decode/programs.py).

    "vk": kda_decode, vw 8 x vsplit 4 (the measured point of bench/results/kda-decode-h200.json); vw 4
    (twice the warps, 59 registers) while vw 8 would give under 16 warps per SM (B <= 4 at HV = 32:
    the state loads of too few warps cannot cover the memory latency); vw 16 x vsplit 2 (half the
    CTAs, each twice the rows) from B * HV = 4096 CTA pairs on (B >= 128 at HV = 32: 0.2898 against
    0.2928 ms at B = 256 in the H200 pool bench, about 1%; the bench keeps timing 8x4 beside it).
    "kv": kda_decode_kv (form "cols": lanes along V, a warp instruction one contiguous row segment),
    8 warps of 16 K rows, by B * HV: 1 column per lane (V-slices of 32, 4 CTAs per SM at 64 registers)
    while 2 columns' grid of HV * B * 2 CTAs would fill under two CTAs per SM (B <= 4 at HV = 32);
    4 columns per lane (whole 512-byte rows per warp instruction like the [V, K] program, one CTA per
    state, 2 CTAs per SM at 124 registers) from B * HV = 4096 on, where the grid is 15+ waves deep
    (B >= 128 at HV = 32); 2 columns (8-byte vectors, 2 CTAs per SM at 108 registers: a 3-CTA cap of
    80 makes ptxas split the state stores) between. bench/kda_decode_device.sh measures these choices
    beside the other points."""
    if _layout(state_layout) == 0:
        if B * HV * (V // 64) < 2 * sms:
            return {"form": "cols", "vec": 1, "warps": 8, "blocks": 4}
        return {"form": "cols", "vec": 4 if B * HV >= 4096 else 2, "warps": 8, "blocks": 2}
    vw = 4 if B * HV * (V // 8) < 16 * sms else 16 if B * HV >= 4096 else 8
    return {"vw": vw, "vsplit": 32 // vw, "stage_kv": False}


def _decode_program(params: dict, arch: str, inplace: bool):
    """The decode program of a plan: form "cols" (kda_decode_kv, the [K, V] layout only) or kda_decode
    (both layouts; vw, vsplit, stage_kv)."""
    from tasks.kda_decode import programs
    p = dict(params)
    if p.pop("form", "rows") == "cols":
        return programs.kda_decode_kv(**p, arch=arch, inplace=inplace, pool="P")
    p.setdefault("stage_kv", False)
    return programs.kda_decode(**p, arch=arch, inplace=inplace, pool="P")


def _decode_pools(state_pool, inplace: bool, out):
    """(pool the kernel reads, pool it writes) for the three modes; refuses an `out` that overlaps
    the input pool (the copying kernel declares the two pools non-aliasing) and a non-contiguous
    pool to update in place."""
    if inplace or out is state_pool:
        if out is not None and out is not state_pool:
            raise ValueError("inplace=True writes state_pool itself: pass no `out`")
        if not state_pool.is_contiguous():
            raise ValueError("inplace=True needs a contiguous state_pool (its rows are written where they are)")
        return state_pool, state_pool
    if out is None:
        src = state_pool.contiguous()
        return src, src.clone()
    if tuple(out.shape) != tuple(state_pool.shape) or out.dtype != state_pool.dtype or not out.is_contiguous():
        raise ValueError(f"out: a contiguous {state_pool.dtype} pool of shape {tuple(state_pool.shape)} is expected")
    a0, a1 = state_pool.data_ptr(), state_pool.data_ptr() + state_pool.numel() * 4
    b0, b1 = out.data_ptr(), out.data_ptr() + out.numel() * 4
    if a0 < b1 and b0 < a1:
        raise ValueError("out overlaps state_pool: pass out=state_pool (or inplace=True) to update in place")
    return state_pool.contiguous(), out


def _check_decode(q, k, v, g, beta, A_log, dt_bias, state_pool, idx, safe_gate, state_layout) -> dict:
    """The decode task's checks (tasks/kda/task.py DECODE_TASK) with a pool of any P >= 1 slots."""
    from tasks.kda.task import DECODE_TASK
    B, H, HV = _dims(q, v)
    P = state_pool.shape[0] if state_pool.dim() == 4 else -1
    if P < 1:
        raise ValueError(f"state_pool: [P, HV, {K}, {V}] with P >= 1 expected, got {tuple(state_pool.shape)}")
    shape = {"B": B, "H": H, "HV": HV, "SAFE": int(bool(safe_gate)), "VK": _layout(state_layout)}
    specs = [s for s in DECODE_TASK.inputs(shape) if s.name != "state"]
    _check_against(specs, {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log,
                           "dt_bias": dt_bias, "idx": idx})
    _check_against([replace(s, shape=(P,) + tuple(s.shape[1:])) for s in DECODE_TASK.inputs(shape)
                    if s.name == "state"], {"state": state_pool})
    return {**shape, "P": P}


def kda_decode(q, k, v, g, beta, A_log, dt_bias, state_pool, idx, *, safe_gate: bool = True,
               state_layout: str = "vk", inplace: bool = False, out=None, plan: Optional[dict] = None):
    """One decode token per sequence: q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV] bf16;
    state_pool fp32 [P, HV, V, K] ("vk") or [P, HV, K, V] ("kv"), P >= 1 slots; idx [B] int32: sequence
    b continues from state_pool[idx[b]] and its new state goes to row idx[b]. The idx entries must be
    distinct and in [0, P) (an out-of-range entry traps the kernel; duplicates race, as in fla).
    -> (o [B, HV, V] bf16, pool), by mode:

    - inplace=True (the serving path, vLLM / SGLang style: a persistent pool indexed by slot ids):
      rows idx[b] of state_pool are updated where they are, every other row untouched, and the pool
      returned is state_pool itself. One kernel, the state read and written once: the fast path.
      Passing out=state_pool means the same.
    - out=<pool> (a preallocated [P, ..] pool, not overlapping state_pool): rows idx[b] of `out`
      receive the new states, its other rows are left as they are; state_pool is not written.
    - default (inplace=False, no out): a new pool, a copy of state_pool with rows idx[b] updated; the
      input is untouched (one extra copy of the whole pool per call).
    `plan` overrides `decode_plan`: {"form": "cols", "vec", "warps", "blocks"} (kda_decode_kv, "kv"
    only) or {"vw", "vsplit", "stage_kv"} (kda_decode)."""
    import torch

    from tasks.kda.task import DECODE_TASK

    from .runtime import runtime
    shape = _check_decode(q, k, v, g, beta, A_log, dt_bias, state_pool, idx, safe_gate, state_layout)
    src, dst = _decode_pools(state_pool, inplace, out)
    rw = dst is src
    dev = q.device
    rt = runtime(dev.index or 0)
    params = dict(plan or decode_plan(shape["B"], shape["HV"], state_layout, rt.props.get("sms", 132)))
    if params.get("form") == "cols" and state_layout != "kv":
        raise ValueError("the 'cols' decode form serves state_layout 'kv' only")

    def build(arch):
        return _decode_program(params, arch, rw)
    kern = rt.kernel(("kda_decode", tuple(sorted(params.items())), rw), build)
    o = torch.empty(shape["B"], shape["HV"], V, dtype=torch.bfloat16, device=dev)
    tensors = {"q": q.contiguous(), "k": k.contiguous(), "v": v.contiguous(), "g": g.contiguous(),
               "beta": beta.contiguous(), "A_log": A_log, "dt_bias": dt_bias, "state": src, "idx": idx, "o": o}
    if not rw:
        tensors["state_out"] = dst
    scalars = {**DECODE_TASK.scalars(shape), "P": shape["P"]}
    rt.launch(kern, tensors, scalars, torch.cuda.current_stream(dev).cuda_stream)
    return o, dst
