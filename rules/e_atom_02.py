"""E-ATOM-02: a vector scatter_add (`vec` 2 / 4) is not a legal vector reduction here.

`vec > 1` lowers each lane's adds to `red.global.add.v2 / .v4.f32`: one L2 request for vec consecutive
floats. That instruction exists from sm_90 on, only into global f32 memory, and its address must be
4 vec-byte aligned: the lane's columns (src's columns / 4 per lane) must split into groups of vec, and
the destination's base pointer, tile offsets and row stride must be provably multiples of vec floats.
The legal list gives the vector widths that are provable; vec 1 (scalar reds) is always legal.
"""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import ScatterAdd

from ._cpy_util import alignment_problem

CODE = "E-ATOM-02"
TITLE = "vector scatter_add: sm_90, global f32, aligned groups"
STAGE = "expanded"


def problem(ctx, env, n, v: int):
    """(sub-path, message) why vec = v cannot be used, or None."""
    k = ctx.kernel
    if v == 1:
        return None
    if "red_vector" not in ctx.arch.features:
        return ("/vec", f"{k.arch} has no vector red (red.global.add.v{v}.f32 needs sm_90 or later)")
    dst = resolve_tile(k, n.dst)
    if dst.space != "global" or dst.dtype != "f32":
        return ("/dst/buf", f"vector reds add into global f32 memory; {n.dst.buf!r} is {dst.space} {dst.dtype}")
    if n.src is None:
        return ("/vec", "a count (no src) adds one float per row: there is no group to vectorise")
    cols = resolve_tile(k, n.src).shape[-1]
    if cols % (4 * v):
        return ("/src/shape", f"a lane adds {cols // 4} of the row's {cols} columns, not a multiple of {v}")
    pr = alignment_problem(env, dst, tuple(dst.shape), 4 * v)
    if pr is not None:
        return ("/dst" + pr[0], pr[1])
    return None


def check(ctx):
    for s in ctx.sites:
        n = s.node
        if not isinstance(n, ScatterAdd) or n.vec == 1:
            continue
        env = ctx.env(s)
        pr = problem(ctx, env, n, n.vec)
        if pr is None:
            continue
        legal = [v for v in (1, 2, 4) if problem(ctx, env, n, v) is None]
        yield ctx.report(f"{s.path}{pr[0]}", f"scatter_add vec={n.vec}: {pr[1]}", legal=legal,
                         fix=[{"op": "replace", "path": f"{s.path}/vec", "value": legal[-1]}])
