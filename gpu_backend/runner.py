"""Run a compiled kernel from device pointers and shapes: evaluate the grid, build TMA maps, launch.

No torch: a tensor argument is anything with `.ptr` and `.shape` (gpu_backend.memory.DeviceArray),
or with `.data_ptr()` and `.shape` (a torch tensor, still accepted for old scripts), or a
`(ptr, shape)` pair.

A `LaunchSpec` is everything needed to launch a cubin: its kernel name, the argument signature in the
lowering's format (`{"name", "kind": ptr|tmap|scalar, "dtype", ...}`), threads, dynamic shared memory,
the grid as index expressions over scalars and consts, and the tensor params' declared shapes (index
expressions) when known. `spec_from_kernel` builds one from CAKE IR + its CompileResult; a raw CUDA
candidate (gpu_backend.candidate.CudaCandidate) builds one directly.

A CAKE IR `Program` (several kernels in order on one stream) becomes a `ProgramSpec`: one LaunchSpec
per kernel plus the workspace tensors the runtime allocates. It shows the evaluator the same surface as
a LaunchSpec (signature, tensors, scalars, env, shape_problem) with the workspace left out: the task
passes only its own inputs, outputs and scalars. `CompiledKernel.from_spec` loads either.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from cake_ir import expr as E

from .module import LoadedKernel
from .tensormap import encode_tiled

IndexLike = Union[int, str]


def eval_index(e: IndexLike, env: Mapping[str, int]) -> int:
    return int(E.evaluate(E.parse_index(e), env))


@dataclass
class TensorDecl:
    dtype: str
    shape: Optional[list] = None          # index expressions; None = take the buffer's shape
    strides: Optional[list] = None        # index expressions; None = row-major contiguous
    access: str = "read"


@dataclass
class ScalarDecl:
    dtype: str
    min: Optional[int] = None
    max: Optional[int] = None
    divisible_by: int = 1

    def violation(self, value) -> Optional[str]:
        """Why `value` breaks the facts this kernel was proved under (None when it does not)."""
        if not isinstance(value, int):
            return None
        if self.min is not None and value < self.min:
            return f"{value} < min {self.min}"
        if self.max is not None and value > self.max:
            return f"{value} > max {self.max}"
        if self.divisible_by > 1 and value % self.divisible_by:
            return f"{value} is not divisible by {self.divisible_by}"
        return None


@dataclass
class LaunchSpec:
    kernel_name: str
    cubin: bytes
    signature: list[dict]
    threads: int
    smem_bytes: int
    grid: list[IndexLike]
    consts: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, TensorDecl] = field(default_factory=dict)
    scalars: dict[str, ScalarDecl] = field(default_factory=dict)
    cluster: Optional[list[int]] = None

    def env(self, scalars: Mapping[str, Any]) -> dict:
        env = dict(self.consts)
        env.update({k: int(v) for k, v in scalars.items() if isinstance(v, int) and not isinstance(v, bool)})
        return env

    def grid_dims(self, scalars: Mapping[str, Any]) -> list[int]:
        env = self.env(scalars)
        return [eval_index(g, env) for g in self.grid]

    def shape_problem(self, shapes: Mapping[str, list[int]], scalars: Mapping[str, Any]) -> Optional[str]:
        """Why these buffer shapes differ from the shapes the kernel declares (None if they match)."""
        env = self.env(scalars)
        for name, decl in self.tensors.items():
            if name in shapes and decl.shape is not None:
                want = [eval_index(s, env) for s in decl.shape]
                if list(shapes[name]) != want:
                    return f"{name}: the kernel declares shape {want}, the task's buffer has {list(shapes[name])}"
        return None


def scalar_decls(kernel) -> dict[str, ScalarDecl]:
    """The facts a CAKE IR Kernel declares for its scalar params (what a launch must satisfy); for a
    Program, every kernel's facts merged (a value must satisfy them all)."""
    from cake_ir.nodes import Program, ScalarParam
    if isinstance(kernel, Program):
        return merge_scalar_decls(scalar_decls(k) for k in kernel.kernels)
    return {p.name: ScalarDecl(p.dtype, p.min, p.max, p.divisible_by) for p in kernel.params
            if isinstance(p, ScalarParam)}


def merge_scalar_decls(decls) -> dict[str, ScalarDecl]:
    """One decl per scalar name holding the facts of every dict in `decls`: the largest min, the
    smallest max, the lcm of the divisors."""
    out: dict[str, ScalarDecl] = {}
    for ds in decls:
        for n, d in ds.items():
            o = out.get(n)
            if o is None:
                out[n] = ScalarDecl(d.dtype, d.min, d.max, d.divisible_by)
                continue
            o.min = d.min if o.min is None else (o.min if d.min is None else max(o.min, d.min))
            o.max = d.max if o.max is None else (o.max if d.max is None else min(o.max, d.max))
            o.divisible_by = math.lcm(o.divisible_by, d.divisible_by)
    return out


def spec_from_kernel(kernel, result) -> LaunchSpec:
    """A LaunchSpec from a CAKE IR Kernel and its (ok) CompileResult."""
    from cake_ir.nodes import TensorParam
    tensors = {p.name: TensorDecl(p.dtype, list(p.shape), list(p.strides) if p.strides else None, p.access)
               for p in kernel.params if isinstance(p, TensorParam)}
    scalars = scalar_decls(kernel)
    return LaunchSpec(result.kernel_name, result.cubin, list(result.signature), kernel.launch.threads,
                      result.smem_bytes, list(kernel.launch.grid), dict(kernel.consts), tensors, scalars,
                      list(kernel.launch.cluster) if kernel.launch.cluster else None)


def _ptr_shape(t) -> tuple[int, list[int]]:
    if isinstance(t, tuple) and len(t) == 2:
        return int(t[0]), [int(s) for s in t[1]]
    if hasattr(t, "ptr"):
        return int(t.ptr), [int(s) for s in t.shape]
    return int(t.data_ptr()), [int(s) for s in t.shape]


class ShapeMismatch(ValueError):
    pass


class CompiledKernel:
    """A loaded kernel: call it with tensors (DeviceArray / (ptr, shape) / torch) and scalar values.

    `CompiledKernel(kernel, compile_result)` (IR) or `CompiledKernel.from_spec(spec)`.
    """

    def __init__(self, kernel=None, result=None, device: int = 0, *, spec: Optional[LaunchSpec] = None):
        if spec is None:
            if not result.ok:
                raise RuntimeError("kernel did not compile: " + "; ".join(d.short() for d in result.diagnostics[:5]))
            spec = spec_from_kernel(kernel, result)
        self.kernel, self.result, self.spec = kernel, result, spec
        self.loaded = LoadedKernel.load(spec.cubin, spec.kernel_name, spec.smem_bytes, spec.threads,
                                        spec.signature, device)

    @classmethod
    def from_spec(cls, spec: Union[LaunchSpec, "ProgramSpec"], device: int = 0):
        """A CompiledKernel for a LaunchSpec, a CompiledProgram for a ProgramSpec."""
        if isinstance(spec, ProgramSpec):
            return CompiledProgram(spec, device)
        return cls(spec=spec, device=device)

    def env(self, scalars: Mapping[str, Any]) -> dict:
        return self.spec.env(scalars)

    def prepare(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any]):
        """(grid, void** args address, keep-alive) for these buffers and scalars; checks shapes
        against the declared ones and encodes TMA descriptors."""
        spec = self.spec
        env = spec.env(scalars)
        grid = [eval_index(g, env) for g in spec.grid]
        for i, c in enumerate(spec.cluster or []):   # compiled in (__cluster_dims__): the grid must tile by it
            if c > 1 and (i >= len(grid) or grid[i] % c):
                raise ShapeMismatch(f"grid {grid} is not a multiple of the cluster {spec.cluster} along dim {i}")
        ptrs, shapes = {}, {}
        for name, t in tensors.items():
            ptrs[name], shapes[name] = _ptr_shape(t)
        problem = spec.shape_problem(shapes, scalars)
        if problem:
            raise ShapeMismatch(problem)
        tmaps = {}
        for arg in spec.signature:
            if arg["kind"] != "tmap":
                continue
            name = arg["name"]
            decl = spec.tensors.get(name)
            strides = [eval_index(s, env) for s in decl.strides] if decl and decl.strides else None
            tmaps[name] = encode_tiled(ptrs[name], arg["dtype"], shapes[name], list(arg["box"]),
                                       arg.get("swizzle", "128B"), arg.get("oob_fill", "zero"), strides)
        scal = {a["name"]: scalars[a["name"]] for a in spec.signature if a["kind"] == "scalar"}
        addr, keep = self.loaded.pack_args(ptrs, scal, tmaps)
        return grid, addr, keep

    def launch_prepared(self, prepared, stream: int = 0) -> None:
        grid, addr, _keep = prepared
        self.loaded.launch(grid, addr, stream)

    def __call__(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any], stream: int = 0):
        prepared = self.prepare(tensors, scalars)
        self.launch_prepared(prepared, stream)
        return prepared[2]

    def unload(self) -> None:
        self.loaded.unload()


# ------------------------------------------------------------------------------------ programs
@dataclass
class ProgramSpec:
    """Everything needed to run a CAKE IR Program: its kernels' LaunchSpecs in launch order and its
    workspace tensors (name, TensorDecl with the shape over the scalars), which the runtime allocates."""
    name: str
    launches: list[LaunchSpec]
    workspace: list[tuple[str, TensorDecl]] = field(default_factory=list)

    @property
    def workspace_names(self) -> set[str]:
        return {n for n, _ in self.workspace}

    @property
    def kernel_name(self) -> str:
        return "+".join(ls.kernel_name for ls in self.launches)

    @property
    def signature(self) -> list[dict]:
        """The task-facing arguments: every kernel's, each name once (first occurrence), no workspace."""
        seen, out = self.workspace_names, []
        for ls in self.launches:
            for a in ls.signature:
                if a["name"] not in seen:
                    seen = seen | {a["name"]}
                    out.append(a)
        return out

    @property
    def tensors(self) -> dict[str, TensorDecl]:
        out: dict[str, TensorDecl] = {}
        for ls in self.launches:
            for n, d in ls.tensors.items():
                if n in self.workspace_names:
                    continue
                if n not in out:
                    out[n] = d
                elif out[n].access != d.access:   # read by one kernel, written by another
                    out[n] = TensorDecl(out[n].dtype, out[n].shape, out[n].strides, "readwrite")
        return out

    @property
    def scalars(self) -> dict[str, ScalarDecl]:
        """One decl per scalar holding every kernel's facts (a value must satisfy them all)."""
        return merge_scalar_decls(ls.scalars for ls in self.launches)

    def env(self, scalars: Mapping[str, Any]) -> dict:
        """The scalar values only: consts are per kernel (each launch's own env adds them)."""
        return {k: int(v) for k, v in scalars.items() if isinstance(v, int) and not isinstance(v, bool)}

    def grid_dims(self, scalars: Mapping[str, Any]) -> list[list[int]]:
        """Each kernel's grid, in launch order."""
        return [ls.grid_dims(scalars) for ls in self.launches]

    def workspace_shapes(self, scalars: Mapping[str, Any]) -> dict[str, list[int]]:
        env = self.env(scalars)
        return {n: [eval_index(s, env) for s in d.shape] for n, d in self.workspace}

    def shape_problem(self, shapes: Mapping[str, list[int]], scalars: Mapping[str, Any]) -> Optional[str]:
        """Why the task's buffers differ from what some kernel declares (workspace excluded)."""
        task = {n: s for n, s in shapes.items() if n not in self.workspace_names}
        for ls in self.launches:
            problem = ls.shape_problem(task, scalars)
            if problem:
                return f"kernel {ls.kernel_name}: {problem}"
        return None


def spec_from_program(program, result) -> ProgramSpec:
    """A ProgramSpec from a CAKE IR Program and its (ok) ProgramCompileResult."""
    launches = [spec_from_kernel(k, r) for k, r in zip(program.kernels, result.kernels)]
    ws = [(w.name, TensorDecl(w.dtype, list(w.shape), None, "readwrite")) for w in program.workspace]
    return ProgramSpec(program.name, launches, ws)


class WorkspacePool:
    """A Program's workspace buffers: one flat byte buffer per name, grown (x2, or to fit) when a larger
    shape needs more and otherwise reused, so a serving loop over many sequence lengths holds ~2x its
    largest workspace, not one buffer per shape. Not zeroed (the first kernel using a workspace writes
    it). Outgrown buffers are kept until `free`: launches prepared earlier (cakelib caches them) may
    still point into them."""

    def __init__(self, workspace: list[tuple[str, TensorDecl]]):
        self.decls = dict(workspace)
        self.buffers: dict[str, Any] = {}
        self.retired: list = []

    def get(self, shapes: Mapping[str, list[int]]) -> dict[str, tuple]:
        """(device pointer, shape) per workspace name for these shapes (allocating or growing)."""
        from .memory import SIZE, DeviceArray
        out = {}
        for name, shape in shapes.items():
            need = max(1, math.prod(shape)) * SIZE[self.decls[name].dtype]
            buf = self.buffers.get(name)
            if buf is None or buf.nbytes < need:
                if buf is not None:
                    self.retired.append(buf)
                grown = 2 * buf.nbytes if buf is not None else 0
                buf = self.buffers[name] = DeviceArray.alloc((max(need, grown),), "u8")
            out[name] = (buf.ptr, list(shape))
        return out

    def free(self) -> None:
        for w in list(self.buffers.values()) + self.retired:
            w.free()
        self.buffers, self.retired = {}, []


class CompiledProgram:
    """A loaded Program, used like a CompiledKernel: `prepare(tensors, scalars)` takes the workspace
    from its WorkspacePool (one pool per stream: launches in flight on two streams never share a
    workspace) and prepares every kernel; `launch_prepared` launches them in order on that stream
    (stream order makes a kernel's writes visible to the next).

    `CompiledProgram(spec)` or `CompiledProgram.from_ir(program, program_compile_result)`."""

    def __init__(self, spec: ProgramSpec, device: int = 0):
        self.spec, self.device = spec, device
        self.pools: dict[int, WorkspacePool] = {}
        self.kernels: list[CompiledKernel] = []
        try:
            for ls in spec.launches:
                self.kernels.append(CompiledKernel(spec=ls, device=device))
        except Exception:
            self.unload()
            raise

    @classmethod
    def from_ir(cls, program, result, device: int = 0) -> "CompiledProgram":
        if not result.ok:
            raise RuntimeError("program did not compile: " + "; ".join(d.short() for d in result.diagnostics[:5]))
        return cls(spec_from_program(program, result), device)

    def env(self, scalars: Mapping[str, Any]) -> dict:
        return self.spec.env(scalars)

    def pool(self, stream: int = 0) -> WorkspacePool:
        """The workspace pool of launches on `stream`."""
        p = self.pools.get(stream)
        if p is None:
            p = self.pools[stream] = WorkspacePool(self.spec.workspace)
        return p

    def drop_pools(self, keep: int) -> None:
        """Free the workspace pools of every stream but `keep` (the caller synchronized the device)."""
        for s in [s for s in self.pools if s != keep]:
            self.pools.pop(s).free()

    def prepare(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any], stream: int = 0):
        """(per-kernel prepared launches, workspace buffers): each kernel gets the task's tensors it
        names plus the workspace of `stream` (launch the result on that stream)."""
        problem = self.spec.shape_problem({n: _ptr_shape(t)[1] for n, t in tensors.items()}, scalars)
        if problem:
            raise ShapeMismatch(problem)
        ws = self.pool(stream).get(self.spec.workspace_shapes(scalars))
        every = {**tensors, **ws}
        prepared = []
        for ck in self.kernels:
            names = set(ck.spec.tensors) | {a["name"] for a in ck.spec.signature if a["kind"] in ("ptr", "tmap")}
            prepared.append(ck.prepare({n: t for n, t in every.items() if n in names}, scalars))
        return prepared, ws

    def launch_prepared(self, prepared, stream: int = 0) -> None:
        for ck, p in zip(self.kernels, prepared[0]):
            ck.launch_prepared(p, stream)

    def __call__(self, tensors: Mapping[str, Any], scalars: Mapping[str, Any], stream: int = 0):
        prepared = self.prepare(tensors, scalars, stream)
        self.launch_prepared(prepared, stream)
        return prepared

    def unload(self) -> None:
        for p in self.pools.values():
            p.free()
        self.pools = {}
        for ck in self.kernels:
            ck.unload()
        self.kernels = []
