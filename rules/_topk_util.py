"""Helpers shared by the top-k rules (E-TOPK-*)."""
from cake_ir.analysis.tiles import resolve_tile
from cake_ir.nodes import Access, Fill, TopKBound
from cake_ir.walk import statements


def _resets(node, tensor: str) -> bool:
    """node zeroes or overwrites words of `tensor`: an stg into it, or a topk_bound store (a bound a later
    kernel reads, in place of whatever the words held)."""
    return (isinstance(node, Access) and node.op == "stg" and node.dst.buf == tensor) or \
        (isinstance(node, TopKBound) and node.mode == "store" and node.bound.buf == tensor)


def reset_later(ctx, after: list, tensor: str) -> bool:
    """Some statement after this site (`after`: the kernel's later sites) or some later kernel of the
    program (e.g. a merge kernel after a split search) resets `tensor`'s words."""
    if any(_resets(o.node, tensor) for o in after):
        return True
    prog = ctx.program
    if prog is None:
        return False
    names = [k.name for k in prog.kernels]
    me = names.index(ctx.source.name) if ctx.source.name in names else len(names)
    return any(_resets(s.node, tensor) for k in prog.kernels[me + 1:] for s in statements(k))


def bound_word_errors(ctx, ref, path: str):
    """Reports on a bound-word operand `ref` at `path` (a topk's shared_bound, a topk_bound's bound): it must
    be a tile of a 2-d global i32 tensor with readwrite access. Yields (report, fatal) pairs; fatal: the
    tensor is not usable, the caller checks nothing further."""
    t = resolve_tile(ctx.kernel, ref)
    par = t.param
    if par is None or t.dtype != "i32" or len(par.shape) != 2:
        yield ctx.report(f"{path}/buf", f"{ref.buf!r} must be a 2-d global i32 tensor (one word per row)",
                         legal=["i32"]), True
        return
    if par.access != "readwrite":
        yield ctx.report(f"{path}/buf", f"tensor {par.name!r} is {par.access}; a bound word is read, published and "
                         "reset: readwrite", legal=["readwrite"]), False


def row_register_errors(ctx, n, path: str, field: str, what: str, unset: str):
    """Reports on a topk's per-row f32 register operand (`field`: bound_cache, given_bound): an mma_rows
    f32 register tile [rows, 1] beside the lists, set (a fill, or a topk_bound load) before the topk
    (`unset`: the message's advice)."""
    k = ctx.kernel
    ref = getattr(n, field)
    b, lists = resolve_tile(k, ref).buffer, resolve_tile(k, n.vals).buffer
    rows = lists.shape[0] if lists is not None else None
    if b is None or b.space != "reg" or b.layout != "mma_rows" or b.dtype != "f32" or list(b.shape) != [rows, 1]:
        yield ctx.report(f"{path}/{field}/buf", f"a {what} is an mma_rows f32 register tile [{rows}, 1] "
                         "(a register per list row)", legal=[[rows, 1]])
        return
    before = ctx.sites[:next(i for i, s in enumerate(ctx.sites) if s.node is n)]
    if not any((isinstance(o.node, Fill) and o.node.dst.buf == b.name)
               or (isinstance(o.node, TopKBound) and o.node.mode == "load" and o.node.vals.buf == b.name)
               for o in before):
        yield ctx.report(f"{path}/{field}", f"{what} {b.name!r} is not {unset}")
