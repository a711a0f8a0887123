"""Inputs and the float64 check of the large-k kNN (any D, l2 and ip): bench/lib_grid.py knn_inputs /
knn_reference / knn_check semantics (recall@k = 1 allowing ties, distinct in-range indices, distances
within 2e-5 (||q||^2 + max ||x||^2)), on the GPU in torch."""
from __future__ import annotations


def make_inputs(Q: int, M: int, D: int, seed: int = 0, queries_only=None):
    """Clustered database with exact duplicate rows, queries near rows and an eighth of them on rows (fp16).
    queries_only: a database made before (the same M, D) to draw new queries from."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    if queries_only is None:
        centers = torch.randn(max(1, M // 64), D, device="cuda", generator=g)
        xb = centers[torch.randint(0, centers.shape[0], (M,), device="cuda", generator=g)]
        xb += 0.3 * torch.randn(M, D, device="cuda", generator=g)
        dup = torch.randint(0, M, (max(1, M // 50),), device="cuda", generator=g)
        xb[dup] = xb[torch.randint(0, M, dup.shape, device="cuda", generator=g)]
        xb = xb.half().contiguous()
    else:
        xb = queries_only
    rows = torch.randint(0, M, (Q,), device="cuda", generator=g)
    xq = xb[rows].float() + 0.1 * torch.randn(Q, D, device="cuda", generator=g)
    nq = max(1, Q // 8)
    xq[:nq] = xb[torch.randint(0, M, (nq,), device="cuda", generator=g)].float()
    return xq.half().contiguous(), xb


def reference(xq, xb, k: int, metric: str):
    """(k-th best exact score per query, allowance per query), float64, chunked over the database."""
    import torch
    q = xq.double()
    qn = (q * q).sum(1)
    bmax, best = 0.0, None
    for m0 in range(0, xb.shape[0], 1 << 15):
        b = xb[m0:m0 + (1 << 15)].double()
        bn = (b * b).sum(1)
        bmax = max(bmax, float(bn.max()))
        dot = q @ b.T
        s = (qn[:, None] + bn[None, :] - 2.0 * dot).clamp_min(0) if metric == "l2" else -dot
        v = torch.topk(s, min(k, s.shape[1]), dim=1, largest=False).values
        best = v if best is None else torch.topk(torch.cat([best, v], 1), k, dim=1, largest=False).values
    kth = best[:, k - 1]
    return (kth if metric == "l2" else -kth), 2e-5 * (qn + bmax)


def check_knn(xq, xb, I, Dist, k: int, metric: str = "l2") -> tuple[bool, str]:
    """lib_grid's kNN check against this module's float64 reference, and the results best first."""
    from bench.lib_grid import knn_check
    ok, why = knn_check(xq, xb, I, Dist, k, reference(xq, xb, k, metric), metric)
    if not ok:
        return ok, why
    order = Dist[:, 1:] >= Dist[:, :-1] if metric == "l2" else Dist[:, 1:] <= Dist[:, :-1]
    if k > 1 and not bool(order.all()):
        return False, "results not best first"
    return True, ""
