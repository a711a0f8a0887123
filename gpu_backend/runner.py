"""Run a compiled CAKE kernel on torch tensors: evaluate the grid, build TMA maps, launch."""
from __future__ import annotations

from typing import Any, Mapping

from cake_ir import expr as E
from cake_ir.nodes import Kernel, ScalarParam, TensorParam

from .module import LoadedKernel
from .tensormap import encode_tiled


def eval_index(e, env: Mapping[str, int]) -> int:
    v = E.evaluate(E.parse_index(e), env)
    return int(v)


class CompiledKernel:
    """A compiled kernel bound to its IR: call it with torch tensors and scalar values."""

    def __init__(self, kernel: Kernel, result, device: int = 0):
        if not result.ok:
            raise RuntimeError("kernel did not compile: " + "; ".join(d.short() for d in result.diagnostics[:5]))
        self.kernel, self.result = kernel, result
        self.loaded = LoadedKernel.load(result.cubin, result.kernel_name, result.smem_bytes,
                                        kernel.launch.threads, result.signature, device)

    def env(self, scalars: Mapping[str, Any]) -> dict:
        env = dict(self.kernel.consts)
        env.update({k: int(v) for k, v in scalars.items() if isinstance(v, int)})
        return env

    def prepare(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any]):
        env = self.env(scalars)
        grid = [eval_index(g, env) for g in self.kernel.launch.grid]
        tmaps = {}
        for p in self.kernel.params:
            if isinstance(p, TensorParam):
                t = tensors[p.name]
                shape = [eval_index(s, env) for s in p.shape]
                if list(t.shape) != shape:
                    raise ValueError(f"{p.name}: expected shape {shape}, got {list(t.shape)}")
                if p.tma is not None:
                    strides = [eval_index(s, env) for s in p.strides] if p.strides else None
                    tmaps[p.name] = encode_tiled(t.data_ptr(), p.dtype, shape, list(p.tma.box), p.tma.swizzle,
                                                 p.tma.oob_fill, strides)
        ptrs = {n: t.data_ptr() for n, t in tensors.items()}
        addr, keep = self.loaded.pack_args(ptrs, {p.name: scalars[p.name] for p in self.kernel.params
                                                  if isinstance(p, ScalarParam)}, tmaps)
        return grid, addr, keep

    def __call__(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any], stream: int = 0):
        grid, addr, keep = self.prepare(tensors, scalars)
        self.loaded.launch(grid, addr, stream)
        return keep
