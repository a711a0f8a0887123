"""Expression strings in CAKE IR: index expressions, conditions and element-wise value expressions.

IR documents keep expressions as short strings ("bid.x * 128 + 64 * wg", "k < K / 64",
"exp2((x - m) * 1.4427)") because they are what people and LLMs write and read. This module parses
them into a small AST, proves facts about integer expressions (interval range and divisibility) from
the facts of their free variables, canonicalises them for symbolic comparison, and renders them as
C. Division and modulo are floor semantics on non-negative operands (the verifier proves
non-negativity where it matters); rendering uses C's `/` and `%`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Union

INF = math.inf


class ExprError(ValueError):
    """An expression string that does not parse or uses something its context forbids."""

    def __init__(self, message: str, text: str = "", pos: int | None = None):
        self.text, self.pos = text, pos
        where = f" at column {pos + 1}" if pos is not None else ""
        super().__init__(f"{message}{where} in {text!r}" if text else message)


# ----------------------------------------------------------------------------------------- AST
@dataclass(frozen=True)
class Num:
    value: Union[int, float]


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Un:
    op: str  # '-', '!'
    a: "Node"


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / % < <= > >= == != && ||
    a: "Node"
    b: "Node"


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Node", ...]


Node = Union[Num, Var, Un, Bin, Call]

# Functions allowed per context. Index/cond functions are integer-valued.
# ld(T, i, lo, hi[, est]): element i (flat) of the i32 tensor T, read at run time (a state-pool slot, a
# cu_seqlens offset); the kernel traps unless lo <= value <= hi, so [lo, hi] is a fact (rule E-LDX-01).
# `est`, an index expression, is the typical value the cost model and the sync simulator stand in for
# the read (default lo); it proves nothing and is not compiled.
INDEX_FUNCS = {"min": 2, "max": 2, "cdiv": 2, "ld": (4, 5)}


def ld_estimate(call: "Call") -> "Node":
    """What the cost model and the sync simulator stand in for a run-time read ld(T, i, lo, hi[, est])."""
    return call.args[4] if len(call.args) == 5 else call.args[2]
COND_FUNCS = {"elect_one": 0, **INDEX_FUNCS}
VALUE_FUNCS = {
    "exp": 1, "exp2": 1, "log": 1, "log2": 1, "sqrt": 1, "rsqrt": 1, "abs": 1, "sigmoid": 1,
    "softplus": 1, "tanh": 1, "max": 2, "min": 2, "select": 3, "recip": 1,
    # floor: value expressions are float, so integer division of coordinates reads floor(row() / 4)
    "floor": 1,
    # the coordinates of the element being computed in the destination tile: col() its index in the last
    # dim, row() over all the others flattened; causal masks such as select(col() <= row(), x, 0)
    "row": 0, "col": 0,
}

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|0x[0-9a-fA-F]+|\d+)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)"
    r"|(?P<op>&&|\|\||<=|>=|==|!=|[-+*/%<>!(),?:]))",
    re.ASCII,  # ASCII digits and whitespace only: no Unicode digits/spaces as lookalikes
)

_BINARY_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
                "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_CMP = {"<", "<=", ">", ">=", "==", "!="}
_LOGIC = {"&&", "||"}


_WS = " \t\n\r\f\v"  # the whitespace _TOKEN skips (ASCII)


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip(_WS) == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character {text[pos:].lstrip(_WS)[:1]!r}", text, pos)
        kind = m.lastgroup
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str, funcs: Mapping[str, int]):
        if len(text) > 4000:
            raise ExprError("expression longer than 4000 characters")
        self.text, self.funcs = text, funcs
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self):
        return self.toks[self.i]

    def take(self):
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, val: str):
        kind, v, pos = self.take()
        if v != val:
            raise ExprError(f"expected {val!r}, found {v or 'end of input'!r}", self.text, pos)

    def parse(self) -> Node:
        node = self.expr(0)
        kind, v, pos = self.peek()
        if kind != "end":
            raise ExprError(f"unexpected {v!r}", self.text, pos)
        return node

    def expr(self, min_prec: int) -> Node:
        self.depth += 1
        if self.depth > 100:
            raise ExprError("expression nested too deeply", self.text)
        left = self.unary()
        while True:
            kind, v, pos = self.peek()
            prec = _BINARY_PREC.get(v) if kind == "op" else None
            if prec is None or prec < min_prec:
                break
            self.take()
            right = self.expr(prec + 1)
            left = Bin(v, left, right)
        self.depth -= 1
        return left

    def unary(self) -> Node:
        kind, v, pos = self.take()
        if kind == "op" and v in ("-", "!"):
            a = self.unary()
            if v == "-" and isinstance(a, Num):
                return Num(-a.value)
            return Un(v, a)
        if kind == "op" and v == "+":
            return self.unary()
        if kind == "op" and v == "(":
            e = self.expr(0)
            self.expect(")")
            return e
        if kind == "num":
            if v.startswith("0x"):
                return Num(int(v, 16))
            if re.fullmatch(r"\d+", v):
                n = int(v)
                if n > 2**63:
                    raise ExprError(f"integer literal {v} does not fit in 64 bits", self.text, pos)
                return Num(n)
            return Num(float(v))
        if kind == "name":
            if self.peek()[1] == "(":
                if v not in self.funcs:
                    raise ExprError(f"unknown function {v!r} (allowed: {', '.join(sorted(self.funcs))})", self.text, pos)
                self.take()
                args: list[Node] = []
                if self.peek()[1] != ")":
                    while True:
                        args.append(self.expr(0))
                        if self.peek()[1] == ",":
                            self.take()
                            continue
                        break
                self.expect(")")
                arity = self.funcs[v]
                if len(args) not in (arity if isinstance(arity, tuple) else (arity,)):
                    want = " or ".join(map(str, arity)) if isinstance(arity, tuple) else arity
                    raise ExprError(f"{v}() takes {want} argument(s), got {len(args)}", self.text, pos)
                return Call(v, tuple(args))
            return Var(v)
        raise ExprError(f"unexpected {v or 'end of input'!r}", self.text, pos)


MAX_HEIGHT = 200  # operator nesting, parentheses or long chains alike ("a+a+...+a" is left-deep)


def _height(node: Node) -> int:
    worst, stack = 0, [(node, 1)]
    while stack:
        n, h = stack.pop()
        worst = max(worst, h)
        if isinstance(n, Un):
            stack.append((n.a, h + 1))
        elif isinstance(n, Bin):
            stack.extend(((n.a, h + 1), (n.b, h + 1)))
        elif isinstance(n, Call):
            stack.extend((x, h + 1) for x in n.args)
    return worst


@lru_cache(maxsize=8192)
def _parse_cached(text: str, ctx: str) -> Node:
    funcs = {"index": INDEX_FUNCS, "cond": COND_FUNCS, "value": VALUE_FUNCS}[ctx]
    node = _Parser(text, funcs).parse()
    if _height(node) > MAX_HEIGHT:  # renderers and analyses recurse over the tree
        raise ExprError(f"expression has more than {MAX_HEIGHT} nested operations", text)
    if ctx == "index":
        _check_integer(node, text, allow_logic=False)
    elif ctx == "cond":
        _check_integer(node, text, allow_logic=True)
    return node


def _check_integer(node: Node, text: str, allow_logic: bool) -> None:
    for n in walk(node):
        if isinstance(n, Num) and isinstance(n.value, float):
            raise ExprError(f"index expressions are integer; found {n.value}", text)
        if isinstance(n, Bin) and (n.op in _CMP or n.op in _LOGIC) and not allow_logic:
            raise ExprError(f"comparison {n.op!r} is not allowed in an index expression", text)
        if isinstance(n, Un) and n.op == "!" and not allow_logic:
            raise ExprError("'!' is not allowed in an index expression", text)


def parse_index(text: Union[str, int]) -> Node:
    if isinstance(text, bool):
        raise ExprError("expected an integer expression, got a boolean")
    if isinstance(text, int):
        return Num(text)
    return _parse_cached(text, "index")


def parse_cond(text: Union[str, bool]) -> Node:
    if isinstance(text, bool):
        return Num(1 if text else 0)
    return _parse_cached(text, "cond")


def parse_value(text: Union[str, int, float]) -> Node:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Num(text)
    return _parse_cached(str(text), "value")


def walk(node: Node) -> Iterable[Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, Un):
            stack.append(n.a)
        elif isinstance(n, Bin):
            stack.extend((n.a, n.b))
        elif isinstance(n, Call):
            stack.extend(n.args)


def free_vars(node: Node) -> set[str]:
    return {n.name for n in walk(node) if isinstance(n, Var)}


# --------------------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class Fact:
    """What is known about an integer value: lo <= v <= hi and v % div == 0."""

    lo: float = -INF
    hi: float = INF
    div: int = 1

    @staticmethod
    def const(v: int) -> "Fact":
        return Fact(v, v, abs(v) if v else 0)  # div 0 means "zero": divisible by everything

    @property
    def nonneg(self) -> bool:
        return self.lo >= 0

    def divisible_by(self, d: int) -> bool:
        return self.div == 0 or (d != 0 and self.div % d == 0)


def _gcd(a: int, b: int) -> int:
    if a == 0:
        return b
    if b == 0:
        return a
    return math.gcd(a, b)


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0
    return a * b


def facts(node: Node, env: Mapping[str, Fact]) -> Fact:
    """Interval and divisibility of an integer expression. Unknown variables are unbounded."""
    if isinstance(node, Num):
        return Fact.const(int(node.value))
    if isinstance(node, Var):
        return env.get(node.name, Fact())
    if isinstance(node, Un):
        a = facts(node.a, env)
        if node.op == "-":
            return Fact(-a.hi, -a.lo, a.div)
        return Fact(0, 1, 1)
    if isinstance(node, Call):
        args = [facts(x, env) for x in node.args]
        if node.fn == "min":
            return Fact(min(args[0].lo, args[1].lo), min(args[0].hi, args[1].hi), _gcd(args[0].div, args[1].div))
        if node.fn == "max":
            return Fact(max(args[0].lo, args[1].lo), max(args[0].hi, args[1].hi), _gcd(args[0].div, args[1].div))
        if node.fn == "cdiv":
            a, b = args
            if b.lo > 0 and a.lo >= 0:
                return Fact(math.ceil(a.lo / b.hi) if b.hi < INF else 0, math.ceil(a.hi / b.lo) if a.hi < INF else INF, 1)
            return Fact()
        if node.fn == "elect_one":
            return Fact(0, 1, 1)
        if node.fn == "ld":
            return Fact(args[2].lo, args[3].hi, 1)
        return Fact()
    assert isinstance(node, Bin)
    a, b = facts(node.a, env), facts(node.b, env)
    op = node.op
    if op in _CMP or op in _LOGIC:
        return Fact(0, 1, 1)
    if op == "+":
        return Fact(a.lo + b.lo, a.hi + b.hi, _gcd(a.div, b.div))
    if op == "-":
        return Fact(a.lo - b.hi, a.hi - b.lo, _gcd(a.div, b.div))
    if op == "*":
        cands = [_mul(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return Fact(min(cands), max(cands), a.div * b.div)
    if op in ("/", "%"):
        if b.lo == b.hi and b.lo > 0:
            c = int(b.lo)
            if op == "/":
                lo = math.floor(a.lo / c) if a.lo > -INF else -INF
                hi = math.floor(a.hi / c) if a.hi < INF else INF
                div = a.div // c if a.div and a.div % c == 0 else (0 if a.div == 0 else 1)
                return Fact(lo, hi, div)
            if a.divisible_by(c):
                return Fact.const(0)
            if a.nonneg:
                return Fact(0, min(c - 1, a.hi), _gcd(a.div, c) if a.div else c)
            return Fact(-(c - 1), c - 1, _gcd(a.div, c) if a.div else c)
        if b.lo > 0 and a.nonneg:
            if op == "/":
                return Fact(0, a.hi / b.lo if a.hi < INF else INF, 1)
            return Fact(0, b.hi - 1, 1)
        return Fact()
    return Fact()


def evaluate(node: Node, env: Mapping[str, Union[int, float]]) -> Union[int, float]:
    """Evaluate with integer floor semantics for / and % on integers."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        if node.name not in env:
            raise ExprError(f"unbound variable {node.name!r}")
        return env[node.name]
    if isinstance(node, Un):
        v = evaluate(node.a, env)
        return -v if node.op == "-" else int(not v)
    if isinstance(node, Call):
        args = [evaluate(x, env) for x in node.args]
        fns: dict[str, Callable] = {
            "min": min, "max": max, "cdiv": lambda a, b: -(-a // b), "exp": math.exp, "exp2": lambda x: 2.0**x,
            "log": math.log, "log2": math.log2, "sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x),
            "abs": abs, "sigmoid": lambda x: 1 / (1 + math.exp(-x)), "softplus": lambda x: math.log1p(math.exp(x)),
            "tanh": math.tanh, "select": lambda c, a, b: a if c else b, "recip": lambda x: 1 / x,
            "floor": math.floor,
        }
        if node.fn not in fns:
            raise ExprError(f"cannot evaluate {node.fn}() statically")
        return fns[node.fn](*args)
    a, b = evaluate(node.a, env), evaluate(node.b, env)
    op = node.op
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if isinstance(a, int) and isinstance(b, int):
            return a // b
        return a / b
    if op == "%":
        return a % b
    return int({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b,
                "&&": bool(a) and bool(b), "||": bool(a) or bool(b)}[op])


def try_const(node: Node, env: Mapping[str, Union[int, float]] | None = None) -> Union[int, float, None]:
    try:
        return evaluate(node, env or {})
    except (ExprError, ZeroDivisionError, OverflowError, ValueError, TypeError):
        return None


# ----------------------------------------------------------------------- canonical polynomials
Poly = tuple  # sorted tuple of (monomial, coeff); monomial = sorted tuple of atom strings


def _poly(node: Node) -> dict[tuple, int] | None:
    if isinstance(node, Num):
        if isinstance(node.value, float):
            return None
        return {(): node.value} if node.value else {}
    if isinstance(node, Var):
        return {(node.name,): 1}
    if isinstance(node, Un) and node.op == "-":
        p = _poly(node.a)
        return None if p is None else {k: -v for k, v in p.items()}
    if isinstance(node, Bin) and node.op in "+-*":
        pa, pb = _poly(node.a), _poly(node.b)
        if pa is None or pb is None:
            return None
        out: dict[tuple, int] = {}
        if node.op in "+-":
            s = 1 if node.op == "+" else -1
            for k, v in pa.items():
                out[k] = out.get(k, 0) + v
            for k, v in pb.items():
                out[k] = out.get(k, 0) + s * v
        else:
            for ka, va in pa.items():
                for kb, vb in pb.items():
                    k = tuple(sorted(ka + kb))
                    out[k] = out.get(k, 0) + va * vb
        return {k: v for k, v in out.items() if v}
    if isinstance(node, Bin) and node.op in "/%":
        folded = _fold_div(node)
        if folded is not None:
            return folded
    # Opaque atom: / % calls comparisons, canonicalised recursively.
    atom = _atom(node)
    return None if atom is None else {(atom,): 1}


def _fold_div(node: Bin) -> dict[tuple, int] | None:
    """x % 1 = 0, x / 1 = x, and constant / constant with C's truncation (a pipeline's slot `(0) % 1` is 0)."""
    pb = _poly(node.b)
    if pb is None or set(pb) - {()} or not pb:
        return None
    d = pb[()]
    if abs(d) == 1:
        if node.op == "%":
            return {}
        pa = _poly(node.a)
        return None if pa is None else {k: v * d for k, v in pa.items()}
    pa = _poly(node.a)
    if pa is None or set(pa) - {()}:
        return None
    n = pa.get((), 0)
    q = (abs(n) // abs(d)) * (1 if (n >= 0) == (d > 0) else -1)
    v = q if node.op == "/" else n - q * d
    return {(): v} if v else {}


def _atom(node: Node) -> str | None:
    if isinstance(node, Bin):
        a, b = canon(node.a), canon(node.b)
        if a is None or b is None:
            return None
        return f"({a}{node.op}{b})"
    if isinstance(node, Call):
        args = [canon(x) for x in node.args]
        if any(x is None for x in args):
            return None
        return f"{node.fn}({','.join(args)})"
    if isinstance(node, Un):
        a = canon(node.a)
        return None if a is None else f"{node.op}{a}"
    return None


def canon(node: Node) -> str | None:
    """A canonical string: two integer expressions with the same canon are equal for all values."""
    p = _poly(node)
    if p is None:
        return None
    if not p:
        return "0"
    terms = []
    for mono, c in sorted(p.items()):
        terms.append(f"{c}" if not mono else f"{c}*{'*'.join(mono)}")
    return "+".join(terms)


def same(a: Union[str, int], b: Union[str, int]) -> bool:
    """Symbolic equality of two integer expressions (sound, not complete)."""
    try:
        ca, cb = canon(parse_index(a)), canon(parse_index(b))
    except ExprError:
        return False
    return ca is not None and ca == cb


def substitute(node: Node, mapping: Mapping[str, Node]) -> Node:
    if isinstance(node, Var):
        return mapping.get(node.name, node)
    if isinstance(node, Un):
        return Un(node.op, substitute(node.a, mapping))
    if isinstance(node, Bin):
        return Bin(node.op, substitute(node.a, mapping), substitute(node.b, mapping))
    if isinstance(node, Call):
        return Call(node.fn, tuple(substitute(x, mapping) for x in node.args))
    return node


# ---------------------------------------------------------------------------------- rendering
def to_text(node: Node) -> str:
    """Render back to the IR's own syntax (fully parenthesised where needed)."""
    return _render(node, lambda v: v.name, 0, c_mode=False)


def to_c(node: Node, var: Callable[[Var], str], float_mode: bool = False) -> str:
    """Render as C. `var` maps a variable to C text; `float_mode` renders literals as floats."""
    return _render(node, var, 0, c_mode=True, float_mode=float_mode)


_C_FUNCS = {"exp": "cake::fexp", "exp2": "exp2f", "log": "__logf", "log2": "__log2f", "sqrt": "sqrtf",
            "rsqrt": "cake::frsqrt", "abs": "fabsf", "tanh": "tanhf", "sigmoid": "cake::sigmoidf",
            "softplus": "cake::softplusf", "recip": "cake::frcp", "floor": "floorf", "elect_one": "cake::elect_one_sync",
            "ld": "cake::ld_index"}


def _render(node: Node, var, parent_prec: int, c_mode: bool, float_mode: bool = False) -> str:
    if isinstance(node, Num):
        v = node.value
        if c_mode and float_mode:
            return repr(float(v)) + "f" if math.isfinite(float(v)) else ("cake::inf()" if v > 0 else "(-cake::inf())")
        if isinstance(v, int) and c_mode and abs(v) > 2**31 - 1:
            return f"{v}LL"
        s = repr(v)
        return f"({s})" if (isinstance(v, (int, float)) and v < 0 and parent_prec > 0) else s
    if isinstance(node, Var):
        return var(node)
    if isinstance(node, Un):
        inner = _render(node.a, var, 7, c_mode, float_mode)
        return f"{node.op}{inner}"
    if isinstance(node, Call):
        args = [_render(a, var, 0, c_mode, float_mode) for a in node.args]
        if not c_mode:
            return f"{node.fn}({', '.join(args)})"
        if node.fn == "select":
            return f"(({args[0]}) ? ({args[1]}) : ({args[2]}))"
        if node.fn == "cdiv":
            return f"((({args[0]}) + ({args[1]}) - 1) / ({args[1]}))"
        if node.fn in ("min", "max"):
            return f"{'f' if float_mode else ''}{node.fn}({args[0]}, {args[1]})"
        if node.fn == "ld":
            args = args[:4]       # the estimate is for the cost model only
        if node.fn in ("row", "col"):
            return f"(float)cake_{node.fn}" if float_mode else f"cake_{node.fn}"
        return f"{_C_FUNCS.get(node.fn, node.fn)}({', '.join(args)})"
    prec = _BINARY_PREC[node.op]
    a = _render(node.a, var, prec, c_mode, float_mode)
    b = _render(node.b, var, prec + 1, c_mode, float_mode)
    s = f"{a} {node.op} {b}"
    return f"({s})" if prec < parent_prec else s
