"""The run's baselines: timed once per (GPU, library versions, task input version, shape) and kept in
the knowledge store (table `baselines`), so a run on a machine that timed them before starts without
re-running them (fla's chunk_kda spends minutes in Triton compilation and autotuning on a cold start).

A cached verdict is a measured one: "ok" (with its median) or "fail" (the baseline's output failed the
task's check on its inputs). An unavailable baseline (library not installed) is asked again each run,
which costs an import. `agent.run --retime-baselines` ignores the cache and replaces it.

Baselines are timed on the run's bench inputs (the same data as every candidate, built once per worker:
gpu_backend.task_data), by the GPU worker's `agent.baselines.dispatch`.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from importlib import metadata
from typing import Optional

# the libraries a baseline's speed can depend on (those not installed are recorded as absent)
LIBRARIES = ("torch", "triton", "fla-core", "flash-kmeans", "flashlib", "flash-kda", "cuda-bindings")
CACHED_STATUSES = ("ok", "fail")


def versions(task) -> dict:
    """Installed library versions and the task's input/reference version (its package's source)."""
    from gpu_backend.task_data import task_version
    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    out["task"] = task_version(task)
    return out


def cache_key(task_name: str, shape: dict, name: str, device: str, vers: dict) -> str:
    blob = json.dumps([task_name, sorted(shape.items()), name, device, sorted(vers.items())], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def time_baselines(rt, retime: bool = False) -> dict:
    """{name: {"status", "ms", "device", "message", "error_class", "cached"}} for the task's baselines
    at the run's shape: from the cache where a measured verdict is there, else timed on the workers
    (each verdict then stored). {"_none": ...} when the task declares none."""
    bl = rt.entry.baselines
    if not bl:
        return {"_none": {"status": "none", "message": "the task declares no baselines"}}
    device = _device(rt)
    vers = versions(rt.entry.task)
    keys = [cache_key(rt.cfg.task, rt.shape, b["name"], device, vers) for b in bl]
    out: dict = {}
    for b, key in zip(bl, keys):
        row = None if retime or not device else rt.store.baseline(key)
        if row is not None and row.status in CACHED_STATUSES:
            out[b["name"]] = {**(row.result or {}), "cached": row.created_at.isoformat(timespec="seconds")}
    todo = [(b, key) for b, key in zip(bl, keys) if b["name"] not in out]
    bench_seed = zlib.crc32(f"{rt.cfg.seed}:{rt.cfg.run_id}:bench".encode()) & 0x7FFFFFFF
    jobs = [{"baseline": b["name"], "call": b["call"], "task": rt.cfg.task, "shape": rt.shape, "name": b["name"],
             "bench_seed": bench_seed, "seed": zlib.crc32(f"{rt.cfg.seed}:baseline:{b['name']}".encode()) & 0x7FFFFFFF,
             "deadline_s": max(rt.cfg.deadline_s, 600.0)} for b, _ in todo]

    def done(idx: int, rec: dict) -> None:
        b, key = todo[idx]
        tm = (rec.get("timings") or [None])[0]
        res = {"status": rec.get("status"), "ms": tm["ms_median"] if tm else None, "device": rec.get("device"),
               "message": (rec.get("message") or "")[:300], "error_class": rec.get("error_class"),
               "seconds": rec.get("wall_s")}
        out[b["name"]] = res
        if res["status"] in CACHED_STATUSES and device:
            rt.store.save_baseline(key, task=rt.cfg.task, name=b["name"], device=device, shape=rt.shape,
                                   versions=vers, status=res["status"], result=res, run_id=rt.cfg.run_id)

    try:
        rt.backend.evaluate(jobs, done, stop=rt.over_budget)
    except Exception as e:  # noqa: BLE001 - no baseline is not a reason to stop the run
        out["_error"] = {"status": "error", "message": f"{type(e).__name__}: {e}"[:300]}
    for n, b in out.items():
        rt.progress.event(f"[{rt.cfg.run_id}] baseline {n}: {describe(b)}")
    return out


def describe(b: dict) -> str:
    if b.get("status") == "ok":
        how = f"cached from {b['cached']}" if b.get("cached") else f"timed in {b.get('seconds') or 0:.0f} s"
        return f"{b['ms']:.4f} ms on {b.get('device')} ({how})"
    if b.get("status") == "skipped":
        return "not timed (the run's time budget ran out first)"
    return (f"not timed ({b.get('error_class') or b.get('status')}: {b.get('message', '')[:120]})"
            + (f"; cached from {b['cached']}" if b.get("cached") else ""))


def _device(rt) -> Optional[str]:
    """The name of the GPU the run evaluates on (the first one's, from the workers' start-up check)."""
    devs = getattr(rt.backend, "devices", None) or {}
    names = sorted({str(d) for d in devs.values() if d})
    return ",".join(names) if names else None
