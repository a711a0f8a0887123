"""Baseline hook: library implementations (torch.matmul, torch.softmax) timed by the evaluation worker.

The GPU worker pool runs `dispatch`: a job with a "baseline" key is a baseline timing; any other job
is a candidate evaluation (gpu_backend.evaluate.run_job). Tasks declare their baselines
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
    inputs = task.make_inputs(shape, int(job.get("seed") or 0))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    specs = {s.name: s for s in task.inputs(shape)}
    tin = {n: torch.from_numpy(inputs[n]).to(dev).to(dt.get(specs[n].dtype, torch.float32)) for n in specs}
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
    ref = task.reference(inputs, shape)
    worst = 0.0
    import numpy as np
    if getattr(task, "check", None) is not None:   # knn / kmeans: the task's own check (recall, inertia)
        host = {n: out[n].cpu().numpy() for n in ref}
        checks = task.check(host, ref, inputs, shape)
        worst = 0.0 if all(c.ok for c in checks) else float("inf")
        ref = {}
    for n, r in ref.items():
        o = out[n].float().cpu().numpy().astype(np.float64)
        if not np.isfinite(o).all():
            worst = float("inf")
            break
        worst = max(worst, float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-300)))
    med = statistics.median(times)
    sec = med * 1e-3
    rec.update(status="ok" if worst <= task.tolerance.rel_rmse else "fail",
               error_class=None if worst <= task.tolerance.rel_rmse else "wrong_result",
               device=torch.cuda.get_device_name(0), max_rel_rmse=worst,
               timings=[{"shape": shape, "ms_min": min(times), "ms_median": med, "ms_max": max(times), "reps": reps,
                         "warmup": warmup, "flush_bytes": flush.numel(), "rechecked": True,
                         "tflops": task.flops(shape) / sec / 1e12, "tbps": task.bytes(shape) / sec / 1e12}],
               message=f"{job['baseline']} (torch {torch.__version__})", wall_s=time.perf_counter() - t0)
    return rec


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
    import flashlib   # Triton path; API checked on the GPU machine (baseline_unavailable otherwise)
    d, i = flashlib.knn(inputs["Xq"], inputs["Xb"], k=10)
    return {"I": i.int(), "Dist": d.float()}


def kmeans_torch(inputs: dict, B: int | None = None) -> dict:
    """One Lloyd iteration in torch: matmul + argmin + scatter_add (index_add) per batch."""
    import torch
    from tasks.kmeans.task import D
    X, C = inputs["X"], inputs["C"]
    B = B or int(inputs.get("_B", 1))
    x = X.view(B, -1, D)
    c = C.view(B, -1, D)
    K = c.shape[1]
    d = (c.float() ** 2).sum(-1)[:, None, :] - 2 * torch.bmm(x, c.transpose(1, 2)).float()
    a = d.argmin(-1)
    sums = torch.zeros(B, K, D, device=X.device, dtype=torch.float32)
    sums.scatter_add_(1, a[..., None].expand(-1, -1, D), x.float())
    cnt = torch.zeros(B, K, device=X.device, dtype=torch.float32)
    cnt.scatter_add_(1, a, torch.ones_like(a, dtype=torch.float32))
    new = torch.where(cnt[..., None] > 0, sums / cnt.clamp(min=1)[..., None], c.float())
    return {"A": a.int(), "Cnew": new.view(-1, D)}


def kmeans_flash(inputs: dict, B: int | None = None) -> dict:
    """flash-kmeans (Triton), one iteration from the task's centroids."""
    from flash_kmeans import batch_kmeans_Euclid
    from tasks.kmeans.task import D
    B = B or int(inputs.get("_B", 1))
    x = inputs["X"].view(B, -1, D)
    c = inputs["C"].view(B, -1, D)
    a, centers, _ = batch_kmeans_Euclid(x, n_clusters=c.shape[1], max_iters=1, init_centroids=c)
    return {"A": a.int(), "Cnew": centers.float().reshape(-1, D)}
