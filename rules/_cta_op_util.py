"""Checks shared by the rules of block-wide runtime ops (row_select: E-SEL-01; the counting-sort ops:
E-SORT-01): operands that are global tiles of given dtypes, an smem scratch of enough 4-byte words, and a
call by every thread of the CTA outside any `if`."""
from __future__ import annotations

from typing import Iterator, Optional

from cake_ir.analysis.tiles import resolve_tile
from cake_ir.dtypes import SIZE


def global_tile(k, ref, dtypes: tuple, write: bool = False, ndim: Optional[int] = None) -> bool:
    """`ref` is a tile of a global tensor of one of `dtypes` (with `ndim` dims, where given) that the kernel
    may write, where `write`."""
    t = resolve_tile(k, ref)
    if t.param is None or t.space != "global" or t.dtype not in dtypes:
        return False
    if ndim is not None and len(t.param.shape) != ndim:
        return False
    return not write or t.param.access in ("write", "readwrite")


def smem_words(k, ref) -> int:
    """4-byte words of the smem buffer `ref` names (0: not an smem buffer of 4-byte elements)."""
    b = k.buffer(ref.buf)
    if b is None or b.space != "smem" or SIZE[b.dtype] != 4:
        return 0
    words = 1
    for d in b.shape:
        words *= d
    return words


def whole_cta_problems(ctx, site, op: str) -> Iterator:
    """The op at `site` must run on every thread of the CTA (a role from warp 0 spanning the launch's threads)
    and sit under no `if` (its barriers are CTA-wide)."""
    k, role, path = ctx.kernel, site.role, site.path
    if role is None or role.first_warp != 0 or role.threads != k.launch.threads:
        yield ctx.report(path, f"{op} runs on every thread of the CTA: its role must start at warp 0 and span "
                         f"the launch's {k.launch.threads} threads")
    if "/then/" in path or "/else/" in path:
        yield ctx.report(path, f"{op} synchronises the CTA: it cannot sit under an `if`")
