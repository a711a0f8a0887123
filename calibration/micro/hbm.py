"""HBM bandwidth: streaming copies and reads through TMA, cp.async and plain ldg/stg.

The TMA and ldg kernels walk tiles grid-stride (tile = i * G + bid.x), so at any moment the CTAs
read neighbouring tiles; the cp.async ring walks a contiguous chunk per CTA (the verifier's bound
prover cannot show grid-stride look-ahead copies in bounds). Sizes: 1 GiB read per launch (256 MiB
with --quick), L2 flushed before every repetition. Copies are checked bit for bit (Y == X) after the
first launch and again after the timed launches.

- hbm_tma_copy: a producer warp fills an S-stage mbarrier pipeline with TMA loads of 128x64 bf16
  tiles (16 KiB); a consumer warp TMA-stores each tile to Y and releases the slot after the store
  has read it (tma_store_wait 0). Read + write, like a device-to-device copy.
- hbm_cp_async_copy: 8 warps run a cp.async ring (commit / wait_group S-2 / __syncthreads), then
  lds the tile into registers and stg it to Y.
- hbm_ldg_copy: 8 warps ldg a tile into registers and stg it (what the softmax rows do), loop
  unrolled x4 so several loads are in flight per thread.
- hbm_tma_read: TMA loads only (the consumer waits and releases): read bandwidth, informational.

hbm_bw (bytes/s) = the fastest of the three copies: (bytes read + bytes written) / time.
"""
from __future__ import annotations

from cake_ir.builder import KernelBuilder, bar, tile

from .base import Micro, TensorArg

GIB = 2**30
COLS = 64                 # bf16 columns per row: 128 bytes, one 128B-swizzle span


def _tiles(total_bytes: int, tile_bytes: int, G: int) -> int:
    """Tiles per CTA so that G CTAs move about `total_bytes`."""
    return max(1, -(-total_bytes // (tile_bytes * G)))


# ------------------------------------------------------------------------------------ kernels
def tma_stream(name: str, br: int = 128, stages: int = 4, store: bool = True, working_set: int = 0):
    """TMA producer warp + consumer warp over an mbarrier pipeline of `br`x64 bf16 tiles.

    store=True: the consumer TMA-stores each tile to Y (a copy). store=False: it only waits and
    releases (a read). working_set=W > 0: tiles are taken modulo the compile-time constant W (X holds
    W tiles), so a small W re-reads an L2-resident working set. (W is a const, not a scalar param,
    because the verifier's bound prover handles `% const` but not `% param`.)"""
    kb = KernelBuilder(name, arch="sm_90a", grid=["G"], threads=64,
                       note="TMA stream: producer warp, consumer warp, mbarrier pipeline")
    kb.const(BR=br, S=stages, **({"W": working_set} if working_set else {}))
    kb.scalar("G", min=1)
    kb.scalar("T", min=1)
    rows = "W * BR" if working_set else "G * T * BR"
    idx = "((i * G + bid.x) % W)" if working_set else "(i * G + bid.x)"
    kb.tensor("X", "bf16", [rows, COLS], tma={"box": [br, COLS], "swizzle": "128B"})
    if store:
        kb.tensor("Y", "bf16", [rows, COLS], access="write", tma={"box": [br, COLS], "swizzle": "128B"})
    kb.buffer("s", "smem", "bf16", [br, COLS], layout="swizzle_128B", stages=stages)
    kb.pipeline("p", stages=stages, mechanism="tma", producer="load", consumers=["drain"], buffers=["s"])
    with kb.role("load", warps=(0, 1)) as r:
        with r.if_("elect_one()"):
            with r.for_("i", 0, "T", id="load_loop"):
                r.pipe("acquire", "p", "i")
                r.copy("tma_load", tile("X", [f"{idx} * BR", 0], [br, COLS]), tile("s", slot="i % S"),
                       barrier=bar("p_full", "i % S"), scope="thread", id="tma_load")
                r.pipe("commit", "p", "i")
    with kb.role("drain", warps=(1, 1)) as r:
        with r.for_("i", 0, "T", id="drain_loop"):
            r.pipe("wait", "p", "i")
            if store:
                with r.if_("elect_one()"):
                    r.copy("tma_store", tile("s", slot="i % S"), tile("Y", [f"{idx} * BR", 0], [br, COLS]),
                           scope="thread", id="tma_store")
                    r.sync("tma_store_commit")
                    r.sync("tma_store_wait", n=0)
            r.pipe("release", "p", "i")
    return kb.build()


def cp_async_copy(br: int = 64, stages: int = 4, warps: int = 8):
    """cp.async ring of `br`x64 bf16 tiles (16-byte chunks), lds into a blocked register tile, stg.

    Each CTA copies a contiguous chunk of T tiles (tile = bid.x * T + i): the bound prover can show
    the ring's look-ahead copies stay in bounds for that indexing (not for grid-stride)."""
    kb = KernelBuilder("hbm_cp_async_copy", arch="sm_90a", grid=["G"], threads=32 * warps,
                       note="cp.async multistage ring, lds + stg copy")
    kb.const(BR=br, S=stages)
    kb.scalar("G", min=1)
    kb.scalar("T", min=stages, divisible_by=1)
    kb.tensor("X", "bf16", ["G * T * BR", COLS])
    kb.tensor("Y", "bf16", ["G * T * BR", COLS], access="write")
    kb.buffer("s", "smem", "bf16", [br, COLS], stages=stages)
    kb.buffer("x", "reg", "bf16", [br, COLS], layout="blocked", vec=8, scope="cta")
    with kb.role("main", warps=(0, warps)) as r:
        with r.for_("j", 0, stages - 1, unroll=True, id="prefill"):
            r.copy("cp_async", tile("X", ["(bid.x * T + j) * BR", 0], [br, COLS]), tile("s", slot="j"),
                   vec_bytes=16)
            r.sync("cp_async_commit")
        with r.for_("i", 0, "T", id="main_loop"):
            r.sync("cp_async_wait", n=stages - 2)
            r.sync("syncthreads")
            with r.if_("i + S - 1 < T"):
                r.copy("cp_async", tile("X", ["(bid.x * T + i + S - 1) * BR", 0], [br, COLS]),
                       tile("s", slot="(i + S - 1) % S"), vec_bytes=16, id="cp_async")
            r.sync("cp_async_commit")
            r.lds(tile("s", [0, 0], [br, COLS], slot="i % S"), tile("x"), vec_bytes=16, id="lds")
            r.stg(tile("x"), tile("Y", ["(bid.x * T + i) * BR", 0], [br, COLS]), vec_bytes=16, id="stg")
        r.sync("cp_async_wait", n=0)
    return kb.build()


def ldg_copy(br: int = 64, warps: int = 8, unroll: int = 4):
    """ldg a `br`x64 bf16 tile into a blocked register tile (16-byte vectors), stg it."""
    kb = KernelBuilder("hbm_ldg_copy", arch="sm_90a", grid=["G"], threads=32 * warps,
                       note="ldg/stg copy through registers")
    kb.const(BR=br)
    kb.scalar("G", min=1)
    kb.scalar("T", min=1)
    kb.tensor("X", "bf16", ["G * T * BR", COLS])
    kb.tensor("Y", "bf16", ["G * T * BR", COLS], access="write")
    kb.buffer("x", "reg", "bf16", [br, COLS], layout="blocked", vec=8, scope="cta")
    with kb.role("main", warps=(0, warps)) as r:
        with r.for_("i", 0, "T", unroll=unroll, id="loop"):
            r.ldg(tile("X", ["(i * G + bid.x) * BR", 0], [br, COLS]), tile("x"), vec_bytes=16, id="ldg")
            r.stg(tile("x"), tile("Y", ["(i * G + bid.x) * BR", 0], [br, COLS]), vec_bytes=16, id="stg")
    return kb.build()


def ldg_read(name: str, br: int = 32, warps: int = 8, unroll: int = 4, working_set: int = 0):
    """ldg tiles (i * G + bid.x), modulo the const W when working_set=W > 0, and add them into an f32
    register accumulator; one stg of the accumulator per CTA at the end keeps the loads live."""
    kb = KernelBuilder(name, arch="sm_90a", grid=["G"], threads=32 * warps,
                       note="ldg read stream into a register accumulator")
    kb.const(BR=br, **({"W": working_set} if working_set else {}))
    kb.scalar("G", min=1)
    kb.scalar("T", min=1)
    kb.tensor("X", "bf16", ["W * BR" if working_set else "G * T * BR", COLS])
    kb.tensor("Y", "f32", ["G * BR", COLS], access="write")
    kb.buffer("x", "reg", "bf16", [br, COLS], layout="blocked", vec=8, scope="cta")
    kb.buffer("acc", "reg", "f32", [br, COLS], layout="blocked", vec=8, scope="cta")
    with kb.role("main", warps=(0, warps)) as r:
        r.fill("acc", 0.0)
        with r.for_("i", 0, "T", unroll=unroll, id="loop"):
            idx = "((i * G + bid.x) % W)" if working_set else "(i * G + bid.x)"
            r.ldg(tile("X", [f"{idx} * BR", 0], [br, COLS]), tile("x"), vec_bytes=16, id="ldg")
            r.map("acc", "acc + x")
        r.stg(tile("acc"), tile("Y", ["bid.x * BR", 0], [br, COLS]), vec_bytes=16, id="stg")
    return kb.build()


# ------------------------------------------------------------------------------ microbenchmarks
def micros(sms: int, quick: bool = False) -> list[Micro]:
    total = (GIB // 4) if quick else GIB
    out = []

    # TMA copy: 16 KiB tiles, 4 stages (64 KiB smem), 3 CTAs per SM.
    br, S, per_sm = 128, 4, 3
    G = per_sm * sms
    T = _tiles(total, br * COLS * 2, G)
    rows = G * T * br
    out.append(Micro(
        "hbm_tma_copy", "hbm", tma_stream("hbm_tma_copy", br, S, store=True), {"G": G, "T": T},
        {"X": TensorArg((rows, COLS), "bf16", "randn"), "Y": TensorArg((rows, COLS), "bf16", "poison")},
        "rate", ("hbm_bw",), work=2.0 * rows * COLS * 2, unit="B/s", check="copy:X:Y",
        description=f"TMA load -> smem ({S}-stage mbarrier pipeline) -> TMA store; {br}x64 bf16 tiles, "
                    f"{per_sm} CTAs/SM; bytes read + written / time",
        extra={"tile_bytes": br * COLS * 2, "stages": S, "ctas_per_sm": per_sm}))

    # cp.async copy: 8 KiB tiles, 4 stages, 256 threads, 4 CTAs per SM.
    br, S, per_sm = 64, 4, 4
    G = per_sm * sms
    T = max(S, _tiles(total, br * COLS * 2, G))
    rows = G * T * br
    out.append(Micro(
        "hbm_cp_async_copy", "hbm", cp_async_copy(br, S), {"G": G, "T": T},
        {"X": TensorArg((rows, COLS), "bf16", "randn"), "Y": TensorArg((rows, COLS), "bf16", "poison")},
        "rate", ("hbm_bw",), work=2.0 * rows * COLS * 2, unit="B/s", check="copy:X:Y",
        description=f"cp.async ring ({S} stages, wait_group {S - 2}) -> lds -> stg; {br}x64 bf16 tiles, "
                    f"{per_sm} CTAs/SM of 256 threads; bytes read + written / time",
        extra={"tile_bytes": br * COLS * 2, "stages": S, "ctas_per_sm": per_sm}))

    # ldg/stg copy: 8 KiB tiles (two 16 B loads per thread), 4 CTAs of 256 threads per SM, loop
    # unrolled x4: 8 loads (128 B) in flight per thread, 128 KiB per SM.
    br, per_sm = 64, 4
    G = per_sm * sms
    T = _tiles(total, br * COLS * 2, G)
    rows = G * T * br
    out.append(Micro(
        "hbm_ldg_copy", "hbm", ldg_copy(br), {"G": G, "T": T},
        {"X": TensorArg((rows, COLS), "bf16", "randn"), "Y": TensorArg((rows, COLS), "bf16", "poison")},
        "rate", ("hbm_bw",), work=2.0 * rows * COLS * 2, unit="B/s", check="copy:X:Y",
        description=f"ldg 16 B vectors -> registers -> stg; {br}x64 bf16 tiles, {per_sm} CTAs/SM; "
                    f"bytes read + written / time",
        extra={"tile_bytes": br * COLS * 2, "ctas_per_sm": per_sm}))

    # TMA read only (no store): informational (reads alone can exceed the copy rate).
    br, S, per_sm = 128, 4, 3
    G = per_sm * sms
    T = _tiles(total, br * COLS * 2, G)
    W = G * T
    out.append(Micro(
        "hbm_tma_read", "hbm", tma_stream("hbm_tma_read", br, S, store=False),
        {"G": G, "T": T}, {"X": TensorArg((W * br, COLS), "bf16", "randn")},
        "rate", ("hbm_bw",), work=1.0 * W * br * COLS * 2, unit="B/s", primary=False,
        description="TMA loads only (consumer waits and releases); bytes read / time; read-only rate",
        extra={"tile_bytes": br * COLS * 2, "stages": S, "ctas_per_sm": per_sm}))
    return out
