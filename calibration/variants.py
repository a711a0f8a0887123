"""Parametrised GEMM and softmax variants: the set bench/rank_variants.py ranks, and the small set
`calibration.run` measures to refine the constants.

Every variant is a CAKE IR kernel built by the seed programs' builders (tasks/gemm/programs.py,
tasks/softmax/programs.py) and compiled for sm_90a (the mma.sync GEMMs are sm_80 programs retargeted
with compile_kernel(arch="sm_90a"), exactly as bench/examples.py runs them on the H200).

`legal(...)` rejects configurations the builders cannot express (shape divisibility, resource
limits that are certain to fail); everything else is compiled, and a variant that does not verify
or compile is reported and skipped by the caller, never silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from cake_ir.nodes import Kernel

ARCH = "sm_90a"
SMEM_LIMIT = 227 * 1024


@dataclass
class Variant:
    name: str
    family: str                       # "gemm" | "softmax"
    make: Callable[[], Kernel]        # builds the kernel (already targeted at ARCH)
    params: dict
    shapes: list = field(default_factory=list)   # problem shapes to measure it at
    skip_reason: Optional[str] = None

    def kernel(self) -> Kernel:
        k = self.make()
        return k if k.arch == ARCH else k.model_copy(update={"arch": ARCH})


# ----------------------------------------------------------------------------------- GEMM
GEMM_SHAPES = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 8192, "N": 8192, "K": 4096}]


def _mma_smem(bm, bn, bk, stages):
    return (bm + bn) * bk * 2 * stages


def _mma_regs_per_thread(bm, bn, warps_m, warps_n):
    wm, wn = bm // warps_m, bn // warps_n
    return wm * wn // 32 + (wm * 16 + wn * 16) // 64 + 40


def gemm_mma_configs():
    """mma.sync: CTA tiles x K slab x stages x warp grids (warp tiles 32..64 x 32..128)."""
    out = []
    for bm, bn in ((128, 128), (128, 256), (256, 128), (64, 128), (128, 64)):
        for bk in (32, 64):
            for stages in (2, 3, 4):
                for wmg, wng in ((2, 4), (4, 2), (2, 2)):
                    out.append(dict(bm=bm, bn=bn, bk=bk, stages=stages, warps_m=wmg, warps_n=wng))
    return out


def gemm_mma_legal(bm, bn, bk, stages, warps_m, warps_n) -> Optional[str]:
    wm, wn = bm // warps_m, bn // warps_n
    if bm % (16 * warps_m) or bn % (8 * warps_n) or wm % 16 or wn % 16:
        return f"warp tile {wm}x{wn} is not a multiple of 16x16"
    if _mma_smem(bm, bn, bk, stages) > SMEM_LIMIT:
        return f"shared memory {_mma_smem(bm, bn, bk, stages)} B > {SMEM_LIMIT} B"
    if _mma_regs_per_thread(bm, bn, warps_m, warps_n) > 255:
        return f"warp tile {wm}x{wn} needs > 255 registers per thread"
    return None


# A spread of mma.sync configurations (the full product is ~90; these 16 cover tile size, K slab,
# stages and warp grid, each varied against a common baseline 128x128x32 s4 2x4).
GEMM_MMA_PICK = [
    (128, 128, 32, 4, 2, 4), (128, 128, 32, 2, 2, 4), (128, 128, 32, 3, 2, 4), (128, 128, 64, 3, 2, 4),
    (128, 128, 64, 2, 2, 4), (128, 128, 32, 4, 4, 2), (128, 128, 32, 4, 2, 2), (128, 256, 32, 3, 2, 4),
    (128, 256, 32, 4, 2, 4), (256, 128, 32, 3, 4, 2), (256, 128, 32, 4, 4, 2), (64, 128, 32, 4, 2, 4),
    (64, 128, 64, 3, 2, 2), (128, 64, 32, 4, 2, 2), (128, 64, 64, 4, 4, 2), (128, 256, 64, 2, 2, 4),
]


def gemm_wgmma_legal(bm, bn, bk, stages, consumers) -> Optional[str]:
    smem = (bm + bn) * bk * 2 * stages
    if smem > SMEM_LIMIT:
        return f"shared memory {smem} B > {SMEM_LIMIT} B"
    return None


def gemm_variants(shapes=None) -> list[Variant]:
    from tasks.gemm.programs import gemm_mma_sm80, gemm_wgmma_sm90a

    shapes = list(shapes or GEMM_SHAPES)
    out = []
    for bn in (128, 256):
        for stages in (3, 4, 5):
            for consumers in (1, 2):
                bm, bk = 64 * consumers, 64
                p = dict(bm=bm, bn=bn, bk=bk, stages=stages, consumers=consumers)
                out.append(Variant(f"gemm_wgmma_{bm}x{bn}x{bk}_s{stages}_c{consumers}", "gemm",
                                   (lambda p=p: gemm_wgmma_sm90a(**p)), dict(p, impl="wgmma"),
                                   [s for s in shapes if s["M"] % bm == 0 and s["N"] % bn == 0],
                                   gemm_wgmma_legal(**p)))
    for bm, bn, bk, stages, wmg, wng in GEMM_MMA_PICK:
        p = dict(bm=bm, bn=bn, bk=bk, stages=stages, warps_m=wmg, warps_n=wng)
        out.append(Variant(f"gemm_mma_{bm}x{bn}x{bk}_s{stages}_w{wmg}x{wng}", "gemm",
                           (lambda p=p: gemm_mma_sm80(**p)), dict(p, impl="mma_sync"),
                           [s for s in shapes if s["M"] % bm == 0 and s["N"] % bn == 0 and s["K"] >= bk * stages],
                           gemm_mma_legal(**p)))
    return out


# --------------------------------------------------------------------------------- softmax
SOFTMAX_M = 65536


def softmax_legal(n, warps, vec) -> Optional[str]:
    threads = 32 * warps
    if n % (threads * vec):
        return f"row of {n} does not split into {threads} threads x {vec}-element chunks"
    per_thread = n // threads
    if per_thread * 3 + 24 > 255:       # bf16 row + f32 row per thread (+ scalars)
        return f"{per_thread} elements per thread exceed the register file"
    return None


def softmax_kernel(n: int, warps: int, vec: int) -> Kernel:
    """tasks.softmax.programs.softmax_row with its row ldg/stg vector width matched to `vec`.

    softmax_row leaves vec_bytes at the default 16, which only verifies for vec=8 (8 bf16 = 16 B);
    for vec=4 each thread's contiguous run is 8 bytes and E-CPY-04 rejects the program. The seed
    builder is not ours to edit, so the width is set here (vec_bytes = 2 * vec, at most 16)."""
    from cake_ir.nodes import Kernel as K
    from tasks.softmax.programs import softmax_row

    doc = softmax_row(n, warps, vec).model_dump(by_alias=True, exclude_none=True)
    vb = min(16, 2 * vec)
    for role in doc["roles"]:
        for st in role["body"]:
            if st.get("op") in ("ldg", "stg"):
                st["vec_bytes"] = vb
    doc["name"] = f"softmax_row_n{n}_w{warps}_v{vec}"
    return K.model_validate(doc)


def softmax_variants(m: int = SOFTMAX_M) -> list[Variant]:
    out = []
    for n in (2048, 4096, 8192):
        for warps in (4, 8, 16):
            for vec in (4, 8):
                p = dict(n=n, warps=warps, vec=vec)
                out.append(Variant(f"softmax_n{n}_w{warps}_v{vec}", "softmax", (lambda p=p: softmax_kernel(**p)),
                                   dict(p), [{"M": m}], softmax_legal(**p)))
    return out


def all_variants(gemm_shapes=None, softmax_m: int = SOFTMAX_M) -> list[Variant]:
    return gemm_variants(gemm_shapes) + softmax_variants(softmax_m)


# ------------------------------------------------------------------------ refinement set
# calibration.run measures these (at shapes rank_variants does not use) to refine the constants.
REFINE_GEMM_SHAPE = {"M": 2048, "N": 2048, "K": 8192}
REFINE_SOFTMAX_M = 16384


def refine_set() -> list[Variant]:
    from tasks.gemm.programs import gemm_mma_sm80, gemm_wgmma_sm90a

    g = [REFINE_GEMM_SHAPE]
    s = [{"M": REFINE_SOFTMAX_M}]
    specs = [
        ("gemm_wgmma_128x256x64_s4_c2", "gemm", lambda: gemm_wgmma_sm90a(128, 256, 64, 4, 2), g),
        ("gemm_wgmma_64x128x64_s3_c1", "gemm", lambda: gemm_wgmma_sm90a(64, 128, 64, 3, 1), g),
        ("gemm_mma_128x128x32_s4_w2x4", "gemm", lambda: gemm_mma_sm80(128, 128, 32, 4, 2, 4), g),
        ("gemm_mma_128x256x32_s3_w2x4", "gemm", lambda: gemm_mma_sm80(128, 256, 32, 3, 2, 4), g),
        ("softmax_n4096_w8_v8", "softmax", lambda: softmax_kernel(4096, 8, 8), s),
        ("softmax_n2048_w4_v4", "softmax", lambda: softmax_kernel(2048, 4, 4), s),
        ("softmax_n8192_w16_v8", "softmax", lambda: softmax_kernel(8192, 16, 8), s),
    ]
    return [Variant(n, f, mk, {}, sh) for n, f, mk, sh in specs]
