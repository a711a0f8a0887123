"""E-MMA-01: mma_sync shape / dtype combination is not a legal mma.sync instruction.

CAKE lowers `mma_sync` to `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`, or to
`m16n8k8 ... tf32` for f32 operands. Operands a and b must have the same 16-bit float type (or both
be f32 for tf32) and the accumulator c must be f32.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import MmaSync

CODE = "E-MMA-01"
TITLE = "mma_sync shape and dtypes"
STAGE = "source"

LEGAL = {"bf16": (16, 8, 16), "f16": (16, 8, 16), "f32": (16, 8, 8)}


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, MmaSync):
            continue
        a, b, c = (resolve_tile(k, r) for r in (n.a, n.b, n.c))
        shape = tuple(n.shape)
        if a.known and a.dtype not in LEGAL:
            yield ctx.report(f"{s.path}/a", f"mma_sync operand a is {a.dtype}; mma.sync takes bf16/f16 (m16n8k16) "
                             "or f32 as tf32 (m16n8k8)", legal=sorted(LEGAL))
            continue
        if a.known and b.known and a.dtype != b.dtype:
            yield ctx.report(f"{s.path}/b", f"mma_sync operands differ in type: a is {a.dtype}, b is {b.dtype}",
                             legal=[a.dtype])
            continue
        if c.known and c.dtype != "f32":
            yield ctx.report(f"{s.path}/c", f"mma_sync accumulator c is {c.dtype}; CAKE accumulates in f32",
                             legal=["f32"])
        if a.known and shape != LEGAL[a.dtype]:
            want = list(LEGAL[a.dtype])
            yield ctx.report(f"{s.path}/shape", f"mma_sync shape {list(shape)} is not legal for {a.dtype} operands",
                             legal=[want], fix=[{"op": "replace", "path": f"{s.path}/shape", "value": want}])
        elif not a.known and shape not in set(LEGAL.values()):
            yield ctx.report(f"{s.path}/shape", f"mma_sync shape {list(shape)} is not m16n8k16 or m16n8k8",
                             legal=[[16, 8, 16], [16, 8, 8]])
