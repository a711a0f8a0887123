"""Chunked (WY-form) KDA prefill on tensor cores, FlashKDA's algorithm in CAKE IR:
`kda_chunk16_ws(vs, safe)`, one gate form per build (its SAFE fact is fixed).

Per chunk of C = 16 tokens (G = cumulative gate inside the chunk, every exponent anchored at the chunk
start; q, k L2-normalised in the kernel, q scaled by K^-1/2):

    QG = q e^G,  KG = k e^G,  KD = k e^{G_C - G}
    Akk = Diag(beta) tril_<(k_i . k_j e^{G_i - G_j}),  Aqk = tril_<=(q_i . k_j e^{G_i - G_j})
    A' = (I + Akk)^-1 Diag(beta) = (I - L)(I + L^2)(I + L^4)(I + L^8) Diag(beta)   (L strictly lower)
    W = A' KG,  U = A' v;  Vn = U - W S;  O = QG S + Aqk Vn;  S = Diag(e^{G_C}) S + KD^T Vn

mma operands are bf16 (FlashKDA's choice; bench/kda_chunk_precision.py: o 3.9e-3 against the 5e-3
bar). Safe gate: the Gram factors as KG KI^T with KI = k e^{-G} (G >= 16 * -5 = -80: inside the
bf16/fp32 range), 0.81 ms at T = 8192, H = 32 on the H200 against fla chunk_kda's 1.2-1.7 ms. Softplus
gate: every Gram entry on the tensor cores too, anchored per level so that every factor is <= 1
(`_prepare_softplus`), 1.81 ms there against fla's 1.41 (docs/perf-log.md, KDA softplus on the tensor
cores; the explicit diagonal blocks it replaced took 3.7 ms).
"""
from typing import Optional

from cake_ir.builder import KernelBuilder, bar, tile

from tasks.kda.programs import L2_EPS, K, V, gate_expr, prefill_interface, sequence_lets

C = 16
VS = 32


P = 4          # producer warps: each prepares whole chunks (c = p, p + P, ...) into its own slot
HALF = C // 2  # a producer handles the q / k rows of a chunk in two halves (registers)


def point_problem(vs: int, safe: bool = True, producers: int = P, consumers: int = 4) -> Optional[str]:
    """Why (vs, gate form, producers, consumers) does not build, or None. The search's families use it
    too (tasks/kda/programs.py)."""
    if vs not in (32, 64, 128):
        return f"vs must be 32, 64 or 128, not {vs}"
    if not safe and vs == 128:
        return "the softplus form keeps more per-producer buffers: V-slice 32 or 64"
    if not 1 <= producers <= 4:
        return f"producers (slots in flight) must be 1 .. 4, not {producers}"
    if consumers not in (1, 2, 4, 8) or vs % (8 * consumers):
        return (f"consumers must split the {vs} state columns into multiples of 8 (1, 2, 4 or 8 warps), "
                f"not {consumers}")
    return None


def kda_chunk16_ws(arch: str = "sm_80", vs: int = VS, safe: bool = True, producers: int = P, consumers: int = 4):
    """The chunked algorithm of the module docstring, warp-specialised so that the per-chunk chain is
    not serial:

    producers (warps 0 .. P-1, P = `producers`, default 4): warp p prepares chunks p, p + P, ... alone.
        Lane l owns channels 4l..4l+3 of every token: the gate of the 16 tokens and its cumulative sum
        down the tokens, then, 8 tokens at a time, the q / k norms (one shuffle tree for 16 rows), KG and
        KI into its private buffers (over the raw chunk) and QG, KD into slot p; then Aqk = tril(QG KI^T),
        A' = (I + Akk)^-1 Diag(beta) and W = A' KG into slot p, with e^{G_C}; v goes into the slot
        directly (cp.async). It waits `empty[p]` before touching the slot and arrives on `full[p]`.
    consumers (`consumers` warps, default 4): warp w keeps the state columns c0 + w vs/NC .. + vs/NC for
        all K rows (an fp32 mma accumulator S [128, vs / NC]); per chunk, in order, it waits
        `full[c % P]`, then U = A' V, Vn = U - W S, O = QG S + Aqk Vn (stored),
        S = Diag(e^{G_C}) S + KD^T Vn, and arrives on `empty[c % P]`. No consumer reads another's
        columns: no CTA barrier in the loop.
    P chunks are in flight per CTA, so one producer's chain (loads, norms, the inverse) overlaps the
    other producers' and the consumers' state updates. A producer's chain is what binds (one producer
    warp per scheduler, each instruction waiting on the last: the cost model's serial term); 2 producers
    + 2 consumers halve a CTA's shared memory and registers, so that two CTAs share an SM.

    `vs` (32, 64 or 128) is the V-slice of a CTA: V / vs CTAs per (value head, sequence) each redo the
    producers' work, so a small vs fills the GPU at small HV * N and a large one does less work twice.
    `safe` picks the gate form (the SAFE scalar is fixed to it). The softplus gate has no lower bound, so
    e^{-G} may overflow and the factorised Gram KG KI^T is not usable: `_prepare_softplus` builds Akk
    and Aqk from four anchored tensor-core products (one per level of 8 / 4 / 2 / 1-token halves) plus
    Aqk's diagonal. Everything else (QG, KD, W, the consumers) only ever uses factors <= 1 and is shared
    with the safe form.
    """
    why = point_problem(vs, safe, producers, consumers)
    if why:
        raise ValueError(why)
    P, NC = producers, consumers
    gate = "safe" if safe else "softplus"
    shape_tag = "" if (P, NC) == (4, 4) else f"_p{P}c{NC}"
    kb = KernelBuilder(f"kda_chunk16_ws_vs{vs}" + ("" if safe else "_softplus") + shape_tag, arch=arch,
                       grid=["HV", "N", V // vs], threads=32 * (P + NC),
                       note=f"chunked KDA prefill, warp-specialised ({gate} gate), V-slice {vs}")
    kb.const(K=K, V=V, C=C, VS=vs, P=P)
    prefill_interface(kb, safe=safe)
    producer_buffers(kb, safe, P)
    slot_buffers(kb, vs, P)
    consumer_buffers(kb, vs, NC)
    kb.mbarrier("full", arrivals=32, count=P)
    kb.mbarrier("empty", arrivals=32 * NC, count=P)
    with kb.prologue.if_("tid == 0"):
        for i in range(P):
            kb.prologue.mbar_init(bar("full", i), 32)
            kb.prologue.mbar_init(bar("empty", i), 32 * NC)
    kb.prologue.fence("mbarrier_init")
    kb.prologue.sync("syncthreads")

    with kb.role("prod", warps=(0, P)) as r:
        sequence_lets(r, "VS")
        r.let("p", "role_warp")
        r.ldg(tile("A_log", ["hv"], [1]), tile("al"), vec_bytes=4)
        r.ldg(tile("dt_bias", ["hv", 0], [1, K]), tile("dbt"), vec_bytes=16)
        with r.for_("c", "p", "nc", step=P, id="produce"):
            r.let("t0", "bos + c * C")
            for n, src in (("wQ", ("q", "h")), ("wK", ("k", "h")), ("wG", ("g", "hv"))):
                r.copy("cp_async", tile(src[0], ["t0", src[1], 0], [C, 1, K]), tile(n, slot="p"), oob="zfill",
                       vec_bytes=16, scope="warp")
            r.sync("cp_async_commit")
            with r.if_("c >= P"):                 # the consumers are done with this slot's last chunk
                r.mbar_wait(bar("empty", "p"), "(c / P - 1) % 2")
            r.copy("cp_async", tile("v", ["t0", "hv", "c0"], [C, 1, vs]), tile("sV", slot="p"), oob="zfill",
                   vec_bytes=16, scope="warp")
            r.sync("cp_async_commit")
            prepare_chunk(r, safe, SlotSink())
            r.sync("cp_async_wait", n=0)            # this lane's part of v is in the slot
            r.mbar_arrive(bar("full", "p"))
            r.sync("syncwarp")          # every lane is done with this chunk's private buffers
    with kb.role("cons", warps=(P, NC)) as r:
        consume(r, vs, NC, P)
    return kb.build()


# ------------------------------------------------------------------ pieces shared with two_pass.py
PAD = 8        # 272-byte rows: the 8 rows of an ldmatrix land in distinct banks


def outputs(chunk: int = C) -> dict:
    """What a prepared chunk of `chunk` tokens is (name: rows x cols, dtype); the consumers read these
    from slot buffers s<name>."""
    return {"QG": (chunk, K, "bf16"), "KD": (chunk, K, "bf16"), "W": (chunk, K, "bf16"),
            "Aqk": (chunk, chunk, "bf16"), "Ainv": (chunk, chunk, "bf16"), "Dec": (1, K, "f32")}


OUTPUTS = outputs(C)


def producer_buffers(kb, safe: bool, P: int) -> None:
    """A producer warp's private shared memory (stage = producer warp: the raw chunk, then KG over g and
    KI over k) and registers (lane l holds channels 4l..4l+3 of every token row)."""
    for n in ("wQ", "wK", "wG"):
        kb.buffer(n, "smem", "bf16", [C, 1, K], stages=P, pad=PAD)
    kb.buffer("wBeta", "smem", "f32", [C, 1], stages=P)
    kb.buffer("wGc", "smem", "f32", [C, K], stages=P)
    kb.buffer("wP", "smem", "bf16", [C, C], stages=P, pad=PAD)
    v4 = dict(layout="blocked", vec=4, scope="warp", role="prod")
    for n in ("qh", "kh", "gh"):
        kb.buffer(n, "reg", "f32", [HALF, K], **v4)
    for n in ("dbt", "GCr"):
        kb.buffer(n, "reg", "f32", [1, K], **v4)
    kb.buffer("al", "reg", "f32", [1], scope="thread", role="prod")
    kb.buffer("b1", "reg", "f32", [1, 1], scope="thread", role="prod")
    if safe:
        kb.buffer("gt", "reg", "f32", [C, K], **v4)
        kb.buffer("live", "reg", "f32", [C, 1], scope="thread", role="prod")
        kb.buffer("qs", "reg", "f32", [HALF, 1], scope="thread", role="prod")
        kb.buffer("ks", "reg", "f32", [HALF, 1], scope="thread", role="prod")
    else:
        # the level operands (see _prepare_softplus), the norm factors and Aqk's diagonal per token,
        # the anchors of a level's rows
        for n in ("wX", "wXq"):
            kb.buffer(n, "smem", "bf16", [C, 1, K], stages=P, pad=PAD)
        for n in ("wNq", "wNk", "wDg"):
            kb.buffer(n, "smem", "f32", [C, 1], stages=P)
        kb.buffer("tt", "reg", "f32", [HALF, K], **v4)
        for n in ("A0", "A1", "A2", "A3"):
            kb.buffer(n, "reg", "f32", [1, K], **v4)
        for n in ("ck", "cq", "cd"):
            kb.buffer(n, "reg", "f32", [HALF, 1], scope="thread", role="prod")
        kb.buffer("T2", "reg", "f32", [C, C], layout="mma_acc", scope="warp", role="prod")
    for n in ("L", "Pm", "Inv"):
        kb.buffer(n, "reg", "f32", [C, C], layout="mma_acc", scope="warp", role="prod")
    kb.buffer("pa", "reg", "bf16", [C, C], layout="mma_a", scope="warp", role="prod")
    kb.buffer("pb", "reg", "bf16", [C, C], layout="mma_b", scope="warp", role="prod")
    kb.buffer("brow", "reg", "f32", [C, 1], layout="mma_rows", scope="warp", role="prod")


def slot_buffers(kb, vs: int, P: int, names=tuple(OUTPUTS), chunk: int = C) -> None:
    """The slots a prepared chunk (of `chunk` tokens) sits in for the consumers (stage = chunk % P), and
    v's V-slice."""
    outs = outputs(chunk)
    for n in names:
        rows, cols, dt = outs[n]
        if n == "Dec":
            kb.buffer("sDec", "smem", "f32", [1, K], stages=P)
        else:
            kb.buffer("s" + n, "smem", dt, [rows, cols], stages=P, pad=PAD)
    if vs:
        kb.buffer("sV", "smem", "bf16", [chunk, 1, vs], stages=P, pad=PAD)


def consumer_buffers(kb, vs: int, NC: int, chunk: int = C) -> None:
    """A consumer warp's state columns (vs / NC of them) and its staging in shared memory. KD^T (cT)
    is loaded 16 tokens at a time: [K, 16] whatever the chunk."""
    cwn = vs // NC
    kb.buffer("sS", "smem", "bf16", [K, vs], pad=PAD)
    kb.buffer("sVn", "smem", "bf16", [chunk, vs], pad=PAD)
    kb.buffer("S", "reg", "f32", [K, cwn], layout="mma_acc", scope="warp", role="cons")
    kb.buffer("dec", "reg", "f32", [K, 1], layout="mma_rows", scope="warp", role="cons")
    kb.buffer("ca", "reg", "bf16", [chunk, chunk], layout="mma_a", scope="warp", role="cons")
    kb.buffer("cb", "reg", "bf16", [cwn, chunk], layout="mma_b", scope="warp", role="cons")
    kb.buffer("cT", "reg", "bf16", [K, 16], layout="mma_a", scope="warp", role="cons")
    for n in ("U", "Vn", "Oa"):
        kb.buffer(n, "reg", "f32", [chunk, cwn], layout="mma_acc", scope="warp", role="cons")


class SlotSink:
    """Where a producer puts a prepared chunk: slot p of the consumers' shared-memory buffers."""

    def store(self, r, name: str, src: str, r0: int, rows: int, c0: int = 0, cols: int = K):
        if name == "Dec":
            r.sts(tile(src), tile("sDec", slot="p"), vec_bytes=16)
        else:
            whole = (r0, c0, rows, cols) == (0, 0) + OUTPUTS[name][:2]
            dst = tile("s" + name, slot="p") if whole else tile("s" + name, [r0, c0], [rows, cols], slot="p")
            r.sts(tile(src), dst, vec_bytes=store_vec_bytes(src))


def store_vec_bytes(src: str) -> int:
    """Store width of a producer register tile: 4 f32 -> bf16 per lane for the blocked rows, pairs for
    the mma accumulators."""
    return 4 if src in ("L", "Pm", "Inv") else 8


def prepare_chunk(r, safe: bool, out, w: bool = True) -> None:
    """One producer warp prepares the chunk whose raw q / k / g sit in its private wQ / wK / wG (copies
    committed, t0 the chunk's first token): beta, the gate, norms, QG, KD, e^{G_C}, Aqk, A' and W, each
    handed to `out` (a SlotSink, or two_pass.WorkspaceSink). Without `w`, W is not computed: A' is left
    in Inv and KG in wG (two_pass's 32-token chunks build their second half's W from them)."""
    # beta of token `lane` (0 past the sequence end: such tokens add nothing and see nothing)
    r.let("tb", "t0 + lane % C")
    r.ldg(tile("beta", ["tb", "hv"], [1, 1]), tile("b1"), oob="zfill", vec_bytes=2)
    r.map("b1", "select(tb < eos, sigmoid(b1), 0)")
    with r.if_("lane < C"):
        r.sts(tile("b1"), tile("wBeta", ["lane", 0], [1, 1], slot="p"), vec_bytes=4)
    r.sync("cp_async_wait", n=0)
    r.sync("syncwarp")
    (_prepare_safe if safe else _prepare_softplus)(r, out)
    # (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8) (L strictly lower: L^16 = 0), then Diag(beta)
    r.map("Inv", "select(col() == row(), 1, 0) - L")
    r.map("Pm", "L")
    for step in range(4):
        if step < 3:
            r.map("pa", "Pm")
            r.sts(tile("Pm"), tile("wP", slot="p"), vec_bytes=4)
            r.sync("syncwarp")
            r.ldmatrix(tile("wP", slot="p"), tile("pb"), trans=True)
            r.fill("Pm", 0.0)
            r.mma_sync(tile("pa"), tile("pb"), tile("Pm"))          # P <- P P
            r.sync("syncwarp")
            r.map("L", "Pm + select(col() == row(), 1, 0)")        # I + P
        else:
            r.map("L", "select(col() == row(), brow, 0)")          # Diag(beta)
        r.sts(tile("L"), tile("wP", slot="p"), vec_bytes=4)
        r.sync("syncwarp")
        r.ldmatrix(tile("wP", slot="p"), tile("pb"), trans=True)
        r.map("pa", "Inv")
        r.fill("Inv", 0.0)
        r.mma_sync(tile("pa"), tile("pb"), tile("Inv"))            # Inv <- Inv (I + P)
        r.sync("syncwarp")
    out.store(r, "Ainv", "Inv", 0, C, 0, C)
    if not w:
        return
    # W = A' KG, 16 columns at a time (in L, free now)
    r.map("pa", "Inv")
    for qq in range(K // 16):
        r.ldmatrix(tile("wG", [0, 0, qq * 16], [C, 1, 16], slot="p"), tile("pb"), trans=True)
        r.fill("L", 0.0)
        r.mma_sync(tile("pa"), tile("pb"), tile("L"))
        out.store(r, "W", "L", 0, C, qq * 16, 16)


def state_tiles(cwn: int) -> tuple:
    """A consumer warp's state columns c0 + cw .. + cwn in h0 / ht, per layout: [K, V] and [V, K]."""
    return (["n", "hv", 0, "c0 + cw"], [1, 1, K, cwn]), (["n", "hv", "c0 + cw", 0], [1, 1, cwn, K])


def load_initial_state(r, cwn: int) -> None:
    """S <- h0 (either layout) of this sequence's state columns, or 0 without an initial state."""
    kv_tile, vk_tile = state_tiles(cwn)
    with r.if_("H0 == 1"):
        with r.if_("VK == 1"):
            r.ldg(tile("h0", *vk_tile), tile("S"), trans=True, vec_bytes=4, id="load_h0_vk")
        with r.else_():
            r.ldg(tile("h0", *kv_tile), tile("S"), vec_bytes=4, id="load_h0")
    with r.else_():
        r.fill("S", 0.0)


def store_final_state(r, cwn: int) -> None:
    """ht <- S (either layout) of this sequence's state columns."""
    kv_tile, vk_tile = state_tiles(cwn)
    with r.if_("VK == 1"):
        r.stg(tile("S"), tile("ht", *vk_tile), trans=True, vec_bytes=4, id="store_ht_vk")
    with r.else_():
        r.stg(tile("S"), tile("ht", *kv_tile), vec_bytes=4, id="store_ht")


def consume(r, vs: int, NC: int, P: int, lets: bool = True, first: str = "0", count: str = "nc",
            init=load_initial_state, u_expr: Optional[str] = None, store_o: bool = True,
            final=store_final_state, chunk: int = C) -> None:
    """A consumer warp's chunks first .. first + count - 1 of its sequence (default: the whole sequence):
    `init` the state, then per chunk (in order) U = A' V, Vn = U - W S, O = QG S + Aqk Vn (stored unless
    `store_o` is False), S = Diag(e^{G_C}) S + KD^T Vn from stage i % P (waiting `full`, releasing
    `empty`), then `final`. `u_expr` rewrites U (the segment programs zero it for their M columns).
    With `lets` the CTA's sequence and V-slice come from sequence_lets; else the caller has set them.
    `chunk` (16 or 32) is the tokens per chunk: at 32 the row tiles are two m16 blocks (one mma_sync
    each, independent) and the state update takes KD^T Vn as two k16 steps, 16 tokens at a time."""
    cwn = vs // NC
    ch = chunk

    def part(buf: str, rows: int, cols: int) -> dict:
        """The leading [rows, cols] of a consumer fragment (the whole buffer at chunk 16)."""
        return tile(buf) if (rows, cols) == {"ca": (ch, ch), "cb": (cwn, ch)}[buf] else tile(buf, [0, 0], [rows, cols])

    if lets:
        sequence_lets(r, "VS")
    r.let("cw", f"role_warp * {cwn}")
    init(r, cwn)
    with r.for_("i", 0, count, id="consume"):
        r.let("c", f"{first} + i" if first != "0" else "i")
        r.let("s", "i % P")
        r.let("t0", "bos + c * C")
        r.sts(tile("S"), tile("sS", [0, "cw"], [K, cwn]), vec_bytes=4)
        r.sync("syncwarp")
        r.mbar_wait(bar("full", "s"), "(i / P) % 2")
        # U = A' V (this warp's columns)
        r.ldmatrix(tile("sAinv", slot="s"), tile("ca"))
        r.ldmatrix(tile("sV", [0, 0, "cw"], [ch, 1, cwn], slot="s"), tile("cb"), trans=True)
        r.fill("U", 0.0)
        r.mma_sync(tile("ca"), tile("cb"), tile("U"))
        if u_expr:
            r.map("U", u_expr)
        # Vn = U - W S;  O = QG S + Aqk Vn
        r.fill("Vn", 0.0)
        if store_o:
            r.fill("Oa", 0.0)
        for kk in range(K // 16):
            r.ldmatrix(tile("sS", [kk * 16, "cw"], [16, cwn]), part("cb", cwn, 16), trans=True)
            r.ldmatrix(tile("sW", [0, kk * 16], [ch, 16], slot="s"), part("ca", ch, 16))
            r.mma_sync(part("ca", ch, 16), part("cb", cwn, 16), tile("Vn"))
            if store_o:
                r.ldmatrix(tile("sQG", [0, kk * 16], [ch, 16], slot="s"), part("ca", ch, 16))
                r.mma_sync(part("ca", ch, 16), part("cb", cwn, 16), tile("Oa"))
        r.map("Vn", "U - Vn")
        r.sts(tile("Vn"), tile("sVn", [0, "cw"], [ch, cwn]), vec_bytes=4)
        r.sync("syncwarp")
        if store_o:
            r.ldmatrix(tile("sAqk", slot="s"), tile("ca"))
        r.ldmatrix(tile("sVn", [0, "cw"], [ch, cwn]), tile("cb"), trans=True)
        if store_o:
            r.mma_sync(tile("ca"), tile("cb"), tile("Oa"))
            r.stg(tile("Oa"), tile("o", ["t0", "hv", "c0 + cw"], [ch, 1, cwn]), oob="mask", vec_bytes=4,
                  row_limit="eos", id="store_o")
        # S = Diag(e^{G_C}) S + KD^T Vn, 16 tokens at a time
        r.lds(tile("sDec", slot="s"), tile("dec"), vec_bytes=4)
        r.map("S", "S * dec")
        for kh in range(ch // 16):
            if ch == 16:
                r.ldmatrix(tile("sKD", slot="s"), tile("cT"), trans=True)
                r.mma_sync(tile("cT"), tile("cb"), tile("S"), id="state_update")
            else:
                r.ldmatrix(tile("sKD", [kh * 16, 0], [16, K], slot="s"), tile("cT"), trans=True)
                r.mma_sync(tile("cT"), tile("cb", [0, kh * 16], [cwn, 16]), tile("S"), id=f"state_update{kh}")
        r.mbar_arrive(bar("empty", "s"))
    final(r, cwn)


_ROWS_3D = ("wQ", "wK", "wG", "wX", "wXq")   # [C, 1, K] buffers (cp.async targets); the rest are [C, K]


def _cols(buf: str, c0: int, width: int) -> dict:
    """Columns c0 .. c0 + width of all C rows of a producer / slot buffer."""
    if buf in _ROWS_3D:
        return tile(buf, [0, 0, c0], [C, 1, width], slot="p")
    return tile(buf, [0, c0], [C, width], slot="p")


def _normalised_half(r, hh: int, qn: str, kn: str):
    """Rows hh * 8 .. + 8: raw q, k and the cumulative gate into qh, kh, gh; the per-row norm factors
    (0 past the sequence end; q's with the K^-1/2 scale) into qn, kn (one shuffle tree for both)."""
    rows = [hh * HALF, 0, 0]
    r.lds(tile("wQ", rows, [HALF, 1, K], slot="p"), tile("qh"), vec_bytes=8)
    r.lds(tile("wK", rows, [HALF, 1, K], slot="p"), tile("kh"), vec_bytes=8)
    r.lds(tile("wGc", [hh * HALF, 0], [HALF, K], slot="p"), tile("gh"), vec_bytes=16)
    r.reduce("sum_sq", "qh", qn, axis=1)
    r.reduce("sum_sq", "kh", kn, axis=1)
    live = f"select(t0 + {hh * HALF} + row() < eos, 1, 0)"
    r.map(qn, f"{live} * rsqrt({qn} + {L2_EPS!r}) * {K ** -0.5!r}")
    r.map(kn, f"{live} * rsqrt({kn} + {L2_EPS!r})")


def _grams(r, a: str, b: str, q: str, dk: str = "L", dq: str = "Pm"):
    """dk = A B^T and dq = Q B^T over all K channels (A, Q [C, K] row operands, B [C, K] stored N x K)."""
    r.fill(dk, 0.0)
    r.fill(dq, 0.0)
    for kk in range(K // 16):
        r.ldmatrix(_cols(b, kk * 16, 16), tile("pb"))
        r.ldmatrix(_cols(a, kk * 16, 16), tile("pa"))
        r.mma_sync(tile("pa"), tile("pb"), tile(dk))
        r.ldmatrix(_cols(q, kk * 16, 16), tile("pa"))
        r.mma_sync(tile("pa"), tile("pb"), tile(dq))


def _masks(r, out):
    """Aqk = tril_<=(Pm) into its slot; L = Diag(beta) tril_<(L) (beta rows in brow)."""
    r.map("Pm", "select(col() <= row(), Pm, 0)", id="aqk")
    out.store(r, "Aqk", "Pm", 0, C, 0, C)
    r.lds(tile("wBeta", slot="p"), tile("brow"), vec_bytes=4)
    r.map("L", "select(col() < row(), L * brow, 0)", id="akk")


def _prepare_safe(r, out):
    """Safe gate (G >= 16 * LOWER_BOUND = -80 in a chunk): every factor as a product of per-token rows,
    Akk and Aqk on the tensor cores from KG / QG and KI = k e^-G. Leaves Aqk in its slot, Akk in L, beta
    in brow."""
    # the gate of the 16 tokens (0 past the sequence end), summed down the tokens
    r.lds(tile("wG", slot="p"), tile("gt"), vec_bytes=8)
    r.map("live", "select(t0 + row() < eos, 1, 0)")
    r.map("gt", f"{gate_expr('gt', 'dbt', safe=True)} * live")
    r.scan("sum", "gt", "gt", axis=0)
    r.sts(tile("gt"), tile("wGc", slot="p"), vec_bytes=16)
    r.sync("syncwarp")
    r.lds(tile("wGc", [C - 1, 0], [1, K], slot="p"), tile("GCr"), vec_bytes=16)
    r.map("GCr", "exp(GCr)")                # e^{G_C}: the chunk's decay, and KD = k e^{G_C} / e^G
    for hh in range(2):
        rows = [hh * HALF, 0, 0]
        _normalised_half(r, hh, "qs", "ks")
        # one exp per element: e^-G = 1 / e^G (G >= -80 for the safe gate: e^G stays a normal float)
        r.map("gh", "exp(gh)")
        r.map("qh", "qh * qs * gh")
        r.map("kh", "kh * ks")
        r.sync("syncwarp")                  # every lane has read this half's raw rows
        out.store(r, "QG", "qh", hh * HALF, HALF)
        r.map("qh", "kh * gh")
        r.sts(tile("qh"), tile("wG", rows, [HALF, 1, K], slot="p"), vec_bytes=8)     # KG
        r.map("gh", "recip(gh)")
        r.map("qh", "kh * gh")
        r.sts(tile("qh"), tile("wK", rows, [HALF, 1, K], slot="p"), vec_bytes=8)     # KI
        r.map("qh", "kh * (gh * GCr)")
        out.store(r, "KD", "qh", hh * HALF, HALF)
    out.store(r, "Dec", "GCr", 0, 1)
    r.sync("syncwarp")
    _grams(r, "wG", "wK", "sQG")           # KG KI^T, QG KI^T
    _masks(r, out)


def _prepare_softplus(r, out):
    """Softplus gate: every Gram entry k_i . k_j e^{G_i - G_j} (j < i) on the tensor cores, anchored so
    that every factor is <= 1. The pairs of a chunk split by the highest bit where i and j differ:
    at level lv (b = 2^lv) i is in the upper and j in the lower half of one 2b-token block, and the
    anchor a = the block's last lower token gives e^{G_i - G_j} = e^{G_i - G_a} e^{G_a - G_j}, both
    factors <= 1 (G falls down the tokens). Per level one operand tile holds the upper rows' X = k e^{G - a}
    and the lower rows' Y = k e^{a - G} (one exp per element), a second the upper rows' q e^{G - a};
    their products, masked to the level's pairs, sum into Akk / Aqk over levels 3..0 (8, 4, 2, 1-token
    halves). The diagonal of Aqk is q_i . k_i. Raw q / k stay in wQ / wK and their norm factors in
    wNq / wNk, so each level rebuilds its operands without a second rounding to bf16."""
    # the gate, summed down the tokens a half at a time (the second half continues from G_7)
    for hh in range(2):
        r.lds(tile("wG", [hh * HALF, 0, 0], [HALF, 1, K], slot="p"), tile("tt"), vec_bytes=8)
        r.map("ck", f"select(t0 + {hh * HALF} + row() < eos, 1, 0)")
        r.map("tt", f"{gate_expr('tt', 'dbt', safe=False)} * ck")
        r.scan("sum", "tt", "tt", axis=0)
        if hh:
            r.map("tt", "tt + A0")
        r.sts(tile("tt"), tile("wGc", [hh * HALF, 0], [HALF, K], slot="p"), vec_bytes=16)
        r.sync("syncwarp")
        if not hh:
            r.lds(tile("wGc", [HALF - 1, 0], [1, K], slot="p"), tile("A0"), vec_bytes=16)   # G_7
    r.lds(tile("wGc", [C - 1, 0], [1, K], slot="p"), tile("GCr"), vec_bytes=16)            # G_C
    for hh in range(2):
        rows = [hh * HALF, 0]
        _normalised_half(r, hh, "cq", "ck")
        r.map("qh", "qh * cq")
        r.map("kh", "kh * ck")
        r.map("tt", "qh * kh")
        r.reduce("sum", "tt", "cd", axis=1)            # the diagonal of Aqk: q_i . k_i
        with r.if_("lane == 0"):
            for reg, buf in (("cq", "wNq"), ("ck", "wNk"), ("cd", "wDg")):
                r.sts(tile(reg), tile(buf, rows, [HALF, 1], slot="p"), vec_bytes=4)
        _level_operands(r, 3, hh, loaded=True)     # level 3 from the normalised rows in registers
        r.map("tt", "exp(gh)")
        r.map("qh", "qh * tt")
        out.store(r, "QG", "qh", hh * HALF, HALF)
        r.map("tt", "kh * tt")
        r.sts(tile("tt"), tile("wG", [hh * HALF, 0, 0], [HALF, 1, K], slot="p"), vec_bytes=8)  # KG
        r.map("kh", "kh * exp(GCr - gh)")
        out.store(r, "KD", "kh", hh * HALF, HALF)
    r.map("GCr", "exp(GCr)")
    out.store(r, "Dec", "GCr", 0, 1)
    r.sync("syncwarp")
    for lv in (3, 2, 1, 0):
        b = 1 << lv
        if lv < 3:
            for hh in range(2):
                _level_operands(r, lv, hh)
            r.sync("syncwarp")
        if lv == 3:       # the first level writes the accumulators, the others add to them
            _grams(r, "wX", "wX", "wXq")
            r.map("L", "select(row() >= 8 && col() < 8, L, 0)")
            r.map("Pm", "select(row() >= 8 && col() < 8, Pm, 0)")
        else:
            _grams(r, "wX", "wX", "wXq", dk="Inv", dq="T2")
            pairs = f"floor(row() / {b}) - floor(col() / {b}) == 1 && floor(row() / {b}) - 2 * floor(row() / {2 * b}) == 1"
            r.map("L", f"L + select({pairs}, Inv, 0)")
            r.map("Pm", f"Pm + select({pairs}, T2, 0)")
        r.sync("syncwarp")          # the next level overwrites the operand tiles
    r.lds(tile("wDg", slot="p"), tile("brow"), vec_bytes=4)
    r.map("Pm", "Pm + select(col() == row(), brow, 0)")
    _masks(r, out)


def _level_operands(r, lv: int, hh: int, loaded: bool = False):
    """Rows hh * 8 .. + 8 of level lv's operand tiles (see _prepare_softplus): wX = k e^{G - a} (upper
    rows) or k e^{a - G} (lower rows), wXq = q e^{G - a} (upper rows; the lower ones are never read).
    `loaded`: qh / kh already hold the normalised rows and gh the gate (the first pass), else the raw
    rows, their norm factors and the gate are read again."""
    b = 1 << lv
    rows3 = [hh * HALF, 0, 0]
    cq, ck = ("1", "1") if loaded else ("cq", "ck")
    if not loaded:
        r.lds(tile("wQ", rows3, [HALF, 1, K], slot="p"), tile("qh"), vec_bytes=8)
        r.lds(tile("wK", rows3, [HALF, 1, K], slot="p"), tile("kh"), vec_bytes=8)
        r.lds(tile("wGc", [hh * HALF, 0], [HALF, K], slot="p"), tile("gh"), vec_bytes=16)
        r.lds(tile("wNq", [hh * HALF, 0], [HALF, 1], slot="p"), tile("cq"), vec_bytes=4)
        r.lds(tile("wNk", [hh * HALF, 0], [HALF, 1], slot="p"), tile("ck"), vec_bytes=4)
    # the anchors of this half's rows: the last lower token of each 2b block (G_7 for both halves at lv 3)
    anchors = sorted({(i & ~(2 * b - 1)) + b - 1 for i in range(hh * HALF, hh * HALF + HALF)})
    for n, a in enumerate(anchors):
        r.lds(tile("wGc", [a, 0], [1, K], slot="p"), tile(f"A{n}"), vec_bytes=16)
    anc = f"A{len(anchors) - 1}"
    for n in reversed(range(len(anchors) - 1)):
        anc = f"select(row() < {(n + 1) * 2 * b}, A{n}, {anc})"
    if lv == 3:           # the whole half is upper (hh = 1) or lower (hh = 0)
        upper = "1 == 1" if hh else "1 == 0"
        d = "gh - A0" if hh else "A0 - gh"
    else:
        upper = f"floor(row() / {b}) - 2 * floor(row() / {2 * b}) == 1"
        d = f"select({upper}, gh - {anc}, {anc} - gh)"
    r.map("tt", f"exp({d})")
    # the first pass keeps qh / kh (QG, KG, KD come next): the operands go through tt, exp taken twice
    xk, xq = ("tt", "tt") if loaded else ("kh", "qh")
    r.map(xk, f"kh * {ck} * tt")
    r.sts(tile(xk), tile("wX", rows3, [HALF, 1, K], slot="p"), vec_bytes=8)
    if lv < 3 or hh:      # wXq's lower rows are never read
        if loaded:
            r.map("tt", f"exp({d})")
        r.map(xq, f"select({upper}, qh * {cq} * tt, 0)")
        r.sts(tile(xq), tile("wXq", rows3, [HALF, 1, K], slot="p"), vec_bytes=8)
