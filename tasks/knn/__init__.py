"""Exact brute-force k-nearest neighbours (L2 or inner product) with the top-k fused into the GEMM."""
