"""Load a compiled kernel (cubin) and launch it with arguments built from the lowering's signature."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .driver import check, context

_SCALAR_CT = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "f32": ctypes.c_float}


class _TensorMapArg(ctypes.Structure):
    _pack_ = 64
    _fields_ = [("opaque", ctypes.c_uint8 * 128)]


@dataclass
class LoadedKernel:
    module: Any
    function: Any
    name: str
    smem_bytes: int
    threads: int
    signature: list

    @classmethod
    def load(cls, cubin: bytes, name: str, smem_bytes: int, threads: int, signature: list, device: int = 0):
        from cuda.bindings import driver
        context(device)
        mod = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        fn = check(driver.cuModuleGetFunction(mod, name.encode()), "cuModuleGetFunction")
        if smem_bytes > 48 * 1024:
            check(driver.cuFuncSetAttribute(
                fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                "cuFuncSetAttribute")
        return cls(mod, fn, name, smem_bytes, threads, signature)

    def pack_args(self, tensors: Mapping[str, int], scalars: Mapping[str, Any],
                  tmaps: Optional[Mapping[str, bytes]] = None):
        """Kernel arguments in signature order. Returns (void** address, keep-alive list)."""
        keep: list = []
        for arg in self.signature:
            if arg["kind"] == "ptr":
                keep.append(ctypes.c_void_p(int(tensors[arg["name"]])))
            elif arg["kind"] == "tmap":
                t = _TensorMapArg()
                ctypes.memmove(ctypes.addressof(t), (tmaps or {})[arg["name"]], 128)
                keep.append(t)
            else:
                keep.append(_SCALAR_CT[arg["dtype"]](scalars[arg["name"]]))
        ptrs = (ctypes.c_void_p * max(1, len(keep)))(*[ctypes.addressof(x) for x in keep])
        keep.append(ptrs)
        return ctypes.addressof(ptrs), keep

    def launch_args(self, grid, args_addr: int, stream: int = 0) -> tuple:
        """cuLaunchKernel's arguments for this grid, packed argument array and stream (a caller that
        launches the same configuration again keeps the tuple: cakelib.launch_plan)."""
        from cuda.bindings import driver
        g = list(grid) + [1] * (3 - len(grid))
        return (self.function, int(g[0]), int(g[1]), int(g[2]), self.threads, 1, 1, self.smem_bytes,
                driver.CUstream(stream), args_addr, 0)

    def launch(self, grid, args_addr: int, stream: int = 0):
        from cuda.bindings import driver
        check(driver.cuLaunchKernel(*self.launch_args(grid, args_addr, stream)), "cuLaunchKernel")

    def unload(self):
        from cuda.bindings import driver
        check(driver.cuModuleUnload(self.module), "cuModuleUnload")
