"""E-NAME-01: an expression uses a name that is not defined where it is evaluated.

Every name in an index, condition or value expression must be defined at that point: a builtin index
name (`bid.x`, `tid`, `lane`, `warp`, `role_warp`, `role_tid`, `wg`, `wg_tid`, ...), a const, a scalar
param, the variable of an enclosing `for`, or a `let` earlier in an enclosing scope (a `let` inside a
loop body, an `if` branch or a block ends with it; the prologue's lets are not visible in the roles, nor
one role's in another). A `map` expression may also name register tiles (of its own role: a tile owned
by another role, or any register tile in the prologue, is not declared there). `ld(T, ...)` names the
tensor param `T` (rule E-LDX-01). The launch grid and the tensor params' shapes and strides are
evaluated on the host: they may name scalar params and consts only.

What goes wrong: the lowering prints the name as a C++ identifier, so NVRTC fails with `identifier "H"
is undefined` (E-BACKEND-COMPILE, mapped back to a statement only approximately); a let that names
itself (`let x = x + 1`) even compiles and reads an uninitialised value.

A Program's workspace shapes are not seen by this kernel rule: E-PRG-02 makes each equal to the shape of
the kernels' tensor params of that name, which are checked here.
"""
from __future__ import annotations

import difflib
from functools import lru_cache
from typing import Annotated, Optional, get_args, get_origin

from pydantic import AfterValidator, BaseModel

from cake_ir import expr as E
from cake_ir import nodes as N
from cake_ir.analysis.facts import BUILTINS
from cake_ir.nodes import For, Let, ScalarParam, TensorParam

CODE = "E-NAME-01"
TITLE = "names in expressions are defined where they are used"
STAGE = "source"

MAX_LEGAL = 80          # a longer list drops the builtins (always the same 13 names)

# ----------------------------------------------------------------- expression fields of the node types
# Enumerated from the pydantic definitions in cake_ir.nodes (fields typed IndexExpr / CondExpr / ValueExpr,
# alone, Optional or in lists, and inside nested operand models such as TileRef and BarRef), so a field
# added to a node is checked without touching this rule. Statement lists (body / then / else) are left
# to the statement walker.
_VALIDATORS = {N._check_index: "index", N._check_cond: "cond", N._check_value: "value"}
_STMT = frozenset(N.STMT_TYPES) | {N.Role}


def _scan(tp, found: set) -> None:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        for m in meta:
            if isinstance(m, AfterValidator) and m.func in _VALIDATORS:
                found.add(_VALIDATORS[m.func])
                return
        _scan(base, found)
    elif origin is not None:
        for a in get_args(tp):
            _scan(a, found)
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        found.add("stmt" if tp in _STMT else "model")


@lru_cache(maxsize=None)
def expr_fields(cls) -> tuple:
    """(attribute, JSON key, kind) of each field of `cls` holding expressions ('index' / 'cond' / 'value')
    or operand models to descend into ('model')."""
    out = []
    for name, f in cls.model_fields.items():
        found: set = set()
        for m in f.metadata:
            if isinstance(m, AfterValidator) and m.func in _VALIDATORS:
                found.add(_VALIDATORS[m.func])
        _scan(f.annotation, found)
        kinds = [k for k in ("index", "cond", "value") if k in found]
        if kinds:
            out.append((name, f.alias or name, kinds[0]))
        elif "model" in found and "stmt" not in found:
            out.append((name, f.alias or name, "model"))
    return tuple(out)


def expressions(obj, path: str) -> list[tuple[str, str, str]]:
    """(path, kind, text) of every expression string in `obj`'s own fields and operand models (not in
    nested statement lists); numbers and booleans name nothing and are left out."""
    out, stack = [], [(obj, path)]
    while stack:
        o, base = stack.pop()
        for attr, key, kind in expr_fields(type(o)):
            v = getattr(o, attr)
            if v is None:
                continue
            p = f"{base}/{key}"
            if kind == "model":
                if isinstance(v, list):
                    stack.extend((x, f"{p}/{i}") for i, x in enumerate(v) if isinstance(x, BaseModel))
                elif isinstance(v, BaseModel):
                    stack.append((v, p))
            elif isinstance(v, str):
                out.append((p, kind, v))
            elif isinstance(v, list):
                out.extend((f"{p}/{i}", kind, x) for i, x in enumerate(v) if isinstance(x, str))
    return out


@lru_cache(maxsize=8192)
def names_of(text: str, kind: str) -> Optional[tuple]:
    """The variable names of an expression in order of appearance, without ld()'s tensor argument
    (E-LDX-01 judges it); None when it does not parse (the schema reports that)."""
    try:
        node = {"index": E.parse_index, "cond": E.parse_cond, "value": E.parse_value}[kind](text)
    except (E.ExprError, RecursionError, TypeError, ValueError):
        return None
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, E.Var):
            if n.name not in out:
                out.append(n.name)
        elif isinstance(n, E.Un):
            stack.append(n.a)
        elif isinstance(n, E.Bin):
            stack.extend((n.b, n.a))
        elif isinstance(n, E.Call):
            args = n.args[1:] if n.fn == "ld" and n.args and isinstance(n.args[0], E.Var) else n.args
            stack.extend(reversed(args))
    return tuple(out)


# ------------------------------------------------------------------------------------- the check
class _Scope:
    """What a kernel defines, and where its lets and loop variables are (for the hints)."""

    def __init__(self, ctx):
        k = ctx.kernel
        self.k, self.ctx = k, ctx
        self.consts = set(k.consts)
        self.scalars = {p.name for p in k.params if isinstance(p, ScalarParam)}
        self.tensors = {p.name for p in k.params if isinstance(p, TensorParam)}
        self.decl = frozenset(self.consts | self.scalars)
        self.base = self.decl | frozenset(BUILTINS)
        self.reg = {b.name: b for b in k.buffers if b.space == "reg"}
        self.smem = {b.name for b in k.buffers if b.space != "reg"}
        self.others = {**{b.name: "a barrier" for b in k.barriers}, **{p.name: "a pipeline" for p in k.pipelines},
                       **{r.name: "a role" for r in k.roles}}
        self._defs = None
        self._cache: dict = {}

    def at(self, site) -> frozenset:
        key = (site.role_index, tuple(map(id, site.loops)), tuple(map(id, site.lets)))
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = self.base | {f.var for f in site.loops} | {l.name for l in site.lets}
        return d

    def reg_names(self, site) -> frozenset:
        """The register tiles a map expression may name here: the role's own and unowned ones (the
        lowering declares them per role; the prologue has none)."""
        role = site.role
        key = ("reg", site.role_index)
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = frozenset() if role is None else frozenset(
                n for n, b in self.reg.items() if b.role in (None, role.name))
        return d

    def definitions(self) -> dict:
        """name -> [(site, 'let' | 'for')] over the whole kernel, built on the first miss only."""
        if self._defs is None:
            self._defs = {}
            for s in self.ctx.sites:
                if isinstance(s.node, Let):
                    self._defs.setdefault(s.node.name, []).append((s, "let"))
                elif isinstance(s.node, For):
                    self._defs.setdefault(s.node.var, []).append((s, "for"))
        return self._defs


def _role_name(k, ri) -> str:
    return "the prologue" if ri is None else f"role {k.roles[ri].name!r}"


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _where(sc: _Scope, name: str, site) -> list[str]:
    """Why a let / loop variable called `name` elsewhere in the kernel is not visible at `site`."""
    k = sc.k
    hints = []
    for d, what in sc.definitions().get(name, ()):
        if d.role_index != site.role_index:
            if d.role_index is None:
                hints.append(f"{name} is a let of the prologue ({d.path}); the prologue's lets end with it "
                             "and are not visible in the roles: define it again in this role")
            else:
                hints.append(f"{name} is defined in {_role_name(k, d.role_index)} ({d.path}); each role sees "
                             f"only its own lets: define it in {_role_name(k, site.role_index)} too")
            continue
        if what == "for":
            if d.path == site.path:
                hints.append(f"{name} is this loop's own variable, which does not exist yet in its bounds")
            else:
                hints.append(f"{name} is the variable of the loop at {d.path}, which does not enclose this "
                             "statement")
            continue
        if d.path == site.path:
            hints.append(f"a let cannot use its own name: {name} is being defined by this let")
            continue
        scope = _parent(d.path)
        if (site.path + "/").startswith(scope + "/"):
            hints.append(f"{name} is defined later in the same scope, at {d.path}: move that let before this "
                         "statement")
            continue
        a, b = d.path.split("/"), site.path.split("/")
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        common = "/".join(a[:n])
        if n < len(a) and n < len(b) and {a[n], b[n]} == {"then", "else"}:
            hints.append(f"{name} is defined in the other branch of the if at {common} ({d.path}): define it "
                         "before the if, or in this branch too")
        else:
            hints.append(f"{name} is defined at {d.path}, inside a loop body, if branch or block that does not "
                         "enclose this statement (its lets end with it): define it in a scope enclosing both")
    return hints


def _message(sc: _Scope, name: str, where: str, text: str, kind: str, site, legal: set) -> str:
    """What is wrong with `name` here, and the likeliest fix (at most three hints)."""
    head = f"{name!r} is not defined in {where} {text!r}"
    hints = _where(sc, name, site) if site is not None else []
    if site is None and name in sc.definitions():
        hints.insert(0, f"{name} is a let or loop variable of the statements; the launch grid and tensor shapes "
                     "are evaluated on the host from scalar params and consts only")
    elif site is None and name in BUILTINS:
        hints.insert(0, f"{name} is a builtin of the statements; the launch grid and tensor shapes are evaluated "
                     "on the host from scalar params and consts only")
    if name in sc.tensors:
        hints.insert(0, f"{name} is a tensor param (a pointer), not a value: " + (
            "sizes are scalar params or consts" if site is None else
            "load a tile of it into a register tile (ldg) and name that" if kind == "value" else
            f"read an element with ld({name}, i, lo, hi) in a let and use the let"))
    elif name in sc.reg and kind == "value":
        owner = sc.reg[name].role
        hints.insert(0, f"{name} is a register tile of role {owner!r}, declared only there" if site.role is not None
                     else f"{name} is a register tile; register tiles are declared in the roles, not the prologue")
    elif name in sc.reg or name in sc.smem:
        hints.insert(0, f"{name} is a buffer, not an integer: only map expressions read register tiles")
    elif name in sc.others:
        hints.insert(0, f"{name} names {sc.others[name]}, not a value")
    elif name.startswith("cake_"):
        hints.insert(0, "cake_ names are the lowering's internals, not IR names")
    elif name.split(".")[0] in ("bid", "nbid"):
        hints.insert(0, "the grid builtins are bid.x, bid.y, bid.z and nbid.x, nbid.y, nbid.z")
    if not hints:
        close = difflib.get_close_matches(name, sorted(legal), n=3, cutoff=0.7) if len(name) > 2 else []
        also = f" (did you mean {', '.join(close)}?)" if close else ""
        if site is None:
            hints.append(f"no scalar param or const of that name{also}: declare a scalar param {name} "
                         "(kind scalar) if the task passes it, or a const if it is fixed")
        elif kind == "value":
            hints.append(f"no register tile, scalar param, const, let or loop variable of that name is in "
                         f"scope{also}: declare the register tile (a reg buffer) {name} and fill it before this "
                         f"map, or a scalar param / const {name}, or define a let {name} before this statement")
        else:
            hints.append(f"no scalar param, const, let or loop variable of that name is in scope{also}: declare a "
                         f"scalar param {name} (kind scalar) if the task passes it, a const if it is fixed, or "
                         f"define a let {name} before this statement")
    return f"{head}: " + "; ".join(hints[:3])


def _legal(names: set) -> list:
    out = sorted(names)
    if len(out) > MAX_LEGAL:
        out = sorted(n for n in names if n not in BUILTINS)[:MAX_LEGAL] + ["(and the builtins)"]
    return out


_WHAT = {"index": "index expression", "cond": "condition", "value": "map expression"}


def _decl_where(k, fpath: str) -> str:
    parts = fpath.split("/")
    if parts[1] == "launch":
        return "the launch grid"
    if parts[1] == "params" and len(parts) > 3:
        return f"the {parts[3]} of tensor param {k.params[int(parts[2])].name}"
    return fpath


def _field_name(stmt, path: str, field_path: str) -> str:
    rel = field_path[len(path) + 1:]
    if isinstance(stmt, Let):
        return f"let {stmt.name}'s value"
    return f"{getattr(stmt, 'op', 'the statement')}'s {rel}"


def check(ctx):
    k = ctx.kernel
    sc = _Scope(ctx)
    # declarations (the launch grid, tensor shapes and strides, and any expression field a declaration
    # gains): evaluated on the host from scalar params and consts
    for fpath, kind, text in expressions(k, ""):
        for name in names_of(text, kind) or ():
            if name not in sc.decl:
                yield ctx.report(fpath, _message(sc, name, _decl_where(k, fpath), text, kind, None, sc.decl),
                                 legal=_legal(sc.decl))
    # statements, with the names in scope at each
    for s in ctx.sites:
        defined = None
        for fpath, kind, text in expressions(s.node, s.path):
            names = names_of(text, kind)
            if not names:
                continue
            if defined is None:
                defined = sc.at(s)
            legal = defined | sc.reg_names(s) if kind == "value" else defined
            for name in names:
                # smem buffers in a map are a lowering error of their own ("map reads register tiles")
                if name in legal or (kind == "value" and name in sc.smem):
                    continue
                where = f"{_field_name(s.node, s.path, fpath)} ({_WHAT[kind]})"
                yield ctx.report(fpath, _message(sc, name, where, text, kind, s, legal), legal=_legal(legal))
