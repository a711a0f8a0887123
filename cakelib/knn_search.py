"""`knn(queries, database, k)`: exact brute-force k nearest neighbours (squared L2 or inner product)
on the GPU, through a CAKE IR kernel picked per shape by the dispatch table (cakelib/tables/knn.json).

Inputs are read as fp16 (fp32 accumulation on tensor cores). Three paths, by shape (`_route`):
- D in {64, 128}, k <= 32: the fused kernels of the fitted tables (a running top-k per query in registers; the
  split-database path where its registers allow);
- any other D in [1, 1024] at k <= 32: the any-D variants (cakelib.variants.knn_dk_pick, a rule: the D-chunked
  wgmma search on sm_90a, mma.sync with whole staged rows elsewhere, where the arch's smem holds them); an odd D
  gets a zero column appended on the device first, which changes no distance (torch tensors and numpy arrays);
- k in (32, 1024], and any k <= 32 shape no fused variant holds: the large-k path (cakelib/knn_large_k.py: a
  distance tile into a workspace, then an exact block-wide selection per query row). Returns (indices [Q, k]
int32, distances [Q, k] float32), best first: smallest squared distance for "l2", largest q.x for "ip".

rerank=True: the search returns its best KC = min(32, M, max(2k, k + 8)) candidates, and a second kernel
(tasks/knn/rerank.py) re-scores them exactly in fp32 from the inputs in their own precision (fp32, or fp16 when
they are fp16; l2 as the sum of squared differences, without the fused form's cancellation) and returns the best
k of them, ties to the smaller index. A true neighbour the fp16 search ranked below its KC-th candidate is not
recovered. It needs D a multiple of 16.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import arrays, fast_calls
from .runtime import choose, runtime
from .variants import (KNN_D, KNN_D_MAX, KNN_K_MAX, KNN_LARGE_D_MAX, KNN_LARGE_K_MAX, KNN_LARGE_M_MAX, knn_dk_pick,
                       knn_large_k_supports)


def _even_columns(x, name: str):
    """x with an odd D padded by a zero column (the kernels' cp.async chunks need 4-byte aligned rows; a zero
    column changes no distance, norm or inner product); other inputs unchanged."""
    if arrays._is_torch(x):
        if len(x.shape) == 2 and x.shape[1] % 2 and x.shape[1] <= KNN_D_MAX:
            import torch
            return torch.nn.functional.pad(x.to(torch.float16), (0, 1))
        return x
    if hasattr(x, "__cuda_array_interface__") or (hasattr(x, "ptr") and hasattr(x, "dtype")):
        shape = x.__cuda_array_interface__["shape"] if hasattr(x, "__cuda_array_interface__") else x.shape
        if len(shape) == 2 and shape[1] % 2 and shape[1] <= KNN_D_MAX:
            raise ValueError(f"{name}: an odd D ({shape[1]}) from a raw device array; pass a torch tensor or numpy "
                             "array (padded here), or pad D to even")
        return x
    a = np.asarray(x)
    return np.pad(a, ((0, 0), (0, 1))) if a.ndim == 2 and a.shape[1] % 2 and a.shape[1] <= KNN_D_MAX else x


def knn(queries, database, k: int = 10, metric: str = "l2", *, variant: Optional[dict] = None,
        device: Optional[int] = None, out: Optional[tuple] = None, rerank: bool = False):
    """out: optional (indices int32 [Q, k], distances float32 [Q, k]) CUDA torch tensors written in place
    (and returned), for callers that keep their buffers."""
    # a call cakelib.knn would launch from its plan (cakelib.fast_calls): recorded after the general path
    planned = variant is None and device is None and not rerank
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', not {metric!r}")
    if device is None:   # a torch tensor's own device, else GPU 0
        device = arrays.device_of(queries)
    rt = runtime(device)   # makes the device's context current before any allocation
    if not rerank and k <= KNN_K_MAX:   # (the any-D kernels copy 4-byte pieces of rows; large k pads itself)
        queries, database = _even_columns(queries, "queries"), _even_columns(database, "database")
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
        if rerank:
            if k > KNN_K_MAX:
                raise ValueError(f"knn: rerank=True supports k <= {KNN_K_MAX}, not k = {k}")
            from tasks.knn.rerank import rerank_candidates
        kk = rerank_candidates(k, M) if rerank else k     # what the search returns
        shape = {"Q": Q, "M": M, "k": kk, "D": D, "arch": rt.arch}
        path, dk = _route(shape, rerank) if variant is None else ("fused", None)
        if path == "large_k":
            I, Dist = _outputs(q, Q, k, out)
            outs = [I, Dist]
            from .knn_large_k import knn_large_k
            temps = knn_large_k(rt, q, db, k, metric, I, Dist, stream)
            return arrays.result(I), arrays.result(Dist)
        _, p = choose("knn", shape, variant or dk)
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



def _outputs(q, Q: int, k: int, out):
    """(indices, distances) Args: the caller's `out=` tensors, or new ones."""
    if out is not None:
        return (arrays.as_output(out[0], "out[0] (indices)", (Q, k), "i32", q),
                arrays.as_output(out[1], "out[1] (distances)", (Q, k), "f32", q))
    return arrays.empty_like_kind(q, (Q, k), "i32"), arrays.empty_like_kind(q, (Q, k), "f32")


def _route(shape: dict, rerank: bool) -> tuple[str, dict | None]:
    """("fused", None): the fitted tables' pick (D in KNN_D, k <= KNN_K_MAX); ("fused", p): the any-D variant p;
    ("large_k", None): the large-k path (k past the register lists, or a k <= KNN_K_MAX shape no fused variant
    holds); a ValueError naming the limits outside every path."""
    Q, M, k, D = shape["Q"], shape["M"], shape["k"], shape["D"]
    if k <= KNN_K_MAX:
        if D in KNN_D:
            return "fused", None
        p = knn_dk_pick(shape) if 1 <= D <= KNN_D_MAX else {}
        if p and not (rerank and D % 16):
            return "fused", p
        if rerank:
            raise ValueError(f"knn: rerank=True needs a fused kernel: D in {KNN_D}, or D <= {KNN_D_MAX} a multiple of "
                             f"16 where the any-D variants hold the shape (got {shape})")
    if not knn_large_k_supports(shape):
        raise ValueError(f"knn: shape Q = {Q}, M = {M}, k = {k}, D = {D} is outside what the library supports "
                         f"(k <= min({KNN_LARGE_K_MAX}, M), 1 <= D <= {KNN_LARGE_D_MAX}, M <= {KNN_LARGE_M_MAX} "
                         f"past k = {KNN_K_MAX})")
    return "large_k", None
