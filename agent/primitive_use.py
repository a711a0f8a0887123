"""Accepted IR primitives in LLM replies: the prompt's listing and the expansion of primitive statements.

A reply may put `{"op": "primitive", "name": NAME, "params": {...}}` wherever a statement may stand
(the prologue, a role body, the body of a for / block / last_cta, an if's then / else; in a Kernel or
in each kernel of a Program, whole or through a JSON Patch). `expand_primitive_statements` replaces
each one with the primitive's statements (`primitives.expand`), spliced in place, before the program
is loaded; cake_ir itself never sees the op. A `note` on the statement is allowed and dropped. The
expanded statements are not searched again (promoted templates come from real programs, which hold no
primitive statements).
"""
from __future__ import annotations

import copy
import json
from typing import Any

PRIMITIVE_OP = "primitive"
ALLOWED_KEYS = {"op", "name", "params", "note"}
MAX_TEMPLATE_CHARS = 900        # one primitive's template in the prompt; longer ones are cut
MAX_EXAMPLE_CHARS = 300
_MARK = "\u00a7"                # wraps a parameter name while the template is rendered to JSON


class PrimitiveUseError(ValueError):
    """A primitive statement that cannot be expanded: unknown name or wrong parameters."""


def uses_primitives(ir: Any) -> bool:
    """Whether any statement list of the document holds a primitive statement."""
    from primitives import statement_lists
    return any(isinstance(st, dict) and st.get("op") == PRIMITIVE_OP
               for _, lst in statement_lists(ir) for st in lst)


def signature(name: str, params: dict) -> str:
    return f"{name}({', '.join(f'{k}: {t}' for k, t in params.items())})"


def _legal(prims: dict) -> str:
    if not prims:
        return "no primitives are accepted, so op \"primitive\" cannot be used"
    return "accepted primitives: " + "; ".join(signature(n, dict(getattr(m, "PARAMS", {})))
                                               for n, m in sorted(prims.items()))


def _expand_one(st: dict, path: str, prims: dict) -> list:
    extra = sorted(set(st) - ALLOWED_KEYS)
    if extra:
        raise PrimitiveUseError(f"{path}: a primitive statement has only op, name and params; unexpected {extra}")
    name, params = st.get("name"), st.get("params", {})
    if not isinstance(name, str) or name not in prims:
        raise PrimitiveUseError(f"{path}: unknown primitive {name!r}; {_legal(prims)}")
    mod = prims[name]
    sig = signature(name, dict(getattr(mod, "PARAMS", {})))
    if not isinstance(params, dict):
        raise PrimitiveUseError(f"{path}: params of primitive {name!r} must be an object; expected {sig}")
    try:
        out = mod.expand(**params)
    except Exception as e:  # noqa: BLE001 - TypeError from instantiate, or a hand-written expand's error
        raise PrimitiveUseError(f"{path}: primitive {name!r} with params {json.dumps(params)[:300]}: {e}; "
                                f"expected {sig}") from None
    return copy.deepcopy(list(out))


def _expand_list(lst: list, path: str, prims: dict) -> list:
    out = []
    for i, st in enumerate(lst):
        p = f"{path}/{i}"
        if isinstance(st, dict) and st.get("op") == PRIMITIVE_OP:
            out.extend(_expand_one(st, p, prims))
            continue
        if isinstance(st, dict):
            for key in ("body", "then", "else"):
                if isinstance(st.get(key), list):
                    st[key] = _expand_list(st[key], f"{p}/{key}", prims)
        out.append(st)
    return out


def expand_primitive_statements(ir: Any) -> Any:
    """`ir` with every primitive statement replaced by its expansion (a new document; `ir` itself when
    it uses none, so a reply without primitives costs one walk). Raises PrimitiveUseError naming the
    statement's JSON pointer (in the document as given), the primitive and what is legal."""
    if not isinstance(ir, dict) or not uses_primitives(ir):
        return ir
    from primitives import load_primitives
    prims = load_primitives()
    out = copy.deepcopy(ir)
    kernels = [(f"/kernels/{k}", kd) for k, kd in enumerate(out["kernels"]) if isinstance(kd, dict)] \
        if isinstance(out.get("kernels"), list) else [("", out)]
    for prefix, kd in kernels:
        if isinstance(kd.get("prologue"), list):
            kd["prologue"] = _expand_list(kd["prologue"], f"{prefix}/prologue", prims)
        for ri, role in enumerate(kd.get("roles") if isinstance(kd.get("roles"), list) else []):
            if isinstance(role, dict) and isinstance(role.get("body"), list):
                role["body"] = _expand_list(role["body"], f"{prefix}/roles/{ri}/body", prims)
    return out


# ------------------------------------------------------------------------------ the prompt's listing
def render_template(template: Any) -> str:
    """Compact JSON of a template with each parameter leaf written <name>."""
    from primitives import PARAM

    def sub(node):
        if isinstance(node, dict):
            if set(node) == {PARAM}:
                return f"{_MARK}{node[PARAM]}{_MARK}"
            return {k: sub(v) for k, v in node.items()}
        if isinstance(node, list):
            return [sub(v) for v in node]
        return node
    text = json.dumps(sub(template), separators=(",", ":"), ensure_ascii=False)
    return text.replace(f'"{_MARK}', "<").replace(f'{_MARK}"', ">")


def primitive_line(card: dict) -> str:
    """One accepted primitive for the prompt: signature, statement template (cut at
    MAX_TEMPLATE_CHARS) and one example of its parameters."""
    line = f"- {signature(card['name'], card['params'])}"
    if card.get("template") is not None:
        tpl = render_template(card["template"])
        if len(tpl) > MAX_TEMPLATE_CHARS:
            tpl = tpl[:MAX_TEMPLATE_CHARS] + " [... cut]"
        line += f" expands to {tpl}"
    if card.get("examples"):
        ex = json.dumps(card["examples"][0], separators=(",", ":"))
        if len(ex) <= MAX_EXAMPLE_CHARS:
            line += f"; e.g. params {ex}"
    return line
