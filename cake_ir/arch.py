"""Architecture facts: one table read by the verifier, the cost model and the lowering.

Limits are the hardware's (CUDA programming guide, PTX ISA); rates are starting points that
`calibration/` overwrites per GPU (see `cake_ir.cost.load_constants`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Arch = Literal["sm_80", "sm_86", "sm_89", "sm_90a"]
ARCHES: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90a")


@dataclass(frozen=True)
class ArchSpec:
    name: str
    cc: int                       # compute capability, e.g. 90
    sms: int                      # SM count of the reference part
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    smem_per_block_max: int       # bytes, opt-in dynamic limit
    smem_per_sm: int              # bytes
    smem_static_limit: int        # bytes usable without the opt-in attribute
    regs_per_sm: int
    max_regs_per_thread: int
    named_barriers: int
    max_cluster_size: int
    features: frozenset[str] = field(default_factory=frozenset)
    # Rates (starting points; calibration overwrites): bytes/s and FLOP/s for the whole GPU.
    hbm_bw: float = 1.5e12
    l2_bw: float = 4.0e12
    smem_bw_per_sm: float = 128 * 1.4e9
    mma_sync_flops: float = 312e12
    wgmma_flops: float = 0.0
    fp32_flops: float = 19.5e12
    sfu_ops: float = 1e12
    clock_hz: float = 1.4e9
    launch_overhead_s: float = 3e-6
    tma_latency_s: float = 1.0e-6
    cp_async_latency_s: float = 0.8e-6
    mbarrier_roundtrip_s: float = 0.2e-6
    # cycles per instruction of one warp's own stream when nothing else hides its dependences (the
    # cost model's serial term); modelled instructions, so it also absorbs their undercount of SASS
    warp_issue_cycles: float = 4.0
    # warp instructions one f32 shared-memory atomic add costs the issue term: there is no native one, the
    # GPU runs a compare-and-swap loop (load, add, CAS, test, branch; again when lanes collide). Fitted to
    # the H200 k-means sweep (bench/results/lib-sweep-kmeans-h200.json, 798 timings): at 2 (a plain red)
    # the model underpredicted the atomic variants 3.9x against 1.7x for the atomic-free ones and its
    # per-shape pick was 1.40x slower than the measured best; at 24 1.8x vs 1.7x, picks 1.048x
    smem_f32_atomic_instrs: float = 24.0
    l2_bytes: int = 40 * 2**20
    # registers are allocated per warp in units of 256, i.e. a thread's count rounds up to a multiple of 8
    reg_alloc_unit: int = 8


# Features: cp_async (sm_80+), ldmatrix, mma_sync_bf16, tma, mbarrier_tx, wgmma, setmaxnreg,
# cluster, stmatrix, fence_proxy_async, elect_sync, red_vector (red.global.add.v2 / .v4.f32).
_AMPERE = frozenset({"cp_async", "ldmatrix", "mma_sync_bf16", "mma_sync_tf32", "mbarrier"})
_HOPPER = _AMPERE | frozenset({"tma", "mbarrier_tx", "wgmma", "setmaxnreg", "cluster", "stmatrix",
                               "fence_proxy_async", "elect_sync", "bulk_copy", "red_vector"})

ARCH_TABLE: dict[str, ArchSpec] = {
    "sm_80": ArchSpec("sm_80", 80, 108, 1024, 2048, 32, 163 * 1024, 164 * 1024, 48 * 1024, 65536, 255,
                      16, 1, _AMPERE, hbm_bw=2.0e12, l2_bw=5.0e12, mma_sync_flops=312e12,
                      fp32_flops=19.5e12, clock_hz=1.41e9, l2_bytes=40 * 2**20),
    "sm_86": ArchSpec("sm_86", 86, 84, 1024, 1536, 16, 99 * 1024, 100 * 1024, 48 * 1024, 65536, 255,
                      16, 1, _AMPERE, hbm_bw=0.94e12, l2_bw=2.0e12, mma_sync_flops=142e12,
                      fp32_flops=40e12, clock_hz=1.7e9, l2_bytes=6 * 2**20),
    "sm_89": ArchSpec("sm_89", 89, 128, 1024, 1536, 24, 99 * 1024, 100 * 1024, 48 * 1024, 65536, 255,
                      16, 1, _AMPERE, hbm_bw=1.0e12, l2_bw=3.0e12, mma_sync_flops=330e12,
                      fp32_flops=82e12, clock_hz=2.5e9, l2_bytes=72 * 2**20),
    # H200 SXM: H100's SM with 4.8 TB/s HBM3e. Rates below are the anchors measured here
    # (copy 4.25 TB/s read+write, bf16 GEMM ~685-790 TFLOP/s); calibration refines them.
    "sm_90a": ArchSpec("sm_90a", 90, 132, 1024, 2048, 32, 227 * 1024, 228 * 1024, 48 * 1024, 65536, 255,
                       16, 8, _HOPPER, hbm_bw=4.25e12, l2_bw=10e12, smem_bw_per_sm=128 * 1.98e9,
                       mma_sync_flops=500e12, wgmma_flops=790e12, fp32_flops=67e12, sfu_ops=4.2e12,
                       clock_hz=1.98e9, l2_bytes=50 * 2**20),
}


def spec(arch: str) -> ArchSpec:
    return ARCH_TABLE[arch]


def has(arch: str, feature: str) -> bool:
    return arch in ARCH_TABLE and feature in ARCH_TABLE[arch].features


def with_overrides(arch: str, **values) -> ArchSpec:
    """A copy of an arch's spec with calibrated constants applied."""
    return replace(ARCH_TABLE[arch], **values)
