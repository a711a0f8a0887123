"""Evaluate one candidate on one task in the current process: compile, test, profile.

    rec = evaluate(ir_json, "softmax", gpu=0)        # -> EvalRecord (gpu_backend.record)

Rules (/shared/design/evaluation.md):
- compile (cached per process and on disk), for the device's arch;
- test: for every task shape, inputs drawn fresh from a recorded seed, outputs poisoned (NaN pattern)
  before the launch, every element checked written and finite, values compared with a float64 numpy
  reference computed on the host from the same inputs (nothing the kernel can read), with the task's
  tolerance; inputs checked unmodified. Each shape is then run a second time with fresh inputs written
  to the same addresses and checked against a fresh reference: a kernel that replays a cached result
  (keyed on addresses, a flag, or a fingerprint of stale data) fails there as `cache_cheat`. With
  `input_pool` the inputs come from a fixed pool of seeded sets per shape whose references are cached
  (the agent's fast per-candidate test; its new bests are re-tested on fresh inputs);
- profile: per bench shape, CUDA-event timing (gpu_backend.timing): warm-up, median/min/max of `reps`,
  L2 flushed and outputs poisoned before every repetition; the outputs the timed runs leave are
  re-checked against the reference (a kernel that skips work on repeated inputs leaves poison).

A sticky CUDA error (kernel fault) ends the evaluation with status "crash" and `context_lost` set: the
process's CUDA context is unusable afterwards (gpu_backend.worker restarts the worker). Running this
in-process is fine for trusted kernels and tests; untrusted candidates go through the WorkerPool.
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable, Optional

import numpy as np

from .candidate import Compiled, compile_candidate, first_error_node
from .checks import run_checks
from .driver import CudaError
from .errors import classify
from . import task_data
from .record import EvalRecord, ShapeResult, Timing
from .runner import ShapeMismatch
from .task_data import pool_seed

Progress = Callable[..., None]


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def derive_seed(seed: int, *parts: int) -> int:
    """A per-(shape, run) seed from the evaluation's seed; deterministic, well mixed."""
    return int(np.random.SeedSequence([int(seed), *[int(p) for p in parts]]).generate_state(1)[0] & 0x7FFFFFFF)


def _get_task(task):
    if isinstance(task, str):
        from tasks.base import get_task
        return get_task(task)
    return task


class _Stop(Exception):
    """Internal: the record is final (a failure was recorded)."""


def evaluate(candidate, task, gpu: int = 0, *, verify: bool = True, shapes: Optional[list[dict]] = None,
             bench_shapes: Optional[list[dict]] = None, seed: Optional[int] = None, profile: bool = True,
             warmup: int = 3, reps: int = 20, reruns: int = 1, progress: Optional[Progress] = None,
             job_id: Optional[str] = None, name: Optional[str] = None,
             bench_seed: Optional[int] = None, input_pool: int = 0) -> EvalRecord:
    """Compile, test and (if `profile`) time `candidate` (IR JSON text / dict / Kernel / Program / CudaCandidate)
    on `task` (a Task or its name) on device ordinal `gpu`. `verify=False` skips the verifier (used to
    run known-bad programs in the fault corpus). `reruns` fresh-input re-runs per shape (cache check).
    `bench_seed`: the timed shapes' inputs come from it instead of `seed`, the same for every candidate
    of a run, so a worker generates them and their reference once (`gpu_backend.task_data`).
    `input_pool` > 0: each test shape's inputs come from a fixed pool of that many seeded sets (the
    candidate's seed picks the set, a re-run the next one), whose references are cached in memory and
    on disk; 0: fresh inputs from the candidate's seed, references computed anew."""
    t0 = time.perf_counter()
    task = _get_task(task)
    seed = new_seed() if seed is None else int(seed)
    rec = EvalRecord(job_id=job_id, task=task.name, gpu=gpu, seed=seed, worker_pid=os.getpid(),
                     candidate=name or "?")
    say = progress or (lambda *a, **k: None)
    state: dict[str, Any] = {}
    try:
        _evaluate(rec, state, candidate, task, gpu, verify, shapes, bench_shapes, seed, profile, warmup, reps,
                  reruns, say, name, bench_seed, input_pool)
    except _Stop:
        pass
    except CudaError as e:
        cls, sticky = classify(e)
        rec.status, rec.error_class, rec.context_lost = ("crash" if sticky else "error"), cls, sticky
        rec.message = f"{e} during {rec.stage}"
        comp: Optional[Compiled] = state.get("comp")
        if sticky and comp is not None and comp.kernel is not None and not verify:
            _verifier_hint(rec, comp.kernel)
    except Exception as e:  # noqa: BLE001 - the record carries it; the caller decides
        rec.status, rec.error_class = "error", "internal_error"
        rec.message = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=6))[-2000:]
    rec.wall_s = time.perf_counter() - t0
    return rec


def _verifier_hint(rec: EvalRecord, kernel) -> None:
    """The verifier was skipped for this run; after a fault, name the node it would have flagged."""
    hint = verifier_hint(kernel)
    if hint:
        rec.node = hint[0]
        rec.message += f"; the verifier (skipped for this run) reports {hint[1]}"


def verifier_hint(kernel) -> Optional[tuple[str, str]]:
    """(node path, diagnostic) of the verifier's first error for `kernel`, or None."""
    try:
        from cake_ir.verifier import verify
        errs = [d for d in verify(kernel).diagnostics if d.severity == "error"]
        return (errs[0].node, errs[0].short()) if errs else None
    except Exception:  # noqa: BLE001 - a hint only
        return None


def fault_hint(job: dict) -> Optional[tuple[str, str]]:
    """For the worker pool: after a job run with verify=False timed out or killed its worker, the
    node the verifier would have flagged (None when the verifier ran or finds nothing)."""
    if job.get("verify", True):
        return None
    from cake_ir.nodes import Kernel, Program

    from .candidate import as_candidate
    c = as_candidate(job.get("candidate"))
    return verifier_hint(c) if isinstance(c, (Kernel, Program)) else None


def _fail(rec: EvalRecord, status: str, error_class: str, message: str, node: Optional[str] = None):
    rec.status, rec.error_class, rec.message = status, error_class, message
    if node:
        rec.node = node
    raise _Stop


def _evaluate(rec, state, candidate, task, gpu, verify, shapes, bench_shapes, seed, profile, warmup, reps,
              reruns, say, name, bench_seed=None, input_pool=0) -> None:
    from .driver import arch_of, context, properties
    from .runner import CompiledKernel

    rec.stage = "compile"
    say("compile")
    context(gpu)
    props = properties(gpu)
    rec.device = props["name"]
    comp = state["comp"] = compile_candidate(candidate, arch_of(props), verify)
    rec.candidate = name or comp.name
    rec.compile = dict(comp.info)
    rec.diagnostics = [d for d in comp.diagnostics if d.get("severity") in ("error", "warning")][:20]
    if not comp.ok:
        errs = [d for d in comp.diagnostics if d.get("severity", "error") == "error"]
        msg = "; ".join(f"{d['code']} at {d['node']}: {d['message']}" for d in errs[:3]) or "compile failed"
        _fail(rec, "fail", comp.error_class or "compile_error", msg, first_error_node(comp.diagnostics))
    shapes = list(shapes if shapes is not None else task.shapes)
    bench_shapes = list(bench_shapes if bench_shapes is not None else task.bench_shapes)
    if not shapes:
        _fail(rec, "error", "internal_error", "the task has no shapes")
    problem = interface_problem(comp.spec, task, shapes[0])
    if problem:
        _fail(rec, "error", "interface", problem)
    ck = CompiledKernel.from_spec(comp.spec, device=gpu)   # a CompiledProgram for a Program's ProgramSpec
    try:
        rec.stage = "test"
        for si, shape in enumerate(shapes):
            say("test", shape=shape)
            _check_facts(rec, comp.spec, task, shape)
            _test_shape(rec, ck, task, shape, seed, si, reruns, input_pool)
        if profile:
            rec.stage = "profile"
            for bi, shape in enumerate(bench_shapes):
                say("profile", shape=shape)
                _check_facts(rec, comp.spec, task, shape)
                _profile_shape(rec, ck, task, shape, seed if bench_seed is None else int(bench_seed), bi, warmup,
                               reps, gpu)
        rec.status = "ok"
    finally:
        if not rec.context_lost:
            try:
                ck.unload()
            except Exception:  # noqa: BLE001
                pass


def interface_problem(spec, task, shape: dict) -> Optional[str]:
    """Why the kernel's arguments do not fit the task (None when they do)."""
    want = {t.name: t for t in list(task.inputs(shape)) + list(task.outputs(shape)) + workspace_specs(task, shape)}
    have = {a["name"]: a for a in spec.signature if a["kind"] == "ptr"}
    scal_have = {a["name"] for a in spec.signature if a["kind"] == "scalar"}
    scal_want = set(task.scalars(shape))
    problems = []
    if set(want) - set(have):
        problems.append(f"missing tensor params {sorted(set(want) - set(have))}")
    if set(have) - set(want):
        problems.append(f"unknown tensor params {sorted(set(have) - set(want))}")
    for n in set(want) & set(have):
        if want[n].dtype != have[n]["dtype"]:
            problems.append(f"{n} is {have[n]['dtype']}, the task passes {want[n].dtype}")
    if scal_have - scal_want:
        problems.append(f"scalars {sorted(scal_have - scal_want)} are not provided by the task "
                        f"(it provides {sorted(scal_want)})")
    for n, decl in spec.tensors.items():
        if decl.strides is not None:
            problems.append(f"{n} declares strides; the task's tensors are contiguous (drop `strides`)")
    return "; ".join(problems) or None


def _check_facts(rec, spec, task, shape):
    scal = task.scalars(shape)
    for n, decl in spec.scalars.items():
        why = decl.violation(scal.get(n))
        if why:
            _fail(rec, "fail", "unsupported_shape",
                  f"task shape {shape}: scalar {n} = {why} (the kernel's declared facts); the task requires "
                  f"every shape in {task.name}.shapes")


def workspace_specs(task, shape) -> list:
    """A task's scratch tensors (optional `workspace(shape)`): zero-filled once by the evaluator and
    passed to the kernel, which must leave them zeroed (checked after every test launch)."""
    fn = getattr(task, "workspace", None)
    return list(fn(shape)) if fn is not None else []


def _alloc(arena, task, shape):
    ins = {t.name: arena.alloc(t.shape, t.dtype) for t in task.inputs(shape)}
    outs = {t.name: arena.alloc(t.shape, t.dtype) for t in task.outputs(shape)}
    for t in workspace_specs(task, shape):   # scratch rides with the inputs (never poisoned)
        ins[t.name] = arena.alloc(t.shape, t.dtype)
        ins[t.name].fill_bits(0)
    return ins, outs


def _dirty_workspace(ins, task, shape) -> Optional[str]:
    for t in workspace_specs(task, shape):
        bits = ins[t.name].download_bits()
        if np.count_nonzero(bits):
            return f"workspace {t.name}: {int(np.count_nonzero(bits))} of {bits.size} elements left non-zero"
    return None


def _prepare(rec, ck, tensors, scalars):
    problem = ck.spec.shape_problem({n: list(t.shape) for n, t in tensors.items()}, scalars)
    if problem:
        _fail(rec, "error", "interface", problem)
    try:
        return ck.prepare(tensors, scalars)
    except ShapeMismatch as e:
        _fail(rec, "error", "interface", str(e))


def _test_shape(rec: EvalRecord, ck, task, shape: dict, seed: int, si: int, reruns: int, pool: int = 0) -> None:
    from .memory import Arena, synchronize
    with Arena() as arena:
        ins, outs = _alloc(arena, task, shape)
        scalars = task.scalars(shape)
        prepared = _prepare(rec, ck, {**ins, **outs}, scalars)
        first_ok, prev = False, None
        for run in range(1 + reruns):
            s, inputs, sent, refs_of = _test_inputs(task, shape, seed, si, run, pool, ins)
            for n in sent:
                ins[n].upload_bits(sent[n])
            for o in outs.values():
                o.poison()
            ck.launch_prepared(prepared)
            synchronize("kernel (test launch)")
            bits = {n: o.download_bits() for n, o in outs.items()}
            refs = refs_of()
            checks = run_checks(task, bits, {n: o.dtype for n, o in outs.items()}, refs, inputs, shape)
            bad = next((c for c in checks if not c.ok), None)
            dirty = _dirty_workspace(ins, task, shape)
            if bad is None and dirty:
                _fail(rec, "fail", "workspace_dirty", f"shape {shape}, seed {s}: {dirty} (the kernel must leave "
                      "its workspace zeroed)")
            rels = [c.rel_rmse for c in checks if c.rel_rmse is not None]
            mabs = [c.max_abs for c in checks if c.max_abs is not None]
            sr = ShapeResult(shape=dict(shape), run=run, seed=s, ok=bad is None,
                             rel_rmse=max(rels) if rels else None, max_abs=max(mabs) if mabs else None,
                             error_class=bad.error_class if bad else None, message=bad.message if bad else "")
            rec.shapes.append(sr)
            if sr.rel_rmse is not None:
                rec.max_rel_rmse = max(rec.max_rel_rmse or 0.0, sr.rel_rmse)
            if sr.max_abs is not None:
                rec.max_abs = max(rec.max_abs or 0.0, sr.max_abs)
            if bad is not None:
                stale = _stale_reason(bad, bits, prev, outs, task, shape) if first_ok else None
                if stale:
                    _fail(rec, "fail", "cache_cheat",
                          f"shape {shape}: correct on the first inputs, then {stale} after fresh inputs were "
                          f"written to the same addresses (seed {s}): {bad.message}")
                _fail(rec, "fail", bad.error_class, f"shape {shape}, seed {s}: {bad.message}")
            prev = (bits, refs, inputs)
            if run == 0:
                first_ok = True
                for n, a in ins.items():
                    if n in sent and not np.array_equal(a.download_bits(), sent[n]):
                        _fail(rec, "fail", "input_modified", f"shape {shape}: the kernel wrote to input {n}")


def _test_inputs(task, shape: dict, seed: int, si: int, run: int, pool: int, ins: dict):
    """(seed, host inputs, device bits per input, refs()) of one test run: set (seed + run) % pool of the
    shape's fixed pool (cached), or fresh inputs from the evaluation's seed."""
    from .memory import to_bits
    if pool > 0:
        s = pool_seed(task.name, shape, (seed + run) % pool)
        it = DATA.item(task, shape, s)
        sent = {n: it.bits(n, a.dtype) for n, a in ins.items() if n in it.inputs}
        return s, it.inputs, sent, it.refs
    s = derive_seed(seed, si, run)
    inputs = task.make_inputs(shape, s)
    sent = {n: to_bits(inputs[n], a.dtype) for n, a in ins.items() if n in inputs}
    return s, inputs, sent, lambda: task.reference(inputs, shape)


def _stale_reason(bad, bits, prev, outs, task, shape=None) -> Optional[str]:
    """Why a re-run failure looks like a replayed result rather than a plain wrong kernel (a wrong
    kernel can pass one input set by luck, e.g. a constant softmax row): outputs left unwritten after a
    run that wrote them all, outputs bit-identical to the previous run's, or outputs that match the
    previous inputs' reference."""
    if prev is None:
        return None
    if bad.error_class == "unwritten_output":
        return "outputs left unwritten (work skipped)"
    prev_bits, prev_refs, prev_inputs = prev
    if all(np.array_equal(bits[n], prev_bits[n]) for n in bits):
        return "outputs identical to the previous run's"
    again = run_checks(task, bits, {n: o.dtype for n, o in outs.items()}, prev_refs, prev_inputs, shape)
    if all(c.ok for c in again):
        return "outputs matching the previous inputs' reference"
    return None


def _profile_shape(rec: EvalRecord, ck, task, shape: dict, seed: int, bi: int, warmup: int, reps: int,
                   gpu: int) -> None:
    from .memory import Arena
    from .timing import L2Flusher, time_launches
    with Arena() as arena:
        ins, outs = _alloc(arena, task, shape)
        item = DATA.item(task, shape, derive_seed(seed, 1000 + bi))
        inputs = item.inputs
        for n, a in ins.items():
            if n in inputs:
                a.upload_bits(item.bits(n, a.dtype))
        prepared = _prepare(rec, ck, {**ins, **outs}, task.scalars(shape))
        flusher = L2Flusher.for_device(gpu)

        def poison():
            for o in outs.values():
                o.poison()

        stats = time_launches(lambda: ck.launch_prepared(prepared), warmup=warmup, reps=reps, flusher=flusher,
                              before_each=poison)
        bits = {n: o.download_bits() for n, o in outs.items()}
        refs = item.refs()
        checks = run_checks(task, bits, {n: o.dtype for n, o in outs.items()}, refs, inputs, shape)
        bad = next((c for c in checks if not c.ok), None)
        sec = stats.ms_median * 1e-3
        rec.timings.append(Timing(shape=dict(shape), ms_min=stats.ms_min, ms_median=stats.ms_median,
                                  ms_max=stats.ms_max, reps=stats.reps, warmup=stats.warmup,
                                  flush_bytes=stats.flush_bytes, rechecked=True,
                                  tflops=task.flops(shape) / sec / 1e12 if sec > 0 else None,
                                  tbps=task.bytes(shape) / sec / 1e12 if sec > 0 else None))
        if bad is not None:   # it passed every test shape; skipping work when timed leaves poison
            cls = "cache_cheat" if bad.error_class == "unwritten_output" else bad.error_class
            _fail(rec, "fail", cls, f"outputs of the timed runs (shape {shape}) fail the check: {bad.message}")


def hello(job: Optional[dict] = None, progress: Optional[Progress] = None) -> dict:
    """A worker's start-up check: open device 0 of its CUDA_VISIBLE_DEVICES and name it. Status
    "error" (error_class no_device) with the driver's answer when it cannot: no driver, no device."""
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"candidate": "hello", "task": "-", "stage": "compile", "worker_pid": os.getpid()}
    try:
        from .driver import arch_of, context, properties
        context(0)
        props = properties(0)
        rec.update(status="ok", device=props["name"], message=f"{props['name']} ({arch_of(props)}), "
                   f"driver {props['driver']}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    except Exception as e:  # noqa: BLE001 - the answer is the record
        rec.update(status="error", error_class="no_device",
                   message=f"cannot open a CUDA device (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): {type(e).__name__}: {e}")
    rec["wall_s"] = time.perf_counter() - t0
    return rec


DATA = task_data.from_environment()    # this process's task inputs and references (memory + disk)


def run_job(job: dict, progress: Optional[Progress] = None) -> dict:
    """The worker pool's default job function: a job dict -> an EvalRecord dict.

    Keys: candidate (IR JSON text/dict, or a CudaCandidate dict), task (name), and optionally verify,
    shapes, bench_shapes, seed, bench_seed, input_pool, profile, warmup, reps, reruns, name, job_id. Runs on device 0
    of the worker's CUDA_VISIBLE_DEVICES."""
    kw: dict[str, Any] = {k: job[k] for k in ("verify", "shapes", "bench_shapes", "seed", "bench_seed", "profile",
                                               "warmup", "reps", "reruns", "name", "job_id", "input_pool") if k in job}
    return evaluate(job["candidate"], job["task"], 0, progress=progress, **kw).model_dump()
