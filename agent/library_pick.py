"""The library's current kernel for the run's shape, timed in the run itself.

A library entry's recorded time comes from another run (other inputs, maybe another day's clocks). To
say whether this run beat the library, the entry is timed once in this run by the same profile job as
every candidate (same worker, same bench inputs), right after the baselines. The result is kept in the
state (`library_pick`), printed in the summary, and used by the library export: a new best replaces
the entry only when it is faster than the entry's same-run time.
"""
from __future__ import annotations

import json
from typing import Optional


def current_entry(rt) -> Optional[dict]:
    """{"name", "hash", "ir", "seconds"} of the measured library entry at the run's shape, or None."""
    from . import config as C
    d = rt.entry.library_dir(C.library_root())
    key = rt.entry.shape_key()
    try:
        meta = json.loads((d / f"{key}.meta.json").read_text())
        ir = json.loads((d / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not meta.get("measured"):
        return None
    return {"name": meta.get("name"), "hash": meta.get("hash"), "ir": ir, "seconds": meta.get("seconds")}


def time_library_pick(rt) -> dict:
    """{"name", "hash", "status", "ms", "recorded_ms", "message"} of the library's entry timed now, or {}."""
    from .gpu_stages import jobs_for
    e = current_entry(rt)
    if e is None:
        return {}
    pseudo = {"id": "library", "name": e["name"], "hash": e["hash"], "ir": e["ir"]}
    out = {"name": e["name"], "hash": e["hash"], "status": "skipped", "ms": None,
           "recorded_ms": e["seconds"] * 1e3 if e.get("seconds") else None, "message": ""}

    def done(idx: int, rec: dict) -> None:
        tm = next((t for t in rec.get("timings") or [] if t.get("shape") == rt.shape), None)
        out.update(status=rec.get("status"), ms=tm["ms_median"] if tm and rec.get("status") == "ok" else None,
                   message=(rec.get("message") or "")[:300])

    rt.backend.evaluate(jobs_for(rt, "profile", [pseudo]), done, stop=rt.over_budget)
    how = f"{out['ms']:.4f} ms" if out["ms"] else f"not timed ({out['status']}: {out['message'][:120]})"
    rt.progress.event(f"[{rt.cfg.run_id}] library pick {e['name']} {e['hash'][:8]}: {how} in this run"
                      + (f" (recorded {out['recorded_ms']:.4f} ms)" if out["recorded_ms"] else ""))
    return out


def verdict(pick: dict, best: dict) -> Optional[str]:
    """One summary line: the run's best against the library pick timed in the same run."""
    if not pick or not pick.get("ms") or not best.get("score_s"):
        return None
    ratio = pick["ms"] * 1e-3 / best["score_s"]
    same = best.get("hash") == pick.get("hash")
    return (f"library pick {pick['name']} {pick['hash'][:8]}: {pick['ms']:.4f} ms in this run; the run's best is "
            + ("that kernel" if same else f"{ratio:.3f}x of it ({'faster' if ratio > 1 else 'not faster'})"))
