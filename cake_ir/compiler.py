"""End-to-end compile: load -> expand -> verify -> plan smem -> emit CUDA C++ -> NVRTC -> cubin.

`compile_kernel` never raises on a bad program: every problem comes back as diagnostics.
`compile_program` compiles each kernel of a Program (one cubin per kernel; the runtime launches
them in order); `compile_ir` picks the one that fits the node.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Union

from .diagnostics import Diagnostic
from .nodes import Kernel, Program


@dataclass
class CompileResult:
    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    cuda_source: Optional[str] = None
    line_map: dict[int, str] = field(default_factory=dict)   # C++ line -> IR node path
    cubin: Optional[bytes] = None
    kernel_name: Optional[str] = None
    signature: list[dict] = field(default_factory=list)      # kernel arguments, in order
    smem_bytes: int = 0
    resources: dict = field(default_factory=dict)            # registers, spills, stack, smem
    arch: Optional[str] = None
    cached: bool = False
    seconds: dict = field(default_factory=dict)              # verify / lower / nvrtc


def compile_kernel(kernel: Kernel, arch: Optional[str] = None, emit: str = "cubin",
                   verify_first: bool = True, use_cache: bool = True) -> CompileResult:
    """Compile a kernel. `arch` overrides kernel.arch (e.g. to check an sm_80 program for sm_90a).
    emit="cuda" stops after C++ generation (no NVRTC)."""
    from .lower import lower
    from .verifier import verify

    t0 = time.perf_counter()
    kernel = with_arch(kernel, arch)
    res = verify(kernel) if verify_first else None
    t1 = time.perf_counter()
    out = CompileResult(ok=False, arch=kernel.arch)
    out.seconds["verify"] = t1 - t0
    if res is not None:
        out.diagnostics.extend(res.diagnostics)
        if not res.ok:
            return out
        expanded = res.expanded
    else:
        from .passes import expand
        expanded, d = expand(kernel)
        out.diagnostics.extend(d)
    lowered = lower(expanded)
    out.diagnostics.extend(lowered.diagnostics)
    out.cuda_source, out.line_map = lowered.source, lowered.line_map
    out.kernel_name, out.signature, out.smem_bytes = lowered.kernel_name, lowered.signature, lowered.smem_bytes
    t2 = time.perf_counter()
    out.seconds["lower"] = t2 - t1
    if any(d.severity == "error" for d in lowered.diagnostics):
        return out
    if emit == "cuda":
        out.ok = True
        return out
    from .nvrtc import nvrtc_compile
    nv = nvrtc_compile(lowered.source, kernel.arch, lowered.line_map, lowered.kernel_name, use_cache=use_cache)
    out.cubin, out.resources, out.cached = nv.cubin, nv.resources, nv.cached
    out.diagnostics.extend(nv.diagnostics)
    out.seconds["nvrtc"] = time.perf_counter() - t2
    out.ok = nv.cubin is not None and not any(d.severity == "error" for d in nv.diagnostics)
    return out


@dataclass
class ProgramCompileResult:
    """compile_program's result: `ok` when every kernel compiled; `diagnostics` point into the program
    document (`/kernels/{i}/...`); `kernels` holds each kernel's own CompileResult (kernel paths)."""
    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    kernels: list[CompileResult] = field(default_factory=list)
    arch: Optional[str] = None
    seconds: dict = field(default_factory=dict)               # verify / lower / nvrtc, summed over kernels

    @property
    def cached(self) -> bool:
        return bool(self.kernels) and all(k.cached for k in self.kernels)


def with_arch(node: Union[Kernel, Program], arch: Optional[str]) -> Union[Kernel, Program]:
    """The kernel or program retargeted to `arch` (a program's every kernel too; None: unchanged)."""
    if not arch:
        return node
    if isinstance(node, Program):
        if arch == node.arch and all(k.arch == arch for k in node.kernels):
            return node
        return node.model_copy(update={"arch": arch, "kernels": [with_arch(k, arch) for k in node.kernels]})
    return node if node.arch == arch else node.model_copy(update={"arch": arch})


def compile_program(program: Program, arch: Optional[str] = None, emit: str = "cubin",
                    verify_first: bool = True, use_cache: bool = True) -> ProgramCompileResult:
    """Compile every kernel of a Program. `arch` overrides the program's and every kernel's arch.
    With `verify_first` the whole program is verified first (kernel and program rules) and nothing is
    compiled when it has errors; otherwise each kernel is only expanded and lowered."""
    from .verifier import prefix_diagnostic, verify

    program = with_arch(program, arch)
    out = ProgramCompileResult(ok=False, arch=program.arch)
    t0 = time.perf_counter()
    if verify_first:
        res = verify(program)
        out.diagnostics.extend(res.diagnostics)
        out.seconds["verify"] = time.perf_counter() - t0
        if not res.ok:
            return out
    for i, k in enumerate(program.kernels):
        # verified above (warnings already reported): each kernel only expands, lowers and compiles
        r = compile_kernel(k, emit=emit, verify_first=False, use_cache=use_cache)
        out.kernels.append(r)
        out.diagnostics.extend(prefix_diagnostic(d, i) for d in r.diagnostics)
        for stage, sec in r.seconds.items():
            out.seconds[stage] = out.seconds.get(stage, 0.0) + sec
        if not r.ok:
            return out   # a kernel that does not compile: the program cannot run; stop spending NVRTC time
    out.ok = True
    return out


def compiled_parts(res) -> list[CompileResult]:
    """The per-kernel results inside a compile result: [res] for a kernel, a program's kernels."""
    return res.kernels if isinstance(res, ProgramCompileResult) else [res]


def resource_summary(res) -> dict:
    """ptxas resources of a compile result, combined over a Program's kernels: registers and shared
    memory the largest (the kernels never co-reside), spills and stack summed, the kernel names."""
    parts = compiled_parts(res)
    regs = [p.resources["registers"] for p in parts if p.resources.get("registers") is not None]
    return {"registers": max(regs, default=None), "smem_bytes": max((p.smem_bytes for p in parts), default=0),
            "spill_store_bytes": sum(p.resources.get("spill_store_bytes", 0) for p in parts),
            "spill_load_bytes": sum(p.resources.get("spill_load_bytes", 0) for p in parts),
            "stack_bytes": sum(p.resources.get("stack_bytes", 0) for p in parts),
            "kernel_name": "+".join(p.kernel_name or "?" for p in parts)}


def compile_ir(node: Union[Kernel, Program], **kw):
    """compile_kernel for a Kernel, compile_program for a Program (same keyword arguments)."""
    return compile_program(node, **kw) if isinstance(node, Program) else compile_kernel(node, **kw)
