"""The compiler's passes, listed in the one place that orders them.

    parse (io.load) -> expand (EXPAND_PASSES) -> verify (verifier) -> plan shared memory
    -> lower roles + emit CUDA C++ (lower.emit) -> NVRTC (nvrtc.compile) -> load and launch (gpu_backend)

Expansion passes turn sugar into explicit nodes before verification, keeping every original node at
its original path: a sugar statement becomes a `block` at the same index whose `origin` names it, and
generated declarations (barriers, prologue code) are appended after the author's.
"""
from __future__ import annotations

from ..diagnostics import Diagnostic
from ..nodes import Kernel
from .expand_pipelines import expand_pipelines
from .plan_smem import SmemPlan, plan_smem

EXPAND_PASSES = (expand_pipelines,)


def expand(kernel: Kernel) -> tuple[Kernel, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    k = kernel
    for p in EXPAND_PASSES:
        k, d = p(k)
        diags.extend(d)
    return k, diags


__all__ = ["EXPAND_PASSES", "expand", "expand_pipelines", "plan_smem", "SmemPlan"]
