"""Macro tactics: a fixed sequence of existing tactics applied in order, as one tactic.

Promoted from tactic sequences that improved candidates on several tasks or shapes
(knowledge/promote/tactic.py writes tactics/<name>.py with `TACTICS = [MacroTactic(...)]`). This module
defines no TACTICS itself, so tactic discovery imports it and finds nothing to register.

Parameters: {"steps": [params of step 1, params of step 2, ...]}. `choices` are the observed parameter
variants (`variants`) that apply to the genome, checked by applying them; the precondition is the first
step's. Applying runs each step's own `apply`, so the resulting recipe lists the individual steps
(family tactics regenerate from the family and replay, IR tactics append steps) and replays never
need the macro.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

from .base import Tactic, TacticError, get_tactic


@dataclass
class MacroTactic(Tactic):
    steps: tuple[str, ...] = ()                  # tactic names, in order
    variants: list = field(default_factory=list)  # observed [params of step 1, params of step 2, ...]

    def _tactics(self) -> list[Tactic]:
        return [get_tactic(n) for n in self.steps]

    def precondition(self, g: dict) -> Optional[str]:
        if not self.steps:
            return "empty macro"
        return self._tactics()[0].precondition(g)

    def _run(self, g: dict, params: dict) -> dict:
        plist = params.get("steps")
        if not isinstance(plist, list) or len(plist) != len(self.steps):
            raise TacticError(f"{self.name}: params must be {{'steps': [{len(self.steps)} parameter dicts]}}")
        cur = {"ir": g["ir"], "recipe": g.get("recipe")}
        for t, p in zip(self._tactics(), plist):
            cur = t.apply(cur, dict(p))       # raises TacticError when a step does not apply
        return cur

    def choices(self, g: dict) -> list[dict]:
        out = []
        for v in self.variants:
            params = {"steps": copy.deepcopy(list(v))}
            try:
                self._run(g, params)
            except Exception:  # noqa: BLE001 - a variant that does not apply here is not a choice
                continue
            out.append(params)
        return out

    def apply(self, g: dict, params: dict) -> dict:
        why = self.precondition(g)
        if why:
            raise TacticError(f"{self.name}: {why}")
        out = self._run(g, params)
        if out["ir"] == g["ir"]:
            raise TacticError(f"{self.name}{params}: no change")
        return out

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        return self._run({"ir": ir, "recipe": g.get("recipe")}, params)["ir"]

    def card(self) -> dict:
        return {**super().card(), "steps": list(self.steps)}
