"""The structured record of one evaluation (what the evaluator, the worker pool and the agent log).

stage:  compile | test | profile        (the last stage reached)
status: ok | fail | error | timeout | crash | skipped
  fail     the candidate is wrong (compile diagnostics, wrong/unwritten/NaN output, cache cheat, ...)
  error    a call was refused or the harness failed (bad launch configuration, interface mismatch, ...)
  timeout  the watchdog killed the worker (hang, or too slow for the deadline)
  crash    a kernel fault killed the CUDA context (or the worker died); the worker was restarted
  skipped  never run: the caller stopped dispatching (e.g. the agent run's time budget was reached)
error_class: a stable short name (ERROR_CLASSES lists the usual ones).
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

Stage = Literal["compile", "test", "profile"]
Status = Literal["ok", "fail", "error", "timeout", "crash", "skipped"]

ERROR_CLASSES = {
    "compile_error": "the compiler rejected the program (diagnostics name the nodes)",
    "parse_error": "the candidate is not a valid IR document",
    "arch_mismatch": "the program needs features this GPU lacks",
    "interface": "the kernel's params do not match the task's tensors and scalars",
    "unsupported_shape": "a task shape breaks the kernel's declared scalar facts",
    "illegal_address": "a kernel fault: out-of-bounds or invalid memory access",
    "misaligned": "a kernel fault: misaligned memory access",
    "launch_failure": "a kernel fault reported as an unspecified launch failure",
    "launch_config": "the launch was refused (grid/block/shared memory)",
    "launch_out_of_resources": "too many registers or resources for the launch",
    "load_error": "the cubin could not be loaded",
    "hang": "no launch finished before the watchdog deadline (deadlock, or a very long kernel)",
    "too_slow": "launches finished but the evaluation exceeded its deadline during timing",
    "compile_timeout": "compilation exceeded the deadline",
    "wrong_result": "outputs outside the task's tolerance",
    "unwritten_output": "output elements still hold the poison pattern",
    "nan": "outputs contain NaN/Inf",
    "input_modified": "the kernel wrote to an input tensor",
    "cache_cheat": "correct on first inputs, wrong on fresh inputs at the same addresses (or after timing)",
    "worker_died": "the worker process exited without reporting (worker_killed_<signal> for a signal)",
    "trap": "a device-side assert or trap",
    "illegal_instruction": "a kernel fault: illegal instruction",
    "internal_error": "the harness raised (a bug here, not in the candidate)",
}


class ShapeResult(BaseModel):
    shape: dict[str, Any]
    run: int = 0                      # 0: first inputs; 1: fresh inputs at the same addresses
    seed: int
    ok: bool
    rel_rmse: Optional[float] = None
    max_abs: Optional[float] = None
    error_class: Optional[str] = None
    message: str = ""


class Timing(BaseModel):
    shape: dict[str, Any]
    ms_min: float
    ms_median: float
    ms_max: float
    reps: int
    warmup: int
    flush_bytes: int = 0
    launches_per_rep: int = 1
    tflops: Optional[float] = None    # at the median
    tbps: Optional[float] = None      # task bytes / median time
    rechecked: bool = False           # outputs of the timed runs checked against the reference


class EvalRecord(BaseModel):
    job_id: Optional[str] = None
    candidate: str = "?"
    task: str = "?"
    gpu: Optional[int] = None
    device: Optional[str] = None
    stage: Stage = "compile"
    status: Status = "error"
    error_class: Optional[str] = None
    message: str = ""
    node: Optional[str] = Field(default=None, description="IR node path where known")
    diagnostics: list[dict] = Field(default_factory=list)
    seed: Optional[int] = None
    max_rel_rmse: Optional[float] = None
    max_abs: Optional[float] = None
    shapes: list[ShapeResult] = Field(default_factory=list)
    timings: list[Timing] = Field(default_factory=list)
    compile: dict[str, Any] = Field(default_factory=dict)
    context_lost: bool = Field(default=False, description="a sticky CUDA error: the worker must restart")
    worker_pid: Optional[int] = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ms_median(self) -> Optional[float]:
        return self.timings[0].ms_median if self.timings else None

    def short(self) -> str:
        s = f"{self.candidate} on {self.task}: {self.stage}/{self.status}"
        if self.error_class:
            s += f" [{self.error_class}]"
        if self.node:
            s += f" at {self.node}"
        if self.timings:
            s += f" {self.timings[0].ms_median:.4f} ms"
        return s + (f" - {self.message}" if self.message and not self.ok else "")
