"""E-SORT-01: a counting-sort op (`bucket_offsets`, `bucket_place`, `segment_sums`: cake::bucket_offsets,
bucket_place, segment_sums) with operands of the wrong kind, or `bucket_offsets` run by part of the CTA.

- `bucket_offsets`: counts a global f32 or i32 tile; dst a global i32 tile the kernel writes; scratch an
  smem buffer of at least 32 4-byte words; executed by every thread of the CTA (its role starts at warp 0 and
  spans the launch's threads) and under no `if` (its barriers are CTA-wide);
- `bucket_place`: keys, cursor, ids and sorted_keys global i32 tiles; cursor, ids and sorted_keys of tensors
  the kernel writes;
- `segment_sums`: src a tile [.., D] of a contiguous 2-d global f16 tensor with rows of D (the tile's width),
  D a multiple of 8 and at most 8 x the role's threads; dst a tile of a contiguous 2-d global f32 tensor with
  rows of D that the kernel writes; ids and keys global i32 tiles.

What goes wrong on hardware: an offsets scan run by part of the CTA deadlocks on its __syncthreads or leaves
buckets unscanned (their slots collide: rows lost or written twice); a scratch of fewer words than warps
overwrites the smem after it; a cursor the kernel may not write faults or races; a src whose rows are not D
wide is read at the wrong rows (the op's row pitch is D), and D not a multiple of 8 misaligns its 16-byte loads.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import BucketOffsets, BucketPlace, SegmentSums

from ._cpy_util import const_value
from ._cta_op_util import global_tile, smem_words, whole_cta_problems

CODE = "E-SORT-01"
TITLE = "counting-sort ops: global i32 slots and cursors, f16 rows of D into f32 sums, offsets by the whole CTA"
STAGE = "source"


def _rows_of(k, ref, d: int) -> bool:
    """The tile's tensor is 2-d and contiguous with rows of d elements."""
    p = resolve_tile(k, ref).param
    return p is not None and len(p.shape) == 2 and not p.strides and const_value(k, p.shape[-1]) == d


def _operands(ctx, k, n, p, spec):
    for f, dts, w in spec:
        ref = getattr(n, f)
        if not global_tile(k, ref, dts, w):
            yield ctx.report(f"{p}/{f}/buf", f"{n.op}'s {f} {ref.buf!r} must be a tile of a global "
                             f"{' or '.join(dts)} tensor" + (" the kernel writes" if w else ""),
                             legal=[f"global {dt}" for dt in dts])


def _offsets(ctx, k, s):
    n, p = s.node, s.path
    yield from whole_cta_problems(ctx, s, "bucket_offsets")
    yield from _operands(ctx, k, n, p, (("counts", ("f32", "i32"), False), ("dst", ("i32",), True)))
    if smem_words(k, n.scratch) < 32:
        yield ctx.report(f"{p}/scratch/buf", "bucket_offsets' scratch must be an smem buffer of at least 32 4-byte "
                         "words (one a warp)", legal=["smem i32 [32]"])


def _segment_sums(ctx, k, s):
    n, p = s.node, s.path
    yield from _operands(ctx, k, n, p, (("src", ("f16",), False), ("ids", ("i32",), False),
                                        ("keys", ("i32",), False), ("dst", ("f32",), True)))
    src = resolve_tile(k, n.src)
    d = src.shape[-1] if src.shape else 0
    t = s.role.threads if s.role is not None else k.launch.threads
    if d % 8 or not 8 <= d <= 8 * t:
        yield ctx.report(f"{p}/src/shape", f"segment_sums' width D (the src tile's last dim) is a multiple of 8 "
                         f"up to 8 x the role's {t} threads, not {d}", legal=[f"8 .. {8 * t}, a multiple of 8"])
        return
    for f in ("src", "dst"):
        if global_tile(k, getattr(n, f), ("f16",) if f == "src" else ("f32",)) and not _rows_of(k, getattr(n, f), d):
            yield ctx.report(f"{p}/{f}/buf", f"segment_sums' {f} must be a contiguous 2-d tensor with rows of "
                             f"D = {d} elements (the op's row pitch)", legal=[f"[rows, {d}]"])


def check(ctx):
    k = ctx.kernel
    for s in ctx.sites:
        n, p = s.node, s.path
        if isinstance(n, BucketOffsets):
            yield from _offsets(ctx, k, s)
        elif isinstance(n, BucketPlace):
            yield from _operands(ctx, k, n, p, (("keys", ("i32",), False), ("cursor", ("i32",), True),
                                                ("ids", ("i32",), True), ("sorted_keys", ("i32",), True)))
        elif isinstance(n, SegmentSums):
            yield from _segment_sums(ctx, k, s)
