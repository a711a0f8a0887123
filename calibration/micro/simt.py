"""SIMT and SFU throughput: element-wise map loops on per-thread register arrays.

- simt_fmul: 8 warps x 2 CTAs per SM; every thread loads 16 random fp32 values (from global: the
  compiler must not see them as equal, or it would fold the 16 chains into one), makes them
  positive, applies `x = x * 0.99999` J times (one FMUL each: no add to fuse into an FMA), then
  stores them.
- sfu_exp2: the same loop with `x = exp2(-x)` (what softmax uses; lowered to MUFU.EX2 plus a
  range-scaling FSETP/FSEL/2 FMUL, so still MUFU-bound; values converge to ~0.64).
- sfu_rsqrt: `x = rsqrt(x)` (MUFU.RSQ plus a denormal guard; values converge to 1): secondary.

cake_ir.cost charges `simt_ops / (fp32_flops / 2)` and `sfu_ops / sfu_ops_rate`, counting one op per
binary operator / SFU function per element, so:
    fp32_flops = 2 x (model-counted ops) / time     (the FMA FLOP rate when FMUL runs at FFMA rate)
    sfu_ops    = (model-counted SFU ops) / time
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, tile

from .base import Micro, TensorArg

VALS = 16


def map_loop(name: str, expr: str, warps: int = 8, unroll: int = 4):
    kb = KernelBuilder(name, arch="sm_90a", grid=["G"], threads=32 * warps,
                       note=f"element-wise throughput: x = {expr}")
    kb.scalar("G", min=1)
    kb.scalar("J", min=1)
    kb.tensor("X", "f32", [f"G * {32 * warps}", VALS])
    kb.tensor("Y", "f32", [f"G * {32 * warps}", VALS], access="write")
    kb.buffer("x", "reg", "f32", [1, VALS], scope="thread")
    with kb.role("main", warps=(0, warps)) as r:
        r.ldg(tile("X", [f"bid.x * {32 * warps} + tid", 0], [1, VALS]), tile("x"), vec_bytes=16)
        r.map("x", "abs(x) + 0.5")
        with r.for_("j", 0, "J", unroll=unroll, id="loop"):
            r.map("x", expr, id="op")
        r.stg(tile("x"), tile("Y", [f"bid.x * {32 * warps} + tid", 0], [1, VALS]), vec_bytes=16)
    return kb.build()


def micros(sms: int, quick: bool = False) -> list[Micro]:
    warps, per_sm = 8, 2
    G = per_sm * sms
    threads = G * 32 * warps
    out = []
    J = 4096 if quick else 16384
    out.append(Micro(
        "simt_fmul", "simt", map_loop("simt_fmul", "x * 0.99999"), {"G": G, "J": J},
        {"X": TensorArg((threads, VALS), "f32", "randn"), "Y": TensorArg((threads, VALS), "f32", "poison")},
        "rate", ("fp32_flops",), work=2.0 * threads * J * VALS, unit="FLOP/s", flush_l2=False,
        description=f"{VALS} independent FMUL chains per thread, {per_sm} CTAs x {warps} warps per SM; "
                    f"2 x ops / time",
        extra={"iterations": J}))
    J = 1024 if quick else 4096
    for name, expr, primary in (("sfu_exp2", "exp2(-x)", True), ("sfu_rsqrt", "rsqrt(x)", False)):
        out.append(Micro(
            name, "simt", map_loop(name, expr), {"G": G, "J": J},
            {"X": TensorArg((threads, VALS), "f32", "randn"), "Y": TensorArg((threads, VALS), "f32", "poison")},
            "rate", ("sfu_ops",), work=1.0 * threads * J * VALS, unit="op/s", flush_l2=False, primary=primary,
            description=f"{VALS} independent {expr} chains per thread, {per_sm} CTAs x {warps} warps per SM; "
                        f"SFU ops / time",
            extra={"iterations": J}))
    return out
