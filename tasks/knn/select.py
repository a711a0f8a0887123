"""The selection kernel of the large-k kNN (k up to 1024): one CTA per (row segment, query row) of a
distance block that tasks/knn/dist_tile.py wrote, picking the segment's k best with the block-wide
`row_select` (radix selection in shared memory, cake::row_select).

Two uses of the same builder:
- `merge=False`: scores of S [R, NP] (the fp32 dot products of a query chunk against the database):
  l2 scores QN[r] + XN[j] - 2 S[r, j] (squared distances), ip scores S[r, j]; segment s of row r covers
  database rows [s SL, min((s + 1) SL, M)). Its k best go to OV / OI [R, OC] at column s k (OC = SEG k:
  partial lists of a split row; SEG = 1: the results themselves).
- `merge=True`: the SEG partial lists of a row (CV / CI [R, CC], CC = SEG k, already scored, worst-padded
  entries with index -1) re-selected into OV / OI [R, k]: exact, a top-k of top-k lists of a partition.
"""
from cake_ir.builder import KernelBuilder, tile
from cake_ir.nodes import SELECT_SCRATCH_WORDS

SELECT_THREADS = 512   # enough loads in flight per CTA to stream a long row; the histogram's atomics spread


def knn_select(k: int, metric: str = "l2", merge: bool = False, threads: int = SELECT_THREADS,
               arch: str = "sm_80"):
    l2 = metric == "l2"
    name = f"knn_select_{'merge_' if merge else ''}{metric}_k{k}"
    kb = KernelBuilder(name, arch=arch, grid=["SEG", "R"], threads=threads,
                       note=f"exact top-{k} of each query row's " + ("partial lists" if merge else "distance segments"))
    kb.const(KK=k)
    kb.scalar("R", min=1)
    kb.scalar("SEG", min=1)
    kb.scalar("OC", min=k)
    if merge:
        kb.scalar("CC", min=k)
        kb.tensor("CV", "f32", ["R", "CC"])
        kb.tensor("CI", "i32", ["R", "CC"])
    else:
        kb.scalar("M", min=k)
        kb.scalar("SL", min=1)
        kb.tensor("S", "f32", ["R", "cdiv(M, 128) * 128"])
        if l2:
            kb.tensor("XN", "f32", [1, "cdiv(M, 128) * 128"])
            kb.tensor("QN", "f32", [1, "cdiv(R, 128) * 128"])
    kb.tensor("OV", "f32", ["R", "OC"], access="write")
    kb.tensor("OI", "i32", ["R", "OC"], access="write")
    kb.buffer("sel", "smem", "i32", [SELECT_SCRATCH_WORDS])
    kind = "max" if metric == "ip" else "min"   # (the partial lists keep the metric's order)
    with kb.role("main", warps=(0, threads // 32)) as r:
        out = dict(vals=tile("OV", ["bid.y", "bid.x * KK"], [1, k]), idx=tile("OI", ["bid.y", "bid.x * KK"], [1, k]),
                   scratch=tile("sel"))
        if merge:
            r.row_select(kind, k, tile("CV", ["bid.y", 0], [1, 1]), "CC", src_idx=tile("CI", ["bid.y", 0], [1, 1]),
                         id="select_merge", **out)
        else:
            r.let("c0", "bid.x * SL")
            opt = dict(scale=-2.0, row_bias=tile("QN", [0, "bid.y"], [1, 1]),
                       col_bias=tile("XN", [0, "c0"], [1, 1])) if l2 else {}
            r.row_select(kind, k, tile("S", ["bid.y", "c0"], [1, 1]), "max(min(SL, M - c0), 0)", col="c0",
                         id="select_rows", **opt, **out)
    return kb.build()
