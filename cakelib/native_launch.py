"""Launch plans fired from C: a plan's pointer writes and its cuLaunchKernel calls in one ctypes call.

A planned small call spends most of its host time launching: one cuLaunchKernel is ~3.3 us in the driver
itself plus the binding's conversion, 0.1-0.5 us (bench/results/host-overhead-native-h100.json);
`cakelib/native/plan_launch.c` makes the same driver calls from C, with the context set and the pointer
writes, in one ctypes call. It is built once per source hash with the host C compiler (`$CC`, else `cc`)
into the cubin cache directory and loaded with ctypes; it links nothing (the driver's cuLaunchKernel is
passed in as a function pointer, as is cuCtxSetCurrent: a run makes the plan's context current first).
Where no compiler or no driver is found, or `CAKE_NATIVE_LAUNCH=0`, `native_plan` returns None and the plan
launches through cuda.bindings (cakelib.launch_plan.PlannedLaunch): the same launches.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence

SOURCE = Path(__file__).with_name("native") / "plan_launch.c"
MAX_CELLS = 4   # cake_plan_run's pointer arguments

_U3 = ctypes.c_uint * 3


class LaunchStruct(ctypes.Structure):
    """plan_launch.c's cake_launch."""
    _fields_ = [("func", ctypes.c_void_p), ("grid", _U3), ("block", _U3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("params", ctypes.c_void_p)]


class PlanStruct(ctypes.Structure):
    """plan_launch.c's cake_plan."""
    _fields_ = [("set_context", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("launch", ctypes.c_void_p),
                ("cells", ctypes.c_void_p), ("ncells", ctypes.c_int),
                ("nlaunches", ctypes.c_int), ("launches", ctypes.c_void_p)]


class NativePlan:
    """One plan's C structures (kept alive here) and its two entry points: `run(addr, a, b, c, d)` makes the
    plan's context current, writes the cells and fires, `fire(addr)` fires; both return 0 or the first
    failing call's CUresult. `pad` fills run's pointer arguments past the plan's cells."""
    __slots__ = ("struct", "launches", "addr", "run", "fire", "pad")

    def __init__(self, lib, entries: tuple, ctx: int, calls: Sequence[tuple], cells):
        set_context, launch = entries
        self.launches = (LaunchStruct * len(calls))(*(_launch_struct(c) for c in calls))
        self.struct = PlanStruct(set_context, ctx, launch, ctypes.addressof(cells), len(cells), len(calls),
                                 ctypes.addressof(self.launches))
        self.addr = ctypes.addressof(self.struct)
        self.run, self.fire = lib.cake_plan_run, lib.cake_plan_fire
        self.pad = (0,) * (MAX_CELLS - len(cells))


def _launch_struct(call: tuple) -> LaunchStruct:
    """A cuLaunchKernel argument tuple (gpu_backend.module.launch_args: function, grid x3, block x3, shared
    bytes, stream, packed-argument address, extra) as a cake_launch."""
    func, gx, gy, gz, bx, by, bz, smem, stream, params, extra = call
    if extra:
        raise ValueError("a planned launch passes no extra")
    return LaunchStruct(int(func), _U3(gx, gy, gz), _U3(bx, by, bz), smem, int(stream), int(params))


def native_plan(ctx, calls: Sequence[tuple], cells) -> Optional[NativePlan]:
    """The C form of a plan's launches in context `ctx`, or None (no library, no driver entry points, or
    more cells than cake_plan_run takes): the caller launches through cuda.bindings."""
    if len(cells) > MAX_CELLS:
        return None
    lib = library()
    entries = driver_entries() if lib is not None else None
    if entries is None:
        return None
    return NativePlan(lib, entries, int(ctx), calls, cells)


_LIB: object = None      # the loaded library, False once it could not be had


def library():
    """plan_launch.c built and loaded (once per process), or None."""
    global _LIB
    if _LIB is None:
        _LIB = False
        if os.environ.get("CAKE_NATIVE_LAUNCH", "1") != "0":
            path = build(SOURCE, _cache_dir())
            if path is not None:
                _LIB = _load(path)
    return _LIB or None


def _load(path: Path):
    lib = ctypes.CDLL(str(path))
    u64, vp = ctypes.c_uint64, ctypes.c_void_p
    lib.cake_plan_run.argtypes = [vp, u64, u64, u64, u64]
    lib.cake_plan_run.restype = ctypes.c_int
    lib.cake_plan_fire.argtypes = [vp]
    lib.cake_plan_fire.restype = ctypes.c_int
    return lib


def _cache_dir() -> Path:
    from cake_ir.nvrtc import CACHE_DIR
    return CACHE_DIR


def build(source: Path, out_dir: Path) -> Optional[Path]:
    """`source` compiled into a shared library under `out_dir`, named by the source's and compiler's hash
    (reused when present), or None where no C compiler is found or it fails (the failure is not fatal:
    the caller has the cuda.bindings path)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    text = source.read_bytes()
    digest = hashlib.sha256(text + cc.encode()).hexdigest()[:16]
    path = out_dir / f"{source.stem}-{digest}.so"
    if path.exists():
        return path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            part = Path(tmp) / path.name
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(part), str(source)], check=True,
                           capture_output=True, timeout=60)
            os.replace(part, path)   # atomic: concurrent builders leave one whole file
    except (OSError, subprocess.SubprocessError):
        return None
    return path


_ENTRIES: object = None   # driver_entries' answer, resolved once per process (False: none)


def driver_entries() -> Optional[tuple]:
    """The addresses of the driver's cuCtxSetCurrent and cuLaunchKernel as cuda.bindings resolves them
    (cuGetProcAddress at the driver's version; per-thread default stream where
    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM asks for it), or None without a driver; looked up once."""
    global _ENTRIES
    if _ENTRIES is None:
        _ENTRIES = _lookup_entries() or False
    return _ENTRIES or None


def _lookup_entries() -> Optional[tuple]:
    try:
        from cuda.bindings import driver
        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        flags = driver.CUdriverProcAddress_flags
        per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
        flag = (flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread
                else flags.CU_GET_PROC_ADDRESS_DEFAULT)
        found = [driver.cuGetProcAddress(name, version, flag) for name in (b"cuCtxSetCurrent", b"cuLaunchKernel")]
    except Exception:  # noqa: BLE001 - no driver library: the cuda.bindings path reports it at launch
        return None
    if any(got[0] != driver.CUresult.CUDA_SUCCESS or not got[1] for got in found):
        return None
    return tuple(int(got[1]) for got in found)
