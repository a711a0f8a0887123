"""Flat IR features of a CAKE IR document (the JSON dict form), for failure clustering and learned rules.

Learned rules (rules/e_lrn_*.py, written by knowledge/promote/rule.py) import this module, so it lives
in rules/ and depends on nothing outside the standard library: a rule must not pull in the knowledge
DB. The leading underscore keeps the verifier from loading it as a rule (cake_ir/verifier.py skips
private modules). Every feature is an int, float, str or bool; a feature that cannot be computed is
left out rather than guessed.

    features(ir)          -> {"arch": "sm_90a", "threads": 384, "regs_min": 40, "op:wgmma": 1, ...}
    match(predicate, f)   -> does every test [key, op, value] of the predicate hold on f?
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterator

DTYPE_BYTES = {"f64": 8, "f32": 4, "i32": 4, "u32": 4, "tf32": 4, "f16": 2, "bf16": 2, "i16": 2, "u16": 2,
               "f8e4m3": 1, "f8e5m2": 1, "e4m3": 1, "e5m2": 1, "i8": 1, "u8": 1, "i64": 8, "u64": 8}
SCOPE_THREADS = {"thread": 1, "warp": 32, "warpgroup": 128}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _num(v: Any, consts: dict) -> Any:
    """An int for a literal or an expression over consts ("BM", "BN / 2"); None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if not isinstance(v, str):
        return None
    names = set(_NAME.findall(v))
    if not names <= set(consts) or not re.fullmatch(r"[\sA-Za-z0-9_+\-*/%()]+", v):
        return None   # refers to runtime values (M, bid.x, ...): not a static feature
    try:
        return eval(v.replace("/", "//"), {"__builtins__": {}}, dict(consts))  # noqa: S307 - consts only
    except Exception:  # noqa: BLE001
        return None


def _prod(shape, consts) -> Any:
    out = 1
    for s in shape or []:
        v = _num(s, consts)
        if v is None:
            return None
        out *= v
    return out


def _walk(body: list, depth: int = 0) -> Iterator[tuple[dict, int]]:
    for st in body or []:
        if not isinstance(st, dict):
            continue
        yield st, depth
        for key in ("body", "then", "else"):
            if isinstance(st.get(key), list):
                yield from _walk(st[key], depth + (1 if st.get("op") == "for" else 0))


def _inc(f: dict, key: str, by: int = 1) -> None:
    f[key] = f.get(key, 0) + by


def _maxf(f: dict, key: str, v: Any) -> None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f[key] = max(f.get(key, v), v)


def _minf(f: dict, key: str, v: Any) -> None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f[key] = min(f.get(key, v), v)


def features(ir: Any) -> dict:
    """Features of one IR document (dict); {} when it is not a kernel document."""
    if not isinstance(ir, dict):
        return {}
    f: dict = {}
    try:
        _kernel_features(ir, f)
    except Exception:  # noqa: BLE001 - features are hints; a malformed document gives what it gives
        pass
    return f


def _kernel_features(ir: dict, f: dict) -> None:
    consts = {k: v for k, v in (ir.get("consts") or {}).items() if isinstance(v, (int, float))}
    f["arch"] = str(ir.get("arch", "?"))
    launch = ir.get("launch") or {}
    threads = _num(launch.get("threads"), consts)
    if threads:
        f["threads"], f["warps"] = threads, threads // 32
    mb = launch.get("min_blocks_per_sm") or 1
    f["min_blocks_per_sm"] = mb
    if threads:
        # registers per thread the launch can get: 64K registers per SM over the resident threads
        f["launch_reg_cap"] = min(255, (65536 // (threads * mb)) // 8 * 8)
    f["grid_dims"] = len(launch.get("grid") or [])
    for name, v in consts.items():
        f[f"const:{name}"] = v

    roles = ir.get("roles") or []
    f["roles"] = len(roles)
    role_threads = {}
    for r in roles:
        w = r.get("warps") or [0, 0]
        nw = w[1] if len(w) > 1 else 0
        role_threads[r.get("name")] = 32 * nw
        _maxf(f, "role_warps_max", nw)
        _minf(f, "role_warps_min", nw)
        if r.get("regs") is not None:
            _maxf(f, "regs_max", r["regs"])
            _minf(f, "regs_min", r["regs"])
    if roles:
        f["has_regs"] = any(r.get("regs") is not None for r in roles)

    # buffers: spaces, layouts, stages, dtypes, shared memory bytes, register tiles per thread
    smem, reg_words_role = 0, {}
    for b in ir.get("buffers") or []:
        space, dt = b.get("space", "?"), b.get("dtype", "?")
        _inc(f, f"space:{space}")
        _inc(f, f"dtype:{dt}")
        if b.get("layout"):
            _inc(f, f"layout:{b['layout']}")
        stages = b.get("stages") or 1
        _maxf(f, "buffer_stages_max", stages)
        n = _prod(b.get("shape"), consts)
        if n is None:
            continue
        nbytes = n * DTYPE_BYTES.get(dt, 4)
        if space == "smem":
            smem += nbytes * stages
            _maxf(f, "smem_tile_bytes_max", nbytes)
        elif space == "reg":
            if b.get("vec"):
                _maxf(f, "reg_vec_max", b["vec"])
            scope = b.get("scope", "thread")
            owners = [b["role"]] if b.get("role") else list(role_threads)
            for rn in owners:
                per = SCOPE_THREADS.get(scope) or max(role_threads.get(rn) or threads or 1, 1)
                words = math.ceil(nbytes / 4 / per)
                reg_words_role[rn] = reg_words_role.get(rn, 0) + words
                _maxf(f, "reg_tile_words_max", words)
                if scope == "cta" and b.get("layout") == "blocked":
                    # elements each thread holds of a CTA-wide blocked tile, and whether it splits evenly
                    chunk = (role_threads.get(rn) or threads or 1) * (b.get("vec") or 1)
                    _maxf(f, "blocked_chunk_elems", chunk)
                    f["blocked_even"] = f.get("blocked_even", True) and n % chunk == 0
    f["smem_bytes"] = smem
    if reg_words_role:
        f["reg_words_role_max"] = max(reg_words_role.values())
        fracs = []
        for rn, words in reg_words_role.items():
            budget = next((r.get("regs") for r in roles if r.get("name") == rn and r.get("regs")), None)
            budget = budget or f.get("launch_reg_cap")
            if budget:
                fracs.append(words / budget)
        if fracs:
            f["reg_tile_frac"] = round(max(fracs), 4)

    for p in ir.get("pipelines") or []:
        _inc(f, "pipelines")
        _maxf(f, "pipeline_stages_max", _num(p.get("stages"), consts))
        _inc(f, f"pipe:{p.get('mechanism', '?')}")
    for p in ir.get("params") or []:
        if p.get("kind") == "tensor":
            _inc(f, "tensors")
            if p.get("tma"):
                _inc(f, "tma_tensors")
                if p["tma"].get("swizzle"):
                    _inc(f, f"tma_swizzle:{p['tma']['swizzle']}")

    # statements: op kinds, copy kinds, MMA shapes, vector widths, loops
    bodies = [(ir.get("prologue") or [])] + [r.get("body") or [] for r in roles]
    for body in bodies:
        for st, depth in _walk(body):
            op = st.get("op", "?")
            _inc(f, f"op:{op}")
            _maxf(f, "loop_depth_max", depth)
            if op == "copy":
                _inc(f, f"copy:{st.get('kind', '?')}")
            if op in ("wgmma", "mma_sync", "mma") and isinstance(st.get("shape"), list) and len(st["shape"]) == 3:
                m, n, k = st["shape"]
                _maxf(f, f"{op}_m", m), _maxf(f, f"{op}_n", n), _maxf(f, f"{op}_k", k)
            if st.get("vec_bytes") is not None:
                _maxf(f, "vec_bytes_max", st["vec_bytes"])
                _minf(f, "vec_bytes_min", st["vec_bytes"])
            if op == "for" and st.get("unroll") not in (None, False):
                _inc(f, "unrolled_loops")
            if op in ("cp_async_wait", "wgmma_wait") and isinstance(st.get("n"), int):
                _maxf(f, f"{op}_n", st["n"])


# ------------------------------------------------------------------ predicates
def test(t: list, f: dict) -> bool:
    """One test [key, op, value]; a missing feature never matches (a rule stays silent on IR it
    cannot describe)."""
    key, op, val = t
    if key not in f:
        return False
    v = f[key]
    try:
        if op == "==":
            return v == val
        if op == "!=":
            return v != val
        if op == ">=":
            return v >= val
        if op == "<=":
            return v <= val
        if op == ">":
            return v > val
        if op == "<":
            return v < val
    except TypeError:
        return False
    raise ValueError(f"unknown operator {op!r}")


def match(predicate: list, f: dict) -> bool:
    return bool(predicate) and all(test(t, f) for t in predicate)


def describe(predicate: list) -> str:
    return " and ".join(f"{k} {op} {v!r}" for k, op, v in predicate)
