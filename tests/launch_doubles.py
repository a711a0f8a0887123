"""Doubles at cakelib's boundaries, for CPU tests and CPU timing of the launch path: a minimal `torch`
module (tensors are pointers with a shape; no torch is installed on the CPU machines) and the CUDA
driver (context, module load, workspace allocation and cuLaunchKernel, which records the arguments it
was given, decoded through the packed void** array by the kernel's signature). Kernels stay the real
IR compiled by NVRTC; everything between the call and the driver is the library's own code.

    install(setattr, setitem) -> (runtime, fake torch module)    # pytest: monkeypatch.setattr / .setitem
"""
import ctypes
import math
import itertools
import sys
import types

from cakelib import runtime as rt_mod

try:
    from cakelib import launch_plan
except ImportError:      # a tree without launch plans (timing the general path alone)
    launch_plan = None

_PTRS = itertools.count(0x7000_0000, 0x10_0000)


class FakeDevice:
    type, index = "cuda", 0

    def __eq__(self, other):
        return isinstance(other, FakeDevice) and other.index == self.index

    def __hash__(self):
        return hash(("cuda", self.index))


class FakeTensor:
    """A torch CUDA tensor as the library reads it: pointer, shape, dtype, device, contiguity."""
    is_cuda = True

    def __init__(self, shape, dtype, ptr=None):
        self.shape, self.dtype, self.device = tuple(int(s) for s in shape), dtype, FakeDevice()
        self.ptr = next(_PTRS) if ptr is None else ptr

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device.index

    def is_contiguous(self):
        return True

    def contiguous(self):
        return self

    def to(self, dtype):
        return self if dtype is self.dtype else FakeTensor(self.shape, dtype)

    def reshape(self, shape):
        return FakeTensor(shape, self.dtype, self.ptr)

    def expand(self, *shape):
        return FakeTensor(shape, self.dtype, self.ptr)


FakeTensor.__module__ = "torch"     # what cakelib.arrays recognises a torch tensor by


def fake_torch(setattr, setitem):
    """A `torch` module with what cakelib reads: dtypes, Tensor, empty, the current stream (`current`)."""
    torch = types.ModuleType("torch")
    torch.float16, torch.float32, torch.int32 = "torch.float16", "torch.float32", "torch.int32"
    torch.Tensor = FakeTensor
    torch.current = 5                                     # the current stream's raw handle
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: torch.current)
    torch.empty = lambda shape, dtype, device: FakeTensor(shape, dtype)
    torch.empty_like = lambda t: FakeTensor(t.shape, t.dtype)
    torch.as_tensor = None
    torch.cuda = types.SimpleNamespace(current_stream=lambda device=None: types.SimpleNamespace(
        cuda_stream=torch.current), current_device=lambda: 0)
    setitem(sys.modules, "torch", torch)
    if launch_plan is not None:
        for name in ("tensor", "f16", "f32", "i32", "raw_stream", "empty", "empty_like"):
            setattr(launch_plan.Torch, name, None)
    return torch


class RecordingDriver:
    """cuLaunchKernel / cuCtxSetCurrent doubles: each launch is decoded (argument values read back through
    its void** array by the kernel's signature) when it is made, as the driver copies them."""

    def __init__(self):
        self.launches, self.contexts, self.current = [], 0, None
        self.functions = {}       # function handle -> (kernel name, signature)

    def launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, addr, extra):
        from cuda.bindings import driver
        name, signature = self.functions[int(fn)]
        ptrs = (ctypes.c_void_p * len(signature)).from_address(addr)
        ct = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
              "f32": ctypes.c_float}
        vals = tuple((a["name"], ct["ptr" if a["kind"] == "ptr" else a["dtype"]].from_address(p).value)
                     for a, p in zip(signature, ptrs))
        self.launches.append((name, (gx, gy, gz), (bx, by, bz), smem, int(stream), vals))
        return (driver.CUresult.CUDA_SUCCESS,)

    def c_entries(self):
        """cuCtxSetCurrent's and cuLaunchKernel's C signatures around `set_context` and `launch` (for
        cakelib.native_launch's C plans): ctypes callbacks made once and kept alive on the driver (every plan
        holds their addresses, as the real driver's stay valid); their addresses."""
        if not hasattr(self, "_c_entries"):
            u, vp = ctypes.c_uint, ctypes.c_void_p
            launch = ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, u, u, u, u, u, vp, vp, vp)
            set_ctx = ctypes.CFUNCTYPE(ctypes.c_int, vp)
            self._c_entries = (
                set_ctx(lambda ctx: int(self.set_context(ctx)[0])),
                launch(lambda fn, *rest: int(self.launch(fn, *rest[:7], rest[7] or 0, *rest[8:])[0])))
        return tuple(ctypes.cast(e, ctypes.c_void_p).value for e in self._c_entries)

    def set_context(self, ctx):
        from cuda.bindings import driver
        self.contexts += 1
        self.current = int(ctx or 0)    # the context made current last (its handle)
        return (driver.CUresult.CUDA_SUCCESS,)


class CountingRuntime(rt_mod.Runtime):
    """The real Runtime, counting the general path's fresh preparations (a planned call makes none)."""
    prepares = 0

    def prepare(self, *a, **kw):
        self.prepares += 1
        return super().prepare(*a, **kw)


def install(setattr, setitem, record: bool = True, native: bool = False):
    """The doubles in place (through the given setattr / setitem, which restore them when theirs do)
    and a counting Runtime for device 0; record=False: cuLaunchKernel only returns success; native=True:
    plans launch through their C form (cakelib.native_launch) into the recording driver's C entry,
    else through the cuda.bindings double."""
    torch = fake_torch(setattr, setitem)
    from cuda.bindings import driver as cu

    from gpu_backend import driver as gd
    from gpu_backend import memory
    from gpu_backend.module import LoadedKernel
    rec = RecordingDriver()
    setattr(cu, "cuLaunchKernel", rec.launch if record else (lambda *a, _ok=(cu.CUresult.CUDA_SUCCESS,): _ok))
    setattr(cu, "cuCtxSetCurrent", rec.set_context)
    setattr(gd, "context", lambda ordinal=0: (ordinal, cu.CUcontext(0xC0)))
    setattr(gd, "properties", lambda ordinal=0: {"cc": (9, 0), "sms": 132, "name": "fake H200"})
    from cakelib import native_launch

    def load(cls, cubin, name, smem, threads, signature, device=0):
        handle = 0x1000 + len(rec.functions)
        rec.functions[handle] = (name, signature)
        return cls(None, cu.CUfunction(handle), name, smem, threads, signature)
    setattr(LoadedKernel, "load", classmethod(load))
    setattr(native_launch, "driver_entries", rec.c_entries if native else (lambda: None))

    class FakeArray:
        def __init__(self, shape, dtype):
            self.ptr, self.shape, self.dtype = next(_PTRS), tuple(shape), dtype
            self.nbytes = memory.SIZE[dtype] * max(1, math.prod(shape))

        def fill_bits(self, bits):
            pass

        def free(self):
            pass
    setattr(memory.DeviceArray, "alloc", classmethod(lambda cls, shape, dtype: FakeArray(shape, dtype)))
    setattr(memory, "synchronize", lambda: None)
    runtime = CountingRuntime(0)
    runtime.rec = rec
    setitem(rt_mod._RUNTIMES, 0, runtime)
    return runtime, torch


