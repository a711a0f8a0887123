"""Plan dynamic shared memory: buffer offsets (swizzled buffers 1024-byte aligned, as TMA and wgmma
descriptors need), mbarriers (8-byte aligned) and per-role reduction scratch."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import size
from ..nodes import Buffer, Kernel, MBarrier, Reduce, Scan
from ..walk import statements

SWIZZLE_ALIGN = 1024
DEFAULT_ALIGN = 128


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def row_pitch_elems(b: Buffer) -> int:
    return b.shape[-1] + (b.pad if b.layout == "row_major" else 0)


def stage_bytes(b: Buffer) -> int:
    """Bytes of one stage including row padding."""
    rows = 1
    for d in b.shape[:-1]:
        rows *= d
    return rows * row_pitch_elems(b) * size(b.dtype)


def stage_stride(b: Buffer) -> int:
    a = SWIZZLE_ALIGN if b.layout.startswith("swizzle") else 16
    return _align(stage_bytes(b), a)


@dataclass
class SmemPlan:
    offsets: dict[str, int] = field(default_factory=dict)      # buffer -> byte offset
    stage_strides: dict[str, int] = field(default_factory=dict)
    barrier_offsets: dict[str, int] = field(default_factory=dict)
    scratch_offsets: dict[str, int] = field(default_factory=dict)  # role -> reduction scratch offset
    total: int = 0

    def describe(self) -> list[tuple[str, int, int]]:
        rows = [(n, o, self.stage_strides[n]) for n, o in self.offsets.items()]
        rows += [(f"mbarrier {n}", o, 8) for n, o in self.barrier_offsets.items()]
        rows += [(f"scratch {n}", o, 256) for n, o in self.scratch_offsets.items()]
        return sorted(rows, key=lambda r: r[1])


SCRATCH_BYTES = 32 * 4 * 2  # 32 warps x (value, spare) floats for scope-wide reductions


def plan_smem(kernel: Kernel) -> SmemPlan:
    plan = SmemPlan()
    off = 0
    smem = [b for b in kernel.buffers if b.space == "smem"]
    # Swizzled buffers first so their 1024-byte alignment wastes nothing.
    for b in sorted(smem, key=lambda b: 0 if b.layout.startswith("swizzle") else 1):
        a = SWIZZLE_ALIGN if b.layout.startswith("swizzle") else DEFAULT_ALIGN
        off = _align(off, a)
        plan.offsets[b.name] = off
        plan.stage_strides[b.name] = stage_stride(b)
        off += plan.stage_strides[b.name] * b.stages
    for bar in kernel.barriers:
        if isinstance(bar, MBarrier):
            off = _align(off, 8)
            plan.barrier_offsets[bar.name] = off
            off += 8 * bar.count
    roles_needing = []
    for s in statements(kernel):
        if isinstance(s.node, (Reduce, Scan)):
            b = kernel.buffer(s.node.src.buf)
            if b is not None and b.scope in ("cta", "role", "warpgroup"):
                key = s.role.name if s.role is not None else "_prologue"
                if key not in roles_needing:
                    roles_needing.append(key)
    for key in roles_needing:
        off = _align(off, 16)
        plan.scratch_offsets[key] = off
        off += SCRATCH_BYTES
    plan.total = _align(off, 16) if off else 0
    return plan
