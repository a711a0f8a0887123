"""Small IR kernels (JSON dicts) shared by test_cli, test_printer and test_cost."""
import copy as _copy


def copy_kernel(n_min: int = 1024) -> dict:
    """Y[N] = X[N] (f32), one CTA of 256 threads per 1024 elements, a blocked float4 register tile."""
    return {
        "name": "copy_f32",
        "arch": "sm_90a",
        "launch": {"grid": ["N / 1024"], "threads": 256},
        "params": [
            {"kind": "tensor", "name": "X", "dtype": "f32", "shape": ["N"], "access": "read"},
            {"kind": "tensor", "name": "Y", "dtype": "f32", "shape": ["N"], "access": "write"},
            {"kind": "scalar", "name": "N", "dtype": "i32", "min": n_min, "divisible_by": 1024},
        ],
        "buffers": [
            {"name": "r", "space": "reg", "dtype": "f32", "shape": [1024], "layout": "blocked", "vec": 4,
             "scope": "cta"},
        ],
        "roles": [
            {"name": "main", "warps": [0, 8], "body": [
                {"op": "ldg", "id": "load", "src": {"buf": "X", "offset": ["bid.x * 1024"], "shape": [1024]},
                 "dst": {"buf": "r"}, "vec_bytes": 16},
                {"op": "stg", "id": "store", "src": {"buf": "r"},
                 "dst": {"buf": "Y", "offset": ["bid.x * 1024"], "shape": [1024]}, "vec_bytes": 16},
            ]},
        ],
    }


def gemm_kernel(stages: int = 4) -> dict:
    """C[M,N] (f32) = A[M,K] * B[N,K]^T (bf16), sm_90a: a TMA producer warpgroup and two wgmma
    consumer warpgroups (64 rows each) over a `stages`-deep pipeline of 128x64 / 256x64 tiles."""
    return {
        "name": "gemm_bf16",
        "arch": "sm_90a",
        "launch": {"grid": ["N / 256", "M / 128"], "threads": 384},
        "consts": {"BM": 128, "BN": 256, "BK": 64},
        "params": [
            {"kind": "tensor", "name": "A", "dtype": "bf16", "shape": ["M", "K"], "access": "read",
             "tma": {"box": [128, 64], "swizzle": "128B"}},
            {"kind": "tensor", "name": "B", "dtype": "bf16", "shape": ["N", "K"], "access": "read",
             "tma": {"box": [256, 64], "swizzle": "128B"}},
            {"kind": "tensor", "name": "C", "dtype": "f32", "shape": ["M", "N"], "access": "write"},
            {"kind": "scalar", "name": "M", "dtype": "i32", "min": 128, "divisible_by": 128},
            {"kind": "scalar", "name": "N", "dtype": "i32", "min": 256, "divisible_by": 256},
            {"kind": "scalar", "name": "K", "dtype": "i32", "min": 64, "divisible_by": 64},
        ],
        "buffers": [
            {"name": "sA", "space": "smem", "dtype": "bf16", "shape": [128, 64], "stages": stages,
             "layout": "swizzle_128B"},
            {"name": "sB", "space": "smem", "dtype": "bf16", "shape": [256, 64], "stages": stages,
             "layout": "swizzle_128B"},
            {"name": "acc", "space": "reg", "dtype": "f32", "shape": [64, 256], "layout": "wgmma_acc",
             "scope": "warpgroup", "role": "consumer"},
        ],
        "pipelines": [
            {"name": "ab", "stages": stages, "mechanism": "tma", "producer": "producer",
             "consumers": ["consumer"], "buffers": ["sA", "sB"]},
        ],
        "roles": [
            {"name": "producer", "warps": [0, 4], "regs": 40, "body": [
                {"op": "if", "cond": "role_tid == 0", "then": [
                    {"op": "for", "var": "k", "stop": "K / BK", "body": [
                        {"op": "pipe_acquire", "pipe": "ab", "iter": "k"},
                        {"op": "copy", "kind": "tma_load", "id": "tmaA",
                         "src": {"buf": "A", "offset": ["bid.y * BM", "k * BK"], "shape": [128, 64]},
                         "dst": {"buf": "sA", "slot": f"k % {stages}"},
                         "barrier": {"name": "ab_full", "index": f"k % {stages}"}},
                        {"op": "copy", "kind": "tma_load", "id": "tmaB",
                         "src": {"buf": "B", "offset": ["bid.x * BN", "k * BK"], "shape": [256, 64]},
                         "dst": {"buf": "sB", "slot": f"k % {stages}"},
                         "barrier": {"name": "ab_full", "index": f"k % {stages}"}},
                    ]},
                ]},
            ]},
            {"name": "consumer", "warps": [4, 8], "regs": 232, "body": [
                {"op": "for", "var": "k", "stop": "K / BK", "body": [
                    {"op": "pipe_wait", "pipe": "ab", "iter": "k"},
                    {"op": "wgmma_fence"},
                    {"op": "wgmma", "id": "mma", "shape": [64, 256, 16],
                     "a": {"buf": "sA", "slot": f"k % {stages}", "offset": ["64 * wg", 0], "shape": [64, 64]},
                     "b": {"buf": "sB", "slot": f"k % {stages}"},
                     "acc": {"buf": "acc"}, "accumulate": "k > 0"},
                    {"op": "wgmma_commit"},
                    {"op": "wgmma_wait", "n": 0},
                    {"op": "pipe_release", "pipe": "ab", "iter": "k"},
                ]},
                {"op": "stg", "id": "store", "src": {"buf": "acc"},
                 "dst": {"buf": "C", "offset": ["bid.y * BM + 64 * wg", "bid.x * BN"], "shape": [64, 256]},
                 "vec_bytes": 8},
            ]},
        ],
    }


def softmax_kernel() -> dict:
    """Row softmax of X[R, 1024] f32, one row per CTA: map/reduce work for the SIMT/SFU terms."""
    return {
        "name": "softmax_rows",
        "arch": "sm_80",
        "launch": {"grid": ["R"], "threads": 256},
        "params": [
            {"kind": "tensor", "name": "X", "dtype": "f32", "shape": ["R", 1024]},
            {"kind": "tensor", "name": "Y", "dtype": "f32", "shape": ["R", 1024], "access": "write"},
            {"kind": "scalar", "name": "R", "dtype": "i32", "min": 1},
        ],
        "buffers": [
            {"name": "x", "space": "reg", "dtype": "f32", "shape": [1, 1024], "layout": "blocked", "vec": 4,
             "scope": "cta"},
            {"name": "m", "space": "reg", "dtype": "f32", "shape": [1, 1], "layout": "blocked", "scope": "cta"},
            {"name": "s", "space": "reg", "dtype": "f32", "shape": [1, 1], "layout": "blocked", "scope": "cta"},
        ],
        "roles": [
            {"name": "main", "warps": [0, 8], "body": [
                {"op": "ldg", "src": {"buf": "X", "offset": ["bid.x", 0], "shape": [1, 1024]}, "dst": {"buf": "x"}},
                {"op": "reduce", "kind": "max", "src": {"buf": "x"}, "dst": {"buf": "m"}, "axis": 1},
                {"op": "map", "dst": {"buf": "x"}, "expr": "exp2((x - m) * 1.4426950408889634)"},
                {"op": "reduce", "kind": "sum", "src": {"buf": "x"}, "dst": {"buf": "s"}, "axis": 1},
                {"op": "map", "dst": {"buf": "x"}, "expr": "x * recip(s)"},
                {"op": "stg", "src": {"buf": "x"}, "dst": {"buf": "Y", "offset": ["bid.x", 0], "shape": [1, 1024]}},
            ]},
        ],
    }


def clone(d: dict) -> dict:
    return _copy.deepcopy(d)
