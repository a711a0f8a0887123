"""Loading and dumping IR documents, with diagnostics instead of tracebacks.

`load` never raises on bad input: malformed JSON gives E-PARSE-JSON with line and column, a schema
violation gives E-SCHEMA-* diagnostics whose node paths point into the document.

A document is a `Kernel`, or a `Program` (several kernels run in order with shared workspace tensors)
when it has a `"kernels"` key; every function here takes either (`IRNode`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional, Union

from pydantic import ValidationError

from .diagnostics import Diagnostic
from .nodes import Kernel, Program

IRNode = Union[Kernel, Program]

MAX_DOC_BYTES = 8 * 2**20
MAX_DEPTH = 64


def _depth(obj, limit: int) -> int:
    stack = [(obj, 1)]
    worst = 0
    while stack:
        o, d = stack.pop()
        worst = max(worst, d)
        if worst > limit:
            return worst
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return worst


def _pointer(raw: Any, loc: tuple) -> str:
    """Turn a pydantic error location into a JSON pointer into the raw document, skipping the
    discriminator tags pydantic inserts for tagged unions."""
    parts, cur = [], raw
    for item in loc:
        if isinstance(cur, list) and isinstance(item, int):
            parts.append(str(item))
            cur = cur[item] if 0 <= item < len(cur) else None
        elif isinstance(cur, dict) and isinstance(item, str) and item in cur:
            parts.append(item)
            cur = cur[item]
        elif isinstance(cur, dict) and isinstance(item, str) and item == "else_" and "else" in cur:
            parts.append("else")
            cur = cur["else"]
        elif isinstance(cur, dict) and isinstance(item, str) and item in (cur.get("op"), cur.get("kind")):
            continue  # union tag
        elif isinstance(item, str) and item.startswith(("function-", "tagged-union", "union[")):
            continue
        else:
            parts.append(str(item))
            cur = None
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts) if parts else "/"


def schema_diagnostics(raw: Any, err: ValidationError) -> list[Diagnostic]:
    out = []
    for e in err.errors(include_url=False):
        ptr = _pointer(raw, tuple(e.get("loc", ())))
        typ = e.get("type", "")
        legal = None
        ctx = e.get("ctx") or {}
        if "expected" in ctx:
            legal = ctx["expected"]
        code = {"missing": "E-SCHEMA-MISSING", "extra_forbidden": "E-SCHEMA-EXTRA",
                "union_tag_invalid": "E-SCHEMA-TAG", "literal_error": "E-SCHEMA-VALUE"}.get(typ, "E-SCHEMA-TYPE")
        msg = e.get("msg", "invalid")
        if typ == "value_error":
            msg = msg.removeprefix("Value error, ")
        out.append(Diagnostic(code=code, node=ptr, message=msg, legal=legal))
    return out


def is_program_doc(raw: Any) -> bool:
    """A decoded document is a Program when it lists `kernels` (a Kernel has `roles` instead)."""
    return isinstance(raw, dict) and "kernels" in raw


def load(source: Union[str, bytes, dict]) -> tuple[Optional[IRNode], list[Diagnostic]]:
    """Parse a JSON document (text or already-decoded) into a Kernel or a Program, or return diagnostics."""
    if isinstance(source, (str, bytes)):
        if len(source) > MAX_DOC_BYTES:
            return None, [Diagnostic(code="E-PARSE-SIZE", node="/", message=f"document is larger than {MAX_DOC_BYTES} bytes")]
        try:
            raw = json.loads(source)
        except json.JSONDecodeError as e:
            return None, [Diagnostic(code="E-PARSE-JSON", node="/",
                                     message=f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}")]
        except (UnicodeDecodeError, RecursionError, ValueError) as e:
            return None, [Diagnostic(code="E-PARSE-JSON", node="/", message=f"unreadable JSON: {type(e).__name__}")]
    else:
        raw = source
    if not isinstance(raw, dict):
        return None, [Diagnostic(code="E-SCHEMA-TYPE", node="/", message="an IR document is a JSON object (a Kernel or a Program)")]
    if _depth(raw, MAX_DEPTH) > MAX_DEPTH:
        return None, [Diagnostic(code="E-PARSE-DEPTH", node="/", message=f"document nests deeper than {MAX_DEPTH} levels")]
    try:
        model = Program if is_program_doc(raw) else Kernel
        return model.model_validate(raw), []
    except ValidationError as err:
        return None, schema_diagnostics(raw, err)
    except (RecursionError, ValueError, TypeError, OverflowError) as err:
        return None, [Diagnostic(code="E-SCHEMA-TYPE", node="/", message=f"invalid document: {err}"[:500])]


def load_file(path) -> tuple[Optional[IRNode], list[Diagnostic]]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DOC_BYTES + 1)
    except OSError as e:
        return None, [Diagnostic(code="E-PARSE-FILE", node="/", message=f"cannot read {path}: {e.strerror}")]
    return load(data)


def to_dict(kernel: IRNode) -> dict:
    """The document as written: only fields that were set (lossless round trip of the input)."""
    return kernel.model_dump(mode="json", by_alias=True, exclude_unset=True)


def dumps(kernel: IRNode, indent: Optional[int] = 1) -> str:
    return json.dumps(to_dict(kernel), indent=indent)


def canonical_dict(kernel: IRNode) -> dict:
    """Defaults removed, so two documents that mean the same thing compare equal."""
    return kernel.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def ir_hash(kernel: IRNode) -> str:
    blob = json.dumps(canonical_dict(kernel), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def json_schema(program: bool = False) -> dict:
    """The Kernel JSON schema (usable as an LLM structured-output schema); `program=True`: the
    Program schema (whose `kernels` items are Kernels)."""
    return (Program if program else Kernel).model_json_schema(by_alias=True)
