"""The library's GPU side: one primary CUDA context per device (shared with torch / cupy), compiled
variants loaded once per process (the NVRTC cubin cache under $CAKE_CACHE_DIR also survives across
processes), zeroed workspaces reused across calls (every kernel leaves its workspace zeroed; one set
per CUDA stream, so that searches issued on two streams at once never share scratch), and the dispatch
tables read from cakelib/tables/<op>.json.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Optional

# CAKELIB_TABLES points the library at other tables (bench/lib_grid.py: freshly fitted ones)
TABLES = Path(os.environ.get("CAKELIB_TABLES") or Path(__file__).resolve().parent / "tables")
# streams whose workspaces are kept at once; a caller that makes a new stream per call would otherwise
# grow them without bound (past it, the device is synchronized and the others' workspaces freed)
MAX_STREAMS = 8


class Runtime:
    def __init__(self, device: int = 0):
        from gpu_backend.driver import arch_of, context, properties
        self.ctx = context(device)[1]
        self.device = device
        self.props = properties(device)
        self.arch = arch_of(self.props)
        self._kernels: dict = {}
        self._workspaces: dict = {}
        self._prepared: dict = {}
        self._streams: dict = {}   # the streams holding workspaces, least recently used first
        # a repeated call's launch plans (cakelib.launch_plan), keyed per op by everything the call's
        # kernel, arguments and workspaces depend on; they point into this runtime's workspaces
        self.plans: dict = {}
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
               tuple(sorted(scalars.items())), stream)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self.prepare(kern, tensors, scalars, stream)
            if len(self._prepared) > 256:
                self._prepared.clear()
            self._prepared[key] = prepared
        kern.launch_prepared(prepared, stream)

    def prepare(self, kern, tensors: dict, scalars: dict, stream: int = 0):
        """A fresh prepared launch (its own packed argument array, not shared with the cache above):
        checks shapes against the kernel's declarations; a Program takes its workspace per stream."""
        from gpu_backend.runner import CompiledProgram
        if isinstance(kern, CompiledProgram):
            with self._lock:
                self._use_stream(stream)
            return kern.prepare(tensors, scalars, stream=stream)
        return kern.prepare(tensors, scalars)

    def workspace(self, name: str, shape: tuple, dtype: str, stream: int = 0):
        """A zeroed device buffer kept for reuse (kernels that take a workspace leave it zeroed), one per
        stream: two launches in flight on different streams would otherwise share it (a split search's
        partial lists, counters and bounds)."""
        key = (name, tuple(shape), dtype, stream)
        with self._lock:
            self._use_stream(stream)
            w = self._workspaces.get(key)
            if w is None:
                from gpu_backend.memory import DeviceArray, synchronize
                w = DeviceArray.alloc(shape, dtype)
                w.fill_bits(0)
                synchronize()
                self._workspaces[key] = w
            return w

    def _use_stream(self, stream: int) -> None:
        """Mark `stream` as holding workspaces (lock held). Past MAX_STREAMS streams: synchronize the
        device (nothing in flight uses what is freed), free every other stream's workspaces and the
        Programs' pools, and forget the prepared launches that point into them."""
        if stream in self._streams:
            self._streams[stream] = self._streams.pop(stream)
            return
        self._streams[stream] = True
        if len(self._streams) <= MAX_STREAMS:
            return
        from gpu_backend.memory import synchronize
        from gpu_backend.runner import CompiledProgram
        synchronize()
        for key in [k for k in self._workspaces if k[3] != stream]:
            self._workspaces.pop(key).free()
        for k in self._kernels.values():
            if isinstance(k, CompiledProgram):
                k.drop_pools(keep=stream)
        self._prepared.clear()
        self.plans.clear()
        self._streams = {stream: True}


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
    variant's domain and turned into its per-call form (variants.PER_CALL: kNN's split options,
    tables/split_options/knn.json), else the general fallback."""
    from .variants import NAMES, SUPPORTS, region_table
    sup = SUPPORTS[op]
    if variant is not None:
        if not sup(variant, shape):
            raise ValueError(f"{op} variant {variant} does not support shape {shape}")
        return NAMES[op](variant), dict(variant)
    t = table(region_table(op, shape)) or table(op)   # a region without a fitted table uses the op's
    key = (op, tuple(sorted(shape.items())))
    hit = _CHOICES.get(key)
    if hit is not None and hit[0] is t:
        return hit[1], dict(hit[2])
    name, params = _pick(op, shape, t, sup)
    tuned = per_call_form(op, params, shape)
    if tuned != params:
        name, params = NAMES[op](tuned), tuned
    if len(_CHOICES) > 4096:
        _CHOICES.clear()
    _CHOICES[key] = (t, name, params)
    return name, dict(params)


def per_call_form(op: str, params: dict, shape: dict) -> dict:
    """The params a table pick runs with at `shape`: the op's fitted per-call options
    (variants.PER_CALL) where they give a form the variant's domain holds, else `params` itself. The
    sweep times this form too, so that the table is fitted on what the library runs."""
    from .variants import PER_CALL, SUPPORTS
    tuned = PER_CALL[op](params, shape) if op in PER_CALL else params
    return tuned if tuned != params and SUPPORTS[op](tuned, shape) else params


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
