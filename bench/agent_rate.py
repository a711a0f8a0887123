"""How fast `agent.run` measures candidates, read from its knowledge DB (no GPU needed to read):

    python bench/agent_rate.py --home .cake --run kda-cold:1764859000.12 --run kda-warm:1764859300.5 \
        --out bench/results/agent-kda-rate-h200.json --command "bash bench/agent_kda_device.sh"

Each --run is RUN_ID:START where START is the command's start in seconds since the epoch (the shell's
`date +%s.%N` just before `python -m agent.run`). Per run: time to the first measured candidate (its
profile evaluation stored), candidates timed per minute overall and in steady state (the steps after
the first, which times the seeds and then the baselines once: from the first timing of step 1 to the
last), the graph's seconds per node, baselines (timed or from the cache), the best, the stop reason
and the command's wall time when the run's `finished_at` is known. Prints a table; writes
the results JSON (GPU, versions, command) when --out is given.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _epoch(t) -> float:
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def run_stats(store, run_id: str, start: float) -> dict:
    run = store.get_run(run_id)
    if run is None:
        return {"run": run_id, "error": "no such run in the DB"}
    evs = store.evaluations(run_id)
    cands = {c.id: c for c in store.candidates(run_id)}
    timed = sorted(_epoch(e.created_at) for e in evs if e.stage == "profile" and e.status in ("ok", "fail"))
    # steady state: the steps after the first (the seeds, then the one-time baseline timing)
    later = sorted(_epoch(e.created_at) for e in evs if e.stage == "profile" and e.status in ("ok", "fail")
                   and (cands.get(e.candidate_id) is not None and (cands[e.candidate_id].iteration or 0) >= 1))
    tested = [e for e in evs if e.stage == "test"]
    summary = run.summary or {}
    end = _epoch(run.finished_at) if run.finished_at else (timed[-1] if timed else start)
    span = (later[-1] - later[0]) if len(later) > 1 else None
    best = summary.get("best") or {}
    return {
        "run": run_id, "stop": run.stop_reason, "config": {k: (run.config or {}).get(k) for k in
                                                            ("budget_s", "batch", "compile_workers", "strategies",
                                                             "shape", "timed_shapes", "gpus")},
        "wall_s": round(end - start, 1), "elapsed_s": summary.get("elapsed_s"),
        "first_timed_s": round(timed[0] - start, 1) if timed else None,
        "candidates": len(cands), "gpu_tested": len(tested), "timed": len(timed),
        "timed_per_min": round(len(timed) / (end - start) * 60, 1) if end > start else None,
        "steady_timed_per_min": round((len(later) - 1) / span * 60, 1) if span else None,
        "steady_window_s": round(span, 1) if span else None,
        "confirmed": sum(1 for e in evs if e.stage == "confirm" and e.status == "ok"),
        "confirm_failed": sum(1 for e in evs if e.stage == "confirm" and e.status != "ok"),
        "funnel": summary.get("funnel"), "failures_by_code": summary.get("failures_by_code"),
        "node_s": summary.get("node_s"),
        "baselines": {n: {k: b.get(k) for k in ("status", "ms", "cached", "seconds", "error_class")}
                      for n, b in (summary.get("baseline") or {}).items()},
        "best": {k: best.get(k) for k in ("name", "hash", "score_s", "speedup", "speedup_vs", "speedups", "tactic",
                                          "params")},
    }


def versions() -> dict:
    from importlib import metadata
    out = {"python": platform.python_version()}
    for lib in ("torch", "triton", "fla-core", "cuda-bindings", "cuda-core", "nvidia-cuda-nvrtc", "langgraph",
                "numpy"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    try:
        from gpu_backend.driver import properties
        out["gpu"] = properties(0)["name"]
    except Exception:  # noqa: BLE001 - reading a DB needs no GPU
        out["gpu"] = None
    return out


def table(rows: list[dict]) -> str:
    cols = ("run", "wall_s", "first_timed_s", "timed", "timed_per_min", "steady_timed_per_min", "confirmed",
            "stop")
    out = ["  ".join(cols)]
    for r in rows:
        out.append("  ".join(str(r.get(c)) for c in cols))
        b = r.get("best") or {}
        if b.get("score_s"):
            out.append(f"    best {b['name']} {b['score_s'] * 1e3:.4f} ms"
                       + (f", {b['speedup']:.2f}x vs {b['speedup_vs']}" if b.get("speedup") else ""))
        out.append(f"    node seconds {r.get('node_s')}; baselines {r.get('baselines')}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", required=True, help="the runs' CAKE_HOME")
    ap.add_argument("--run", action="append", required=True, help="RUN_ID:START_EPOCH_S (repeatable)")
    ap.add_argument("--out", help="results JSON to write")
    ap.add_argument("--command", default="", help="the command that produced the runs (recorded)")
    args = ap.parse_args(argv)
    from knowledge.store import Store
    store = Store(home=args.home)
    rows = []
    for spec in args.run:
        rid, _, start = spec.rpartition(":")
        rows.append(run_stats(store, rid, float(start)))
    print(table(rows))
    if args.out:
        doc = {"gpu": None, "versions": versions(), "command": args.command,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host_cpus": os.cpu_count(), "runs": rows}
        doc["gpu"] = doc["versions"].get("gpu")
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
