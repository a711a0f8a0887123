"""Exact brute-force kNN by inner product (maximum inner product search), top-k fused into the GEMM."""
