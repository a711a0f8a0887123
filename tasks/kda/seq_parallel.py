"""Sequence-parallel KDA prefill: the two-pass Program with the recurrence split into segments.

The two-pass recurrence (two_pass.py) walks a sequence's chunks one after another: at T = 32768 and
H = 32 that is 2048 dependent steps of ~1 us on ~128 CTAs, one per SM, each SM mostly idle. The chunk
step is affine in the state, S' = M_c S + B_c with M_c = Diag(e^{G_C}) - KD^T W and B_c = KD^T A' V, so a
segment of L chunks maps its start state to M S + B with M = prod M_c (K x K) and B its zero-start end
state. Four kernels, one Program:

  prepare   two_pass.kda_prepare, unchanged (chunk-parallel).
  ends      grid [HV, N, SEGS * (V + K) / vs]: every segment but a sequence's last runs its L chunks
            twice over, as V-slices: from S = 0 with v (columns 0 .. V - 1: B), and from S = I with v = 0
            (columns V .. V + K - 1: M, since U = A' 0 = 0 leaves S' = M_c S), into workspace wsE.
  starts    grid [HV, N, V / 32], one warp per 8 state columns: S_0 = h0 (or 0), S_{j+1} = M_j S_j + B_j
            for the sequence's segments in order, each S_j into wsS. M_j S_j runs on bf16 tensor cores
            as hi + lo halves (Mh Sh + Mh Sl + Ml Sh, fp32 accumulation): error ~2^-16, as fp32 would be.
  outputs   grid [HV, N, SEGS * V / vs]: each segment's chunks from S_j (the recurrence's consumers,
            unchanged), storing o; a sequence's last segment stores ht.

The recurrence work is ~3x the two-pass (B, M, then outputs), spread over SEGS times more CTAs: it
pays where few long sequences leave SMs idle (H200, T = 32768: 2x at H = 8, a wash at H = 32, whose
128 two-pass CTAs already fill the GPU; docs/perf-log.md, the sequence-parallel recurrence).
Segment j of sequence n sits in segment slot gs(n) + j, gs(n) = (bos_n + n SEG) / SEG, SEG = L C tokens:
the same non-collision argument as the chunk slots (two_pass.py) with SEG for C, so T / SEG + N + 1 slots.
"""
from cake_ir.builder import KernelBuilder, tile
from cake_ir.nodes import Program, Workspace

from tasks.kda.chunked import C, PAD, consume, load_initial_state, store_final_state
from tasks.kda.programs import K, V, sequence_lets
from tasks.kda.two_pass import (COPIES, PREPARE_WARPS, STAGES, copy_tag, full_arrivals, kda_prepare,
                                load_slots, recurrence_kernel, slots, two_pass_problem, workspace)

SEG_CHUNKS = 64                     # L: 1024-token segments (a power of two, 2 .. 256)
STARTS_COLS = 32                    # state columns per CTA of the starts kernel (4 warps x 8)


def segment_workspace(seg_chunks: int) -> list[Workspace]:
    rows = f"{slots(seg_chunks * C)} * HV * {K}"   # segment slots
    return [Workspace(name="wsE", dtype="f32", shape=[rows, V + K]),     # [B | M] per segment and head
            Workspace(name="wsS", dtype="f32", shape=[rows, V])]         # start state per segment, [K, V]


def _segment_param(kb, name: str, seg_chunks: int, access: str = "read") -> None:
    """A kernel's param for segment workspace `name`, declared as segment_workspace has it."""
    w = next(w for w in segment_workspace(seg_chunks) if w.name == name)
    kb.tensor(name, w.dtype, list(w.shape), access=access)


def _segment_lets(r, slices: str, seg_chunks: int) -> None:
    """hv, n, the sequence (sequence_lets), segment j and V-slice sl of grid z, the slice's first column
    c0, the sequence's segment count nsg and this segment's slot gs."""
    sequence_lets(r, None)
    r.let("j", f"bid.z / {slices}")
    r.let("c0", f"(bid.z % {slices}) * VS")
    r.let("nsg", f"cdiv(nc, {seg_chunks})")
    r.let("gs", f"(bos + n * {seg_chunks * C}) / {seg_chunks * C} + j")


def kda_segment_ends(arch: str, vs: int, safe: bool, stages: int, consumers: int, seg_chunks: int,
                     copy: str = COPIES[0]):
    """The ends kernel (module docstring): B and M of every segment but each sequence's last."""
    gate = "safe" if safe else "softplus"
    tag = copy_tag(copy)
    slices = (V + K) // vs
    L = seg_chunks

    def extra(kb):
        _segment_param(kb, "wsE", L, "write")

    def lets(r):
        _segment_lets(r, str(slices), L)

    def load(r):
        lets(r)
        with r.if_("j + 1 < nsg"):
            load_slots(r, vs, stages, first=f"j * {L}", count=str(L), with_v="c0 < V", copy=copy)

    def end_state(r, cwn):
        r.stg(tile("S"), tile("wsE", [f"(gs * HV + hv) * {K}", "c0 + cw"], [K, cwn]), oob="mask",
              vec_bytes=4, id="store_segment_end")

    def cons(r):
        lets(r)
        with r.if_("j + 1 < nsg"):
            # S = 0 on the B columns, the identity's columns c0 - V + cw .. on the M columns
            consume(r, vs, consumers, stages, lets=False, first=f"j * {L}", count=str(L),
                    init=lambda r, cwn: r.map("S", "select(row() + V == c0 + cw + col(), 1, 0)"),
                    u_expr="select(c0 < V, U, 0)", store_o=False, final=end_state)

    return recurrence_kernel(f"kda_seg{L}_ends_vs{vs}_{gate}_p{stages}c{consumers}{tag}",
                             ["HV", "N", f"cdiv(T, {L * C}) * {slices}"],
                             f"sequence-parallel KDA prefill: segment transition and zero-start end state ({gate})",
                             arch, vs, safe, stages, consumers, load, cons, extra, copy=copy,
                             full=full_arrivals(copy, "c0 < V"))


def kda_segment_outputs(arch: str, vs: int, safe: bool, stages: int, consumers: int, seg_chunks: int,
                        copy: str = COPIES[0]):
    """The outputs kernel (module docstring): every segment from its start state; o, and ht at the end."""
    gate = "safe" if safe else "softplus"
    tag = copy_tag(copy)
    slices = V // vs
    L = seg_chunks

    def extra(kb):
        _segment_param(kb, "wsS", L)

    def lets(r):
        _segment_lets(r, str(slices), L)
        r.let("cnt", f"min(nc - j * {L}, {L})")

    def load(r):
        lets(r)
        with r.if_("j < max(nsg, 1)"):             # an empty sequence still stores ht = h0
            load_slots(r, vs, stages, first=f"j * {L}", count="cnt", copy=copy)

    def start_state(r, cwn):
        r.ldg(tile("wsS", [f"(gs * HV + hv) * {K}", "c0 + cw"], [K, cwn]), tile("S"), oob="zfill",
              vec_bytes=4, id="load_segment_start")

    def last_state(r, cwn):
        with r.if_("j + 1 >= nsg"):
            store_final_state(r, cwn)

    def cons(r):
        lets(r)
        with r.if_("j < max(nsg, 1)"):
            consume(r, vs, consumers, stages, lets=False, first=f"j * {L}", count="cnt", init=start_state,
                    final=last_state)

    return recurrence_kernel(f"kda_seg{L}_outputs_vs{vs}_{gate}_p{stages}c{consumers}{tag}",
                             ["HV", "N", f"cdiv(T, {L * C}) * {slices}"],
                             f"sequence-parallel KDA prefill: outputs of each segment from its start state ({gate})",
                             arch, vs, safe, stages, consumers, load, cons, extra, copy=copy)


def kda_segment_starts(arch: str, seg_chunks: int):
    """The starts kernel (module docstring): the segments' start states, in order, per (head, sequence)
    and 32 state columns; warp w owns columns c0 + 8 w .. + 8 of S in registers (mma accumulator)."""
    L = seg_chunks
    cwn = STARTS_COLS // 4
    kb = KernelBuilder(f"kda_seg{L}_starts", arch=arch, grid=["HV", "N", V // STARTS_COLS], threads=128,
                       note="sequence-parallel KDA prefill: segment start states S_{j+1} = M_j S_j + B_j")
    kb.const(K=K, V=V, C=C)
    for n in ("T", "N", "H", "HV"):
        kb.scalar(n, min=1)
    for n in ("VK", "H0"):
        kb.scalar(n, min=0, max=1)
    kb.tensor("h0", "f32", ["N", "HV", "V", "K"])
    kb.tensor("cu_seqlens", "i32", ["N + 1"])
    _segment_param(kb, "wsE", L)
    _segment_param(kb, "wsS", L, "write")
    for n in ("sMh", "sMl"):
        kb.buffer(n, "smem", "bf16", [K, K], pad=PAD)
    for n in ("sSh", "sSl"):
        kb.buffer(n, "smem", "bf16", [K, STARTS_COLS], pad=PAD)
    for n in ("S", "Sl"):
        kb.buffer(n, "reg", "f32", [K, cwn], layout="mma_acc", scope="warp", role="comb")
    kb.buffer("Sb", "reg", "bf16", [K, cwn], layout="mma_acc", scope="warp", role="comb")
    v4 = dict(layout="blocked", vec=4, scope="warp", role="comb")
    kb.buffer("mx", "reg", "f32", [8, K], **v4)
    kb.buffer("mh", "reg", "bf16", [8, K], **v4)
    kb.buffer("ml", "reg", "f32", [8, K], **v4)
    for n in ("ah", "al"):
        kb.buffer(n, "reg", "bf16", [K, 16], layout="mma_a", scope="warp", role="comb")
    for n in ("bh", "bl"):
        kb.buffer(n, "reg", "bf16", [cwn, 16], layout="mma_b", scope="warp", role="comb")
    with kb.role("comb", warps=(0, 4)) as r:
        sequence_lets(r, str(STARTS_COLS))
        r.let("cw", f"role_warp * {cwn}")
        r.let("nsg", f"cdiv(nc, {L})")
        r.let("gs0", f"(bos + n * {L * C}) / {L * C}")
        load_initial_state(r, cwn)
        r.stg(tile("S"), tile("wsS", [f"(gs0 * HV + hv) * {K}", "c0 + cw"], [K, cwn]), oob="mask",
              vec_bytes=4, id="store_first_start")
        with r.for_("j", 0, "max(nsg - 1, 0)", id="segments"):
            r.let("erow", f"((gs0 + j) * HV + hv) * {K}")
            # M_j into shared memory as bf16 hi + lo; warp w converts rows 32 w .. 32 w + 31
            for rb in range(4):
                r.ldg(tile("wsE", [f"erow + role_warp * 32 + {rb * 8}", V], [8, K]), tile("mx"), oob="zfill",
                      vec_bytes=16)
                r.map("mh", "mx")
                r.map("ml", "mx - mh")
                r.sts(tile("mh"), tile("sMh", [f"role_warp * 32 + {rb * 8}", 0], [8, K]), vec_bytes=8)
                r.sts(tile("ml"), tile("sMl", [f"role_warp * 32 + {rb * 8}", 0], [8, K]), vec_bytes=8)
            # S_j as bf16 hi + lo (this warp's columns)
            r.map("Sb", "S")
            r.map("Sl", "S - Sb")
            r.sts(tile("Sb"), tile("sSh", [0, "cw"], [K, cwn]), vec_bytes=4)
            r.sts(tile("Sl"), tile("sSl", [0, "cw"], [K, cwn]), vec_bytes=4)
            r.sync("syncthreads")
            # S_{j+1} = B_j + M_j S_j
            r.ldg(tile("wsE", ["erow", "c0 + cw"], [K, cwn]), tile("S"), oob="zfill", vec_bytes=4,
                  id="load_segment_end")
            for kk in range(K // 16):
                r.ldmatrix(tile("sMh", [0, kk * 16], [K, 16]), tile("ah"))
                r.ldmatrix(tile("sMl", [0, kk * 16], [K, 16]), tile("al"))
                r.ldmatrix(tile("sSh", [kk * 16, "cw"], [16, cwn]), tile("bh"), trans=True)
                r.ldmatrix(tile("sSl", [kk * 16, "cw"], [16, cwn]), tile("bl"), trans=True)
                r.mma_sync(tile("ah"), tile("bh"), tile("S"))
                r.mma_sync(tile("ah"), tile("bl"), tile("S"))
                r.mma_sync(tile("al"), tile("bh"), tile("S"))
            r.stg(tile("S"), tile("wsS", [f"erow + HV * {K}", "c0 + cw"], [K, cwn]), oob="mask", vec_bytes=4,
                  id="store_start")
            r.sync("syncthreads")          # every warp is done with sM / sS before the next segment's
    return kb.build()


def kda_seq_parallel(arch: str = "sm_90a", vs: int = 32, safe: bool = True, warps: int = PREPARE_WARPS,
                     stages: int = STAGES, consumers: int = 4, seg_chunks: int = SEG_CHUNKS,
                     copy: str = COPIES[0]) -> Program:
    """The four kernels as one Program (`copy`: the loaders' copy mechanism, two_pass.COPIES)."""
    why = two_pass_problem(vs, safe, warps, stages, consumers, seg_chunks, copy, arch)
    if why:
        raise ValueError(why)
    gate = "" if safe else "_softplus"
    tag = copy_tag(copy)
    return Program(
        name=f"kda_seq_parallel{seg_chunks}_vs{vs}{gate}_w{warps}_p{stages}c{consumers}{tag}", arch=arch,
        workspace=workspace(copy) + segment_workspace(seg_chunks),
        kernels=[kda_prepare(arch, safe, warps, copy),
                 kda_segment_ends(arch, vs, safe, stages, consumers, seg_chunks, copy),
                 kda_segment_starts(arch, seg_chunks),
                 kda_segment_outputs(arch, vs, safe, stages, consumers, seg_chunks, copy)],
        note="chunked KDA prefill, sequence-parallel: prepare, segment ends (B, M), start states, outputs")
