"""Exact brute-force kNN: for each query in Xq [Q, 128] return the k = 10 nearest rows of the database
Xb [M, 128] (fp16 inputs): indices I [Q, k] (i32) and distances Dist [Q, k] (f32, best first).
Metric L2 (squared Euclidean distance, smallest first); tasks/knn_ip is the inner-product variant
(largest first).

Correctness is recall@k = 1.0 against a float64 reference, allowing ties: a returned index is right
when its exact float64 distance is no worse than the reference's k-th distance plus a rounding
allowance `tol` (fp32 accumulation of the ||q||^2 + ||x||^2 - 2 q.x expansion: 2e-5 times the
query's scale ||q||^2 + max ||x||^2; for inner product 2e-5 * ||q|| * max ||x||); indices must be
in range and distinct per row, and every returned distance within `tol` of that index's exact
distance. Inputs are clustered (realistic nearest neighbours are close) and contain exact duplicate
database rows (exact ties: either index is right) and queries equal to database rows (distance 0).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from tasks.base import BaseTask, TensorSpec, Tolerance

D = 128
K_NN = 10
RANK_TOL = 2e-5   # fp32 accumulation allowance relative to the query's score scale


def topk_reference(xq: np.ndarray, xb: np.ndarray, k: int, metric: str, chunk: int = 1 << 16):
    """(indices, scores) of the k best database rows per query, float64, chunked over the database."""
    Q = xq.shape[0]
    best_v = np.full((Q, 0), 0.0)
    best_i = np.zeros((Q, 0), dtype=np.int64)
    q = xq.astype(np.float64)
    qn = (q * q).sum(1)[:, None]
    for m0 in range(0, xb.shape[0], chunk):
        b = xb[m0:m0 + chunk].astype(np.float64)
        s = q @ b.T
        s = np.maximum(qn + (b * b).sum(1)[None, :] - 2.0 * s, 0.0) if metric == "l2" else -s
        v = np.concatenate([best_v, s], axis=1)
        i = np.concatenate([best_i, np.broadcast_to(np.arange(m0, m0 + b.shape[0]), s.shape)], axis=1)
        kk = min(k, v.shape[1])
        part = np.argpartition(v, kk - 1, axis=1)[:, :kk]
        best_v = np.take_along_axis(v, part, 1)
        best_i = np.take_along_axis(i, part, 1)
    order = np.argsort(best_v, axis=1, kind="stable")
    v = np.take_along_axis(best_v, order, 1)
    i = np.take_along_axis(best_i, order, 1)
    return i, (v if metric == "l2" else -v)


class KnnTask(BaseTask):
    name = "knn"
    metric = "l2"
    k = K_NN
    d = D
    shapes = [{"Q": 1, "M": 1000}, {"Q": 77, "M": 4099}, {"Q": 130, "M": 20000}, {"Q": 300, "M": 65}]
    bench_shapes = [{"Q": 1024, "M": 1 << 20}, {"Q": 16, "M": 10_000_000}, {"Q": 10000, "M": 1_000_000}]
    # reported by the generic check; the task's own check (below) decides
    tolerance = Tolerance(rel_rmse=1e-4)

    def inputs(self, shape):
        return [TensorSpec("Xq", (shape["Q"], self.d), "f16"), TensorSpec("Xb", (shape["M"], self.d), "f16")]

    def outputs(self, shape):
        return [TensorSpec("I", (shape["Q"], self.k), "i32"), TensorSpec("Dist", (shape["Q"], self.k), "f32")]

    def workspace(self, shape):
        """The split-database path's scratch (tasks/knn/programs.py): partial lists PV/PI, per-query-
        tile counters WT and per-query shared bounds TH, zeroed by the evaluator and left zeroed by the
        kernel."""
        from tasks.knn.programs import WS_ROWS, WS_TILES
        return [TensorSpec("PV", (WS_ROWS, self.k), "f32"), TensorSpec("PI", (WS_ROWS, self.k), "i32"),
                TensorSpec("WT", (WS_TILES, 1), "i32"), TensorSpec("TH", (WS_ROWS, 1), "i32")]

    def make_inputs(self, shape, seed: int, rng: Optional[np.random.Generator] = None):
        rng = self.rng_for(seed, rng)
        Q, M, d = shape["Q"], shape["M"], self.d
        centers = rng.standard_normal((max(1, M // 64), d), dtype=np.float32)
        xb = centers[rng.integers(0, centers.shape[0], M)] + 0.3 * rng.standard_normal((M, d), dtype=np.float32)
        dup = rng.choice(M, size=max(1, M // 50), replace=False)            # exact ties
        xb[dup] = xb[rng.integers(0, M, dup.size)]
        xq = xb[rng.integers(0, M, Q)] + 0.1 * rng.standard_normal((Q, d), dtype=np.float32)
        xq[: max(1, Q // 8)] = xb[rng.integers(0, M, max(1, Q // 8))]       # a query on a database row
        return {"Xq": xq.astype(np.float16).astype(np.float32), "Xb": xb.astype(np.float16).astype(np.float32)}

    def reference(self, inputs, shape):
        i, v = topk_reference(inputs["Xq"], inputs["Xb"], self.k, self.metric)
        return {"I": i.astype(np.float64), "Dist": v}

    # ---- the task's own check (gpu_backend.checks.run_checks calls it)
    def exact_scores(self, xq, xb, idx):
        q = xq.astype(np.float64)[:, None, :]
        b = xb.astype(np.float64)[idx]
        return ((q - b) ** 2).sum(-1) if self.metric == "l2" else (q * b).sum(-1)

    def rank_tol(self, xq, xb):
        qn = (xq.astype(np.float64) ** 2).sum(1)
        bn = float((xb.astype(np.float64) ** 2).sum(1).max())
        return RANK_TOL * ((qn + bn) if self.metric == "l2" else np.sqrt(qn * bn))

    def check(self, outputs: dict, refs: dict, inputs: dict, shape: dict) -> list:
        """outputs: host values (I as int, Dist as float). Returns gpu_backend.checks.OutputCheck list."""
        from gpu_backend.checks import OutputCheck
        I = np.asarray(outputs["I"]).astype(np.int64)
        Dv = np.asarray(outputs["Dist"], dtype=np.float64)
        M, k = shape["M"], self.k
        out = []
        bad = (I < 0) | (I >= M)
        if bad.any():
            r = np.argwhere(bad)[0]
            return [OutputCheck(name="I", ok=False, error_class="wrong_result", elements=I.size,
                                first_bad=[int(x) for x in r],
                                message=f"I: {int(bad.sum())} indices outside [0, {M}) (first at {list(map(int, r))}: {I[tuple(r)]})")]
        srt = np.sort(I, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if dup.any():
            q = int(np.flatnonzero(dup)[0])
            return [OutputCheck(name="I", ok=False, error_class="wrong_result", elements=I.size, first_bad=[q, 0],
                                message=f"I: query {q} returns an index twice: {I[q].tolist()}")]
        ex = self.exact_scores(inputs["Xq"], inputs["Xb"], I)
        tol = self.rank_tol(inputs["Xq"], inputs["Xb"])[:, None]
        kth = refs["Dist"][:, k - 1:k]
        miss = ex > kth + tol if self.metric == "l2" else ex < kth - tol
        recall = 1.0 - miss.sum() / miss.size
        if miss.any():
            q, j = (int(x) for x in np.argwhere(miss)[0])
            out.append(OutputCheck(name="I", ok=False, error_class="wrong_result", elements=I.size, first_bad=[q, j],
                                   rel_rmse=1.0 - recall,
                                   message=f"I: recall@{k} = {recall:.6f} < 1 (ties allowed): query {q} returns {I[q, j]} "
                                           f"at exact distance {ex[q, j]:.6g}, the reference's k-th is {kth[q, 0]:.6g} "
                                           f"(allowance {tol[q, 0]:.3g})"))
        else:
            out.append(OutputCheck(name="I", ok=True, elements=I.size, rel_rmse=0.0))
        err = np.abs(Dv - ex)
        worst = float(err.max()) if err.size else 0.0
        over = err > tol
        if over.any():
            q, j = (int(x) for x in np.argwhere(over)[0])
            out.append(OutputCheck(name="Dist", ok=False, error_class="wrong_result", elements=Dv.size,
                                   first_bad=[q, j], max_abs=worst,
                                   message=f"Dist: query {q} slot {j} returns {Dv[q, j]:.6g}, the exact distance of "
                                           f"index {I[q, j]} is {ex[q, j]:.6g} (allowance {tol[q, 0]:.3g})"))
        else:
            rel = float(np.linalg.norm(Dv - ex) / max(np.linalg.norm(ex), 1e-300))
            out.append(OutputCheck(name="Dist", ok=True, elements=Dv.size, rel_rmse=rel, max_abs=worst))
        return out

    def flops(self, shape):
        return 2.0 * shape["Q"] * shape["M"] * self.d

    def bytes(self, shape):
        return 2.0 * (shape["Q"] + shape["M"]) * self.d + 8.0 * shape["Q"] * self.k


TASK = KnnTask()
