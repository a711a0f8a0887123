"""Helpers shared by the top-k rules (E-TOPK-*)."""
from cake_ir.nodes import Access, TopKBound
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
