"""Test doubles for the agent's GPU path on a machine without a GPU (imported by spawned workers).

`fake_eval(job, progress)` stands in for gpu_backend.evaluate.run_job / the baseline hook: it checks
the candidate loads as CAKE IR, fails about one candidate in five at the test stage (wrong_result, as
a real test would report it), and reports a deterministic fake timing derived from the cost model
(1.3x its prediction) at each of the job's bench shapes (the run's timed shapes, as the real worker
does). Baseline jobs get a fixed 1.0 ms. A job with input_pool 0 (the confirm stage's fresh inputs)
fails for about one candidate in three (for all with CAKE_FAKE_CONFIRM_FAIL=all). CAKE_FAKE_EVAL_SLEEP makes every job take that many seconds
(budget and progress tests). Nothing here is a measurement.
"""
import os
import time
import zlib


def fake_eval(job, progress=None):
    if progress:
        progress("compile")
    time.sleep(float(os.environ.get("CAKE_FAKE_EVAL_SLEEP", "0")))
    if job.get("hello"):
        return {"status": "ok", "stage": "compile", "candidate": "hello", "task": "-", "device": "FakeGPU",
                "worker_pid": os.getpid()}
    if "baseline" in job:
        shape = job["shape"]
        return {"status": "ok", "stage": "profile", "candidate": job["baseline"], "task": job["task"],
                "device": "FakeGPU", "worker_pid": os.getpid(),
                "timings": [{"shape": shape, "ms_min": 0.9, "ms_median": 1.0, "ms_max": 1.1, "reps": 5, "warmup": 1}]}
    from cake_ir.cost import estimate
    from cake_ir.io import ir_hash, load
    from tasks.registry import get

    text = job["candidate"]
    kernel, diags = load(text)
    rec = {"candidate": job.get("name", "?"), "task": job["task"], "device": "FakeGPU", "worker_pid": os.getpid(),
           "seed": job.get("seed")}
    if kernel is None:
        return {**rec, "status": "fail", "stage": "compile", "error_class": "parse_error", "message": str(diags)[:200]}
    h = ir_hash(kernel)
    if zlib.crc32(h.encode()) % 5 == 0:
        return {**rec, "status": "fail", "stage": "test", "error_class": "wrong_result",
                "message": "shape {'M': 7}: rel RMSE 0.31 > 0.01 (fake)", "max_rel_rmse": 0.31}
    if not job.get("profile", True):
        fail_all = os.environ.get("CAKE_FAKE_CONFIRM_FAIL") == "all"
        if job.get("input_pool") == 0 and (fail_all or zlib.crc32(h.encode()) % 3 == 0):   # the confirm stage
            return {**rec, "status": "fail", "stage": "test", "error_class": "wrong_result",
                    "message": "fresh inputs: rel RMSE 0.2 > 0.01 (fake)", "max_rel_rmse": 0.2}
        return {**rec, "status": "ok", "stage": "test", "max_rel_rmse": 0.002}
    entry = get(job["task"])
    timings = []
    for shape in job.get("bench_shapes") or [entry.bench_shape]:
        ms = estimate(kernel, shape).seconds * 1.3e3
        timings.append({"shape": shape, "ms_min": ms * 0.98, "ms_median": ms, "ms_max": ms * 1.05, "reps": 5,
                        "warmup": 1, "tflops": entry.task.flops(shape) / (ms * 1e-3) / 1e12})
    return {**rec, "status": "ok", "stage": "profile", "max_rel_rmse": 0.002, "timings": timings}
