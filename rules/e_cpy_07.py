"""E-CPY-07: a bulk copy (`bulk_load`) moves whole 16-byte-aligned rows into plain rows, on an mbarrier,
unpredicated.

`bulk_load` issues one `cp.async.bulk` per tile row (the last dim's contiguous run), or one for the
whole tile when its rows are one run in both memories (the tile spans whole rows of its smem buffer
and the global row stride equals the buffer's padded pitch; `cake_ir.analysis.tiles.bulk_rows`). The
instruction requires the byte count to be a multiple of 16 and both the global and the shared address
of every copy to be 16-byte aligned: the rows (or the run) must be a multiple of 16 bytes, the base
pointer (`align`) and the smem buffer aligned, the innermost offset a multiple of 16 bytes and, for a
copy per row, every row stride (global: from the param's shape/strides facts; smem: the padded row
pitch) and the stage stride too. The rows
land as written, so the smem buffer must be `row_major` (a swizzled layout would need the tensor
form, `tma_load`). The copy completes only as transaction bytes on `barrier` (an mbarrier; announce
the bytes with `mbar_expect_tx`, E-SYN-03). It has no predication: `oob` must be `none`, and the
tile must be provably in bounds (E-CPY-03); clamp the index, or use `cp_async` with `zfill`.

What goes wrong on hardware: a misaligned address or size faults the copy (an illegal-instruction /
misaligned-address error kills the context); without a barrier nothing ever signals that the rows
landed.
"""
from cake_ir.analysis.tiles import bulk_rows, resolve_tile
from cake_ir.nodes import Copy, MBarrier

from ._cpy_util import alignment_problem, tile_shape

CODE = "E-CPY-07"
TITLE = "bulk_load rows: 16-byte size and alignment, row_major dst, mbarrier, no predication"
STAGE = "expanded"


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, Copy) or n.kind != "bulk_load":
            continue
        if n.barrier is None:
            yield ctx.report(s.path, "bulk_load completes only as transaction bytes on an mbarrier: it needs a "
                             "`barrier` (announce its bytes there with mbar_expect_tx)")
        elif not isinstance(k.barrier(n.barrier.name), MBarrier):
            yield ctx.report(f"{s.path}/barrier/name", f"bulk_load signals {n.barrier.name!r}, which is not an "
                             "mbarrier", legal=[b.name for b in k.barriers if isinstance(b, MBarrier)])
        if n.oob != "none":
            yield ctx.report(f"{s.path}/oob", "bulk_load has no predication: it copies whole rows, so the tile must "
                             "be provably in bounds (clamp the index, or use cp_async with oob zfill)",
                             legal=["none"], fix=[{"op": "replace", "path": f"{s.path}/oob", "value": "none"}])
        src, dst = resolve_tile(k, n.src), resolve_tile(k, n.dst)
        if src.param is None or dst.buffer is None or dst.buffer.space != "smem":
            continue  # E-CPY-05 / E-CPY-06
        if dst.buffer.layout != "row_major":
            yield ctx.report(f"{s.path}/dst/buf", f"bulk_load writes plain rows; {dst.ref.buf!r} is "
                             f"{dst.buffer.layout} (a swizzled tile needs the tensor form, tma_load)",
                             legal=["row_major"])
            continue
        sshape, dshape = tile_shape(k, src, dst), tile_shape(k, dst, src)
        plan = bulk_rows(k, n.src, n.dst)
        if sshape is None or dshape is None or plan is None:
            continue
        if plan.copy_bytes % 16:
            what = (f"its rows are one run of {plan.copy_bytes} bytes" if plan.merged else
                    f"its rows are {plan.copy_bytes} bytes")
            yield ctx.report(f"{s.path}/dst", f"bulk_load: {what}; cp.async.bulk moves a multiple of 16 bytes")
            continue
        env = ctx.env(s)
        for f, t, shp in (("src", src, sshape), ("dst", dst, dshape)):
            if plan.merged:     # one copy: only its start must be aligned
                shp = (1,) * (len(shp) - 1) + shp[-1:]
            pr = alignment_problem(env, t, shp, 16)
            if pr is not None:
                sub, msg = pr
                yield ctx.report(f"{s.path}/{f}{sub}", f"bulk_load rows must start 16-byte aligned: {msg}")
                break
