"""The kernel library (cakelib) on the GPU: fit the dispatch tables from measured variants, then time the
dispatched library against the best baseline over a grid of 400+ shapes, checking every result.

    python bench/lib_grid.py sweep [--op knn,kmeans] [--out DIR]   # variants x training shapes -> tables
    python bench/lib_grid.py grid  [--op knn,kmeans] [--out DIR]   # library vs baselines at every grid shape
                                   [--deadline-s S] [--spread N] [--skip I] [--shard I/N]
    python bench/lib_grid.py merge OUT FILE [FILE ...]             # one grid file from shards / continuations
    python bench/lib_grid.py refit SWEEP.json [--out DIR] [--max-depth N] [--min-leaf N] [--cv]  # tables from a sweep (no GPU)
    python bench/lib_grid.py refit SWEEP.json --keep-tree TABLE.json   # that table's tree, pins from the sweep's own rows
    python bench/lib_grid.py shapes                                # print the grids (no GPU)
    python bench/lib_grid.py compile [--op ...] [--arch A] [--grid] # compile every sweep kernel, or (--grid) every
                                                                   # kernel the grid dispatches (no GPU; fills the cache)
    python bench/lib_grid.py summary FILE [FILE ...]               # geomean / worst / slower count of grid results
    python bench/lib_grid.py compare OLD NEW [NEW ...]             # library time new / old on the shapes both timed
    python bench/lib_grid.py changed OP OLD.json NEW.json          # --only spec of the grid shapes two tables pick apart
    python bench/lib_grid.py runs OP > SNAPSHOT.json               # what the library runs at each grid shape (per-call params, kNN queue)
    python bench/lib_grid.py runs-changed BEFORE.json AFTER.json   # --only spec of the shapes two snapshots run differently

Honesty rules (docs/evaluation.md): seeded inputs; every library result is checked against float64
math on the GPU (knn: recall@k = 1 with ties allowed and distances within the rounding allowance;
kmeans: one Lloyd step checked as tasks/kmeans does, assignment near-optimal, inertia within 1e-3,
centroids = means of the kernel's own assignment); L2 flushed before every timed repetition; median
of CUDA-event timings; every baseline timed in the same process on the same device tensors.

kmeans is timed as 10 Lloyd iterations from the same initial centroids for every implementation
(baselines with tol < 0 so none stops early); knn as one search call.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

D = 128
ITERS = 10
# The dispatch trees' features. Their size is chosen per fit by leave-one-shape-out cross-validation
# (cakelib.dispatch.fit_by_cross_validation): a fixed depth 4 shared a leaf between Q = 64 and 256 and a
# hand-picked depth 5 followed noisy shapes (0.841x vs 0.867x on the grid, lib-grid-knn-h200-refit-depth5.json);
# the 40-variant kNN sweep needed depth 8 (a fixed depth 4 measured 0.36x on the grid, the cross-validated
# depth 8 1.03x).
FEATURES = {"knn": ["log2_Q", "log2_M", "k"], "kmeans": ["B", "log2_N", "K", "log2_B*N"]}
# The fit's extra weight on a shape's slowdown past 5% (cakelib.dispatch.fit `tail`). Over a sweep
# with the capped kernels out of their domain at k = 32 (KNN_CAPPED_K_MAX): tail 0 -> 3 moves the
# leave-one-shape-out estimate 1.078x -> 1.073x the per-shape best and the held-out shapes > 10% slower
# than their best 21 -> 19 (none > 1.5x either way); the training set's worst shape 1.41x -> 1.65x.
FIT_TAIL = 3.0
# A measured shape whose tree pick runs more than this x its best variant runs the best (cakelib.dispatch.pin).
# (A sweep timed two new variants only at Q = 64, M = 4M (k = 10: 0.79 ms against the leaf's 1.01); a leaf
# can only take a variant measured on all its shapes, so the tree kept the slower one.)
# Only the sweep's own rows count (`fresh_rows`): its --prior's, rescaled, may predate a change to the kernels.
PIN_OVER = 1.05


# ---------------------------------------------------------------- shapes
def knn_grid() -> list[dict]:
    """Search (few queries, large databases), batch search, SIFT-like and self-kNN build shapes."""
    out = []
    for Q in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        for M in (100_000, 1 << 18, 1 << 20, 4 << 20):
            for k in (1, 10, 16):
                if Q * M <= (1 << 32):
                    out.append({"Q": Q, "M": M, "k": k})
    for N in (16384, 32768, 65536):
        for k in (2, 8, 16, 32):
            out.append({"Q": N, "M": N, "k": k})
    for k in (10, 16, 32):
        out.append({"Q": 10000, "M": 1 << 20, "k": k})
    return out


def kmeans_grid() -> list[dict]:
    out = []
    for B in (1, 2, 4, 8, 16, 32):
        for N in (4096, 16384, 65536, 262144):
            for K in (8, 16, 32, 48, 64, 100, 128, 160, 200, 256):
                if B * N <= (4 << 20):
                    out.append({"B": B, "N": N, "K": K})
    for N in (1 << 20, 2 << 20, 4 << 20):
        for K in (16, 64, 100, 128, 256):
            out.append({"B": 1, "N": N, "K": K})
    return out


def knn_train() -> list[dict]:
    """Search, batch-search and build shapes at k = 10, a few at k = 16 / 32; the shapes between the
    search and build regimes (Q = 2048..8192 at M = 256K / 1M) come first, so a sweep cut by its
    budget still has them (the previous table picked the unsplit kernel at Q = 4096 where an 8-way
    split was 3x faster)."""
    mid = [{"Q": Q, "M": M, "k": 10} for Q in (2048, 4096, 8192) for M in (1 << 18, 1 << 20)]
    base = [{"Q": Q, "M": M, "k": 10} for Q in (1, 4, 16, 64, 256, 1024, 4096) for M in (100_000, 1 << 20, 4 << 20)
            if Q * M <= (1 << 32) and {"Q": Q, "M": M, "k": 10} not in mid]
    other_k = [{"Q": Q, "M": 1 << 20, "k": k} for Q in (1, 64, 1024) for k in (16, 32)]
    # without these no training shape had k = 1 (the depth-6 refit moved the k = 1 grid shapes from 1.64x to
    # 1.45x of the best baseline) or k >= 16 with more than 1024 queries (the build shapes at 0.3-0.7x)
    other_k += [{"Q": Q, "M": 1 << 20, "k": 1} for Q in (1, 64, 1024)] + [{"Q": 16384, "M": 16384, "k": k} for k in (2, 32)]
    other_k += [{"Q": 4096, "M": 1 << 18, "k": 16}, {"Q": 32768, "M": 32768, "k": 16}]
    # the 8192-query searches at k = 16 / 32 (the Q = 10000 grid shapes had only k = 10 near them);
    # after the per-call re-sweep, the shapes whose refitted pick lost most in the grid: a leaf
    # of Q = 64 at M <= 256K fitted to M >= 1M points (0.63-0.94x), k = 16 at M = 100K given the k = 10
    # picks (Q = 256 / 512: 0.80x), Q = 32 at M = 4M k = 16, Q = 4096 at M = 100K k = 16
    other_k += [{"Q": 8192, "M": 1 << 20, "k": k} for k in (16, 32)]
    other_k += [{"Q": 64, "M": 1 << 18, "k": k} for k in (10, 16)] + \
        [{"Q": Q, "M": 100_000, "k": 16} for Q in (64, 256, 512, 4096)] + [{"Q": 32, "M": 4 << 20, "k": 16}]
    # (a refit without them gave Q = 32 at M = 100K the Q <= 16 pick: k = 16 0.87x -> 0.61x)
    other_k += [{"Q": 32, "M": 100_000, "k": k} for k in (10, 16)]
    # the grid's slowest shapes, the k >= 16 builds and Q = 64 at M = 4M (0.79-0.95x)
    other_k += [{"Q": 65536, "M": 65536, "k": k} for k in (16, 32)] + [{"Q": 32768, "M": 32768, "k": 32}]
    other_k += [{"Q": 64, "M": 4 << 20, "k": 16}]
    # (the refit on them moved Q = M = 16384 at k = 16, in the builds' leaf but not timed, 1.13x -> 0.87x)
    other_k += [{"Q": 16384, "M": 16384, "k": 16}]
    # without these no training shape sat at M = 256K or at Q = 128 / 512, where the grid's picks went wrong
    # (a depth-4 leaf shared by Q = 64 and 256; a refit leaf fitted to M = 100K points)
    between = [{"Q": Q, "M": M, "k": 10} for Q in (1, 16, 128, 512) for M in (1 << 18,)] + \
        [{"Q": Q, "M": 1 << 20, "k": 10} for Q in (128, 512)] + [{"Q": 16, "M": 1 << 18, "k": 16}]
    # Q = 128 at k = 1 / 16 and Q = 64 at M = 4M, k = 1 (the grid's worst shapes: a split bq 16
    # kernel reading the database 8 times, picked from k = 10 points)
    between += [{"Q": 128, "M": M, "k": 1} for M in (1 << 18, 4 << 20)] + \
        [{"Q": 128, "M": M, "k": 16} for M in (100_000, 1 << 20)] + [{"Q": 64, "M": 4 << 20, "k": 1}]
    # the k = 16 grid shapes that lost most (Q = 128 at M = 4M: 0.50x; Q = 32 / 512 / 2048)
    between += [{"Q": 128, "M": 4 << 20, "k": 16}] + [{"Q": Q, "M": 1 << 18, "k": 16} for Q in (32, 512, 2048)]
    # (the refit with only that Q = 32 shape gave Q = 32 the Q = 64 picks: 0.65-0.89x of the earlier time)
    between += [{"Q": 32, "M": 1 << 20, "k": k} for k in (1, 10)] + [{"Q": 32, "M": 4 << 20, "k": 10}]
    # (`between` second, where the 128-query wgmma CTAs should matter, so a cut sweep has it)
    return mid + between + base + [{"Q": 32768, "M": 32768, "k": 10}] + other_k


def knn_small_train() -> list[dict]:
    """The small-database region (M < cakelib.variants.KNN_SMALL_M, its own table tables/knn_small.json):
    launch-latency-bound calls the main table's tree, fitted on M >= 16384, only extrapolates to."""
    return [{"Q": Q, "M": M, "k": k} for Q in (1, 8, 128, 2048, 8192) for M in (33, 300, 2000, 12000)
            for k in (1, 10, 32) if k <= M]


def knn_small_grid() -> list[dict]:
    """The small region's evaluation shapes, none of them a training shape (held out from the fit),
    the tiny calls users reported among them (Q = 4096, M = 33; Q = 3, M = 50)."""
    return [{"Q": Q, "M": M, "k": k} for Q, M, k in (
        (4096, 33, 10), (3, 50, 10), (1, 1000, 1), (16, 100, 16), (64, 64, 1), (100, 700, 5), (500, 5000, 10),
        (1024, 1024, 16), (7, 9000, 10), (30000, 500, 10), (10000, 10000, 10), (4096, 4096, 32), (2, 16000, 10),
        (256, 16000, 1), (20000, 2000, 2), (1, 40, 32))]


# Training and grid shapes per (op, region): a region has its own dispatch table, tables/<op>_<region>.json
TRAIN = {("knn", ""): lambda: knn_train(), ("kmeans", ""): lambda: kmeans_train(),
         ("knn", "small"): knn_small_train}
GRID = {("knn", ""): lambda: knn_grid(), ("kmeans", ""): lambda: kmeans_grid(), ("knn", "small"): knn_small_grid}


def table_file(op: str, region: str = "") -> str:
    return f"{op}_{region}.json" if region else f"{op}.json"


def kmeans_train() -> list[dict]:
    """With no training shape of K < 32 above 256K points a refit picked the K <= 64 variant for K = 16 at
    N = 4M (25% slower than the K <= 32 one): N = 4M, K = 16 is one now. B = 16, N = 262K, K = 160: one of
    the batched shapes that ran slower than flashlib (0.68x). The two slowest grid shapes (K = 256 at
    N = 4M and at B = 16, N = 262K)."""
    return [{"B": B, "N": N, "K": K} for B in (1, 4, 32) for N in (16384, 262144) for K in (32, 100, 256)
            if B * N <= (4 << 20)] + [{"B": 1, "N": 1 << 21, "K": K} for K in (64, 256)] + [
        {"B": 2, "N": 262144, "K": 8}, {"B": 4, "N": 65536, "K": 16}, {"B": 16, "N": 65536, "K": 64},
        {"B": 4, "N": 262144, "K": 128}, {"B": 1, "N": 1 << 22, "K": 16}, {"B": 16, "N": 262144, "K": 160},
        # the two slowest grid shapes (0.70x / 0.73x of flashlib), for the register-held sums
        {"B": 1, "N": 1 << 22, "K": 256}, {"B": 16, "N": 262144, "K": 256}]


def knn_variants() -> list[dict]:
    """The unsplit kernel and the split-database path, with per-tile database norms (norms "tile", the
    original variants) and with the norms computed once by a first kernel (norms "global"); minb 3:
    registers capped for 3 CTAs of 4 warps per SM (minb 4 with qfrag "smem": 4); merge "wide": the split path's last CTA merges with
    all its threads, several partial lists in flight (the serial merge is most of a Q = 1 search)."""
    def v(bq, bn, split, stages, norms="global", minb=1, merge="wide", qfrag="reg", wm=16, ws=1, mma="sync"):
        p = {"bq": bq, "bn": bn, "split": split, "stages": stages}
        if mma != "sync":                   # wgmma: both norms from first kernels, the wide merge
            return {**p, "mma": mma, **({"merge": "wide"} if split > 1 else {}), **({"minb": minb} if minb != 1 else {})}
        if wm != 16:
            p["wm"] = wm
        if ws != 1:
            p["ws"] = ws
        if qfrag != "reg":
            p["qfrag"] = qfrag
        if norms != "tile":
            p["norms"] = norms
        if minb != 1:
            p["minb"] = minb
        if split > 1 and merge != "serial":
            p["merge"] = merge
        return p
    # the variants an earlier sweep never timed within 10% of a shape's best (and that the
    # committed table cannot pick) are left out, to keep the sweep's budget for the wgmma variants:
    # bq64 bn128 s1, the tile-norm serial-merge splits 8 / 32 / 128, the global-norm split 512 (wide and
    # serial), bq64 qfrag smem wm 32, the wm-32 stream at splits 8 / 32
    out = [v(64, 64, 1, 2, "tile"), v(64, 64, 1, 2), v(64, 64, 1, 2, minb=3), v(128, 64, 1, 2), v(32, 64, 1, 2)]
    out += [v(16, 32, 512, 4, "tile", merge="serial")]       # the previous split variants
    out += [v(16, 32, s, 4) for s in (8, 32, 128)]
    # few queries: the norms kernel's extra database read may cost more than per-tile norms
    out += [v(16, 32, s, 4, "tile") for s in (128, 512)]
    out += [v(32, 64, s, 3) for s in (8, 32, 128)] + [v(64, 64, s, 2) for s in (8, 32)]
    out += [v(64, 64, 8, 2, minb=3)]
    # query fragments re-read from smem: 4 CTAs of 4 warps per SM (128 registers, a few L1 spills)
    out += [v(64, 64, 1, 2, minb=4, qfrag="smem"), v(64, 64, 8, 2, minb=4, qfrag="smem")]
    # the few-query stream: ws warps per CTA, each its own database chunk and smem ring, sharing the
    # query tile (per-warp tile norms: no norms kernel reading the database a second time)
    # (split: a multiple of the last CTA's 2 * ws (bq 16) or ws (bq 32) merge groups)
    out += [v(16, 32, s, 4, "tile", ws=4) for s in (8, 32, 128)] + [v(16, 32, 128, 4, ws=4)]
    out += [v(16, 64, 64, 2, "tile", ws=4)]
    out += [v(32, 32, 64, 3, "tile", wm=32, ws=4)]
    # sm_90a: the distance tile on wgmma, 64 or 128 queries per CTA sharing each database
    # tile (tasks/knn/wgmma.py); splits that give the mid-Q searches 2-4 CTAs per SM
    wg = {"mma": "wgmma"}
    out += [v(64, 128, 1, 3, **wg), v(128, 128, 1, 3, **wg), v(128, 64, 1, 4, **wg)]
    out += [v(64, 128, s, 3, **wg) for s in (8, 32, 128)] + [v(128, 128, s, 3, **wg) for s in (8, 32)]
    out += [v(128, 64, s, 4, **wg) for s in (16, 64)]
    # the next tile's wgmma in flight during this tile's top-k (two accumulators; bn 64: at 128 the two
    # accumulators and the top-k's scores spill)
    out += [{**v(128, 64, s, 4, **wg), "overlap": True} for s in (1, 8, 32)]
    out += [{**v(64, 64, s, 4, **wg), "overlap": True} for s in (8, 128)]
    # at k = 16 the lists' 24 more registers per thread cost these variants a CTA per SM
    # (wgmma bq 128: 124 -> 144 registers, 2 -> 1 CTAs of 256 threads; the ws4 stream 126 -> 150) and
    # 1.7-2.4x the k = 10 time; capped at 128 registers they build without spills (ptxas)
    out += [v(128, 64, s, 4, minb=2, **wg) for s in (16, 64)] + [v(16, 32, s, 4, "tile", ws=4, minb=4) for s in (32, 128)]
    # ncu, Q = M = 32768: at k = 16 the unsplit bq 128 kernel runs one CTA per SM (139
    # registers; 12.5% occupancy, no eligible warp 75% of cycles; k = 8: 107 registers, two CTAs, 57%):
    # capped at 128 it builds without spills at k = 16 (k = 32 spills 8.9 KB)
    out += [v(128, 64, 1, 4, minb=2, **wg)]
    # with the shared bound (k > 1) a split's CTAs no longer each insert their own first
    # candidates, so more splits cost less; Q <= 128 on 128 CTAs of 128 queries (s64: 64 CTAs, half the
    # SMs idle at Q = 128), 256 CTAs of 64
    out += [v(128, 64, s, 4, **wg) for s in (32, 128)] + [{**v(64, 64, 256, 4, **wg), "overlap": True}]
    # (the 64-query wgmma splits with the merge kernel and the sampled bound are no variants of their own:
    # the sweep times every split in its per-call form, which is that)
    # Q = 8192-10000 searches ran the unsplit mma.sync bq 32 kernel (Q = 10000, M = 1M, k = 10:
    # 19.2 ms, where Q = 4096 takes 4.3 ms on a 16-way wgmma split): the workspace (WS_ROWS 2^17) now
    # holds an 8-way split of 79 query tiles of 128, 632 CTAs
    out += [v(128, 64, 8, 4, **wg), v(128, 64, 8, 4, minb=2, **wg)]
    # the sampled bound on the builds (Q = M, k >= 16: the unsplit mma.sync kernel at 0.79-0.95x of
    # flashlib; the seeded 8-way split at Q = 10000, M = 1M, k = 16 scores 2.5x the pairs per second) -- slower
    # at every k >= 10 wgmma build (1.03-1.18x; kept: the committed sweep's rows and a k = 2 pin name them); and
    # sparser samples for the few-query searches of 4M rows (Q = 64: the every-8th-tile sample took 315 us of
    # 1.18 ms, ncu; every 32nd: 1.22-1.28x faster, pinned there)
    sd = lambda p, f: {**p, "seed": f}   # noqa: E731  (an explicit seed: the per-call options keep it)
    out += [sd(v(128, 64, 1, 4, **wg), f) for f in (8, 32)] + [sd(v(128, 64, 2, 4, **wg), 8)]
    out += [sd({**v(128, 64, 1, 4, **wg), "overlap": True}, 8), sd(v(128, 64, 1, 4, minb=2, **wg), 8)]
    out += [sd(v(128, 64, 1, 2), 8)]
    out += [sd(v(128, 64, 128, 4, **wg), f) for f in (16, 32)] + [sd({**v(64, 64, 256, 4, **wg), "overlap": True}, 32)]
    # a k = 16 build on mma.sync at two CTAs per SM: query fragments from smem and 32-row database tiles
    # bring it to 124 registers without spills (ptxas, sm_90a; at bn 64 it spills 84 bytes, at k = 32 2-4 KB)
    out += [v(128, 32, 1, 3, minb=2, qfrag="smem")]
    return out


def kmeans_variants() -> list[dict]:
    def res(kmax, bm, big, batch, private, ctas):
        return {"kind": "resident", "kmax": kmax, "bm": bm, "bn": 64, "ctas": ctas, "big": big, "cas_batch": batch,
                "private": private}
    out = [res(32, 64, 8, 1, False, p) for p in (66, 132, 264)] + [res(32, 64, 8, 8, True, p) for p in (66, 132, 264)]
    out += [res(64, 64, 8, 1, False, p) for p in (132, 264)] + [res(64, 32, 8, 8, True, p) for p in (132, 264)]
    out += [res(128, 64, 32, b, False, p) for b in (1, 8) for p in (33, 132, 264)]
    out += [res(256, 32, 16, b, False, p) for b in (1, 8) for p in (16, 33, 132)]
    out += [{"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": p} for p in (4, 33, 132)]
    # the tensor-core update (sums += onehot^T X per tile, no shared-memory CAS per point and dim)
    mma = {"update": "mma"}
    out += [{"kind": "resident", "kmax": 32, "bm": 64, "bn": 64, "ctas": p, "big": 8, **mma} for p in (132, 264)]
    out += [{"kind": "resident", "kmax": 64, "bm": 64, "bn": 64, "ctas": p, "big": 8, **mma} for p in (132, 264)]
    out += [{"kind": "resident", "kmax": 128, "bm": 64, "bn": 64, "ctas": p, "big": 16, **mma} for p in (33, 132)]
    out += [{"kind": "resident", "kmax": 256, "bm": 32, "bn": 64, "ctas": 132, "big": 8, **mma}]
    out += [{"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": p, **mma} for p in (33, 132)]
    # 32 clusters per accumulator block: X is read from shared memory half as often
    mma32 = {"update": "mma", "urows": 32}
    out += [{"kind": "resident", "kmax": 128, "bm": 64, "bn": 64, "ctas": p, "big": 8, **mma32} for p in (33, 132)]
    out += [{"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": p, **mma32} for p in (33, 132)]
    # 128-point tiles: 8 warps (two per scheduler to hide latency), the sums' blocks loaded and stored once
    # per 128 points, each centroid tile (fused) scored against twice the points
    out += [{"kind": "resident", "kmax": k, "bm": 128, "bn": 64, "ctas": 132, "big": 8, **mma} for k in (32, 64)]
    out += [{"kind": "resident", "kmax": 128, "bm": 128, "bn": 64, "ctas": p, "big": 8, **m}
            for p in (33, 132) for m in (mma, mma32)]
    out += [{"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": p, **m} for p in (33, 132) for m in (mma, mma32)]
    # the centroid norms once per CTA instead of per centroid tile and point tile (a reduce and a barrier less)
    out += [{"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": p, **m, "norms": "once"} for p in (33, 132)
            for m in (mma, mma32)]
    # sm_90a: the assignment on wgmma (tasks/kmeans/wgmma.py), one CTA per SM (smem)
    wg = {"mma": "wgmma"}
    out += [{"kind": "fused", "kmax": 256, "bm": bm, "bn": bn, "ctas": 132, **m, **wg}
            for bm, bn in ((64, 128), (128, 64)) for m in (mma, mma32)]
    out += [{"kind": "resident", "kmax": 128, "bm": bm, "bn": bn, "ctas": 132, **m, **wg}
            for bm, bn, m in ((64, 128, mma), (64, 128, mma32), (128, 128, mma), (128, 64, mma32))]
    # the streamed (fused) kernels with the next point tile loading during this one's last centroid tile
    # (one CTA per SM: each point tile's loads were exposed); 64-point tiles for the second sX buffer
    x2 = {"norms": "once", "xstages": 2}
    out += [{"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 132, **m, **x2} for m in (mma, mma32)]
    out += [{"kind": "fused", "kmax": 256, "bm": 64, "bn": 64, "ctas": 132, **m, **wg, "xstages": 2} for m in (mma, mma32)]
    # batches of B >= 8 at K >= 100 kept the mma.sync p33 picks (0.58-0.93x of flashlib); the
    # wgmma kernels were swept at 132 CTAs per batch only (16-32 waves at B = 16-32). The cost model
    # (ptxas registers) puts 33 per batch 17% (B = 16, N = 262K, K = 160) to 41% (B = 32, N = 65K) ahead
    out += [{"kind": k, "kmax": kmax, "bm": 128, "bn": 64, "ctas": p, **mma32, **wg}
            for k, kmax in (("fused", 256), ("resident", 128)) for p in (16, 33)]
    # the sums held in registers across the point tiles (no smem sums: 256 KB less shared-memory
    # traffic per 128-point tile at K = 256, and room for K = 256 resident centroids); 128-point tiles
    # (K x 128 x 4 bytes over 256 threads: 128 registers at K = 256)
    rs = {**mma32, **wg, "sums": "regs"}
    out += [{"kind": k, "kmax": kmax, "bm": 128, "bn": 64, "ctas": p, **rs}
            for k, kmax in (("resident", 256), ("fused", 256), ("resident", 128)) for p in (16, 33, 132)]
    out += [{"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": 132, **rs, "xstages": 2}]
    # the same sums in wgmma accumulators, the one-hot product on wgmma (A = the one-hot from registers, B = the
    # points MN-major from the swizzled tile): as many flops as the distances, on wgmma instead of mma.sync
    rw = {"update": "mma", **wg, "sums": "wgmma"}
    out += [{"kind": "resident", "kmax": kmax, "bm": 128, "bn": 64, "ctas": p, **rw}
            for kmax in (256, 128) for p in (16, 33, 132)]
    out += [{"kind": "fused", "kmax": 256, "bm": 128, "bn": 64, "ctas": 132, **rw}]
    # ... with both atoms of dims in one m64n128k16 per block and 16 points (half the update instructions)
    out += [{"kind": "resident", "kmax": kmax, "bm": 128, "bn": 64, "ctas": p, **rw, "update_n": 128}
            for kmax in (256, 128) for p in (16, 33, 132)]
    # centroid tiles in pairs on two accumulators (`astages` 2), tile 2u + 1's wgmma in flight during
    # tile 2u's argmin; bn 32 keeps the two accumulators in the registers of one (238 vs 239 at K = 256; bn 64:
    # 255 and spills). Measured and not picked (bench/results/lib-sweep-kmeans-h200-session22-a2.json): at
    # B = 1, N = 4M, K = 256 16.72 ms against 16.62 for bn 32 on one accumulator and 14.39 for the bn 64 pick
    # (the two warpgroups already overlap one's argmin with the other's wgmma); kept for the record and tests
    out += [{"kind": "resident", "kmax": kmax, "bm": 128, "bn": 32, "ctas": 132, **rw, "update_n": 128, "astages": 2}
            for kmax in (256, 128)]
    # ... and every tile in one static sequence (`aunroll`: tile t + 1's wgmma under tile t's argmin, no loop and
    # no condition, so ptxas keeps the wgmma pipelined; ncu, B = 1 N = 4M K = 256: the pick's wait for each
    # tile's wgmma was the top stall, 9.4% of the samples); bn 64 at 255 registers spills 40 B. Measured (bench/
    # results/lib-sweep-kmeans-h200-session22-au.json): bn 64 1.0-1.3% faster than the pick at B = 1 (N = 4M:
    # 14.18 ms against 14.36), slower batched; bn 32 6-12% slower: not pinned (PIN_OVER), not refitted yet
    out += [{"kind": "resident", "kmax": 256, "bm": 128, "bn": bn, "ctas": 132, **rw, "update_n": 128, "astages": 2,
             "aunroll": True} for bn in (32, 64)]
    # the argmin's running bests split into independent chains (topk `chains`; ncu, B = 1 N = 4M K = 256: a
    # fixed-latency "wait" stall 1.36 of the 5.13 cycles per issued instruction). Measured on the K >= 100 picks
    # and not picked: 0-7% slower everywhere (bench/results/lib-sweep-kmeans-h200-session22-chains.json); kept
    # on the K = 256 pick for the record and tests
    out += [{"kind": "resident", "kmax": 256, "bm": 128, "bn": 64, "ctas": 132, **rw, "update_n": 128, "chains": c}
            for c in (2, 4)]
    return out


# ---------------------------------------------------------------- timing and checks
class Timer:
    """bench/examples.py `timed` with a 256 MiB L2 flush: up to 30 repetitions, at least 3, stopping
    once they add up to 60 ms."""

    def __init__(self):
        from bench.examples import l2_flusher
        self.flush = l2_flusher(256)

    def __call__(self, fn) -> dict:
        from bench.examples import timed
        t = timed(fn, self.flush, reps=30, warmup=1, min_reps=3, budget_ms=60.0)
        return {"ms": t["ms_median"], "ms_min": t["ms_min"], "reps": t["reps"]}


def knn_inputs(shape, seed=0, d=D):
    """Clustered database with exact duplicate rows, queries near rows and some on rows (as tasks/knn); d
    columns."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    Q, M = shape["Q"], shape["M"]
    centers = torch.randn(max(1, M // 64), d, device="cuda", generator=g)
    xb = centers[torch.randint(0, centers.shape[0], (M,), device="cuda", generator=g)]
    xb += 0.3 * torch.randn(M, d, device="cuda", generator=g)
    dup = torch.randint(0, M, (max(1, M // 50),), device="cuda", generator=g)
    xb[dup] = xb[torch.randint(0, M, dup.shape, device="cuda", generator=g)]
    xq = xb[torch.randint(0, M, (Q,), device="cuda", generator=g)] + 0.1 * torch.randn(Q, d, device="cuda", generator=g)
    nq = max(1, Q // 8)
    xq[:nq] = xb[torch.randint(0, M, (nq,), device="cuda", generator=g)]
    if shape.get("self"):
        xq = xb[:Q].clone()
    return xq.half().contiguous(), xb.half().contiguous()


# The checks below are tasks/knn and tasks/kmeans `check` in torch on the GPU: the tasks' numpy float64
# versions take minutes at grid sizes (a 4096 x 4M float64 distance matrix).
def knn_reference(xq, xb, k):
    """(k-th best exact squared distance per query, rounding allowance per query), float64 on the GPU."""
    import torch
    M = xb.shape[0]
    q = xq.double()
    qn = (q * q).sum(1)
    bmax = 0.0
    best = None
    for m0 in range(0, M, 1 << 16):
        b = xb[m0:m0 + (1 << 16)].double()
        bn = (b * b).sum(1)
        bmax = max(bmax, float(bn.max()))
        d = (qn[:, None] + bn[None, :] - 2.0 * q @ b.T).clamp_min(0)
        v = torch.topk(d, min(k, d.shape[1]), dim=1, largest=False).values
        best = v if best is None else torch.topk(torch.cat([best, v], 1), k, dim=1, largest=False).values
    return best[:, k - 1], 2e-5 * (qn + bmax)


def index_problem(I, Q: int, M: int, k: int) -> str:
    """'' when I [Q, k] holds distinct indices in [0, M) per row, else what is wrong."""
    if tuple(I.shape) != (Q, k) or (I < 0).any() or (I >= M).any():
        return "indices out of range"
    s, _ = I.sort(1)
    if k > 1 and (s[:, 1:] == s[:, :-1]).any():
        return "duplicate index in a row"
    return ""


def knn_check(xq, xb, I, Dist, k, ref, metric: str = "l2") -> tuple[bool, str]:
    """recall@k = 1 allowing ties (float64), distinct in-range indices, distances within the allowance.
    ref: (each query's k-th best exact score, its allowance); metric "ip" scores by the largest q.x."""
    import torch
    I = I.long()
    bad = index_problem(I, xq.shape[0], xb.shape[0], k)
    if bad:
        return False, bad
    kth, tol = ref
    if metric == "l2":
        ex = ((xq.double()[:, None, :] - xb[I].double()) ** 2).sum(-1)
        miss = ex > kth[:, None] + tol[:, None]
    else:
        ex = (xq.double()[:, None, :] * xb[I].double()).sum(-1)
        miss = ex < kth[:, None] - tol[:, None]
    if miss.any():
        qi = int(miss.any(1).nonzero()[0])
        return False, f"recall@{k} = {1 - miss.float().mean().item():.6f} (first query {qi})"
    err = (Dist.double() - ex).abs()
    if (err > tol[:, None]).any() or not torch.isfinite(Dist).all():
        return False, f"distance off by {float(err.max()):.3g} (allowance {float(tol.min()):.3g})"
    return True, ""


def kmeans_inputs(shape, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, N, K, D = shape["B"], shape["N"], shape["K"], shape.get("D", globals()["D"])
    centers = 2.0 * torch.randn(B, K, D, device="cuda", generator=g)
    lab = torch.randint(0, K, (B, N), device="cuda", generator=g)
    x = torch.gather(centers, 1, lab[..., None].expand(-1, -1, D)) + 0.5 * torch.randn(B, N, D, device="cuda", generator=g)
    pick = torch.stack([torch.randperm(N, device="cuda", generator=g)[:K] if N >= K else
                        torch.randint(0, N, (K,), device="cuda", generator=g) for _ in range(B)])
    c = torch.gather(x, 1, pick[..., None].expand(-1, -1, D)) + 0.05 * torch.randn(B, K, D, device="cuda", generator=g)
    if K >= 3:
        c[:, K - 1] = 40.0      # an empty cluster keeps its centroid
        c[:, 1] = c[:, 0]       # exact ties
    return x.half().contiguous(), c.half().contiguous()


def kmeans_check(x, c, A, Cn) -> tuple[bool, str]:
    """One Lloyd step from c (the checks of tasks/kmeans/task.py, in float64 on the GPU)."""
    import torch
    B, N, _ = x.shape
    K = c.shape[1]
    A = A.long().reshape(B, N)
    if (A < 0).any() or (A >= K).any():
        return False, "assignment out of range"
    xd, cd = x.double(), c.double()
    xn = (xd * xd).sum(-1)
    cn = (cd * cd).sum(-1)
    worst = 0.0
    for b in range(B):
        d = (xn[b][:, None] + cn[b][None, :] - 2.0 * xd[b] @ cd[b].T).clamp_min(0)
        best = d.min(1).values
        got = d.gather(1, A[b][:, None])[:, 0]
        tol = 2e-5 * (xn[b] + cn[b].max())
        if (got > best + tol).any():
            return False, f"batch {b}: {int((got > best + tol).sum())} points not assigned to a nearest centroid"
        rel = float((got.sum() - best.sum()) / best.sum().clamp_min(1e-300))
        worst = max(worst, rel)
        if rel > 1e-3:
            return False, f"batch {b}: inertia {rel:.3g} over the reference"
        cnt = torch.bincount(A[b], minlength=K).double()
        sums = torch.zeros(K, D, dtype=torch.float64, device="cuda").index_add_(0, A[b], xd[b])
        own = torch.where(cnt[:, None] > 0, sums / cnt.clamp_min(1)[:, None], cd[b])
        got_c = Cn.reshape(B, K, D)[b].double()
        r = float(torch.linalg.vector_norm(got_c - own) / torch.linalg.vector_norm(own).clamp_min(1e-300))
        if not math.isfinite(r) or r > 1e-4:
            return False, f"batch {b}: centroids rel RMSE {r:.3g} vs the means of the own assignment"
    return True, ""


# ---------------------------------------------------------------- implementations
def knn_baselines():
    from agent.baselines import _knn_torch

    def torch_knn(xq, xb, k):
        return _knn_torch({"Xq": xq, "Xb": xb}, "l2", k=k)

    out = {"torch": torch_knn}
    try:
        from flashlib import flash_knn
        out["flashlib"] = lambda xq, xb, k: flash_knn(xq, xb, k)
    except Exception as e:  # noqa: BLE001
        print(f"flashlib knn unavailable: {e}", flush=True)
    return out


def kmeans_baselines():
    from agent.baselines import lloyd_step_torch

    def torch_lloyd(x, c, iters):
        cur = c
        for _ in range(iters):
            a, cur = lloyd_step_torch(x, cur)
            cur = cur.half()
        return a, cur

    out = {"torch": torch_lloyd}
    try:
        import flash_kmeans
        fn = flash_kmeans.batch_kmeans_Euclid
        if not fn.__module__.endswith("torch_fallback"):
            out["flash-kmeans"] = lambda x, c, iters: fn(x, n_clusters=c.shape[1], max_iters=iters, tol=-1.0,
                                                         init_centroids=c.clone())
    except Exception as e:  # noqa: BLE001
        print(f"flash-kmeans unavailable: {e}", flush=True)
    try:
        from flashlib import flash_kmeans as fl
        out["flashlib"] = lambda x, c, iters: fl(x, c.shape[1], max_iters=iters, tol=-1.0, init_centroids=c.clone())
    except Exception as e:  # noqa: BLE001
        print(f"flashlib kmeans unavailable: {e}", flush=True)
    return out


# ---------------------------------------------------------------- modes
def precompile(jobs: list[tuple], procs: int) -> dict:
    """Compile (op, params, k) jobs in parallel into the on-disk cubin cache; returns failures."""
    from concurrent.futures import ProcessPoolExecutor
    fails = {}
    with ProcessPoolExecutor(procs) as ex:
        for job, err in zip(jobs, ex.map(_compile_job, jobs)):
            if err:
                fails[str(job)] = err
    return fails


def _compile_job(job) -> str:
    from cake_ir.compiler import compile_ir
    from cakelib.variants import kmeans_kernel, knn_kernel
    op, p, k, arch = job
    try:   # (a build that cannot be made is a failure to report, not the end of the batch)
        ir = knn_kernel(p, k, "l2", D, arch) if op == "knn" else kmeans_kernel(p, arch)
    except Exception as e:  # noqa: BLE001
        return f"build: {type(e).__name__}: {e}"[:400]
    res = compile_ir(ir, arch=arch)   # a kernel or a Program (knn norms "global")
    return "" if res.ok else "; ".join(d.short() for d in res.diagnostics if d.severity == "error")[:400]


def env_info() -> dict:
    from bench.examples import env_info as info
    return info(("torch", "triton", "flashlib", "flash-kmeans", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/lib_grid.py")


def poisoned_outputs(xq, k):
    """Fresh outputs filled with values no kernel writes (index -7, NaN distances) for a checked call:
    the caching allocator would otherwise hand a variant the block the previous variant just filled
    with the right answer, and a kernel that never stores its result would pass."""
    import torch
    Q = xq.shape[0]
    return (torch.full((Q, k), -7, dtype=torch.int32, device=xq.device),
            torch.full((Q, k), float("nan"), dtype=torch.float32, device=xq.device))


def poisoned_kmeans_outputs(x, c):
    """poisoned_outputs for kmeans: NaN centroids [B, K, D], cluster -7 for every point [B, N]."""
    import torch
    B, N, _ = x.shape
    return (torch.full(tuple(c.shape), float("nan"), dtype=torch.float32, device=x.device),
            torch.full((B, N), -7, dtype=torch.int32, device=x.device))


def run_knn_variant(timer, xq, xb, k, p, ref, best_ms=None):
    """Check, then time; a variant whose checked call (kernels already compiled: first launch, then a
    synchronised second one) took over 10x the best time at this shape so far is not timed further:
    its wall time stands in (`approx`), which is plenty for the fit and saves the sweep's budget."""
    import torch
    from cakelib import knn
    I, Dv = knn(xq, xb, k, variant=p, out=poisoned_outputs(xq, k))
    ok, why = knn_check(xq, xb, I, Dv, k, ref)
    if not ok:
        return ok, why, None
    if best_ms is not None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        knn(xq, xb, k, variant=p)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        if wall > 10 * best_ms and wall > 2.0:
            return ok, why, {"ms": wall, "ms_min": wall, "reps": 1, "approx": True}
    return ok, why, timer(lambda: knn(xq, xb, k, variant=p))


def run_kmeans_variant(timer, x, c, p):
    from cakelib import kmeans
    K = c.shape[1]
    Cn, A = kmeans(x, K, 1, init=c, variant=p, out=poisoned_kmeans_outputs(x, c))
    ok, why = kmeans_check(x, c, A, Cn)
    t = timer(lambda: kmeans(x, K, ITERS, init=c, variant=p)) if ok else None
    return ok, why, t


def shape_filter(spec: str | None):
    """"k=16", "Q=1,k=16" or "B=16|32,K=160" -> a predicate on shapes (every named dimension one of its
    values); alternatives joined by ";" ("k=1;Q=4096|32768,k=16": either); None: all shapes."""
    if not spec:
        return lambda shape: True
    alts = [{k: {int(x) for x in v.split("|")} for k, v in (kv.split("=") for kv in part.split(","))}
            for part in spec.split(";")]
    return lambda shape: any(all(shape.get(k) in v for k, v in want.items()) for want in alts)


def variant_filter(op: str, pattern: str | None):
    """A predicate on variant params: the variant's name matches the regular expression (None: all)."""
    from cakelib.variants import NAMES
    return lambda p: pattern is None or re.search(pattern, NAMES[op](p)) is not None


def sweep_jobs(op: str, arch: str, only: str | None = None, pattern: str | None = None, region: str = "") -> list[tuple]:
    """(op, params, k, arch) of every kernel the sweep runs: each variant at each training k it supports
    (only / pattern: the training shapes and variants the sweep is restricted to)."""
    from cakelib.variants import NAMES, SUPPORTS
    variants = list(filter(variant_filter(op, pattern), knn_variants() if op == "knn" else kmeans_variants()))
    if op != "knn":
        return [(op, p, 10, arch) for p in variants if SUPPORTS[op](p, {"B": 1, "N": 1, "K": 1, "D": D, "arch": arch})]
    # the training shapes and the probe's (a restricted sweep still probes its variants at every probe k)
    from cakelib.runtime import per_call_form
    train = [s for s in TRAIN[op, region]() if shape_filter(only)(s)]
    shapes = train + PROBE_SHAPES[op]
    jobs = {(NAMES[op](p), k): (op, p, k, arch) for k in sorted({s["k"] for s in shapes}) for p in variants
            if any(s["k"] == k and SUPPORTS[op](p, {**s, "D": D, "arch": arch}) for s in shapes)}
    for s in train:                      # the per-call forms the sweep times (another build where they differ)
        sh = {**s, "D": D, "arch": arch}
        for p in variants:
            if SUPPORTS[op](p, sh):
                t = per_call_form(op, p, sh)
                jobs.setdefault((NAMES[op](t), s["k"]), (op, t, s["k"], arch))
    return list(jobs.values())


# A small shape per op on which the probe checks every variant once (Q not a multiple of a query tile,
# M not of a database tile, several point tiles per CTA, K past a centroid tile).
PROBE_SHAPES = {"knn": [{"Q": 300, "M": 40_003, "k": 10}, {"Q": 37, "M": 40_003, "k": 16}],
                "kmeans": [{"B": 2, "N": 60_001, "K": 30}, {"B": 2, "N": 60_001, "K": 100},
                           {"B": 1, "N": 60_001, "K": 250}]}   # every kmax (32 .. 256) is probed


def probe_child(op: str, start: int, pattern: str | None = None) -> None:
    """In a child process: check each variant (from index `start`; those whose name matches `pattern`)
    once on the probe shapes it supports, printing `START i` before and `OK i` / `BAD i why` after, so
    that the parent knows which variant killed the process (an illegal address poisons the CUDA context
    for everything after it)."""
    from cakelib.variants import SUPPORTS
    from gpu_backend.driver import arch_of, properties
    arch = arch_of(properties(0))
    variants = knn_variants() if op == "knn" else kmeans_variants()
    cases = []
    for shape in PROBE_SHAPES[op]:
        if op == "knn":
            xq, xb = knn_inputs(shape)
            cases.append((shape, (xq, xb, knn_reference(xq, xb, shape["k"]))))
        else:
            cases.append((shape, kmeans_inputs(shape)))
    wanted = variant_filter(op, pattern)
    for i in range(start, len(variants)):
        p = variants[i]
        if not wanted(p):                # not swept: nothing to check (and nothing compiled for it)
            print(f"OK {i}", flush=True)
            continue
        print(f"START {i}", flush=True)
        why = ""
        for shape, data in cases:
            if not SUPPORTS[op](p, {**shape, "D": D, "arch": arch}):
                continue
            if op == "knn":
                from cakelib import knn
                xq, xb, ref = data
                I, Dv = knn(xq, xb, shape["k"], variant=p, out=poisoned_outputs(xq, shape["k"]))
                ok, w = knn_check(xq, xb, I, Dv, shape["k"], ref)
            else:
                ok, w, _ = _kmeans_checked(data, p)
            if not ok:
                why = f"{shape}: {w}"[:300]
                break
        print(f"BAD {i} {why}" if why else f"OK {i}", flush=True)


def _kmeans_checked(data, p):
    from cakelib import kmeans
    x, c = data
    Cn, A = kmeans(x, c.shape[1], 1, init=c, variant=p, out=poisoned_kmeans_outputs(x, c))
    ok, why = kmeans_check(x, c, A, Cn)
    return ok, why, None


def probe(op: str, timeout_s: float = 300.0, pattern: str | None = None) -> dict:
    """{variant index: why} for the variants that failed their check or killed the probing process:
    children check the variants in order; one that dies (crash, sticky CUDA error, hang past the
    timeout) takes the variant it was on with it and a new child resumes after it."""
    import subprocess
    n = len(knn_variants() if op == "knn" else kmeans_variants())
    bad, start, t0 = {}, 0, time.time()
    while start < n and time.time() - t0 < timeout_s:
        cmd = [sys.executable, os.path.abspath(__file__), "probe-child", op, str(start)] + ([pattern] if pattern else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout_s - (time.time() - t0)))
            lines, rc, err = out.stdout.splitlines(), out.returncode, out.stderr
        except subprocess.TimeoutExpired as e:
            lines, rc, err = (e.stdout or b"").decode(errors="replace").splitlines(), "timeout", ""
        nxt = probe_step(lines, rc, err, start, n, bad)
        if nxt == start:                 # no progress (the child cannot start here): probe nothing more
            last = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"{op}: probe: the probing process made no progress (rc {rc}): {last[:200]}", flush=True)
            break
        start = nxt
    return bad


def probe_step(lines: list, rc, err: str, start: int, n: int, bad: dict) -> int:
    """Read one probing child's output (from variant `start`): record its BAD variants and the one it
    died on into `bad`; return where the next child starts (n: done; `start` again: it made no
    progress, e.g. it cannot start on this machine, and the caller stops probing)."""
    cur, done = None, start
    for ln in lines:
        kind, _, rest = ln.partition(" ")
        idx, _, why = rest.partition(" ")
        if kind == "START":
            cur = int(idx)
        elif kind in ("OK", "BAD"):
            done, cur = int(idx) + 1, None
            if kind == "BAD":
                bad[int(idx)] = why
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if cur is not None:                  # the child died on this variant
        bad[cur] = f"the probing process died on it (rc {rc}): {last}"[:300]
        return cur + 1
    if done >= n or rc == 0:
        return n
    return done                          # died between variants: resume there (no progress: the caller stops)


def rescale_prior(kept: list, new: list, old: list) -> list:
    """The prior sweep's rows put on this run's clock: at each shape, their times x the median ratio (this
    run / the prior) of the variants timed in both (re-timed wgmma k-means variants once ran a
    median 3% faster than their prior rows, up to 37% at the smallest shape, which handed them picks from
    variants that were not re-timed). A shape with no variant in both keeps its rows as they were."""
    key = lambda r: (json.dumps(r["shape"], sort_keys=True), r["variant"])
    # (a row that `ran` a per-call form is another kernel than a prior row of its name may have been)
    before = {key(r): r["ms"] for r in old if r.get("ok") and r.get("ms") and not r.get("ran")}
    ratios: dict = {}
    for r in new:
        if r.get("ok") and r.get("ms") and key(r) in before and not r.get("ran"):
            ratios.setdefault(key(r)[0], []).append(r["ms"] / before[key(r)])
    out = []
    for r in kept:
        f = statistics.median(ratios[key(r)[0]]) if key(r)[0] in ratios else None
        out.append({**r, "ms": r["ms"] * f, "prior_ms": r["ms"], "rescaled": f} if f and r.get("ms") else r)
    return out


def sweep(ops, out_dir, procs, budget_s=200, only=None, pattern=None, prior=None, region=""):
    """Time every variant at every training shape (only / pattern: a subset of shapes / variant names)
    and fit the dispatch table; prior: an earlier sweep's JSON whose measurements join the fit (this
    sweep's replace those of the same shape and variant), for timing a few new variants without
    re-timing the rest."""
    import torch
    from cakelib.dispatch import evaluate, fit_by_cross_validation, pin
    from cakelib.runtime import per_call_form
    from cakelib.variants import FALLBACK, NAMES, SUPPORTS
    from gpu_backend.driver import arch_of, properties
    arch = arch_of(properties(0))
    timer = Timer()
    info = env_info()
    result = {"mode": "sweep", "env": info, "command": " ".join(sys.argv), "ops": {}}
    for op in ops:
        variants = knn_variants() if op == "knn" else kmeans_variants()
        shapes = [s for s in TRAIN[op, region]() if shape_filter(only)(s)]
        t0 = time.time()
        jobs = sweep_jobs(op, arch, only, pattern, region)
        fails = precompile(jobs, procs)
        bad = {(NAMES[op](j[1]), j[2]) for j in jobs if str(j) in fails}   # (variant, k) that did not compile
        print(f"{op}: compiled {len(jobs)} variant x k kernels in {time.time() - t0:.1f} s, {len(fails)} failed", flush=True)
        # variants that fail a small check or kill their process are kept out: one illegal address
        # would poison this process's CUDA context for every variant after it
        probed = {NAMES[op](variants[i]): why for i, why in probe(op, pattern=pattern).items()}
        for name, why in sorted(probed.items()):
            print(f"{op}: probe: {name} left out: {why}", flush=True)
        bad |= {(name, s.get("k", 10)) for name in probed for s in shapes}
        print(f"{op}: probed {len(variants)} variants in {time.time() - t0:.1f} s, {len(probed)} left out", flush=True)
        variants = list(filter(variant_filter(op, pattern), variants))
        uq = unqueued(variants, {s["k"] for s in shapes}) if op == "knn" else {}
        if uq:   # (their times compare a queue as well as a kernel with the fitted variants')
            print(f"knn: {len(uq)} variants run queue T = 0 at k >= 16 for want of a queue-table entry "
                  f"(bench/topk_queue_ab.py --variant): {', '.join(sorted(uq))}", flush=True)
        raw = []
        t_op = time.time()
        for shape in shapes:
            if time.time() - t_op > budget_s:
                print(f"{op}: sweep budget of {budget_s} s spent; remaining shapes skipped", flush=True)
                break
            sh = {**shape, "D": D, "arch": arch}   # the wgmma variants run on sm_90a only
            if op == "knn":
                xq, xb = knn_inputs(shape)
                ref = knn_reference(xq, xb, shape["k"])
            else:
                x, c = kmeans_inputs(shape)
            best = None
            order = variants
            if op == "knn" and shape["Q"] < 1024:   # the fast ones first, so slow ones are cut short (approx)
                order = sorted(variants, key=lambda p: -p["split"])
            for p in order:
                if time.time() - t_op > budget_s + 30:
                    print(f"{op}: sweep budget overrun at {shape}; the shape's remaining variants skipped", flush=True)
                    break
                name = NAMES[op](p)
                if not SUPPORTS[op](p, sh) or (name, shape.get("k", 10)) in bad:
                    continue
                # timed as the library runs the pick at this shape (its per-call form), recorded under
                # its table name: the fit compares what the dispatcher's choices would cost
                run = per_call_form(op, p, sh)
                ran = {"ran": NAMES[op](run)} if run != p else {}
                if ran and (ran["ran"], shape.get("k", 10)) in bad:
                    continue
                try:
                    ok, why, t = (run_knn_variant(timer, xq, xb, shape["k"], run, ref, best) if op == "knn"
                                  else run_kmeans_variant(timer, x, c, run))
                    if t and not t.get("approx"):
                        best = t["ms"] if best is None else min(best, t["ms"])
                except Exception as e:  # noqa: BLE001
                    ok, why, t = False, f"{type(e).__name__}: {e}"[:300], None
                    torch.cuda.synchronize()
                raw.append({"shape": shape, "variant": name, **ran, "ok": ok, "why": why, **(t or {})})
                print(f"{op} {shape} {ran.get('ran', name):28s} {'ok ' if ok else 'BAD'} "
                      f"{t['ms'] if t else float('nan'):9.4f} ms {why}", flush=True)
            torch.cuda.empty_cache()
        vmap = {NAMES[op](p): p for p in variants}
        if prior:
            from bench.examples import timing_of
            prior_doc = json.load(open(prior))
            if timing_of(prior_doc.get("env")) != timing_of(info):
                print(f"{op}: WARNING: the prior sweep was timed by another method ({timing_of(prior_doc.get('env'))!r}, "
                      f"now {timing_of(info)!r}): the fit compares its rows with this sweep's", flush=True)
            old = prior_doc["ops"][op]
            new = {(json.dumps(r["shape"], sort_keys=True), r["variant"]) for r in raw}
            kept = [r for r in old["rows"] if (json.dumps(r["shape"], sort_keys=True), r["variant"]) not in new]
            kept = [{**r, "prior": True} for r in rescale_prior(kept, raw, old["rows"])]
            raw = kept + raw
            vmap = {**old["variants"], **vmap}
            result["prior"] = {"file": prior, "rows_kept": len(kept), "env": prior_doc.get("env")}
            shapes = list({json.dumps(r["shape"], sort_keys=True): r["shape"] for r in raw}.values())
        rows = measurements(op, raw, vmap, arch)
        meta = {"gpu": info.get("gpu"), "date": info["date"], "command": " ".join(["python"] + sys.argv),
                "shapes": len(shapes), "measurements": len(rows)}
        sup = _supports(op, vmap, arch)
        table = fit_by_cross_validation(op, rows, FEATURES[op], vmap, NAMES[op](FALLBACK[op]),
                                        supports=sup, meta=meta, tail=FIT_TAIL)
        table = pin(table, measurements(op, fresh_rows(raw), vmap, arch), PIN_OVER, sup)
        path = os.path.join(out_dir, table_file(op, region))
        table.save(path)
        ev = evaluate(table, rows)
        result["ops"][op] = {"variants": vmap, "fails_compile": fails, "fails_probe": probed, "rows": raw, "fit_eval": ev}
        print(f"{op}: table -> {path}; training-set geomean slowdown vs oracle {ev['geomean_slowdown_vs_oracle']:.3f}",
              flush=True)
        with open(os.path.join(out_dir, "lib-sweep-h200.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)


def spread(shapes: list, n: int) -> list:
    """Every n-th shape first, then the next residue, ...: a run cut by its deadline still covers the
    whole grid (n = 1: the grid's own order)."""
    return [shapes[i] for r in range(max(1, n)) for i in range(r, len(shapes), max(1, n))]


def grid_jobs(op: str, shapes, arch: str) -> list[tuple]:
    """The (op, params, k, arch) compile jobs of the kernels the library dispatches at these shapes."""
    from cakelib.runtime import choose
    jobs = {(op, json.dumps(choose(op, {**s, "D": D})[1], sort_keys=True), s.get("k", 10), arch) for s in shapes}
    return [(o, json.loads(p), k, a) for o, p, k, a in sorted(jobs)]


def time_baselines(timer, calls: dict, row: dict, lib_ms) -> None:
    """Time each baseline call into row["baselines"] (None and row["baseline_errors"] where it raised), then
    the best baseline, its time and the speedup lib_ms has over it."""
    import torch
    row["baselines"] = {}
    for b, fn in calls.items():
        try:
            row["baselines"][b] = timer(fn)["ms"]
        except Exception as e:  # noqa: BLE001
            row["baselines"][b] = None
            row.setdefault("baseline_errors", {})[b] = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
    good = {b: t for b, t in row["baselines"].items() if t}
    if good and lib_ms:
        bb = min(good, key=good.get)
        row["best_baseline"], row["best_baseline_ms"] = bb, good[bb]
        row["speedup"] = good[bb] / lib_ms


def grid(ops, out_dir, procs, deadline_s=1e9, skip=0, spread_n=1, shard=(0, 1), only=None, region=""):
    import torch
    from cakelib import kmeans, knn
    from cakelib.runtime import choose
    from gpu_backend.driver import arch_of, properties
    arch = arch_of(properties(0))
    timer = Timer()
    info = env_info()
    result = {"mode": "grid", "env": info, "command": " ".join(sys.argv), "ops": {}}
    summary = []
    for op in ops:
        shapes = [s for s in spread(GRID[op, region](), spread_n)[skip:] if shape_filter(only)(s)]
        shapes = shapes[shard[0]::shard[1]]   # shard i of n: one GPU of n each takes every n-th shape
        # compile the dispatched variants in parallel first (k is a compile-time constant for knn)
        jobs = grid_jobs(op, shapes, arch)
        t0 = time.time()
        fails = precompile(jobs, procs)
        print(f"{op}: compiled {len(jobs)} dispatched kernels in {time.time() - t0:.1f} s, {len(fails)} failed", flush=True)
        base = knn_baselines() if op == "knn" else kmeans_baselines()
        rows = []
        t_start = time.time()
        for shape in shapes:
            if time.time() - t_start > deadline_s:
                print(f"{op}: deadline of {deadline_s} s reached after {len(rows)} of {len(shapes)} shapes", flush=True)
                result.setdefault("truncated", {})[op] = {"done": len(rows), "of": len(shapes)}
                break
            sh = {**shape, "D": D}
            name, _ = choose(op, sh)
            row = {"shape": shape, "variant": name}
            try:
                if op == "knn":
                    xq, xb = knn_inputs(shape)
                    k = shape["k"]
                    I, Dv = knn(xq, xb, k, out=poisoned_outputs(xq, k))
                    row["ok"], row["why"] = knn_check(xq, xb, I, Dv, k, knn_reference(xq, xb, k))
                    row["cake_ms"] = timer(lambda: knn(xq, xb, k))["ms"] if row["ok"] else None
                    calls = {b: (lambda f=f: f(xq, xb, k)) for b, f in base.items()}
                else:
                    x, c = kmeans_inputs(shape)
                    K = shape["K"]
                    Cn, A = kmeans(x, K, 1, init=c, out=poisoned_kmeans_outputs(x, c))
                    row["ok"], row["why"] = kmeans_check(x, c, A, Cn)
                    row["cake_ms"] = timer(lambda: kmeans(x, K, ITERS, init=c))["ms"] if row["ok"] else None
                    calls = {b: (lambda f=f: f(x, c, ITERS)) for b, f in base.items()}
            except Exception as e:  # noqa: BLE001
                row["ok"], row["why"], calls = False, f"{type(e).__name__}: {e}"[:300], {}
            time_baselines(timer, calls, row, row.get("cake_ms"))
            rows.append(row)
            print(f"{op} {shape} {name:28s} ok={row['ok']} cake={row.get('cake_ms')} base={row['baselines']} "
                  f"x{row.get('speedup', float('nan')):.2f} t={time.time() - t_start:.0f}s {row['why']}", flush=True)
            torch.cuda.empty_cache()
            if len(rows) % 10 == 0:   # a killed run still leaves its measurements
                with open(os.path.join(out_dir, f"lib-grid-{op}-h200.partial.json"), "w") as f:
                    json.dump({**result, "ops": {op: {"rows": rows}}}, f, default=str)
        sp = [r["speedup"] for r in rows if r.get("speedup")]
        s = {"op": op, "shapes": len(rows), "correct": sum(bool(r["ok"]) for r in rows),
             "geomean_speedup": math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None,
             "worst_speedup": min(sp) if sp else None, "slower_than_0.95": sum(x < 0.95 for x in sp)}
        if sp:
            w = min((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"])
            s["worst_shape"] = w["shape"]
        result["ops"][op] = {"summary": s, "rows": rows}
        summary.append(s)
        with open(os.path.join(out_dir, f"lib-grid-{op}-h200.json"), "w") as f:
            json.dump({**result, "ops": {op: result["ops"][op]}}, f, indent=1, default=str)
    print("\nop       shapes correct geomean worst  <0.95x")
    for s in summary:
        print(f"{s['op']:8s} {s['shapes']:6d} {s['correct']:7d} {s['geomean_speedup'] or 0:7.3f} "
              f"{s['worst_speedup'] or 0:5.3f} {s['slower_than_0.95']:6d}")


def summarize(rows: list[dict]) -> dict:
    sp = [r["speedup"] for r in rows if r.get("speedup")]
    out = {"shapes": len(rows), "correct": sum(bool(r.get("ok")) for r in rows), "timed": len(sp),
           "geomean_speedup": math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None,
           "worst_speedup": min(sp) if sp else None, "slower_than_0.95": sum(x < 0.95 for x in sp),
           "faster_than_1.0": sum(x > 1.0 for x in sp)}
    if sp:
        out["worst_shape"] = min((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"])["shape"]
        by = {}
        for r in rows:
            if r.get("best_baseline"):
                by[r["best_baseline"]] = by.get(r["best_baseline"], 0) + 1
        out["best_baseline_counts"] = by
    return out


def summary(paths: list[str]) -> None:
    """Merge grid result files (a run cut by its deadline and its continuation) and print the summary."""
    ops: dict = {}
    for p in paths:
        d = json.load(open(p))
        for op, v in d["ops"].items():
            ops.setdefault(op, []).extend(v["rows"])
    for op, rows in ops.items():
        print(op, json.dumps(summarize(rows)))


def measurements(op: str, raw: list, vmap: dict, arch: str = "sm_90a") -> list:
    """The fit's rows from a sweep's raw rows: a variant timed at a shape its domain no longer holds
    (cakelib.variants changed since, e.g. KNN_CAPPED_K_MAX) counts as not run there."""
    from cakelib.dispatch import Measurement
    sup = _supports(op, vmap, arch)
    return [Measurement(shape=r["shape"], variant=r["variant"], ms=r.get("ms"),
                        ok=r["ok"] and sup(r["variant"], r["shape"])) for r in raw]


def unqueued(variants: list, ks) -> dict:
    """kNN variant name -> the ks >= 16 at which it runs the deferred insertion's queue at T = 0 only because
    the queue table has no entry for it (cakelib.variants.knn_queue's default). An earlier sweep ran every
    wgmma build and every seeded form at T = 0 beside the mma.sync build's fitted T = 2, which had bought it 2.4x
    at k = 32: the sweep compared queues, not kernels."""
    from cakelib.variants import knn_name, knn_queue_fitted
    big = sorted(k for k in ks if k >= 16)
    return {knn_name(p): big for p in variants if big and "queue" not in p and not knn_queue_fitted(p)}


def fresh_rows(raw: list) -> list:
    """A sweep's rows timed in its own run (not carried over from its --prior: `sweep` marks those)."""
    return [r for r in raw if not r.get("prior")]


def _supports(op: str, vmap: dict, arch: str = "sm_90a"):
    """supports(variant name, shape) for picking among measured variants (D and the GPU's arch added)."""
    from cakelib.variants import SUPPORTS
    return lambda name, shape: name in vmap and SUPPORTS[op](vmap[name], {**shape, "D": D, "arch": arch})


def refit(sweep_path: str, out_dir: str, max_depth=None, min_leaf=None, cv=False, pin_over=PIN_OVER,
          keep_tree=None) -> None:
    """Fit the dispatch tables again from a sweep's measurements (lib-sweep-h200.json), no GPU; the tree
    size is chosen by leave-one-shape-out cross-validation like the sweep's, unless max_depth / min_leaf
    fix it. The table records the sweep's date and GPU and the refit command. cv: also print the
    leave-one-shape-out estimate (cakelib.dispatch.cross_validate) for the fitted size. pin_over: the
    measured shapes whose tree pick is slower than this x their best run the best (<= 0: no pins).
    keep_tree: a table file whose tree is kept (no fit; e.g. when a sweep of a few shapes would move picks
    at shapes it did not time): only its pins are redone from the sweep's own rows, its pins at shapes
    the sweep did not time kept."""
    from cakelib.dispatch import TREE_SIZES, DispatchTable, cross_validate, evaluate, fit, fit_by_cross_validation, pin
    from cakelib.variants import FALLBACK, NAMES
    d = json.load(open(sweep_path))
    for op, v in d["ops"].items():
        rows = measurements(op, v["rows"], v["variants"])
        vm, fb, sup = v["variants"], NAMES[op](FALLBACK[op]), _supports(op, v["variants"])
        meta = {"gpu": d["env"].get("gpu"), "date": d["env"]["date"], "command": " ".join(["python"] + sys.argv),
                "sweep_command": d.get("command"), "shapes": len({json.dumps(r["shape"], sort_keys=True) for r in v["rows"]}),
                "measurements": len(rows)}
        fresh = measurements(op, fresh_rows(v["rows"]), v["variants"])
        if keep_tree:
            if pin_over <= 0:
                raise SystemExit("refit --keep-tree only redoes the pins: --pin-over must be > 0")
            old = DispatchTable.load(keep_tree)
            if old.op != op:
                raise SystemExit(f"--keep-tree {keep_tree} is a {old.op!r} table, the sweep's op is {op!r}")
            table = pin(old, fresh, pin_over, sup)
            timed = {json.dumps(r.shape, sort_keys=True) for r in fresh}
            # (marked: they rest on an earlier sweep's own run, now this sweep's prior rows)
            kept = [{**p, "kept": True} for p in old.pins if json.dumps(p["shape"], sort_keys=True) not in timed]
            table = dataclasses.replace(table, pins=kept + table.pins,
                                        meta={**table.meta, "repinned": meta, "pins_kept": len(kept)})
            how = f"tree of {keep_tree}, {len(table.pins) - len(kept)} pins from the sweep's own rows, {len(kept)} kept"
        else:
            if max_depth or min_leaf:        # a fixed size: the given parts over the simplest one tried
                size = {**TREE_SIZES[0], **({"max_depth": max_depth} if max_depth else {}),
                        **({"min_leaf": min_leaf} if min_leaf else {})}
                table = fit(op, rows, FEATURES[op], vm, fb, meta=meta, tail=FIT_TAIL, **size)
            else:
                table = fit_by_cross_validation(op, rows, FEATURES[op], vm, fb, supports=sup, meta=meta, tail=FIT_TAIL)
            if pin_over > 0:
                table = pin(table, fresh, pin_over, sup)
            kw = {k: table.meta["fit"][k] for k in ("max_depth", "min_leaf", "tail")}
            how = str(kw)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{op}.json")
        table.save(path)
        print(f"{op}: table -> {path}; training-set geomean slowdown vs oracle "
              f"{evaluate(table, rows)['geomean_slowdown_vs_oracle']:.3f} ({how})")
        if cv and not keep_tree:
            ev = cross_validate(op, rows, FEATURES[op], vm, fb, supports=sup, **kw)
            print(f"{op}: leave-one-shape-out geomean slowdown vs oracle {ev['geomean_slowdown_vs_oracle']:.3f}, "
                  f"worst {ev['worst_slowdown']:.2f} at {ev['worst_shape']}")


def merge(out_path: str, paths: list[str], later_wins: bool = False) -> None:
    """One grid result file from several (the shards of one run on several GPUs, or a run and its
    continuation): every row once, each part's env and command kept, the summary recomputed.
    later_wins: a shape in several parts keeps the last part's row (a subset re-timed after a refit
    that changed only that subset's picks), and each part records how many rows it gave."""
    from bench.examples import timing_of
    parts, ops = [], {}
    docs = [json.load(open(p)) for p in paths]
    for p, d in zip(paths, docs):
        parts.append({"file": os.path.basename(p), "env": d.get("env"), "command": d.get("command"),
                      "truncated": d.get("truncated")})
    methods = {timing_of(p["env"]) for p in parts if p["env"] is not None}
    if len(methods) > 1:
        print(f"WARNING: the parts were timed by different methods {sorted(methods)}: rows are not comparable",
              flush=True)
    for i, d in enumerate(docs):
        for op, v in d["ops"].items():
            ops.setdefault(op, []).extend((i, r) for r in v.get("rows", []))
        if "parts" in d:   # an already merged file: its parts' provenance
            parts[i]["parts"] = d["parts"]
    out = {"mode": "grid", "parts": parts, "ops": {}}
    for op, tagged in ops.items():
        keys = [json.dumps(r["shape"], sort_keys=True) for _, r in tagged]
        if len(set(keys)) != len(keys) and not later_wins:
            raise SystemExit(f"{op}: a shape appears in more than one part")
        last = {key: i for i, key in enumerate(keys)}
        kept = [tagged[i] for i in sorted(last.values())]
        for i, part in enumerate(parts):
            part.setdefault("rows_kept", {})[op] = sum(1 for j, _ in kept if j == i)
        rows = [r for _, r in kept]
        out["ops"][op] = {"summary": {"op": op, **summarize(rows)}, "rows": rows}
        print(op, json.dumps(out["ops"][op]["summary"]))
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, default=str)


def compare(old_path: str, new_paths: list[str]) -> None:
    """The library's time on the shapes two grid runs share: geomean new / old time per k, and of the
    speedup over the best baseline (each run's own baselines)."""
    def rows(paths):
        out = {}
        for p in paths:
            for op, v in json.load(open(p))["ops"].items():
                for r in v["rows"]:
                    if r.get("cake_ms"):
                        out[(op, json.dumps(r["shape"], sort_keys=True))] = r
        return out
    old, new = rows([old_path]), rows(new_paths)
    by: dict = {}
    for key in sorted(set(old) & set(new)):
        k = json.loads(key[1]).get("k", json.loads(key[1]).get("K"))
        by.setdefault((key[0], k), []).append((old[key], new[key]))
    print("op     k  shapes  time new/old (geomean)  speedup vs best baseline old -> new")
    for (op, k), pairs in sorted(by.items()):
        g = math.exp(sum(math.log(n["cake_ms"] / o["cake_ms"]) for o, n in pairs) / len(pairs))
        sp = [(o.get("speedup"), n.get("speedup")) for o, n in pairs if o.get("speedup") and n.get("speedup")]
        so = math.exp(sum(math.log(a) for a, _ in sp) / len(sp)) if sp else float("nan")
        sn = math.exp(sum(math.log(b) for _, b in sp) / len(sp)) if sp else float("nan")
        print(f"{op:6s} {k!s:>3s} {len(pairs):6d}  {g:22.3f}  {so:.3f} -> {sn:.3f}")


def only_spec(shapes) -> str:
    """The --only spec ("B=1,N=4096,K=8;...") of these shapes."""
    return ";".join(",".join(f"{k}={v}" for k, v in s.items()) for s in shapes)


def changed_shapes(op: str, old_table: str, new_table: str) -> str:
    """The --only spec of the op's grid shapes where the library's guarded pick (cakelib.runtime._pick)
    differs between two dispatch tables: the shapes a refit needs re-timed."""
    from cakelib.dispatch import DispatchTable
    from cakelib.runtime import _pick
    from cakelib.variants import SUPPORTS
    old, new = DispatchTable.load(old_table), DispatchTable.load(new_table)
    pick = lambda t, s: _pick(op, {**s, "D": D}, t, SUPPORTS[op])[0]     # noqa: E731
    return only_spec(s for s in (knn_grid() if op == "knn" else kmeans_grid()) if pick(old, s) != pick(new, s))


def runs(op: str) -> dict:
    """Grid shape (its --only spec) -> what the library runs there with the committed tables: the pick's
    per-call params (cakelib.runtime.choose) and, for kNN, the queue width filled in per k. Two snapshots
    (`runs` before and after a change to any table) give the shapes to re-time (`runs-changed`)."""
    from cakelib.runtime import choose
    from cakelib.variants import knn_queue
    out = {}
    for s in (knn_grid() if op == "knn" else kmeans_grid()):
        _, p = choose(op, {**s, "D": D})
        out[only_spec([s])] = {**p, **({"queue": knn_queue(p, s["k"])} if op == "knn" else {})}
    return out


def runs_changed(before: dict, after: dict) -> str:
    """The --only spec of the shapes whose entry differs between two `runs` snapshots."""
    return ";".join(spec for spec in before if before[spec] != after.get(spec))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "changed":
        return print(changed_shapes(sys.argv[2], sys.argv[3], sys.argv[4]))
    if len(sys.argv) > 1 and sys.argv[1] == "runs":        # runs OP > snapshot.json
        return print(json.dumps(runs(sys.argv[2]), sort_keys=True))
    if len(sys.argv) > 1 and sys.argv[1] == "runs-changed":   # runs-changed BEFORE.json AFTER.json -> --only spec
        return print(runs_changed(*(json.load(open(f)) for f in sys.argv[2:4])))
    if len(sys.argv) > 1 and sys.argv[1] == "probe-child":
        return probe_child(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    if len(sys.argv) > 1 and sys.argv[1] == "summary":
        return summary(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3:])
    if len(sys.argv) > 1 and sys.argv[1] == "merge":
        later = "--later-wins" in sys.argv
        return merge(sys.argv[2], [a for a in sys.argv[3:] if a != "--later-wins"], later)
    if len(sys.argv) > 1 and sys.argv[1] == "refit":
        rp = argparse.ArgumentParser()
        rp.add_argument("mode")
        rp.add_argument("sweep")
        rp.add_argument("--out", default="cakelib/tables")
        rp.add_argument("--max-depth", type=int)
        rp.add_argument("--min-leaf", type=int)
        rp.add_argument("--cv", action="store_true", help="also the leave-one-shape-out estimate")
        rp.add_argument("--pin-over", type=float, default=PIN_OVER,
                        help="pin a measured shape whose tree pick is slower than this x its best (0: no pins)")
        rp.add_argument("--keep-tree", help="a table file whose tree is kept: only the pins are redone (from the "
                        "sweep's own rows; its pins at shapes the sweep did not time are kept)")
        a = rp.parse_args()
        return refit(a.sweep, a.out, a.max_depth, a.min_leaf, a.cv, a.pin_over, a.keep_tree)
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sweep", "grid", "shapes", "compile"])
    ap.add_argument("--op", default="knn,kmeans")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--arch", default="sm_90a", help="compile mode only")
    ap.add_argument("--budget-s", type=float, default=200.0, help="sweep: seconds per op before skipping shapes")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="grid: seconds per op before stopping")
    ap.add_argument("--skip", type=int, default=0, help="grid: start at this shape (continue a run cut by its deadline)")
    ap.add_argument("--shard", default="0/1", help="grid: I/N, every N-th shape from the I-th (one GPU of N)")
    ap.add_argument("--spread", type=int, default=1,
                    help="grid: time every n-th shape first (a run cut by its deadline still covers the grid)")
    ap.add_argument("--only", help="sweep / grid: only the shapes with these dimensions, e.g. k=16")
    ap.add_argument("--variants", help="sweep / compile: only the variants whose name matches this regex")
    ap.add_argument("--grid", action="store_true", help="compile: the grid's dispatched kernels, not the sweep's")
    ap.add_argument("--prior", help="sweep: an earlier sweep JSON whose measurements join the fit")
    ap.add_argument("--region", default="", choices=["", "small"],
                    help="sweep / grid: a shape region with its own table (knn small: M < 16384, tables/knn_small.json)")
    args = ap.parse_args()
    ops = [o for o in args.op.split(",") if o]
    os.makedirs(args.out, exist_ok=True)
    if args.mode == "shapes":
        for op in ops:
            g = knn_grid() if op == "knn" else kmeans_grid()
            tr = knn_train() if op == "knn" else kmeans_train()
            print(f"{op}: {len(g)} grid shapes, {len(tr)} training shapes")
        return
    if args.mode == "compile":
        for op in ops:
            if args.grid:   # the kernels the grid dispatches (with the committed tables) at its --only shapes
                jobs = grid_jobs(op, filter(shape_filter(args.only), GRID[op, args.region]()),
                                 args.arch)
            else:           # what the sweep compiles (fills the cubin cache for it)
                jobs = sweep_jobs(op, args.arch, args.only, args.variants, args.region)
            t0 = time.time()
            fails = precompile(jobs, args.procs)
            print(f"{op}: {len(jobs)} {'dispatched' if args.grid else 'variant x k'} kernels, {len(fails)} failed, "
                  f"{time.time() - t0:.1f} s")
            for j, e in fails.items():
                print("  ", j, e)
        return
    if args.mode == "sweep":
        sweep(ops, args.out, args.procs, args.budget_s, args.only, args.variants, args.prior, args.region)
    else:
        i, n = (int(x) for x in args.shard.split("/"))
        grid(ops, args.out, args.procs, args.deadline_s, args.skip, args.spread, (i, n), args.only, args.region)


if __name__ == "__main__":
    main()
