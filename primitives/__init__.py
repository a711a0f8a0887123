"""IR primitives: named, parametrised composite statements (a fixed sequence of CAKE IR statements).

A primitive is a module here defining

    NAME = "pipe_wait_wgmma_pipe_release"
    PARAMS = {"acc_buf": "str", "k": "int", ...}     # parameter -> type: str | int | float | bool | expr
    def expand(**params) -> list[dict]               # the IR statement dicts, in program order

and, when promoted, TEMPLATE (the statements with {"$param": name} leaves) and EXAMPLES (the observed
parameter sets). Most are promoted from recurring statement subtrees of successful candidates
(knowledge/promote/primitive.py); `instantiate` is the template expansion they share and `match` its
inverse. Discovery is like tactics/ and rules/: every module of this package that defines NAME and
expand, and the `cake.primitives` entry points of installed packages; modules whose name starts with
`_` and sub-packages (e.g. a `proposed/` folder) are never imported.

Use from the builder (cake_ir stays free of imports from here):

    from primitives import emit
    with kb.role("consumer", warps=(4, 8)) as r:
        with r.for_("kt", 0, "K / BK"):
            emit(r, "pipe_wait_wgmma_pipe_release", acc_buf="acc", ...)

Use by the proposers: the LLM prompt lists them (`cards`) and a reply may write
{"op": "primitive", "name": ..., "params": {...}} as a statement (agent/primitive_use.py expands it);
the search tactic primitive_variant re-instantiates their occurrences (tactics/primitive_variant.py).
"""
from __future__ import annotations

import copy
import importlib
import json
import pkgutil
from types import ModuleType
from typing import Any, Optional

PARAM = "$param"            # a template leaf {"$param": name} is replaced by that parameter's value
NESTED = ("body", "then", "else")   # statement fields holding statement lists (for, block, last_cta; if)
TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "expr": (int, str)}

_CACHE: dict[str, dict[str, ModuleType]] = {}


def _check(name: str, kind: str, value: Any) -> None:
    ok = TYPES.get(kind)
    if ok is None:
        raise TypeError(f"parameter {name}: unknown type {kind!r}")
    if isinstance(value, bool) and kind not in ("bool",):
        raise TypeError(f"parameter {name}: expected {kind}, got bool")
    if not isinstance(value, ok):
        raise TypeError(f"parameter {name}: expected {kind}, got {type(value).__name__}")


def instantiate(template: Any, types: dict[str, str], values: dict[str, Any]) -> Any:
    """A deep copy of `template` with every {"$param": name} replaced by values[name] (type-checked;
    missing or unknown parameters raise)."""
    missing = sorted(set(types) - set(values))
    extra = sorted(set(values) - set(types))
    if missing or extra:
        raise TypeError(f"parameters: missing {missing}, unknown {extra}")
    for n, v in values.items():
        _check(n, types[n], v)

    def sub(node):
        if isinstance(node, dict):
            if set(node) == {PARAM}:
                return copy.deepcopy(values[node[PARAM]])
            return {k: sub(v) for k, v in node.items()}
        if isinstance(node, list):
            return [sub(v) for v in node]
        return node
    return sub(template)


def _same(a: Any, b: Any) -> bool:
    """JSON equality that tells 1, 1.0 and true apart (a template literal 0.0 is not the program's 0)."""
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    return type(a) is type(b) and a == b


def match(template: Any, node: Any) -> Optional[dict]:
    """The parameter values that make `instantiate(template, ...)` equal `node`, or None when no values
    do (a parameter used twice must bind one value). The inverse of `instantiate`, without type checks."""
    values: dict[str, Any] = {}

    def rec(t, n) -> bool:
        if isinstance(t, dict):
            if set(t) == {PARAM}:
                name = t[PARAM]
                if name in values:
                    return _same(values[name], n)
                values[name] = copy.deepcopy(n)
                return True
            return isinstance(n, dict) and set(t) == set(n) and all(rec(t[k], n[k]) for k in t)
        if isinstance(t, list):
            return isinstance(n, list) and len(t) == len(n) and all(rec(a, b) for a, b in zip(t, n))
        return _same(t, n)
    return values if rec(template, node) else None


def statement_lists(ir: dict, prefix: str = ""):
    """(JSON pointer, list) for every statement list of a Kernel document (prologue, role bodies, then
    the bodies and branches nested in their statements, depth first) or of each kernel of a Program
    (`/kernels/<k>/...`). Malformed parts (a body that is not a list) are skipped."""
    if not isinstance(ir, dict):
        return
    if isinstance(ir.get("kernels"), list):
        for k, kernel in enumerate(ir["kernels"]):
            yield from statement_lists(kernel, f"{prefix}/kernels/{k}")
        return

    def rec(lst, path):
        yield path, lst
        for i, st in enumerate(lst):
            if isinstance(st, dict):
                for key in NESTED:
                    if isinstance(st.get(key), list):
                        yield from rec(st[key], f"{path}/{i}/{key}")
    if isinstance(ir.get("prologue"), list):
        yield from rec(ir["prologue"], f"{prefix}/prologue")
    for ri, role in enumerate(ir.get("roles") if isinstance(ir.get("roles"), list) else []):
        if isinstance(role, dict) and isinstance(role.get("body"), list):
            yield from rec(role["body"], f"{prefix}/roles/{ri}/body")


def load_primitives(package: str = "primitives", entry_points: bool = True) -> dict[str, ModuleType]:
    """NAME -> module for every primitive module of `package`, plus installed packages' `cake.primitives`
    entry points (cached). Nothing else is ever imported: not sub-packages, not proposals."""
    if package in _CACHE:
        return _CACHE[package]
    pkg = importlib.import_module(package)
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue          # never a sub-package (proposed/ ...) nor a helper
        mod = importlib.import_module(f"{package}.{info.name}")
        name = getattr(mod, "NAME", None)
        if not isinstance(name, str) or not callable(getattr(mod, "expand", None)):
            continue
        if name in found:
            raise RuntimeError(f"duplicate primitive name {name!r}")
        found[name] = mod
    if entry_points:   # installed packages register primitive modules like rules and tactics
        from importlib.metadata import entry_points as eps
        for ep in eps(group="cake.primitives"):
            try:
                mod = ep.load()
            except Exception:  # noqa: BLE001 - a broken plugin must not break the others
                continue
            name = getattr(mod, "NAME", None)
            if isinstance(name, str) and callable(getattr(mod, "expand", None)) and name not in found:
                found[name] = mod
    _CACHE[package] = found
    return found


def get(name: str) -> ModuleType:
    prims = load_primitives()
    if name not in prims:
        raise KeyError(f"unknown primitive {name!r}; known: {', '.join(sorted(prims)) or 'none'}")
    return prims[name]


def expand(name: str, **params) -> list[dict]:
    return get(name).expand(**params)


def emit(body, name: str, **params) -> list[dict]:
    """Append the primitive's statements to a cake_ir.builder body (a RoleBuilder, kb.prologue, or the
    body of an open for_/if_ block) and return them."""
    out = []
    for st in expand(name, **params):
        st = dict(st)
        out.append(body.add(st.pop("op"), **st))
    return out


def cards() -> list[dict]:
    """Name, parameters, description, statement template (None for a module without TEMPLATE) and
    example parameter sets (the module's EXAMPLES, else none) of every primitive (for listings and prompts)."""
    return [{"name": n, "params": dict(getattr(m, "PARAMS", {})), "description": (m.__doc__ or "").strip(),
             "template": getattr(m, "TEMPLATE", None), "examples": list(getattr(m, "EXAMPLES", []) or [])}
            for n, m in sorted(load_primitives().items())]


__all__ = ["instantiate", "match", "statement_lists", "load_primitives", "get", "expand", "emit", "cards",
           "PARAM", "NESTED", "TYPES"]
