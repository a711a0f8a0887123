"""E-HOT-01: onehot operands have the wrong space, layout, dtype or shape.

- `dst` is an `mma_a` register fragment [16 i, 16 j] of f16 or bf16, at most 256 rows (the one-hot
  factor of a tensor-core scatter-add: rows are target rows, columns source rows; the lowering
  compares targets relative to a row as f16, exact for row offsets below 256);
- `index` is an smem i32 vector ([j], [j, 1] or [1, j]) with exactly one target per fragment column.

What goes wrong on hardware: the lowering packs two 16-bit ones per register in the m16n8k16 A
order and reads one i32 per column from shared memory; another layout puts the ones at the wrong
(row, column) pairs, a register index vector does not exist at the addresses read, and a short
vector reads past its end.
"""
from math import prod

from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import OneHot

CODE = "E-HOT-01"
TITLE = "onehot operand spaces, layouts, dtypes and shapes"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, OneHot):
            continue
        db = resolve_tile(k, n.dst).buffer
        if db is None or db.space != "reg" or db.layout != "mma_a" or db.dtype not in ("f16", "bf16"):
            what = "missing" if db is None else f"{db.space} {db.layout} {db.dtype}"
            yield ctx.report(f"{p}/dst/buf", f"onehot builds an f16 / bf16 mma_a register fragment; "
                             f"{n.dst.buf!r} is {what}", legal=["reg mma_a f16", "reg mma_a bf16"])
            continue
        if len(db.shape) != 2 or db.shape[0] % 16 or db.shape[1] % 16 or db.shape[0] > 256:
            yield ctx.report(f"{p}/dst/buf", f"onehot fragments are [16 i, 16 j] with 16 i <= 256, not "
                             f"{list(db.shape)}", legal=["[16 i, 16 j], 16 i <= 256"])
            continue
        idx = resolve_tile(k, n.index)
        cols = db.shape[1]
        if idx.space != "smem" or idx.dtype != "i32":
            yield ctx.report(f"{p}/index/buf", f"onehot reads its targets from an smem i32 vector; {n.index.buf!r} "
                             f"is {idx.space} {idx.dtype}", legal=["smem i32"])
        elif not idx.shape or prod(idx.shape) != cols or sum(d != 1 for d in idx.shape) > 1:
            yield ctx.report(f"{p}/index/shape", f"onehot needs one target per fragment column: a vector of {cols} "
                             f"(the tile is {list(idx.shape) if idx.shape else '?'})",
                             legal=[[cols], [cols, 1], [1, cols]])
