"""Shared-memory bandwidth and bank-conflict cost: lds / sts loops over resident smem tiles.

- smem_lds_wide: 8 warps lds a 64x128 f32 tile (16-byte vectors, row-contiguous: conflict-free)
  from alternating halves of a 128x128 buffer and add it into a register accumulator; one stg at
  the end keeps it live. The row offset depends on the loop variable and the loop is kept rolled
  (`unroll: 1`), so the compiler cannot hoist the loads out of the loop.
- smem_sts_wide: the same tile stored (sts) J times to alternating halves; read back once at the end.
- smem_lds_col_pad{0,1} / smem_lds_col_swz128: every warp reads one column of a 32x32 f32 buffer
  per lds (lane i reads row i: 4-byte accesses 128 bytes apart). pad 0: all lanes hit one bank
  (32-way conflict); pad 1: conflict-free; swizzle_128B: the XOR spreads a column over 8 banks
  (4-way conflict).

smem_bw_per_sm (bytes/s per SM) = lds bytes (as cake_ir.cost counts them) / (SMs x time), from
smem_lds_wide. The bank-conflict kernels inform no ArchSpec field (the cost model does not model
conflicts); `calibration.fit` reports their slowdown relative to pad 1 under "measured".
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, tile

from .base import Micro, TensorArg

ROWS, COLS_F32 = 64, 128     # the wide tile: 64 x 128 f32 = 32 KiB per lds of the whole tile


def lds_wide(name: str = "smem_lds_wide", store: bool = False, warps: int = 8):
    kb = KernelBuilder(name, arch="sm_90a", grid=["G"], threads=32 * warps,
                       note="smem bandwidth: " + ("sts" if store else "lds") + " loop over a resident tile")
    kb.const(R=ROWS)
    kb.scalar("G", min=1)
    kb.scalar("J", min=1)
    kb.tensor("Y", "f32", ["G * R", COLS_F32], access="write")
    kb.buffer("s", "smem", "f32", [2 * ROWS, COLS_F32])
    kb.buffer("x", "reg", "f32", [ROWS, COLS_F32], layout="blocked", vec=4, scope="cta")
    kb.buffer("acc", "reg", "f32", [ROWS, COLS_F32], layout="blocked", vec=4, scope="cta")
    with kb.role("main", warps=(0, warps)) as r:
        r.map("x", "tid * 0.001 + 1.0")
        r.sts(tile("x"), tile("s", [0, 0], [ROWS, COLS_F32]), vec_bytes=16)
        r.sts(tile("x"), tile("s", [ROWS, 0], [ROWS, COLS_F32]), vec_bytes=16)
        r.fill("acc", 0.0)
        r.sync("syncthreads")
        # '#pragma unroll 1': unrolled by 2 the two halves' addresses would be loop-invariant and the
        # compiler could hoist the loads (or sink the stores) out of the loop.
        with r.for_("j", 0, "J", unroll=1, id="loop"):
            if store:
                r.sts(tile("x"), tile("s", ["(j % 2) * R", 0], [ROWS, COLS_F32]), vec_bytes=16, id="sts")
            else:
                r.lds(tile("s", ["(j % 2) * R", 0], [ROWS, COLS_F32]), tile("x"), vec_bytes=16, id="lds")
                r.map("acc", "acc + x")
        r.sync("syncthreads")
        if store:
            r.lds(tile("s", [0, 0], [ROWS, COLS_F32]), tile("acc"), vec_bytes=16)
        r.stg(tile("acc"), tile("Y", ["bid.x * R", 0], [ROWS, COLS_F32]), vec_bytes=16)
    return kb.build()


def lds_column(name: str, layout: str = "row_major", pad: int = 0, warps: int = 8, unroll: int = 8):
    """Each warp lds one column (32 rows x 1 f32) of a 32x32 buffer per statement."""
    kb = KernelBuilder(name, arch="sm_90a", grid=["G"], threads=32 * warps,
                       note=f"bank conflicts: column reads of a 32x32 f32 buffer ({layout}, pad {pad})")
    kb.const(U=unroll)
    kb.scalar("G", min=1)
    kb.scalar("J", min=1)
    kb.tensor("Y", "f32", ["G * 32", warps], access="write")
    kb.buffer("s", "smem", "f32", [32, 32], layout=layout, pad=pad if layout == "row_major" else None)
    kb.buffer("init", "reg", "f32", [32, 32], layout="blocked", vec=4, scope="cta")
    kb.buffer("x", "reg", "f32", [32, 1], layout="blocked", vec=1, scope="warp")
    kb.buffer("acc", "reg", "f32", [32, 1], layout="blocked", vec=1, scope="warp")
    with kb.role("main", warps=(0, warps)) as r:
        r.map("init", "tid * 0.001 + 1.0")
        r.sts(tile("init"), tile("s"), vec_bytes=4)
        r.fill("acc", 0.0)
        r.sync("syncthreads")
        with r.for_("j", 0, "J", unroll=1, id="loop"):     # kept rolled: see lds_wide
            with r.for_("u", 0, "U", unroll=True):
                r.lds(tile("s", [0, "(j * U + u + role_warp) % 32"], [32, 1]), tile("x"), vec_bytes=4, id="lds")
                r.map("acc", "acc + x")
        r.stg(tile("acc"), tile("Y", ["bid.x * 32", "role_warp"], [32, 1]), vec_bytes=4)
    return kb.build()


def micros(sms: int, quick: bool = False) -> list[Micro]:
    out = []
    per_sm = 2
    G = per_sm * sms
    J = 512 if quick else 2048
    tile_bytes = ROWS * COLS_F32 * 4
    out.append(Micro(
        "smem_lds_wide", "smem", lds_wide(), {"G": G, "J": J},
        {"Y": TensorArg((G * ROWS, COLS_F32), "f32", "poison")},
        "rate_per_sm", ("smem_bw_per_sm",), work=1.0 * G * J * tile_bytes, unit="B/s/SM", flush_l2=False,
        description=f"lds.128 of a 64x128 f32 tile per iteration (conflict-free), {per_sm} CTAs x 8 warps "
                    f"per SM; lds bytes / (SMs x time)",
        extra={"ctas_per_sm": per_sm, "iterations": J}))
    out.append(Micro(
        "smem_sts_wide", "smem", lds_wide("smem_sts_wide", store=True), {"G": G, "J": J},
        {"Y": TensorArg((G * ROWS, COLS_F32), "f32", "poison")},
        "rate_per_sm", ("smem_bw_per_sm",), work=1.0 * G * J * tile_bytes, unit="B/s/SM", primary=False,
        flush_l2=False,
        description="sts.128 of a 64x128 f32 tile per iteration (conflict-free); sts bytes / (SMs x time)",
        extra={"ctas_per_sm": per_sm, "iterations": J}))

    warps, U = 8, 8
    # Iterations chosen so each variant runs about the same time (pad 0 is ~32x slower per lds).
    for name, layout, pad, J, ways in (("smem_lds_col_pad1", "row_major", 1, 2048 if quick else 8192, 1),
                                       ("smem_lds_col_swz128", "swizzle_128B", 0, 512 if quick else 2048, 4),
                                       ("smem_lds_col_pad0", "row_major", 0, 64 if quick else 256, 32)):
        work = 1.0 * G * warps * J * U * 32 * 4      # lds bytes as the cost model counts them
        out.append(Micro(
            name, "smem", lds_column(name, layout, pad, warps, U), {"G": G, "J": J},
            {"Y": TensorArg((G * 32, warps), "f32", "poison")},
            "rate_per_sm" if pad == 1 else "info", ("smem_bw_per_sm",) if pad == 1 else (), work=work,
            unit="B/s/SM", primary=False, flush_l2=False,
            allowed_warnings=frozenset({"W-PERF-01", "W-PERF-02"}),
            description=f"column lds (32 lanes x 4 B, row pitch {32 + pad} floats, {layout}): expected "
                        f"{ways}-way bank conflict; lds bytes / (SMs x time)",
            extra={"expected_conflict_ways": ways, "iterations": J, "compare_to": "smem_lds_col_pad1"}))
    return out
