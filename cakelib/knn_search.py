"""`knn(queries, database, k)`: exact brute-force k nearest neighbours (squared L2 or inner product)
on the GPU, through a CAKE IR kernel picked per shape by the dispatch table (cakelib/tables/knn.json).

Inputs are read as fp16 (fp32 accumulation on tensor cores). The fused kernels take D = 64 or 128 and k <= 32
(the split-database path where its registers allow, which the dispatcher only picks when it applies); every
other shape with k <= min(1024, M) and D <= 1024 runs on the large-k path (cakelib/knn_large_k.py: a distance
tile into a workspace, then an exact block-wide selection per query row; rerank=True: k <= 32 only). Returns (indices [Q, k]
int32, distances [Q, k] float32), best first: smallest squared distance for "l2", largest q.x for "ip".

rerank=True: the search returns its best KC = min(32, M, max(2k, k + 8)) candidates, and a second kernel
(tasks/knn/rerank.py) re-scores them exactly in fp32 from the inputs in their own precision (fp32, or fp16 when
they are fp16; l2 as the sum of squared differences, without the fused form's cancellation) and returns the best
k of them, ties to the smaller index. A true neighbour the fp16 search ranked below its KC-th candidate is not
recovered.
"""
from __future__ import annotations

from typing import Optional

from . import arrays
from .runtime import choose, runtime


def knn(queries, database, k: int = 10, metric: str = "l2", *, variant: Optional[dict] = None,
        device: Optional[int] = None, out: Optional[tuple] = None, rerank: bool = False):
    """out: optional (indices int32 [Q, k], distances float32 [Q, k]) CUDA torch tensors written in place
    (and returned), for callers that keep their buffers."""
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', not {metric!r}")
    if device is None:   # a torch tensor's own device, else GPU 0
        device = arrays.device_of(queries)
    rt = runtime(device)   # makes the device's context current before any allocation
    q = arrays.as_input(queries, "queries")
    try:
        db = arrays.as_input(database, "database")
    except Exception:
        arrays.release(q)
        raise
    outs, temps = [], []
    try:
        if len(q.shape) != 2 or len(db.shape) != 2 or q.shape[1] != db.shape[1]:
            raise ValueError(f"queries [Q, D] and database [M, D] expected, got {list(q.shape)} and {list(db.shape)}")
        Q, D = q.shape
        M = db.shape[0]
        if not 1 <= k <= M:
            raise ValueError(f"k = {k} must be in [1, M = {M}]")
        stream = arrays.stream_of(q)
        if variant is None and _large_k(Q, M, k, D, rt.arch, rerank):
            I, Dist = _outputs(q, Q, k, out)
            outs = [I, Dist]
            from .knn_large_k import knn_large_k
            temps = knn_large_k(rt, q, db, k, metric, I, Dist, stream)
            return arrays.result(I), arrays.result(Dist)
        if rerank:
            from tasks.knn.rerank import rerank_candidates
        kk = rerank_candidates(k, M) if rerank else k     # what the search returns
        shape = {"Q": Q, "M": M, "k": kk, "D": D, "arch": rt.arch}
        _, p = choose("knn", shape, variant)
        from .variants import knn_kernel, knn_queue
        # the build's key: every build parameter (an explicit variant may set options its name omits, e.g.
        # share / skip_pad) and the queue, filled in per k like k itself
        kern = rt.kernel(("knn", tuple(sorted(p.items())), kk, metric, D, knn_queue(p, kk)),
                         lambda arch: knn_kernel(p, kk, metric, D, arch))
        from tasks.knn.programs import WS_ROWS, WS_TILES
        ws = {n: rt.workspace(f"knn.{n}", shape, dt, stream) for n, shape, dt in (
            ("PV", (WS_ROWS, kk), "f32"), ("PI", (WS_ROWS, kk), "i32"), ("WT", (WS_TILES, 1), "i32"),
            ("TH", (WS_ROWS, 1), "i32"))}
        I, Dist = _outputs(q, Q, k, out)
        outs = [I, Dist]
        if not rerank:
            rt.launch(kern, {"Xq": q.view, "Xb": db.view, "I": I.view, "Dist": Dist.view, **ws}, {"Q": Q, "M": M},
                      stream)
            return arrays.result(I), arrays.result(Dist)
        CI, CD = (arrays.empty_like_kind(q, (Q, kk), dt, scratch=True) for dt in ("i32", "f32"))
        temps = [CI, CD]
        rt.launch(kern, {"Xq": q.view, "Xb": db.view, "I": CI.view, "Dist": CD.view, **ws}, {"Q": Q, "M": M}, stream)
        # the precision the re-ranking reads: fp16 when both inputs are fp16 already, else fp32 (an exact copy of
        # fp32 / fp16 / bf16 values)
        dt = "f16" if arrays.is_f16(queries) and arrays.is_f16(database) else "f32"
        rq, rdb = (q, db) if dt == "f16" else (arrays.as_input(queries, "queries", "f32"),
                                              arrays.as_input(database, "database", "f32"))
        if dt != "f16":
            temps += [rq, rdb]
        from tasks.knn.rerank import knn_rerank
        rk = rt.kernel(("knn_rerank", kk, k, metric, D, dt), lambda arch: knn_rerank(kk, k, metric, D, dt, arch))
        rt.launch(rk, {"Xq": rq.view, "Xb": rdb.view, "CI": CI.view, "I": I.view, "Dist": Dist.view},
                  {"Q": Q, "M": M}, stream)
        return arrays.result(I), arrays.result(Dist)
    finally:
        if temps and any(t.owned is not None for t in temps):
            from gpu_backend.memory import synchronize
            synchronize()
        arrays.release(q, db, *outs, *temps)



def _outputs(q, Q: int, k: int, out):
    """(indices, distances) Args: the caller's `out=` tensors, or new ones."""
    if out is not None:
        return (arrays.as_output(out[0], "out[0] (indices)", (Q, k), "i32", q),
                arrays.as_output(out[1], "out[1] (distances)", (Q, k), "f32", q))
    return arrays.empty_like_kind(q, (Q, k), "i32"), arrays.empty_like_kind(q, (Q, k), "f32")


def _large_k(Q: int, M: int, k: int, D: int, arch: str, rerank: bool) -> bool:
    """Whether the search runs on the large-k path (cakelib/knn_large_k.py): every k past the register lists'
    KNN_K_MAX, and smaller k at the shapes no table variant supports (e.g. a D the fused kernels do not
    take); a clear error outside both domains."""
    from .variants import KNN_K_MAX, KNN_LARGE_D_MAX, KNN_LARGE_K_MAX, KNN_LARGE_M_MAX, knn_large_k_supports
    shape = {"Q": Q, "M": M, "k": k, "D": D, "arch": arch}
    big = knn_large_k_supports(shape)
    if k > KNN_K_MAX:
        if rerank:
            raise ValueError(f"knn: rerank=True supports k <= {KNN_K_MAX}, not k = {k}")
        if not big:
            raise ValueError(f"knn: shape Q = {Q}, M = {M}, k = {k}, D = {D} is outside what the library supports "
                             f"(k <= min({KNN_LARGE_K_MAX}, M), 1 <= D <= {KNN_LARGE_D_MAX}, M <= {KNN_LARGE_M_MAX})")
        return True
    if rerank or not big:
        return False
    try:
        choose("knn", shape)
        return False
    except ValueError:
        return True
