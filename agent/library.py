"""Export a run's best kernels into the task's library, one entry per timed shape:
tasks/<task>/library/<shape-key>.json (the IR, in the same format as the seed files) and
<shape-key>.meta.json (where it came from and how fast).

The profile stage times every candidate on all bench shapes of the run's shape class
(TaskEntry.timed_shapes(); the run is scored at the first, its own `bench_shape`). `export_best` writes
one entry per shape those evaluations timed:

- the run's own shape: the run's best (state["best"], the kernel the run was judged by), with its
  speedups over the baselines (timed at this shape only);
- every other timed shape: the fastest candidate at that shape by its median there (`shape_bests`,
  read back from the DB's profile evaluations). A candidate counts only where its profile stage passed
  (status ok: it was re-checked correct at every shape it was timed on), so a kernel that failed or
  was wrong anywhere in profiling is exported for no shape. No baseline was timed at these shapes:
  `speedups` is None, `speedup` is against the best seed at the same shape (when a seed was timed there).

A dry run measures nothing: it writes the run's own shape only, labelled unmeasured.

An entry is replaced only by a better one: a measured kernel beats an unmeasured (dry-run) one; between
two entries of the same kind the faster wins when they were judged on the same device (or the same
cost-model target), always comparing medians of the same shape (an entry holds one shape); a
measurement on another device replaces the old one (the library follows the GPU the project benchmarks
on). CAKE_LIBRARY_DIR redirects the library (tests use it).
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


def shape_bests(entry, store, run_id: str) -> list[dict]:
    """Per shape the run's profile evaluations timed (the class's timed shapes first, in their order;
    a shape no evaluation timed is left out): the fastest candidate whose profile stage passed, by
    its median at that shape. Each item: shape, key, hash, name, ms_median (None: no passing candidate
    timed there), n_timed / n_failed (candidates timed there that passed / failed the profile stage),
    seed_ms (the best seed's median there), device."""
    cands = {c.id: c for c in store.candidates(run_id)}
    order = [dict(s) for s in entry.timed_shapes()]
    found: dict[int, dict] = {}
    for ev in store.evaluations(run_id):
        c = cands.get(ev.candidate_id)
        if ev.stage != "profile" or c is None:
            continue
        res = ev.result if isinstance(ev.result, dict) else {}
        for t in ev.timings or []:
            shape, ms = (t or {}).get("shape"), (t or {}).get("ms_median")
            if not isinstance(shape, dict) or ms is None:
                continue
            i = next((j for j, s in enumerate(order) if s == shape), None)
            if i is None:
                order.append(dict(shape))
                i = len(order) - 1
            b = found.setdefault(i, {"hash": None, "name": None, "ms_median": None, "n_timed": 0, "n_failed": 0,
                                     "seed_ms": None, "device": None})
            if ev.status != "ok" or _failed_at(res, shape):
                b["n_failed"] += 1
                continue
            b["n_timed"] += 1
            if c.strategy == "seed" and (b["seed_ms"] is None or ms < b["seed_ms"]):
                b["seed_ms"] = ms
            if b["ms_median"] is None or ms < b["ms_median"]:     # ties: the first evaluated wins
                b.update(hash=c.hash, name=c.name, ms_median=ms, ms_min=t.get("ms_min"), ms_max=t.get("ms_max"),
                         device=res.get("device"))
    return [{"shape": order[i], "key": entry.shape_key(order[i]), **found[i]} for i in sorted(found)]


def _failed_at(result: dict, shape: dict) -> bool:
    return any(isinstance(s, dict) and s.get("shape") == shape and s.get("ok") is False
               for s in result.get("shapes") or [])


def export_best(entry, store, state: dict, cfg, root: Optional[Path] = None, spec=None) -> dict:
    """Write the run's best kernel per timed shape (see the module docstring). Returns the run's own
    shape's outcome at the top level (written, reason, path, meta_path: what a single-shape export
    returned) and every shape's under "entries" (the run's shape first): shape, key, timed (the
    run's own shape), hash, name, ms, measured, status (written | kept | none | error), written,
    reason, path, meta_path, library_ms / library_name (the entry that was kept)."""
    rows = {c.hash: c for c in store.candidates(cfg.run_id)}
    own = _export_timed(entry, rows, state, cfg, root)
    entries = [own]
    if not cfg.dry_run:
        bests = shape_bests(entry, store, cfg.run_id)
        others = [b for b in bests if b["shape"] != entry.bench_shape]
        for b in others:
            try:
                entries.append(_export_shape(entry, rows, b, cfg, root, spec))
            except Exception as e:  # noqa: BLE001 - one shape's export must not lose the others
                entries.append({**_item(entry, b["shape"], False), "hash": b.get("hash"), "name": b.get("name"),
                                "ms": b.get("ms_median"), "status": "error", "written": False,
                                "reason": f"export failed: {type(e).__name__}: {str(e)[:200]}"})
        timed_keys = {b["key"] for b in bests}
        for s in entry.timed_shapes():     # class shapes no profile evaluation timed (nothing got that far)
            if entry.shape_key(s) not in timed_keys and s != entry.bench_shape:
                entries.append({**_item(entry, s, False), "status": "none", "written": False,
                                "reason": "no candidate was timed at this shape"})
    out = {k: own.get(k) for k in ("written", "reason", "path", "meta_path") if k in own}
    out["entries"] = entries
    out["n_written"] = sum(e["status"] == "written" for e in entries)
    out["n_kept"] = sum(e["status"] == "kept" for e in entries)
    out["dir"] = str(entry.library_dir(root))
    return out


def _item(entry, shape: dict, timed: bool) -> dict:
    return {"shape": dict(shape), "key": entry.shape_key(shape), "timed": timed, "hash": None, "name": None,
            "ms": None, "measured": None}


def _export_timed(entry, rows: dict, state: dict, cfg, root) -> dict:
    """The run's own shape: the run's best, as the run judged it (measured, or the cost model's
    prediction in a dry run), with the run's speedups."""
    item = _item(entry, entry.bench_shape, True)
    best = state.get("best") or {}
    if not best.get("hash"):
        return {**item, "status": "none", "written": False, "reason": "no candidate passed"}
    item.update(hash=best["hash"], name=best.get("name"), measured=bool(best.get("measured")),
                ms=best["score_s"] * 1e3 if best.get("score_s") is not None else None)
    row = rows.get(best["hash"])
    if row is None:
        return {**item, "status": "error", "written": False,
                "reason": f"best candidate {best['hash']} is not in the DB"}
    prof = best.get("profile") or {}
    pm = prof.get("metrics") or {}
    device = prof.get("device") if best.get("measured") else None
    pick = state.get("library_pick") or {}
    meta = {"seconds": best.get("score_s"), "ms_median": pm.get("ms_median"), "predicted_s": best.get("predicted_s"),
            "library_pick": {k: pick.get(k) for k in ("hash", "ms")} if pick.get("ms") else None,
            "speedup": best.get("speedup"), "speedup_vs": best.get("speedup_vs"),
            "speedups": best.get("speedups") or pm.get("speedup"),
            "roofline_frac": pm.get("roofline_frac"), "device": device,
            "target": None if best.get("measured") else cfg.target,
            "strategy": best.get("strategy"), "tactic": best.get("tactic")}
    note = None if best.get("measured") else "dry run: ranked by the cost model, not measured"
    return _write_entry(entry, item, rows, row, bool(best.get("measured")), meta, {}, note, cfg, root)


def _export_shape(entry, rows: dict, b: dict, cfg, root, spec) -> dict:
    """Another timed shape of the run: the fastest passing candidate at that shape (measured there)."""
    item = _item(entry, b["shape"], False)
    if b.get("hash") is None:
        return {**item, "status": "none", "written": False,
                "reason": f"no candidate passed the profile stage at this shape ({b['n_failed']} timed, all failed)"}
    item.update(hash=b["hash"], name=b.get("name"), measured=True, ms=b["ms_median"])
    row = rows.get(b["hash"])
    if row is None:
        return {**item, "status": "error", "written": False, "reason": f"candidate {b['hash']} is not in the DB"}
    sec = b["ms_median"] * 1e-3
    roof = None
    if spec is not None and sec > 0:
        try:
            from cake_ir.cost import roofline_floor
            t = entry.task
            roof = roofline_floor(t.flops(b["shape"]), t.bytes(b["shape"]), spec) / sec
        except Exception:  # noqa: BLE001 - the roofline fraction is a nicety
            roof = None
    seed = b.get("seed_ms")
    meta = {"seconds": sec, "ms_median": b["ms_median"], "predicted_s": None,
            "speedup": seed / b["ms_median"] if seed else None, "speedup_vs": "best seed" if seed else None,
            "speedups": None, "roofline_frac": roof, "device": b.get("device"), "target": None}
    extra = {"run_shape_key": entry.shape_key(), "candidates_timed": b["n_timed"]}
    note = (f"the fastest of the {b['n_timed']} candidates that passed profiling, by their median at this shape; "
            f"the run was scored at {entry.shape_key()} and timed its baselines only there (speedups: none "
            f"measured at this shape" + ("; speedup is vs the best seed at this shape)" if seed else ")")
            + "; predicted_s: the cost model was not run at this shape")
    return _write_entry(entry, item, rows, row, True, meta, extra, note, cfg, root)


def _write_entry(entry, item: dict, rows: dict, row, measured: bool, timing: dict, extra: dict,
                 note: Optional[str], cfg, root) -> dict:
    """Write (or keep) one shape's entry: the IR and its meta, under `_should_replace`."""
    from cake_ir.io import dumps, ir_hash, load
    from cake_ir.nodes import IR_VERSION

    kernel, diags = load(row.ir)
    if kernel is None:
        return {**item, "status": "error", "written": False,
                "reason": f"the best candidate does not load: {diags[:1]}"}
    key = item["key"]
    d = entry.library_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    ir_path, meta_path = d / f"{key}.json", d / f"{key}.meta.json"
    meta = {"task": entry.name, "shape": item["shape"], "shape_key": key, "run": cfg.run_id,
            "hash": item["hash"], "name": item["name"], "measured": measured,
            **{k: timing.get(k) for k in ("seconds", "ms_median", "predicted_s", "speedup", "speedup_vs",
                                          "speedups", "roofline_frac", "device", "target", "library_pick")},
            "arch": kernel.arch, "strategy": timing.get("strategy", row.strategy),
            "tactic": timing.get("tactic", row.tactic), "recipe": row.recipe,
            "lineage": lineage(rows, item["hash"]), "ir_version": IR_VERSION, **extra,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "note": note}
    paths = {"path": str(ir_path), "meta_path": str(meta_path)}
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
        lib_ms = old.get("seconds") * 1e3 if isinstance(old.get("seconds"), (int, float)) else None
        return {**item, **paths, "status": "kept", "written": False, "reason": why, "library_ms": lib_ms,
                "library_name": old.get("name"), "library_measured": bool(old.get("measured"))}
    _write_atomic(ir_path, dumps(kernel) + "\n")
    _write_atomic(meta_path, json.dumps(meta, indent=1, default=str) + "\n")
    return {**item, **paths, "status": "written", "written": True, "reason": why}


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
    pick = new.get("library_pick") or {}
    if pick.get("hash") == old.get("hash") and pick.get("ms") and new.get("seconds") is not None:
        if new["seconds"] < pick["ms"] * 1e-3:      # the entry timed in the same run, on the same inputs
            return True, f"faster than the library entry timed in the same run ({pick['ms']:.4f} ms)"
        return False, f"the library entry is as fast or faster in the same run ({pick['ms']:.4f} ms)"
    where_old = old.get("device") if old.get("measured") else old.get("target")
    where_new = new.get("device") if new["measured"] else new.get("target")
    if where_old != where_new:
        return True, f"judged on {where_new} (the entry was judged on {where_old})"
    if old.get("seconds") is None or (new.get("seconds") is not None and new["seconds"] < old["seconds"]):
        return True, "faster than the library entry"
    return False, f"the library entry is as fast or faster ({old.get('seconds')} s)"
