"""Launch overhead: an empty kernel (one CTA of one warp whose role does nothing), timed exactly like
every other measurement (a CUDA-event pair around one launch, L2 flushed before it, median).

launch_overhead_s = that median: the fixed cost a timed launch pays on top of the kernel's work, which
is what cake_ir.cost adds once per launch. (`calibration.measure` also records the back-to-back
launch rate of the same kernel, informational.)
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder

from .base import Micro


def empty_kernel():
    kb = KernelBuilder("launch_empty", arch="sm_90a", grid=[1], threads=32, note="empty kernel")
    with kb.role("main", warps=(0, 1)):
        pass
    return kb.build()


def micros(sms: int, quick: bool = False) -> list[Micro]:
    return [Micro("launch_empty", "launch", empty_kernel(), {}, {}, "launch", ("launch_overhead_s",),
                  work=1.0, unit="s",
                  description="one empty CTA; median CUDA-event time of one launch (L2 flushed before it)",
                  extra={"back_to_back": 200})]
