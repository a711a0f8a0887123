"""RFC 6902 JSON Patch over plain JSON values (with RFC 6901 JSON pointers), no dependencies.

    doc2 = apply_patch(doc, [{"op": "replace", "path": "/launch/threads", "value": 128}])

Operations: add, remove, replace, move, copy, test. The input is not modified. With
`lenient_replace=True` a replace of an absent object member adds it (see apply_patch). Any problem raises
PatchError naming the operation's index and pointer, e.g. `op 2 (replace /roles/0/warps): path not
found: no member 'warps' at /roles/0` - the text an LLM repair turn gets verbatim.
"""
from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    pass


MAX_ADDED_VALUES = 200_000  # JSON values a patch may add (repeated `copy` of a parent doubles the document)


def _count(value: Any, limit: int) -> int:
    """JSON values in `value` (stops counting past `limit`)."""
    n, stack = 0, [value]
    while stack and n <= limit:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def parse_pointer(ptr: str) -> list[str]:
    if not isinstance(ptr, str):
        raise PatchError(f"a JSON pointer is a string, got {type(ptr).__name__}")
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError(f"JSON pointer {ptr!r} must start with '/' (or be empty for the whole document)")
    return [t.replace("~1", "/").replace("~0", "~") for t in ptr[1:].split("/")]


def _pointer_text(tokens: list[str]) -> str:
    return "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens) if tokens else ""


def _index(container: list, token: str, where: str, for_add: bool = False) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"{token!r} is not an array index at {where}")
    i = int(token)
    limit = len(container) if for_add else len(container) - 1
    if i > limit:
        raise PatchError(f"index {i} out of range at {where} (array of {len(container)})")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for n, t in enumerate(tokens[:-1]):
        where = _pointer_text(tokens[:n]) or "/"
        if isinstance(cur, dict):
            if t not in cur:
                raise PatchError(f"path not found: no member {t!r} at {where}")
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_index(cur, t, where)]
        else:
            raise PatchError(f"path not found: {where} is a {type(cur).__name__}, not an object or array")
    return cur


def get(doc: Any, ptr: str) -> Any:
    tokens = parse_pointer(ptr)
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last, where = tokens[-1], _pointer_text(tokens[:-1]) or "/"
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path not found: no member {last!r} at {where}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, where)]
    raise PatchError(f"path not found: {where} is a {type(parent).__name__}")


def _add(doc, tokens, value):
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last, where = tokens[-1], _pointer_text(tokens[:-1]) or "/"
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, where, for_add=True), value)
    else:
        raise PatchError(f"cannot add into {where}: it is a {type(parent).__name__}")
    return doc


def _remove(doc, tokens):
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last, where = tokens[-1], _pointer_text(tokens[:-1]) or "/"
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path not found: no member {last!r} at {where}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, where))
    raise PatchError(f"cannot remove from {where}: it is a {type(parent).__name__}")


def _replace(doc, tokens, value, lenient: bool = False):
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last, where = tokens[-1], _pointer_text(tokens[:-1]) or "/"
    if isinstance(parent, dict):
        if last not in parent and lenient:
            parent[last] = value
        elif last not in parent:
            raise PatchError(f"path not found: no member {last!r} at {where} (use add to create it)")
        parent[last] = value
    elif isinstance(parent, list):
        parent[_index(parent, last, where)] = value
    else:
        raise PatchError(f"cannot replace in {where}: it is a {type(parent).__name__}")
    return doc


def apply_patch(doc: Any, patch: Any, lenient_replace: bool = False) -> Any:
    """Apply an RFC 6902 patch (a list of operation objects) to a copy of `doc`.

    lenient_replace: a `replace` of a member an object lacks acts as `add`. IR documents leave fields
    at their schema defaults unwritten, and both verifier fixes and LLM replies "replace" such fields;
    strict RFC 6902 would reject that."""
    if not isinstance(patch, list):
        raise PatchError(f"a JSON Patch is an array of operations, got {type(patch).__name__}")
    doc = copy.deepcopy(doc)
    added = 0
    for i, op in enumerate(patch):
        if not isinstance(op, dict):
            raise PatchError(f"op {i}: an operation is an object, got {type(op).__name__}")
        kind, path = op.get("op"), op.get("path")
        label = f"op {i} ({kind} {path})"
        try:
            if kind not in ("add", "remove", "replace", "move", "copy", "test"):
                raise PatchError(f"unknown op {kind!r} (add, remove, replace, move, copy, test)")
            if path is None:
                raise PatchError("missing 'path'")
            tokens = parse_pointer(path)
            if kind in ("add", "replace", "test") and "value" not in op:
                raise PatchError("missing 'value'")
            if kind in ("move", "copy") and "from" not in op:
                raise PatchError("missing 'from'")
            if kind in ("add", "replace", "copy"):
                added += _count(op["value"] if kind != "copy" else get(doc, op["from"]), MAX_ADDED_VALUES)
                if added > MAX_ADDED_VALUES:
                    raise PatchError(f"the patch adds more than {MAX_ADDED_VALUES} JSON values")
            if kind == "add":
                doc = _add(doc, tokens, copy.deepcopy(op["value"]))
            elif kind == "remove":
                doc, _ = _remove(doc, tokens)
            elif kind == "replace":
                doc = _replace(doc, tokens, copy.deepcopy(op["value"]), lenient_replace)
            elif kind == "move":
                src = parse_pointer(op["from"])
                if tokens[:len(src)] == src and len(tokens) > len(src):
                    raise PatchError("cannot move a value into one of its own children")
                doc, value = _remove(doc, src)
                doc = _add(doc, tokens, value)
            elif kind == "copy":
                doc = _add(doc, tokens, copy.deepcopy(get(doc, op["from"])))
            elif kind == "test":
                have = get(doc, path)
                if not _equal(have, op["value"]):
                    raise PatchError(f"test failed: value is {have!r}, expected {op['value']!r}")
        except PatchError as e:
            raise PatchError(f"{label}: {e}") from None
    return doc


def _equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
