"""Thin, checked access to the CUDA driver API (cuda.bindings.driver)."""
from __future__ import annotations

import functools


class CudaError(RuntimeError):
    def __init__(self, call: str, code):
        self.call, self.code = call, code
        super().__init__(f"{call} failed: {getattr(code, 'name', code)}")


def check(result, call: str = "cuda call"):
    """cuda.bindings returns (err, *values); raise on error, return the values."""
    from cuda.bindings import driver
    err, *vals = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(call, err)
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else tuple(vals)


@functools.lru_cache(maxsize=None)
def context(ordinal: int = 0):
    """Make the device's primary context current (the one torch and cupy use too)."""
    from cuda.bindings import driver
    check(driver.cuInit(0), "cuInit")
    dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev, ctx


def gpu_available() -> bool:
    try:
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:
        return False


def properties(ordinal: int = 0) -> dict:
    from cuda.bindings import driver
    dev, _ = context(ordinal)
    A = driver.CUdevice_attribute

    def attr(a):
        return check(driver.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")

    name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    major = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return {
        "name": name,
        "cc": (major, minor),
        "sms": attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "l2_bytes": attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        "smem_per_block_optin": attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        "clock_khz": attr(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        "driver": check(driver.cuDriverGetVersion(), "cuDriverGetVersion"),
    }


def arch_of(props: dict) -> str:
    major, minor = props["cc"]
    return {(9, 0): "sm_90a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89"}.get((major, minor), f"sm_{major}{minor}")
