"""Seed programs for KDA prefill (task `kda`, tasks/kda/task.py).

`kda_recurrent`: the token recurrence with the state in registers, the token stream staged through
shared memory. One CTA per (value head, sequence, V-slice), grid [HV, N, vsplit]; warp w of slice z
owns value columns z * V / vsplit + [w * VW, (w + 1) * VW) of the state for the whole sequence, so
no state ever leaves the SM between tokens and a CTA needs nothing from any other CTA.

Per chunk of C tokens the CTA copies q, k, g (all K channels) and its V-slice of v into shared memory
with cp.async (v double-buffered; q/k/g single-buffered, the next chunk's copy issued as soon as the
prepare step below has consumed them, so it lands while the tokens of this chunk run); warp 0 loads
the chunk's beta logits and parks their sigmoid beside. Then, in float32 (the task's semantics,
tasks/kda/reference.py):

  prepare (token-parallel, warp w takes tokens w, w + W, ...):
    q, k <- l2norm(q), l2norm(k); q <- q * K^-0.5; d <- exp(g) with
    g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias))  (SAFE = 1) or -exp(A_log) * softplus(f + dt_bias);
    k.q; all as f32 rows in shared memory
  tokens (sequential):
    S' <- S * d[K];  (S'^T k, S'^T q) in one shuffle tree;  u <- beta * (v - S'^T k);
    o <- S'^T q + u (k.q)  (= S^T q);  S <- S' + k u^T

exp(g) <= 1 for every token, so neither gate form can overflow (no cumulative gate is ever formed).
The state layout (VK) is picked at run time: VK = 1 keeps S^T rows (lanes across K, vec 4, shuffle
reductions per row), VK = 0 keeps S columns (whole K rows per lane, column reductions), each path
reading and writing h0 / ht in its own layout with no transpose.

This is the first prefill program: it is exact and simple, and it is latency-bound per token (the
chunked algorithm of docs/tasks-kda.md is the route to tensor cores and is not written yet).
"""
from typing import Optional

from cake_ir.builder import KernelBuilder, tile

from tasks.base import signature_defaults
from tasks.kda.reference import L2_EPS, LOWER_BOUND
from tasks.kda.shapes import K, V


def gate_expr(g: str, d: str, safe: bool | None = None) -> str:
    """The log-space gate of raw input tile `g` plus bias tile `d` as an IR value expression (A_log read
    into the per-thread tile `al`); every KDA program uses it. The form is picked by the SAFE scalar at
    run time, or fixed by `safe` for a program whose scalar facts admit one gate form only."""
    lower = f"{LOWER_BOUND!r} * sigmoid(exp(al) * ({g} + {d}))"
    softplus = f"-exp(al) * softplus({g} + {d})"
    if safe is not None:
        return lower if safe else softplus
    return f"select(SAFE, {lower}, {softplus})"


def prefill_interface(kb, safe: bool | None = None) -> None:
    """The prefill task's scalars and tensors (tasks/kda/task.py), shared by every prefill program;
    `safe` fixes the SAFE fact for a program that serves one gate form."""
    for n in ("T", "N", "H", "HV"):
        kb.scalar(n, min=1)
    kb.scalar("SAFE", min=0 if safe is None else int(safe), max=1 if safe is None else int(safe))
    for n in ("VK", "H0"):
        kb.scalar(n, min=0, max=1)
    for n in ("q", "k"):
        kb.tensor(n, "bf16", ["T", "H", "K"])
    kb.tensor("v", "bf16", ["T", "HV", "V"])
    kb.tensor("g", "bf16", ["T", "HV", "K"])
    kb.tensor("beta", "bf16", ["T", "HV"])
    kb.tensor("A_log", "f32", ["HV"])
    kb.tensor("dt_bias", "f32", ["HV", "K"])
    # [N, HV, V, K] (VK = 1) or [N, HV, K, V] (VK = 0): K = V, so one declared shape covers both
    kb.tensor("h0", "f32", ["N", "HV", "V", "K"])
    kb.tensor("cu_seqlens", "i32", ["N + 1"])
    kb.tensor("o", "bf16", ["T", "HV", "V"], access="write")
    kb.tensor("ht", "f32", ["N", "HV", "V", "K"], access="write")


def sequence_lets(r, slice_const: Optional[str]) -> None:
    """A CTA's (value head, sequence, V-slice) from its grid position (HV, N, V / slice): hv, n, the
    qk head h, the sequence's tokens [bos, eos), its chunk count nc (const C) and first column c0
    (none when `slice_const` is None: the grid's z is not a V-slice)."""
    r.let("hv", "bid.x")
    r.let("n", "bid.y")
    r.let("h", "hv / (HV / H)")              # grouped value heads read q/k head hv // (HV / H)
    # the estimates (sequences of T / N tokens) are what the cost model assumes; nothing is proved from them
    r.let("bos", "ld(cu_seqlens, n, 0, T, n * (T / N))")
    r.let("eos", "ld(cu_seqlens, n + 1, 0, T, (n + 1) * (T / N))")
    r.let("nc", "cdiv(max(eos - bos, 0), C)")
    if slice_const is not None:
        r.let("c0", f"bid.z * {slice_const}")


def _sequence(r, vw: int, vc: int, chunk: int, warps: int, vk: bool):
    """The whole sequence for one state layout: initial state, the chunk loop, the final state."""
    sfx = "" if vk else "_kv"
    S, Tt, Tq = ("S", "Tr", "Tq") if vk else ("Sc", "Tc", "Tcq")
    qv, kv, dv = ("qf", "kf", "df") if vk else ("qc", "kc", "dc")
    st_tile = (["n", "hv", "v0", 0], [1, 1, vw, K]) if vk else (["n", "hv", 0, "v0"], [1, 1, K, vw])
    red_axis = 3 if vk else 2
    tok_vec = 16 if vk else 4            # prepared f32 rows: 4 consecutive K per lane, or 1 (k = lane + 32 i)
    with r.if_("H0 == 1"):
        r.ldg(tile("h0", *st_tile), tile(S), vec_bytes=16, id="load_h0" + sfx)
    with r.else_():
        r.fill(S, 0.0)

    def stage_chunk(c: str, vslot: str):
        t0 = f"bos + ({c}) * C"
        r.copy("cp_async", tile("q", [t0, "h", 0], [chunk, 1, K]), tile("sQ"), oob="zfill", vec_bytes=16)
        r.copy("cp_async", tile("k", [t0, "h", 0], [chunk, 1, K]), tile("sK"), oob="zfill", vec_bytes=16)
        r.copy("cp_async", tile("g", [t0, "hv", 0], [chunk, 1, K]), tile("sG"), oob="zfill", vec_bytes=16)
        r.copy("cp_async", tile("v", [t0, "hv", "c0"], [chunk, 1, vc]), tile("sV", slot=vslot), oob="zfill",
               vec_bytes=16)

    stage_chunk("0", "0")
    r.sync("cp_async_commit")
    with r.if_("role_warp == 0"):
        r.ldg(tile("beta", ["bos", "hv"], [chunk, 1]), tile("bc"), oob="zfill", vec_bytes=2)
        r.map("bc", "sigmoid(bc)")
        r.sts(tile("bc"), tile("sB", slot="0"), vec_bytes=4)
    with r.for_("c", 0, "nc", id="chunk_loop" + sfx):
        r.let("t0", "bos + c * C")
        slot = "c % 2"
        r.sync("cp_async_wait", n=0)      # chunk c has landed
        r.sync("syncthreads")             # visible to every warp; every warp is done with chunk c - 1
        # token-parallel work of the chunk, off the sequential path: warp w prepares tokens w, w + W, ...
        # (normalised and scaled q, normalised k, the decay exp(g)) as f32 rows in shared memory
        with r.for_("jj", 0, chunk // warps, id="prepare" + sfx):
            r.let("jp", "jj * W + role_warp")
            r.lds(tile("sQ", ["jp", 0, 0], [1, 1, K]), tile("qf"), vec_bytes=8)
            r.lds(tile("sK", ["jp", 0, 0], [1, 1, K]), tile("kf"), vec_bytes=8)
            r.lds(tile("sG", ["jp", 0, 0], [1, 1, K]), tile("gf"), vec_bytes=8)
            r.reduce("sum_sq", "qf", "qs", axis=2)
            r.reduce("sum_sq", "kf", "ks", axis=2)
            r.map("qf", f"qf * rsqrt(qs + {L2_EPS!r}) * {K ** -0.5!r}")
            r.map("kf", f"kf * rsqrt(ks + {L2_EPS!r})")
            r.map("gf", f"exp({gate_expr('gf', 'db')})", id="decay" + sfx)
            r.map("Tp", "qf * kf")
            r.reduce("sum", "Tp", "kq", axis=2)
            with r.if_("lane == 0"):
                r.sts(tile("kq"), tile("pKQ", ["jp", 0], [1, 1]), vec_bytes=4)
            r.sts(tile("qf"), tile("pQ", ["jp", 0, 0], [1, 1, K]), vec_bytes=16)
            r.sts(tile("kf"), tile("pK", ["jp", 0, 0], [1, 1, K]), vec_bytes=16)
            r.sts(tile("gf"), tile("pD", ["jp", 0, 0], [1, 1, K]), vec_bytes=16)
        r.sync("syncthreads")             # the prepared rows are visible; the raw q/k/g buffers are free
        with r.if_("c + 1 < nc"):         # chunk c + 1 lands while the tokens of chunk c run
            stage_chunk("c + 1", "(c + 1) % 2")
        r.sync("cp_async_commit")
        with r.if_("c + 1 < nc && role_warp == 0"):
            r.ldg(tile("beta", ["t0 + C", "hv"], [chunk, 1]), tile("bc"), oob="zfill", vec_bytes=2)
        with r.for_("j", 0, "min(C, eos - t0)", id="token_loop" + sfx):
            r.lds(tile("pQ", ["j", 0, 0], [1, 1, K]), tile(qv), vec_bytes=tok_vec)
            r.lds(tile("pK", ["j", 0, 0], [1, 1, K]), tile(kv), vec_bytes=tok_vec)
            r.lds(tile("pD", ["j", 0, 0], [1, 1, K]), tile(dv), vec_bytes=tok_vec)
            r.lds(tile("sV", ["j", 0, "role_warp * VW"], [1, 1, vw], slot=slot), tile("vv"), vec_bytes=16)
            r.lds(tile("sB", ["j", 0], [1, 1], slot=slot), tile("bl"), vec_bytes=4)
            r.lds(tile("pKQ", ["j", 0], [1, 1]), tile("kqj"), vec_bytes=4)
            # with S' the decayed state: u = beta (v - S'^T k) and o = S^T q = S'^T q + u (k . q), so both
            # sums over K read S' and share one shuffle tree (the lowering fuses adjacent warp sums)
            r.map(S, f"{S} * {dv}")
            r.map(Tt, f"{S} * {kv}")
            r.map(Tq, f"{S} * {qv}")
            r.reduce("sum", Tt, "u", axis=red_axis, id="state_times_k" + sfx)
            r.reduce("sum", Tq, "ov", axis=red_axis, id="output" + sfx)
            r.map("u", "bl * (vv - u)")
            r.map("ov", "ov + u * kqj")
            r.map(S, f"{S} + u * {kv}" if vk else f"{S} + {kv} * u", id="rank1_update" + sfx)
            with r.if_("lane == 0"):
                # t0 + j < eos <= T; the mask only states it for the prover
                r.stg(tile("ov"), tile("o", ["t0 + j", "hv", "v0"], [1, 1, vw]), oob="mask",
                      vec_bytes=2 * vw if vw <= 8 else 16, id="store_o" + sfx)
        with r.if_("c + 1 < nc && role_warp == 0"):
            r.map("bc", "sigmoid(bc)")
            r.sts(tile("bc"), tile("sB", slot="(c + 1) % 2"), vec_bytes=4)
    r.sync("cp_async_wait", n=0)          # the last (empty) group: nothing may land after the CTA ends
    r.stg(tile(S), tile("ht", *st_tile), vec_bytes=16, id="store_ht" + sfx)


def kda_recurrent(vw: int = 8, vsplit: int = 4, chunk: int = 32, arch: str = "sm_80"):
    """Both gate forms and both state layouts (run-time SAFE / VK / H0), packed varlen sequences."""
    assert V % (vw * vsplit) == 0 and chunk % 32 == 0
    vc = V // vsplit
    warps = vc // vw
    kb = KernelBuilder(f"kda_recurrent_{vw}_{vsplit}_{chunk}", arch=arch, grid=["HV", "N", vsplit],
                       threads=32 * warps,
                       note="KDA prefill, token recurrence, state in registers, token stream through smem")
    kb.const(K=K, V=V, VW=vw, VC=vc, C=chunk, W=warps)
    prefill_interface(kb)
    # the token stream, 2 stages of C tokens
    for n in ("sQ", "sK", "sG"):       # raw rows: read once, by the prepare step
        kb.buffer(n, "smem", "bf16", [chunk, 1, K])
    kb.buffer("sV", "smem", "bf16", [chunk, 1, vc], stages=2)
    kb.buffer("sB", "smem", "f32", [chunk, 1], stages=2)
    for n in ("pQ", "pK", "pD"):         # the chunk's prepared token rows (f32)
        kb.buffer(n, "smem", "f32", [chunk, 1, K])
    kb.buffer("pKQ", "smem", "f32", [chunk, 1])
    kb.buffer("bc", "reg", "f32", [chunk, 1], layout="blocked", vec=1, scope="warp")
    # VK = 1: S^T rows [VW, K] per warp, each lane 4 consecutive K columns of every row (vec 4)
    v4 = dict(layout="blocked", vec=4, scope="warp")
    for n in ("qf", "kf", "gf", "df"):
        kb.buffer(n, "reg", "f32", [1, 1, K], **v4)
    kb.buffer("db", "reg", "f32", [1, K], **v4)
    kb.buffer("S", "reg", "f32", [1, 1, vw, K], **v4)
    kb.buffer("Tr", "reg", "f32", [1, 1, vw, K], **v4)
    kb.buffer("Tq", "reg", "f32", [1, 1, vw, K], **v4)
    kb.buffer("Tp", "reg", "f32", [1, 1, K], **v4)
    # VK = 0: S columns [K, VW] per warp, each lane whole rows k = lane + 32 i (vec VW); K-vectors vec 1
    v1 = dict(layout="blocked", vec=1, scope="warp")
    for n in ("qc", "kc", "dc"):
        kb.buffer(n, "reg", "f32", [1, 1, K], **v1)
    kb.buffer("Sc", "reg", "f32", [1, 1, K, vw], layout="blocked", vec=vw, scope="warp")
    kb.buffer("Tc", "reg", "f32", [1, 1, K, vw], layout="blocked", vec=vw, scope="warp")
    kb.buffer("Tcq", "reg", "f32", [1, 1, K, vw], layout="blocked", vec=vw, scope="warp")
    kb.buffer("al", "reg", "f32", [1], scope="thread")
    kb.buffer("bl", "reg", "f32", [1, 1], scope="thread")
    kb.buffer("qs", "reg", "f32", [1, 1, 1], scope="thread")
    kb.buffer("ks", "reg", "f32", [1, 1, 1], scope="thread")
    kb.buffer("kq", "reg", "f32", [1, 1, 1], scope="thread")
    kb.buffer("kqj", "reg", "f32", [1, 1], scope="thread")
    kb.buffer("vv", "reg", "f32", [1, 1, vw], scope="thread")
    kb.buffer("u", "reg", "f32", [1, 1, vw, 1], scope="thread")
    kb.buffer("ov", "reg", "f32", [1, 1, vw], scope="thread")
    with kb.role("main", warps=(0, warps)) as r:
        sequence_lets(r, "VC")
        r.let("v0", "c0 + role_warp * VW")
        r.ldg(tile("A_log", ["hv"], [1]), tile("al"), vec_bytes=4)
        r.ldg(tile("dt_bias", ["hv", 0], [1, K]), tile("db"), vec_bytes=16)
        with r.if_("VK == 1", id="layout_vk"):
            _sequence(r, vw, vc, chunk, warps, vk=True)
        with r.else_():
            _sequence(r, vw, vc, chunk, warps, vk=False)
    return kb.build()


def kda_chunked(vs: int = 32, safe: int = 1, arch: str = "sm_90a", producers: int = 4, consumers: int = 4):
    """The warp-specialised chunked prefill (tasks/kda/chunked.py `kda_chunk16_ws`) for one gate form:
    its SAFE fact is fixed, so it competes in runs whose timed shape has that gate (shape classes).
    `producers` is the pipeline depth (chunks in flight, one producer warp and slot each), `consumers`
    the warps the vs state columns split over."""
    from tasks.kda.chunked import kda_chunk16_ws
    return kda_chunk16_ws(arch=arch, vs=vs, safe=bool(safe), producers=producers, consumers=consumers)


def _chunked_point_ok(p: dict) -> bool:
    """A point that builds (chunked.point_problem) with at most 8 warps: more would leave a producer
    fewer registers than its tiles need (the verifier's E-RES-05), so the search does not propose it."""
    from tasks.kda.chunked import point_problem
    nc, npr = p.get("consumers", 4), p.get("producers", 4)
    return point_problem(p["vs"], bool(p.get("safe", 1)), npr, nc) is None and npr + nc <= 8


def kda_two_pass(vs: int = 32, safe: int = 1, arch: str = "sm_90a", warps: int = 1, stages: int = 2,
                 consumers: int = 4, segments: int = 0, copy: str = "cp_async", chunk: int = 16):
    """The two-pass chunked prefill (tasks/kda/two_pass.py): a Program of a chunk-parallel prepare
    kernel (`warps` warps per CTA) and the recurrence (`stages` chunks in flight, `consumers` warps over
    the vs state columns), for one gate form (its SAFE fact is fixed); `segments` > 0 splits the
    recurrence into sequence-parallel segments of that many chunks (tasks/kda/seq_parallel.py); `copy`
    is the recurrence loader's copy mechanism (cp_async, or bulk: the sm_90a bulk copy); `chunk` the tokens
    per chunk (16, or 32: half the recurrence's sequential steps, each a 32-row step)."""
    from tasks.kda.two_pass import kda_two_pass as build
    return build(arch=arch, vs=vs, safe=bool(safe), warps=warps, stages=stages, consumers=consumers,
                 segments=segments, copy=copy, chunk=chunk)


def _two_pass_point_ok(p: dict) -> bool:
    from tasks.kda.two_pass import two_pass_problem
    d = signature_defaults(kda_two_pass)
    return two_pass_problem(p["vs"], bool(p.get("safe", 1)), *(p.get(n, d[n]) for n in
                            ("warps", "stages", "consumers", "segments", "copy", "arch", "chunk"))) is None


# which family parameters the search's family tactics (tactics/family.py) change: the V-slice is the
# CTA tile, the warp-role split and the pipeline depth (chunks in flight) their own axes
CHUNKED_TACTICS = {"retile": ["vs"], "warp_split": ["consumers"], "pipeline_depth": ["producers"]}
TWO_PASS_TACTICS = {"retile": ["vs"], "warp_split": ["warps", "consumers"], "pipeline_depth": ["stages"],
                    "sequence_parallel": ["segments"], "copy_mechanism": ["copy"], "chunk_size": ["chunk"]}

SEEDS = {
    "kda_recurrent_sm80": lambda: kda_recurrent(),                     # both gates, every shape
    "kda_chunked_safe_sm90a": lambda: kda_chunked(vs=32, safe=1),      # SAFE = 1 runs
    "kda_chunked_softplus_sm90a": lambda: kda_chunked(vs=64, safe=0),  # SAFE = 0 runs
    "kda_two_pass_safe_sm90a": lambda: kda_two_pass(vs=32, safe=1),
    "kda_two_pass_softplus_sm90a": lambda: kda_two_pass(vs=32, safe=0),
}

FAMILIES = {
    "kda_recurrent_sm80": {
        "make": kda_recurrent,
        "defaults": signature_defaults(kda_recurrent),
        # vsplit 1 (16 warps) holds both layouts' tiles over the register budget; vw 16 spills to the stack
        "space": {"vw": [8], "vsplit": [2, 4, 8, 16], "chunk": [32, 64]},
        "check": lambda p: V % (p["vw"] * p["vsplit"]) == 0 and p["vsplit"] > 1,
        "tactics": {"retile": ["vsplit", "chunk"]},      # V-split across CTAs, chunk size
    },
    # V-slice per CTA: 32 fills the GPU at small HV * N, 64 / 128 redo the producers' work fewer times
    # (bench/results/kda-prefill-h200.json: vs 32 best at H = 32, vs 64 at H = 64 / 96)
    # pipeline depth x warp-role split: 2 producers + 2 consumers halve the shared memory and registers
    # of a CTA, so two fit on an SM (H = 64 / 96 in one wave at vs 32 / 64)
    "kda_chunked_safe_sm90a": {
        "make": kda_chunked,
        "defaults": {"vs": 32, "safe": 1, "arch": "sm_90a", "producers": 4, "consumers": 4},
        "space": {"vs": [32, 64, 128], "producers": [2, 3, 4], "consumers": [2, 4]},
        "check": _chunked_point_ok,
        "tactics": CHUNKED_TACTICS,
    },
    "kda_chunked_softplus_sm90a": {
        "make": kda_chunked,
        "defaults": {"vs": 64, "safe": 0, "arch": "sm_90a", "producers": 4, "consumers": 4},
        "space": {"vs": [32, 64], "producers": [2, 3, 4], "consumers": [2, 4]},
        "check": _chunked_point_ok,
        "tactics": CHUNKED_TACTICS,
    },
    # two passes: the prepare kernel's warps per CTA (occupancy: ~26-31 KB of shared memory and up to
    # 255 registers per warp), the recurrence's V-slice, pipeline depth and consumer split
    # (bench/results/kda-prefill-h200.json: vs 32 p2c4 at H = 32, vs 64 p2c4 at H = 64, vs 128 p2c8 at
    # H = 96 and the packed batches; one prepare warp per CTA is as fast as two)
    "kda_two_pass_safe_sm90a": {
        "make": kda_two_pass,
        "defaults": signature_defaults(kda_two_pass),
        "space": {"vs": [32, 64, 128], "warps": [1, 2], "stages": [2, 3, 4], "consumers": [2, 4, 8],
                  "segments": [0, 32, 64, 128], "copy": ["cp_async", "bulk"],    # two_pass.COPIES
                  "chunk": [16, 32]},                                             # two_pass.CHUNKS
        "check": _two_pass_point_ok,
        "tactics": TWO_PASS_TACTICS,
    },
    "kda_two_pass_softplus_sm90a": {
        "make": kda_two_pass,
        "defaults": {**signature_defaults(kda_two_pass), "safe": 0},
        "space": {"vs": [32, 64, 128], "warps": [1, 2], "stages": [2, 3, 4], "consumers": [2, 4, 8],
                  "segments": [0, 32, 64, 128], "copy": ["cp_async", "bulk"],    # two_pass.COPIES
                  "chunk": [16, 32]},                                             # two_pass.CHUNKS
        "check": _two_pass_point_ok,
        "tactics": TWO_PASS_TACTICS,
    },
}
