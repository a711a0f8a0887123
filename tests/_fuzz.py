"""Shared IR-document fuzzing core for tests/test_fuzz_ir.py and bench/fuzz_ir.py.

`seed_documents()` are the valid programs we mutate (task seeds and rule `pass.json` fixtures).
`mutate(doc, rng)` perturbs one field (or a few) of a deep copy: numbers to huge/negative/zero, strings
to garbage or odd expressions, lists truncated/extended, keys dropped/added, ops/kinds swapped, names
pointed at the wrong kind of object (a pipeline naming itself as a buffer, a tile naming a barrier).
`check(source)` runs the whole front end on one document and returns (outcome, crash_location):
outcome is "rejected" (load gave diagnostics), "clean" or "diagnostics" (the expanded kernel is
lowered either way: lowering must turn what it cannot lower into E-LOWER-* diagnostics); an unhandled exception is
returned as ("crash", "<stage> <Exception> file:line") instead of raised, so a driver can count them.
"""
from __future__ import annotations

import copy
import glob
import json
import os
import random
import traceback
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ODD_STRINGS = [
    "", " ", "x", "_", "a" * 49, "1abc", "a-b", "a b", "a*/b", "a//b", "#include <x>", "a\nb", "a\\\nb",
    "\u0430bc", "ab\u200bc", "\x00", "tid", "__x", "cake_x", "M*N", "M/0", "M%0", "bid.x", "(", ")", "((1)",
    "1 +", "-" * 30, "1" * 400, "2**64", "1e308", "nan", "inf", "x[0]", "f(x)", "max(1)", "min(1,2,3)",
    "exp(x)", "a ? b : c", "true", "false", "!", "&&", "M >= 1 && N", "0x10", "1.5", "-1", "M << 70",
    "(" * 300 + "1" + ")" * 300, "+".join(["M"] * 2000), "\"", "'", "`rm -rf /`", "$(id)",
]
ODD_NUMBERS = [0, -1, 1, 2, 3, 7, 31, 32, 33, 64, 127, 255, 256, 1023, 2**31 - 1, 2**31, 2**32, 2**63,
               2**64 + 1, -2**63, 10**30, 0.5, -0.0, 1e308, True, False, None]
OPS = ["for", "if", "let", "block", "copy", "ldg", "stg", "lds", "sts", "ldmatrix", "mma_sync", "wgmma",
       "mbar_init", "mbar_arrive", "mbar_expect_tx", "mbar_wait", "cp_async_arrive", "cp_async_commit",
       "wgmma_fence", "wgmma_commit", "syncthreads", "syncwarp", "tma_store_commit", "cp_async_wait",
       "wgmma_wait", "tma_store_wait", "bar_sync", "bar_arrive", "fence", "pipe_acquire", "pipe_commit",
       "pipe_wait", "pipe_release", "fill", "map", "reduce", "scan", "bogus"]
KINDS = ["tensor", "scalar", "mbarrier", "named", "tma_load", "tma_store", "cp_async", "sync", "sum", "max",
         "min", "proxy_async", "mbarrier_init", "acq_rel_cta", "acq_rel_gpu", "bogus"]
DTYPES = ["bf16", "f16", "f32", "f64", "i32", "u32", "i64", "u64", "i8", "u8", "pred", "f8", "x"]
LAYOUTS = ["row_major", "swizzle_32B", "swizzle_64B", "swizzle_128B", "blocked", "mma_a", "mma_b", "mma_acc",
           "wgmma_acc"]


def seed_documents() -> list[tuple[str, dict]]:
    out = []
    for pat in ("tasks/*/seeds/*.json", "rules/fixtures/*/pass.json"):
        for p in sorted(glob.glob(os.path.join(ROOT, pat))):
            with open(p) as f:
                doc = json.load(f)
            out.append((os.path.relpath(p, ROOT), doc.get("kernel", doc)))  # fixtures wrap the kernel
    return out


def _slots(obj, path=()):
    """Every (container, key) position in a JSON value, with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield obj, k, path + (k,)
            yield from _slots(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield obj, i, path + (i,)
            yield from _slots(v, path + (i,))


def _names(doc: dict) -> list[str]:
    names = list((doc.get("consts") or {}) if isinstance(doc.get("consts"), dict) else [])
    for group in ("params", "buffers", "barriers", "pipelines", "roles"):
        for item in doc.get(group) or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                names.append(item["name"])
    return names or ["x"]


def _perturb(value: Any, rng: random.Random, names: list[str]) -> Any:
    r = rng.random()
    if isinstance(value, bool) or value is None:
        return rng.choice(ODD_NUMBERS + ODD_STRINGS[:5] + [[], {}])
    if isinstance(value, (int, float)):
        if r < 0.3:
            return rng.choice(ODD_NUMBERS)
        if r < 0.8:  # plausible values: more programs load and reach the later stages
            return rng.choice([0, 1, 2, 4, 8, 16, 24, 32, 64, 96, 128, 256, 512, value * 2, value + 1,
                               max(value - 1, 0), value // 2 if isinstance(value, int) else value])
        return rng.choice([-value, str(value), [value]])
    if isinstance(value, str):
        if value in OPS or r < 0.1:
            return rng.choice(OPS)
        if value in KINDS or r < 0.2:
            return rng.choice(KINDS)
        if value in DTYPES:
            return rng.choice(DTYPES)
        if value in LAYOUTS:
            return rng.choice(LAYOUTS)
        if r < 0.6:
            return rng.choice(names)  # a name of the wrong kind (or the node's own name)
        if r < 0.75:  # an expression made of names in scope
            return f"{rng.choice(names)} {rng.choice('+-*/%')} {rng.choice(names + ['1', '0', '3'])}"
        if r < 0.9:
            return rng.choice(ODD_STRINGS)
        return rng.choice([0, -1, None, [value], {"x": value}, value + " + 1", value * 3])
    if isinstance(value, list):
        if r < 0.3 and value:
            return value[: rng.randrange(len(value))]
        if r < 0.55:
            return value + [copy.deepcopy(rng.choice(value)) if value else 1] * rng.randint(1, 3)
        if r < 0.7:
            return list(reversed(value))
        if r < 0.8:
            return value * 40
        return rng.choice([{}, "x", 0, None, [[value]]])
    if isinstance(value, dict):
        v = dict(value)
        if r < 0.3 and v:
            v.pop(rng.choice(list(v)))
        elif r < 0.5:
            v[rng.choice(["bogus", "op", "kind", "name", "id", "note", "else", "else_", "slot", "shape"])] = \
                rng.choice(ODD_NUMBERS + ODD_STRINGS + names)
        elif r < 0.7 and "op" in v:
            v["op"] = rng.choice(OPS)
        elif r < 0.8 and "kind" in v:
            v["kind"] = rng.choice(KINDS)
        else:
            return rng.choice([[], "x", 0, None, [v]])
        return v
    return value


def mutate(doc: dict, rng: random.Random, n: Optional[int] = None) -> dict:
    """A deep copy of doc with `n` (default 1, sometimes 2-3) fields perturbed."""
    doc = copy.deepcopy(doc)
    names = _names(doc)
    for _ in range(n if n is not None else rng.choice([1, 1, 1, 2, 3])):
        slots = list(_slots(doc))
        if not slots:
            break
        container, key, _path = rng.choice(slots)
        if isinstance(container, dict) and rng.random() < 0.1:
            container.pop(key)
        else:
            container[key] = _perturb(container[key], rng, names)
    return doc


def cross_reference(doc: dict, rng: random.Random) -> dict:
    """Point one name reference at a different object (cyclic/missing/wrong-kind names)."""
    doc = copy.deepcopy(doc)
    names = _names(doc) + ["missing_name"]
    refs = [(c, k) for c, k, p in _slots(doc) if k in ("buf", "pipe", "barrier", "name", "producer", "role")
            and isinstance(c[k], str)]
    refs += [(c, k) for c, k, p in _slots(doc) if len(p) >= 2 and p[-2] in ("buffers", "consumers")
             and isinstance(c[k], str)]
    if refs:
        c, k = rng.choice(refs)
        c[k] = rng.choice(names)
    for p in doc.get("pipelines") or []:  # a pipeline naming itself as a buffer / consumer
        if isinstance(p, dict) and rng.random() < 0.3:
            p["buffers"] = [p.get("name")]
            p["consumers"] = [p.get("name")]
    return doc


def deep_nesting(depth: int) -> dict:
    body: list = []
    inner = body
    for i in range(depth):
        st = {"op": "for", "var": f"i{i}", "stop": 2, "body": []}
        inner.append(st)
        inner = st["body"]
    return {"name": "deep", "arch": "sm_80", "launch": {"grid": [1], "threads": 32},
            "roles": [{"name": "main", "warps": [0, 1], "body": body}]}


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    frame = tb[-1] if tb else None
    loc = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}" if frame else "?"
    return f"{type(e).__name__} {loc}"


def check(source) -> tuple[str, Optional[str]]:
    """Run load -> verify -> print -> cost -> lower(cuda) on one document; never raises."""
    from cake_ir import cost, printer
    from cake_ir.io import load
    from cake_ir.lower import lower
    from cake_ir.verifier import verify

    stage = "load"
    try:
        kernel, diags = load(source)
        if kernel is None:
            assert diags, "load returned neither a kernel nor diagnostics"
            return "rejected", None
        stage = "verify"
        res = verify(kernel)
        stage = "print"
        printer.format_kernel(kernel)
        stage = "cost"
        cost.estimate(kernel)
        # lowering reports what it cannot lower, verified or not (a Program: each expanded kernel)
        for expanded in (res.expanded if isinstance(res.expanded, list) else [res.expanded]):
            if expanded is not None:
                stage = "lower" if res.ok else "lower-unverified"
                lowered = lower(expanded)
                assert isinstance(lowered.source, str)
        return ("clean" if not res.diagnostics else "diagnostics"), None
    except Exception as e:  # noqa: BLE001 - this is what we count
        return "crash", f"{stage} {_where(e)}"
