"""Test doubles for the worker pool (imported by spawned workers, so module-level functions only).

`dispatch(job, progress)` picks a behaviour by job["kind"]: ok (optionally sleeping job["sleep"]
seconds), hang (reports stage "test", then sleeps forever), exit (os._exit without replying),
sticky (raises a CUDA illegal-address error), raise (an ordinary exception), slow_profile (reports
"profile", then sleeps forever).
"""
import os
import time


class _Code:
    def __init__(self, name):
        self.name = name


def dispatch(job, progress):
    kind = job.get("kind", "ok")
    if kind == "ok":
        time.sleep(float(job.get("sleep", 0)))
        return {"status": "ok", "stage": "profile", "candidate": job.get("name", "double"),
                "message": f"cvd={os.environ.get('CUDA_VISIBLE_DEVICES')}", "compile": {"t": time.time()}}
    if kind == "hang":
        progress("compile")
        progress("test", shape={"M": 1})
        time.sleep(10**6)
    if kind == "slow_profile":
        progress("profile")
        time.sleep(10**6)
    if kind == "exit":
        os._exit(7)
    if kind == "sticky":
        from gpu_backend.driver import CudaError
        raise CudaError("cuCtxSynchronize", _Code("CUDA_ERROR_ILLEGAL_ADDRESS"))
    if kind == "raise":
        raise ValueError("a bug in the job")
    raise AssertionError(kind)
