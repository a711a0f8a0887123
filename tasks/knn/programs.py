"""Seed programs for exact kNN: a distance GEMM on tensor cores (mma.sync, sm_80+) whose epilogue keeps
a running top-k per query in registers (threshold test, sorted insertion), so the Q x M distance matrix
is never written. `python -m tasks.export_seeds` writes them to seeds/*.json."""
from contextlib import nullcontext
from typing import Callable, Optional

from tasks.base import signature_defaults
from cake_ir.builder import KernelBuilder, fit_ident, tile
from cake_ir.nodes import Program, Workspace

BIG = 3.0e38   # list sentinel: worse than any finite score


WS_ROWS = 1 << 17   # rows of the split path's partial-list workspace (the task's `workspace`; 2^17: an
                    # 8-way split of 10000 queries in tiles of 128)
WS_TILES = 1 << 12  # query-tile counters in the workspace
# the norms workspace's columns: M rounded up to 16 bytes, so the search kernel's 16-byte cp.async
# chunks of its last tile stay inside it (the norms kernel writes the padding rows' zero norms)
XN_COLS = "cdiv(M, 4) * 4"


def knn_db_norms(d: int = 128, rows: int = 128, arch: str = "sm_80", src: str = "Xb", n: str = "M",
                 dst: str = "XN"):
    """The first kernel of the `norms="global"` Program: squared norms of the database rows, once, into
    the workspace XN [1, XN_COLS] (a row per thread, summed as the search kernel's per-tile `reduce`
    did; the padding columns past M get the zero norm of the zero-filled rows). src / n / dst name
    another row set (the wgmma search's query norms: Xq, Q, QN)."""
    name = f"knn_db_norms_d{d}" if src == "Xb" else f"knn_{src.lower()}_norms_d{d}"
    kb = KernelBuilder(name, arch=arch, grid=[f"cdiv({n}, BR)"], threads=rows,
                       note=f"squared norms of the rows of {src} (read by the kNN search kernel)")
    kb.const(BR=rows, D=d)
    kb.scalar(n, min=1)
    kb.tensor(src, "f16", [n, "D"])
    kb.tensor(dst, "f32", [1, f"cdiv({n}, 4) * 4"], access="write")
    dw = -(-d // 8) * 8     # the staged row: D rounded up to 16 bytes, the columns past D zero-filled
    kb.buffer("sX", "smem", "f16", [rows, dw], pad=8)
    kb.buffer("nv", "smem", "f32", [rows])
    kb.buffer("nr", "reg", "f32", [1, 1], layout="row_major", scope="thread")
    with kb.role("main", warps=(0, rows // 32)) as r:
        r.let("m0", "bid.x * BR")
        r.copy("cp_async", tile(src, ["m0", 0], [rows, dw]), tile("sX"), oob="zfill", vec_bytes=vec_bytes(d),
               id="load_rows")
        r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=0)
        r.sync("syncthreads")
        r.reduce("sum_sq", tile("sX"), tile("nv"), id="db_norms")
        r.sync("syncthreads")
        r.lds(tile("nv", ["tid"], [1]), tile("nr"), vec_bytes=4)
        r.stg(tile("nr"), tile(dst, [0, "m0 + tid"], [1, 1]), oob="mask", vec_bytes=4, id="store_norms")
    return kb.build()


def vec_bytes(d: int) -> int:
    """The widest cp.async chunk that holds whole columns of an f16 row of d and stays aligned (16 bytes when
    d % 8 == 0): a chunk starting before D ends before it, so zfill's per-chunk column test is exact."""
    for v in (16, 8, 4):
        if (2 * d) % v == 0:
            return v
    raise ValueError(f"an f16 row of d = {d} columns has no 4-byte aligned chunks (pad D to even)")


def norm_rows(d: int) -> int:
    """Rows per CTA of the norms kernels (a row per thread): the [rows, D] staged tile within ~64 KB of smem
    (D <= 128 keeps 128 rows)."""
    return 128 if d <= 128 else 64 if d <= 256 else 32


def declare_search_io(kb, bq: int, bn: int, d: int, k: int, split: int, outputs: bool = True) -> None:
    """The search kernels' constants, scalars and tensors (the task's interface, tasks/knn/task.py);
    outputs=False: a sampling kernel's (it writes only the bounds TH, not I / Dist)."""
    kb.const(BQ=bq, BN=bn, D=d, KK=k, SPLIT=split, WR=WS_ROWS, WTR=WS_TILES)
    kb.scalar("Q", min=1)
    kb.scalar("M", min=k)
    kb.tensor("Xq", "f16", ["Q", "D"])
    kb.tensor("Xb", "f16", ["M", "D"])
    if outputs:
        kb.tensor("I", "i32", ["Q", "KK"], access="write")
        kb.tensor("Dist", "f32", ["Q", "KK"], access="write")
    # the split path's scratch (declared by every variant: the task passes it to all of them)
    kb.tensor("PV", "f32", ["WR", "KK"], access="readwrite")
    kb.tensor("PI", "i32", ["WR", "KK"], access="readwrite")
    kb.tensor("WT", "i32", ["WTR", 1], access="readwrite")
    # the split path's shared per-query bounds of the k-th best (topk shared_bound; 0 = none, left zeroed)
    kb.tensor("TH", "i32", ["WR", 1], access="readwrite")


def shares_bound(k: int, split: int, ws: int = 1, share: bool = True) -> bool:
    """The search's `topk` shares each query's bound between the CTAs (and warps) that split its
    database: k > 1 (a top-1's running best needs none) with more than one of them."""
    return share and k > 1 and (split > 1 or ws > 1)


def sample_rows(kb, r, f: int, bn: int) -> Callable[[str], str]:
    """A sampling kernel (a seeded search's first kernel, `seed` = f) scores every f-th BN-row tile of the
    database: the constant SF = f and MV, the sample's rows (cdiv(M, f BN) tiles of BN), over which the
    usual split / chunk arithmetic runs; returns the map from a sample row (a multiple of BN, e.g.
    m0 + t * BN) to its database row. Tiles past M are zero-filled and masked by the limit M, and the
    chunks of the sample are disjoint, so every sampled row is scored once."""
    kb.const(SF=f)
    r.let("MV", "cdiv(M, SF * BN) * BN")
    return lambda v: f"(({v}) / BN) * (SF * BN)"


def seeded_bound(k: int, seed: int) -> bool:
    """The search filters from its first tile with the bound a sampling kernel left in TH (`seed` = f:
    the k-th best of every f-th database tile, a bound of the row's k-th best over the whole database)."""
    return seed > 0 and k > 1


def reset_bounds(r, rows: str) -> None:
    """Zero the shared-bound words of the tile's query rows (`rows`: this thread's row, < BQ): the last
    CTA of a query tile runs after every reader, and the next launch finds no bound."""
    r.fill("zb", 0)
    r.stg(tile("zb"), tile("TH", [f"q0 + {rows}", 0], [1, 1]), oob="mask", vec_bytes=4, id="reset_bounds")


def declare_topk_queue(kb, rows: int, queue: int) -> dict:
    """The deferred insertion's queue beside a warp's [rows, k] lists (mma_rows [rows, queue] values and
    indices), as the `topk` / `topk_merge` fields that name it ({} for queue 0). The program fills qi
    with -1 before the stream (E-TOPK-02)."""
    if not queue:
        return {}
    kb.buffer("qv", "reg", "f32", [rows, queue], layout="mma_rows", scope="warp")
    kb.buffer("qi", "reg", "i32", [rows, queue], layout="mma_rows", scope="warp")
    return dict(queue_vals=tile("qv"), queue_idx=tile("qi"))


def knn_fused(metric: str = "l2", k: int = 10, d: int = 128, bq: int = 64, bn: int = 64, split: int = 1,
              stages: int = 2, arch: str = "sm_80", norms: str = "tile", minb: int = 1, merge: str = "serial",
              qfrag: str = "reg", wm: int = 16, ws: int = 1, queue: int = 0, share: bool = True,
              skip_pad: bool = True, seed: int = 0, sample: Optional[bool] = None, rolled: bool = True):
    """CTA (query tile, split) streams database rows [s * CH, (s + 1) * CH) (CH = M / split rounded
    up to BN) in `bn`-row tiles (cp.async double buffer). Each warp owns 16 queries, keeps their A
    fragments (all of D) in registers, computes a [16, bn] score tile with mma.sync and folds it into
    per-lane top-k lists; the 4 lanes of each quad merge at the end. L2 scores are ||q||^2 + ||x||^2
    - 2 q.x (squared database norms per tile or precomputed: `norms`); inner product keeps the k
    largest q.x.

    split = 1: one CTA per query tile owns the whole database and writes the results.
    split > 1 (few queries: the split-database path): each CTA writes its partial lists to the
    workspace PV/PI (rows (tile * split + s) * BQ + r, so padded query rows never collide); the last
    CTA of a query tile to finish (`last_cta`) merges the `split` lists per query (exact re-selection
    over the stored scores; `merge` below), writes I/Dist and zeroes the rows it read.
    `stages` database tiles are in flight per CTA (cp.async groups, wait(stages - 2)): a few-query
    search is a stream over the database, and one warp per SM needs several tiles in flight.
    Needs cdiv(Q, BQ) * BQ * split <= WS_ROWS and cdiv(Q, BQ) <= WS_TILES (the dispatcher's
    `supports`).

    norms (l2 only): "tile" computes each database tile's squared norms in smem as it arrives (every
    CTA, every tile: a row of D products per thread and a barrier per tile); "global" returns a
    Program whose first kernel (knn_db_norms) writes them once to the workspace XN [1, M] and whose
    search kernel streams XN's [1, BN] slice with each database tile (same cp.async group).
    minb: CTAs per SM the register allocation must allow (__launch_bounds__ min blocks); 1 leaves it
    to the compiler (~180 registers at k = 10: 2 CTAs of 4 warps per SM).
    merge (split > 1): "serial": one thread per query reads the `split` partial lists one after the
    other (a global-load latency each: ~0.3 ms of a Q = 1, split 512 search); "wide": both halves of
    the CTA's threads take every other split, `unroll` lists in flight per thread (their loads issued
    together), and the second half hands its list to the first through shared memory (_merge_wide).
    qfrag: "reg" keeps the query fragments in registers, "smem" re-reads them per k step (see `fa`).
    wm: query rows per warp (16 or 32: a 32-row warp tile reads each B fragment once for two mma row
    tiles and each column norm once for four list rows; twice the accumulator and lists).
    merge "kernel" (`_mk`): no last CTA; a merge kernel of its own follows the search (knn_merge: a
    warp per query, spread over the GPU; the last-CTA merge runs on one SM per query tile).
    ws (split > 1 with the wide or kernel merge, bq == wm): warps per CTA that stream the database, each its
    own chunk with its own ring of `stages` smem slots (a warp-scope cp.async pipeline, syncwarp, no
    CTA barrier in the loop; norms "tile": each warp sums its own tile's norms), all sharing the CTA's
    query tile: the few-query search is a pure stream with ws warps per CTA (ws x the memory and
    epilogue parallelism of one warp per CTA); each CTA merges its warps' lists in smem first
    (_merge_warps), so the last CTA merges SPLIT lists with all ws * 32 threads.

    The top-k epilogue (the `topk` lowering, k > 1) filters each lane's scores against the quad's k-th
    entry before the exact insertion (docs/ir.md `topk`).

    queue (k > 1): T pending entries per row and lane, the deferred insertion (`topk` queue_vals /
    queue_idx): the warp's lanes insert their queued scores together instead of one divergent insertion
    per column where any lane has a passing score; the merge inserts what is left.

    share (k > 1, split > 1 or ws > 1): the CTAs and warps that split a query's database share its
    bound of the k-th best through the workspace TH (`topk` shared_bound): a candidate another split
    has already beaten k times costs one compare, where each split alone would insert its own first
    ~k ln(CH / k) candidates per lane list; the last CTA zeroes the tile's words.

    skip_pad (k > 1): the query rows past Q (the last tile's padding: 15 of 16 rows at Q = 1) never
    enter the insertion (`topk` valid_rows); their lanes only join the shuffles.

    seed = f (k > 1): a Program whose first search kernel (`sample=True`, the same build; False: the search
    kernel alone) scores every f-th BN-row tile of the database and stores each query's k-th best of
    that sample as its bound in
    TH (`topk_bound` store; its splits merge as the search's do); the search then loads those bounds
    before its first tile (`topk_bound` load) and filters every tile with them, where each split alone
    starts from an empty list (~k ln(CH / k) insertions per lane list, most in the first tiles). Exact:
    the sample's k entries are database rows scored by the same code, so the row's k-th best over the
    database is at least as good (ties pass the filter). The sample costs 1 / f of the stream; its bound
    is about the row's (k f / M)-quantile. An unsplit seeded search zeroes its tile's words at the end.

    rolled (k > 1): a row's passing scores are inserted by one rolled loop over a mask of them (`topk` rolled)
    instead of an unrolled insertion per column: the search kernel's code shrinks by ~bn / 4 copies of the
    insertion per row (ncu: the k = 32 builds stall on the instruction cache)."""
    gnorm = norms == "global" and metric == "l2"
    if seeded_bound(k, seed) and sample is None:   # the sampling kernel, then the search that reads its bounds
        kw = dict(metric=metric, k=k, d=d, bq=bq, bn=bn, split=split, stages=stages, arch=arch, norms=norms, minb=minb,
                  merge=merge, qfrag=qfrag, wm=wm, ws=ws, queue=queue, share=share, skip_pad=skip_pad, seed=seed,
                  rolled=rolled)
        return seeded_program(knn_fused(**kw, sample=True), knn_fused(**kw, sample=False), arch)
    sampling = bool(sample) and seeded_bound(k, seed)
    seeded = seeded_bound(k, seed) and not sampling
    wide = split > 1 and merge == "wide"
    kmerge = split > 1 and merge == "kernel"     # the merge is a kernel of its own (knn_merge)
    rmerge = split > 1 and merge == "rows"       # the last CTA's threads spread over the tile's real rows
    tmerge = split > 1 and merge == "tail"       # the last CTAs of each tile merge, a warp per row (arrive_wait)
    if ws > 1 and (not (wide or kmerge or rmerge or tmerge) or bq != wm):
        raise ValueError("ws > 1 needs split > 1 with the wide, rows, tail or kernel merge and bq == wm")
    if (rmerge or tmerge) and seeded_bound(k, seed):
        raise ValueError(f"the {merge} merge stores results, not a sample's bounds: "
                         "seed needs the wide or kernel merge")
    warps = bq // wm * ws
    l2 = metric == "l2"
    queue = queue if k > 1 else 0   # a top-1 keeps a running best: nothing to defer
    tag = (f"_s{split}" if split > 1 else "") + (f"_p{stages}" if stages != 2 else "") + ("_gn" if gnorm else "") \
        + (f"_b{minb}" if minb != 1 else "") \
        + ("_mw" if wide else "_mk" if kmerge else "_mr" if rmerge else "_mt" if tmerge else "") \
        + ("_qs" if qfrag == "smem" else "") \
        + (f"_w{wm}" if wm != 16 else "") + (f"_ws{ws}" if ws > 1 else "") + (f"_q{queue}" if queue else "")
    shared = shares_bound(k, split, ws, share)
    tag += "_sb" if shared else ""
    tag += f"_sd{seed}" if seeded else f"_smp{seed}" if sampling else ""
    grid = ["cdiv(Q, BQ)", "SPLIT"] if split > 1 else ["cdiv(Q, BQ)"]
    kb = KernelBuilder(fit_ident(f"knn_{metric}_k{k}_d{d}_{bq}x{bn}{tag}"), arch=arch, grid=grid, threads=32 * warps,
                       min_blocks_per_sm=minb,
                       note=(f"the sample (every {seed}-th tile) of a seeded kNN search: each query's k-th best as its "
                             "bound in TH; " if sampling else "")
                            + f"exact kNN ({metric}), top-{k} fused into the mma.sync distance GEMM"
                            + (f", database split over {split} CTAs" + (f" x {ws} warps" if ws > 1 else "")
                               + (" + merge kernel" if kmerge else " + last-CTA merge over the real query rows"
                                  if rmerge else " + merge by the last CTAs, a warp per row" if tmerge
                                  else " + last-CTA merge") if split > 1 else ""))
    declare_search_io(kb, bq, bn, d, k, split, outputs=not sampling)
    if gnorm:
        kb.tensor("XN", "f32", [1, XN_COLS])
    if d % 2 or (qfrag == "reg" and d % 16):
        raise ValueError(f"d must be even (qfrag 'reg': a multiple of 16), got {d}")
    dp = -(-d // 16) * 16     # the staged rows: D rounded up to the mma's k step, the columns past D zero-filled
    vec = vec_bytes(d)        # (cp.async chunks of whole columns: zfill's column test is exact)
    kb.buffer("sQ", "smem", "f16", [bq, dp], pad=8)
    kb.buffer("sB", "smem", "f16", [ws * bn, dp], pad=8, stages=stages)   # warp w's tiles at rows w * BN
    if l2:
        kb.buffer("qn", "smem", "f32", [bq])
        if gnorm:
            kb.buffer("cn", "smem", "f32", [1, ws * bn], stages=stages)
        elif ws > 1:
            kb.buffer("cn", "smem", "f32", [1, ws * bn])
        else:
            kb.buffer("cn", "smem", "f32", [bn])
    # qfrag "reg": the warp's query A fragments for all of D stay in registers (d / 4 of them);
    # "smem": re-read per 16-wide k step from sQ with the B fragments (8 more ldmatrix per tile at D = 128,
    # 28 fewer registers: more CTAs per SM)
    kb.buffer("fa", "reg", "f16", [wm, d if qfrag == "reg" else 16], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "f16", [bn, 16], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [wm, bn], layout="mma_acc", scope="warp")
    kb.buffer("tv", "reg", "f32", [wm, k], layout="mma_rows", scope="warp")
    kb.buffer("ti", "reg", "i32", [wm, k], layout="mma_rows", scope="warp")
    qref = declare_topk_queue(kb, wm, queue)
    halves = 32 * warps // bq
    if wide and split % halves:   # (the serial merge takes any split)
        raise ValueError(f"the merge deals the {split} partial lists of a query to {halves} thread groups: "
                         f"split must be a multiple of {halves}")
    unroll = _merge_unroll(split, k, d, bn, wm, qfrag, 1 if rmerge else halves) if wide or rmerge else 1
    if tmerge:              # the tail's row merge (merge_query_row), then ws > 1: the CTA's merge of its warps
        declare_row_merge(kb, k, split, warps, reset=shared)
    if (kmerge or tmerge) and ws > 1:   # only the CTA's merge of its warps' lists (_merge_warps)
        own = ((("mv", "f32"), ("pv0", "f32"), ("mi", "i32"), ("pi0", "i32")) if kmerge
               else (("pv0", "f32"), ("pi0", "i32")))
        for n, dt in own:
            kb.buffer(n, "reg", dt, [1, k], layout="row_major", scope="thread")
        kb.buffer("hmv", "smem", "f32", [ws * bq, k])
        kb.buffer("hmi", "smem", "i32", [ws * bq, k])
    elif split > 1 and not (kmerge or tmerge):
        for n in ("pv", "mv") + tuple(f"pv{u}" for u in range(unroll) if wide or rmerge):
            kb.buffer(n, "reg", "f32", [1, k], layout="row_major", scope="thread")
        for n in ("pi", "mi") + tuple(f"pi{u}" for u in range(unroll) if wide or rmerge):
            kb.buffer(n, "reg", "i32", [1, k], layout="row_major", scope="thread")
        # the other groups' lists, handed to the first through smem (ws > 1: first the warps' lists, for
        # the CTA's own merge); rows: every thread's list, for the tree
        hrows = max(32 * warps, ws * bq) if rmerge else max(halves - 1, ws if ws > 1 else 0) * bq
        if (wide or rmerge) and hrows:
            kb.buffer("hmv", "smem", "f32", [hrows, k])
            kb.buffer("hmi", "smem", "i32", [hrows, k])
    if (shared or seeded) and not (kmerge or tmerge):   # the reset's word (a merge kernel or the tail's declared)
        kb.buffer("zb", "reg", "i32", [1, 1], layout="row_major", scope="thread")
    if shared:
        kb.buffer("bc", "reg", "f32", [wm, 1], layout="mma_rows", scope="warp")   # the bound as last read
    if seeded:
        kb.buffer("gb", "reg", "f32", [wm, 1], layout="mma_rows", scope="warp")   # the sample's bound
    kind = "min" if l2 else "max"
    worst = -BIG if not l2 else BIG
    # ws > 1: every warp has the CTA's queries and its own database chunk and smem rows (ws = 1 keeps
    # the tiles' default offsets and the copies' default scope: the IR of the other variants unchanged)
    cscope = "warp" if ws > 1 else None

    def sb(slot):      # this warp's database tile in slot `slot`
        return tile("sB", ["rb", 0], [bn, dp], slot=slot) if ws > 1 else tile("sB", slot=slot)

    def cnt(slot):     # its database norms (norms "global": staged per slot)
        return tile("cn", [0, "rb"], [1, bn], slot=slot) if ws > 1 else tile("cn", slot=slot)
    with kb.role("main", warps=(0, warps)) as r:
        r.let("q0", "bid.x * BQ")
        r.let("wq0", "0" if ws > 1 else f"role_warp * {wm}")
        if ws > 1:
            r.let("rb", "role_warp * BN")
        # the rows split over the CTAs: the database's, or (sampling) the sample's, mapped to database rows
        dbrow = sample_rows(kb, r, seed, bn) if sampling else (lambda v: v)
        n_rows = "MV" if sampling else "M"
        if split > 1:
            r.let("s", f"bid.y * {ws} + role_warp" if ws > 1 else "bid.y")
            r.let("CH", f"cdiv(cdiv({n_rows}, SPLIT * {ws}), BN) * BN" if ws > 1 else f"cdiv(cdiv({n_rows}, SPLIT), BN) * BN")
            r.let("m0", "s * CH")
            # ws > 1: every warp runs the chunk's CH / BN tiles (a warp-uniform trip count; tiles past M
            # are zero-filled without a global read and masked by `limit`)
            r.let("nt", "CH / BN" if ws > 1 else f"cdiv(max(min(CH, {n_rows} - m0), 0), BN)")
        else:
            r.let("m0", "0")
            r.let("nt", f"cdiv({n_rows}, BN)")
        r.copy("cp_async", tile("Xq", ["q0", 0], [bq, dp]), tile("sQ"), oob="zfill", vec_bytes=vec, id="load_queries")
        r.copy("cp_async", tile("Xb", [dbrow("m0"), 0], [bn, dp]), sb(0), oob="zfill", vec_bytes=vec, scope=cscope)
        if gnorm:
            r.copy("cp_async", tile("XN", [0, dbrow("m0")], [1, bn]), cnt(0), oob="zfill", scope=cscope)
        r.sync("cp_async_commit")
        for p in range(1, stages - 1):   # fill the pipeline (rows past the chunk are masked by `limit`)
            r.copy("cp_async", tile("Xb", [dbrow(f"m0 + {p} * BN"), 0], [bn, dp]), sb(p), oob="zfill", vec_bytes=vec,
                   scope=cscope)
            if gnorm:
                r.copy("cp_async", tile("XN", [0, dbrow(f"m0 + {p} * BN")], [1, bn]), cnt(p), oob="zfill",
                       scope=cscope)
            r.sync("cp_async_commit")
        r.sync("cp_async_wait", n=stages - 2)
        r.sync("syncthreads")
        if qfrag == "reg":
            r.ldmatrix(tile("sQ", ["wq0", 0], [wm, d]), tile("fa"), id="query_fragments")
        if l2:
            r.reduce("sum_sq", tile("sQ"), tile("qn"), id="query_norms")
            if ws > 1:   # the loop's barrier is a syncwarp: every warp reads every query norm
                r.sync("syncthreads")
        r.fill("tv", worst)
        r.fill("ti", -1)
        if queue:
            r.fill("qi", -1)
        if seeded:       # the sample's bounds, before the first tile
            r.add("topk_bound", kind=kind, mode="load", vals=tile("gb"), bound=tile("TH", ["q0 + wq0", 0], [wm, 1]),
                  id="load_bounds")
        if shared:
            r.fill("bc", worst)
        ahead = stages - 1
        with r.for_("t", 0, "nt", id="db_loop"):
            r.sync("cp_async_wait", n=stages - 2)   # tile t has landed
            # and every warp is done with tile t - 1's slot (ws > 1: the slot is this warp's own)
            r.sync("syncwarp" if ws > 1 else "syncthreads")
            with r.if_(f"t + {ahead} < nt"):
                r.copy("cp_async", tile("Xb", [dbrow(f"m0 + (t + {ahead}) * BN"), 0], [bn, dp]),
                       sb(f"(t + {ahead}) % {stages}"), oob="zfill", vec_bytes=vec, id="prefetch", scope=cscope)
                if gnorm:
                    r.copy("cp_async", tile("XN", [0, dbrow(f"m0 + (t + {ahead}) * BN")], [1, bn]),
                           cnt(f"(t + {ahead}) % {stages}"), oob="zfill", id="prefetch_norms", scope=cscope)
            r.sync("cp_async_commit")                # always: one group per iteration keeps the count exact
            if l2 and not gnorm and ws > 1:
                r.reduce("sum_sq", sb(f"t % {stages}"), tile("cn", [0, "rb"], [1, bn]), id="db_norms", scope="warp")
                r.sync("syncwarp")
            elif l2 and not gnorm:
                r.reduce("sum_sq", tile("sB", slot=f"t % {stages}"), tile("cn"), id="db_norms")
                r.sync("syncthreads")
            r.fill("acc", 0.0)
            for kk in range(dp // 16):
                r.ldmatrix(tile("sB", ["rb" if ws > 1 else 0, kk * 16], [bn, 16], slot=f"t % {stages}"), tile("fb"))
                if qfrag == "reg":
                    r.mma_sync(tile("fa", [0, kk * 16], [wm, 16]), tile("fb"), tile("acc"))
                else:
                    r.ldmatrix(tile("sQ", ["wq0", kk * 16], [wm, 16]), tile("fa"))
                    r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
            # the split's last tile may run past its chunk into the next split's rows: `limit` stops
            # at the chunk end (or M), so every database row is scored by exactly one split
            # (sampling: a chunk's tiles stay in it, the limit is the database's end)
            lim = "min(m0 + CH, M)" if split > 1 and not sampling else "M"
            topk = dict(kind=kind, k=k, src=tile("acc"), vals=tile("tv"), idx=tile("ti"), col=dbrow("m0 + t * BN"),
                        limit=lim, **qref)
            if shared:
                topk.update(shared_bound=tile("TH", ["q0 + wq0", 0], [wm, 1]), bound_cache=tile("bc"))
            if seeded:
                topk["given_bound"] = tile("gb")
            if skip_pad and k > 1:
                topk["valid_rows"] = "Q - q0 - wq0"
            if rolled and k > 1:
                topk["rolled"] = True
            if l2:
                topk.update(scale=-2.0, row_bias=tile("qn", ["wq0"], [wm]),
                            col_bias=cnt(f"t % {stages}") if gnorm
                            else tile("cn", [0, "rb"], [1, bn]) if ws > 1 else tile("cn"))
            r.add("topk", id="select", **topk)
        # a chunk shorter than the pipeline (small M) leaves prefetch groups in flight (zero-filled rows
        # past the chunk): retire them before the CTA can exit (E-PIP-04, seen once the simulator ran
        # the stream's per-warp trip counts)
        r.sync("cp_async_wait", n=0)
        r.add("topk_merge", kind=kind, vals=tile("tv"), idx=tile("ti"), id="merge", **qref)
        if split == 1 and sampling:
            r.add("topk_bound", kind=kind, mode="store", vals=tile("tv"), bound=tile("TH", ["q0 + wq0", 0], [wm, 1]),
                  id="store_bounds")
        elif split == 1:
            r.stg(tile("tv"), tile("Dist", ["q0 + wq0", 0], [wm, k]), oob="mask", vec_bytes=4, id="store_dist")
            r.stg(tile("ti"), tile("I", ["q0 + wq0", 0], [wm, k]), oob="mask", vec_bytes=4, id="store_idx")
            if seeded:   # the CTA's warps are done reading their rows' words: leave them zeroed
                r.sync("syncthreads")
                with r.if_("tid < BQ"):
                    reset_bounds(r, "tid")
        else:
            if ws > 1:
                _merge_warps(r, k, kind, ws, bq)
            else:
                r.let("pr", "(bid.x * SPLIT + s) * BQ + wq0")
                r.stg(tile("tv"), tile("PV", ["pr", 0], [wm, k]), oob="mask", vec_bytes=4, id="store_partial_dist")
                r.stg(tile("ti"), tile("PI", ["pr", 0], [wm, k]), oob="mask", vec_bytes=4, id="store_partial_idx")
            if tmerge:
                _merge_tail(r, k, kind, worst, split, warps, tail_waiters(bq, wm, ws), shared)
            elif not kmerge:   # (kmerge: the merge kernel after this one, knn_merge, takes the partial lists)
                fin = r.add("last_cta", id="merge_splits", counter=tile("WT", ["bid.x", 0], [1, 1]), count="SPLIT",
                            body=[])
                with r._nest(fin["body"]):
                    if wide:
                        _merge_wide(r, k, kind, worst, unroll, halves, shared or seeded, sampling)
                    elif rmerge:
                        _merge_rows(r, k, kind, worst, unroll, 32 * warps, shared)
                    else:
                        _merge_serial(r, k, kind, worst, shared or seeded, sampling)
    search = kb.build()
    after = [knn_merge(k, bq, split, kind, publish=sampling, reset=shared or seeded, arch=arch)] if kmerge else []
    if not gnorm and not after:
        return search
    return Program(name=search.name, arch=arch,
                   workspace=[Workspace(name="XN", dtype="f32", shape=[1, XN_COLS])] if gnorm else [],
                   kernels=([knn_db_norms(d, rows=norm_rows(d), arch=arch)] if gnorm else []) + [search] + after)


def tail_waiters(bq: int, wm: int = 16, ws: int = 1) -> int:
    """The tail merge's waiting CTAs per query tile: a warp per query row, cdiv(BQ, warps) CTAs (at most the
    split's)."""
    return -(-bq // (bq // wm * ws))


def _merge_tail(r, k: int, kind: str, worst: float, split: int, warps: int, waiters: int, reset: bool) -> None:
    """merge="tail": every CTA of a query tile arrives on the tile's counter (WT) after storing its partial
    lists; the last W = cdiv(BQ, warps) CTAs of the tile (bid.y >= SPLIT - W: dispatched after all the others)
    wait for all SPLIT arrivals, then each warp merges one query row as the merge kernel does
    (merge_query_row): the merge kernel's work without its launch."""
    if waiters > split:
        raise ValueError(f"the tail merge needs split >= cdiv(BQ, warps) = {waiters}, got {split}")
    first = f"(SPLIT - {waiters})"
    fin = r.add("arrive_wait", id="merge_tail", counter=tile("WT", ["bid.x", 0], [1, 1]), count="SPLIT",
                waiters=waiters, when=f"bid.y >= {first}", body=[])
    with r._nest(fin["body"]):
        slot = f"max(bid.y - {first}, 0) * {warps} + role_warp"   # (max: provably >= 0 for the verifier)
        merge_query_row(r, k, split, kind, worst, f"bid.x * BQ + {slot}", f"{slot} < BQ", publish=False, reset=reset)


def _merge_serial(r, k: int, kind: str, worst: float, reset: bool, sampling: bool) -> None:
    """The last CTA's serial merge: thread tid < BQ merges the SPLIT partial lists of query row tid one
    after the other, zeroing each row it read; stores the result (sampling: the row's bound instead) and,
    with `reset`, zeroes the row's shared-bound word."""
    # every row of the tile is merged (and so zeroed), also a padded query's; only real
    # queries are stored
    with r.if_("tid < BQ"):
        r.fill("mv", worst)
        r.fill("mi", -1)
        with r.for_("j", 0, "SPLIT", id="merge_loop"):
            r.let("rr", "(bid.x * SPLIT + j) * BQ + tid")
            r.ldg(tile("PV", ["rr", 0], [1, k]), tile("pv"), oob="zfill", vec_bytes=4)
            r.ldg(tile("PI", ["rr", 0], [1, k]), tile("pi"), oob="zfill", vec_bytes=4)
            r.add("topk", kind=kind, k=k, src=tile("pv"), src_idx=tile("pi"), vals=tile("mv"),
                  idx=tile("mi"), src_sorted=True)
            # leave the workspace zeroed for the next launch (each row is read by this thread only)
            r.fill("pv", 0.0)
            r.fill("pi", 0)
            r.stg(tile("pv"), tile("PV", ["rr", 0], [1, k]), oob="mask", vec_bytes=4)
            r.stg(tile("pi"), tile("PI", ["rr", 0], [1, k]), oob="mask", vec_bytes=4)
        if sampling:   # the sample's k-th best is the row's bound (every row of the tile)
            r.add("topk_bound", kind=kind, mode="store", vals=tile("mv"),
                  bound=tile("TH", ["q0 + tid", 0], [1, 1]), id="store_bounds")
        else:
            if reset:
                reset_bounds(r, "tid")
            with r.if_("q0 + tid < Q"):
                r.stg(tile("mv"), tile("Dist", ["q0 + tid", 0], [1, k]), vec_bytes=4, id="store_dist")
                r.stg(tile("mi"), tile("I", ["q0 + tid", 0], [1, k]), vec_bytes=4, id="store_idx")


MERGE_WARPS = 4   # queries (one warp each) per CTA of the merge kernel


def knn_merge(k: int, bq: int, split: int, kind: str = "min", publish: bool = False, reset: bool = True,
              arch: str = "sm_80", warps: int = MERGE_WARPS):
    """The split search's merge as a kernel of its own (`merge="kernel"`, after the search kernel): a
    warp per query row of the search's tiles (the padded rows too, so every partial row is zeroed),
    `warps` per CTA, spread over the GPU. Lane l merges the partial lists l, l + 32, ... of its query
    (per-thread `topk` over the stored lists, each row zeroed after it is read), then the warp merges
    its 32 lists in a tree through shared memory (5 rounds of half the lanes at 32 splits). Lane 0
    stores the result (I / Dist, real queries only) and zeroes the row's shared-bound word (`reset`);
    `publish` (a sampling kernel's merge): it stores the row's k-th best as its bound instead.

    The last-CTA merge it replaces runs on one SM per query tile with two threads per query: at Q = 128,
    M = 100K, split 128 that was ~190 of the search kernel's 248 us (ncu: the SMs were
    active a quarter of its cycles), warp divergence over 32 queries per warp making most entries run
    the whole insertion.

    Every list it reads is sorted (a quad's after topk_merge, or a lane's), so each is merged by a bitonic
    network (`topk` src_sorted, as in every merge of stored lists here): at Q = 1, k = 16 the insertions
    made this kernel 34 us against the search's 45 (ncu), a serial chain of k shifts of k
    slots per list and 5 tree rounds of one warp."""
    worst = BIG if kind == "min" else -BIG
    kb = KernelBuilder(f"knn_merge_k{k}_bq{bq}_s{split}" + ("_bound" if publish else ""), arch=arch,
                       grid=["cdiv(cdiv(Q, BQ) * BQ, QW)"], threads=32 * warps,
                       note=f"merge of {split} partial top-{k} lists per query: a warp per query"
                            + (", storing each query's k-th best as its bound" if publish else ""))
    kb.const(BQ=bq, KK=k, SPLIT=split, WR=WS_ROWS, QW=warps)
    kb.scalar("Q", min=1)
    kb.tensor("PV", "f32", ["WR", "KK"], access="readwrite")
    kb.tensor("PI", "i32", ["WR", "KK"], access="readwrite")
    if publish or reset:
        kb.tensor("TH", "i32", ["WR", 1], access="readwrite")
    if not publish:
        kb.tensor("I", "i32", ["Q", "KK"], access="write")
        kb.tensor("Dist", "f32", ["Q", "KK"], access="write")
    declare_row_merge(kb, k, split, warps, reset and not publish)
    with kb.role("main", warps=(0, warps)) as r:
        merge_query_row(r, k, split, kind, worst, "bid.x * QW + role_warp", "q < cdiv(Q, BQ) * BQ", publish, reset)
    return kb.build()


def declare_row_merge(kb, k: int, split: int, warps: int, reset: bool) -> None:
    """merge_query_row's buffers: per-thread lists mv / mi (merged) and pv / pi (read), the warps' lists in
    smem for the tree (hv / hi), the reset's word zb."""
    for n, dt in (("mv", "f32"), ("pv", "f32"), ("mi", "i32"), ("pi", "i32")):
        kb.buffer(n, "reg", dt, [1, k], layout="row_major", scope="thread")
    if min(32, split) > 1:
        kb.buffer("hv", "smem", "f32", [32 * warps, k])
        kb.buffer("hi", "smem", "i32", [32 * warps, k])
    if reset:
        kb.buffer("zb", "reg", "i32", [1, 1], layout="row_major", scope="thread")


def merge_query_row(r, k: int, split: int, kind: str, worst: float, row: str, guard: str, publish: bool,
                    reset: bool) -> None:
    """One warp merges the `split` partial lists of query row `row` (padded rows included, while `guard`
    holds) into I / Dist (real queries only): lane l merges the lists l, l + 32, ... (each row zeroed after
    it is read, the workspace left as the next launch expects), then the warp merges its lanes' lists in
    a tree through smem; lane 0 stores the result and zeroes the row's shared-bound word (`reset`), or
    (`publish`) stores the row's k-th best as its bound instead."""
    vb = list_vec_bytes(k)
    lanes = min(32, split)            # lanes that hold a list after the first pass
    rounds = [1 << i for i in range(max(lanes - 1, 0).bit_length() - 1, -1, -1)]   # 16, 8, ..., 1
    r.let("q", row)                            # this warp's query row (warp-uniform)
    r.let("qt", "q / BQ")
    r.let("qr", "q % BQ")
    r.let("hr", "role_warp * 32")              # the warp's rows of hv / hi
    with r.if_(guard):
        r.fill("mv", worst)
        r.fill("mi", -1)
        with r.for_("jj", 0, "cdiv(SPLIT, 32)", id="merge_loop"):
            with r.if_("jj * 32 + lane < SPLIT"):
                r.let("rr", "(qt * SPLIT + jj * 32 + lane) * BQ + qr")
                r.ldg(tile("PV", ["rr", 0], [1, k]), tile("pv"), oob="zfill", vec_bytes=vb)
                r.ldg(tile("PI", ["rr", 0], [1, k]), tile("pi"), oob="zfill", vec_bytes=vb)
                r.add("topk", kind=kind, k=k, src=tile("pv"), src_idx=tile("pi"), vals=tile("mv"), idx=tile("mi"),
                      src_sorted=True)
                r.fill("pv", 0.0)     # leave the workspace zeroed for the next launch
                r.fill("pi", 0)
                r.stg(tile("pv"), tile("PV", ["rr", 0], [1, k]), oob="mask", vec_bytes=vb)
                r.stg(tile("pi"), tile("PI", ["rr", 0], [1, k]), oob="mask", vec_bytes=vb)
        if rounds:
            r.sts(tile("mv"), tile("hv", ["hr + lane", 0], [1, k]), vec_bytes=vb, id="stage_lists")
            r.sts(tile("mi"), tile("hi", ["hr + lane", 0], [1, k]), vec_bytes=vb)
            r.sync("syncwarp")
        for h in rounds:         # lanes < h take the list of lane + h (written the round before)
            with r.if_(f"lane < {h}"):
                r.lds(tile("hv", [f"hr + lane + {h}", 0], [1, k]), tile("pv"), vec_bytes=vb)
                r.lds(tile("hi", [f"hr + lane + {h}", 0], [1, k]), tile("pi"), vec_bytes=vb)
                r.add("topk", kind=kind, k=k, src=tile("pv"), src_idx=tile("pi"), vals=tile("mv"), idx=tile("mi"),
                      src_sorted=True)
                if h > 1:
                    r.sts(tile("mv"), tile("hv", ["hr + lane", 0], [1, k]), vec_bytes=vb)
                    r.sts(tile("mi"), tile("hi", ["hr + lane", 0], [1, k]), vec_bytes=vb)
            r.sync("syncwarp")
        with r.if_("lane == 0"):
            if publish:
                r.add("topk_bound", kind=kind, mode="store", vals=tile("mv"), bound=tile("TH", ["q", 0], [1, 1]),
                      id="store_bounds")
            else:
                if reset:
                    r.fill("zb", 0)
                    r.stg(tile("zb"), tile("TH", ["q", 0], [1, 1]), oob="mask", vec_bytes=4, id="reset_bounds")
                with r.if_("q < Q"):
                    r.stg(tile("mv"), tile("Dist", ["q", 0], [1, k]), vec_bytes=vb, id="store_dist")
                    r.stg(tile("mi"), tile("I", ["q", 0], [1, k]), vec_bytes=vb, id="store_idx")


def _kernels(ir) -> list:
    """The kernels of a build: a Program's, or the one kernel."""
    return list(ir.kernels) if isinstance(ir, Program) else [ir]


def seeded_program(sample, search, arch: str) -> Program:
    """A seeded search: the sampling build's kernels (norms, the sample, its merge), then the search build's
    that are not already there (the norms kernels run once); the search's name and workspaces."""
    first = _kernels(sample)
    have = {k.name for k in first}
    return Program(name=search.name, arch=arch, kernels=first + [k for k in _kernels(search) if k.name not in have],
                   workspace=list(search.workspace) if isinstance(search, Program) else [])


def _merge_unroll(split: int, k: int, d: int, bn: int, wm: int = 16, qfrag: str = "reg", halves: int = 2) -> int:
    """Partial lists in flight per thread in the wide merge (each of the `halves` thread groups takes
    split / halves): up to 4, within the verifier's register budget (E-RES-05 sums every register tile
    of the role: query fragments, accumulator, B fragments, the mma_rows lists, the merge lists)."""
    fa = wm * d // 64 if qfrag == "reg" else wm // 4
    base = fa + wm * bn // 32 + bn // 4 + wm * k // 4 + 2 * k + 16
    u = 4
    while u > 1 and ((split // halves) % u or base + 2 * k * u > 250):
        u //= 2
    return u


def _merge_warps(r, k: int, kind: str, ws: int, bq: int) -> None:
    """ws > 1: the CTA's own merge of its warps' lists (each warp's quads hold its merged lists, [BQ, k]),
    through smem: thread qq < BQ merges the ws lists of query qq and stores the CTA's partial list to
    PV / PI row (bid.x * SPLIT + bid.y) * BQ + qq, so the last CTA merges SPLIT lists, not SPLIT * ws."""
    r.sts(tile("tv"), tile("hmv", ["role_warp * BQ", 0], [bq, k]), vec_bytes=4, id="stage_warp_lists")
    r.sts(tile("ti"), tile("hmi", ["role_warp * BQ", 0], [bq, k]), vec_bytes=4)
    r.sync("syncthreads")
    with r.if_("tid < BQ"):
        r.lds(tile("hmv", ["tid", 0], [1, k]), tile("mv"), vec_bytes=4)
        r.lds(tile("hmi", ["tid", 0], [1, k]), tile("mi"), vec_bytes=4)
        with r.for_("w", 1, ws, id="merge_warps"):
            r.lds(tile("hmv", ["w * BQ + tid", 0], [1, k]), tile("pv0"), vec_bytes=4)
            r.lds(tile("hmi", ["w * BQ + tid", 0], [1, k]), tile("pi0"), vec_bytes=4)
            r.add("topk", kind=kind, k=k, src=tile("pv0"), src_idx=tile("pi0"), vals=tile("mv"), idx=tile("mi"),
                  src_sorted=True)
        r.let("pr", "(bid.x * SPLIT + bid.y) * BQ + tid")
        r.stg(tile("mv"), tile("PV", ["pr", 0], [1, k]), oob="mask", vec_bytes=4, id="store_partial_dist")
        r.stg(tile("mi"), tile("PI", ["pr", 0], [1, k]), oob="mask", vec_bytes=4, id="store_partial_idx")


def list_vec_bytes(k: int) -> int:
    """The vector width of a stored [1, k] partial list's rows (rows of k words: 16-byte aligned at k % 4 == 0)."""
    return 16 if k % 4 == 0 else 8 if k % 2 == 0 else 4


def _load_stored_lists(r, k: int, unroll: int, rows_of: Callable[[int], None], guard: Optional[str] = None) -> None:
    """A last-CTA merge step's loads: the stored partial lists at PV / PI rows rr0 .. rr{unroll - 1}
    (`rows_of(u)` emits the lets of rr{u}) into pv{u} / pi{u}, every load issued before the first merge.
    `guard` ("... {u} ..."): the condition under which list u exists."""
    vb = list_vec_bytes(k)
    for u in range(unroll):
        rows_of(u)
        with r.if_(guard.format(u=u)) if guard else nullcontext():
            r.ldg(tile("PV", [f"rr{u}", 0], [1, k]), tile(f"pv{u}"), oob="zfill", vec_bytes=vb)
            r.ldg(tile("PI", [f"rr{u}", 0], [1, k]), tile(f"pi{u}"), oob="zfill", vec_bytes=vb)


def _zero_stored_list(r, k: int, u: int) -> None:
    """Leave stored list rr{u} zeroed for the next launch (each row is read by one thread only)."""
    vb = list_vec_bytes(k)
    r.fill(f"pv{u}", 0.0)
    r.fill(f"pi{u}", 0)
    r.stg(tile(f"pv{u}"), tile("PV", [f"rr{u}", 0], [1, k]), oob="mask", vec_bytes=vb)
    r.stg(tile(f"pi{u}"), tile("PI", [f"rr{u}", 0], [1, k]), oob="mask", vec_bytes=vb)


def _merge_wide(r, k: int, kind: str, worst: float, unroll: int, halves: int = 2, shared: bool = False,
                sampling: bool = False) -> None:
    """The last CTA's merge of the SPLIT partial lists of each query (row qq of the tile), by all
    halves * BQ threads: thread (g, qq) = (tid / BQ, tid % BQ) merges lists
    j = halves * m + g, `unroll` rows per step with their loads issued before the inserts; zeroes every
    row it read (padded queries' rows too, so the workspace is left zeroed); the groups g >= 1 hand their
    lists to g = 0 through smem, which merges them and stores the real queries. Exact: a top-k of top-k
    lists of a partition. shared: group 0 also zeroes the tile's shared-bound words (padded rows too).
    sampling (a seeded search's sample): group 0 stores each row's k-th best as its bound instead of
    the results (padded rows too: the search zeroes them all)."""
    r.let("qq", "tid % BQ")
    r.let("g", "tid / BQ")
    r.fill("mv", worst)
    r.fill("mi", -1)
    with r.for_("jj", 0, f"SPLIT / {halves * unroll}", id="merge_loop"):
        _load_stored_lists(r, k, unroll, lambda u: r.let(
            f"rr{u}", f"(bid.x * SPLIT + (jj * {unroll} + {u}) * {halves} + g) * BQ + qq"))
        for u in range(unroll):
            r.add("topk", kind=kind, k=k, src=tile(f"pv{u}"), src_idx=tile(f"pi{u}"), vals=tile("mv"), idx=tile("mi"),
                  src_sorted=True)
        for u in range(unroll):
            _zero_stored_list(r, k, u)
    if halves == 2:
        with r.if_("g == 1"):
            r.sts(tile("mv"), tile("hmv", ["qq", 0], [1, k]), vec_bytes=4)
            r.sts(tile("mi"), tile("hmi", ["qq", 0], [1, k]), vec_bytes=4)
        r.sync("syncthreads")
    elif halves > 2:   # group g's list at rows (g - 1) * BQ of hmv / hmi
        with r.if_("g >= 1"):
            r.sts(tile("mv"), tile("hmv", ["(g - 1) * BQ + qq", 0], [1, k]), vec_bytes=4)
            r.sts(tile("mi"), tile("hmi", ["(g - 1) * BQ + qq", 0], [1, k]), vec_bytes=4)
        r.sync("syncthreads")
    if sampling:
        with r.if_("g == 0"):
            _merge_groups(r, k, kind, halves)
            r.add("topk_bound", kind=kind, mode="store", vals=tile("mv"), bound=tile("TH", ["q0 + qq", 0], [1, 1]),
                  id="store_bounds")
        return
    if shared:
        with r.if_("g == 0"):
            reset_bounds(r, "qq")
    with r.if_("g == 0 && q0 + qq < Q"):
        _merge_groups(r, k, kind, halves)
        r.stg(tile("mv"), tile("Dist", ["q0 + qq", 0], [1, k]), vec_bytes=4, id="store_dist")
        r.stg(tile("mi"), tile("I", ["q0 + qq", 0], [1, k]), vec_bytes=4, id="store_idx")


def _merge_rows(r, k: int, kind: str, worst: float, unroll: int, threads: int, shared: bool) -> None:
    """The last CTA's merge with its threads spread over the tile's nr = min(BQ, Q - q0) real query rows:
    tpr = threads / nr threads per row, thread (row, sub) = (tid / tpr, tid % tpr) merges lists sub,
    sub + tpr, ... (`unroll` loads in flight), then the row's threads halve their lists in a tree through
    smem (rounds h = threads / 2, ..., 1: a thread sub < h takes the list of sub + h while sub + h < tpr).
    At Q = 8 of a 16-row tile and 128 threads: 8 lists and 4 tree rounds a thread, where the wide merge's
    groups of 16 rows (8 of them padding) take 16 lists and 7 more serially. Every partial row is zeroed,
    the padded rows' too; `shared`: the tile's bound words as well."""
    vb = list_vec_bytes(k)
    r.let("nr", "min(BQ, Q - q0)")
    r.let("tpr", f"{threads} / nr")
    r.let("row", "tid / tpr")
    r.let("sub", "tid % tpr")
    r.fill("mv", worst)
    r.fill("mi", -1)
    with r.for_("mm", 0, f"cdiv(SPLIT, tpr * {unroll})", id="merge_loop"):
        def rows_of(u):
            r.let(f"j{u}", f"(mm * {unroll} + {u}) * tpr + sub")
            r.let(f"rr{u}", f"(bid.x * SPLIT + j{u}) * BQ + row")
        _load_stored_lists(r, k, unroll, rows_of, guard="row < nr && j{u} < SPLIT")
        for u in range(unroll):
            with r.if_(f"row < nr && j{u} < SPLIT"):
                r.add("topk", kind=kind, k=k, src=tile(f"pv{u}"), src_idx=tile(f"pi{u}"), vals=tile("mv"),
                      idx=tile("mi"), src_sorted=True)
                _zero_stored_list(r, k, u)
    r.fill("pv0", 0.0)
    r.fill("pi0", 0)
    r.let("np", "max(BQ - nr, 1)")
    with r.for_("z", "tid", "SPLIT * (BQ - nr)", step=threads, id="zero_padded_rows"):
        r.let("zr", "(bid.x * SPLIT + z / np) * BQ + nr + z % np")
        r.stg(tile("pv0"), tile("PV", ["zr", 0], [1, k]), oob="mask", vec_bytes=vb)
        r.stg(tile("pi0"), tile("PI", ["zr", 0], [1, k]), oob="mask", vec_bytes=vb)
    h = threads // 2
    while h >= 1:
        with r.if_(f"row < nr && sub >= {h} && sub < {2 * h}"):
            r.sts(tile("mv"), tile("hmv", ["tid", 0], [1, k]), vec_bytes=4)
            r.sts(tile("mi"), tile("hmi", ["tid", 0], [1, k]), vec_bytes=4)
        r.sync("syncthreads")
        with r.if_(f"row < nr && sub < {h} && sub + {h} < tpr"):   # (the partner, tid + h, is of this row)
            r.lds(tile("hmv", [f"min(tid + {h}, {threads - 1})", 0], [1, k]), tile("pv0"), vec_bytes=4)
            r.lds(tile("hmi", [f"min(tid + {h}, {threads - 1})", 0], [1, k]), tile("pi0"), vec_bytes=4)
            r.add("topk", kind=kind, k=k, src=tile("pv0"), src_idx=tile("pi0"), vals=tile("mv"), idx=tile("mi"),
                  src_sorted=True)
        r.sync("syncthreads")   # (the next round's senders write rows this round's readers may still read)
        h //= 2
    if shared:
        with r.if_("tid < BQ"):
            reset_bounds(r, "tid")
    with r.if_("row < nr && sub == 0"):   # (row < nr: a real query; the mask, for the verifier)
        r.stg(tile("mv"), tile("Dist", ["q0 + row", 0], [1, k]), oob="mask", vec_bytes=4, id="store_dist")
        r.stg(tile("mi"), tile("I", ["q0 + row", 0], [1, k]), oob="mask", vec_bytes=4, id="store_idx")


def _merge_groups(r, k: int, kind: str, halves: int) -> None:
    """Group 0's thread of query qq merges the other groups' lists (handed over in hmv / hmi) into mv / mi."""
    if halves == 2:
        r.lds(tile("hmv", ["qq", 0], [1, k]), tile("pv0"), vec_bytes=4)
        r.lds(tile("hmi", ["qq", 0], [1, k]), tile("pi0"), vec_bytes=4)
        r.add("topk", kind=kind, k=k, src=tile("pv0"), src_idx=tile("pi0"), vals=tile("mv"), idx=tile("mi"),
              src_sorted=True)
    elif halves > 2:
        with r.for_("h", 0, halves - 1, id="merge_groups"):
            r.lds(tile("hmv", ["h * BQ + qq", 0], [1, k]), tile("pv0"), vec_bytes=4)
            r.lds(tile("hmi", ["h * BQ + qq", 0], [1, k]), tile("pi0"), vec_bytes=4)
            r.add("topk", kind=kind, k=k, src=tile("pv0"), src_idx=tile("pi0"), vals=tile("mv"),
                  idx=tile("mi"), src_sorted=True)


# the inner-product seed is tasks/knn_ip
SEEDS = {"knn_l2_mma_sm80": lambda: knn_fused("l2"),
         "knn_l2_split_sm80": lambda: knn_fused("l2", bq=16, bn=32, split=64)}

FAMILIES = {
    "knn_l2_mma_sm80": {
        "make": knn_fused,
        "defaults": {**signature_defaults(knn_fused), "metric": "l2"},
        "space": {"bq": [16, 32, 64, 128], "bn": [32, 64, 128], "k": [1, 10, 32, 64], "d": [64, 128],
                  "split": [1, 8, 32, 128, 512], "stages": [2, 3, 4], "norms": ["tile", "global"],
                  "merge": ["serial", "wide", "kernel", "rows", "tail"], "ws": [1, 4], "queue": [0, 2, 4],
                  "share": [True, False], "seed": [0, 8, 32], "rolled": [True, False]},
        # ws > 1 (the few-query stream): one 16-query warp tile per CTA and the wide, rows, tail or kernel merge;
        # the rows and tail merges store results only (no sampled bound); the tail's waiting CTAs (a warp per
        # query row) are some of the split's
        "check": lambda p: p["bq"] % 16 == 0 and p["bn"] % 16 == 0 and (
            p.get("ws", 1) == 1 or (p["bq"] == 16 and p["split"] > 1
                                    and p.get("merge") in ("wide", "kernel", "rows", "tail")))
            and not (p.get("merge") in ("rows", "tail") and p.get("seed", 0) and p.get("k", 10) > 1)
            and not (p.get("merge") == "tail" and p["split"] > 1
                     and p["split"] < tail_waiters(p["bq"], p.get("wm", 16), p.get("ws", 1))),
        "tactics": {"retile": ["bq", "bn"], "topk_queue": ["queue"], "topk_shared_bound": ["share"],
                "topk_sampled_bound": ["seed"], "topk_rolled_insertion": ["rolled"]},
    },
}

# the wgmma kernels (sm_90a, tasks/knn/wgmma.py) register their seed and family in SEEDS / FAMILIES;
# imported last: they build on this module's helpers
from . import wgmma  # noqa: E402,F401
