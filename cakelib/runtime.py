"""The library's GPU side: one primary CUDA context per device (shared with torch / cupy), compiled
variants loaded once per process (the NVRTC cubin cache under $CAKE_CACHE_DIR also survives across
processes), zeroed workspaces reused across calls (every kernel leaves its workspace zeroed), and the
dispatch tables read from cakelib/tables/<op>.json.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Optional

# CAKELIB_TABLES points the library at other tables (bench/lib_grid.py: freshly fitted ones)
TABLES = Path(os.environ.get("CAKELIB_TABLES") or Path(__file__).resolve().parent / "tables")


class Runtime:
    def __init__(self, device: int = 0):
        from gpu_backend.driver import arch_of, context, properties
        context(device)
        self.device = device
        self.props = properties(device)
        self.arch = arch_of(self.props)
        self._kernels: dict = {}
        self._workspaces: dict = {}
        self._prepared: dict = {}
        self._lock = threading.Lock()

    def kernel(self, key: tuple, build: Callable):
        """The loaded kernel for `key`, compiling `build(arch)` on first use: an IR Kernel gives a
        CompiledKernel, an IR Program a CompiledProgram (same prepare / launch_prepared surface; it
        allocates its own workspace)."""
        with self._lock:
            k = self._kernels.get(key)
            if k is None:
                from cake_ir.compiler import compile_ir
                from cake_ir.nodes import Program
                from gpu_backend.runner import CompiledKernel, CompiledProgram
                ir = build(self.arch)
                res = compile_ir(ir, arch=self.arch)
                if not res.ok:
                    errs = "; ".join(d.short() for d in res.diagnostics if d.severity == "error")
                    raise RuntimeError(f"variant {key} does not compile for {self.arch}: {errs}")
                loaded = (CompiledProgram.from_ir if isinstance(ir, Program) else CompiledKernel)(ir, res, self.device)
                k = self._kernels[key] = loaded
            return k

    def launch(self, kern, tensors: dict, scalars: dict, stream: int = 0) -> None:
        """Launch with argument packing cached per (buffers, scalars): a k-means loop alternates between
        two argument sets, so packing (grid and shape checks, ctypes) runs once per set, not per launch."""
        from gpu_backend.runner import _ptr_shape
        key = (id(kern), tuple((n, *_flat(_ptr_shape(t))) for n, t in sorted(tensors.items())),
               tuple(sorted(scalars.items())))
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = kern.prepare(tensors, scalars)   # checks shapes against the kernel's declarations
            if len(self._prepared) > 256:
                self._prepared.clear()
            self._prepared[key] = prepared
        kern.launch_prepared(prepared, stream)

    def workspace(self, name: str, shape: tuple, dtype: str):
        """A zeroed device buffer kept for reuse (kernels that take a workspace leave it zeroed)."""
        key = (name, tuple(shape), dtype)
        with self._lock:
            w = self._workspaces.get(key)
            if w is None:
                from gpu_backend.memory import DeviceArray, synchronize
                w = DeviceArray.alloc(shape, dtype)
                w.fill_bits(0)
                synchronize()
                self._workspaces[key] = w
            return w


def _flat(ps):
    return (ps[0], *ps[1])


_RUNTIMES: dict[int, Runtime] = {}
_TABLES: dict = {}


def runtime(device: int = 0) -> Runtime:
    rt = _RUNTIMES.get(device)
    if rt is None:
        rt = _RUNTIMES[device] = Runtime(device)
    else:   # the calling thread may not have the context current yet
        from cuda.bindings import driver
        from gpu_backend.driver import check, context
        check(driver.cuCtxSetCurrent(context(device)[1]), "cuCtxSetCurrent")
    return rt


def table(op: str, path: Optional[Path] = None):
    """The op's dispatch table (None when no table has been fitted yet: callers use the fallback)."""
    key = (op, path, TABLES)   # no Path built per call: this runs on every library call
    t = _TABLES.get(key, _UNLOADED)
    if t is _UNLOADED:
        from .dispatch import DispatchTable
        p = Path(path) if path else TABLES / f"{op}.json"
        t = _TABLES[key] = DispatchTable.load(p) if p.exists() else None
    return t


_UNLOADED = object()
# (op, shape) -> (table, name, params): a small call's host time was a third the table's pick and the
# domain checks (bench/results/knn-host-overhead-h200.json); a pick holds while its table is loaded
_CHOICES: dict = {}


def choose(op: str, shape: dict, variant: Optional[dict] = None) -> tuple[str, dict]:
    """(name, params) of the variant to run: an explicit `variant`, else the table's pick guarded by the
    variant's domain, else the general fallback."""
    from .variants import NAMES, SUPPORTS
    sup = SUPPORTS[op]
    if variant is not None:
        if not sup(variant, shape):
            raise ValueError(f"{op} variant {variant} does not support shape {shape}")
        return NAMES[op](variant), dict(variant)
    t = table(op)
    key = (op, tuple(sorted(shape.items())))
    hit = _CHOICES.get(key)
    if hit is not None and hit[0] is t:
        return hit[1], dict(hit[2])
    name, params = _pick(op, shape, t, sup)
    if len(_CHOICES) > 4096:
        _CHOICES.clear()
    _CHOICES[key] = (t, name, params)
    return name, dict(params)


def _pick(op: str, shape: dict, t, sup) -> tuple[str, dict]:
    from .variants import FALLBACK, NAMES
    if t is not None:
        name = t.pick(shape, supports=lambda n, s: sup(t.variants[n], s))
        params = t.variants[name]
        if sup(params, shape):
            return name, dict(params)
    fb = FALLBACK[op]
    if not sup(fb, shape):
        raise ValueError(f"{op}: shape {shape} is outside what the library supports "
                         f"(see cakelib.variants: {op} limits)")
    return NAMES[op](fb), dict(fb)
