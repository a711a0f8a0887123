"""Primitive variants: an occurrence of an accepted IR primitive (primitives/) re-instantiated with
other parameter values.

An occurrence is a window of consecutive sibling statements equal to the primitive's expansion for
some parameter values: the TEMPLATE is matched against the window (`primitives.match`, each
{"$param": name} leaf binding one value) and `expand` with the bound values must give the window back
(modules without a TEMPLATE are never matched). The other values offered are, in this order, the
parameters of the primitive's other occurrences in the program, its EXAMPLES (the parameters observed
when it was promoted), and each int parameter halved (when even) or doubled. Parameters bound under
an `id` key keep the occurrence's own values, so a variant never copies another statement's author id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .base import Tactic, TacticError

MAX_CHOICES = 16


@dataclass
class Occurrence:
    name: str
    at: str          # JSON pointer of the statement list
    start: int
    end: int
    params: dict


def matchable() -> dict:
    """NAME -> module of the accepted primitives that have a statement TEMPLATE (a list)."""
    from primitives import load_primitives
    return {n: m for n, m in load_primitives().items() if isinstance(getattr(m, "TEMPLATE", None), list)
            and getattr(m, "TEMPLATE")}


def bind(mod, window: list) -> Optional[dict]:
    """The parameters for which `mod` expands to exactly `window`, or None."""
    from primitives import match
    values = match(mod.TEMPLATE, window)
    if values is None or set(values) != set(getattr(mod, "PARAMS", {})):
        return None
    try:
        return values if mod.expand(**values) == window else None
    except Exception:  # noqa: BLE001 - values of the wrong type: not an occurrence
        return None


def occurrences(ir: dict, prims: Optional[dict] = None) -> list[Occurrence]:
    """Every occurrence of an accepted primitive in a Kernel document, in program order."""
    from primitives import statement_lists
    prims = matchable() if prims is None else prims
    out = []
    for at, lst in statement_lists(ir):
        for name, mod in sorted(prims.items()):
            n = len(mod.TEMPLATE)
            for start in range(len(lst) - n + 1):
                values = bind(mod, lst[start:start + n])
                if values is not None:
                    out.append(Occurrence(name, at, start, start + n, values))
    return out


def id_params(template: Any, key: Optional[str] = None) -> set:
    """Parameters bound at an `id` key of the template (author ids: unique per kernel)."""
    from primitives import PARAM
    if isinstance(template, dict):
        if set(template) == {PARAM}:
            return {template[PARAM]} if key == "id" else set()
        return set().union(*(id_params(v, k) for k, v in template.items()))
    if isinstance(template, list):
        return set().union(*(id_params(v) for v in template))
    return set()


def variants(occ: Occurrence, others: list[Occurrence], mod) -> list[dict]:
    """Parameter sets for this occurrence other than its own (see the module docstring), each expandable."""
    types = dict(getattr(mod, "PARAMS", {}))
    keep = {k: occ.params[k] for k in id_params(mod.TEMPLATE) if k in occ.params}
    sets = [{**o.params, **keep} for o in others] + [{**e, **keep} for e in getattr(mod, "EXAMPLES", []) or []
                                                   if isinstance(e, dict)]
    for k, kind in types.items():
        v = occ.params.get(k)
        if kind != "int" or k in keep or isinstance(v, bool) or not isinstance(v, int):
            continue
        sets += [{**occ.params, k: v // 2}] if v >= 2 and v % 2 == 0 else []
        sets += [{**occ.params, k: 2 * v}] if v >= 1 else []
    out, seen = [], {json.dumps(occ.params, sort_keys=True)}
    for s in sets:
        key = json.dumps(s, sort_keys=True)
        if key in seen or set(s) != set(types):
            continue
        seen.add(key)
        try:
            mod.expand(**s)
        except Exception:  # noqa: BLE001 - an example of another type: not offered
            continue
        out.append(s)
    return out


def _list_at(ir: dict, pointer: str) -> list:
    node: Any = ir
    try:
        for part in pointer.strip("/").split("/"):
            node = node[int(part)] if isinstance(node, list) else node[part]
    except (KeyError, IndexError, ValueError, TypeError):
        raise TacticError(f"no statement list at {pointer}") from None
    if not isinstance(node, list):
        raise TacticError(f"{pointer} is not a statement list")
    return node


class PrimitiveVariant(Tactic):
    def supports(self, arch: Optional[str]) -> bool:
        # with no accepted primitive it applies to no program: retrieval leaves it out of prompts
        return bool(matchable()) and super().supports(arch)

    def precondition(self, g: dict) -> Optional[str]:
        prims = matchable()
        if not prims:
            return "no accepted IR primitive with a TEMPLATE (primitives/ holds none)"
        if not occurrences(g["ir"], prims):
            return "no occurrence of an accepted primitive in the program"
        return None

    def choices(self, g: dict) -> list[dict]:
        prims = matchable()
        occs = occurrences(g["ir"], prims)
        per_occ = []
        for occ in occs:
            others = [o for o in occs if o.name == occ.name and o is not occ]
            per_occ.append([{"primitive": occ.name, "at": occ.at, "start": occ.start, "params": p}
                            for p in variants(occ, others, prims[occ.name])])
        out = []                      # round robin over the occurrences, so each gets a share of the cap
        for i in range(max((len(x) for x in per_occ), default=0)):
            out += [x[i] for x in per_occ if i < len(x)]
        return out[:MAX_CHOICES]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        mod = matchable().get(params.get("primitive"))
        if mod is None:
            raise TacticError(f"no accepted primitive {params.get('primitive')!r}")
        lst, start, n = _list_at(ir, params["at"]), int(params["start"]), len(mod.TEMPLATE)
        if bind(mod, lst[start:start + n]) is None:
            raise TacticError(f"no occurrence of {mod.NAME} at {params['at']}/{start}")
        try:
            lst[start:start + n] = mod.expand(**params["params"])
        except Exception as e:  # noqa: BLE001 - wrong parameters for this primitive
            raise TacticError(f"{mod.NAME}: {e}") from None
        return ir


TACTICS = [PrimitiveVariant(
    name="primitive_variant",
    description="Re-instantiate an accepted IR primitive (a recurring statement sequence promoted from "
                "successful programs) where the program uses it, with other parameter values: those of "
                "its other occurrences in the program, those observed when it was promoted, or an integer "
                "parameter halved or doubled.",
    keywords=("primitive", "recurring", "statement sequence", "parameters", "variant", "template"),
    step_key=("primitive", "at", "start"),
    params_doc="primitive: an accepted primitive's name; at, start: the window (statement-list pointer and "
               "first index) of its occurrence; params: its new parameter values",
)]
