"""What the evaluator runs: a CAKE IR program (JSON text, dict, Kernel or Program) or, for baselines
and the fault corpus, a raw CUDA C++ kernel (`CudaCandidate`). `compile_candidate` turns any of them
into a `LaunchSpec` (cubin + launch description; a `ProgramSpec` for a Program), caching per process
on (content hash, arch, verify).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .runner import LaunchSpec, ProgramSpec, ScalarDecl, TensorDecl, spec_from_kernel, spec_from_program


class CudaCandidate(BaseModel):
    """A raw CUDA C++ kernel evaluated through the same path as IR (used for baselines and for faults
    the IR cannot express). The source must be self-contained (NVRTC has no CUDA headers here);
    bf16 tensors are `unsigned short` bit patterns. Arguments are passed in `signature` order."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["cuda"] = "cuda"
    name: str
    source: str
    kernel_name: str
    grid: list[Union[int, str]] = Field(description="index expressions over the scalars and consts")
    threads: int
    smem_bytes: int = 0
    signature: list[dict] = Field(description='[{"name", "kind": "ptr"|"scalar", "dtype"}] in argument order')
    consts: dict[str, int] = Field(default_factory=dict)
    arch: Optional[str] = Field(default=None, description="default: the device's arch")


@dataclass
class Compiled:
    ok: bool
    name: str = "?"
    spec: Optional[Union[LaunchSpec, ProgramSpec]] = None
    diagnostics: list[dict] = field(default_factory=list)   # Diagnostic.model_dump()s
    kernel: Any = None                                      # the IR Kernel or Program (None for CUDA)
    info: dict = field(default_factory=dict)                # registers, smem, cached, seconds, hash, arch
    error_class: Optional[str] = None                       # compile_error / parse_error / arch_mismatch


_ARCH_CC = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90}


def target_arch(kernel_arch: str, device_arch: str) -> Optional[str]:
    """The arch to compile for on this device, or None when the program cannot run here
    (sm_90a features need a compute-capability-9.0 part; older programs run on newer parts)."""
    if kernel_arch == device_arch:
        return kernel_arch
    if kernel_arch == "sm_90a":
        return device_arch if device_arch == "sm_90a" else None
    kc, dc = _ARCH_CC.get(kernel_arch), _ARCH_CC.get(device_arch)
    if kc is None or dc is None or dc < kc:
        return None
    return device_arch


def as_candidate(candidate) -> Union[CudaCandidate, Any, list]:
    """Normalise: CudaCandidate | Kernel | Program, or a list of diagnostic dicts when it does not parse."""
    from cake_ir.io import load
    from cake_ir.nodes import Kernel, Program
    if isinstance(candidate, (CudaCandidate, Kernel, Program)):
        return candidate
    if isinstance(candidate, (str, bytes)):
        try:
            raw = json.loads(candidate)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raw = None
        if isinstance(raw, dict) and raw.get("kind") == "cuda":
            return CudaCandidate.model_validate(raw)
    elif isinstance(candidate, dict) and candidate.get("kind") == "cuda":
        return CudaCandidate.model_validate(candidate)
    kernel, diags = load(candidate)
    if kernel is None:
        return [d.model_dump() for d in diags]
    return kernel


_CACHE: dict[tuple, Compiled] = {}


def _key(c, arch: str, verify: bool) -> tuple:
    if isinstance(c, CudaCandidate):
        h = hashlib.sha256(c.model_dump_json().encode()).hexdigest()[:16]
    else:
        from cake_ir.io import ir_hash
        h = ir_hash(c)
    return (h, arch, verify)


def compile_candidate(candidate, device_arch: str, verify: bool = True, use_cache: bool = True) -> Compiled:
    """Compile for `device_arch`. Never raises on a bad candidate: problems come back in Compiled."""
    c = as_candidate(candidate)
    if isinstance(c, list):
        return Compiled(False, diagnostics=c, error_class="parse_error")
    key = _key(c, device_arch, verify)
    if use_cache and key in _CACHE:
        hit = _CACHE[key]
        return Compiled(hit.ok, hit.name, hit.spec, hit.diagnostics, hit.kernel, {**hit.info, "cached": True},
                        hit.error_class)
    out = _compile_cuda(c, device_arch) if isinstance(c, CudaCandidate) else _compile_ir(c, device_arch, verify)
    out.info["hash"] = key[0]
    if use_cache:
        _CACHE[key] = out
    return out


def _compile_ir(node, device_arch: str, verify: bool) -> Compiled:
    """A Kernel or a Program compiled for the device; for a Program, info combines the kernels'
    resources (compiler.resource_summary) and lists each kernel's."""
    from cake_ir.compiler import ProgramCompileResult, compile_ir, compiled_parts, resource_summary, with_arch
    arch = target_arch(node.arch, device_arch)
    if arch is None:
        return Compiled(False, node.name, kernel=node, error_class="arch_mismatch", diagnostics=[{
            "code": "E-EVAL-ARCH", "severity": "error", "node": "/arch",
            "message": f"a {node.arch} program cannot run on this {device_arch} device"}])
    try:
        res = compile_ir(node, arch=arch, verify_first=verify)
    except OSError:  # two workers racing on the on-disk cubin cache: compile without it
        res = compile_ir(node, arch=arch, verify_first=verify, use_cache=False)
    diags = [d.model_dump() for d in res.diagnostics]

    def info_of(r) -> dict:
        s = resource_summary(r)
        return {"registers": s["registers"], "smem_bytes": s["smem_bytes"], "spill_bytes": s["spill_store_bytes"],
                "cached": r.cached, "seconds": r.seconds}
    info = {"arch": arch, **info_of(res)}
    program = isinstance(res, ProgramCompileResult)
    if program:
        info["kernels"] = [{"name": k.name, **info_of(r)} for k, r in zip(node.kernels, compiled_parts(res))]
    if not res.ok:
        return Compiled(False, node.name, kernel=node, diagnostics=diags, info=info, error_class="compile_error")
    target = with_arch(node, arch)
    spec = spec_from_program(target, res) if program else spec_from_kernel(target, res)
    return Compiled(True, node.name, spec, diags, node, info)


def _compile_cuda(c: CudaCandidate, device_arch: str) -> Compiled:
    from cake_ir.nvrtc import nvrtc_compile
    arch = c.arch or device_arch
    t0 = time.perf_counter()
    try:
        nv = nvrtc_compile(c.source, arch, {}, c.kernel_name)
    except OSError:  # a race on the on-disk cache (see _compile_ir)
        nv = nvrtc_compile(c.source, arch, {}, c.kernel_name, use_cache=False)
    diags = [d.model_dump() for d in nv.diagnostics]
    info = {"arch": arch, "registers": nv.resources.get("registers"), "smem_bytes": c.smem_bytes,
            "cached": nv.cached, "seconds": {"nvrtc": time.perf_counter() - t0}}
    if nv.cubin is None:
        return Compiled(False, c.name, diagnostics=diags, info=info, error_class="compile_error")
    tensors = {a["name"]: TensorDecl(a["dtype"]) for a in c.signature if a["kind"] in ("ptr", "tmap")}
    scalars = {a["name"]: ScalarDecl(a["dtype"]) for a in c.signature if a["kind"] == "scalar"}
    spec = LaunchSpec(c.kernel_name, nv.cubin, list(c.signature), c.threads, c.smem_bytes, list(c.grid),
                      dict(c.consts), tensors, scalars)
    return Compiled(True, c.name, spec, diags, None, info)


def first_error_node(diags: list[dict]) -> Optional[str]:
    for d in diags:
        if d.get("severity", "error") == "error":
            return d.get("node")
    return None
