"""Repair: apply a JSON-Patch fix that a verifier diagnostic suggests for this program."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError
from .jsonpatch import PatchError, apply_patch


def _fixes(g: dict) -> list[dict]:
    return [d for d in g.get("diagnostics") or [] if d.get("severity", "error") == "error" and d.get("fix")]


class VerifierFix(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        return None if _fixes(g) else "no verifier diagnostic with a fix for this program"

    def choices(self, g: dict) -> list[dict]:
        fixes = _fixes(g)
        out = [{"code": d["code"], "node": d.get("node"), "fix": d["fix"]} for d in fixes]
        if len(fixes) > 1:   # every suggested fix at once (distinct paths only)
            seen, ops = set(), []
            for d in fixes:
                for op in d["fix"]:
                    if op.get("path") not in seen:
                        seen.add(op.get("path"))
                        ops.append(op)
            out.insert(0, {"code": "all", "node": None, "fix": ops})
        return out

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        try:
            return apply_patch(ir, params["fix"], lenient_replace=True)
        except PatchError as e:
            raise TacticError(f"fix for {params.get('code')} at {params.get('node')}: {e}") from None


TACTICS = [VerifierFix(
    name="verifier_fix",
    kind="repair",
    description="Apply the JSON-Patch fix a verifier diagnostic proposes (e.g. a legal vector width, the "
                "stage count that fits shared memory) to a program that failed verification.",
    keywords=("repair", "fix", "diagnostic", "verify", "E-"),
    params_doc="fix: the diagnostic's JSON Patch (RFC 6902), applied leniently",
)]
