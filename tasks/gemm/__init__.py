"""bf16 GEMM: C[M, N] = A[M, K] @ B[N, K]^T (both operands K-contiguous, fp32 accumulate, bf16 out)."""
