"""`kmeans(x, k, iters)`: Lloyd's k-means (squared Euclidean) on the GPU, in one of two families:

- "table" (D = 128, k <= 256): each iteration is one CAKE IR kernel (fused argmin assignment +
  shared-memory aggregated update, tasks/kmeans/programs.py / wgmma.py) picked per shape by the dispatch
  table (cakelib/tables/kmeans.json), then a cast of the new fp32 centroids to the fp16 the next
  assignment reads;
- "wide" (every other D, a multiple of 32 in [32, 1024], and k <= 65536): per iteration the centroid norms,
  the streamed-chunk assignment that adds each point into global per-cluster sums, and a finalize that
  divides and writes the fp32 centroids and their fp16 copy (tasks/kmeans/wide.py; rule:
  cakelib.variants.kmeans_wide_params); with `sums: "sorted"` (the rule's from D = 768) the assignment only
  counts, and three kernels between it and the finalize sum the points by a counting sort of the
  assignments (tasks/kmeans/sorted_sums.py).

x: [N, D] or [B, N, D] (read as fp16). init: centroids [k, D] / [B, k, D] (default: k distinct points per
batch, drawn with `seed`). Empty clusters keep their centroid. Runs exactly `iters` iterations (no early
stop). Returns (centroids float32 [.., k, D], assignments int32 [.., N]): the assignment is the last
iteration's (to the centroids it started from).
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
    in place (and returned). variant: a table variant, or {"kind": "wide", ..} (cakelib.variants)."""
    # a call cakelib.kmeans would launch from its plan (cakelib.fast_calls): recorded after the general path
    planned = variant is None and device is None and init is not None
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
        wide = _is_wide(shape, variant)
        if wide:
            from .variants import kmeans_wide_params, kmeans_wide_supports
            p = dict(variant) if variant is not None else kmeans_wide_params(shape)
            if not kmeans_wide_supports(p, shape):
                raise ValueError(f"kmeans variant {p} does not support shape {shape}")
        else:
            name, p = choose("kmeans", shape, variant)
        c0 = init if init is not None else _init_rows(xa, x, B, N, k, seed)
        ca = arrays.as_input(c0, "init")
        owned.append(ca)
        if tuple(ca.shape) not in ((B, k, D), (k, D) if not batched else (B, k, D)):
            raise ValueError(f"init must be [{'B, ' if batched else ''}k, D], got {list(ca.shape)}")
        out_shape = (B, k, D) if batched else (k, D)
        a_shape = (B, N) if batched else (N,)
        if out is not None:
            Cn = arrays.as_output(out[0], "out[0] (centroids)", out_shape, "f32", xa)
            A = arrays.as_output(out[1], "out[1] (assignments)", a_shape, "i32", xa)
        else:
            A = arrays.empty_like_kind(xa, (B, N), "i32")
            Cn = arrays.empty_like_kind(xa, (B * k, D), "f32")
        owned += [A, Cn]
        if wide:
            owned += _wide_loop(rt, p, xa, ca, A, Cn, B, N, k, D, iters)
        else:
            def record(lloyd, cast, launches: dict, stream: int) -> None:   # the repeat call's plan
                if planned and xa.kind == "torch":
                    fast_calls.record_kmeans(rt, x, init, k, iters, out, lloyd, cast,
                                             {**launches, "c_shape": out_shape, "a_shape": a_shape}, stream)
            owned += _table_loop(rt, (name, p), xa, ca, A, Cn, B, N, k, D, iters, record)
        C = arrays.result(Cn)
        Aout = arrays.result(A)
        return arrays.reshape(C, out_shape), arrays.reshape(Aout, a_shape)
    finally:
        arrays.release(*owned)


def _is_wide(shape: dict, variant: Optional[dict]) -> bool:
    """The wide family runs `shape`: the caller's variant says so, or the rule (variants.kmeans_family);
    shapes outside both families raise here, with the limit they cross."""
    from .variants import kmeans_family, kmeans_wide_domain_error
    if variant is not None:
        return variant.get("kind") == "wide"
    if kmeans_family(shape) == "table":
        return False
    err = kmeans_wide_domain_error(shape)
    if err:
        raise ValueError(f"kmeans: {err} (see cakelib.variants: kmeans limits)")
    return True


def _table_loop(rt, picked, xa, ca, A, Cn, B, N, k, D, iters, record) -> list:
    """The fitted table's fused kernel per iteration, a cast of the fp32 centroids to fp16 between; then
    `record(lloyd, cast, launches, stream)` with what was launched (cakelib.fast_calls.record_kmeans)."""
    name, p = picked
    from .cast import cast_f32_f16
    from .variants import kmeans_kernel
    lloyd = rt.kernel(("kmeans", name), lambda arch: kmeans_kernel(p, arch))
    cast = rt.kernel(("cast_f32_f16", D), lambda arch: cast_f32_f16(D, arch=arch))
    stream = arrays.stream_of(xa)
    ws = {n: rt.workspace(f"kmeans.{n}", shape, dt, stream) for n, shape, dt in (
        ("WS", (B * k, D), "f32"), ("WC", (B * k, 1), "f32"), ("WT", (B, 1), "i32"))}
    C16 = arrays.empty_like_kind(xa, (B * k, D), "f16") if iters > 1 else None
    a_view, cn_view = A.reshaped((B, N)), Cn.reshaped((B * k, D))
    X = xa.reshaped((B * N, D))
    cur = ca.reshaped((B * k, D))
    for it in range(iters):
        rt.launch(lloyd, {"X": X, "C": cur, "A": a_view, "Cnew": cn_view, **ws}, {"B": B, "N": N, "K": k}, stream)
        if it + 1 < iters:
            rt.launch(cast, {"Src": cn_view, "Dst": C16.view}, {"R": B * k}, stream)
            cur = C16.view
    scalars = {"B": B, "N": N, "K": k}
    record(lloyd, cast, {"first": ({"X": X, "C": ca.reshaped((B * k, D)), "A": a_view, "Cnew": cn_view, **ws}, scalars),
                         "loop": ({"X": X, "C": cur, "A": a_view, "Cnew": cn_view, **ws}, scalars),
                         "cast": ({"Src": cn_view, "Dst": cur}, {"R": B * k}), "scratch": C16}, stream)
    return [C16]


def _wide_loop(rt, p, xa, ca, A, Cn, B, N, k, D, iters) -> list:
    """Per iteration: centroid norms, assignment + global scatter of the sums, finalize (fp32 centroids and
    the fp16 copy the next iteration reads: two fp16 buffers taking turns, so that no launch reads the
    buffer it writes)."""
    from tasks.kmeans.wide import copy_rows
    from .variants import kmeans_name, kmeans_wide_kernels
    build = kmeans_wide_kernels(p, D, rt.arch)
    copies = p.get("copies", 1)
    keys = {"assign": kmeans_name(p), "norms": "", "finalize": f"p{copies}", "offsets": "", "place": "", "runs": ""}
    kern = {part: rt.kernel(("kmeans_wide", keys[part], D, part),
                            lambda arch, part=part: kmeans_wide_kernels(p, D, arch)[part]())
            for part in build}
    stream = arrays.stream_of(xa)
    R = B * k
    rows = copy_rows(R, D, copies)
    ws = {n: rt.workspace(f"kmeans_wide.{n}", shape, dt, stream) for n, shape, dt in (
        ("WS", (rows, D), "f32"), ("WC", (rows, 1), "f32"), ("CN", (1, R), "f32"))}
    if "runs" in kern:    # the counting sort's cursors, slots' rows and slots' clusters
        ws.update({n: rt.workspace(f"kmeans_wide.{n}", shape, "i32", stream) for n, shape in (
            ("CUR", (1, R)), ("IDS", (1, B * N)), ("SK", (1, B * N)))})
    c16 = [arrays.empty_like_kind(xa, (R, D), "f16") for _ in range(2)]
    a_view, cn_view = A.reshaped((B, N)), Cn.reshaped((R, D))
    X = xa.reshaped((B * N, D))
    cur = ca.reshaped((R, D))
    for it in range(iters):
        nxt = c16[it % 2].view
        rt.launch(kern["norms"], {"C": cur, "CN": ws["CN"]}, {"R": R}, stream)
        rt.launch(kern["assign"], {"X": X, "C": cur, "CN": ws["CN"], "A": a_view, "WS": ws["WS"], "WC": ws["WC"]},
                  {"B": B, "N": N, "K": k}, stream)
        if "runs" in kern:
            _sorted_sums(rt, kern, ws, X, a_view, B, N, k, stream)
        rt.launch(kern["finalize"], {"C": cur, "WS": ws["WS"], "WC": ws["WC"], "Cnew": cn_view, "C16": nxt},
                  {"R": R}, stream)
        cur = nxt
    return c16


def _sorted_sums(rt, kern: dict, ws: dict, X, a_view, B: int, N: int, k: int, stream) -> None:
    """The centroid sums WS by a counting sort of the assignments (tasks/kmeans/sorted_sums.py): each
    cluster's first slot from the counts WC, every point placed in its cluster's run, the runs summed."""
    rt.launch(kern["offsets"], {"WC": ws["WC"], "CUR": ws["CUR"]}, {"R": B * k}, stream)
    rt.launch(kern["place"], {"A": a_view, "CUR": ws["CUR"], "IDS": ws["IDS"], "SK": ws["SK"]},
              {"B": B, "N": N, "K": k}, stream)
    rt.launch(kern["runs"], {"X": X, "IDS": ws["IDS"], "SK": ws["SK"], "WS": ws["WS"]}, {"B": B, "N": N, "K": k},
              stream)
