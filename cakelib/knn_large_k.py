"""The large-k kNN path (k up to 1024, any D up to 1024): per chunk of queries, a distance tile kernel
writes the chunk's fp32 dot products against the whole database into a bounded workspace
(tasks/knn/dist_tile.py: wgmma on Hopper where D rounds to a multiple of 64, else mma.sync), and a selection kernel picks each row's k best from it (tasks/knn/select.py,
the block-wide `row_select`): one CTA per (row, database segment), then, where a row was split into
segments so that few-query chunks still fill the GPU, a merge of the segments' partial lists.
l2 scores are ||q||^2 + ||x||^2 - 2 q.x with the norms of the fp16 rows (summed in fp32 once per call for
the database, by the first chunk's distance tile from its staged slices; per chunk for the queries); ip scores are q.x. Rows of D not a multiple of 8 are first
copied with zero columns (knn_pad_rows)."""
from __future__ import annotations

from math import ceil

from .variants import KNN_LARGE_WS_WORDS

SELECT_CTAS = 1024     # CTAs the selection aims for per chunk (a few per SM: each streams its segment)
MIN_SEGMENT = 4096     # database rows per segment at least (and 8 k): the per-CTA passes stay long
MAX_SEGMENTS = 64
CAND_WORDS = 2048 * 1024   # partial-list workspace: rows x segments x k < 2 SELECT_CTAS k words
MAX_CHUNK = 32768          # the selection's grid.y (rows) stays under CUDA's 65535
PAD = 128                  # tasks/knn/dist_tile.py DIST_BM / DIST_BN: the padding of S and the norms
# Hopper, DP % 64 == 0: the distance tile on wgmma (knn_dist_tile_wgmma); else mma.sync (knn_dist_tile).
# A module switch so that a benchmark can check and time both forms.
DIST_WGMMA = True
SMALL_CHUNK = 32           # chunks of at most this many queries take the 32-row distance tile


def chunk_rows(Q: int, M: int) -> int:
    """Queries per chunk: as many 128-row tiles of S [rows, M padded] as the workspace holds (at least one)."""
    np_ = ceil(M / PAD) * PAD
    fit = max(PAD, (KNN_LARGE_WS_WORDS // np_) // PAD * PAD)
    return min(fit, ceil(Q / PAD) * PAD, MAX_CHUNK)


def segments(R: int, M: int, k: int) -> tuple[int, int]:
    """(segments per row, segment length) for a chunk of R rows: enough CTAs to fill the GPU, each segment
    at least MIN_SEGMENT and 8 k rows long, a multiple of 4."""
    seg = max(1, min(ceil(SELECT_CTAS / R), M // max(MIN_SEGMENT, 8 * k), MAX_SEGMENTS))
    sl = ceil(M / seg / 4) * 4    # segments start at 16-byte boundaries (the selection's vector loads)
    return ceil(M / sl), sl


def _ptr(view) -> int:
    from gpu_backend.runner import _ptr_shape
    return _ptr_shape(view)[0]


def _rows(view, r0: int, rows: int, cols: int, item: int) -> tuple:
    """Rows [r0, r0 + rows) of a row-major [*, cols] array as a (ptr, shape) view."""
    return (_ptr(view) + r0 * cols * item, [rows, cols])


def _dist_kernel(rt, dp: int, rows: int, norms: bool):
    """The distance tile for a chunk of `rows` queries: mma.sync 32-row tiles for a few queries (a quarter of
    the padded rows' work), wgmma on Hopper where DP % 64 == 0, else mma.sync 128-row tiles; norms: the
    form that also writes the database norms (mma.sync)."""
    from tasks.knn.dist_tile import knn_dist_tile, knn_dist_tile_wgmma
    bm = 32 if rows <= SMALL_CHUNK else 128
    if DIST_WGMMA and not norms and bm == 128 and rt.arch == "sm_90a" and dp % 64 == 0:
        return rt.kernel(("knn_dist_wgmma", dp), lambda arch: knn_dist_tile_wgmma(dp, arch=arch))
    return rt.kernel(("knn_dist_tile", dp, norms, bm), lambda arch: knn_dist_tile(dp, norms=norms, bm=bm, arch=arch))


def knn_large_k(rt, q, db, k: int, metric: str, I, Dist, stream: int) -> list:
    """Runs the search of q [Q, D] against db [M, D] into I / Dist [Q, k] (cakelib Args); returns the
    scratch Args the caller releases after the device is done with them."""
    from tasks.knn.dist_tile import knn_pad_rows, knn_row_norms
    from tasks.knn.select import knn_select
    from . import arrays
    Q, D = q.shape
    M = db.shape[0]
    dp = ceil(D / 8) * 8
    temps = []
    qv, dbv = q.view, db.view
    if dp != D:   # whole 16-byte chunks per row
        pad = rt.kernel(("knn_pad_rows", D), lambda arch: knn_pad_rows(D, arch=arch))
        for src, n in ((q, Q), (db, M)):
            out = arrays.empty_like_kind(q, (n, dp), "f16", scratch=True)
            temps.append(out)
            rt.launch(pad, {"X": src.view, "XP": out.view}, {"N": n}, stream)
        qv, dbv = temps[0].view, temps[1].view
    l2 = metric == "l2"
    np_ = ceil(M / PAD) * PAD
    S = rt.workspace("knn_topk.S", (max(KNN_LARGE_WS_WORDS, PAD * np_),), "f32", stream)
    if l2:
        XN = rt.workspace(f"knn_topk.XN{np_}", (1, np_), "f32", stream)
        QN = rt.workspace("knn_topk.QN", (1, ceil(KNN_LARGE_WS_WORDS / PAD / PAD) * PAD), "f32", stream)
        qnorms = rt.kernel(("knn_sqnorms", "Xq", dp), lambda arch: knn_row_norms(dp, "Xq", "R", "QN", arch=arch))
    sel = rt.kernel(("knn_select", k, metric), lambda arch: knn_select(k, metric, arch=arch))
    qc = chunk_rows(Q, M)
    for q0 in range(0, Q, qc):
        R = min(qc, Q - q0)
        rp = ceil(R / PAD) * PAD
        xq = _rows(qv, q0, R, dp, 2)
        sv = (_ptr(S), [R, np_])
        t = {}
        if l2:
            qn = (_ptr(QN), [1, rp])
            rt.launch(qnorms, {"Xq": xq, "QN": qn}, {"R": R}, stream)
            t = {"XN": XN, "QN": qn}
        xn = l2 and q0 == 0   # the first chunk's distance tile also writes the database norms (no pass of their own)
        rt.launch(_dist_kernel(rt, dp, R, xn), {"Xq": xq, "Xb": (_ptr(dbv), [M, dp]), "S": sv, **({"XN": XN} if xn else {})},
                  {"R": R, "M": M}, stream)
        seg, sl = segments(R, M, k)
        iv, dv = _rows(I.view, q0, R, k, 4), _rows(Dist.view, q0, R, k, 4)
        if seg == 1:
            rt.launch(sel, {"S": sv, "OV": dv, "OI": iv, **t}, {"R": R, "SEG": 1, "OC": k, "M": M, "SL": sl}, stream)
            continue
        CV = rt.workspace("knn_topk.CV", (CAND_WORDS,), "f32", stream)
        CI = rt.workspace("knn_topk.CI", (CAND_WORDS,), "i32", stream)
        cv, ci = (_ptr(CV), [R, seg * k]), (_ptr(CI), [R, seg * k])
        rt.launch(sel, {"S": sv, "OV": cv, "OI": ci, **t}, {"R": R, "SEG": seg, "OC": seg * k, "M": M, "SL": sl},
                  stream)
        mrg = rt.kernel(("knn_select_merge", k, metric), lambda arch: knn_select(k, metric, merge=True, arch=arch))
        rt.launch(mrg, {"CV": cv, "CI": ci, "OV": dv, "OI": iv}, {"R": R, "SEG": 1, "OC": k, "CC": seg * k}, stream)
    return temps
