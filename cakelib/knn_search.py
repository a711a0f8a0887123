"""`knn(queries, database, k)`: exact brute-force k nearest neighbours (squared L2 or inner product)
on the GPU, through a CAKE IR kernel picked per shape by the dispatch table (cakelib/tables/knn.json).

Inputs are read as fp16 (fp32 accumulation on tensor cores); D must be 64 or 128, k <= 32 (the
split-database path where its registers allow, which the dispatcher only picks when it applies). Returns (indices [Q, k]
int32, distances [Q, k] float32), best first: smallest squared distance for "l2", largest q.x for "ip".

rerank=True: the search returns its best KC = min(32, M, max(2k, k + 8)) candidates, and a second kernel
(tasks/knn/rerank.py) re-scores them exactly in fp32 from the inputs in their own precision (fp32, or fp16 when
they are fp16; l2 as the sum of squared differences, without the fused form's cancellation) and returns the best
k of them, ties to the smaller index. A true neighbour the fp16 search ranked below its KC-th candidate is not
recovered.
"""
from __future__ import annotations

from typing import Optional

from . import arrays, fast_calls
from .runtime import choose, runtime


def knn(queries, database, k: int = 10, metric: str = "l2", *, variant: Optional[dict] = None,
        device: Optional[int] = None, out: Optional[tuple] = None, rerank: bool = False):
    """out: optional (indices int32 [Q, k], distances float32 [Q, k]) CUDA torch tensors written in place
    (and returned), for callers that keep their buffers."""
    planned = variant is None and device is None and not rerank   # a repeat call's plan (cakelib.fast_calls)
    if planned:
        hit = fast_calls.knn(queries, database, k, metric, out)
        if hit is not None:
            return hit
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
        stream = arrays.stream_of(q)
        ws = {n: rt.workspace(f"knn.{n}", shape, dt, stream) for n, shape, dt in (
            ("PV", (WS_ROWS, kk), "f32"), ("PI", (WS_ROWS, kk), "i32"), ("WT", (WS_TILES, 1), "i32"),
            ("TH", (WS_ROWS, 1), "i32"))}
        if out is not None:
            I = arrays.as_output(out[0], "out[0] (indices)", (Q, k), "i32", q)
            Dist = arrays.as_output(out[1], "out[1] (distances)", (Q, k), "f32", q)
        else:
            I = arrays.empty_like_kind(q, (Q, k), "i32")
            Dist = arrays.empty_like_kind(q, (Q, k), "f32")
        outs = [I, Dist]
        if not rerank:
            tensors, scalars = {"Xq": q.view, "Xb": db.view, "I": I.view, "Dist": Dist.view, **ws}, {"Q": Q, "M": M}
            rt.launch(kern, tensors, scalars, stream)
            if planned and q.kind == "torch":
                fast_calls.record_knn(rt, queries, database, k, metric, out, kern, tensors, scalars, stream)
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

