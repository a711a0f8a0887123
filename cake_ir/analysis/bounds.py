"""Symbolic bound proofs for index expressions at a statement.

Interval facts (`cake_ir.expr.facts`) lose the link between a block index and the tensor dim the grid
was sized from: with grid y = `M / 128`, `bid.y * 128 + 128 <= M` holds for every M, but the interval
of `bid.y` is unbounded when M is. This module keeps integer scalar params symbolic and proves
`expr >= 0` by

  1. inlining lets and writing the expression as a polynomial over atoms (variables and opaque
     sub-expressions such as `K / 64`) with rational coefficients, so equal terms cancel;
  2. replacing each atom by a symbolic lower or upper bound (sign-directed) in the scalar params:
     `bid.d` <= grid_d - 1, a loop var <= stop - step (when the range divides) or stop - 1,
     `x / c` <= x / c and >= (x - c + 1) / c (exact when x is divisible by c), cdiv likewise,
     other builtins by their interval facts;
  3. bounding what remains with the params' declared min/max.

Guards (`if` conditions on the path) are used relationally: for a guard `L < R` we also try to prove
`expr - lam * (R - L - 1) >= 0` for a positive multiplier `lam` that cancels a shared term.

Everything here is sound (a True answer is a proof) and incomplete (False means "not proved").
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Union

from .. import expr as E
from ..nodes import For, Kernel, ScalarParam
from ..walk import Site

Poly = dict  # monomial (sorted tuple of param names) -> Fraction

_MAX_CANDS = 6
_MAX_DEPTH = 40
_MAX_TERMS = 4096
_MAX_INLINE = 400  # nodes of an inlined let value; larger lets stay opaque (interval facts only)


def _tree_size(node, limit: int) -> int:
    """Tree size of an expression (lets inlined share subtrees), counting at most `limit` + 1."""
    n, stack = 0, [node]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, E.Un):
            stack.append(x.a)
        elif isinstance(x, E.Bin):
            stack.extend((x.a, x.b))
        elif isinstance(x, E.Call):
            stack.extend(x.args)
    return n


def _const(c) -> Poly:
    c = Fraction(c)
    return {(): c} if c else {}


def _add(p: Poly, q: Poly, s=1) -> Poly:
    out = dict(p)
    for k, v in q.items():
        out[k] = out.get(k, 0) + s * v
    return {k: v for k, v in out.items() if v}


def _scale(p: Poly, c) -> Poly:
    c = Fraction(c)
    return {k: v * c for k, v in p.items() if v * c}


def _mulp(p: Poly, q: Poly) -> Poly:
    if len(p) * len(q) > _MAX_TERMS:
        raise ValueError("polynomial too large")
    out: Poly = {}
    for ka, va in p.items():
        for kb, vb in q.items():
            k = tuple(sorted(ka + kb))
            out[k] = out.get(k, 0) + va * vb
    return {k: v for k, v in out.items() if v}


def _is_const(p: Poly) -> bool:
    return all(k == () for k in p)


def _cval(p: Poly) -> Fraction:
    return p.get((), Fraction(0))


def _cap(cands: list) -> list:
    out, seen = [], set()
    for c in cands:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
        if len(out) >= _MAX_CANDS:
            break
    return out


def _parse(e) -> Optional[E.Node]:
    if isinstance(e, (E.Num, E.Var, E.Un, E.Bin, E.Call)):
        return e
    try:
        return E.parse_index(e)
    except (E.ExprError, TypeError, ValueError, RecursionError):
        return None


def _parse_cond(e) -> Optional[E.Node]:
    try:
        return E.parse_cond(e)
    except (E.ExprError, TypeError, ValueError, RecursionError):
        return None


class Prover:
    """Proves facts about index expressions at one statement site."""

    def __init__(self, kernel: Kernel, site: Optional[Site], env: dict):
        self.k = kernel
        self.env = env
        self.params = {p.name for p in kernel.params if isinstance(p, ScalarParam) and p.dtype != "f32"}
        self.consts = dict(kernel.consts)
        self.grid = {}
        for axis, g in zip("xyz", list(kernel.launch.grid) + [1] * (3 - len(kernel.launch.grid))):
            self.grid[axis] = _parse(g)
        self.lets: dict[str, E.Node] = {}
        self.loops: dict[str, For] = {}
        self.guards: list[E.Node] = []  # each a node G with G >= 0 known
        if site is not None:
            for loop in site.loops:
                self.loops[loop.var] = loop
            for let in site.lets:
                v = _parse(let.value)
                if v is not None:
                    v = self.inline(v)
                    if _tree_size(v, _MAX_INLINE) <= _MAX_INLINE:
                        self.lets[let.name] = v
                    else:
                        self.lets.pop(let.name, None)
            for g in site.guards:
                c = _parse_cond(g.cond)
                if c is not None:
                    c = self.inline(c)
                    if _tree_size(c, _MAX_INLINE) <= _MAX_INLINE:
                        self._add_guard(c, g.taken)
        self._busy: set = set()

    # ------------------------------------------------------------------ setup
    def inline(self, node: E.Node) -> E.Node:
        if not self.lets:
            return node
        try:
            return E.substitute(node, self.lets)
        except RecursionError:
            return node

    def _add_guard(self, c: E.Node, taken: bool, depth: int = 0):
        if depth > 8:
            return
        if isinstance(c, E.Un) and c.op == "!":
            return self._add_guard(c.a, not taken, depth + 1)
        if isinstance(c, E.Bin):
            if (c.op == "&&" and taken) or (c.op == "||" and not taken):
                self._add_guard(c.a, taken, depth + 1)
                self._add_guard(c.b, taken, depth + 1)
                return
            op = c.op
            if not taken:
                op = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "==!", "!=": "=="}.get(op)
            a, b = c.a, c.b
            one = E.Num(1)
            if op == "<":
                self.guards.append(E.Bin("-", E.Bin("-", b, a), one))
            elif op == "<=":
                self.guards.append(E.Bin("-", b, a))
            elif op == ">":
                self.guards.append(E.Bin("-", E.Bin("-", a, b), one))
            elif op == ">=":
                self.guards.append(E.Bin("-", a, b))
            elif op == "==":
                self.guards.append(E.Bin("-", b, a))
                self.guards.append(E.Bin("-", a, b))

    # ------------------------------------------------------------------ linear forms over atoms
    def _lin(self, node: E.Node, depth: int = 0):
        """node -> ({monomial of atom keys: Fraction}, {key: atom node}) or None."""
        atoms: dict = {}

        def go(n, d):
            if d > _MAX_DEPTH:
                raise RecursionError
            if isinstance(n, E.Num):
                if isinstance(n.value, float):
                    raise ValueError
                return _const(n.value)
            if isinstance(n, E.Var):
                if n.name in self.consts:
                    return _const(self.consts[n.name])
                atoms[n.name] = n
                return {(n.name,): Fraction(1)}
            if isinstance(n, E.Un) and n.op == "-":
                return _scale(go(n.a, d + 1), -1)
            if isinstance(n, E.Bin) and n.op in ("+", "-"):
                return _add(go(n.a, d + 1), go(n.b, d + 1), 1 if n.op == "+" else -1)
            if isinstance(n, E.Bin) and n.op == "*":
                return _mulp(go(n.a, d + 1), go(n.b, d + 1))
            key = E.canon(n) or E.to_text(n)
            atoms[key] = n
            return {(key,): Fraction(1)}

        try:
            return go(node, depth), atoms
        except (RecursionError, ValueError, TypeError):
            return None

    # ------------------------------------------------------------------ bounds
    def bound(self, node: E.Node, hi: bool, depth: int = 0) -> list:
        """Candidate polynomials over scalar params, each an upper (hi) / lower bound of node."""
        if depth > _MAX_DEPTH:
            return []
        try:
            return _cap(self._bound(node, hi, depth))
        except (RecursionError, ZeroDivisionError, OverflowError, ValueError, TypeError):
            return []

    def _numeric(self, node: E.Node, hi: bool) -> list:
        try:
            f = E.facts(node, self.env)
        except (RecursionError, ZeroDivisionError, OverflowError, ValueError, TypeError):
            return []
        v = f.hi if hi else f.lo
        if v in (E.INF, -E.INF) or (isinstance(v, float) and math.isnan(v)):
            return []
        return [_const(Fraction(v).limit_denominator() if isinstance(v, float) else v)]

    def _bound(self, n: E.Node, hi: bool, depth: int) -> list:
        d = depth + 1
        if isinstance(n, E.Num):
            if isinstance(n.value, float):
                return []
            return [_const(n.value)]
        if isinstance(n, E.Var):
            return self._bound_var(n.name, hi, d)
        if isinstance(n, E.Un):
            if n.op == "-":
                return [_scale(p, -1) for p in self.bound(n.a, not hi, d)]
            return [_const(1 if hi else 0)]
        if isinstance(n, E.Bin):
            if n.op in ("+", "-"):
                pa = self.bound(n.a, hi, d)
                pb = self.bound(n.b, hi if n.op == "+" else not hi, d)
                return [_add(x, y, 1 if n.op == "+" else -1) for x in pa for y in pb]
            if n.op == "*":
                return self._bound_mul(n, hi, d)
            if n.op == "/":
                c = self._const_of(n.b)
                if c is not None and c > 0:
                    return self._bound_div(n.a, c, hi, d, ceil=False)
                return self._numeric(n, hi)
            return self._numeric(n, hi)
        if isinstance(n, E.Call):
            if n.fn == "cdiv":
                c = self._const_of(n.args[1])
                if c is not None and c > 0:
                    return self._bound_div(n.args[0], c, hi, d, ceil=True)
            elif n.fn == "min" and hi:
                return self.bound(n.args[0], True, d) + self.bound(n.args[1], True, d) + self._numeric(n, hi)
            elif n.fn == "max" and not hi:
                return self.bound(n.args[0], False, d) + self.bound(n.args[1], False, d) + self._numeric(n, hi)
            elif n.fn == "ld":   # a run-time read trapped unless lo <= value <= hi
                return self.bound(n.args[3] if hi else n.args[2], hi, d)
            return self._numeric(n, hi)
        return []

    def _const_of(self, n: E.Node) -> Optional[int]:
        v = E.try_const(n, self.consts)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def _bound_mul(self, n: E.Bin, hi: bool, d: int) -> list:
        ca, cb = self._const_of(n.a), self._const_of(n.b)
        if ca is not None or cb is not None:
            c, other = (ca, n.b) if ca is not None else (cb, n.a)
            return [_scale(p, c) for p in self.bound(other, hi if c >= 0 else not hi, d)]
        try:
            fa, fb = E.facts(n.a, self.env), E.facts(n.b, self.env)
        except (RecursionError, ValueError, TypeError, OverflowError):
            return []
        if fa.lo >= 0 and fb.lo >= 0:
            pa, pb = self.bound(n.a, hi, d), self.bound(n.b, hi, d)
            return [_mulp(x, y) for x in pa for y in pb] + self._numeric(n, hi)
        return self._numeric(n, hi)

    def _divisible(self, n: E.Node, c: int) -> bool:
        try:
            return E.facts(n, self.env).divisible_by(c)
        except (RecursionError, ValueError, TypeError, OverflowError):
            return False

    def _bound_div(self, a: E.Node, c: int, hi: bool, d: int, ceil: bool) -> list:
        exact = self._divisible(a, c)
        out = []
        for p in self.bound(a, hi, d):
            if _is_const(p):
                v = _cval(p)
                q = math.ceil(v / c) if ceil else math.floor(v / c)
                out.append(_const(q))
            elif exact:
                out.append(_scale(p, Fraction(1, c)))
            elif ceil:
                # ceil(x/c) <= (x + c - 1)/c ; ceil(x/c) >= x/c
                out.append(_scale(_add(p, _const(c - 1)), Fraction(1, c)) if hi else _scale(p, Fraction(1, c)))
            else:
                # floor(x/c) <= x/c ; floor(x/c) >= (x - c + 1)/c
                out.append(_scale(p, Fraction(1, c)) if hi else _scale(_add(p, _const(-(c - 1))), Fraction(1, c)))
        return out

    def _bound_var(self, name: str, hi: bool, d: int) -> list:
        if name in self.consts:
            return [_const(self.consts[name])]
        if name in self.params:
            return [{(name,): Fraction(1)}]
        if name in self.lets:
            if name in self._busy:
                return []
            self._busy.add(name)
            try:
                return self.bound(self.lets[name], hi, d)
            finally:
                self._busy.discard(name)
        if name in self.loops:
            if name in self._busy:
                return self._numeric(E.Var(name), hi)
            self._busy.add(name)
            try:
                return self._bound_loop(self.loops[name], hi, d) + self._numeric(E.Var(name), hi)
            finally:
                self._busy.discard(name)
        if name.startswith("bid.") and name[4:] in self.grid:
            if not hi:
                return [_const(0)]
            g = self.grid[name[4:]]
            if g is None:
                return self._numeric(E.Var(name), hi)
            return [_add(p, _const(-1)) for p in self.bound(g, True, d)] + self._numeric(E.Var(name), hi)
        if name.startswith("nbid.") and name[5:] in self.grid:
            g = self.grid[name[5:]]
            return (self.bound(g, hi, d) if g is not None else []) + self._numeric(E.Var(name), hi)
        return self._numeric(E.Var(name), hi)

    def _bound_loop(self, loop: For, hi: bool, d: int) -> list:
        start, stop = _parse(loop.start), _parse(loop.stop)
        if start is None or stop is None:
            return []
        start, stop = self.inline(start), self.inline(stop)
        if not hi:
            return self.bound(start, False, d)
        last = 1
        if loop.step > 1:
            span = E.Bin("-", stop, start)
            if self._divisible(span, loop.step):
                last = loop.step
        out = []
        for p in self.bound(stop, True, d):
            q = _add(p, _const(-last))
            if loop.step > 1 and _is_const(q):
                # the last value is start + step * floor((stop - 1 - start) / step)
                for s in self.bound(start, False, d):
                    if _is_const(s):
                        sv, tv = _cval(s), _cval(p)
                        if sv.denominator == 1 and tv.denominator == 1 and tv > sv:
                            q = _const(sv + loop.step * ((tv - 1 - sv) // loop.step))
                        break
            out.append(q)
        return out

    # ------------------------------------------------------------------ proofs
    def _lower_numeric(self, p: Poly) -> float:
        total = 0.0
        for mono, c in p.items():
            if mono == ():
                total += float(c)
                continue
            lo, hi = 1.0, 1.0
            for name in mono:
                f = self.env.get(name, E.Fact())
                cands = [x * y for x in (lo, hi) for y in (f.lo, f.hi)
                         if not ((x == 0 and abs(y) == E.INF) or (y == 0 and abs(x) == E.INF))]
                if not cands:
                    return -E.INF
                lo, hi = min(cands), max(cands)
            v = lo if c > 0 else hi
            if abs(v) == E.INF:
                return -E.INF
            total += float(c) * v
        return total

    def _lower(self, node: E.Node) -> bool:
        lin = self._lin(node)
        if lin is None:
            return False
        poly, atoms = lin
        combos: list = [_const(0)]
        for mono, c in poly.items():
            if mono == ():
                combos = [_add(x, _const(c)) for x in combos]
                continue
            want_hi = c < 0
            if len(mono) == 1:
                cands = self.bound(atoms[mono[0]], want_hi)
            else:
                prod = atoms[mono[0]]
                for key in mono[1:]:
                    prod = E.Bin("*", prod, atoms[key])
                cands = self.bound(prod, want_hi)
            if not cands:
                return False
            combos = _cap([_add(x, _scale(q, c)) for x in combos for q in cands])
        for p in combos:
            if self._lower_numeric(p) >= 0:
                return True
        return False

    def nonneg(self, e: Union[str, int, E.Node]) -> bool:
        """True when e >= 0 is proved at this site."""
        node = _parse(e)
        if node is None:
            return False
        node = self.inline(node)
        if _tree_size(node, 4 * _MAX_INLINE) > 4 * _MAX_INLINE:
            return False
        if self._lower(node):
            return True
        lin = self._lin(node)
        if lin is None:
            return False
        poly, _ = lin
        for g in self.guards:
            gl = self._lin(g)
            if gl is None:
                continue
            gpoly, _ = gl
            lams = set()
            for mono, c in gpoly.items():
                if mono and mono in poly and (poly[mono] > 0) == (c > 0):
                    lams.add(poly[mono] / c)
            for lam in list(lams)[:4]:
                if lam > 0 and self._lower(E.Bin("-", node, E.Bin("*", _frac_node(lam), g))):
                    return True
        return False

    def le(self, a, b) -> bool:
        """True when a <= b is proved at this site."""
        na, nb = _parse(a), _parse(b)
        if na is None or nb is None:
            return False
        return self.nonneg(E.Bin("-", nb, na))


def _frac_node(f: Fraction) -> E.Node:
    return E.Num(int(f.numerator)) if f.denominator == 1 else E.Num(f)
