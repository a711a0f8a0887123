"""Seed programs for the KDA decode step (task `kda_decode`, defined in tasks/kda/task.py).

`kda_decode`: one CTA per (value head, sequence) and V-slice, grid [HV, B(, vsplit)]; warp w of
slice z owns value columns z * V / vsplit + [w * VW, (w + 1) * VW). The sequence's state is gathered from the pool by a run-time index
(`ld(idx, b, 0, B - 1)`). The VK scalar picks the state layout at run time:
- VK = 1 ([P, HV, V, K]): S^T rows, each lane 4 consecutive K columns of every row (blocked, vec 4), so
  the reductions over K are one warp shuffle tree per row and the K-vectors (q, k, the decay) are
  lane-local column broadcasts;
- VK = 0 ([P, HV, K, V]): S columns, each lane whole rows k = lane + 32 i (blocked, vec VW), the
  K-vectors blocked vec 1 (the lane's rows), and the sums over K column reductions.
`kda_decode_kv` serves the [K, V] layout alone with lanes along V (a warp instruction moves one
contiguous run of a state row; the sums over K are added across warps in shared memory); cakelib's
decode_plan runs it for that layout.
Per step, in float32 (fla fused_recurrent_kda semantics, tasks/kda/reference.py):

    q, k <- l2norm(q), l2norm(k); q <- q * K^-0.5;  beta <- sigmoid(beta_logit)
    g <- lower_bound * sigmoid(exp(A_log) * (f + dt_bias))    (SAFE = 1)
         -exp(A_log) * softplus(f + dt_bias)                   (SAFE = 0)
    S <- S * exp(g)[K];  u <- beta * (v - S^T k);  S <- S + k u^T;  o <- S^T q

Verified and compiled (sm_80, sm_90a) in CI; the GPU checks against the float64 recurrence
(tests/test_kda_decode_ir.py, tests/test_kda_decode_inplace.py) pass on the H200.
"""
from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, tile

from tasks.kda.programs import L2_EPS, K, V, gate_expr


def kda_decode(vw: int = 8, vsplit: int = 1, arch: str = "sm_80", inplace: bool = False, pool: str = "",
               stage_kv: bool = False):
    """Both state layouts, chosen at run time by the VK scalar (one kernel for every task shape).
    `vsplit` CTAs share a (value head, sequence), each V / vsplit columns (more CTAs at small B).

    inplace = False (the task's interface): `state` [B, HV, .., ..] is read-only and the new states go
    to slot idx[b] of a separate `state_out` of the same shape. inplace = True (the serving form): one
    read-write pool `state` [P, HV, .., ..] of P >= B slots (scalar P); sequence b's state is read
    from and written back to row idx[b]. Every thread stores exactly the state elements it loaded,
    after loading them, so a CTA never writes what another thread reads; CTAs of distinct sequences
    touch disjoint rows when the idx entries are distinct (the caller's contract, as in fla).
    `pool` = "P" gives the copying form a pool of P slots too (state and state_out [P, ..]);
    the default is the task's P = B ("B"), and "P" for the in-place form.

    stage_kv: the [K, V] layout's state moves between global memory and the warps' column tiles
    through shared memory (rows padded by 4 floats: lanes reading rows lane + 32 i hit distinct
    banks): the CTA copies its [K, VC] slab in by cp.async, issued before the token inputs load, and
    stores it back from a CTA-wide tile, whole rows per instruction (VC * 4 contiguous bytes per
    row), instead of each lane touching its own 32-byte piece of 32 rows (32 distinct lines per warp
    instruction, an L1 wavefront per line)."""
    assert V % (vw * vsplit) == 0
    warps = V // (vw * vsplit)
    grid = ["HV", "B"] + ([vsplit] if vsplit > 1 else [])
    name = (f"kda_decode_{vw}_{vsplit}" + ("_inplace" if inplace else "_pool" if pool == "P" else "")
            + ("_stagekv" if stage_kv else ""))
    kb = KernelBuilder(name, arch=arch, grid=grid, threads=32 * warps,
                       note="KDA decode step, state pool gathered by index; VK picks the state layout")
    kb.const(K=K, V=V, VW=vw, VC=V // vsplit)
    pool = pool or ("P" if inplace else "B")
    assert pool in ("B", "P"), pool
    _declare_params(kb, pool, inplace)
    _declare_buffers(kb, vw, vsplit, stage_kv)
    dst = "state" if inplace else "state_out"
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.y")
        r.let("hv", "bid.x")
        r.let("h", "hv / (HV / H)")            # grouped value heads read q/k head hv // (HV / H)
        r.let("slot", f"ld(idx, b, 0, {pool} - 1)")  # the sequence's state in the pool
        r.let("v0", ("bid.z * VC + " if vsplit > 1 else "") + "role_warp * VW")
        r.ldg(tile("A_log", ["hv"], [1]), tile("al"), vec_bytes=4)
        r.ldg(tile("beta", ["b", "hv"], [1, 1]), tile("bl"), vec_bytes=2)
        r.map("bl", "sigmoid(bl)")
        r.ldg(tile("v", ["b", "hv", "v0"], [1, 1, vw]), tile("vv"), vec_bytes=2, id="load_v")
        with r.if_("VK == 1", id="layout_vk"):
            _step_vk(r, vw, dst)
        with r.else_():
            _step_kv(r, vw, vsplit, dst, stage_kv)
        with r.if_("lane == 0"):
            r.stg(tile("ov"), tile("o", ["b", "hv", "v0"], [1, 1, vw]), vec_bytes=2, id="store_o")
    return kb.build()


def _declare_params(kb, pool: str, inplace: bool, vk_max: int = 1):
    """Scalars and tensors: the pool of `pool` slots, read-write in place, else read + state_out.
    vk_max = 0: a program of the [K, V] layout only (a VK = 1 launch is refused by the domain)."""
    kb.scalar("B", min=1)
    if pool == "P":
        kb.scalar("P", min=1)
    kb.scalar("H", min=1)
    kb.scalar("HV", min=1)
    kb.scalar("SAFE", min=0, max=1)
    kb.scalar("VK", min=0, max=vk_max)
    for n in ("q", "k"):
        kb.tensor(n, "bf16", ["B", "H", "K"])
    kb.tensor("v", "bf16", ["B", "HV", "V"])
    kb.tensor("g", "bf16", ["B", "HV", "K"])
    kb.tensor("beta", "bf16", ["B", "HV"])
    kb.tensor("A_log", "f32", ["HV"])
    kb.tensor("dt_bias", "f32", ["HV", "K"])
    # [B, HV, V, K] (VK = 1) or [B, HV, K, V] (VK = 0): K = V, so one declared shape covers both
    kb.tensor("state", "f32", [pool, "HV", "V", "K"], access="readwrite" if inplace else "read")
    kb.tensor("idx", "i32", ["B"])
    kb.tensor("o", "bf16", ["B", "HV", "V"], access="write")
    if not inplace:
        kb.tensor("state_out", "f32", [pool, "HV", "V", "K"], access="write")


def _declare_buffers(kb, vw: int, vsplit: int, stage_kv: bool):
    """Register tiles of both layouts' paths (never live together), the staged slab's, per-thread rows."""
    # VK = 1: S^T rows [VW, K] per warp, each lane 4 consecutive K columns of every row (vec 4)
    vec = dict(layout="blocked", vec=4, scope="warp")
    for n in ("qf", "kf", "gf", "af"):
        kb.buffer(n, "reg", "f32", [1, 1, K], **vec)
    kb.buffer("db", "reg", "f32", [1, K], **vec)
    kb.buffer("S", "reg", "f32", [1, 1, vw, K], **vec)
    kb.buffer("T", "reg", "f32", [1, 1, vw, K], **vec)
    # VK = 0: S columns [K, VW] per warp, each lane whole rows k = lane + 32 i (vec VW); K-vectors vec 1
    col = dict(layout="blocked", vec=1, scope="warp")
    for n in ("qc", "kc", "gc", "ac"):
        kb.buffer(n, "reg", "f32", [1, 1, K], **col)
    kb.buffer("dc", "reg", "f32", [1, K], **col)
    kb.buffer("Sc", "reg", "f32", [1, 1, K, vw], layout="blocked", vec=vw, scope="warp")
    kb.buffer("Tc", "reg", "f32", [1, 1, K, vw], layout="blocked", vec=vw, scope="warp")
    if stage_kv:
        # the CTA's slab on its way out, 16-byte chunks dealt round-robin (rows whole per few threads);
        # its smem copy padded by 4 floats a row so that lanes reading rows lane + 32 i hit distinct banks
        kb.buffer("Sx", "reg", "f32", [1, 1, K, V // vsplit], layout="blocked", vec=4, scope="cta")
        kb.buffer("sS", "smem", "f32", [1, 1, K, V // vsplit], pad=4)
    # per-thread scalars and rows
    kb.buffer("al", "reg", "f32", [1], scope="thread")
    kb.buffer("bl", "reg", "f32", [1, 1], scope="thread")
    kb.buffer("qs", "reg", "f32", [1, 1, 1], scope="thread")
    kb.buffer("ks", "reg", "f32", [1, 1, 1], scope="thread")
    kb.buffer("vv", "reg", "f32", [1, 1, vw], scope="thread")
    kb.buffer("u", "reg", "f32", [1, 1, vw, 1], scope="thread")
    kb.buffer("ov", "reg", "f32", [1, 1, vw], scope="thread")


def _step_vk(r, vw: int, dst: str):
    """VK = 1: this warp's S^T rows [VW, K]; the sums over K are row reductions (a shuffle tree)."""
    r.ldg(tile("q", ["b", "h", 0], [1, 1, K]), tile("qf"), oob="zfill", vec_bytes=8)
    r.ldg(tile("k", ["b", "h", 0], [1, 1, K]), tile("kf"), oob="zfill", vec_bytes=8)
    r.ldg(tile("g", ["b", "hv", 0], [1, 1, K]), tile("gf"), vec_bytes=8)
    r.ldg(tile("dt_bias", ["hv", 0], [1, K]), tile("db"), vec_bytes=16)
    r.ldg(tile("state", ["slot", "hv", "v0", 0], [1, 1, vw, K]), tile("S"), vec_bytes=16, id="gather_state")
    r.map("gf", gate_expr("gf", "db"), id="gate")
    r.map("af", "exp(gf)")
    r.reduce("sum_sq", "qf", "qs", axis=2, id="q_norm")
    r.reduce("sum_sq", "kf", "ks", axis=2, id="k_norm")
    r.map("qf", f"qf * rsqrt(qs + {L2_EPS!r}) * {K ** -0.5!r}")
    r.map("kf", f"kf * rsqrt(ks + {L2_EPS!r})")
    # S <- S * exp(g); u <- beta * (v - S^T k); S <- S + k u^T; o <- S^T q
    r.map("S", "S * af", id="decay")
    r.map("T", "S * kf")
    r.reduce("sum", "T", "u", axis=3, id="state_times_k")
    r.map("u", "bl * (vv - u)", id="delta")
    r.map("S", "S + u * kf", id="rank1_update")
    r.stg(tile("S"), tile(dst, ["slot", "hv", "v0", 0], [1, 1, vw, K]), vec_bytes=16,
          id="scatter_state")
    r.map("T", "S * qf")
    r.reduce("sum", "T", "ov", axis=3, id="output")


def _step_kv(r, vw: int, vsplit: int, dst: str, stage_kv: bool):
    """VK = 0: this warp's S columns [K, VW]; the sums over K are column reductions over the warp."""
    if stage_kv:            # the slab's copy is in flight while the token inputs load
        _stage_issue(r, vsplit)
    r.ldg(tile("q", ["b", "h", 0], [1, 1, K]), tile("qc"), oob="zfill", vec_bytes=2)
    r.ldg(tile("k", ["b", "h", 0], [1, 1, K]), tile("kc"), oob="zfill", vec_bytes=2)
    r.ldg(tile("g", ["b", "hv", 0], [1, 1, K]), tile("gc"), vec_bytes=2)
    r.ldg(tile("dt_bias", ["hv", 0], [1, K]), tile("dc"), vec_bytes=4)
    # state [.., K, V]: rows k, this warp's VW columns (32 contiguous bytes per lane and row)
    if stage_kv:
        _stage_land(r, vw)
    else:
        r.ldg(tile("state", ["slot", "hv", 0, "v0"], [1, 1, K, vw]), tile("Sc"), vec_bytes=16,
              id="gather_state_kv")
    r.map("gc", gate_expr("gc", "dc"), id="gate_kv")
    r.map("ac", "exp(gc)")
    r.reduce("sum_sq", "qc", "qs", axis=2)
    r.reduce("sum_sq", "kc", "ks", axis=2)
    r.map("qc", f"qc * rsqrt(qs + {L2_EPS!r}) * {K ** -0.5!r}")
    r.map("kc", f"kc * rsqrt(ks + {L2_EPS!r})")
    r.map("Sc", "Sc * ac", id="decay_kv")
    r.map("Tc", "Sc * kc")
    r.reduce("sum", "Tc", "u", axis=2, id="state_times_k_kv")   # u: one value per column
    r.map("u", "bl * (vv - u)", id="delta_kv")
    r.map("Sc", "Sc + kc * u", id="rank1_update_kv")
    if stage_kv:
        _stage_out(r, vsplit, vw, dst)
    else:
        r.stg(tile("Sc"), tile(dst, ["slot", "hv", 0, "v0"], [1, 1, K, vw]), vec_bytes=16,
              id="scatter_state_kv")
    r.map("Tc", "Sc * qc")
    r.reduce("sum", "Tc", "ov", axis=2, id="output_kv")


def _stage_issue(r, vsplit: int):
    """The CTA's [K, VC] slab of the pool -> padded smem by cp.async, whole rows per warp instruction."""
    c0 = "bid.z * VC" if vsplit > 1 else "0"
    r.copy("cp_async", tile("state", ["slot", "hv", 0, c0], [1, 1, K, V // vsplit]),
           tile("sS", [0, 0, 0, 0], [1, 1, K, V // vsplit]), vec_bytes=16, id="gather_state_kv")
    r.sync("cp_async_commit")


def _stage_land(r, vw: int):
    """Wait for the slab; each warp reads its VW columns (lane l: rows l + 32 i, distinct banks)."""
    r.sync("cp_async_wait", n=0)
    r.sync("syncthreads")                 # every thread's part of the slab has landed
    r.lds(tile("sS", [0, 0, 0, "role_warp * VW"], [1, 1, K, vw]), tile("Sc"), vec_bytes=16)


def _stage_out(r, vsplit: int, vw: int, dst: str):
    """Back out: each warp's columns -> smem -> the CTA tile Sx -> global memory, rows whole."""
    c0 = "bid.z * VC" if vsplit > 1 else "0"
    r.sts(tile("Sc"), tile("sS", [0, 0, 0, "role_warp * VW"], [1, 1, K, vw]), vec_bytes=16)
    r.sync("syncthreads")                 # the whole slab is back in smem
    r.lds(tile("sS", [0, 0, 0, 0], [1, 1, K, V // vsplit]), tile("Sx"), vec_bytes=16)
    r.stg(tile("Sx"), tile(dst, ["slot", "hv", 0, c0], [1, 1, K, V // vsplit]), vec_bytes=16,
          id="scatter_state_kv")


def kda_decode_kv(vec: int = 2, warps: int = 8, blocks: int = 1, arch: str = "sm_80", inplace: bool = False,
                  pool: str = ""):
    """The [K, V] layout only (VK's domain is {0}), lanes along V: lane l of every warp owns the `vec`
    consecutive columns c0 = z * VC + l * vec of V-slice z of VC = 32 vec columns (grid [V / VC, HV, B]),
    warp w the K rows [w KW, (w + 1) KW), KW = K / warps. A warp instruction moves one contiguous
    32 * vec * 4-byte segment of a state row (the [K, V] layout's coalesced direction), and every thread
    stores exactly the elements it loaded (in place as in kda_decode). The sums over K are per-lane
    partials over the warp's rows, added across warps through shared memory (one barrier).

    After the decay, one pass over S computes both sums over K (the L2 norms folded into per-column
    scalars, so one cross-warp exchange serves u and o): with q~, k~ raw, rk = |k~|^-1,
    rq = |q~|^-1 K^-0.5, S <- S exp(g)[K], then
        u = beta (v - rk S^T k~),  o = rq (S^T q~ + rk (k~ . q~) u),  S <- S + k~ (rk u)^T,
    which is u <- beta (v - S^T k); S <- S + k u^T; o <- S^T q of the reference.
    `blocks`: CTAs per SM that ptxas must fit (__launch_bounds__' second argument, a register cap)."""
    # KW != vec: a thread's [KW] row vectors and [vec] column vectors broadcast by their shapes
    assert vec in (1, 2, 4) and K % warps == 0 and K // warps != vec
    kw, vsplit = K // warps, V // (32 * vec)
    # the V-slices of one state are neighbours in launch order (x fastest): its rows' halves or
    # quarters are read at the same time, as whole rows are in the [V, K] layout's program
    grid = ([vsplit] if vsplit > 1 else []) + ["HV", "B"]
    name = (f"kda_decode_kv_c{vec}_w{warps}" + (f"_b{blocks}" if blocks > 1 else "")
            + ("_inplace" if inplace else "_pool" if pool == "P" else ""))
    kb = KernelBuilder(name, arch=arch, grid=grid, threads=32 * warps, min_blocks_per_sm=blocks,
                       note="KDA decode step, [K, V] state pool gathered by index, lanes along V")
    kb.const(K=K, V=V, KW=kw, VEC=vec, VC=32 * vec)
    pool = pool or ("P" if inplace else "B")
    assert pool in ("B", "P"), pool
    _declare_params(kb, pool, inplace, vk_max=0)
    _declare_col_buffers(kb, vec, warps)
    with kb.role("main", warps=(0, warps)) as r:
        r.let("b", "bid.z" if vsplit > 1 else "bid.y")
        r.let("hv", "bid.y" if vsplit > 1 else "bid.x")
        r.let("h", "hv / (HV / H)")
        r.let("slot", f"ld(idx, b, 0, {pool} - 1)")
        r.let("k0", "role_warp * KW")          # this warp's K rows
        r.let("cl", "lane * VEC")              # this lane's columns within the CTA's slice
        r.let("c0", ("bid.x * VC + " if vsplit > 1 else "") + "cl")
        _step_kv_cols(r, kw, vec, warps, "state" if inplace else "state_out")
    return kb.build()


def _declare_col_buffers(kb, vec: int, warps: int):
    """kda_decode_kv's tiles: the thread's [KW, vec] block of S, its rows' K-vectors, the warps' partials."""
    kw = K // warps
    own = dict(layout="blocked", vec=vec, scope="thread")       # chunks = whole rows of `vec` columns
    kb.buffer("Sq", "reg", "f32", [1, 1, kw, vec], **own)
    kb.buffer("Tq", "reg", "f32", [1, 1, kw, vec], **own)
    kb.buffer("Pw", "reg", "f32", [1, warps, vec], **own)
    for n in ("qr", "kr", "gr"):                  # the warp's rows, raw (16-byte loads)
        kb.buffer(n, "reg", "f32", [1, 1, kw], scope="thread")
    kb.buffer("dr", "reg", "f32", [1, kw], scope="thread")
    for n in ("ab", "kk", "qq"):                  # a, k~, q~ per row: broadcast along the row
        kb.buffer(n, "reg", "f32", [1, 1, kw], layout="blocked", vec=1, scope="thread")
    for n in ("qf", "kf"):                        # whole q, k per warp: the norms and k~ . q~
        kb.buffer(n, "reg", "f32", [1, 1, K], layout="blocked", vec=4, scope="warp")
    for n in ("vv", "pk", "pq", "u", "wv", "ov"):
        kb.buffer(n, "reg", "f32", [1, 1, vec], scope="thread")
    kb.buffer("al", "reg", "f32", [1], scope="thread")
    kb.buffer("bl", "reg", "f32", [1, 1], scope="thread")
    for n in ("qs", "ks", "qk"):
        kb.buffer(n, "reg", "f32", [1, 1, 1], scope="thread")
    # S^T k~, S^T q~ partials per warp (an instruction reads one row: pad only keeps W-PERF-01 quiet)
    kb.buffer("sP", "smem", "f32", [2, warps, 32 * vec], pad=4)


def _step_kv_cols(r, kw: int, vec: int, warps: int, dst: str):
    """kda_decode_kv's step: loads (the state first), the gate and norms, one pass of partial sums,
    the cross-warp sums, the update stored where it was read, o from warp 0."""
    r.ldg(tile("state", ["slot", "hv", "k0", "c0"], [1, 1, kw, vec]), tile("Sq"), vec_bytes=4 * vec,
          id="gather_state_kv")
    r.ldg(tile("A_log", ["hv"], [1]), tile("al"), vec_bytes=4)
    r.ldg(tile("beta", ["b", "hv"], [1, 1]), tile("bl"), vec_bytes=2)
    r.ldg(tile("v", ["b", "hv", "c0"], [1, 1, vec]), tile("vv"), vec_bytes=2 * vec, id="load_v")
    r.ldg(tile("q", ["b", "h", 0], [1, 1, K]), tile("qf"), oob="zfill", vec_bytes=8)
    r.ldg(tile("k", ["b", "h", 0], [1, 1, K]), tile("kf"), oob="zfill", vec_bytes=8)
    r.ldg(tile("q", ["b", "h", "k0"], [1, 1, kw]), tile("qr"), oob="zfill", vec_bytes=16)
    r.ldg(tile("k", ["b", "h", "k0"], [1, 1, kw]), tile("kr"), oob="zfill", vec_bytes=16)
    r.ldg(tile("g", ["b", "hv", "k0"], [1, 1, kw]), tile("gr"), vec_bytes=16)
    r.ldg(tile("dt_bias", ["hv", "k0"], [1, kw]), tile("dr"), vec_bytes=16)
    r.map("bl", "sigmoid(bl)")
    r.map("gr", gate_expr("gr", "dr"), id="gate_kv")
    r.map("ab", "exp(gr)")
    r.map("kk", "kr")
    r.map("qq", "qr")
    r.reduce("sum_sq", "qf", "qs", axis=2)
    r.reduce("sum_sq", "kf", "ks", axis=2)
    r.map("qf", "qf * kf")
    r.reduce("sum", "qf", "qk", axis=2)
    r.map("ks", f"rsqrt(ks + {L2_EPS!r})")                       # rk
    r.map("qs", f"rsqrt(qs + {L2_EPS!r}) * {K ** -0.5!r}")       # rq
    r.map("Sq", "Sq * ab", id="decay_kv")
    r.map("Tq", "Sq * kk")
    r.reduce("sum", "Tq", "pk", axis=2, id="state_times_k_kv")   # this warp's rows of S^T k~
    r.map("Tq", "Sq * qq")
    r.reduce("sum", "Tq", "pq", axis=2, id="state_times_q_kv")
    _sum_over_warps(r, vec, warps)
    r.map("u", "bl * (vv - ks * pk)", id="delta_kv")
    r.map("wv", "ks * u")
    r.map("Sq", "Sq + kk * wv", id="rank1_update_kv")
    r.stg(tile("Sq"), tile(dst, ["slot", "hv", "k0", "c0"], [1, 1, kw, vec]), vec_bytes=4 * vec,
          id="scatter_state_kv")
    r.map("ov", "qs * (pq + ks * qk * u)", id="output_kv")
    with r.if_("role_warp == 0"):
        r.stg(tile("ov"), tile("o", ["b", "hv", "c0"], [1, 1, vec]), vec_bytes=2 * vec, id="store_o")


def _sum_over_warps(r, vec: int, warps: int):
    """pk, pq <- their sums over the CTA's warps: each warp's row of sP, one barrier, then every
    thread adds its columns' `warps` partials (consecutive lanes, consecutive words: no bank conflict)."""
    r.sts(tile("pk"), tile("sP", [0, "role_warp", "cl"], [1, 1, vec]), vec_bytes=4 * vec)
    r.sts(tile("pq"), tile("sP", [1, "role_warp", "cl"], [1, 1, vec]), vec_bytes=4 * vec)
    r.sync("syncthreads")
    r.lds(tile("sP", [0, 0, "cl"], [1, warps, vec]), tile("Pw"), vec_bytes=4 * vec)
    r.reduce("sum", "Pw", "pk", axis=1)
    r.lds(tile("sP", [1, 0, "cl"], [1, warps, vec]), tile("Pw"), vec_bytes=4 * vec)
    r.reduce("sum", "Pw", "pq", axis=1)


SEEDS = {"kda_decode_sm80": lambda: kda_decode()}

FAMILIES = {
    "kda_decode_sm80": {
        "make": kda_decode,
        "defaults": signature_defaults(kda_decode),
        # vw 4 holds too many registers with both layouts' tiles; 32 is over the 16-wide vector limit
        "space": {"vw": [8, 16], "vsplit": [1, 2, 4]},
        "check": lambda p: V % (p["vw"] * p["vsplit"]) == 0,
        "tactics": {"retile": ["vsplit"], "warp_split": ["vw"]},
    },
}
