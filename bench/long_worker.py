"""Long-run check of one evaluation worker: >= 1000 candidates in a row, memory sampled as it goes.

    python bench/long_worker.py                 # on a GPU: 1000 candidates, ~3-4 min on an H200
    python bench/long_worker.py --quick         # 200 candidates, no hang case
    python bench/long_worker.py --self-test     # no GPU: the same plumbing with CPU job doubles

Phases (one gpu_backend.worker.WorkerPool with one worker on GPU 0):
1. flat: --n jobs back to back, cycling (shuffled, seeded) through the seed programs of gemm and
   softmax, verified tactic variants of them (tactics/), and fault-corpus kernels that fail without
   killing the CUDA context (wrong_result, nan, unwritten_output, input_modified, cache_cheat,
   interface) plus verifier-rejected variants (compile fail). Small shapes, few timing reps. Every
   --sample-every jobs the worker answers a probe (gpu_backend.worker.probe): device memory in use
   (cuMemGetInfo, from inside the worker), host RSS (VmRSS), open fds, gc objects, compile-cache
   entries. Verdict: after warm-up (every distinct program seen once, and at least --n/5 jobs) the
   least-squares slope of device and host memory must stay below --threshold-mib per 100 candidates
   (default 1 MiB), with no worker restart in the phase (a restart would reset the numbers).
2. faults: kernels that kill the context (illegal address, misaligned, trap; and a hang unless
   --quick), each followed by a good candidate: each must come back as crash/timeout and the next
   one ok on a fresh worker.
3. kill: the worker is SIGKILLed from outside in the middle of a long timing job; that job must come
   back as crash/worker_killed_sigkill and the next one ok on the restarted worker.

Every distinct program is compiled once up front (NVRTC, parallel, into CAKE_CACHE_DIR) so the
worker's first pass only loads cubins. Writes JSON (GPU, versions, command, samples, phases, verdict)
to --out (default $OUT or bench/results, file long-worker-<gpu>.json) and prints a short table.
Exit 0 when every check passes.

--self-test runs the phases with CPU job doubles (selftest_job below: statuses follow each job's
expected result, nothing is measured) and also a run whose double leaks host memory on purpose, which
the verdict must call growing; it checks the probe, sampling, slope and phase plumbing without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import signal
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

MIB = 1 << 20
SOFTMAX_SHAPES = [{"M": 7}, {"M": 130}]
SOFTMAX_BENCH = [{"M": 1024}]
GEMM_SHAPES = [{"M": 128, "N": 256, "K": 128}, {"M": 256, "N": 512, "K": 192}]
GEMM_BENCH = [{"M": 512, "N": 512, "K": 512}]
# fault-corpus cases that fail without losing the CUDA context (the worker keeps serving)
SOFT_CASES = ("wrong_constant.json", "no_max_subtraction.json", "half_rows.json", "writes_input.json",
              "first_launch_only.cu", "address_cache.cu", "gemm_wgmma_sm90a.json")
HARD_CASES = ("oob_write.json", "misaligned_store.json", "trap.cu")
HANG_CASE = "mbarrier_hang.json"


# ------------------------------------------------------------------------------ programs
def _shapes(task: str) -> dict:
    if task == "gemm":
        return {"shapes": GEMM_SHAPES, "bench_shapes": GEMM_BENCH}
    return {"shapes": SOFTMAX_SHAPES, "bench_shapes": SOFTMAX_BENCH}


def _facts_ok(kernel, task: str) -> bool:
    """Whether every small shape satisfies the kernel's declared scalar facts (else it would be an
    unsupported_shape failure, not the correct candidate it is)."""
    from cake_ir.nodes import ScalarParam
    from gpu_backend.runner import ScalarDecl
    from tasks.base import get_task
    t = get_task(task)
    sh = _shapes(task)
    for shape in sh["shapes"] + sh["bench_shapes"]:
        scal = t.scalars(shape)
        for p in kernel.params:
            if isinstance(p, ScalarParam):
                if ScalarDecl(p.dtype, p.min, p.max, p.divisible_by).violation(scal.get(p.name)):
                    return False
    return True


def build_programs(per_seed: int = 8) -> list[dict]:
    """Distinct programs with the result each must give: {"name", "task", "candidate", "verify",
    "expect": (status, error_classes), "seed"?}."""
    from cake_ir.io import dumps, ir_hash, load
    from cake_ir.verifier import verify
    from tactics.base import load_tactics
    from tasks.registry import get

    progs, seen = [], set()
    tactics = [t for t in load_tactics() if t.kind != "repair"]
    n_rejected = 0
    for task in ("softmax", "gemm"):
        for g in get(task).seed_genomes():
            k, _ = load(g["ir"])
            seen.add(ir_hash(k))
            progs.append({"name": g["name"], "task": task, "candidate": dumps(k), "verify": True,
                          "expect": ("ok", [None]), "kind": "seed"})
            kept = 0
            for tac in tactics:
                if kept >= per_seed or tac.applicable(g):
                    continue
                for params in tac.choices(g)[:3]:
                    try:
                        k2, _ = load(tac.apply(g, params)["ir"])
                    except Exception:  # noqa: BLE001 - a tactic that does not apply here
                        continue
                    if k2 is None or ir_hash(k2) in seen:
                        continue
                    errs = [d for d in verify(k2).diagnostics if d.severity == "error"]
                    name = f"{g['name']}+{tac.name}" + "".join(f"-{v}" for v in params.values())
                    if errs:
                        if n_rejected < 2:   # a couple of verifier-rejected ones: the compile-fail path
                            seen.add(ir_hash(k2))
                            n_rejected += 1
                            progs.append({"name": name, "task": task, "candidate": dumps(k2), "verify": True,
                                          "expect": ("fail", ["compile_error"]), "kind": "rejected"})
                        continue
                    if kept >= per_seed or not _facts_ok(k2, task):
                        continue
                    seen.add(ir_hash(k2))
                    kept += 1
                    progs.append({"name": name, "task": task, "candidate": dumps(k2), "verify": True,
                                  "expect": ("ok", [None]), "kind": "variant"})
    for case in corpus_cases(SOFT_CASES):
        progs.append(case)
    return progs


def corpus_cases(files) -> list[dict]:
    from test_fault_corpus import CASES, case_job
    out = []
    for case in CASES:
        fn = case["file"].rsplit("/", 1)[-1]
        if fn in files:
            job = case_job(case)
            cls = case["error_class"] if isinstance(case["error_class"], list) else [case["error_class"]]
            out.append({"name": "corpus:" + fn, "task": case["task"], "candidate": job["candidate"],
                        "verify": job["verify"], "expect": (case["status"], cls), "kind": "corpus",
                        "seed": job.get("seed"), "deadline_s": job.get("deadline_s")})
    return out


def job_of(p: dict, **extra) -> dict:
    job = {"candidate": p["candidate"], "task": p["task"], "verify": p["verify"], "name": p["name"],
           "warmup": 1, "reps": 5, "reruns": 1, "expect": list(p["expect"])}
    if p["kind"] != "corpus":   # corpus cases keep the task's shapes: their expected classes depend on them
        job.update(_shapes(p["task"]))
    if p.get("seed") is not None:
        job["seed"] = p["seed"]
    if p.get("deadline_s"):
        job["deadline_s"] = p["deadline_s"]
    job.update(extra)
    return job


def matches(rec, expect) -> bool:
    status, classes = expect
    return rec.status == status and rec.error_class in classes


def _compile_one(args):
    cand, arch, verify = args
    from gpu_backend.candidate import compile_candidate
    t0 = time.perf_counter()
    c = compile_candidate(cand, arch, verify)
    return c.ok, time.perf_counter() - t0


def precompile(progs: list[dict], arch: str, workers: int) -> float:
    """NVRTC every distinct program once into the on-disk cubin cache, in parallel."""
    import concurrent.futures as cf
    import multiprocessing as mp
    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_one, [(p["candidate"], arch, p["verify"]) for p in progs]))
    return time.time() - t0


# ------------------------------------------------------------------------------ the job function
def selftest_job(job: dict, progress=None) -> dict:
    """CPU double for --self-test (imported by the spawned worker): the status is the job's expected
    one, nothing is evaluated or measured. LONG_WORKER_LEAK_KB makes it keep that much per job."""
    if progress:
        progress("test")
    kb = int(os.environ.get("LONG_WORKER_LEAK_KB", "0"))
    if kb:
        _LEAK.append(bytearray(os.urandom(16)) * (kb * 64))   # touched pages, so RSS grows
    if job.get("sleep"):
        time.sleep(float(job["sleep"]))
    status, classes = job.get("expect") or ("ok", [None])
    rec = {"status": status, "error_class": classes[0], "stage": "test", "candidate": job.get("name", "?"),
           "task": job.get("task", "?"), "message": "self-test double (not an evaluation)"}
    if status == "crash":
        rec["context_lost"] = True
    if status == "timeout":         # a hang: never returns, the watchdog kills the worker
        progress and progress("test")
        time.sleep(10**6)
    return rec


_LEAK: list = []


# ------------------------------------------------------------------------------ analysis
def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def analyse(samples: list[dict], warmup_jobs: int, threshold_mib: float, need_device: bool = True) -> dict:
    out: dict = {"warmup_jobs": warmup_jobs, "threshold_bytes_per_100": threshold_mib * MIB}
    post = [s for s in samples if s["jobs"] >= warmup_jobs]
    pids = {s["pid"] for s in post}
    out["restarts_in_window"] = len(pids) - 1 if pids else 0
    flat = True
    for key in ("device_used_bytes", "rss_bytes", "fds", "gc_objects", "compile_cache"):
        vals = [s[key] for s in samples if s.get(key) is not None]
        pv = [(s["jobs"], s[key]) for s in post if s.get(key) is not None]
        if not vals:
            out[key] = None
            continue
        sl = slope([p[0] for p in pv], [p[1] for p in pv]) if len(pv) >= 2 else None
        out[key] = {"first": vals[0], "last": vals[-1], "max": max(vals), "min": min(vals),
                    "after_warmup_first": pv[0][1] if pv else None, "after_warmup_last": pv[-1][1] if pv else None,
                    "slope_per_candidate": sl, "per_100": sl * 100 if sl is not None else None}
        if key in ("device_used_bytes", "rss_bytes"):
            if sl is None:
                flat = False
            elif sl * 100 >= threshold_mib * MIB:
                flat = False
    if out.get("rss_bytes") is None or len(post) < 3 or out["restarts_in_window"] or \
            (need_device and out.get("device_used_bytes") is None):
        flat = False
    out["verdict"] = "flat" if flat else "growing (or not enough clean samples)"
    out["flat"] = flat
    return out


# ------------------------------------------------------------------------------ phases
def phase_flat(pool, progs: list[dict], n: int, every: int, seed: int, log) -> tuple[list, list, dict]:
    rng = random.Random(seed)
    seq: list[dict] = []
    while len(seq) < n:
        cyc = list(progs)
        rng.shuffle(cyc)
        seq += cyc
    seq = seq[:n]
    samples, mism = [], []
    counts: dict = {}
    t0 = time.time()
    restarts0 = pool.stats.get("restarts", 0)

    def sample(done: int) -> None:
        pr = pool.probe()[0] or {}
        samples.append({"jobs": done, "t": round(time.time() - t0, 2), "pid": pr.get("pid"),
                        "restarts": pool.stats.get("restarts", 0) - restarts0,
                        **{k: pr.get(k) for k in ("device_used_bytes", "device_total_bytes", "rss_bytes",
                                                  "hwm_bytes", "fds", "gc_objects", "compile_cache",
                                                  "cuda_context")}})
        s = samples[-1]
        log(f"  {done:5d} jobs {s['t']:7.1f} s  pid {s['pid']}  dev {_mib(s['device_used_bytes'])}  "
            f"rss {_mib(s['rss_bytes'])}  fds {s['fds']}  cache {s['compile_cache']}")

    sample(0)
    for i in range(0, n, every):
        chunk = seq[i:i + every]
        recs = pool.run([job_of(p) for p in chunk])
        for p, r in zip(chunk, recs):
            key = f"{r.status}:{r.error_class}" if r.error_class else r.status
            counts[key] = counts.get(key, 0) + 1
            if not matches(r, p["expect"]):
                mism.append({"name": p["name"], "expect": p["expect"], "status": r.status,
                             "error_class": r.error_class, "message": (r.message or "")[:300]})
        sample(i + len(chunk))
    return samples, mism, {"counts": counts, "seconds": time.time() - t0}


def phase_faults(pool, progs_good: dict, cases: list[dict], log) -> dict:
    jobs, expect = [], []
    for c in cases:
        good = progs_good[c["task"]]
        jobs += [job_of(c, profile=False), job_of(good)]
        expect += [c["expect"], good["expect"]]
    pids0 = pool.pids()
    r0 = pool.stats.get("restarts", 0)
    t0 = time.time()
    recs = pool.run(jobs)
    rows, ok = [], True
    for i in range(0, len(recs), 2):
        fault, after = recs[i], recs[i + 1]
        good = matches(fault, expect[i]) and after.ok and after.worker_pid != fault.worker_pid
        ok &= good
        rows.append({"case": fault.candidate, "status": fault.status, "error_class": fault.error_class,
                     "expect": expect[i], "next": after.status, "fresh_worker": after.worker_pid != fault.worker_pid,
                     "ok": good})
        log(f"  {fault.candidate:34s} {fault.status:8s} {str(fault.error_class):22s} next {after.status}"
            f"{' (fresh worker)' if after.worker_pid != fault.worker_pid else ''}  {'ok' if good else 'UNEXPECTED'}")
    probe = pool.probe()[0]
    return {"ok": ok, "rows": rows, "restarts": pool.stats.get("restarts", 0) - r0, "first_pids": pids0,
            "seconds": time.time() - t0, "probe_after": probe}


def phase_kill(pool, long_job: dict, good: dict, delay: float, log) -> dict:
    pool.wait_ready()
    victim = pool.pids()[0]
    timer = threading.Timer(delay, lambda: os.kill(victim, signal.SIGKILL))
    t0 = time.time()
    timer.start()
    try:
        recs = pool.run([long_job, job_of(good)])
    finally:
        timer.cancel()
    k, after = recs
    ok = (k.status, k.error_class) == ("crash", "worker_killed_sigkill") and after.ok and \
        after.worker_pid not in (None, victim)
    log(f"  killed pid {victim} after {delay:g} s: {k.status}/{k.error_class} during {k.stage}; next {after.status} "
        f"on pid {after.worker_pid}  {'ok' if ok else 'UNEXPECTED'}")
    return {"ok": ok, "victim_pid": victim, "killed": {"status": k.status, "error_class": k.error_class,
                                                      "stage": k.stage, "message": (k.message or "")[:300]},
            "next": {"status": after.status, "pid": after.worker_pid}, "seconds": time.time() - t0,
            "probe_after": pool.probe()[0]}


def _mib(v) -> str:
    return "-" if v is None else f"{v / MIB:9.1f} MiB"


# ------------------------------------------------------------------------------ main
def run(args, log=print) -> dict:
    from gpu_backend.worker import WorkerPool
    t_all = time.time()
    progs = build_programs()
    log(f"[{len(progs)} distinct programs: " + ", ".join(
        f"{k} {sum(p['kind'] == k for p in progs)}" for k in ("seed", "variant", "rejected", "corpus")) + "]")
    job_fn = "long_worker:selftest_job" if args.self_test else "gpu_backend.evaluate:run_job"
    gpu, versions, props = "cpu-self-test", {"python": platform.python_version()}, None
    pre_s = 0.0
    if not args.self_test:
        import cuda.bindings
        import numpy
        versions.update(cuda_bindings=cuda.bindings.__version__, numpy=numpy.__version__)
        pre_s = precompile(progs, args.arch, args.compile_workers)
        log(f"[compiled every distinct program once in {pre_s:.1f} s]")
    result: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]),
                    "n": args.n, "sample_every": args.sample_every, "self_test": args.self_test,
                    "job_fn": job_fn, "precompile_s": pre_s, "programs": [
                        {"name": p["name"], "task": p["task"], "kind": p["kind"], "expect": p["expect"]} for p in progs]}
    env_old = os.environ.get("LONG_WORKER_LEAK_KB")
    if args.leak_kb:
        os.environ["LONG_WORKER_LEAK_KB"] = str(args.leak_kb)
    try:
        with WorkerPool(gpus=[0], job_fn=job_fn, deadline_s=args.deadline) as pool:
            pool.wait_ready()
            log(f"[phase 1: {args.n} candidates through one worker, probe every {args.sample_every}]")
            samples, mism, info = phase_flat(pool, progs, args.n, args.sample_every, args.seed, log)
            warm = max(len(progs), args.n // 5)
            warm = int(math.ceil(warm / args.sample_every) * args.sample_every)
            result["flat"] = {"samples": samples, "mismatches": mism, **info,
                              "analysis": analyse(samples, warm, args.threshold_mib, need_device=not args.self_test)}
            if not args.self_test:
                from gpu_backend.driver import properties
                props = properties(0)   # after phase 1: this process's own context is no noise there
                gpu = props["name"]
                versions["driver"] = props.get("driver")
            if not args.skip_faults:
                log("[phase 2: faults that kill the context, each followed by a good candidate]")
                good = {p["task"]: p for p in progs if p["kind"] == "seed"}
                cases = corpus_cases(HARD_CASES + (() if args.quick else (HANG_CASE,)))
                for c in cases:
                    if c["name"].endswith(HANG_CASE):
                        c["deadline_s"] = 3 if args.self_test else 20
                result["faults"] = phase_faults(pool, good, cases, log)
                log("[phase 3: SIGKILL the worker in the middle of a long timing job]")
                sm = next(p for p in progs if p["kind"] == "seed" and p["task"] == "softmax")
                long_job = job_of(sm, name="long-timing", bench_shapes=[{"M": 16384}], reps=20000, deadline_s=600)
                if args.self_test:
                    long_job["sleep"] = 60
                result["kill"] = phase_kill(pool, long_job, sm, args.kill_after, log)
            result["pool_stats"] = dict(pool.stats)
    finally:
        if args.leak_kb:
            if env_old is None:
                os.environ.pop("LONG_WORKER_LEAK_KB", None)
            else:
                os.environ["LONG_WORKER_LEAK_KB"] = env_old
    result.update(gpu=gpu, device=props, versions=versions, seconds=time.time() - t_all)
    a = result["flat"]["analysis"]
    result["ok"] = bool(a["flat"] and not result["flat"]["mismatches"]
                        and result.get("faults", {"ok": True})["ok"] and result.get("kill", {"ok": True})["ok"])
    return result


def table(result: dict) -> str:
    a = result["flat"]["analysis"]
    lines = [f"\nlong worker run on {result['gpu']}: {result['n']} candidates in "
             f"{result['flat']['seconds']:.0f} s, warm-up {a['warmup_jobs']} jobs, restarts after warm-up "
             f"{a['restarts_in_window']}",
             f"{'metric':18s} {'first':>12s} {'after warm-up':>14s} {'last':>12s} {'max':>12s} {'slope/100 cand':>15s}"]
    for key, unit in (("device_used_bytes", "MiB"), ("rss_bytes", "MiB"), ("fds", ""), ("gc_objects", ""),
                      ("compile_cache", "")):
        m = a.get(key)
        if not m:
            lines.append(f"{key:18s} {'n/a':>12s}")
            continue
        f = (lambda v: "-" if v is None else f"{v / MIB:.2f}") if unit else (lambda v: "-" if v is None else f"{v:.0f}")
        lines.append(f"{key:18s} {f(m['first']):>12s} {f(m['after_warmup_first']):>14s} {f(m['last']):>12s} "
                     f"{f(m['max']):>12s} {f(m['per_100']):>15s}" + (f" {unit}" if unit else ""))
    lines.append(f"verdict: {a['verdict']} (threshold {a['threshold_bytes_per_100'] / MIB:g} MiB per 100 "
                 f"candidates after warm-up, device and host)")
    lines.append(f"results: {result['flat']['counts']}; unexpected {len(result['flat']['mismatches'])}")
    if "faults" in result:
        lines.append(f"faults: {'ok' if result['faults']['ok'] else 'FAILED'} ({result['faults']['restarts']} restarts)")
    if "kill" in result:
        k = result["kill"]
        lines.append(f"kill mid-job: {'ok' if k['ok'] else 'FAILED'} ({k['killed']['status']}/"
                     f"{k['killed']['error_class']}, next {k['next']['status']})")
    lines.append("OK" if result["ok"] else "NOT OK")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="candidates in phase 1 (default 1000)")
    ap.add_argument("--quick", action="store_true", help="200 candidates, no hang case")
    ap.add_argument("--sample-every", type=int, default=50)
    ap.add_argument("--threshold-mib", type=float, default=1.0, help="flat: growth below this per 100 candidates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--kill-after", type=float, default=2.0, help="seconds into the long job when the worker is killed")
    ap.add_argument("--arch", default="sm_90a", help="arch to precompile for (the device's)")
    ap.add_argument("--compile-workers", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    ap.add_argument("--skip-faults", action="store_true", help="phase 1 only")
    ap.add_argument("--out", help="JSON file (default: $OUT or bench/results, long-worker-<gpu>.json)")
    ap.add_argument("--self-test", action="store_true", help="no GPU: CPU job doubles; also checks a leaking double is flagged")
    ap.add_argument("--leak-kb", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def _write(result: dict, out: str | None) -> str:
    if out is None:
        d = os.environ.get("OUT") or os.path.join(ROOT, "bench", "results")
        name = "long-worker-" + result["gpu"].lower().replace("nvidia ", "").replace(" ", "-") + ".json"
        out = os.path.join(d, name)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return out


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.n = min(args.n, 200)
    if args.self_test:
        args.n = min(args.n, 300)
        args.deadline = min(args.deadline, 30.0)
        args.kill_after = min(args.kill_after, 1.0)
        res = run(args)
        print(table(res))
        # the verdict must be able to say "growing": the same run with a double that leaks 64 KiB a job
        leak = argparse.Namespace(**{**vars(args), "leak_kb": 64, "n": 200, "skip_faults": True})
        res_leak = run(leak, log=lambda *a: None)
        la = res_leak["flat"]["analysis"]
        print(f"leaking double (64 KiB per job): host slope {la['rss_bytes']['per_100'] / MIB:.2f} MiB per 100 "
              f"candidates -> {la['verdict']}")
        res["self_test_leak"] = {"analysis": la}
        res["ok"] = bool(res["ok"] and not la["flat"] and res["flat"]["analysis"]["rss_bytes"]["last"] is not None)
        print("self-test", "OK" if res["ok"] else "FAILED", "->", _write(res, args.out))
        return 0 if res["ok"] else 1
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        print("no CUDA GPU visible (use --self-test to check the plumbing on the CPU)")
        return 2
    res = run(args)
    path = _write(res, args.out)
    print(table(res))
    print(f"results: {path}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    # run as the module `long_worker` (bench/ is on sys.path): the functions handed to spawned
    # processes (precompile, the self-test job) then pickle by an importable name
    import long_worker
    sys.exit(long_worker.main())
