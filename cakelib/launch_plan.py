"""Launch plans: what a repeated library call at the same configuration launches, packed once.

A small kNN / k-means call is bound by its host path (bench/results/knn-host-overhead-h200.json: ~80 us a
call through the general path). A plan holds, per kernel launch, cuLaunchKernel's argument tuple
(function, grid, block, shared memory, stream, packed argument array), and one array of the per-call
tensors' device pointers that those packed arrays point at; workspaces, scalars and plan-owned scratch
stay packed. A repeat call writes its tensors' pointers into that array and calls the driver once per
kernel, from C where the plan's C form could be built (cakelib.native_launch), else through cuda.bindings.

Plans live in the device's Runtime (`Runtime.plans`, dropped with the workspaces they point into) and
are made by the general path of a call (which did every check) from a fresh `Runtime.prepare`. A
launch whose per-call tensor is a TMA descriptor (the descriptor encodes the pointer) gets no plan.

torch is imported only once a plan for torch tensors is made (`Torch.load`).
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence

MAX_PLANS = 256   # per device; a caller cycling through more shapes re-plans (like Runtime._prepared)


class Torch:
    """torch's pieces the fast paths read, bound once: the tensor type (exact type: a subclass takes the
    general path), dtypes, the current raw stream (an int, no Stream object), empty() and empty_like()."""
    tensor = None          # None until load(): no call has been planned for torch tensors
    f16 = f32 = i32 = None
    raw_stream = None
    empty = empty_like = None

    @classmethod
    def load(cls) -> None:
        if cls.tensor is not None:
            return
        import torch
        cls.f16, cls.f32, cls.i32 = torch.float16, torch.float32, torch.int32
        cls.raw_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
                          or (lambda device: torch.cuda.current_stream(device).cuda_stream))
        cls.empty, cls.empty_like = torch.empty, torch.empty_like
        cls.tensor = torch.Tensor


def result_template(shape, dtype, device):
    """What a planned call's fresh result is made from: `Torch.empty_like(template)` is a new contiguous
    tensor of this shape, dtype and device, and costs half a `torch.empty(shape, dtype=, device=)` (no
    keyword parsing; bench/results/host-overhead-h100.json). One element expanded, so a plan holds no
    result-sized memory (empty_like of a tensor that is not dense returns a contiguous one)."""
    return Torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(*shape)


def current_stream(device: int) -> int:
    """torch's current CUDA stream on `device` as the driver's handle (torch.cuda.current_stream's
    .cuda_stream without building a Stream object)."""
    Torch.load()
    return int(Torch.raw_stream(device))


class PlannedLaunch:
    """One kernel's or Program's launches with the per-call tensors' pointers in one array (`cells`, in
    `names` order), which every launch's packed arguments point at. `bind(ptrs)` writes the pointers,
    `fire()` launches, `run(ptrs)` does both; the driver copies the arguments at launch, so the next bind
    never races a launch in flight (concurrent callers of one plan hold its lock around bind + fire).
    Launches go through the plan's C form (cakelib.native_launch) where it could be built, else through
    cuda.bindings (`fire_bindings`): the same driver calls."""

    def __init__(self, calls: list, cells, keep, ctx):
        self.calls = calls     # cuLaunchKernel argument tuples, in launch order
        self.cells = cells     # ctypes uint64 array: the per-call tensors' device pointers
        self.keep = keep       # the prepared launch (packed arrays the tuples point into)
        self.ctx = ctx         # the context the launches run in (made current by `run`)
        from .native_launch import native_plan
        self.native = native_plan(ctx, calls, cells)

    def bind(self, ptrs: Sequence[int]) -> None:
        self.cells[:] = ptrs

    def fire(self) -> None:
        n = self.native
        if n is None:
            self.fire_bindings()
        else:
            err = n.fire(n.addr)
            if err:
                _launch_failed(err, "cuLaunchKernel")

    def fire_bindings(self) -> None:
        """The launches through cuda.bindings' cuLaunchKernel."""
        launch = _driver_launch()
        for args in self.calls:
            err = launch(*args)[0]
            if err:
                _launch_failed(err, "cuLaunchKernel")

    def run(self, ptrs: Sequence[int]) -> None:
        """The plan's context made current on this thread, then bind + fire, in one frame (a small call's
        host time is a few microseconds of Python)."""
        n = self.native
        if n is not None:
            err = n.run(n.addr, *ptrs, *n.pad)
            if err:
                _launch_failed(err, "cuCtxSetCurrent / cuLaunchKernel")
            return
        set_context(self.ctx)
        self.cells[:] = ptrs
        self.fire_bindings()


def _launch_failed(err, call: str) -> None:
    from cuda.bindings import driver
    from gpu_backend.driver import CudaError
    raise CudaError(call, driver.CUresult(err) if isinstance(err, int) else err)


def plan_launch(rt, kern, tensors: dict, scalars: dict, stream: int, names: Sequence[str]) -> Optional[PlannedLaunch]:
    """A PlannedLaunch of `kern` with these buffers (the per-call ones named by `names`, bound per call),
    None where a per-call tensor is passed as a TMA descriptor. The fresh prepared launch's void**
    entries of the per-call tensors are pointed at the plan's cells."""
    from gpu_backend.runner import CompiledProgram
    prepared = rt.prepare(kern, tensors, scalars, stream)
    pairs = (list(zip(kern.kernels, prepared[0])) if isinstance(kern, CompiledProgram) else [(kern, prepared)])
    index = {n: i for i, n in enumerate(names)}
    cells = (ctypes.c_uint64 * len(names))(*(int(_ptr_of(tensors[n])) for n in names))
    calls = []
    for ck, (grid, addr, _keep) in pairs:
        signature = ck.loaded.signature
        slots = (ctypes.c_void_p * max(1, len(signature))).from_address(addr)
        for j, arg in enumerate(signature):
            i = index.get(arg["name"])
            if i is None:
                continue
            if arg["kind"] != "ptr":
                return None
            slots[j] = ctypes.addressof(cells) + i * ctypes.sizeof(ctypes.c_uint64)
        calls.append(ck.loaded.launch_args(grid, addr, stream))
    return PlannedLaunch(calls, cells, prepared, rt.ctx)


def _ptr_of(t) -> int:
    from gpu_backend.runner import _ptr_shape
    return _ptr_shape(t)[0]


def remember(rt, key, plan) -> None:
    """Keep `plan` (a call's plan object, or None: the configuration takes the general path) under `key`."""
    if len(rt.plans) >= MAX_PLANS:
        rt.plans.clear()
    rt.plans[key] = plan


def set_context(ctx) -> None:
    """Make `ctx` (a runtime's context) current on this thread (what `cakelib.runtime.runtime` does per
    call)."""
    err = (_DRIVER or _driver()).cuCtxSetCurrent(ctx)[0]
    if err:
        from gpu_backend.driver import CudaError
        raise CudaError("cuCtxSetCurrent", err)


_DRIVER = None


def _driver():
    """cuda.bindings.driver, imported once (its functions are looked up per call: one attribute read)."""
    global _DRIVER
    if _DRIVER is None:
        from cuda.bindings import driver
        _DRIVER = driver
    return _DRIVER


def _driver_launch():
    return (_DRIVER or _driver()).cuLaunchKernel
