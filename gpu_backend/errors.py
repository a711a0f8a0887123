"""Classify CUDA driver errors: the evaluator's error_class, and whether the context is lost.

After a "sticky" error (a kernel fault: illegal address, misaligned access, illegal instruction,
trap/assert, ...) the CUDA context is unusable for the rest of the process; the worker reports the job
and exits so the pool restarts it with a fresh context.
"""
from __future__ import annotations

from typing import Optional

# CUDA error name -> (error_class, sticky)
_CLASSES = {
    "CUDA_ERROR_ILLEGAL_ADDRESS": ("illegal_address", True),
    "CUDA_ERROR_MISALIGNED_ADDRESS": ("misaligned", True),
    "CUDA_ERROR_LAUNCH_FAILED": ("launch_failure", True),
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": ("illegal_instruction", True),
    "CUDA_ERROR_INVALID_PC": ("invalid_pc", True),
    "CUDA_ERROR_INVALID_ADDRESS_SPACE": ("invalid_address_space", True),
    "CUDA_ERROR_HARDWARE_STACK_ERROR": ("stack_error", True),
    "CUDA_ERROR_ASSERT": ("trap", True),
    "CUDA_ERROR_LAUNCH_TIMEOUT": ("hang", True),
    "CUDA_ERROR_CONTAINED": ("contained_fault", True),
    "CUDA_ERROR_TENSOR_MEMORY_LEAK": ("tensor_memory_leak", True),
    "CUDA_ERROR_ECC_UNCORRECTABLE": ("hardware_error", True),
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": ("hardware_error", True),
    "CUDA_ERROR_UNKNOWN": ("unknown_cuda_error", True),
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": ("launch_out_of_resources", False),
    "CUDA_ERROR_INVALID_VALUE": ("launch_config", False),
    "CUDA_ERROR_INVALID_IMAGE": ("load_error", False),
    "CUDA_ERROR_NO_BINARY_FOR_GPU": ("load_error", False),
    "CUDA_ERROR_INVALID_PTX": ("load_error", False),
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": ("load_error", False),
    "CUDA_ERROR_NOT_FOUND": ("load_error", False),
    "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED": ("load_error", False),
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": ("launch_config", False),
    "CUDA_ERROR_INVALID_CLUSTER_SIZE": ("launch_config", False),
    "CUDA_ERROR_OUT_OF_MEMORY": ("out_of_memory", False),
    "CUDA_ERROR_NO_DEVICE": ("no_device", False),
    "CUDA_ERROR_INVALID_DEVICE": ("no_device", False),
    "CUDA_ERROR_NOT_INITIALIZED": ("no_device", False),
}


def error_name(err) -> str:
    """The CUresult name of a CudaError / CUresult / string ('CUDA_ERROR_ILLEGAL_ADDRESS')."""
    code = getattr(err, "code", err)
    name = getattr(code, "name", None)
    if name is None:
        text = str(code)
        i = text.find("CUDA_ERROR_")
        name = text[i:].split()[0].rstrip(":,.)") if i >= 0 else text
    return str(name)


def classify(err) -> tuple[str, bool]:
    """(error_class, sticky) for a CUDA error; unknown names classify as 'cuda_error', not sticky."""
    name = error_name(err)
    if name in _CLASSES:
        return _CLASSES[name]
    return "cuda_error", False


def is_sticky(err) -> bool:
    return classify(err)[1]


def status_for(err) -> str:
    """crash for a fault that kills the context, error for a refused call."""
    return "crash" if is_sticky(err) else "error"


def signal_class(exitcode: Optional[int]) -> str:
    """error_class for a worker that died without reporting (negative exit code = signal)."""
    if exitcode is None:
        return "worker_died"
    if exitcode < 0:
        import signal
        try:
            return "worker_killed_" + signal.Signals(-exitcode).name.lower()
        except ValueError:
            return f"worker_killed_signal_{-exitcode}"
    return "worker_died"
