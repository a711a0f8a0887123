"""What a microbenchmark is: a CAKE IR kernel, its launch values, its tensors, and how its measured
time becomes the value of ArchSpec constant(s).

Conversions (`Micro.kind`), with t = the median CUDA-event time of one launch and t_launch = the
measured launch overhead (the `launch` microbenchmark):

    launch       value = t                                        (seconds)
    rate         value = work / max(t - t_launch, t / 2)          (bytes/s or FLOP/s, whole GPU)
    rate_per_sm  value = work / (sms * max(t - t_launch, t / 2))  (bytes/s per SM)
    latency      value = max(t - t_launch, t / 2) / work - sum(constants in `subtract`)
                 (work = dependent iterations; seconds per iteration)
    info         no constant; recorded under "measured" (e.g. bank-conflict slowdowns)

`work` is counted the way cake_ir.cost counts it (tests/test_calibration.py checks this against
`cost.estimate(...).totals`), so a fitted constant makes the cost model reproduce the measurement
when that term binds. For SIMT work the model charges `simt_ops / (fp32_flops / 2)`, so the fp32
microbenchmark's work is 2 x its model-counted ops (an FMUL loop: one op = one instruction).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from cake_ir.nodes import Kernel

KINDS = ("launch", "rate", "rate_per_sm", "latency", "info")


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument: concrete shape, CAKE dtype and how to initialise it before timing.

    init: "randn" (N(0,1), rounded to the dtype), "ones", "zeros", or "poison" (an output: filled
    with the NaN poison pattern before the checked launch)."""

    shape: tuple[int, ...]
    dtype: str
    init: str = "randn"


@dataclass
class Micro:
    name: str
    family: str                          # hbm / l2 / smem / tensor / latency / sync / launch / simt
    kernel: Kernel
    shapes: dict                         # integer scalar params of the launch
    tensors: dict                        # name -> TensorArg
    kind: str                            # see KINDS
    informs: tuple = ()                  # ArchSpec fields this measurement is a candidate value for
    work: float = 0.0                    # bytes / FLOP / ops / iterations, see the module docstring
    unit: str = ""                       # unit of the converted value
    primary: bool = True                 # False: recorded, but not used to set `informs`
    subtract: tuple = ()                 # constants subtracted from a latency (already fitted ones)
    flush_l2: bool = True                # flush L2 before every timed repetition
    check: Optional[str] = None          # "copy:X:Y" -> Y must equal X bit for bit after a launch
    allowed_warnings: frozenset = frozenset()   # verifier warning codes this program provokes on purpose
    description: str = ""
    extra: dict = field(default_factory=dict)   # anything the report should carry (tile sizes, ...)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} not in {KINDS}")
        if self.kind in ("rate", "rate_per_sm", "latency") and not self.work > 0:
            raise ValueError(f"{self.name}: a {self.kind} microbenchmark needs work > 0")

    def describe(self) -> dict:
        return {"name": self.name, "family": self.family, "kind": self.kind, "informs": list(self.informs),
                "work": self.work, "unit": self.unit, "primary": self.primary, "subtract": list(self.subtract),
                "shapes": dict(self.shapes), "flush_l2": self.flush_l2, "description": self.description,
                **({"extra": self.extra} if self.extra else {})}


def effective_seconds(t: float, t_launch: float) -> float:
    """Kernel time with the launch overhead removed, never less than half the measured time (a noisy
    launch-overhead measurement must not blow a rate up)."""
    return max(t - max(t_launch, 0.0), 0.5 * t)


def convert(kind: str, t: float, work: float, *, t_launch: float = 0.0, sms: int = 1,
            subtract: float = 0.0, floor: float = 1e-9) -> Optional[float]:
    """The value a measurement of `kind` gives, or None when there is none (info, or t not usable).

    Latencies are clamped to at least `floor` x (t / work) so a value is always positive."""
    import math

    if kind == "info" or t is None or not (t > 0) or not math.isfinite(t):
        return None
    if kind == "launch":
        return t
    te = effective_seconds(t, t_launch)
    if kind == "rate":
        return work / te
    if kind == "rate_per_sm":
        return work / (max(1, sms) * te)
    if kind == "latency":
        per = te / work
        return max(per - subtract, max(floor, 0.05 * per))
    raise ValueError(kind)


def expected_seconds(kind: str, value: float, work: float, *, t_launch: float = 0.0, sms: int = 1,
                     subtract: float = 0.0) -> float:
    """The inverse of `convert`: the time a measurement of `kind` takes when its constant is `value`
    (used to synthesise measurements in tests; exact when the result exceeds 2 x t_launch)."""
    if kind == "launch":
        return value
    if kind == "rate":
        return work / value + t_launch
    if kind == "rate_per_sm":
        return work / (max(1, sms) * value) + t_launch
    if kind == "latency":
        return (value + subtract) * work + t_launch
    raise ValueError(kind)
