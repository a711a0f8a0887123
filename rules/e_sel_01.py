"""E-SEL-01: a `row_select` (the block-wide exact top-k of a row segment, cake::row_select) with operands
of the wrong kind, or run by part of the CTA.

- `src` is a tile of a 2-d global f32 tensor; `src_idx` (optional) of a 2-d global i32 tensor; the
  biases (optional) of global f32 tensors;
- `vals` / `idx` are global f32 / i32 tiles [1, k] of tensors the kernel may write;
- `scratch` is an smem buffer of 4-byte words, at least SELECT_SCRATCH_WORDS of them (the histogram,
  the candidates, the control words);
- every thread of the CTA executes it: its role starts at warp 0 and spans the launch's threads, and it
  sits under no `if` (its barriers are CTA-wide).

What goes wrong on hardware: a scratch buffer too small overwrites the smem after it (another buffer's
data, or out of the CTA's window: a fault); a role that is part of the CTA, or a call under a condition
some threads skip, deadlocks on the selection's __syncthreads or counts a partial histogram, so the
selected k-th key is wrong; an output tile that is not [1, k] receives k entries past its end.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import SELECT_SCRATCH_WORDS, RowSelect

from ._cta_op_util import global_tile, smem_words, whole_cta_problems

CODE = "E-SEL-01"
TITLE = "row_select operands: global f32 scores, [1, k] outputs, enough smem scratch, the whole CTA"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if not isinstance(n, RowSelect):
            continue
        yield from whole_cta_problems(ctx, s, "row_select")
        for f, dt, w in (("src", "f32", False), ("src_idx", "i32", False), ("row_bias", "f32", False),
                         ("col_bias", "f32", False), ("vals", "f32", True), ("idx", "i32", True)):
            ref = getattr(n, f)
            if ref is not None and not global_tile(k, ref, (dt,), w, ndim=2):
                yield ctx.report(f"{p}/{f}/buf", f"{f} {ref.buf!r} must be a tile of a 2-d global {dt} tensor"
                                 + (" the kernel writes" if w else ""), legal=[f"global {dt}"])
        for f in ("vals", "idx"):
            t = resolve_tile(k, getattr(n, f))
            if t.param is not None and list(t.shape) != [1, n.k]:
                yield ctx.report(f"{p}/{f}/shape", f"{f} receives the k = {n.k} best: a tile [1, {n.k}], not "
                                 f"{list(t.shape)}", legal=[[1, n.k]])
        if smem_words(k, n.scratch) < SELECT_SCRATCH_WORDS:
            yield ctx.report(f"{p}/scratch/buf", f"row_select's scratch must be an smem buffer of at least "
                             f"{SELECT_SCRATCH_WORDS} 4-byte words", legal=[f"smem i32 [{SELECT_SCRATCH_WORDS}]"])
