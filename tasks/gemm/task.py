"""bf16 GEMM task: C[M, N] = A[M, K] @ B[N, K]^T, fp32 accumulation, bf16 out; rel RMSE <= 1e-2.

Shapes: the seed kernels require M % 128 == 0, N % 256 == 0 (the wgmma seed; 128 for the mma.sync
seed), K % 64 == 0 and K >= 128 (the mma.sync seed's 4-stage prefill with BK=32), so every shape here
is legal for both seeds. They still vary the tile counts (odd numbers of M, N and K tiles, K not a
power of two) so a kernel that silently assumes a square or power-of-two problem fails. When a kernel
with predicated edges exists, add shapes that are not tile multiples (e.g. M=1000) here.

Inputs: N(0, 1) values rounded to bf16, with edge rows: rows of A scaled by 16 (large magnitude),
rows scaled by 1/64 (small), a column block of B with a constant offset (correlated sums), and exact
+-1 entries. Never all zeros.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from gpu_backend.memory import round_to_bf16
from tasks.base import BaseTask, TensorSpec, Tolerance


class GemmTask(BaseTask):
    name = "gemm"
    shapes = [
        {"M": 128, "N": 256, "K": 128},
        {"M": 384, "N": 512, "K": 192},
        {"M": 640, "N": 768, "K": 320},
        {"M": 256, "N": 1280, "K": 1024},
    ]
    bench_shapes = [{"M": 4096, "N": 4096, "K": 4096}]
    tolerance = Tolerance(rel_rmse=1e-2)

    def inputs(self, shape):
        M, N, K = shape["M"], shape["N"], shape["K"]
        return [TensorSpec("A", (M, K), "bf16"), TensorSpec("B", (N, K), "bf16")]

    def outputs(self, shape):
        return [TensorSpec("C", (shape["M"], shape["N"]), "bf16")]

    def make_inputs(self, shape, seed: int, rng: Optional[np.random.Generator] = None):
        rng = self.rng_for(seed, rng)
        M, N, K = shape["M"], shape["N"], shape["K"]
        A = rng.standard_normal((M, K), dtype=np.float32)
        B = rng.standard_normal((N, K), dtype=np.float32)
        big = rng.choice(M, size=max(1, M // 16), replace=False)
        small = rng.choice(M, size=max(1, M // 16), replace=False)
        A[big] *= 16.0
        A[small] *= 1.0 / 64
        c0 = int(rng.integers(0, max(1, N - 8)))
        B[c0:c0 + 8] += 2.0
        A[rng.integers(0, M), :] = np.where(rng.random(K) < 0.5, -1.0, 1.0)
        return {"A": round_to_bf16(A), "B": round_to_bf16(B)}

    def reference(self, inputs, shape):
        A = inputs["A"].astype(np.float64)
        B = inputs["B"].astype(np.float64)
        return {"C": A @ B.T}

    def flops(self, shape):
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes(self, shape):
        M, N, K = shape["M"], shape["N"], shape["K"]
        return 2.0 * (M * K + N * K + M * N)


TASK = GemmTask()
