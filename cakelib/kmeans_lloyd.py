"""`kmeans(x, k, iters)`: Lloyd's k-means (squared Euclidean) on the GPU. Each iteration is one CAKE IR
kernel (fused argmin assignment + shared-memory aggregated update, tasks/kmeans/programs.py) picked per
shape by the dispatch table (cakelib/tables/kmeans.json), then a cast of the new fp32 centroids to the
fp16 the next assignment reads.

x: [N, D] or [B, N, D] (read as fp16), D = 128, k <= 256. init: centroids [k, D] / [B, k, D]
(default: k distinct points per batch, drawn with `seed`). Empty clusters keep their centroid. Runs
exactly `iters` iterations (no early stop). Returns (centroids float32 [.., k, D], assignments int32
[.., N]): the assignment is the last iteration's (to the centroids it started from).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import arrays, fast_calls
from .runtime import choose, runtime


def _init_rows(x_arg, x, B: int, N: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.choice(N, size=k, replace=N < k) for _ in range(B)])
    if x_arg.kind == "torch":
        import torch
        xv = x_arg.view.reshape(B, N, -1)
        t = torch.as_tensor(idx, device=xv.device)
        return torch.stack([xv[b, t[b]] for b in range(B)])
    if x_arg.kind == "numpy":
        xa = np.asarray(x, dtype=np.float32).reshape(B, N, -1)
        return np.stack([xa[b, idx[b]] for b in range(B)])
    raise TypeError("kmeans: pass `init` centroids when x is a raw device array")


def kmeans(x, k: int, iters: int = 10, *, init=None, seed: int = 0, variant: Optional[dict] = None,
           device: Optional[int] = None, out: Optional[tuple] = None):
    """out: optional (centroids float32 [(B,) k, D], assignments int32 [(B,) N]) CUDA torch tensors written
    in place (and returned)."""
    planned = variant is None and device is None and init is not None   # a repeat call's plan (fast_calls)
    if planned and iters >= 1:
        hit = fast_calls.kmeans(x, k, iters, init, out)
        if hit is not None:
            return hit
    if iters < 1:
        raise ValueError("iters must be >= 1")
    if device is None:   # a torch tensor's own device, else GPU 0
        device = arrays.device_of(x)
    rt = runtime(device)   # makes the device's context current before any allocation
    xa = arrays.as_input(x, "x")
    owned = [xa]
    try:
        if len(xa.shape) not in (2, 3):
            raise ValueError(f"x must be [N, D] or [B, N, D], got {list(xa.shape)}")
        batched = len(xa.shape) == 3
        B, N, D = (xa.shape if batched else (1, *xa.shape))
        if not 1 <= k:
            raise ValueError("k must be >= 1")
        shape = {"B": B, "N": N, "K": k, "D": D, "arch": rt.arch}
        name, p = choose("kmeans", shape, variant)
        c0 = init if init is not None else _init_rows(xa, x, B, N, k, seed)
        ca = arrays.as_input(c0, "init")
        owned.append(ca)
        if tuple(ca.shape) not in ((B, k, D), (k, D) if not batched else (B, k, D)):
            raise ValueError(f"init must be [{'B, ' if batched else ''}k, D], got {list(ca.shape)}")
        from .cast import cast_f32_f16
        from .variants import kmeans_kernel
        lloyd = rt.kernel(("kmeans", name), lambda arch: kmeans_kernel(p, arch))
        cast = rt.kernel(("cast_f32_f16", D), lambda arch: cast_f32_f16(D, arch=arch))
        stream = arrays.stream_of(xa)
        ws = {n: rt.workspace(f"kmeans.{n}", shape, dt, stream) for n, shape, dt in (
            ("WS", (B * k, D), "f32"), ("WC", (B * k, 1), "f32"), ("WT", (B, 1), "i32"))}
        out_shape = (B, k, D) if batched else (k, D)
        a_shape = (B, N) if batched else (N,)
        if out is not None:
            Cn = arrays.as_output(out[0], "out[0] (centroids)", out_shape, "f32", xa)
            A = arrays.as_output(out[1], "out[1] (assignments)", a_shape, "i32", xa)
        else:
            A = arrays.empty_like_kind(xa, (B, N), "i32")
            Cn = arrays.empty_like_kind(xa, (B * k, D), "f32")
        C16 = arrays.empty_like_kind(xa, (B * k, D), "f16") if iters > 1 else None
        owned += [A, Cn, C16]
        a_view, cn_view = A.reshaped((B, N)), Cn.reshaped((B * k, D))
        X = xa.reshaped((B * N, D))
        cur = ca.reshaped((B * k, D))
        for it in range(iters):
            rt.launch(lloyd, {"X": X, "C": cur, "A": a_view, "Cnew": cn_view, **ws}, {"B": B, "N": N, "K": k}, stream)
            if it + 1 < iters:
                rt.launch(cast, {"Src": cn_view, "Dst": C16.view}, {"R": B * k}, stream)
                cur = C16.view
        if planned and xa.kind == "torch":
            fast_calls.record_kmeans(rt, x, init, k, iters, out, lloyd, cast, {
                "first": ({"X": X, "C": ca.reshaped((B * k, D)), "A": a_view, "Cnew": cn_view, **ws}, {"B": B, "N": N, "K": k}),
                "loop": ({"X": X, "C": cur, "A": a_view, "Cnew": cn_view, **ws}, {"B": B, "N": N, "K": k}),
                "cast": ({"Src": cn_view, "Dst": cur}, {"R": B * k}), "scratch": C16,
                "c_shape": out_shape, "a_shape": a_shape}, stream)
        C = arrays.result(Cn)
        Aout = arrays.result(A)
        return arrays.reshape(C, out_shape), arrays.reshape(Aout, a_shape)
    finally:
        arrays.release(*owned)
