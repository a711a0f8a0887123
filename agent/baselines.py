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
    fn = _resolve(job["call"])
    if progress:
        progress("profile", shape=shape)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    inputs = task.make_inputs(shape, int(job.get("seed") or 0))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    specs = {s.name: s for s in task.inputs(shape)}
    tin = {n: torch.from_numpy(inputs[n]).to(dev).to(dt.get(specs[n].dtype, torch.float32)) for n in specs}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 * 2**20), dtype=torch.uint8, device=dev)
    warmup, reps = int(job.get("warmup", 3)), int(job.get("reps", 20))
    for _ in range(warmup):
        fn(tin)
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
