"""Export a run's best kernel into the task's library: tasks/<task>/library/<shape-key>.json (the IR,
in the same format as the seed files) and <shape-key>.meta.json (where it came from and how fast).

An entry is replaced only by a better one: a measured kernel beats an unmeasured (dry-run) one; between
two entries of the same kind the faster wins when they were judged on the same device (or the same
cost-model target); a measurement on another device replaces the old one (the library follows the GPU
the project benchmarks on). CAKE_LIBRARY_DIR redirects the library (tests use it).
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Optional


def lineage(candidates: dict, h: str, limit: int = 50) -> list[dict]:
    out = []
    while h and h in candidates and len(out) < limit:
        c = candidates[h]
        out.append({"hash": h, "name": c.name, "tactic": c.tactic, "params": c.params, "strategy": c.strategy})
        h = c.parent_hash
    return out


def export_best(entry, store, state: dict, cfg, root: Optional[Path] = None) -> dict:
    best = state.get("best") or {}
    if not best.get("hash"):
        return {"written": False, "reason": "no candidate passed"}
    from cake_ir.io import dumps, ir_hash, load
    from cake_ir.nodes import IR_VERSION

    rows = {c.hash: c for c in store.candidates(cfg.run_id)}
    row = rows.get(best["hash"])
    if row is None:
        return {"written": False, "reason": f"best candidate {best['hash']} is not in the DB"}
    kernel, diags = load(row.ir)
    if kernel is None:
        return {"written": False, "reason": f"the best candidate does not load: {diags[:1]}"}
    key = entry.shape_key()
    d = entry.library_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    ir_path, meta_path = d / f"{key}.json", d / f"{key}.meta.json"
    prof = best.get("profile") or {}
    pm = prof.get("metrics") or {}
    device = prof.get("device") if best.get("measured") else None
    meta = {"task": entry.name, "shape": entry.bench_shape, "shape_key": key, "run": cfg.run_id,
            "hash": best["hash"], "name": best.get("name"), "measured": bool(best.get("measured")),
            "seconds": best.get("score_s"), "ms_median": pm.get("ms_median"), "predicted_s": best.get("predicted_s"),
            "speedup": best.get("speedup"), "speedup_vs": best.get("speedup_vs"), "speedups": pm.get("speedup"),
            "roofline_frac": pm.get("roofline_frac"), "device": device,
            "target": None if best.get("measured") else cfg.target, "arch": kernel.arch,
            "strategy": best.get("strategy"), "tactic": best.get("tactic"), "recipe": row.recipe,
            "lineage": lineage(rows, best["hash"]), "ir_version": IR_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "note": None if best.get("measured") else "dry run: ranked by the cost model, not measured"}
    old = None
    if meta_path.exists():
        try:
            old = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            old = None
    if old is not None and _entry_hash(ir_path, load, ir_hash) != old.get("hash"):
        old = None  # a kill between the two renames left an IR that its meta does not describe: rewrite both
    ok, why = _should_replace(old, meta)
    if not ok:
        return {"written": False, "reason": why, "path": str(ir_path), "meta_path": str(meta_path)}
    _write_atomic(ir_path, dumps(kernel) + "\n")
    _write_atomic(meta_path, json.dumps(meta, indent=1, default=str) + "\n")
    return {"written": True, "reason": why, "path": str(ir_path), "meta_path": str(meta_path)}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # readers see the old file or the new one, never a torn one


def _entry_hash(ir_path: Path, load, ir_hash) -> Optional[str]:
    try:
        kernel, _ = load(json.loads(ir_path.read_text()))
    except (OSError, ValueError):
        return None
    return ir_hash(kernel) if kernel is not None else None


def _should_replace(old: Optional[dict], new: dict) -> tuple[bool, str]:
    if old is None:
        return True, "new library entry"
    if old.get("hash") == new["hash"]:
        return True, "same kernel, metadata refreshed"
    if new["measured"] and not old.get("measured"):
        return True, "measured kernel replaces an unmeasured one"
    if old.get("measured") and not new["measured"]:
        return False, "the library holds a measured kernel; a dry run does not replace it"
    where_old = old.get("device") if old.get("measured") else old.get("target")
    where_new = new.get("device") if new["measured"] else new.get("target")
    if where_old != where_new:
        return True, f"judged on {where_new} (the entry was judged on {where_old})"
    if old.get("seconds") is None or (new.get("seconds") is not None and new["seconds"] < old["seconds"]):
        return True, "faster than the library entry"
    return False, f"the library entry is as fast or faster ({old.get('seconds')} s)"
