"""Exact kNN on Hopper's warpgroup MMA (sm_90a): the distance tile of 64 queries x BN database rows is
one wgmma chain per warpgroup, both operands read from shared memory by the tensor cores.

Against the mma.sync search (programs.knn_fused) per database tile and warp: no ldmatrix of the B
fragments (8 per k step there) and no query fragments in registers (32 at D = 128), one wgmma per 64
columns of K instead of 2 x BN / 8 HMMAs; the top-k epilogue is the same lowering (`topk` over a
`wgmma_acc` tile: each warp keeps its 16 rows' lists). A CTA of BQ = 64 x warpgroups queries shares
each database tile, so the database is read Q / BQ times (BQ = 128: half the traffic of the 64-query
mma tiles; the mid-Q searches were bound by bytes in flight, docs/tasks-kmeans-knn.md).

Layout: wgmma reads K-major operands in 128-byte swizzle atoms (64 f16 per row), so a [rows, D] tile is
stored as D / 64 atoms one below the other: atom a holds columns [64 a, 64 a + 64) of every row, at rows
[a * rows, (a + 1) * rows) of a [D / 64 * rows, 64] swizzle_128B buffer. The query norms come from a
first kernel (knn_db_norms over Xq) into the workspace QN; the database norms either the same way (norms
"global": XN, staged with each tile) or from the staged tile itself (norms "tile": a sum of squares atom by
atom, while the tile's wgmma runs; a row stays in its 128-byte lines under the swizzle, so its sum does
not depend on it), which saves the norms kernel's read of the whole database.

Any even D (cakelib's any-D variants, `dk`): the tiles hold D rounded up to whole atoms, the columns past D
zero-filled by the copies; with dk < D the database tile arrives in [BN, dk] chunks (dk / 64 atoms per ring
slot, D / dk pipeline steps per tile into one accumulator), so the ring's smem stays fixed while the query
tile (all its atoms) stays resident.
"""
from typing import Optional

from cake_ir.builder import KernelBuilder, fit_ident, tile
from cake_ir.nodes import Program, Workspace
from tasks.base import signature_defaults

from . import programs
from .programs import (BIG, XN_COLS, _merge_wide, declare_search_io, declare_topk_queue, knn_db_norms,
                       knn_merge, reset_bounds, sample_rows, seeded_bound, seeded_program, shares_bound, vec_bytes,
                       norm_rows)

QN_COLS = "cdiv(Q, 4) * 4"   # the query norms' columns, rounded as XN's (16-byte cp.async chunks)
ATOM = 64                    # f16 elements per 128-byte swizzle row


def wgmma_merge_unroll(split: int, k: int, bn: int, accs: int = 1) -> int:
    """Partial lists in flight per thread in the wide merge, within E-RES-05's register budget (the
    accumulators' BN / 2 registers each, the mma_rows lists, the merge lists, ~16 overhead)."""
    base = accs * bn // 2 + 4 * k + 2 * k + 16
    u = 4
    while u > 1 and ((split // 2) % u or base + 2 * k * u > 250):
        u //= 2
    return u


def d_steps(d: int, dk: int) -> int:
    """Pipeline steps per database tile: D in chunks of dk columns (0: the whole row, one step)."""
    return -(-d // dk) if dk else 1


def padded_d(d: int, dk: int) -> int:
    """The columns the smem tiles hold: D rounded up to the step's width (whole 64-column swizzle atoms)."""
    w = dk or ATOM
    return -(-d // w) * w


def prefetch_distance(stages: int, overlap: bool) -> int:
    """Tiles loading past the current one: all other slots of the ring, less the slot of the wgmma still
    in flight when overlapped."""
    return stages - 2 if overlap else stages - 1


def knn_wgmma(metric: str = "l2", k: int = 10, d: int = 128, bq: int = 64, bn: int = 128, split: int = 1,
              stages: int = 3, minb: int = 1, overlap: bool = False, queue: int = 0, share: bool = True,
              merge: str = "wide", norms: str = "global",
              skip_pad: bool = True, seed: int = 0, sample: Optional[bool] = None, rolled: bool = True,
              dk: int = 0, arch: str = "sm_90a"):
    """CTA (query tile of BQ = 64 x warpgroups, split s) streams database rows [s * CH, (s + 1) * CH) in
    BN-row tiles through a `stages`-deep cp.async ring; per tile each warpgroup issues D / 16 wgmma
    k steps (m64 n BN k16) into its [64, BN] f32 accumulator, waits for them and folds the scores into
    its warps' top-k lists. split > 1: partial lists to the workspace, the last CTA merges (the wide
    merge of programs.knn_fused). l2 returns a Program: database norms, query norms, the search.
    overlap: two accumulators, tile t's wgmma issued before tile t - 1's top-k (stages >= 3: one tile
    fewer in flight ahead, the slot an in-flight wgmma reads is never reloaded). queue: the deferred
    top-k insertion's pending entries per row and lane, share: the splits share each query's bound of
    its k-th best, merge "kernel": a merge kernel after the search instead of the last CTA's merge,
    skip_pad: the rows past Q never enter the insertion, seed: a sampling kernel of every
    seed-th tile first leaves each query's bound in TH, which the search loads before its first tile
    (programs.knn_fused). norms (l2): "global", the database norms from a first kernel; "tile", reduced
    from each staged tile while its wgmma runs (one more barrier per tile, one database read less). rolled: one
    rolled insertion loop per row over its passing scores (programs.knn_fused).

    d: any even D (the copies' chunks of vec_bytes(d) bytes hold whole columns and stay aligned); the
    smem tiles hold D rounded up to whole 64-column atoms, the columns past D zero-filled (a zero column
    changes neither a distance nor a norm). dk (a multiple of 64): the database streams in [BN, dk] chunks,
    cdiv(D, dk) pipeline steps per tile accumulated into one accumulator (one wgmma group left in flight
    while the next step's barrier and prefetch run: `prefetch_distance` as with overlap), so the ring's
    smem does not grow with D (the query tile stays resident: cdiv(D, dk) dk / 64 atoms of BQ rows);
    0: the whole row per step."""
    if arch != "sm_90a":
        raise ValueError("knn_wgmma needs sm_90a (wgmma)")
    if bq % 64 or d % 2 or dk % ATOM or bn % 16 or not 16 <= bn <= 256:
        raise ValueError(f"bq must be a multiple of 64, d even, dk of {ATOM}, bn a multiple of 16 up to 256 "
                         f"(got bq={bq}, d={d}, dk={dk}, bn={bn})")
    steps = d_steps(d, dk)
    if steps > 1 and (overlap or stages < 3):
        raise ValueError("a chunked D (dk < D) runs one accumulator (no overlap) and stages >= 3")
    if split > 1 and split % 2:
        raise ValueError("the wide merge deals a query's partial lists to 2 thread groups: split must be even")
    if overlap and stages < 3:
        raise ValueError("overlap needs stages >= 3 (the in-flight wgmma's slot stays loaded)")
    if norms not in ("global", "tile"):
        raise ValueError(f"norms is 'global' or 'tile', not {norms!r}")
    if seeded_bound(k, seed) and sample is None:   # the sampling kernel, then the search that reads its bounds
        kw = dict(metric=metric, k=k, d=d, bq=bq, bn=bn, split=split, stages=stages, minb=minb, overlap=overlap,
                  queue=queue, share=share, merge=merge, norms=norms, skip_pad=skip_pad, seed=seed, rolled=rolled,
                  dk=dk, arch=arch)
        return seeded_program(knn_wgmma(**kw, sample=True), knn_wgmma(**kw, sample=False), arch)
    sampling = bool(sample) and seeded_bound(k, seed)
    seeded = seeded_bound(k, seed) and not sampling
    kmerge = split > 1 and merge == "kernel"     # the merge is a kernel of its own (knn_merge)
    warps = bq // 16
    catoms = (dk if steps > 1 else padded_d(d, 0)) // ATOM     # atoms per pipeline step
    atoms = catoms * steps                       # atoms of the resident query tile
    vec = vec_bytes(d)
    l2 = metric == "l2"
    tnorm = l2 and norms == "tile"     # the database norms reduced from the staged tiles
    kind = "min" if l2 else "max"
    worst = BIG if l2 else -BIG
    queue = queue if k > 1 else 0   # a top-1 keeps a running best: nothing to defer
    tag = (f"_s{split}" if split > 1 else "") + (f"_p{stages}" if stages != 2 else "") \
        + (f"_b{minb}" if minb != 1 else "") + ("_ov" if overlap else "") + (f"_q{queue}" if queue else "") \
        + ("_mk" if kmerge else "") + (f"_dk{dk}" if steps > 1 else "")
    shared = shares_bound(k, split, 1, share)
    tag += "_sb" if shared else ""
    tag += f"_sd{seed}" if seeded else f"_smp{seed}" if sampling else ""
    grid = ["cdiv(Q, BQ)", "SPLIT"] if split > 1 else ["cdiv(Q, BQ)"]
    mma = "wt" if tnorm else "wg"      # (a kernel name holds 48 characters: `wt`, wgmma with tile norms)
    kb = KernelBuilder(fit_ident(f"knn_{metric}_k{k}_d{d}_{bq}x{bn}_{mma}{tag}"), arch=arch, grid=grid, threads=32 * warps,
                       min_blocks_per_sm=minb,
                       note=(f"the sample (every {seed}-th tile) of a seeded kNN search: each query's k-th best as its "
                             "bound in TH; " if sampling else "")
                            + f"exact kNN ({metric}), top-{k} fused into a wgmma distance GEMM"
                            + (f", database split over {split} CTAs + " + ("merge kernel" if kmerge else "last-CTA merge")
                               if split > 1 else ""))
    declare_search_io(kb, bq, bn, d, k, split, outputs=not sampling)
    if l2 and not tnorm:
        kb.tensor("XN", "f32", [1, XN_COLS])
    if l2:
        kb.tensor("QN", "f32", [1, QN_COLS])
    kb.buffer("sQ", "smem", "f16", [atoms * bq, ATOM], layout="swizzle_128B")
    kb.buffer("sB", "smem", "f16", [catoms * bn, ATOM], layout="swizzle_128B", stages=stages)
    if l2:
        kb.buffer("qn", "smem", "f32", [1, bq])
        # (tile norms over a chunked D: one [1, BN] sum, accumulated step by step, read by the tile's select)
        kb.buffer("cn", "smem", "f32", [1, bn], **({} if tnorm and steps > 1 else {"stages": stages}))
    kb.buffer("acc", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")
    if overlap:
        kb.buffer("acc1", "reg", "f32", [64, bn], layout="wgmma_acc", scope="warpgroup")
    kb.buffer("tv", "reg", "f32", [16, k], layout="mma_rows", scope="warp")
    kb.buffer("ti", "reg", "i32", [16, k], layout="mma_rows", scope="warp")
    qref = declare_topk_queue(kb, 16, queue)
    unroll = wgmma_merge_unroll(split, k, bn, 2 if overlap else 1) if split > 1 else 1
    if split > 1 and not kmerge:
        for n in ("mv",) + tuple(f"pv{u}" for u in range(unroll)):
            kb.buffer(n, "reg", "f32", [1, k], layout="row_major", scope="thread")
        for n in ("mi",) + tuple(f"pi{u}" for u in range(unroll)):
            kb.buffer(n, "reg", "i32", [1, k], layout="row_major", scope="thread")
        kb.buffer("hmv", "smem", "f32", [bq, k])      # the second thread group's lists, handed over
        kb.buffer("hmi", "smem", "i32", [bq, k])
    if (shared or seeded) and not kmerge:   # the reset's word (a merge kernel resets the words itself)
        kb.buffer("zb", "reg", "i32", [1, 1], layout="row_major", scope="thread")
    if shared:
        kb.buffer("bc", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")   # the bound as last read
    if seeded:
        kb.buffer("gb", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")   # the sample's bound

    def load_db(r, row, slot, id=None, c="0"):
        """Step c (an expression) of the database tile at `row`, its atoms of columns [c dk, (c + 1) dk), into
        ring slot `slot`, and with its last step the tile's norms (the slot its select reads)."""
        col = "0" if steps == 1 else f"({c}) * {catoms * ATOM}"
        for a in range(catoms):
            r.copy("cp_async", tile("Xb", [row, f"{col} + {a * ATOM}" if steps > 1 else a * ATOM], [bn, ATOM]),
                   tile("sB", [a * bn, 0], [bn, ATOM], slot=slot), oob="zfill", vec_bytes=vec,
                   id=id if a == 0 else None)
        if l2 and not tnorm and steps == 1:
            r.copy("cp_async", tile("XN", [0, row], [1, bn]), tile("cn", slot=slot), oob="zfill")
        elif l2 and not tnorm:
            with r.if_(f"{c} == {steps - 1}"):
                r.copy("cp_async", tile("XN", [0, row], [1, bn]), tile("cn", slot=slot), oob="zfill")

    def step_of(t: str, c) -> str:
        """The pipeline step of tile t's chunk c (the tile itself when a step is a whole row)."""
        return t if steps == 1 else f"({t}) * {steps} + {c}"

    def tile_norms(t: str):
        """Tile t's squared norms into its cn slot, atom by atom (the rows dealt to the same threads), from
        the staged tile while its wgmma runs; the caller's next barrier publishes them to the select."""
        for a in range(atoms):
            r.reduce("sum_sq", tile("sB", [a * bn, 0], [bn, ATOM], slot=f"({t}) % {stages}"),
                     tile("cn", slot=f"({t}) % {stages}"), accumulate=a > 0, id="db_norms" if a == 0 else None)

    def chunk_norms(t: str, c: str, first: bool):
        """Tile t's step c adds its columns' squares to the tile's norms (cn, no slot: first starts them), from the
        staged chunk while its wgmma runs; the barrier before the select publishes them."""
        for a in range(catoms):
            r.reduce("sum_sq", tile("sB", [a * bn, 0], [bn, ATOM], slot=f"({step_of(t, c)}) % {stages}"), tile("cn"),
                     accumulate=a > 0 or not first, id="db_norms" if a == 0 and first else None)

    with kb.role("main", warps=(0, warps)) as r:
        r.let("q0", "bid.x * BQ")
        r.let("wq0", "role_warp * 16")        # this warp's 16 rows: 16 x its warp in warpgroup wg, + 64 wg
        # the rows split over the CTAs: the database's, or (sampling) the sample's, mapped to database rows
        dbrow = sample_rows(kb, r, seed, bn) if sampling else (lambda v: v)
        n_rows = "MV" if sampling else "M"
        if split > 1:
            r.let("s", "bid.y")
            r.let("CH", f"cdiv(cdiv({n_rows}, SPLIT), BN) * BN")
            r.let("m0", "s * CH")
            r.let("nt", f"cdiv(max(min(CH, {n_rows} - m0), 0), BN)")
        else:
            r.let("m0", "0")
            r.let("nt", f"cdiv({n_rows}, BN)")
        for a in range(atoms):
            r.copy("cp_async", tile("Xq", ["q0", a * ATOM], [bq, ATOM]), tile("sQ", [a * bq, 0], [bq, ATOM]),
                   oob="zfill", vec_bytes=vec, id="load_queries" if a == 0 else None)
        if l2:
            r.copy("cp_async", tile("QN", [0, "q0"], [1, bq]), tile("qn"), oob="zfill", id="load_query_norms")
        load_db(r, dbrow("m0"), 0)
        r.sync("cp_async_commit")
        ahead = prefetch_distance(stages, overlap or steps > 1)   # steps in flight past the current one
        for p in range(1, ahead):           # fill the ring (rows past the chunk are masked by `limit`)
            load_db(r, dbrow(f"m0 + {p // steps} * BN"), p, c=str(p % steps))
            r.sync("cp_async_commit")
        r.fill("tv", worst)
        r.fill("ti", -1)
        if queue:
            r.fill("qi", -1)
        if seeded:       # the sample's bounds, before the first tile
            r.add("topk_bound", kind=kind, mode="load", vals=tile("gb"), bound=tile("TH", ["q0 + wq0", 0], [16, 1]),
                  id="load_bounds")
        if shared:
            r.fill("bc", worst)
        # (sampling: a chunk's tiles stay in it, the limit is the database's end)
        lim = "min(m0 + CH, M)" if split > 1 and not sampling else "M"

        def arrive(t: str, c="0"):
            """Step c of tile t has landed, for every thread and the async proxy; the step `ahead` later starts
            loading (chunk (c + ahead) % steps of tile t + (c + ahead) / steps)."""
            r.sync("cp_async_wait", n=ahead - 1)    # the step has landed (this thread's copies)
            r.fence("proxy_async")                  # ... and is visible to the tensor cores' async proxy
            r.sync("syncthreads")                   # every thread's copies; every warp done with the slot reloaded next
            if steps == 1:
                nxt, c2 = f"{t} + {ahead}", "0"
            else:
                nxt, c2 = f"{t} + ({c} + {ahead}) / {steps}", f"({c} + {ahead}) % {steps}"
            with r.if_(f"{nxt} < nt"):
                load_db(r, dbrow(f"m0 + ({nxt}) * BN"), f"({step_of(t, c)} + {ahead}) % {stages}", id="prefetch", c=c2)
            r.sync("cp_async_commit")               # always: one group per step keeps the count exact

        def distances(t: str, acc: str, c="0", first: bool = True):
            """The wgmma of step c (its atoms against the query tile's atoms of the same columns); first: the
            tile's first step (c = 0), which starts the accumulator."""
            r.sync("wgmma_fence")
            for a in range(catoms):
                qrow = f"{a * bq} + 64 * wg" if steps == 1 else f"({c}) * {catoms * bq} + {a * bq} + 64 * wg"
                r.wgmma([64, bn, 16], tile("sQ", [qrow, 0], [64, ATOM]),
                        tile("sB", [a * bn, 0], [bn, ATOM], slot=f"({step_of(t, c)}) % {stages}"), tile(acc),
                        accumulate=a > 0 or not first, id="distances" if a == 0 and first and acc == "acc" else None)
            r.sync("wgmma_commit")

        def select(t: str, acc: str):
            topk = dict(kind=kind, k=k, src=tile(acc), vals=tile("tv"), idx=tile("ti"), col=dbrow(f"m0 + ({t}) * BN"),
                        limit=lim, **qref)
            if shared:
                topk.update(shared_bound=tile("TH", ["q0 + 64 * wg", 0], [64, 1]), bound_cache=tile("bc"))
            if seeded:
                topk["given_bound"] = tile("gb")
            if skip_pad and k > 1:
                topk["valid_rows"] = "Q - q0 - 64 * wg"
            if rolled and k > 1:
                topk["rolled"] = True
            if l2:
                topk.update(scale=-2.0, row_bias=tile("qn", [0, "64 * wg"], [1, 64]),
                            col_bias=tile("cn") if tnorm and steps > 1
                            else tile("cn", slot=f"({step_of(t, steps - 1)}) % {stages}"))
            r.add("topk", id="select" if acc == "acc" else None, **topk)

        if steps > 1:
            with r.for_("t", 0, "nt", id="db_loop"):
                # tile t's chunks (the first peeled: it starts the accumulator); one wgmma group stays in flight,
                # step c - 1's retired before step c + 1's barrier, whose prefetch reloads its slot
                arrive("t", "0")
                distances("t", "acc", "0")
                if tnorm:
                    chunk_norms("t", "0", True)
                with r.for_("c", 1, steps, id="d_loop"):
                    r.sync("wgmma_wait", n=1)
                    arrive("t", "c")
                    distances("t", "acc", "c", first=False)
                    if tnorm:
                        chunk_norms("t", "c", False)
                if tnorm:
                    r.sync("syncthreads")           # the norms, for every warp's select
                r.sync("wgmma_wait", n=0)
                select("t", "acc")
        elif not overlap:
            with r.for_("t", 0, "nt", id="db_loop"):
                arrive("t")
                distances("t", "acc")
                if tnorm:
                    tile_norms("t")
                    r.sync("syncthreads")           # the norms, for every warp's select
                r.sync("wgmma_wait", n=0)
                select("t", "acc")
        else:
            # two accumulators: tile u's wgmma runs while tile u - 1's scores are selected. The prefetch of
            # step u overwrites slot (u - 2) % stages: tile u - 2's wgmma was retired (wait 1) at step u - 1,
            # before this step's barrier, and tile u - 1's (in flight) reads another slot
            # (tile norms: tile u's are reduced after its wgmma is issued; the next arrive's barrier, or the
            # last step's own, publishes them before tile u is selected)
            with r.if_("0 < nt"):
                arrive("0")
                distances("0", "acc")
                if tnorm:
                    tile_norms("0")

            def step(u: str, nxt: str, cur: str):
                with r.if_(f"{u} < nt"):
                    arrive(u)
                    distances(u, nxt)
                    if tnorm:
                        tile_norms(u)
                    r.sync("wgmma_wait", n=1)       # tile u - 1's wgmma is done; tile u's runs on
                with r.if_(f"{u} >= nt"):
                    if tnorm:
                        r.sync("syncthreads")       # the last tile's norms
                    r.sync("wgmma_wait", n=0)
                select(f"{u} - 1", cur)
            with r.for_("t", 0, "nt", step=2, id="db_loop"):
                step("t + 1", "acc1", "acc")
                with r.if_("t + 1 < nt"):
                    step("t + 2", "acc", "acc1")
        r.sync("cp_async_wait", n=0)                # retire the zero-filled prefetches of a short chunk
        r.add("topk_merge", kind=kind, vals=tile("tv"), idx=tile("ti"), id="merge", **qref)
        if split == 1 and sampling:
            r.add("topk_bound", kind=kind, mode="store", vals=tile("tv"), bound=tile("TH", ["q0 + wq0", 0], [16, 1]),
                  id="store_bounds")
        elif split == 1:
            r.stg(tile("tv"), tile("Dist", ["q0 + wq0", 0], [16, k]), oob="mask", vec_bytes=4, id="store_dist")
            r.stg(tile("ti"), tile("I", ["q0 + wq0", 0], [16, k]), oob="mask", vec_bytes=4, id="store_idx")
            if seeded:   # the CTA's warps are done reading their rows' words: leave them zeroed
                r.sync("syncthreads")
                with r.if_("tid < BQ"):
                    reset_bounds(r, "tid")
        else:
            r.let("pr", "(bid.x * SPLIT + s) * BQ + wq0")
            r.stg(tile("tv"), tile("PV", ["pr", 0], [16, k]), oob="mask", vec_bytes=4, id="store_partial_dist")
            r.stg(tile("ti"), tile("PI", ["pr", 0], [16, k]), oob="mask", vec_bytes=4, id="store_partial_idx")
            if not kmerge:   # (kmerge: the merge kernel after this one, knn_merge, takes the partial lists)
                fin = r.add("last_cta", id="merge_splits", counter=tile("WT", ["bid.x", 0], [1, 1]), count="SPLIT",
                            body=[])
                with r._nest(fin["body"]):
                    _merge_wide(r, k, kind, worst, unroll, 2, shared or seeded, sampling)
    search = kb.build()
    after = [knn_merge(k, bq, split, kind, publish=sampling, reset=shared or seeded, arch=arch)] if kmerge else []
    if not l2 and not after:
        return search
    ws = ([] if tnorm else [Workspace(name="XN", dtype="f32", shape=[1, XN_COLS])]) \
        + [Workspace(name="QN", dtype="f32", shape=[1, QN_COLS])] if l2 else []
    first = ([] if tnorm else [knn_db_norms(d, rows=norm_rows(d), arch=arch)]) \
        + [knn_db_norms(d, rows=norm_rows(d), arch=arch, src="Xq", n="Q", dst="QN")] if l2 else []
    return Program(name=search.name, arch=arch, workspace=ws, kernels=first + [search] + after)


# the agent's seed and family (tasks/<task>/programs.py SEEDS / FAMILIES)
programs.SEEDS["knn_l2_wgmma_sm90a"] = lambda: knn_wgmma("l2")
programs.FAMILIES["knn_l2_wgmma_sm90a"] = {
    "make": knn_wgmma,
    "defaults": {**signature_defaults(knn_wgmma), "metric": "l2"},
    "space": {"bq": [64, 128], "bn": [64, 128, 256], "k": [1, 10, 32], "d": [64, 128], "split": [1, 8, 32, 128],
              "stages": [2, 3, 4], "queue": [0, 2, 4], "share": [True, False], "seed": [0, 8, 32],
              "merge": ["wide", "kernel"], "norms": ["global", "tile"], "rolled": [True, False]},
    "check": lambda p: p["bq"] % 64 == 0 and p["bn"] % 16 == 0,
    "tactics": {"retile": ["bq", "bn"], "topk_queue": ["queue"], "topk_shared_bound": ["share"],
                "topk_sampled_bound": ["seed"], "topk_rolled_insertion": ["rolled"]},
}
