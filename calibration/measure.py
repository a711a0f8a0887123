"""The GPU side of calibration and variant ranking: compile, allocate, initialise, check, time.

No torch: device memory is gpu_backend.memory.DeviceArray, launches go through
gpu_backend.runner.CompiledKernel (prepared once, then `launch_prepared`), timing is
gpu_backend.timing.time_launches (CUDA events around each repetition, median, L2 flushed before
every repetition when asked, outputs poisoned before every repetition and re-checked afterwards).

Host-side pieces (input generation, checks) are plain numpy and are unit-tested on the CPU.
"""
from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

HOST_BLOCK = 1_000_003      # random inputs repeat with this (prime) period: cheap to make, and a
                            # misplaced tile still shows up in a bitwise copy check
FIRST_LAUNCH_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------------- host side
def host_bits(shape: Sequence[int], dtype: str, init: str, seed: int = 0) -> np.ndarray:
    """Raw device bits for a tensor initialised as `init` (randn / ones / zeros)."""
    from gpu_backend.memory import to_bits

    n = int(math.prod(shape))
    if init == "randn":
        rng = np.random.default_rng(seed)
        base = to_bits(rng.standard_normal(min(n, HOST_BLOCK), dtype=np.float32), dtype)
        reps = -(-n // base.size)
        flat = np.tile(base, reps)[:n] if reps > 1 else base[:n]
    elif init in ("ones", "zeros"):
        flat = to_bits(np.full(min(n, HOST_BLOCK), 1.0 if init == "ones" else 0.0, dtype=np.float32), dtype)
        flat = np.resize(flat, n)
    else:
        raise ValueError(f"no host values for init {init!r}")
    return np.ascontiguousarray(flat.reshape(tuple(shape)))


def copy_matches(x_bits: np.ndarray, y_bits: np.ndarray) -> tuple[bool, str]:
    if x_bits.shape != y_bits.shape:
        return False, f"shape {y_bits.shape} != {x_bits.shape}"
    eq = x_bits == y_bits
    if eq.all():
        return True, "bitwise equal"
    bad = np.argwhere(~eq)
    return False, f"{int((~eq).sum())} elements differ (first at {bad[0].tolist()})"


def fully_written(bits: np.ndarray, dtype: str) -> tuple[bool, str]:
    from gpu_backend.memory import poison_mask

    n = int(poison_mask(bits, dtype).sum())
    return (n == 0), ("fully written" if n == 0 else f"{n} of {bits.size} elements never written")


def softmax_base(n: int, rows: int = 4096, seed: int = 0):
    """(X base rows [rows, n] float32 bf16-rounded, float64 reference): the softmax task's input
    distribution (tasks/softmax/task.py, edge rows included) at row length n."""
    from tasks.softmax.task import SoftmaxTask

    t = SoftmaxTask()
    t.n = n
    x = t.make_inputs({"M": rows}, seed)["X"]
    return x, t.reference({"X": x}, {"M": rows})["Y"]


def softmax_check(y_bits: np.ndarray, ref_base: np.ndarray, tol: float = 1e-2, max_abs_tol: float = 1e-2) -> dict:
    """Y[M, n] (bf16 bits) against a reference of its base rows (row r of Y <-> base row r % B):
    every element written and finite; rel RMSE and max-abs on the first and the last B rows."""
    from gpu_backend.checks import check_output

    M = y_bits.shape[0]
    B = ref_base.shape[0]
    ok, msg = fully_written(y_bits, "bf16")
    if not ok:
        return {"ok": False, "message": msg}
    out = {"ok": True, "rel_rmse": 0.0, "max_abs": 0.0, "message": ""}
    for start in sorted({0, max(0, M - B)}):
        stop = min(M, start + B)
        rows = np.arange(start, stop)
        c = check_output("Y", y_bits[start:stop], "bf16", ref_base[rows % B], tol, max_abs_tol)
        if not c.ok:
            return {"ok": False, "message": c.message, "rel_rmse": c.rel_rmse, "max_abs": c.max_abs}
        out["rel_rmse"] = max(out["rel_rmse"], c.rel_rmse or 0.0)
        out["max_abs"] = max(out["max_abs"], c.max_abs or 0.0)
    out["message"] = f"rows {0}-{min(M, B) - 1} and {max(0, M - B)}-{M - 1} checked; all {y_bits.size} written"
    return out


def gemm_inputs(shape: dict, seed: int = 0):
    """(A, B float32 bf16-rounded, C reference float64) from the GEMM task's input distribution."""
    from tasks.gemm.task import GemmTask

    t = GemmTask()
    ins = t.make_inputs(shape, seed)
    return ins["A"], ins["B"], t.reference(ins, shape)["C"]


# ------------------------------------------------------------------------------- environment
def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import cuda.bindings
        out["cuda_bindings"] = cuda.bindings.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        from cake_ir.nvrtc import nvrtc_version
        out["nvrtc"] = nvrtc_version()
    except Exception:  # noqa: BLE001
        pass
    try:
        from cake_ir.nodes import IR_VERSION
        out["cake_ir"] = IR_VERSION
    except Exception:  # noqa: BLE001
        pass
    if "torch" in sys.modules:
        out["torch"] = sys.modules["torch"].__version__
    return out


def device_info(ordinal: int = 0) -> dict:
    from gpu_backend.driver import properties

    p = dict(properties(ordinal))
    p["cc"] = list(p.get("cc", ()))
    d = p.get("driver")
    if isinstance(d, int):
        p["driver_version"] = f"{d // 1000}.{(d % 1000) // 10}"
    return p


# -------------------------------------------------------------------------------- compiling
def _warm_one(args):
    kernel, arch = args
    from cake_ir.compiler import compile_kernel

    try:
        r = compile_kernel(kernel, arch=arch, use_cache=True)
        return kernel.name, r.ok
    except Exception as e:  # noqa: BLE001
        return kernel.name, f"{type(e).__name__}: {e}"


def warm_compile_cache(kernels: Sequence, jobs: Optional[int] = None) -> None:
    """Compile kernels in parallel worker processes so the NVRTC disk cache holds their cubins; the
    caller's own compile_kernel calls are then cache hits. Best effort: any failure here only costs
    time (the caller compiles again and reports)."""
    jobs = jobs or min(16, os.cpu_count() or 1)
    if jobs <= 1 or len(kernels) <= 1:
        return
    try:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            list(ex.map(_warm_one, [(k, None) for k in kernels], chunksize=1))
    except Exception as e:  # noqa: BLE001
        print(f"[measure] parallel compile skipped ({type(e).__name__}: {e})", flush=True)


def compile_checked(kernel, allowed_warnings=frozenset()):
    """compile_kernel for sm_90a; returns (CompileResult, errors, unexpected verifier warnings)."""
    from cake_ir.compiler import compile_kernel

    r = compile_kernel(kernel, arch="sm_90a", use_cache=True)
    errs = [d.short() for d in r.diagnostics if d.severity == "error"]
    warns = [d.short() for d in r.diagnostics if d.severity == "warning" and d.code not in allowed_warnings]
    return r, errs, warns


# ---------------------------------------------------------------------------------- waiting
def wait_or_die(what: str, timeout_s: float = FIRST_LAUNCH_TIMEOUT_S, on_timeout=None) -> None:
    """Synchronise with a deadline (a protocol bug would hang the device forever): poll the default
    stream; past the deadline call `on_timeout` (to save partial results) and exit the process."""
    from cuda.bindings import driver

    from gpu_backend.driver import check

    t0 = time.time()
    while True:
        err = driver.cuStreamQuery(driver.CUstream(0))[0]
        if err == driver.CUresult.CUDA_SUCCESS:
            return
        if err != driver.CUresult.CUDA_ERROR_NOT_READY:
            check((err,), f"{what}")
        if time.time() - t0 > timeout_s:
            print(f"[measure] {what}: no completion after {timeout_s:.0f} s (hung kernel?); exiting", flush=True)
            if on_timeout:
                try:
                    on_timeout()
                except Exception:  # noqa: BLE001
                    pass
            os._exit(3)
        time.sleep(0.001)


# ------------------------------------------------------------------------------ microbenchmarks
@dataclass
class Timer:
    reps: int = 10
    warmup: int = 2
    flusher: object = None       # gpu_backend.timing.L2Flusher

    def time(self, launch, flush: bool, before_each=None):
        from gpu_backend.timing import time_launches

        return time_launches(launch, warmup=self.warmup, reps=self.reps,
                             flusher=self.flusher if flush else None, before_each=before_each)


def run_micro(m, timer: Timer, on_timeout=None) -> dict:
    """Compile, set up, check and time one microbenchmark. Returns its measurement record."""
    from gpu_backend.memory import Arena, synchronize
    from gpu_backend.runner import CompiledKernel

    rec = m.describe()
    rec.update({"seconds": None, "correct": False})
    t0 = time.time()
    r, errs, warns = compile_checked(m.kernel, m.allowed_warnings)
    rec["registers"] = r.resources.get("registers")
    rec["spill_bytes"] = r.resources.get("spill_store_bytes")
    rec["smem_bytes"] = r.smem_bytes
    if warns:
        rec["warnings"] = warns[:5]
    if not r.ok:
        rec["error"] = "; ".join(errs[:3]) or "did not compile"
        return rec
    with Arena() as arena:
        arrays, host = {}, {}
        for name, ta in m.tensors.items():
            a = arena.alloc(ta.shape, ta.dtype)
            arrays[name] = a
            if ta.init == "poison":
                a.poison()
            else:
                host[name] = host_bits(ta.shape, ta.dtype, ta.init, seed=len(arrays))
                a.upload_bits(host[name])
        ck = CompiledKernel(m.kernel, r)
        prepared = ck.prepare(arrays, m.shapes)
        launch = (lambda: ck.launch_prepared(prepared))
        rec["grid"] = prepared[0]
        launch()
        wait_or_die(m.name, on_timeout=on_timeout)
        checks = []
        ok = True
        if m.check and m.check.startswith("copy:"):
            _, src, dst = m.check.split(":")
            good, msg = copy_matches(host[src], arrays[dst].download_bits())
            ok &= good
            checks.append(f"{dst} == {src}: {msg}")
        for name, ta in m.tensors.items():
            if ta.init == "poison" and not (m.check and m.check.endswith(":" + name)):
                good, msg = fully_written(arrays[name].download_bits(), ta.dtype)
                ok &= good
                checks.append(f"{name}: {msg}")
        rec["checks"] = checks
        outs = [a for n, a in arrays.items() if m.tensors[n].init == "poison"]

        def poison_outputs():
            for a in outs:
                a.poison()
        st = timer.time(launch, m.flush_l2, before_each=poison_outputs if outs else None)
        rec.update(st.as_dict())
        rec["seconds"] = st.ms_median * 1e-3
        if m.check and m.check.startswith("copy:"):     # the timed launches must have copied too
            _, src, dst = m.check.split(":")
            good, msg = copy_matches(host[src], arrays[dst].download_bits())
            ok &= good
            checks.append(f"after timing, {dst} == {src}: {msg}")
        if m.kind == "launch":
            n = int(m.extra.get("back_to_back", 200))
            from gpu_backend.timing import Event
            s, e = Event(), Event()
            s.record()
            for _ in range(n):
                launch()
            e.record()
            e.synchronize()
            rec["back_to_back_s"] = e.elapsed_ms(s) * 1e-3 / n
            s.destroy()
            e.destroy()
        synchronize("micro")
        rec["correct"] = bool(ok)
        ck.unload()
    rec["wall_s"] = time.time() - t0
    return rec


# --------------------------------------------------------------------------------- variants
@dataclass
class VariantInputs:
    """Device inputs / outputs and references shared by all variants of one problem shape."""

    arrays: dict = field(default_factory=dict)      # name -> DeviceArray
    ref: Optional[np.ndarray] = None
    ref_kind: str = ""
    out: str = ""
    out_dtype: str = "bf16"


class InputCache:
    """One set of device inputs per (family, shape), built on first use, freed by `free()`."""

    def __init__(self, softmax_rows: int = 4096, seed: int = 0):
        self.sets: dict = {}
        self.softmax_rows = softmax_rows
        self.seed = seed

    def get(self, family: str, kernel, shape: dict) -> VariantInputs:
        from gpu_backend.memory import DeviceArray, f32_to_bf16_bits

        if family == "gemm":
            key = ("gemm", shape["M"], shape["N"], shape["K"])
            if key not in self.sets:
                A, B, C = gemm_inputs(shape, self.seed)
                vi = VariantInputs(ref=C, ref_kind="full", out="C")
                vi.arrays["A"] = DeviceArray.from_host(A, "bf16")
                vi.arrays["B"] = DeviceArray.from_host(B, "bf16")
                vi.arrays["C"] = DeviceArray.alloc((shape["M"], shape["N"]), "bf16")
                self.sets[key] = vi
            return self.sets[key]
        if family == "softmax":
            n = int(kernel.consts["N"])
            M = int(shape["M"])
            key = ("softmax", M, n)
            if key not in self.sets:
                xb, ref = softmax_base(n, self.softmax_rows, self.seed)
                bits = f32_to_bf16_bits(xb)
                reps = -(-M // bits.shape[0])
                full = np.ascontiguousarray(np.tile(bits, (reps, 1))[:M])
                vi = VariantInputs(ref=ref, ref_kind="softmax_base", out="Y")
                x = DeviceArray.alloc((M, n), "bf16")
                x.upload_bits(full)
                vi.arrays["X"] = x
                vi.arrays["Y"] = DeviceArray.alloc((M, n), "bf16")
                self.sets[key] = vi
            return self.sets[key]
        raise ValueError(family)

    def free(self):
        for vi in self.sets.values():
            for a in vi.arrays.values():
                try:
                    a.free()
                except Exception:  # noqa: BLE001
                    pass
        self.sets.clear()


def check_variant(vi: VariantInputs, tol: float = 1e-2) -> dict:
    from gpu_backend.checks import check_output

    bits = vi.arrays[vi.out].download_bits()
    if vi.ref_kind == "full":
        c = check_output(vi.out, bits, vi.out_dtype, vi.ref, tol)
        return {"ok": bool(c.ok), "rel_rmse": c.rel_rmse, "max_abs": c.max_abs, "message": c.message, "bits": bits}
    res = softmax_check(bits, vi.ref, tol)
    res["bits"] = bits
    return res


def run_variant(name: str, family: str, kernel, compiled, shape: dict, inputs: InputCache, timer: Timer,
                tol: float = 1e-2, on_timeout=None) -> dict:
    """Check (poisoned output, float64 reference) and time one variant at one shape."""
    from gpu_backend.runner import CompiledKernel

    rec = {"name": name, "family": family, "shapes": dict(shape), "seconds": None, "correct": False}
    t0 = time.time()
    vi = inputs.get(family, kernel, shape)
    ck = CompiledKernel(kernel, compiled)
    try:
        prepared = ck.prepare(vi.arrays, shape)
        out = vi.arrays[vi.out]
        out.poison()
        ck.launch_prepared(prepared)
        wait_or_die(name, on_timeout=on_timeout)
        c1 = check_variant(vi, tol)
        first_bits = c1.pop("bits")
        rec.update({"rel_rmse": c1.get("rel_rmse"), "max_abs": c1.get("max_abs"), "check": c1.get("message")})
        if not c1["ok"]:
            rec["error"] = c1.get("message")
            return rec
        st = timer.time(lambda: ck.launch_prepared(prepared), True, before_each=out.poison)
        rec.update(st.as_dict())
        rec["seconds"] = st.ms_median * 1e-3
        again = out.download_bits()
        if np.array_equal(again, first_bits):
            rec["after_timing"] = "bitwise equal to the checked output"
            rec["correct"] = True
        else:
            c2 = check_variant(vi, tol)
            c2.pop("bits", None)
            rec["after_timing"] = c2.get("message") or f"rel RMSE {c2.get('rel_rmse')}"
            rec["correct"] = bool(c2["ok"])
            if not c2["ok"]:
                rec["error"] = "after timing: " + str(c2.get("message"))
        rec["registers"] = compiled.resources.get("registers")
        rec["smem_bytes"] = compiled.smem_bytes
    finally:
        try:
            ck.unload()
        except Exception:  # noqa: BLE001
            pass
        rec["wall_s"] = time.time() - t0
    return rec
