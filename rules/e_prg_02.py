"""E-PRG-02: a kernel declares a workspace tensor with another dtype or shape than the workspace.

The runtime allocates each workspace once, from the Program's `workspace` entry, and passes the same
buffer to every kernel that names it: a kernel param of that name with another element type or
shape would index memory that is not laid out as it believes (shapes are compared as parsed index
expressions, so `2*N` and `N * 2` agree). A scalar param cannot take a workspace's name either.
"""
from cake_ir import expr as E
from cake_ir.nodes import ScalarParam

CODE = "E-PRG-02"
TITLE = "workspace params agree with the workspace's dtype and shape"
STAGE = "program"


def _same_dim(a, b) -> bool:
    try:
        return E.to_text(E.parse_index(a)) == E.to_text(E.parse_index(b)) or E.same(a, b)
    except E.ExprError:
        return False


def check(ctx):
    prog = ctx.program
    names = {w.name: (wi, w) for wi, w in enumerate(prog.workspace)}
    for i, k in enumerate(prog.kernels):
        for j, p in enumerate(k.params):
            if p.name not in names:
                continue
            wi, w = names[p.name]
            at, ws = f"/kernels/{i}/params/{j}", f"/workspace/{wi}"
            if isinstance(p, ScalarParam):
                yield ctx.report(at, f"{p.name} is a workspace tensor of the program; kernel {k.name} declares it "
                                 "as a scalar", related=[ws])
                continue
            if p.dtype != w.dtype:
                yield ctx.report(f"{at}/dtype", f"workspace {w.name} is {w.dtype}; kernel {k.name} declares {p.dtype}",
                                 legal=[w.dtype], related=[ws])
            if len(p.shape) != len(w.shape) or not all(_same_dim(a, b) for a, b in zip(p.shape, w.shape)):
                yield ctx.report(f"{at}/shape", f"workspace {w.name} has shape {list(w.shape)}; kernel {k.name} "
                                 f"declares {list(p.shape)}", legal=[list(w.shape)], related=[ws])
