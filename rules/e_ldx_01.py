"""E-LDX-01: a run-time index read `ld(T, i, lo, hi)` is misplaced, reads the wrong tensor, or reads
out of bounds.

`ld(T, i, lo, hi)` in an index expression reads element `i` (flat, row-major) of the i32 tensor `T`
at run time: a state-pool slot gathered by sequence, a `cu_seqlens` offset of a packed batch. The
kernel traps unless `lo <= value <= hi`, so every later access can be proved for that range. It may
appear only in a `let` value (where the value is computed once and named): grid, shapes, strides,
facts and loop bounds are evaluated on the host or proved statically and cannot read device memory.
`T` must be an i32 tensor param, and `0 <= i < numel(T)` must be provable.

What goes wrong on hardware: an unprovable `i` reads past the tensor; a value read from a float
tensor is garbage as an index.
"""
import math
import re

from cake_ir import expr as E
from cake_ir.nodes import Let, TensorParam

from ._cpy_util import prover

CODE = "E-LDX-01"
TITLE = "run-time index read (ld)"
STAGE = "source"

_LD = re.compile(r"\bld\s*\(")


def _strings(obj, path):
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        for key, v in obj.items():
            yield from _strings(v, f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{path}/{i}")


def _ld_calls(node):
    return [n for n in E.walk(node) if isinstance(n, E.Call) and n.fn == "ld"]


def check(ctx):
    k = ctx.kernel
    lets = {s.path + "/value": s for s in ctx.sites if isinstance(s.node, Let)}
    for path, text in _strings(k.model_dump(mode="json", by_alias=True, exclude_none=True), ""):
        if _LD.search(text) and path not in lets and not path.endswith("/note"):
            yield ctx.report(path, "ld() reads device memory: use it in a let value and name the result "
                             f"(found in {path!r})", legal=["a let value"])
    tensors = {p.name: p for p in k.params if isinstance(p, TensorParam)}
    for vpath, s in lets.items():
        try:
            node = E.parse_index(s.node.value)
        except E.ExprError:
            continue
        calls = _ld_calls(node)
        if not calls:
            continue
        pv = prover(ctx, s)
        for c in calls:
            t = c.args[0]
            p = tensors.get(t.name) if isinstance(t, E.Var) else None
            if p is None or p.dtype != "i32":
                legal = sorted(n for n, q in tensors.items() if q.dtype == "i32")
                yield ctx.report(vpath, f"ld() reads an i32 tensor param; {E.to_text(t)!r} is not one", legal=legal)
                continue
            i = E.to_text(c.args[1])
            numel = " * ".join(f"({d})" for d in p.shape) if p.shape else "1"
            if not pv.nonneg(i):
                yield ctx.report(vpath, f"ld({p.name}, {i}, ...): index {i!r} is not provably >= 0")
            elif not pv.le(f"({i}) + 1", numel):
                yield ctx.report(vpath, f"ld({p.name}, {i}, ...): cannot prove {i} < {numel} (the tensor's "
                                 "element count); guard the let or bound the index with param facts")
            lo, hi = E.facts(c.args[2], {}), E.facts(c.args[3], {})
            if lo.lo == lo.hi and hi.lo == hi.hi and lo.lo > hi.hi and math.isfinite(lo.lo):
                yield ctx.report(vpath, f"ld(...): the declared range [{lo.lo}, {hi.hi}] is empty")
