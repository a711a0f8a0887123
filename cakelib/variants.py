"""The compiled variants the library dispatches between, per operation: a variant is a family's tile /
split parameters; the problem's own constants (k, metric, D) are filled in at call time, so one
variant covers every k and metric it supports. `supports(op, params, shape)` is the domain of a
variant (what it computes correctly), the dispatcher's guard before it trusts a table's pick.
"""
from __future__ import annotations

import json
from functools import lru_cache
from math import ceil

# ---------------------------------------------------------------- knn (tasks/knn/programs.py)
KNN_D = (64, 128)          # the mma_a query fragments hold all of D in registers
# the any-D variants (a "dk" param) take any even D up to KNN_D_MAX, within the verifier's smem and register
# limits: on sm_90a the D-chunked wgmma search (tasks/knn/wgmma.py knn_wgmma dk: [BN, dk] chunks, the query tile
# resident, 128 KB at BQ = 64 and D = 1024), elsewhere mma.sync with the whole row staged (dk 0, knn_fused with
# the query fragments re-read from smem); knn() pads an odd D with a zero column
KNN_D_MAX = 1024
KNN_DK_K_MAX = 32
# query tiles up to which knn_dk_pick reduces the database norms per staged chunk (each query tile repeats the
# reduce; the norms kernel reads the whole database once more, the search's whole cost at a few queries)
KNN_DK_TILE_NORM_TILES = 2
KNN_K_MAX = 32             # per-lane sorted lists live in registers (k = 64 exceeds the register budget)
# the split path at k = 32: with E-RES-05 counting live ranges (the search lists die before the merge
# lists are born) most split variants verify, and they pass the task's evaluator on the H200
# (tests/test_knn_fast.py::test_split_search_at_k32_passes_evaluator_on_gpu; Q = 1024, M = 1M, k = 32
# 9.9 ms split vs 33.6 ms unsplit in the sweep)
KNN_K_MAX_SPLIT = 32
# the large-k path (cakelib/knn_large_k.py: a distance tile into a workspace, then a block-wide selection)
KNN_LARGE_K_MAX = 1024     # row_select's candidate buffer and bitonic sort hold 4096 entries (>= k + the k-th key's bin)
KNN_LARGE_D_MAX = 1024
KNN_LARGE_M_MAX = 1 << 22  # the workspace holds 128 rows of S at least (2 GiB at this M)
KNN_LARGE_WS_WORDS = 1 << 27   # S workspace: 512 MiB of fp32 dot products per chunk of queries
KNN_FALLBACK = {"bq": 64, "bn": 64, "split": 1, "stages": 2}
# the wgmma kernels' database norms (l2): "global", a norms kernel's first read of the whole database, or
# "tile", reduced from each staged tile while its wgmma runs; a variant's explicit "norms"
# wins (`_gn` / `_tn` in a wgmma name where it is not this default). Measured (same-run A/B and
# the grid's 87 wgmma picks, bench/results/topk-norms-ab-h200.json): "tile" saves the database read only
# where few query tiles share it and the search streams (k = 1, Q = 64: 0.53 -> 0.36 ms at M = 4M, 1.35-1.47x;
# Q = 128 1.03-1.15x): below the H200's ~200 FLOP per byte (2 Q D FLOP per 2 D bytes of a database row) the
# search is bound by the database's bytes. At k = 10 / 16 (the insertion binds) it is even (0.96-1.05x), and
# at Q >= 256 each query tile repeats the reduce in a compute-bound kernel: 0.68-0.99x. So "global" stays
# the default and the per-call form takes "tile" within KNN_WGMMA_TILE_NORMS (knn_wgmma_norms)
KNN_WGMMA_NORMS = "global"
KNN_WGMMA_TILE_NORMS = {"k_max": 1, "q_max": 128}
# a register cap (minb > 1: 128 registers for 2 CTAs of 256 threads or 4 of 128) holds the lists up to
# k = 16 (ptxas: 12-88 B of spill stores); at k = 32 every capped kNN kernel spills 2-9 KB per thread
# (earlier cubins; the grid's Q = 10000, M = 1M, k = 32 ran 2x slower on one), so that is outside
# their domain
KNN_CAPPED_K_MAX = 16


def knn_queue(p: dict, k: int) -> int:
    """The deferred top-k insertion's queue width (the `topk` queue, tasks/knn/programs.py `queue`): T
    pending entries per row and lane, filled in at call time like k, so variant names do not change. A
    variant's own "queue" wins; else the fitted table tables/topk_queue/knn.json (same-run A/B,
    bench/topk_queue_ab.py: it pays at k = 32 and at k = 16 for some kernels, loses at k = 10) at the
    largest listed k <= k; 0 (insertion on the spot) for what it does not list."""
    if k <= 1:
        return 0
    if "queue" in p:
        return int(p["queue"])
    by_k = _queue_table().get(knn_queue_key(p), {})
    ks = [int(x) for x in by_k if int(x) <= k]
    return int(by_k[str(max(ks))]) if ks else 0


def knn_queue_fitted(p: dict) -> bool:
    """The queue table has an entry for this variant (else `knn_queue` runs it at T = 0 at every k)."""
    return knn_queue_key(p) in _queue_table()


def knn_queue_key(p: dict) -> str:
    """A variant's name in the queue table: the scan's lists are the same with a merge kernel or wgmma norms
    reduced per tile, so those forms share the entry of the base variant (last-CTA merge, the default
    norms) and A/B rows of any of them fit it (bench/topk_queue_ab.py --fit). A sampled bound (`_sd{F}`)
    keeps its own entry: with the bound tight from the first tile far fewer scores pass, and the queue that
    pays on the unseeded scan loses there (T = 2 at k = 16 1.07-1.57x unseeded, 0.89-1.0x on most seeded
    picks). The insertion's form (`rolled`) shares it too: the rolled A/B keyed the rolled arm
    apart (`_rl`), so it ran T = 0 where the table fits T = 2 for the unrolled one."""
    one_kernel_form = {"merge": "wide"} if p.get("merge") in ("kernel", "rows", "tail") else {}
    base = {**p, **one_kernel_form}   # (names carry no queue)
    base.pop("rolled", None)
    if p.get("mma", "sync") == "wgmma":
        base.pop("norms", None)
    return knn_name(base)


def knn_split_options(p: dict, shape: dict) -> dict:
    """A split variant's per-call options from tables/split_options/knn.json (fitted by bench/topk_queue_ab.py
    --fit-merge from a same-run A/B): the merge kernel instead of the last-CTA merge for the k classes it
    lists (0.78x the time at k > 1 over 26 split picks, neutral at k = 1), and the sampled
    bound for its family at M >= min_M (0.91x of the merge kernel alone over the wgmma picks; slower on
    the few-query streams, whose chunks are short); then, for a few-query stream pick (ws > 1, unseeded), a
    one-launch merge where the table fits a box of Q and k for it (`max_Q`, `max_k`; bench/topk_queue_ab.py
    --fit-merge-form): the tile's last CTAs, a warp per row, in place of the merge kernel it was timed against
    (`tail`, merge_tail: 0.93-1.00x the merge kernel's time at 29 few-query shapes with k <= 16 on an H100,
    1.11-1.43x at k = 32, topk-merge-tail-ab2-h100.json), else the last-CTA merge over the real query rows
    (`rows`, merge_rows; the committed table has no box for it: 1.02-1.35x the merge kernel's time on an H100,
    topk-merge-rows-ab-h100.json). Unsplit variants and explicit options are kept."""
    if p.get("split", 1) <= 1 or p.get("merge") != "wide":
        return p
    opts = _split_table()
    k, out = shape["k"], dict(p)
    if ("k1" if k == 1 else "k>1") in opts.get("merge_kernel_k", []):
        out["merge"] = "kernel"
        sd = opts.get("seed")
        if sd and "seed" not in p and k >= sd["min_k"] and shape["M"] >= sd["min_M"] \
                and p.get("mma", "sync") == sd["mma"]:
            out["seed"] = sd["F"]
    for form in ("tail", "rows"):   # a one-launch merge where its fitted Q range holds (the tail first)
        rng = opts.get(f"merge_{form}")
        if rng and p.get("ws", 1) > 1 and not out.get("seed") and (form != "tail" or out.get("merge") == "kernel") \
                and shape["Q"] <= rng["max_Q"] and k <= rng.get("max_k", KNN_K_MAX_SPLIT) \
                and knn_supports({**out, "merge": form}, shape):
            out["merge"] = form
            break
    return out


def knn_wgmma_norms(p: dict, shape: dict) -> dict:
    """A wgmma pick's database norms per call: reduced per staged tile ("tile") where the search is bound by
    the database's bytes (KNN_WGMMA_TILE_NORMS: at most q_max queries, k <= k_max; the norms kernel's read
    is then a large share of them), else the variant's own (KNN_WGMMA_NORMS by default)."""
    lim = KNN_WGMMA_TILE_NORMS
    if p.get("mma") != "wgmma" or "norms" in p or shape["k"] > lim["k_max"] or shape["Q"] > lim["q_max"]:
        return p
    return {**p, "norms": "tile"}


def knn_per_call(p: dict, shape: dict) -> dict:
    """kNN's per-call form of a table pick (runtime.per_call_form): the split options, then the norms."""
    return knn_wgmma_norms(knn_split_options(p, shape), shape)


@lru_cache(maxsize=1)
def _split_table() -> dict:
    from pathlib import Path
    path = Path(__file__).resolve().parent / "tables" / "split_options" / "knn.json"
    return json.loads(path.read_text()) if path.exists() else {}


@lru_cache(maxsize=1)
def _queue_table() -> dict:
    from pathlib import Path
    path = Path(__file__).resolve().parent / "tables" / "topk_queue" / "knn.json"
    return json.loads(path.read_text())["queues"] if path.exists() else {}


def knn_name(p: dict) -> str:
    """`norms: "global"` (database norms computed once by a first kernel; l2 only, ip ignores it) adds `_gn`
    (wgmma: norms other than KNN_WGMMA_NORMS add `_gn` / `_tn`, "tile" the norms reduced per staged tile),
    `minb` (CTAs per SM the registers must allow) `_b{minb}`, `merge: "wide"` (the split path's last-CTA
    merge by all threads, several lists in flight) `_mw`, `merge: "kernel"` (a merge kernel of its own after
    the search, a warp per query) `_mk`, `merge: "rows"` (the last-CTA merge with its threads spread over the
    tile's real query rows, a tree per row) `_mr`, `merge: "tail"` (the merge kernel's warp per query run by
    the tile's last CTAs after all its CTAs arrive, `arrive_wait`: one launch) `_mt`, `qfrag: "smem"` (query
    fragments re-read per k step) `_qs`, `wm` (query rows per warp) `_w{wm}`, `ws` (warps per CTA streaming their own
    database chunks) `_ws{ws}`, `seed` (a sampling kernel of every seed-th database tile first leaves each
    query's bound of its k-th best; k > 1) `_sd{seed}`, `rolled: False` (an unrolled insertion per column,
    `_ur`; the builders' default is the rolled loop, `topk` rolled: 1.0-2.3x less time at the
    table's picks, bench/results/topk-rolled-ab-h200.json); the names of the variants without them are unchanged
    (committed tables refer to them)."""
    if p.get("mma") == "wgmma":    # (the names mark a wgmma variant's norms only where they are not the default)
        gn = {"global": "_gn", "tile": "_tn"}[p["norms"]] if p.get("norms", KNN_WGMMA_NORMS) != KNN_WGMMA_NORMS else ""
    else:
        gn = "_gn" if p.get("norms", "tile") == "global" else ""
    gn += f"_b{p['minb']}" if p.get("minb", 1) != 1 else ""
    gn += {"wide": "_mw", "kernel": "_mk", "rows": "_mr", "tail": "_mt"}.get(p.get("merge", "serial"), "") \
        if p["split"] > 1 else ""
    gn += "_qs" if p.get("qfrag", "reg") == "smem" else ""
    gn += f"_w{p['wm']}" if p.get("wm", 16) != 16 else ""
    gn += f"_ws{p['ws']}" if p.get("ws", 1) != 1 else ""
    gn += "_wg" if p.get("mma", "sync") == "wgmma" else ""
    gn += "_ov" if p.get("overlap") else ""
    gn += f"_sd{p['seed']}" if p.get("seed", 0) else ""
    gn += "_ur" if "rolled" in p and not p["rolled"] else ""
    gn += f"_dk{p['dk']}" if "dk" in p else ""    # (the any-D family; dk 0: the whole row per tile)
    return f"knn_bq{p['bq']}_bn{p['bn']}_s{p['split']}_p{p.get('stages', 2)}{gn}"


def knn_supports(p: dict, shape: dict) -> bool:
    """shape: Q, M, k, D (and optional metric; arch: the GPU's, for the sm_90a-only wgmma variants, which
    a shape without it is taken to allow: the sweep's and the table's own checks)."""
    from tasks.knn.programs import WS_ROWS, WS_TILES, tail_waiters
    Q, M, k, D = shape["Q"], shape["M"], shape["k"], shape.get("D", 128)
    if "dk" in p:
        return knn_dk_supports(p, shape)
    if D not in KNN_D or k < 1 or M < k or Q < 1:
        return False
    if p.get("mma", "sync") == "wgmma" and (shape.get("arch", "sm_90a") != "sm_90a" or p["bq"] % 64
                                            or (p["split"] > 1 and p["split"] % 2)
                                            or (p.get("overlap") and p.get("stages", 2) < 3)):
        return False
    if p["bq"] % p.get("wm", 16) or not knn_registers_fit(p, k, D):   # E-RES-05 (e.g. bn 128 at k = 32)
        return False
    if p.get("minb", 1) > 1 and k > KNN_CAPPED_K_MAX:
        return False
    if p["split"] == 1:   # (seeded: the bounds TH hold a word per padded query row)
        return k <= KNN_K_MAX and (not p.get("seed", 0) or ceil(Q / p["bq"]) * p["bq"] <= WS_ROWS)
    tiles = ceil(Q / p["bq"])
    if p.get("merge") == "wide" and p["split"] % (32 * p.get("ws", 1) // p.get("wm", 16)):
        return False                        # the wide merge's thread groups share the lists evenly
    if p.get("merge") in ("rows", "tail") and (p.get("mma", "sync") == "wgmma" or p.get("seed", 0)
                                     or not _verifier_fits(json.dumps(p, sort_keys=True), k, D,
                                                           shape.get("arch", "sm_90a"))):
        return False                        # (mma.sync builds, unseeded; their smem lists [threads, k] must fit)
    if p.get("merge") == "tail" and p["split"] < tail_waiters(p["bq"], p.get("wm", 16), p.get("ws", 1)):
        return False                        # (a warp per query row: cdiv(BQ, warps) waiting CTAs of the split)
    return k <= KNN_K_MAX_SPLIT and tiles <= WS_TILES and tiles * p["bq"] * p["split"] <= WS_ROWS


def knn_dk_supports(p: dict, shape: dict) -> bool:
    """An any-D variant: any even D in [2, KNN_D_MAX], k <= KNN_DK_K_MAX, the split path's workspace bounds, and
    its smem and registers within the verifier's limits at this k, D and arch (built and verified once per
    variant, k, D and arch); the wgmma ones on sm_90a, the mma.sync ones (dk 0, the query fragments from smem,
    one warp tile per 16 queries) on any arch."""
    from tasks.knn.programs import WS_ROWS, WS_TILES
    Q, M, k, D = shape["Q"], shape["M"], shape["k"], shape.get("D", 128)
    arch = shape.get("arch", "sm_90a")
    if p.get("mma", "sync") == "wgmma":
        if arch != "sm_90a" or p["bq"] % 64 or p.get("overlap"):
            return False
    elif p["dk"] or p.get("qfrag") != "smem" or p.get("ws", 1) != 1 or p.get("wm", 16) != 16 or p["bq"] % 16 \
            or p.get("seed", 0) or (p["split"] > 1 and p.get("merge") != "kernel"):
        return False
    if not (2 <= D <= KNN_D_MAX and D % 2 == 0 and 1 <= k <= KNN_DK_K_MAX and M >= k and Q >= 1):
        return False
    tiles = ceil(Q / p["bq"])
    if p["split"] > 1 and (p["split"] % 2 or tiles > WS_TILES or tiles * p["bq"] * p["split"] > WS_ROWS):
        return False
    return _verifier_fits(json.dumps(p, sort_keys=True), k, D, arch)


@lru_cache(maxsize=None)
def _verifier_fits(params: str, k: int, d: int, arch: str) -> bool:
    """The variant's kernels at (k, d) verify with no resource error (E-RES-*: smem per block, registers)."""
    from cake_ir.verifier import verify
    try:
        ir = knn_kernel(json.loads(params), k, "l2", d, arch)
    except ValueError:   # a variant the builder refuses (e.g. stages < 3 with a chunked D)
        return False
    return not any(x.code.startswith("E-RES") for x in verify(ir).diagnostics)


def knn_dk_pick(shape: dict) -> dict:
    """The any-D variant for a shape with D outside KNN_D: knn_dk_pick_wgmma on sm_90a, else
    knn_dk_pick_sync. Returns {} when no variant holds the shape."""
    return dict(_dk_pick(tuple(sorted(shape.items()))))


@lru_cache(maxsize=4096)
def _dk_pick(items: tuple) -> tuple:
    shape = dict(items)
    p = knn_dk_pick_wgmma(shape) if shape.get("arch", "sm_90a") == "sm_90a" else knn_dk_pick_sync(shape)
    return tuple(sorted(p.items()))


def _dk_split(tiles: int, M: int, bn: int, sms: int) -> int:
    """Database splits (a power of 2 up to 128, each split at least 4 tiles of bn rows) for CTAs that fill whole
    waves of `sms` (the any-D searches hold most of an SM's smem: one CTA per SM): the fewest splits whose
    last wave is >= 85% full (fewer partial lists to merge), else the fullest waves."""
    best, best_eff, s = 1, 0.0, 1
    while s <= 128 and (s == 1 or M >= s * 4 * bn):
        ctas = tiles * s
        eff = ctas / (ceil(ctas / sms) * sms)
        if eff >= 0.85:
            return s
        if eff > best_eff:
            best, best_eff = s, eff
        s *= 2
    return best


def knn_dk_pick_sync(shape: dict) -> dict:
    """The mma.sync any-D variant (a rule, unmeasured: the query fragments re-read from smem per k step, BQ 64
    down to 16 and BN 64 / 32 as the whole staged rows fit the arch's smem, 3 / 2 stages, the database split
    over an A100's 108 SMs in whole waves (`_dk_split`), the merge kernel after)."""
    Q, M = shape["Q"], shape["M"]
    for bq in ((64, 32, 16) if Q > 16 else (16,)):
        for bn in (64, 32):
            split = _dk_split(ceil(Q / bq), M, bn, 108)
            for stages in (3, 2):
                p = {"bq": bq, "bn": bn, "split": split, "stages": stages, "qfrag": "smem", "norms": "global", "dk": 0}
                if split > 1:
                    p["merge"] = "kernel"
                if knn_supports(p, shape):
                    return p
    return {}


def knn_dk_pick_wgmma(shape: dict) -> dict:
    """The D-chunked wgmma variant (a rule, not a fitted table: tile the queries by
    128 where the resident query tile leaves the ring room, else 64; BN 128 up to k = 16, 64 above (the lists'
    registers); dk 128 where it pads D no further than 64 would; split the database to fill
    the H200's 132 SMs in whole waves (`_dk_split`), the merge kernel after;
    the database norms reduced from the staged chunks (norms "tile") at up to KNN_DK_TILE_NORM_TILES query
    tiles, where the norms kernel's extra read of the database would cost as much as the search's own).
    Returns {} when no variant holds the shape."""
    Q, M, k, D = shape["Q"], shape["M"], shape["k"], shape.get("D", 128)
    from tasks.knn.wgmma import padded_d
    bn = 128 if k <= 16 else 64
    dks = (128, 64) if padded_d(D, 128) == padded_d(D, 64) else (64, 128)
    for bq in ((128, 64) if Q > 64 else (64,)):
        tiles = ceil(Q / bq)
        split = _dk_split(tiles, M, bn, 132)
        for dk in dks:
            for stages in (4, 3):
                p = {"mma": "wgmma", "bq": bq, "bn": bn, "split": split, "stages": stages, "dk": dk}
                if tiles <= KNN_DK_TILE_NORM_TILES:
                    p["norms"] = "tile"
                if split > 1:
                    p["merge"] = "kernel"
                if knn_supports(p, shape):
                    return p
    return {}


def knn_large_k_supports(shape: dict) -> bool:
    """The large-k path's domain (cakelib/knn_large_k.py): 1 <= k <= min(1024, M), 1 <= D <= 1024, M up to
    KNN_LARGE_M_MAX; any Q, either metric, any arch the kernels compile for (mma.sync: sm_80+)."""
    Q, M, k, D = shape["Q"], shape["M"], shape["k"], shape.get("D", 128)
    return Q >= 1 and 1 <= k <= min(KNN_LARGE_K_MAX, M) and 1 <= D <= KNN_LARGE_D_MAX and M <= KNN_LARGE_M_MAX


def knn_registers_fit(p: dict, k: int, d: int) -> bool:
    """The search kernel's register tiles fit the verifier's E-RES-05 budget: at once when even their sum
    does (`knn_tile_registers`), else as the verifier decides from their live ranges (the kernel is
    built and verified once per variant, k and D: ~0.05-0.2 s)."""
    return knn_tile_registers(p, k, d) <= 255 or _verifier_registers_fit(json.dumps(p, sort_keys=True), k, d)


@lru_cache(maxsize=None)
def _verifier_registers_fit(params: str, k: int, d: int) -> bool:
    from cake_ir.verifier import verify
    try:
        ir = knn_kernel(json.loads(params), k, "l2", d, "sm_90a")   # l2 holds the most tiles (norms)
    except Exception:  # noqa: BLE001 - a variant the builder refuses does not fit either
        return False
    return not any(x.code == "E-RES-05" for x in verify(ir).diagnostics)


def knn_tile_registers(p: dict, k: int, d: int) -> int:
    """Registers per thread in the search kernel's register tiles, all of them at once (accumulator, B
    fragments, query fragments, the two mma_rows lists, the split merge's lists, ~16 overhead; the wide
    merge sizes its extra lists in flight to the budget): an upper bound of the verifier's E-RES-05 count,
    which counts live ranges. Kept by hand so that the dispatcher decides most variants without building
    kernels (`knn_registers_fit`); tests/test_knn_fast.py checks the two agree over every sweep variant."""
    bn, wm = p["bn"], p.get("wm", 16)
    # the merge's lists (the wide merge: at least as many; a merge kernel: only the stream's CTA merge)
    merge = 4 * k if p["split"] > 1 and (p.get("merge") != "kernel" or p.get("ws", 1) > 1) else 0
    q = knn_queue(p, k)                       # the deferred insertion's queue, beside the lists
    from tasks.knn.programs import shares_bound
    sb = shares_bound(k, p["split"], p.get("ws", 1), p.get("share", True))   # the bound cache and the reset's word
    sb_regs = (3 if sb else 0) + (2 if k > 1 and p.get("seed", 0) else 0)     # (seed: the sample's bound)
    if p.get("mma", "sync") == "wgmma":      # a [64, BN] accumulator per warpgroup (two: overlap), no fragments
        return (2 if p.get("overlap") else 1) * bn // 2 + 4 * (k + q) + merge + 16 + sb_regs
    fa = wm * d // 64 if p.get("qfrag", "reg") == "reg" else wm // 4
    return wm * bn // 32 + bn // 4 + fa + wm * (k + q) // 4 + merge + 16 + (wm // 8 + 1 if sb else 0) \
        + (wm // 8 if k > 1 and p.get("seed", 0) else 0)


def knn_kernel(p: dict, k: int, metric: str, d: int, arch: str):
    from tasks.knn.programs import knn_fused
    if p.get("mma", "sync") == "wgmma":
        from tasks.knn.wgmma import knn_wgmma
        return knn_wgmma(metric=metric, k=k, d=d, bq=p["bq"], bn=p["bn"], split=p["split"],
                         stages=p.get("stages", 2), minb=p.get("minb", 1), overlap=p.get("overlap", False),
                         merge=p.get("merge", "wide"),
                         queue=knn_queue(p, k), share=p.get("share", True), skip_pad=p.get("skip_pad", True),
                         seed=p.get("seed", 0), norms=p.get("norms", KNN_WGMMA_NORMS), dk=p.get("dk", 0),
                         arch=arch, **_rolled(p))
    return knn_fused(metric=metric, k=k, d=d, bq=p["bq"], bn=p["bn"], split=p["split"], stages=p.get("stages", 2),
                     arch=arch, norms=p.get("norms", "tile"), minb=p.get("minb", 1),
                     merge=p.get("merge", "serial"), qfrag=p.get("qfrag", "reg"),
                     wm=p.get("wm", 16), ws=p.get("ws", 1), queue=knn_queue(p, k), share=p.get("share", True),
                     skip_pad=p.get("skip_pad", True), seed=p.get("seed", 0), **_rolled(p))


def _rolled(p: dict) -> dict:
    """The variant's `rolled` where it sets one; else the builders' own default (rolled)."""
    return {"rolled": bool(p["rolled"])} if "rolled" in p else {}


# ---------------------------------------------------------------- kmeans (tasks/kmeans/programs.py)
KMEANS_D = 128             # the finishing pass is written for D = 128
# kind "resident": centroids stay in shared memory (kmeans_resident); "fused": the seed that streams
# centroid tiles per point tile (kmeans_fused). kmax = 256 resident needs Hopper's 227 KB of smem.
KMEANS_FALLBACK = {"kind": "resident", "kmax": 256, "bm": 32, "bn": 64, "ctas": 132, "big": 16, "cas_batch": 8,
                   "private": False}


# kind "wide" (tasks/kmeans/wide.py): norms + streamed-chunk assignment with a global scatter of the sums +
# finalize, for every K <= KMEANS_WIDE_K_MAX and D in KMEANS_WIDE_D (a multiple of 32); the fitted table's
# fused kernels keep D = 128, K <= KMEANS_TABLE_K_MAX (kmeans_family)
KMEANS_WIDE_D = (32, 1024)
KMEANS_WIDE_K_MAX = 65536
KMEANS_TABLE_K_MAX = 256
KMEANS_STREAMED_D = 768   # from this D the wgmma rule streams the points too, by TMA (kmeans_wide_params)
KMEANS_ADDS_PER_COPY = 512   # points per cluster row of one copy of the sums (kmeans_wide_copies) ...
KMEANS_COPIES_FROM = 4096    # ... from this many points per cluster on
KMEANS_PAIRED_MAX_D = 128    # up to this D and ...
KMEANS_PAIRED_MAX_K = 2048   # ... this K the wgmma rule runs two CTAs of 128 points per SM (kmeans_wide_params)
KMEANS_PP4_D = (64, 128)          # D in this range and ...
KMEANS_PP4_MIN_K = 1024           # ... K from this: the ping-pong form of four warpgroups (kmeans_wide_params);
KMEANS_PP2_D = (129, 256)         # D in this range and ...
KMEANS_PP2_MIN_K = 2048           # ... K from this: the ping-pong form of two


def kmeans_family(shape: dict) -> str:
    """"table" (the fitted fused kernels) where D = 128 and K <= 256, else "wide"."""
    return "table" if shape.get("D", 128) == KMEANS_D and shape["K"] <= KMEANS_TABLE_K_MAX else "wide"


def kmeans_wide_domain_error(shape: dict) -> str:
    """Why the wide family cannot run `shape` ("" where it can)."""
    D, K, N = shape.get("D", 128), shape["K"], shape["N"]
    lo, hi = KMEANS_WIDE_D
    if not lo <= D <= hi or D % 32:
        return f"D = {D} is outside what the library supports (D a multiple of 32 in [{lo}, {hi}])"
    if not 1 <= K <= KMEANS_WIDE_K_MAX:
        return f"k = {K} is outside what the library supports (1 <= k <= {KMEANS_WIDE_K_MAX})"
    if K > N:
        return f"k = {K} exceeds the number of points N = {N}"
    return ""


def kmeans_wide_params(shape: dict, mma: str = "", pingpong: bool = True, batched_scatter: bool = True,
                       sorted_sums: bool = True) -> dict:
    """The wide family's rule. mma "wgmma" (the default on sm_90a): below D = 768 the resident form, a point
    tile holding all of D (the largest of 256 / 128 / 64 rows whose shared memory fits) with centroid tiles of
    128 streamed past it through a 4-stage ring of 64-dim swizzle atoms; from D = 768 the warp-specialized TMA
    form (tasks/kmeans/wide_tma.py: 128 points by 256 centroids, both streamed as atoms by a TMA producer
    through a 4-stage mbarrier ring), since a resident tile of all of D leaves room for only 64 rows (at
    D = 256 / 512 the resident form stays ahead of it: 18.6 vs 19.9 ms, 19.0 vs 20.1); both scatter the sums
    with 4-float vector reds (red.global.add.v4.f32); the TMA form re-reads its points from global memory for
    the scatter, in slices of up to 8 groups of reds per lane whose loads go out together (`batched_scatter`,
    `sb`: one L2 round trip per 128 dims of a row pair instead of per 16; H100, same run: 37.3 vs 41.3 ms at
    N = 1M, D = 768, K = 1024, bench/results/kmeans-wide-h100.json); and there (`sorted_sums`) the TMA form only
    counts the points and the sums come from a counting sort of the assignments (`sums: "sorted"`,
    tasks/kmeans/sorted_sums.py: X read once more in cluster order, each cluster's run added once; H100, same
    run: 41.7 vs 50.2 ms at N = 1M, D = 1024, K = 1024, 33.6 vs 37.5 at D = 768, even at D = 1024, K = 16384;
    bench/results/kmeans-sorted-sweep-h100.json; below D = 768 slower than the rule's forms at 11 of 12 shapes,
    even at D = 512, kmeans-sorted-sweep-small-d-h100.json).
    "sync" (elsewhere): tiles of 64, a 3-stage ring of D chunks
    (tasks/kmeans/wide.chunk_of), largest point tile of 128 / 64 / 32, scalar reds. The forms side by side on
    the H200: bench/kmeans_wide_sweep.py, docs/perf-log.md. Up to D = 128 and K = 2048 the resident form runs
    two CTAs of 128 points per SM (minb 2), so one CTA's point load, argmin and scatter run under the other's
    wgmma (H100: 6.75 vs 7.52 ms at N = 1M, D = 128, K = 1024; 1.98 vs 2.42 at D = 64, K = 256); from K = 4096
    the doubled centroid reads from L2 cost as much as that buys (25.5 vs 25.4 ms at D = 128, K = 4096). For D in
    KMEANS_PP4_D from K = KMEANS_PP4_MIN_K, and in KMEANS_PP2_D from K = KMEANS_PP2_MIN_K (`pingpong`), the ping-pong
    form (tasks/kmeans/wide_pingpong.py: consumer warpgroups taking turns on the tensor cores, one's argmin under
    the others' chains): four of 64 points by 128 centroids up to D = 128, else two, 256 x 128 where the ring
    then holds two tiles at 8 stages, else 128 x 128 (H100, same runs: 21.4 vs 23.1-24.7 ms at N = 1M, D = 128,
    K = 4096; 6.3 vs 6.7 at K = 1024; 16.5-16.7 vs 18.7 at N = 500K, D = 256, K = 4096;
    bench/results/kmeans-wide-pp-sweep-h100.json)."""
    from tasks.kmeans.wide import ATOM, SMEM_BYTES, assign_smem_bytes, chunk_of
    D, arch = shape.get("D", 128), shape.get("arch", "sm_90a")
    mma = mma or ("wgmma" if arch == "sm_90a" else "sync")
    copies = kmeans_wide_copies(shape)
    if mma == "wgmma" and D >= KMEANS_STREAMED_D:
        if sorted_sums:
            return {"kind": "wide", "mma": mma, "points": "tma", "bm": 128, "bn": 256, "dc": ATOM, "stages": 4,
                    "red": 4, "copies": 1, "sums": "sorted"}
        sb = next(b for b in (8, 4, 2, 1) if D % (16 * b) == 0) if batched_scatter else 1
        return {"kind": "wide", "mma": mma, "points": "tma", "bm": 128, "bn": 256, "dc": ATOM, "stages": 4,
                "red": 4, "copies": copies, **({"sb": sb} if sb > 1 else {})}
    if pingpong and mma == "wgmma":
        pp = _kmeans_pingpong_params(D, shape.get("K", 1024), copies)
        if pp:
            return pp
    if mma == "wgmma" and D <= KMEANS_PAIRED_MAX_D and shape.get("K", 1024) <= KMEANS_PAIRED_MAX_K:
        return {"kind": "wide", "mma": mma, "bm": 128, "bn": 128, "dc": ATOM, "stages": 4, "minb": 2, "red": 4,
                "copies": copies}
    if mma == "wgmma":
        dc, bn, stages, tiles = ATOM, 128, 4, (256, 128, 64)
    else:
        dc, bn, stages, tiles = chunk_of(D), 64, 3, (128, 64, 32)
    cap = SMEM_BYTES.get(arch, SMEM_BYTES["sm_80"])
    bm = next((m for m in tiles if assign_smem_bytes(D, m, bn, dc, stages, mma) <= cap), tiles[-1])
    p = {"kind": "wide", "mma": mma, "bm": bm, "bn": bn, "dc": dc, "stages": stages, "copies": copies}
    return {**p, "red": 4} if mma == "wgmma" else p


def _kmeans_pingpong_params(D: int, K: int, copies: int) -> dict:
    """The ping-pong form the rule takes at (D, K), {} where none: at 8 ring stages, four warpgroups of 64
    points in KMEANS_PP4_D from K = KMEANS_PP4_MIN_K; two in KMEANS_PP2_D from K = KMEANS_PP2_MIN_K, of 128
    points where the ring then holds two tiles' atoms beside the resident points, else of 64."""
    from tasks.kmeans.wide import ATOM, SMEM_BYTES
    from tasks.kmeans.wide_pingpong import pingpong_smem_bytes
    base = {"kind": "wide", "mma": "wgmma", "points": "pingpong", "bn": 128, "dc": ATOM, "stages": 8, "red": 4,
            "copies": copies}
    if KMEANS_PP4_D[0] <= D <= KMEANS_PP4_D[1] and K >= KMEANS_PP4_MIN_K:
        return {**base, "bm": 256, "wgs": 4}
    if not (KMEANS_PP2_D[0] <= D <= KMEANS_PP2_D[1] and K >= KMEANS_PP2_MIN_K):
        return {}
    two_tiles = 8 >= 2 * -(-D // ATOM) and pingpong_smem_bytes(D, 128, 128, 8) <= SMEM_BYTES["sm_90a"]
    return {**base, "bm": 256 if two_tiles else 128, "wgs": 2}


def kmeans_wide_copies(shape: dict) -> int:
    """Copies of the sums (tasks/kmeans/wide.sums_row). Same-address reds serialize in L2: from
    KMEANS_COPIES_FROM points per cluster (N / K) enough copies that a copy's row takes about
    KMEANS_ADDS_PER_COPY points, at most 8; below it one. Measured on the H200 (10 iterations): N = 1M, D = 64,
    K = 256 took 4.64 ms with one copy, 2.36 with 8; at N / K = 2048 and 1024, 4 and 2 copies were within 1%
    of one (bench/results/kmeans-wide-h200.json, cakelib-p1)."""
    per = shape["N"] / max(1, shape["K"])
    if per < KMEANS_COPIES_FROM:
        return 1
    return next((c for c in (1, 2, 4) if c * KMEANS_ADDS_PER_COPY >= per), 8)


def kmeans_wide_supports(p: dict, shape: dict) -> bool:
    from tasks.kmeans.wide import SMEM_BYTES, assign_smem_bytes
    D, arch, mma = shape.get("D", 128), shape.get("arch", "sm_90a"), p.get("mma", "sync")
    if kmeans_wide_domain_error(shape) or shape["B"] < 1 or (mma == "wgmma" and arch != "sm_90a"):
        return False
    if p.get("copies", 1) not in (1, 2, 4, 8) or (p.get("lv") and p.get("red", 1) != 4):
        return False
    if p.get("sb", 1) > 1 and p.get("points") != "tma":       # batched scatter slices: the TMA form's option
        return False
    if p.get("sums", "reds") not in ("reds", "sorted"):
        return False
    if p.get("sums") == "sorted" and (p.get("copies", 1) != 1 or mma != "wgmma" or p.get("pt", 1) > 1
                                      or p.get("points") not in (None, "tma")):
        return False   # the counting sort's sums: one copy of the counts, the resident or TMA wgmma forms
    if p.get("acc2") and (mma != "wgmma" or p.get("points") or p["stages"] < 3
                          or p["bn"] + 4 + 16 > min(255, 65536 // (2 * p["bm"] * p.get("minb", 1)))):
        # the resident wgmma form; two [64, bn] accumulators (bn registers a thread), bv / bi (4) and E-RES-05's
        # 16 of overhead within the thread's share of the SM's 64K registers
        return False
    if p.get("points") == "streamed":
        from tasks.kmeans.wide_streamed import streamed_smem_bytes
        return (mma == "wgmma" and p["bm"] in (64, 128) and p["stages"] >= 3 and p.get("red", 1) in (1, 2, 4)
                and p.get("minb", 1) * streamed_smem_bytes(p["bm"], p["bn"], p["stages"]) <= SMEM_BYTES["sm_90a"])
    if p.get("points") == "pingpong":
        from tasks.kmeans.wide_pingpong import PP_D_MAX, WGS, consumer_regs, consumer_regs_needed, pingpong_smem_bytes
        wgs = p.get("wgs", 2)
        wr = p["bm"] // wgs
        return (mma == "wgmma" and D <= PP_D_MAX and wgs in WGS and wr in (64, 128) and p["bm"] == wgs * wr
                and consumer_regs_needed(D, wr, p["bn"], p.get("a_regs", False)) <= consumer_regs(wgs)
                and -(-D // 64) <= p["stages"] <= 16 and p.get("red", 1) in (1, 2, 4) and p.get("pt", 1) in (1, 2, 4, 8)
                and p.get("handoff", "issued") in ("issued", "first", "before")
                and pingpong_smem_bytes(D, wr, p["bn"], p["stages"], wgs) <= SMEM_BYTES["sm_90a"])
    if p.get("points") == "tma":
        from tasks.kmeans.wide_tma import TMA_D_MIN, tma_smem_bytes
        return (mma == "wgmma" and D >= TMA_D_MIN and p["bm"] in (64, 128) and 2 <= p["stages"] <= 8
                and p.get("red", 1) in (1, 2, 4) and p.get("cluster", 1) in (1, 2) and p.get("pt", 1) in (1, 2, 4, 8)
                and (p.get("cluster", 1) == 1 or p.get("pt", 1) == 1)
                and (p.get("sb", 1) == 1 or (p.get("sb") in (2, 4, 8) and p.get("red") == 4 and D % (16 * p["sb"]) == 0))
                and tma_smem_bytes(p["bm"], p["bn"], p["stages"], p.get("pt", 1)) <= SMEM_BYTES["sm_90a"])
    if p.get("red", 1) not in (1, 2, 4) or (p.get("red", 1) > 1 and arch != "sm_90a"):
        return False
    if mma == "sync" and D % p["dc"]:
        return False
    cap = SMEM_BYTES.get(arch, SMEM_BYTES["sm_80"])
    return p.get("minb", 1) * assign_smem_bytes(D, p["bm"], p["bn"], p["dc"], p["stages"], mma) <= cap


def kmeans_wide_kernels(p: dict, d: int, arch: str) -> dict:
    """The wide family's three kernels at D = d: norms, assignment + scatter (mma.sync, wgmma, streamed or TMA),
    finalize (summing the variant's copies of the sums)."""
    from tasks.kmeans import sorted_sums as ss
    from tasks.kmeans import wide
    red, copies, lv = p.get("red", 1), p.get("copies", 1), p.get("lv", False)
    by_sort = p.get("sums") == "sorted"
    if p.get("points") == "streamed":
        from tasks.kmeans.wide_streamed import kmeans_wide_assign_streamed

        def assign():
            return kmeans_wide_assign_streamed(d, bm=p["bm"], bn=p["bn"], stages=p["stages"], red=red,
                                               minb=p.get("minb", 1), arch=arch, copies=copies, lv=lv)
    elif p.get("points") == "pingpong":
        from tasks.kmeans.wide_pingpong import kmeans_wide_assign_pingpong

        def assign():
            wgs = p.get("wgs", 2)
            return kmeans_wide_assign_pingpong(d, wr=p["bm"] // wgs, bn=p["bn"], stages=p["stages"], red=red, arch=arch,
                                               copies=copies, lv=lv, wgs=wgs, pt=p.get("pt", 1),
                                               handoff=p.get("handoff", "issued"), a_regs=p.get("a_regs", False))
    elif p.get("points") == "tma":
        from tasks.kmeans.wide_tma import kmeans_wide_assign_tma

        def assign():
            return kmeans_wide_assign_tma(d, bm=p["bm"], bn=p["bn"], stages=p["stages"], red=red, arch=arch,
                                          copies=copies, lv=lv, cluster=p.get("cluster", 1), pt=p.get("pt", 1),
                                          sb=p.get("sb", 1), sorted_sums=by_sort)
    elif p.get("mma", "sync") == "wgmma":
        def assign():
            return wide.kmeans_wide_assign_wgmma(d, bm=p["bm"], bn=p["bn"], stages=p["stages"], minb=p.get("minb", 1),
                                                 arch=arch, red=red, copies=copies, lv=lv, acc2=p.get("acc2", False),
                                                 sorted_sums=by_sort)
    else:
        def assign():
            return wide.kmeans_wide_assign(d, bm=p["bm"], bn=p["bn"], dc=p["dc"], stages=p["stages"], arch=arch,
                                           red=red, copies=copies, lv=lv)
    parts = {"norms": lambda: wide.kmeans_wide_norms(d, arch=arch), "assign": assign}
    if by_sort:     # between the assignment and the finalize, in this order
        parts.update(offsets=lambda: ss.kmeans_sums_offsets(arch), place=lambda: ss.kmeans_sums_place(arch),
                     runs=lambda: ss.kmeans_sums_runs(d, arch))
    return {**parts, "finalize": lambda: wide.kmeans_wide_finalize(d, arch=arch, copies=copies)}


def kmeans_name(p: dict) -> str:
    """Wide family: `kmeans_wide_bm.._bn.._c.._s..`, then `_wg` (wgmma), `_st` (`points: "streamed"`,
    tasks/kmeans/wide_streamed.py), `_tma` (`points: "tma"`, tasks/kmeans/wide_tma.py; `_cl2`: `cluster` 2, CTA
    pairs sharing the centroid atoms by multicast; `_t{pt}`: `pt` point tiles a CTA, each tile's scatter by the
    producer warpgroup under the next tile's chains; `_sb{sb}`: `sb` groups of reds per lane in a scatter slice,
    their point loads issued together) or `_pp` (`points: "pingpong"`,
    tasks/kmeans/wide_pingpong.py: `wgs` consumer warpgroups (2 by default; `_pp{wgs}` otherwise) of bm / wgs
    points; `_t{pt}`: `pt` point tiles a CTA; `_hf` / `_hb`: `handoff` "first" / "before"; `_ra`: `a_regs`, the
    points as wgmma A fragments in registers), `_b{minb}`, `_r{red}`
    (vector reds of `red` floats), `_p{copies}` (copies of the sums, tasks/kmeans/wide.sums_row), `_lv` (`lv`: the
    scatter reads its points 4 halves per load), `_a2` (`acc2`: two distance accumulators, a tile's argmin under
    the next tile's wgmma), `_ss` (`sums: "sorted"`: the sums by a counting sort of the assignments,
    tasks/kmeans/sorted_sums.py, instead of a red per point and dim). Table family:
    `update: "mma"` (the tensor-core update, tasks/kmeans/programs.py `_update_mma`, `urows` clusters per
    accumulator block) adds `_mma{urows}`, `norms: "once"` (fused: centroid norms once per CTA) `_n1`; its
    variants carry no cas_batch / private (they only shape the atomic update). `mma: "wgmma"` (the
    assignment on wgmma, sm_90a) adds `_wg`, `xstages: 2` (fused: the next point tile prefetched) `_x2`,
    `sums: "regs"` (wgmma: the sums held in registers for the whole kernel, no smem sums) `_rs`, `sums:
    "wgmma"` (held in wgmma accumulators, the one-hot update on wgmma too) `_rw`, with `update_n: 128` (both
    swizzle atoms of dims per update instruction) `_rw128`, `astages: 2` (resident: two distance accumulators,
    the next centroid tile's wgmma in flight during this one's argmin) `_a2` (`aunroll`: every tile in one static
    sequence, `_a2u`), `chains: c` (the argmin's running bests per row, topk `chains`) `_ch{c}`."""
    if p.get("kind") == "wide":
        return f"kmeans_wide_bm{p['bm']}_bn{p['bn']}_c{p['dc']}_s{p['stages']}" + ("_wg" if p.get("mma") == "wgmma" else "") \
            + {"streamed": "_st", "tma": "_tma", "pingpong": "_pp"}.get(p.get("points"), "") \
            + (f"{p['wgs']}" if p.get("points") == "pingpong" and p.get("wgs", 2) != 2 else "") \
            + (f"_t{p['pt']}" if p.get("points") in ("pingpong", "tma") and p.get("pt", 1) > 1 else "") \
            + (f"_h{p['handoff'][0]}" if p.get("points") == "pingpong" and p.get("handoff", "issued") != "issued"
               else "") + ("_ra" if p.get("points") == "pingpong" and p.get("a_regs") else "") \
            + (f"_cl{p['cluster']}" if p.get("points") == "tma" and p.get("cluster", 1) > 1 else "") \
            + (f"_b{p['minb']}" if p.get("minb", 1) > 1 else "") + ("_a2" if p.get("acc2") else "") \
            + (f"_r{p['red']}" if p.get("red", 1) > 1 else "") + (f"_p{p['copies']}" if p.get("copies", 1) > 1 else "") \
            + ("_lv" if p.get("lv") else "") \
            + (f"_sb{p['sb']}" if p.get("points") == "tma" and p.get("sb", 1) > 1 else "") \
            + ("_ss" if p.get("sums") == "sorted" else "")
    extra = f"_f{p['big']}" if "big" in p else ""
    extra += f"_c{p['cas_batch']}" if "cas_batch" in p else ""
    extra += "_priv" if p.get("private") else ""
    extra += f"_mma{p.get('urows', 16)}" if p.get("update", "atomic") == "mma" else ""
    extra += "_n1" if p.get("norms", "tile") == "once" else ""
    extra += "_wg" if p.get("mma", "sync") == "wgmma" else ""
    extra += "_x2" if p.get("xstages", 1) == 2 else ""
    extra += {"smem": "", "regs": "_rs", "wgmma": "_rw"}[p.get("sums", "smem")]
    extra += "128" if p.get("update_n", 64) == 128 else ""
    extra += "_a2" if p.get("astages", 1) == 2 else ""
    extra += "u" if p.get("aunroll") else ""
    extra += f"_ch{p['chains']}" if p.get("chains", 1) > 1 else ""
    return f"kmeans_{p.get('kind', 'fused')}_k{p['kmax']}_bm{p['bm']}_bn{p['bn']}_p{p['ctas']}{extra}"


def kmeans_supports(p: dict, shape: dict) -> bool:
    """shape: B, N, K, D (arch: the GPU's, for the sm_90a-only wgmma variants; a shape without it is
    taken to allow them)."""
    if p.get("kind") == "wide":
        return kmeans_wide_supports(p, shape)
    if p.get("mma", "sync") == "wgmma" and shape.get("arch", "sm_90a") != "sm_90a":
        return False
    return shape.get("D", 128) == KMEANS_D and 1 <= shape["K"] <= p["kmax"] and shape["N"] >= 1 and shape["B"] >= 1


def kmeans_kernel(p: dict, arch: str):
    from tasks.kmeans.programs import kmeans_fused, kmeans_resident
    if p.get("mma", "sync") == "wgmma":     # the tensor-core update only (tasks/kmeans/wgmma.py)
        from tasks.kmeans.wgmma import kmeans_wgmma
        return kmeans_wgmma(kmax=p["kmax"], bm=p["bm"], bn=p["bn"], ctas=p["ctas"], urows=p.get("urows", 16),
                            resident=p.get("kind", "fused") == "resident", xstages=p.get("xstages", 1),
                            sums=p.get("sums", "smem"), update_n=p.get("update_n", 64),
                            astages=p.get("astages", 1), chains=p.get("chains", 1),
                            aunroll=p.get("aunroll", False), arch=arch)
    update = p.get("update", "atomic")
    if p.get("kind", "fused") == "resident":
        return kmeans_resident(kmax=p["kmax"], bm=p["bm"], bn=p["bn"], ctas=p["ctas"], big=p.get("big", 16),
                               cas_batch=p.get("cas_batch", 8), private=p.get("private", False), update=update,
                               urows=p.get("urows", 16), arch=arch)
    return kmeans_fused(kmax=p["kmax"], bm=p["bm"], bn=p["bn"], ctas=p["ctas"], update=update,
                        urows=p.get("urows", 16), norms=p.get("norms", "tile"), xstages=p.get("xstages", 1), arch=arch)


# Shape regions with a dispatch table of their own (tables/<op>_<region>.json, fitted on the region's own
# sweep: bench/lib_grid.py --region). kNN below 16384 database rows is launch-latency bound, and the main
# table's tree, fitted on M >= 16384, sent it to multi-kernel programs (4 launches at Q = 4096, M = 33).
KNN_SMALL_M = 16384


def region_table(op: str, shape: dict) -> str:
    """The name of the table that covers `shape` (its region's, else the op's own)."""
    return "knn_small" if op == "knn" and shape.get("M", KNN_SMALL_M) < KNN_SMALL_M else op


SUPPORTS = {"knn": knn_supports, "kmeans": kmeans_supports}
# a table pick's per-call form (params, shape) -> params, fitted apart from the dispatch tree
PER_CALL = {"knn": knn_per_call}
NAMES = {"knn": knn_name, "kmeans": kmeans_name}
FALLBACK = {"knn": KNN_FALLBACK, "kmeans": KMEANS_FALLBACK}
