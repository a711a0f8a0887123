"""Where candidates are compiled and run: local worker processes (default) or Ray actors.

Both backends expose the same calls, each taking a list of job dicts and a callback that receives
(index, record dict) as each job finishes (so the graph node can store results one by one):

    compile(jobs, on_result, stop=None)    CPU: agent.jobs.cpu_job (verify, cost estimates, NVRTC), `compile_workers` at a time
    evaluate(jobs, on_result, stop=None)   GPU: test / profile / baseline jobs, one worker per GPU id
    check_gpus()                           start the GPU workers; WorkerStartError with the cause if one cannot

`stop()` (the run's time budget) ends dispatching: jobs not started come back as status "skipped".
`on_tick(activity)`, when set, is called about once a second while jobs run, with what each busy
worker is doing (the graph turns it into progress lines).

LocalBackend reuses gpu_backend.worker.WorkerPool for both: CPU compile workers (no GPU pinned) and
one evaluation worker per `--gpus` entry with the pool's watchdog and restart-after-fault.
RayBackend (`--ray-address`, the optional `ray` extra) runs the same job functions in Ray actors: CPU
actors for compiling and one actor per GPU (num_gpus=1) for evaluation, with a deadline per job (a
job past it gets its actor killed and replaced; a dead actor is recorded as a crash).
"""
from __future__ import annotations

import collections
import os
import time
from typing import Callable, Optional

COMPILE_JOB = "agent.jobs:cpu_job"
EVAL_JOB_DEFAULT = "agent.baselines:dispatch"
OnResult = Callable[[int, dict], None]


def eval_job_fn() -> str:
    """The GPU job function: CAKE_EVAL_JOB_FN ("module:function") overrides it (tests use doubles)."""
    return os.environ.get("CAKE_EVAL_JOB_FN") or EVAL_JOB_DEFAULT


class WorkerStartError(RuntimeError):
    """An evaluation worker could not start or reach its GPU (no driver, no device, ...)."""


HELLO_JOB = {"hello": True, "name": "hello", "task": "-", "deadline_s": 120.0}


def hello_problem(gpu, rec: dict) -> Optional[str]:
    """Why a worker's answer to HELLO_JOB means it cannot evaluate (None when it can)."""
    if rec.get("status") == "ok":
        return None
    return f"GPU {gpu}: {rec.get('error_class') or rec.get('status')}: {(rec.get('message') or '').strip()[:400]}"


class LocalBackend:
    kind = "local"

    def __init__(self, gpus: list, compile_workers: int = 2, deadline_s: float = 300.0):
        self.gpus = list(gpus)
        self.compile_workers = max(1, int(compile_workers))
        self.deadline_s = deadline_s
        self._cpool = None
        self._gpool = None
        self.busy = 0
        self.jobs = collections.Counter()
        self.gpu_s = 0.0
        self.on_tick: Optional[Callable[[list], None]] = None
        self.devices: dict = {}

    def _compile_pool(self):
        if self._cpool is None:
            from gpu_backend.worker import WorkerPool
            self._cpool = WorkerPool(gpus=[None] * self.compile_workers, job_fn=COMPILE_JOB, deadline_s=self.deadline_s)
        return self._cpool

    def _gpu_pool(self):
        if self._gpool is None:
            from gpu_backend.worker import WorkerPool
            if not self.gpus:
                raise RuntimeError("no GPUs to evaluate on (use --gpus, or --dry-run)")
            self._gpool = WorkerPool(gpus=self.gpus, job_fn=eval_job_fn(), deadline_s=self.deadline_s)
        return self._gpool

    def _run(self, pool, jobs: list, on_result: OnResult, label: str, stop=None) -> None:
        if label == "gpu":                 # `busy` is what the progress shows: GPU workers at work
            self.busy = min(len(jobs), len(pool.workers))
        tick = (lambda: self.on_tick(pool.activity())) if self.on_tick else None
        try:
            for idx, rec in pool.run_iter(jobs, on_tick=tick, stop=stop):
                d = rec.model_dump()
                d["executor"] = f"{label}:{rec.gpu if rec.gpu is not None else 'cpu'}:{rec.worker_pid}"
                self.jobs[label] += 1
                if label == "gpu":
                    self.gpu_s += float(rec.wall_s or 0.0)
                on_result(idx, d)
        finally:
            if label == "gpu":
                self.busy = 0

    def compile(self, jobs: list, on_result: OnResult, stop=None) -> None:
        if jobs:
            self._run(self._compile_pool(), jobs, on_result, "local", stop)

    def evaluate(self, jobs: list, on_result: OnResult, stop=None) -> None:
        if jobs:
            self._run(self._gpu_pool(), jobs, on_result, "gpu", stop)

    def check_gpus(self) -> dict:
        """Start one worker per GPU and have each open its device; {gpu: device name}, or
        WorkerStartError naming every GPU that cannot evaluate and why."""
        from gpu_backend.worker import WorkerPoolError
        pool = self._gpu_pool()
        problems = []
        try:
            recs = pool.each(dict(HELLO_JOB))
        except WorkerPoolError as e:
            raise WorkerStartError(str(e)) from None
        for gpu, rec in zip(self.gpus, recs):
            rec = rec.model_dump()
            why = hello_problem(gpu, rec)
            if why:
                problems.append(why)
            else:
                self.devices[gpu] = rec.get("device")
        if problems:
            raise WorkerStartError("; ".join(problems))
        return dict(self.devices)

    def usage(self) -> dict:
        return {"kind": self.kind, "gpus": self.gpus, "compile_workers": self.compile_workers, "busy": self.busy,
                "jobs": dict(self.jobs), "gpu_s": self.gpu_s,
                "restarts": (self._gpool.stats.get("restarts", 0) if self._gpool else 0)}

    def close(self) -> None:
        for p in (self._cpool, self._gpool):
            if p is not None:
                try:
                    p.close()
                except Exception:  # noqa: BLE001
                    pass
        self._cpool = self._gpool = None


class EvalActor:
    """A Ray actor body (wrapped with ray.remote by RayBackend): runs one job function per call."""

    def __init__(self, kind: str):
        self.kind = kind
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    def run(self, fn_path: str, job: dict) -> dict:
        import importlib
        mod, _, attr = fn_path.partition(":")
        fn = getattr(importlib.import_module(mod), attr)
        try:
            rec = fn(job, None)
            rec = rec.model_dump() if hasattr(rec, "model_dump") else dict(rec)
        except BaseException as e:  # noqa: BLE001 - everything becomes a record
            import traceback
            rec = {"status": "error", "error_class": "internal_error",
                   "message": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)[-1500:]}"}
        rec.setdefault("worker_pid", os.getpid())
        return rec

    def where(self) -> dict:
        import ray
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


class RayBackend:
    kind = "ray"

    def __init__(self, address: str, gpus: list, compile_workers: int = 2, deadline_s: float = 300.0,
                 dry_run: bool = False):
        import ray
        if not ray.is_initialized():
            kw = {"ignore_reinit_error": True, "log_to_driver": False}
            if address == "local":      # start a local Ray runtime in this process
                ray.init(include_dashboard=False, **kw)
            else:                       # connect to a running cluster ("auto" or host:port)
                ray.init(address=address, **kw)
        self.ray = ray
        self.Actor = ray.remote(EvalActor)
        self.deadline_s = deadline_s
        self.compile_workers = max(1, int(compile_workers))
        self.cpu = [self._new("cpu") for _ in range(self.compile_workers)]
        self.gpus = list(gpus)
        self.gpu = [] if dry_run else [self._new("gpu") for _ in self.gpus]
        self.busy = 0
        self.jobs = collections.Counter()
        self.restarts = 0
        self.gpu_s = 0.0
        self.on_tick: Optional[Callable[[list], None]] = None
        self.devices: dict = {}

    def _new(self, kind: str):
        opts = {"num_cpus": 1} if kind == "cpu" else {"num_gpus": 1, "num_cpus": 1}
        return self.Actor.options(**opts).remote(kind)

    def _run(self, actors: list, kind: str, fn_path: str, jobs: list, on_result: OnResult, stop=None) -> None:
        ray = self.ray
        if not actors:
            raise RuntimeError(f"no {kind} actors (use --gpus, or --dry-run)")
        queue = collections.deque(enumerate(jobs))
        free = list(range(len(actors)))
        pending: dict = {}
        while queue or pending:
            if queue and stop is not None and stop():
                while queue:
                    idx, job = queue.popleft()
                    on_result(idx, {"status": "skipped", "error_class": "stopped", "candidate": job.get("name", "?"),
                                    "message": "not run: dispatching stopped (the run's time budget)"})
                continue
            if self.on_tick is not None:
                now = time.monotonic()
                self.on_tick([{"gpu": None if kind == "cpu" else "(ray)", "job": j.get("label") or j.get("name")
                               or j.get("baseline"), "stage": None,
                               "seconds": now - (d - float(j.get("deadline_s") or self.deadline_s))}
                              for _, (_, _, d, j) in pending.items()])
            while queue and free:
                slot = free.pop()
                idx, job = queue.popleft()
                ref = actors[slot].run.remote(fn_path, job)
                pending[ref] = (idx, slot, time.monotonic() + float(job.get("deadline_s") or self.deadline_s), job)
            self.busy = len(pending)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                idx, slot, _, job = pending.pop(ref)
                try:
                    rec = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - the actor died (fault) or the call failed
                    rec = {"status": "crash", "error_class": "worker_died", "stage": "test" if kind == "gpu" else "compile",
                           "message": f"ray actor failed: {type(e).__name__}: {str(e)[:500]}"}
                    actors[slot] = self._new(kind)
                    self.restarts += 1
                if rec.get("context_lost"):
                    ray.kill(actors[slot])
                    actors[slot] = self._new(kind)
                    self.restarts += 1
                rec["executor"] = f"ray:{kind}:{rec.get('worker_pid')}"
                self.jobs["ray"] += 1
                if kind == "gpu":
                    self.gpu_s += float(rec.get("wall_s") or 0.0)
                free.append(slot)
                on_result(idx, rec)
            now = time.monotonic()
            for ref, (idx, slot, deadline, job) in list(pending.items()):
                if now > deadline:
                    pending.pop(ref)
                    ray.kill(actors[slot])
                    actors[slot] = self._new(kind)
                    self.restarts += 1
                    free.append(slot)
                    on_result(idx, {"status": "timeout", "error_class": "hang" if kind == "gpu" else "compile_timeout",
                                    "stage": "test" if kind == "gpu" else "compile", "executor": f"ray:{kind}",
                                    "message": f"no result after {float(job.get('deadline_s') or self.deadline_s):g} s; "
                                               f"the actor was killed and replaced"})
        self.busy = 0

    def compile(self, jobs: list, on_result: OnResult, stop=None) -> None:
        if jobs:
            self._run(self.cpu, "cpu", COMPILE_JOB, jobs, on_result, stop)

    def evaluate(self, jobs: list, on_result: OnResult, stop=None) -> None:
        if jobs:
            self._run(self.gpu, "gpu", eval_job_fn(), jobs, on_result, stop)

    def check_gpus(self) -> dict:
        """Each GPU actor opens its device ({gpu: device name}), or WorkerStartError with the causes."""
        problems, devices = [], {}
        for gpu, actor in zip(self.gpus, self.gpu):
            try:
                rec = self.ray.get(actor.run.remote(eval_job_fn(), dict(HELLO_JOB)), timeout=HELLO_JOB["deadline_s"])
            except Exception as e:  # noqa: BLE001 - the actor could not be placed or died
                rec = {"status": "error", "error_class": "worker_died", "message": f"{type(e).__name__}: {e}"}
            why = hello_problem(gpu, rec)
            if why:
                problems.append(why)
            else:
                devices[gpu] = rec.get("device")
        if problems:
            raise WorkerStartError("; ".join(problems))
        self.devices = devices
        return devices

    def usage(self) -> dict:
        return {"kind": self.kind, "gpus": self.gpus, "compile_workers": self.compile_workers, "busy": self.busy,
                "jobs": dict(self.jobs), "restarts": self.restarts, "gpu_s": self.gpu_s}

    def close(self) -> None:
        for a in self.cpu + self.gpu:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        self.cpu, self.gpu = [], []


def make_backend(cfg) -> "LocalBackend | RayBackend":
    if cfg.ray_address:
        return RayBackend(cfg.ray_address, cfg.gpus, cfg.compile_workers, cfg.deadline_s, cfg.dry_run)
    return LocalBackend(cfg.gpus, cfg.compile_workers, cfg.deadline_s)


def local_gpu_count() -> int:
    try:
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001
        return 0


def gpu_list(spec: Optional[str]) -> list[int]:
    if spec is None or spec == "":
        return list(range(local_gpu_count()))
    return [int(x) for x in spec.split(",") if x.strip() != ""]
