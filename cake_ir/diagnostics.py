"""Diagnostics: what every verifier rule, pass and backend step reports.

Codes are stable (`E-SYN-03`, `W-PERF-01`, `E-BACKEND-COMPILE`); the letter says the default
severity. docs/diagnostics.md is the catalog (generated from the rule modules' docstrings).
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

Severity = Literal["error", "warning", "note"]


class Diagnostic(BaseModel):
    code: str
    severity: Severity = "error"
    node: str = Field(description="JSON pointer of the offending node")
    node_id: Optional[str] = None
    related: list[str] = Field(default_factory=list)
    message: str
    legal: Optional[Any] = Field(default=None, description="legal values where a value is out of range")
    fix: Optional[list[dict]] = Field(default=None, description="RFC 6902 JSON Patch that fixes it")
    origin: Optional[str] = Field(default=None, description="sugar node this expanded node came from")

    def short(self) -> str:
        where = self.node + (f" [{self.node_id}]" if self.node_id else "")
        extra = f" (legal: {self.legal})" if self.legal is not None else ""
        return f"{self.code} {self.severity} at {where}: {self.message}{extra}"


def errors(diags: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diags if d.severity == "error"]


def to_json(diags: list[Diagnostic]) -> str:
    return json.dumps([d.model_dump(exclude_none=True) for d in diags], indent=2)


def sort_key(d: Diagnostic):
    sev = {"error": 0, "warning": 1, "note": 2}[d.severity]
    return (sev, d.node, d.code)
