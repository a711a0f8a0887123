"""E-ATOM-01: scatter_add / red_add operands are in the wrong memory space or type.

- `scatter_add`: `index` is an i32 `mma_rows` tile [R, 1] (one target row per src row); `src` (when
  present) an smem or global tile of R rows with a multiple of 4 columns (a row's quad splits them);
  `dst` an smem or global f32/i32 tile with src's column count (1 for counts).
- `red_add`: `src` is a 2-d smem tile or an accumulator register tile (`mma_acc` / `wgmma_acc`: each lane
  adds what it holds), `dst` a global f32/i32 tensor tile of the same shape and dtype.

What goes wrong on hardware: red.add exists for f32/s32 in shared and global memory only; another
type or a register destination has no atomic, and a mismatched shape adds into the wrong elements.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import RedAdd, ScatterAdd

CODE = "E-ATOM-01"
TITLE = "scatter_add / red_add operand spaces and dtypes"
STAGE = "source"

ATOMIC = ("f32", "i32")


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if isinstance(n, ScatterAdd):
            ib = resolve_tile(k, n.index).buffer
            if ib is None or ib.layout != "mma_rows" or ib.dtype != "i32" or ib.shape[-1] != 1:
                yield ctx.report(f"{p}/index/buf", "scatter_add takes target rows from an i32 mma_rows [R, 1] tile",
                                 legal=["mma_rows i32 [R, 1]"])
                continue
            dst = resolve_tile(k, n.dst)
            if dst.space not in ("smem", "global") or dst.dtype not in ATOMIC:
                yield ctx.report(f"{p}/dst/buf", f"scatter_add adds into an smem or global f32/i32 tile; "
                                 f"{n.dst.buf!r} is {dst.space} {dst.dtype}", legal=list(ATOMIC))
                continue
            cols = dst.shape[-1] if dst.shape else None
            if n.src is not None:
                src = resolve_tile(k, n.src)
                if src.space not in ("smem", "global"):
                    yield ctx.report(f"{p}/src/buf", f"scatter_add reads src rows from smem or global memory; "
                                     f"{n.src.buf!r} is {src.space}", legal=["smem", "global"])
                elif src.shape and (src.shape[-1] % 4 or (cols is not None and src.shape[-1] != cols)
                                    or src.shape[0] != ib.shape[0]):
                    yield ctx.report(f"{p}/src/shape", f"src tile {list(src.shape)} must have {ib.shape[0]} rows and "
                                     f"{cols} columns (a multiple of 4)", legal=[[ib.shape[0], cols]])
        elif isinstance(n, RedAdd):
            src, dst = resolve_tile(k, n.src), resolve_tile(k, n.dst)
            acc = src.space == "reg" and src.buffer is not None and src.buffer.layout in ("mma_acc", "wgmma_acc")
            if (src.space != "smem" and not acc) or len(src.shape) != 2:
                yield ctx.report(f"{p}/src/buf", f"red_add reads a 2-d smem tile or an accumulator register tile; "
                                 f"{n.src.buf!r} is {src.space}"
                                 + (f" {src.buffer.layout}" if src.buffer is not None and src.space == "reg" else ""),
                                 legal=["smem", "reg mma_acc", "reg wgmma_acc"])
            elif dst.space != "global" or dst.dtype not in ATOMIC or dst.dtype != src.dtype:
                yield ctx.report(f"{p}/dst/buf", f"red_add adds into a global tile of src's type ({src.dtype}, one of "
                                 f"{list(ATOMIC)}); {n.dst.buf!r} is {dst.space} {dst.dtype}", legal=[src.dtype])
            elif dst.shape and tuple(dst.shape) != tuple(src.shape):
                yield ctx.report(f"{p}/dst/shape", f"red_add tiles differ: src {list(src.shape)}, dst {list(dst.shape)}",
                                 legal=[list(src.shape)])
