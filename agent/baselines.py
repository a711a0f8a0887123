"""Baseline hook: library implementations (torch.matmul, torch.softmax) timed by the evaluation worker.

The GPU worker pool runs `dispatch`: a job with a "baseline" key is a baseline timing, a "hello" job the
worker's start-up check (gpu_backend.evaluate.hello); any other job is a candidate evaluation
(gpu_backend.evaluate.run_job). Tasks declare their baselines
(tasks/registry.py: {"name", "call"}); if gpu_backend.evaluate grows its own `run_baseline(job)`, it
is used instead of the fallback below.

The fallback follows docs/evaluation rules as far as a library call allows: the task's own inputs
(same generator, same dtypes: bf16 in and out, fp32 accumulation inside torch), warm-up, median of
CUDA-event timings with L2 flushed before every repetition (a buffer twice the L2 size is rewritten),
and a correctness check of the baseline's outputs against the task's float64 reference. TF32 is off
so neither side uses a lower precision than the task allows. Without torch the record says
`error_class="baseline_unavailable"` and speedups are not reported.
"""
from __future__ import annotations

import os
import statistics
import time


def dispatch(job: dict, progress=None) -> dict:
    if job.get("hello"):
        from gpu_backend.evaluate import hello
        return hello(job, progress)
    if "baseline" in job:
        from gpu_backend import evaluate as ev
        own = getattr(ev, "run_baseline", None)
        if own is not None:
            return own(job, progress) if _takes_progress(own) else own(job)
        return time_baseline(job, progress)
    from gpu_backend.evaluate import run_job
    return run_job(job, progress)


def _takes_progress(fn) -> bool:
    import inspect
    try:
        return len(inspect.signature(fn).parameters) >= 2
    except (TypeError, ValueError):
        return False


def _resolve(path: str):
    import importlib
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


def time_baseline(job: dict, progress=None) -> dict:
    t0 = time.perf_counter()
    rec = {"job_id": job.get("job_id"), "candidate": job["baseline"], "task": job["task"], "stage": "profile",
           "worker_pid": os.getpid(), "seed": job.get("seed")}
    try:
        import torch
    except ImportError:
        rec.update(status="error", error_class="baseline_unavailable",
                   message="torch is not installed in the evaluation worker; baselines are not timed")
        return rec
    if not torch.cuda.is_available():
        rec.update(status="error", error_class="baseline_unavailable", message="torch sees no CUDA device")
        return rec
    from tasks.registry import get

    entry = get(job["task"])
    task = entry.task
    shape = dict(job["shape"])
    try:
        fn = _resolve(job["call"])
    except (ImportError, AttributeError) as e:   # flash-kmeans / flashlib exist only on GPU machines
        rec.update(status="error", error_class="baseline_unavailable", message=f"{job['baseline']}: {e}")
        return rec
    if progress:
        progress("profile", shape=shape)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    inputs, refs_of = _inputs(task, shape, job)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    specs = {s.name: s for s in task.inputs(shape)}
    tin = {n: torch.from_numpy(_writable(inputs[n])).to(dev).to(dt.get(specs[n].dtype, torch.float32)) for n in specs}
    if "B" in shape:
        tin["_B"] = int(shape["B"])   # batched tasks (kmeans) fold the batch into rows
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 * 2**20), dtype=torch.uint8, device=dev)
    warmup, reps = int(job.get("warmup", 3)), int(job.get("reps", 20))
    try:
        for _ in range(warmup):
            fn(tin)
    except (ImportError, TypeError, AttributeError) as e:   # a library missing or with another API here
        rec.update(status="error", error_class="baseline_unavailable", message=f"{job['baseline']}: {e}")
        return rec
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.fill_(1)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = fn(tin)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    ref = refs_of()
    # the same checks as candidates (run_checks: the task's own check for knn / kmeans -- ties in the
    # indices, inertia -- else rel RMSE / max-abs), on the baseline's outputs as device bits
    checks = check_baseline_outputs(task, _host_outputs(out), ref, inputs, shape)
    bad = next((c for c in checks if not c.ok), None)
    rels = [c.rel_rmse for c in checks if c.rel_rmse is not None]
    worst = float("inf") if bad is not None and not rels else max(rels, default=0.0)
    med = statistics.median(times)
    sec = med * 1e-3
    rec.update(status="ok" if bad is None else "fail",
               error_class=None if bad is None else (bad.error_class or "wrong_result"),
               device=torch.cuda.get_device_name(0), max_rel_rmse=worst,
               timings=[{"shape": shape, "ms_min": min(times), "ms_median": med, "ms_max": max(times), "reps": reps,
                         "warmup": warmup, "flush_bytes": flush.numel(), "rechecked": True,
                         "tflops": task.flops(shape) / sec / 1e12, "tbps": task.bytes(shape) / sec / 1e12}],
               message=f"{job['baseline']} (torch {torch.__version__})" + (f": {bad.message}" if bad else ""),
               wall_s=time.perf_counter() - t0)
    return rec


def _inputs(task, shape: dict, job: dict):
    """(inputs, refs()) the baseline runs on: with `bench_seed`, the run's bench inputs of this shape,
    the very data its candidates are timed on (built once per worker, gpu_backend.task_data); else
    fresh inputs from the job's seed."""
    if job.get("bench_seed") is not None:
        from gpu_backend.evaluate import DATA, derive_seed
        return DATA.get(task, shape, derive_seed(int(job["bench_seed"]), 1000))
    inputs = task.make_inputs(shape, int(job.get("seed") or 0))
    return inputs, lambda: task.reference(inputs, shape)


def _writable(a):
    """torch.from_numpy wants a writable array; cached inputs are read-only memory maps."""
    import numpy as np
    return a if getattr(a, "flags", None) is not None and a.flags.writeable else np.array(a)


def _host_outputs(out: dict) -> dict:
    """torch tensors -> host numpy values (bf16/f16 widened to float32; numpy has no bf16)."""
    import torch
    host = {}
    for n, t in out.items():
        if isinstance(t, torch.Tensor):
            t = t.detach()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.float()
            host[n] = t.cpu().numpy()
        else:
            host[n] = t
    return host


def check_baseline_outputs(task, host: dict, refs: dict, inputs: dict, shape: dict) -> list:
    """Check a baseline's host outputs exactly as a candidate's: convert each declared output to the
    device bits of its task dtype and shape, then gpu_backend.checks.run_checks (CPU only, no torch)."""
    import numpy as np
    from gpu_backend.checks import OutputCheck, run_checks
    from gpu_backend.memory import to_bits
    bits, dtypes = {}, {}
    for spec in task.outputs(shape):
        if spec.name not in host:
            return [OutputCheck(name=spec.name, ok=False, error_class="wrong_result",
                                message=f"{spec.name}: the baseline returned no such output")]
        v = np.asarray(host[spec.name])
        want = tuple(spec.shape)
        if v.size == int(np.prod(want)):
            v = v.reshape(want)       # e.g. kmeans A as [B, N] or Cnew as [B, K, D]
        bits[spec.name], dtypes[spec.name] = to_bits(v, spec.dtype), spec.dtype
    return run_checks(task, bits, dtypes, refs, inputs, shape)


# --------------------------------------------------------------------------- knn / kmeans baselines
# Each takes the task's inputs as torch tensors (names as in tasks/<task>/task.py) and returns its
# outputs; libraries are imported lazily (flash-kmeans and flashlib are installed only on GPU machines).
def _knn_torch(inputs: dict, metric: str, k: int = 10, chunk: int = 1 << 18) -> dict:
    """Chunked matmul + topk over the database (the usual torch recipe; fp16 matmul, fp32 scores)."""
    import torch
    q, b = inputs["Xq"], inputs["Xb"]
    qn = (q.float() ** 2).sum(1, keepdim=True)
    best_v = best_i = None
    for m0 in range(0, b.shape[0], chunk):
        bc = b[m0:m0 + chunk]
        s = (q @ bc.T).float()
        s = qn + (bc.float() ** 2).sum(1)[None, :] - 2 * s if metric == "l2" else -s
        v, i = torch.topk(s, min(k, s.shape[1]), dim=1, largest=False)
        i = i + m0
        if best_v is not None:
            v, j = torch.topk(torch.cat([best_v, v], 1), k, dim=1, largest=False)
            i = torch.gather(torch.cat([best_i, i], 1), 1, j)
        best_v, best_i = v, i
    return {"I": best_i.int(), "Dist": best_v if metric == "l2" else -best_v}


def knn_l2_torch(inputs: dict) -> dict:
    return _knn_torch(inputs, "l2")


def knn_ip_torch(inputs: dict) -> dict:
    return _knn_torch(inputs, "ip")


def knn_l2_flashlib(inputs: dict) -> dict:
    """flashlib 0.4.0 exact brute-force kNN (flashlib/primitives/knn/impl.py `flash_knn_dispatch`, exported
    as `flashlib.flash_knn`; there is no `flashlib.knn`): flash_knn(x [N, D] | [B, N, D], c [M, D], k)
    -> (squared-L2 distances fp32, indices), same dtype for x and c (f16 here: the exact path keeps it)."""
    from flashlib import flash_knn
    d, i = flash_knn(inputs["Xq"], inputs["Xb"], 10)
    return {"I": i.int(), "Dist": d.float()}


def lloyd_step_torch(x, c):
    """One Lloyd iteration in torch for x [B, N, D], c [B, K, D]: matmul + argmin + scatter_add ->
    (assignments [B, N], new centroids [B, K, D] f32; empty clusters keep their centroid)."""
    import torch
    B, _, D = x.shape
    K = c.shape[1]
    d = (c.float() ** 2).sum(-1)[:, None, :] - 2 * torch.bmm(x, c.transpose(1, 2)).float()
    a = d.argmin(-1)
    sums = torch.zeros(B, K, D, device=x.device, dtype=torch.float32)
    sums.scatter_add_(1, a[..., None].expand(-1, -1, D), x.float())
    cnt = torch.zeros(B, K, device=x.device, dtype=torch.float32)
    cnt.scatter_add_(1, a, torch.ones_like(a, dtype=torch.float32))
    return a, torch.where(cnt[..., None] > 0, sums / cnt.clamp(min=1)[..., None], c.float())


def kmeans_torch(inputs: dict, B: int | None = None) -> dict:
    """One Lloyd iteration in torch (`lloyd_step_torch`) on the task's folded [B*N, D] / [B*K, D]."""
    from tasks.kmeans.task import D
    B = B or int(inputs.get("_B", 1))
    a, new = lloyd_step_torch(inputs["X"].view(B, -1, D), inputs["C"].view(B, -1, D))
    return {"A": a.int(), "Cnew": new.view(-1, D)}


def kmeans_flash(inputs: dict, B: int | None = None) -> dict:
    """flash-kmeans 0.3.1 (Triton), one iteration from the task's centroids:
    flash_kmeans/kmeans_triton_impl.py batch_kmeans_Euclid(x [B, N, D], n_clusters, max_iters, tol=0.0,
    init_centroids [B, K, D] same dtype as x) -> (ids [B, N], centroids [B, K, D] in x's dtype, iters).
    With max_iters=1 the ids are the assignment to the given centroids and the centroids the update."""
    import flash_kmeans
    from tasks.kmeans.task import D
    fn = flash_kmeans.batch_kmeans_Euclid
    if fn.__module__.endswith("torch_fallback"):
        # its __init__ silently swaps in the torch implementation when the Triton import fails
        raise ImportError("flash_kmeans fell back to its torch implementation (Triton import failed)")
    B = B or int(inputs.get("_B", 1))
    x = inputs["X"].view(B, -1, D)
    c = inputs["C"].view(B, -1, D)
    a, centers, _ = fn(x, n_clusters=c.shape[1], max_iters=1, init_centroids=c)
    return {"A": a.int(), "Cnew": centers.float().reshape(-1, D)}


def kmeans_flashlib(inputs: dict, B: int | None = None) -> dict:
    """flashlib 0.4.0 k-means (flashlib/primitives/kmeans/impl.py `flash_kmeans`, the smart dispatcher:
    Triton batch_kmeans_Euclid, or CuteDSL on Hopper when installed), one Lloyd iteration:
    flash_kmeans(x [B, N, D], n_clusters, max_iters=1, init_centroids [B, K, D]) -> (ids [B, N],
    centroids in x's dtype, iters). Empty clusters keep their centroid, as in the task's reference."""
    from flashlib import flash_kmeans
    from tasks.kmeans.task import D
    B = B or int(inputs.get("_B", 1))
    x = inputs["X"].view(B, -1, D)
    c = inputs["C"].view(B, -1, D)
    a, centers, _ = flash_kmeans(x, c.shape[1], max_iters=1, init_centroids=c)
    return {"A": a.int(), "Cnew": centers.float().reshape(-1, D)}


# --------------------------------------------------------------------------- kda / kda_decode baselines
# fla-core 0.6.0 (Triton) and FlashKDA exist only on GPU machines: imported lazily, an ImportError makes
# the record `baseline_unavailable`. The task's flags (gate form, state layout, initial state) are not
# in the inputs dict the harness passes: pass `shape=`; without it the task's first bench shape (the
# shape an agent run times) is assumed after checking the tensor sizes agree.
_KDA_INDEX_CACHE: dict = {}


def _kda_shape(inputs: dict, shape, decode: bool) -> dict:
    from tasks.kda.task import DECODE_TASK, TASK
    if shape is not None:
        return dict(shape)
    s = dict((DECODE_TASK if decode else TASK).bench_shapes[0])
    H, HV = inputs["q"].shape[1], inputs["v"].shape[1]
    n = inputs["q"].shape[0]
    if (s["H"], s["HV"], s["B" if decode else "T"]) != (H, HV, n) or \
            (not decode and inputs["cu_seqlens"].shape[0] != s["N"] + 1):
        raise TypeError("kda baseline: the inputs are not the first bench shape's; pass shape= (gate form, "
                        "state layout and initial-state flags are not in the inputs)")
    return s


def _kda_index(t):
    """An index tensor (the harness hands i32 inputs over as float32) as int64 on the device plus a
    host copy, converted once per input tensor (fla caches chunk indices per cu_seqlens tensor)."""
    key = (id(t), t.data_ptr(), tuple(t.shape))
    hit = _KDA_INDEX_CACHE.get(key)
    if hit is None:
        import torch
        dev = t.round().to(torch.int64)
        hit = (t, dev, dev.cpu())   # t kept alive so the key cannot be reused by another tensor
        if len(_KDA_INDEX_CACHE) > 16:
            _KDA_INDEX_CACHE.pop(next(iter(_KDA_INDEX_CACHE)))
        _KDA_INDEX_CACHE[key] = hit
    return hit[1], hit[2]


def kda_chunk_fla(inputs: dict, shape: dict | None = None) -> dict:
    """fla.ops.kda.chunk_kda (Triton) with the task's flags: in-kernel q/k L2 norm, gate activation and
    beta sigmoid; safe_gate + lower_bound=-5 for the safe gate; state_v_first for VK; cu_seqlens for
    N > 1. fla's FlashKDA backend is switched off (FLA_FLASH_KDA=0), so this times fla's own kernels."""
    import torch
    from fla.ops.kda import chunk_kda
    from tasks.kda.reference import LOWER_BOUND
    s = _kda_shape(inputs, shape, decode=False)
    os.environ["FLA_FLASH_KDA"] = "0"   # read per call by fla's dispatcher
    K = inputs["q"].shape[-1]
    cu, cu_cpu = _kda_index(inputs["cu_seqlens"]) if s["N"] > 1 else (None, None)
    with torch.no_grad():
        o, ht = chunk_kda(
            q=inputs["q"][None], k=inputs["k"][None], v=inputs["v"][None], g=inputs["g"][None],
            beta=inputs["beta"][None], scale=K ** -0.5,
            initial_state=inputs["h0"] if s["H0"] else None, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            safe_gate=bool(s["SAFE"]), lower_bound=LOWER_BOUND if s["SAFE"] else None,
            state_v_first=bool(s["VK"]), cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
            A_log=inputs["A_log"], dt_bias=inputs["dt_bias"].reshape(-1))
    return {"o": o[0], "ht": ht}


def kda_flashkda(inputs: dict, shape: dict | None = None) -> dict:
    """FlashKDA (MoonshotAI, CUTLASS, SM90; not on PyPI) called as fla 0.6.0's FlashKDA backend calls
    it (fla/ops/kda/backends/flash_kda.py). It implements only the safe gate, HV == H and the
    [N, HV, V, K] state layout; other shapes are reported unavailable (TypeError)."""
    import flash_kda
    import torch
    from tasks.kda.reference import LOWER_BOUND
    s = _kda_shape(inputs, shape, decode=False)
    if not s["SAFE"] or s["H"] != s["HV"] or not s["VK"]:
        raise TypeError("FlashKDA supports only the safe gate, HV == H and the [N, HV, V, K] state layout")
    q, v = inputs["q"][None], inputs["v"][None]
    K, V, HV, N = q.shape[-1], v.shape[-1], v.shape[2], s["N"]
    cu = _kda_index(inputs["cu_seqlens"])[0] if N > 1 else None
    out = torch.empty_like(v)
    final = torch.empty(N, HV, K, V, dtype=torch.float32, device=q.device)
    flash_kda.fwd(q, inputs["k"][None], v, inputs["g"][None], inputs["beta"][None], K ** -0.5, out,
                  A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], lower_bound=LOWER_BOUND,
                  initial_state=inputs["h0"] if s["H0"] else None, final_state=final, cu_seqlens=cu)
    return {"o": out[0], "ht": final}


def kda_decode_fla(inputs: dict, shape: dict | None = None) -> dict:
    """fla's fused_recurrent_kda decode kernel (fla/ops/kda/fused_recurrent.py, fla-core 0.6.0) launched
    as `fused_recurrent_kda_fwd` launches it for continuous batching (ssm_state_indices, in-place final
    state), except that the final state goes to a separate pool `state_out` (the evaluator's inputs are
    read-only): state[idx[b]] -> state_out[idx[b]], the serving access pattern, no extra copy."""
    import torch
    import triton
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd_kernel
    from tasks.kda.reference import LOWER_BOUND
    s = _kda_shape(inputs, shape, decode=True)
    q, k, v, g, beta, state = (inputs[n] for n in ("q", "k", "v", "g", "beta", "state"))
    B, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    idx = _kda_index(inputs["idx"])[0]
    o = torch.zeros_like(v)
    state_out = torch.empty_like(state)
    BV = 32
    fused_recurrent_kda_fwd_kernel[(triton.cdiv(V, BV) * B * HV,)](
        q=q, k=k, v=v, g=g, beta=beta, A_log=inputs["A_log"], dt_bias=inputs["dt_bias"], o=o, h0=state,
        ht=state_out, cu_seqlens=None, ssm_state_indices=idx, num_accepted_tokens=None,
        lower_bound=LOWER_BOUND if s["SAFE"] else None, scale=K ** -0.5, N=B, T=1, H=H, HV=HV, K=K, V=V,
        BK=triton.next_power_of_2(K), BV=BV, stride_init_state_token=state.stride(0),
        stride_final_state_token=state_out.stride(0), stride_indices_seq=1, stride_indices_tok=1,
        IS_BETA_HEADWISE=False, USE_QK_L2NORM_IN_KERNEL=True, INPLACE_FINAL_STATE=True,
        USE_GATE_IN_KERNEL=True, APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False,
        STATE_V_FIRST=bool(s["VK"]), num_warps=4, num_stages=2)
    return {"o": o, "state_out": state_out}
