"""CUDA-event timing of a candidate's launches (docs: /shared/design/evaluation.md, "Timing").

`time_launches(launch, ...)` runs `warmup` untimed calls, then `reps` timed ones. Before every
repetition, outside the timed region, it calls `before_each` (the evaluator poisons the outputs there,
so the outputs left by the timed runs can be re-checked) and flushes L2 by writing a buffer larger
than L2 (`L2Flusher`, sized from the device's L2). A CUDA event pair brackets each repetition's
launch(es): `launch` may issue several kernels (preparation kernels included) and all of them are
timed. Returns min / median / max milliseconds.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

from .driver import check


@dataclass
class TimingStats:
    ms_min: float
    ms_median: float
    ms_max: float
    reps: int
    warmup: int
    flush_bytes: int
    samples: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"ms_min": self.ms_min, "ms_median": self.ms_median, "ms_max": self.ms_max, "reps": self.reps,
                "warmup": self.warmup, "flush_bytes": self.flush_bytes}


def summarize(samples: list[float], warmup: int = 0, flush_bytes: int = 0) -> TimingStats:
    if not samples:
        raise ValueError("no timing samples")
    return TimingStats(min(samples), statistics.median(samples), max(samples), len(samples), warmup,
                       flush_bytes, list(samples))


class Event:
    def __init__(self):
        from cuda.bindings import driver
        self.ev = check(driver.cuEventCreate(0), "cuEventCreate")  # CU_EVENT_DEFAULT: timing enabled

    def record(self, stream: int = 0):
        from cuda.bindings import driver
        check(driver.cuEventRecord(self.ev, driver.CUstream(stream)), "cuEventRecord")

    def synchronize(self):
        from cuda.bindings import driver
        check(driver.cuEventSynchronize(self.ev), "cuEventSynchronize")

    def elapsed_ms(self, start: "Event") -> float:
        from cuda.bindings import driver
        return float(check(driver.cuEventElapsedTime(start.ev, self.ev), "cuEventElapsedTime"))

    def destroy(self):
        from cuda.bindings import driver
        check(driver.cuEventDestroy(self.ev), "cuEventDestroy")


class L2Flusher:
    """A device buffer of `factor` x the L2 size; `flush()` rewrites all of it (cuMemsetD32Async),
    evicting whatever the previous repetition left in L2. One per process, allocated lazily."""

    _instances: dict = {}

    def __init__(self, l2_bytes: int, factor: int = 2):
        from .memory import DeviceArray
        self.nbytes = max(1 << 20, int(l2_bytes) * factor) // 4 * 4
        self.buf = DeviceArray.alloc((self.nbytes // 4,), "u32")
        self._n = 0

    @classmethod
    def for_device(cls, device: int = 0) -> "L2Flusher":
        if device not in cls._instances:
            from .driver import properties
            cls._instances[device] = cls(properties(device)["l2_bytes"])
        return cls._instances[device]

    def flush(self, stream: int = 0):
        self._n += 1
        self.buf.fill_bits(0x01010101 * (1 + self._n % 200), stream)


def time_launches(launch: Callable[[], None], *, warmup: int = 3, reps: int = 20,
                  flusher: Optional[L2Flusher] = None, before_each: Optional[Callable[[], None]] = None,
                  stream: int = 0) -> TimingStats:
    """Median-of-`reps` CUDA-event timing of everything `launch()` enqueues on `stream`."""
    from .memory import synchronize
    for _ in range(warmup):
        if before_each:
            before_each()
        launch()
    synchronize("warm-up")
    events = [(Event(), Event()) for _ in range(reps)]
    try:
        for start, end in events:
            if before_each:
                before_each()
            if flusher is not None:
                flusher.flush(stream)
            start.record(stream)
            launch()
            end.record(stream)
        events[-1][1].synchronize()
        synchronize("timed launches")
        samples = [end.elapsed_ms(start) for start, end in events]
    finally:
        for a, b in events:
            try:
                a.destroy()
                b.destroy()
            except Exception:  # noqa: BLE001 - a faulted context cannot destroy events
                pass
    return summarize(samples, warmup, flusher.nbytes if flusher else 0)


def copy_ceiling_tbps(nbytes: int = 1 << 30, device: int = 0, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second / 1e12): the memory roofline
    a bandwidth-bound kernel is compared with. Measured with the same protocol as candidates."""
    from cuda.bindings import driver

    from .driver import context
    from .memory import Arena
    context(device)
    with Arena() as arena:
        src, dst = arena.alloc((nbytes // 4,), "u32"), arena.alloc((nbytes // 4,), "u32")
        src.fill_bits(0x3F803F80)

        def copy():
            check(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, driver.CUstream(0)), "cuMemcpyDtoDAsync")

        st = time_launches(copy, warmup=3, reps=reps, flusher=L2Flusher.for_device(device))
    return 2 * nbytes / (st.ms_median * 1e-3) / 1e12
