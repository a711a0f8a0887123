"""End-to-end compile: load -> expand -> verify -> plan smem -> emit CUDA C++ -> NVRTC -> cubin.

`compile_kernel` never raises on a bad program: every problem comes back as diagnostics.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from .diagnostics import Diagnostic
from .nodes import Kernel


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
    if arch and arch != kernel.arch:
        kernel = kernel.model_copy(update={"arch": arch})
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
