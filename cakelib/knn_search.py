"""`knn(queries, database, k)`: exact brute-force k nearest neighbours (squared L2 or inner product)
on the GPU, through a CAKE IR kernel picked per shape by the dispatch table (cakelib/tables/knn.json).

Inputs are read as fp16 (fp32 accumulation on tensor cores); D must be 64 or 128, k <= 32 (the
split-database path where its registers allow, which the dispatcher only picks when it applies). Returns (indices [Q, k]
int32, distances [Q, k] float32), best first: smallest squared distance for "l2", largest q.x for "ip".
"""
from __future__ import annotations

from typing import Optional

from . import arrays
from .runtime import choose, runtime


def knn(queries, database, k: int = 10, metric: str = "l2", *, variant: Optional[dict] = None,
        device: Optional[int] = None, out: Optional[tuple] = None):
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
    outs = []
    try:
        if len(q.shape) != 2 or len(db.shape) != 2 or q.shape[1] != db.shape[1]:
            raise ValueError(f"queries [Q, D] and database [M, D] expected, got {list(q.shape)} and {list(db.shape)}")
        Q, D = q.shape
        M = db.shape[0]
        if not 1 <= k <= M:
            raise ValueError(f"k = {k} must be in [1, M = {M}]")
        shape = {"Q": Q, "M": M, "k": k, "D": D, "arch": rt.arch}
        _, p = choose("knn", shape, variant)
        from .variants import knn_kernel, knn_queue
        # the build's key: every build parameter (an explicit variant may set options its name omits, e.g.
        # share / skip_pad) and the queue, filled in per k like k itself
        kern = rt.kernel(("knn", tuple(sorted(p.items())), k, metric, D, knn_queue(p, k)),
                         lambda arch: knn_kernel(p, k, metric, D, arch))
        from tasks.knn.programs import WS_ROWS, WS_TILES
        stream = arrays.stream_of(q)
        ws = {n: rt.workspace(f"knn.{n}", shape, dt, stream) for n, shape, dt in (
            ("PV", (WS_ROWS, k), "f32"), ("PI", (WS_ROWS, k), "i32"), ("WT", (WS_TILES, 1), "i32"),
            ("TH", (WS_ROWS, 1), "i32"))}
        if out is not None:
            I = arrays.as_output(out[0], "out[0] (indices)", (Q, k), "i32", q)
            Dist = arrays.as_output(out[1], "out[1] (distances)", (Q, k), "f32", q)
        else:
            I = arrays.empty_like_kind(q, (Q, k), "i32")
            Dist = arrays.empty_like_kind(q, (Q, k), "f32")
        outs = [I, Dist]
        rt.launch(kern, {"Xq": q.view, "Xb": db.view, "I": I.view, "Dist": Dist.view, **ws}, {"Q": Q, "M": M},
                  stream)
        return arrays.result(I), arrays.result(Dist)
    finally:
        arrays.release(q, db, *outs)
