"""What every promoter returns: a Proposal is data (file contents + evidence), never imported code."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

KINDS = ("rule", "primitive", "calibration", "tactic")


@dataclass
class PromoteConfig:
    min_count: int = 3          # a cluster recurs when seen at least N times ...
    min_candidates: int = 2     # ... across M distinct candidates
    task: Optional[str] = None  # restrict the evidence to one task (None: all)
    gpu: str = "h200"           # calibration target
    max_error: float = 0.5      # |log(measured / predicted)| above which a cost prediction counts as large
    min_tasks: int = 2          # a macro tactic must have helped on this many tasks or shapes


@dataclass
class Proposal:
    kind: str                          # one of KINDS
    title: str
    fingerprint: str                   # stable digest of what is proposed: same evidence -> same fingerprint
    files: dict[str, str]              # repo-relative path -> content (the plugin, its tests, fixtures)
    evidence: dict[str, Any] = field(default_factory=dict)   # JSON-able: sizes, examples, before/after
    cluster_id: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"proposal kind {self.kind!r} not in {KINDS}")

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.fingerprint[:8]}"


def fingerprint(*parts: Any) -> str:
    """Digest of JSON-able parts (sorted keys), used as a proposal's identity."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()
