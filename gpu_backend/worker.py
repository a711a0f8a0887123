"""Sandboxed evaluation workers: one long-lived subprocess per GPU, a watchdog, restart after faults.

    with WorkerPool(gpus=[0, 1]) as pool:
        records = pool.run([{"candidate": ir_json, "task": "gemm"}, ...])   # EvalRecords, input order

- Each worker is a `spawn`ed process with CUDA_VISIBLE_DEVICES set to its GPU, so it sees one device
  (ordinal 0). It receives jobs over a pipe, runs `job_fn(job, progress)` (default
  gpu_backend.evaluate.run_job) and sends back a record dict. It holds no reference outputs of its own
  beyond the job in hand, and nothing survives between jobs except caches (compiled cubins, L2 flush
  buffer).
- Watchdog: the parent gives each job a deadline (job["deadline_s"] or the pool's). A worker past it
  is killed (SIGKILL: the driver tears down its context and the kernel with it), the job is recorded as
  status "timeout" (error_class hang / too_slow / compile_timeout by the last stage the worker
  reported), and a fresh worker takes its place.
- Faults: a job whose record has `context_lost` (a sticky CUDA error: illegal address, misaligned
  access, trap, ...) makes the worker exit after replying; a worker that dies without replying
  (segfault, os._exit) is recorded as status "crash", error_class worker_died / worker_killed_<signal>.
  Either way the pool restarts it and serves the next job.
- Fan-out: jobs go to whichever worker is idle, so N GPUs run N candidates at a time.

`job_fn` is a picklable callable or a "module:function" string; tests pass doubles that sleep forever,
exit, or return, to check the pool on a machine without a GPU.
"""
from __future__ import annotations

import collections
import importlib
import multiprocessing as mp
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from .record import EvalRecord

DEFAULT_JOB = "gpu_backend.evaluate:run_job"
DEFAULT_HINT = "gpu_backend.evaluate:fault_hint"
_ENV_LOCK = threading.Lock()


def _resolve(fn: Union[str, Callable]) -> Callable:
    if callable(fn):
        return fn
    mod, _, attr = fn.partition(":")
    return getattr(importlib.import_module(mod), attr)


def visible_device(gpu: Optional[int]) -> Optional[str]:
    """The CUDA_VISIBLE_DEVICES entry for pool GPU `gpu`: the gpu-th entry of this process's own
    CUDA_VISIBLE_DEVICES when it is set (so a pool inside a restricted job stays inside it), else
    the ordinal itself."""
    if gpu is None:
        return None
    parent = [t.strip() for t in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if t.strip()]
    return parent[gpu] if 0 <= gpu < len(parent) else str(gpu)


def _status_kb(field_name: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def probe() -> dict:
    """What this process holds: host RSS (VmRSS / VmHWM), open file descriptors, the in-process
    compile cache, and (only when this process already has a CUDA context; none is created here)
    the device's used memory from cuMemGetInfo. Answered by a worker between jobs (WorkerPool.probe)."""
    import gc
    import sys
    out: dict = {"pid": os.getpid(), "rss_bytes": None, "hwm_bytes": None, "fds": None,
                 "gc_objects": len(gc.get_objects()), "compile_cache": None, "cuda_context": False,
                 "device_used_bytes": None, "device_total_bytes": None}
    rss, hwm = _status_kb("VmRSS"), _status_kb("VmHWM")
    out["rss_bytes"] = rss * 1024 if rss is not None else None
    out["hwm_bytes"] = hwm * 1024 if hwm is not None else None
    try:
        out["fds"] = len(os.listdir("/proc/self/fd"))
    except OSError:
        pass
    cand = sys.modules.get("gpu_backend.candidate")
    if cand is not None:
        out["compile_cache"] = len(getattr(cand, "_CACHE", {}))
    drv = sys.modules.get("gpu_backend.driver")
    if drv is not None and drv.context.cache_info().currsize > 0:   # a context exists: measure, don't create
        try:
            from cuda.bindings import driver
            drv.context(0)
            free, total = drv.check(driver.cuMemGetInfo(), "cuMemGetInfo")
            out.update(cuda_context=True, device_used_bytes=int(total) - int(free), device_total_bytes=int(total))
        except Exception as e:  # noqa: BLE001 - a probe never kills the worker
            out["device_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def _worker_main(visible: Optional[str], conn, job_fn) -> None:
    """Worker process: serve jobs until told to stop; exit after a sticky CUDA error."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    fn = _resolve(job_fn)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        if msg[0] == "probe":   # memory / cache figures of this process (long-run leak checks)
            conn.send(("probe", msg[1], probe()))
            continue
        _, jid, job = msg

        def progress(stage: str, **info):
            try:
                conn.send(("progress", jid, stage, info))
            except Exception:  # noqa: BLE001 - progress is best effort
                pass

        try:
            rec = fn(job, progress)
            if hasattr(rec, "model_dump"):
                rec = rec.model_dump()
            rec = dict(rec)
        except BaseException as e:  # noqa: BLE001 - everything becomes a record
            from .errors import classify
            cls, sticky = classify(e) if hasattr(e, "code") else ("internal_error", False)
            rec = {"status": "crash" if sticky else "error", "error_class": cls, "context_lost": sticky,
                   "message": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)[-1500:]}"}
        fatal = bool(rec.get("context_lost"))
        try:
            conn.send(("result", jid, rec))
        except Exception:  # noqa: BLE001 - unpicklable record: send what we can
            conn.send(("result", jid, {"status": "error", "error_class": "internal_error",
                                       "message": "job returned an unpicklable record", "context_lost": fatal}))
        if fatal:
            conn.close()
            os._exit(3)  # the CUDA context is unusable; the parent restarts this worker


@dataclass
class _Worker:
    gpu: Optional[int]
    proc: Any
    conn: Any
    spawned_at: float
    state: str = "starting"          # starting | idle | busy | dead
    pid: Optional[int] = None
    job_index: Optional[int] = None
    job: Optional[dict] = None
    dispatched_at: float = 0.0
    deadline: float = 0.0
    stage: Optional[str] = None
    progress: list = field(default_factory=list)


class WorkerPoolError(RuntimeError):
    pass


class WorkerPool:
    """One worker process per GPU id in `gpus` (None: no CUDA_VISIBLE_DEVICES change).
    Not thread-safe: drive it from one thread."""

    def __init__(self, gpus: Iterable[Optional[int]] = (0,), job_fn: Union[str, Callable, None] = None,
                 deadline_s: float = 300.0, start_timeout_s: float = 120.0, max_start_failures: int = 3,
                 hint_fn: Union[str, Callable, None] = None):
        """`hint_fn(job) -> (node, message) | None` annotates records the parent makes (timeouts,
        dead workers); with the default job function it is gpu_backend.evaluate.fault_hint."""
        self.ctx = mp.get_context("spawn")
        self.job_fn = job_fn if job_fn is not None else DEFAULT_JOB
        self.hint_fn = hint_fn if hint_fn is not None else (DEFAULT_HINT if job_fn is None else None)
        self.deadline_s, self.start_timeout_s = float(deadline_s), float(start_timeout_s)
        self.max_start_failures = max_start_failures
        self.stats = collections.Counter()
        self._start_failures = collections.Counter()
        self.workers: list[_Worker] = [self._spawn(g) for g in gpus]
        if not self.workers:
            raise ValueError("a WorkerPool needs at least one GPU id")
        self._seq = 0

    # ------------------------------------------------------------------ process management
    def _spawn(self, gpu: Optional[int]) -> _Worker:
        parent, child = self.ctx.Pipe()
        with _ENV_LOCK:  # the child also sets it itself; this covers imports before _worker_main runs
            old = os.environ.get("CUDA_VISIBLE_DEVICES")
            visible = visible_device(gpu)
            if visible is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
            try:
                p = self.ctx.Process(target=_worker_main, args=(visible, child, self.job_fn), daemon=True,
                                     name=f"cake-eval-gpu{gpu}")
                p.start()
            finally:
                if gpu is not None:
                    if old is None:
                        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                    else:
                        os.environ["CUDA_VISIBLE_DEVICES"] = old
        child.close()
        self.stats["spawned"] += 1
        return _Worker(gpu, p, parent, time.monotonic())

    def _kill(self, w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(10)
        try:
            w.conn.close()
        except Exception:  # noqa: BLE001
            pass
        w.state = "dead"

    def _replace(self, w: _Worker) -> _Worker:
        self._kill(w)
        self.stats["restarts"] += 1
        nw = self._spawn(w.gpu)
        self.workers[self.workers.index(w)] = nw
        return nw

    # ------------------------------------------------------------------ records made by the parent
    def _parent_record(self, w: _Worker, status: str, error_class: str, message: str) -> EvalRecord:
        job = w.job or {}
        stage = w.stage if w.stage in ("compile", "test", "profile") else "test"
        rec = EvalRecord(job_id=job.get("job_id"), candidate=str(job.get("name") or "?"),
                         task=str(job.get("task") or "?"), gpu=w.gpu, stage=stage, status=status,
                         error_class=error_class, message=message, seed=job.get("seed"), worker_pid=w.pid,
                         context_lost=status == "crash", wall_s=time.monotonic() - w.dispatched_at)
        if self.hint_fn is not None:
            try:
                hint = _resolve(self.hint_fn)(job)
            except Exception:  # noqa: BLE001 - a hint only
                hint = None
            if hint:
                rec.node = hint[0]
                rec.message += f"; the verifier (skipped for this run) reports {hint[1]}"
        return rec

    def _finish(self, w: _Worker, rec: Union[dict, EvalRecord]) -> tuple[int, EvalRecord]:
        if not isinstance(rec, EvalRecord):
            try:
                rec = EvalRecord.model_validate(rec)
            except Exception as e:  # noqa: BLE001
                rec = EvalRecord(status="error", error_class="internal_error",
                                 message=f"malformed record from the worker: {e}"[:1000])
        job = w.job or {}
        rec.job_id = rec.job_id or job.get("job_id")
        rec.gpu = w.gpu
        rec.worker_pid = rec.worker_pid or w.pid
        if rec.seed is None:
            rec.seed = job.get("seed")
        if rec.candidate == "?" and job.get("name"):
            rec.candidate = str(job["name"])
        if rec.task == "?" and job.get("task"):
            rec.task = str(job["task"])
        self.stats[rec.status] += 1
        idx = w.job_index
        w.job, w.job_index, w.stage, w.state = None, None, None, "idle"
        return idx, rec

    # ------------------------------------------------------------------ scheduling
    def _dispatch(self, w: _Worker, idx: int, job: dict) -> None:
        job = dict(job)
        if "seed" not in job or job["seed"] is None:
            from .evaluate import new_seed
            job["seed"] = new_seed()
        self._seq += 1
        job.setdefault("job_id", f"job{self._seq}")
        w.job, w.job_index, w.stage, w.progress = job, idx, None, []
        w.dispatched_at = time.monotonic()
        w.deadline = w.dispatched_at + float(job.get("deadline_s") or self.deadline_s)
        w.state = "busy"
        w.conn.send(("job", job["job_id"], job))

    def _drain(self, w: _Worker) -> Iterator[tuple[int, EvalRecord]]:
        """Read every pending message of one worker."""
        while w.state != "dead":
            try:
                if not w.conn.poll():
                    return
                msg = w.conn.recv()
            except (EOFError, OSError):
                return
            kind = msg[0]
            if kind == "ready":
                w.pid, w.state = msg[1], "idle"
                self._start_failures[w.gpu] = 0
            elif kind == "progress" and w.state == "busy":
                w.stage = msg[2]
                w.progress.append((time.monotonic() - w.dispatched_at, msg[2], msg[3]))
            elif kind == "result" and w.state == "busy":
                rec = msg[2]
                lost = bool(rec.get("context_lost")) if isinstance(rec, dict) else False
                out = self._finish(w, rec)
                if lost:
                    w.state = "dead"   # it exits by itself; replaced below
                yield out

    def run_iter(self, jobs: Iterable[dict], on_tick: Optional[Callable[[], None]] = None,
                 stop: Optional[Callable[[], bool]] = None) -> Iterator[tuple[int, EvalRecord]]:
        """Yield (index, record) as jobs finish, fanning out over the workers. `on_tick()` is called
        about once a second while jobs run (progress display); once `stop()` is true no further job is
        dispatched and each one not started is yielded as status "skipped"."""
        pending = collections.deque(enumerate(jobs))
        while True:
            for w in list(self.workers):
                if w.state == "dead":
                    self._replace(w)
            if pending and stop is not None and stop():
                while pending:
                    idx, job = pending.popleft()
                    yield idx, EvalRecord(candidate=str(job.get("name") or "?"), task=str(job.get("task") or "?"),
                                          status="skipped", error_class="stopped",
                                          message="not run: dispatching stopped (the run's time budget)")
            busy = [w for w in self.workers if w.state == "busy"]
            if not pending and not busy:
                return
            if on_tick is not None:
                on_tick()
            for wi, w in enumerate(self.workers):
                if w.state == "idle" and pending:
                    nxt = next((p for p in pending if p[1].get("_worker", wi) == wi), None)
                    if nxt is None:
                        continue
                    pending.remove(nxt)
                    idx, job = nxt
                    try:
                        self._dispatch(w, idx, job)
                    except (BrokenPipeError, OSError):
                        pending.appendleft((idx, job))
                        w.state = "dead"
            now = time.monotonic()
            limits = [w.deadline for w in self.workers if w.state == "busy"]
            limits += [w.spawned_at + self.start_timeout_s for w in self.workers if w.state == "starting"]
            timeout = max(0.0, min(limits) - now) if limits else 0.5
            objs = [w.conn for w in self.workers if w.state != "dead"]
            objs += [w.proc.sentinel for w in self.workers if w.state != "dead"]
            wait(objs, timeout=min(timeout, 1.0))
            now = time.monotonic()
            for w in list(self.workers):
                yield from self._drain(w)
                if w.state == "dead":
                    continue
                if not w.proc.is_alive():
                    yield from self._drain(w)
                    if w.state == "busy":
                        code = w.proc.exitcode
                        from .errors import signal_class
                        self.stats["died"] += 1
                        yield self._finish(w, self._parent_record(
                            w, "crash", signal_class(code),
                            f"the worker (pid {w.pid}) exited with code {code} during {w.stage or 'the job'} "
                            f"without reporting; restarted"))
                    elif w.state == "starting":
                        self._start_failed(w, f"exited with code {w.proc.exitcode} while starting")
                    w.state = "dead"
                elif w.state == "busy" and now > w.deadline:
                    limit = float((w.job or {}).get("deadline_s") or self.deadline_s)
                    cls = {"compile": "compile_timeout", "profile": "too_slow"}.get(w.stage or "", "hang")
                    self.stats["timeouts"] += 1
                    rec = self._parent_record(
                        w, "timeout", cls,
                        f"killed by the watchdog after {limit:g} s during {w.stage or 'the job'} "
                        f"({'no launch finished: a deadlock, or a kernel slower than the deadline' if cls == 'hang' else 'over the deadline; a task with large shapes may need a longer one: agent.run --deadline'}); "
                        f"worker restarted")
                    self._kill(w)
                    yield self._finish(w, rec)
                    w.state = "dead"
                elif w.state == "starting" and now > w.spawned_at + self.start_timeout_s:
                    self._start_failed(w, f"not ready after {self.start_timeout_s:g} s")
                    self._kill(w)

    def _start_failed(self, w: _Worker, why: str) -> None:
        self._start_failures[w.gpu] += 1
        if self._start_failures[w.gpu] > self.max_start_failures:
            raise WorkerPoolError(f"the worker for GPU {w.gpu} failed to start {self._start_failures[w.gpu]} "
                                  f"times: {why}")

    def run(self, jobs: Iterable[dict]) -> list[EvalRecord]:
        """Run every job; records in input order."""
        jobs = list(jobs)
        out: list[Optional[EvalRecord]] = [None] * len(jobs)
        for idx, rec in self.run_iter(jobs):
            out[idx] = rec
        return out  # type: ignore[return-value]

    def evaluate(self, job: dict) -> EvalRecord:
        return self.run([job])[0]

    def each(self, job: dict) -> list[EvalRecord]:
        """One copy of `job` on every worker (in parallel), records in worker order: e.g. a start-up
        check that each worker reaches its GPU."""
        return self.run([dict(job, _worker=i) for i in range(len(self.workers))])

    def probe(self, timeout: float = 30.0) -> list[Optional[dict]]:
        """Ask every idle worker for `probe()` (host RSS, device memory, caches); None for a worker
        that is not idle or does not answer in time. Call it between runs, not during one."""
        self.wait_ready(timeout)
        out: list[Optional[dict]] = []
        for w in self.workers:
            if w.state != "idle":
                out.append(None)
                continue
            self._seq += 1
            tag = f"probe{self._seq}"
            try:
                w.conn.send(("probe", tag))
                end = time.monotonic() + timeout
                ans = None
                while ans is None and time.monotonic() < end and w.conn.poll(max(0.0, end - time.monotonic())):
                    msg = w.conn.recv()
                    if msg[0] == "probe" and msg[1] == tag:
                        ans = dict(msg[2], gpu=w.gpu)
            except (EOFError, OSError):
                ans = None
                w.state = "dead"
            out.append(ans)
        return out

    def activity(self) -> list[dict]:
        """What each busy worker is doing: GPU, job name, last reported stage, seconds since dispatch."""
        now = time.monotonic()
        return [{"gpu": w.gpu, "job": next((w.job[k] for k in ("label", "name", "baseline") if (w.job or {}).get(k)), None),
                 "stage": w.stage, "seconds": now - w.dispatched_at} for w in self.workers if w.state == "busy"]

    def pids(self) -> list[Optional[int]]:
        return [w.pid for w in self.workers]

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Block until every worker has started (optional; jobs wait for it anyway)."""
        end = time.monotonic() + (timeout if timeout is not None else self.start_timeout_s)
        while any(w.state == "starting" for w in self.workers):
            left = end - time.monotonic()
            if left <= 0:
                raise WorkerPoolError("workers did not start in time")
            wait([w.conn for w in self.workers if w.state == "starting"], timeout=min(left, 0.5))
            for w in self.workers:
                list(self._drain(w))
                if w.state == "starting" and not w.proc.is_alive():
                    self._start_failed(w, f"exited with code {w.proc.exitcode} while starting")
                    self._replace(w)

    def close(self) -> None:
        for w in self.workers:
            if w.state != "dead" and w.proc.is_alive():
                try:
                    w.conn.send(("stop",))
                except Exception:  # noqa: BLE001
                    pass
        for w in self.workers:
            w.proc.join(5)
            self._kill(w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
