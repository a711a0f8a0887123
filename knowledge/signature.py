"""Normalised failure signatures: the same mistake made by different candidates gets the same signature.

    signature(stage, code, message, node_path, ir) -> (sig, node_kind, template, features)

- template: the message with names and numbers abstracted (quoted names -> <name>, hex -> <hex>, file
  paths -> <path>, JSON pointers -> <ptr>, generated identifiers -> <id>, numbers -> <n>); diagnostic
  codes (E-RES-05, ptxas C7602) and arch names (sm_90a) are kept, they carry meaning.
- node_kind: what the JSON pointer names in the candidate's IR: the statement op ("wgmma", "stg"), with
  the field when the pointer goes into one ("stg.vec_bytes"), or the top-level part ("buffer",
  "param.tma.box", "role.regs").
- features: rules/_features.py over the whole IR ({} for proposer failures, which have no IR).

The digest covers stage, code, node kind, template and the arch: the coarse IR context that keeps a
Hopper-only problem apart from an Ampere one. The full feature dict is stored next to it (FailureRow.
features) for promotion; hashing it would make every candidate its own cluster.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

_KEEP = [re.compile(p) for p in (r"\b[EWN]-[A-Z]+-[A-Z0-9]+\b",   # CAKE diagnostic codes
                                  r"\bC\d{4}\b",                   # ptxas / nvcc error numbers
                                  r"\bsm_\d+a?\b")]                # architectures
_SUBS = [
    (re.compile(r"(?<!\w)'[^'\n]{1,200}'|\"[^\"\n]{1,200}\"|`[^`\n]{1,200}`"), "<name>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-]+){2,}\.\w+(?:\(\d+\))?|\b[\w\-]+\.(?:cu|cuh|py|ptx|json)\b(?:\(\d+\))?"),
     "<path>"),
    (re.compile(r"(?<![\w<])/(?:[\w~\-]+/)*[\w~\-]+"), "<ptr>"),
    (re.compile(r"\b[A-Za-z_]+[A-Za-z]*_[A-Za-z0-9_]*\d[A-Za-z0-9_]*\b"), "<id>"),   # gemm_wgmma_128x256_s4
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<hex>"),                                       # hashes
    (re.compile(r"(?<![A-Za-z<])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
]
MAX_TEMPLATE = 300


def template(message: str) -> str:
    text = " ".join((message or "").split())
    kept: list[str] = []

    def protect(m: re.Match) -> str:
        kept.append(m.group(0))
        return "\x00" + "K" * len(kept) + "\x00"   # no digits: survives the number rule

    for pat in _KEEP:
        text = pat.sub(protect, text)
    for pat, rep in _SUBS:
        text = pat.sub(rep, text)
    text = re.sub(r"\x00(K+)\x00", lambda m: kept[len(m.group(1)) - 1], text)
    text = re.sub(r"(<n>)(?:\s*[x,]\s*<n>)+", r"\1", text)   # 128x256x64, "1, 2, 3" -> one <n>
    return text[:MAX_TEMPLATE]


_TOP = {"buffers": "buffer", "params": "param", "roles": "role", "pipelines": "pipeline", "launch": "launch",
        "prologue": "prologue", "consts": "const"}


def node_kind(ir: Any, node: Optional[str]) -> Optional[str]:
    """The kind of IR node a JSON pointer names, or None when it does not resolve."""
    if not node or not isinstance(ir, dict):
        return None
    parts = [p.replace("~1", "/").replace("~0", "~") for p in node.strip("/").split("/") if p != ""]
    if not parts:
        return "kernel"
    cur: Any = ir
    kind, fields = _TOP.get(parts[0], parts[0]), []
    for p in parts:
        if isinstance(cur, list):
            try:
                cur = cur[int(p)]
            except (ValueError, IndexError):
                return None
        elif isinstance(cur, dict):
            if p not in cur:
                return None
            cur = cur[p]
            if p not in ("body", "then", "else") and not p.isdigit():
                fields.append(p)
        else:
            return None
        if isinstance(cur, dict) and "op" in cur:   # entering a statement resets the field trail
            kind, fields = str(cur["op"]), []
    if kind in _TOP.values() and fields and fields[0] in _TOP:
        fields = fields[1:]
    return ".".join([kind] + fields)


def digest(stage: str, code: str, kind: Optional[str], tmpl: str, arch: Optional[str]) -> str:
    blob = json.dumps([stage, code, kind, tmpl, arch], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def signature(stage: str, code: str, message: str, node_path: Optional[str], ir: Any
              ) -> tuple[str, Optional[str], str, dict]:
    from rules._features import features as _features
    feats = _features(ir) if isinstance(ir, dict) else {}
    kind = node_kind(ir, node_path)
    tmpl = template(message)
    return digest(stage, code, kind, tmpl, feats.get("arch")), kind, tmpl, feats
