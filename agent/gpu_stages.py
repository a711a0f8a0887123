"""The graph's GPU stages, one evaluation job per candidate on the worker pool:

- test: the fast correctness set, every test shape of the run's class on inputs from a fixed pool of
  TEST_INPUT_POOL seeded sets per shape (the candidate's seed picks the set, a re-run with the next set
  catches replayed results); their float64 references are computed once and cached on disk;
- profile: a quick re-test on the smallest test shape, then CUDA-event timing on the run's timed
  shapes (its own bench shape, or every bench shape of its class with --timed-shapes class) on the
  run's bench inputs (one seed per run: every candidate is timed on the same data);
- confirm: a candidate that would become the run's best is tested again on the full matrix, every
  test shape of the class with inputs drawn fresh from its own seed plus a fresh re-run, references
  computed anew. Only a confirmed candidate becomes the best, is exported or counts as a speedup.

Each stage stores one evaluation per candidate (keyed, so a re-run node after a crash reuses it).
Jobs not started when the run's time budget runs out come back "skipped": the candidate is dropped
from the step without counting as a failure.
"""
from __future__ import annotations

import copy
import json
import zlib
from typing import Optional

from .candidates import db_fields, mark_failed, stored_result

TEST_INPUT_POOL = 4


def jobs_for(rt, stage: str, todo: list) -> list[dict]:
    cfg = rt.cfg
    tests = rt.entry.test_shapes()                # the run's shape class (all shapes without classes)
    jobs = []
    for c in todo:
        job = {"candidate": json.dumps(c["ir"]), "task": cfg.task, "name": c["id"], "label": f"{c['id']} {c['name']}",
               "seed": zlib.crc32(f"{cfg.seed}:{c['hash']}:{stage}".encode()) & 0x7FFFFFFF,
               "deadline_s": cfg.deadline_s}
        if stage == "test":
            job.update(profile=False, reruns=1, shapes=tests, input_pool=TEST_INPUT_POOL)
        elif stage == "confirm":
            job.update(profile=False, reruns=1, shapes=tests, input_pool=0)
        else:
            job.update(profile=True, reruns=0, shapes=[min(tests, key=lambda s: sum(s.values()))],
                       input_pool=TEST_INPUT_POOL, bench_shapes=rt.entry.timed_shapes(),
                       bench_seed=zlib.crc32(f"{cfg.seed}:{cfg.run_id}:bench".encode()) & 0x7FFFFFFF)
        jobs.append(job)
    return jobs


def run_stage(rt, state: dict, stage: str, todo_of) -> dict:
    """Evaluate `todo_of(batch)` (the candidates this stage looks at) and return the node's update.
    Stored results are reused; the rest run on the workers, each stored as soon as it arrives."""
    batch = copy.deepcopy(state["batch"])
    todo = []
    for c in todo_of(batch, state):
        result = stored_result(rt, c, stage)
        if result is None:
            todo.append(c)
        else:
            apply_result(c, stage, result)
    baseline = state.get("baseline") or {}

    def done(idx: int, rec: dict) -> None:
        c = todo[idx]
        if rec.get("status") == "skipped":
            c["status"], c["stage"] = "skipped", stage
            return
        result = gpu_result(rt, stage, rec, baseline, c)
        apply_result(c, stage, result)
        fails = [] if result["ok"] else [{"code": result.get("error_class") or result.get("status") or "error",
                                          "node": result.get("node"), "message": result.get("message")}]
        rt.store.record_stage(rt.cfg.run_id, db_fields(c), stage, result.get("status") or "error",
                              error_class=result.get("error_class"), metrics=result.get("metrics"),
                              timings=result.get("timings"), result=result, seconds=result.get("seconds", 0.0),
                              executor=result.get("executor"), failures=fails)
        rt.stored(stage)
        rt.show({**state, "batch": batch}, stage)

    # confirm is never cut by the budget: it decides whether a timed candidate counts at all
    rt.backend.evaluate(jobs_for(rt, stage, todo), done, stop=None if stage == "confirm" else rt.over_budget)
    return {"batch": batch, "elapsed_s": rt.elapsed()}


def alive(batch: list, state: dict) -> list:
    return [c for c in batch if c.get("status") == "alive"]


def would_be_best(batch: list, state: dict) -> list:
    """The timed candidates of the step that beat the run's best so far (those the confirm stage
    re-tests before one of them may become the best)."""
    from .strategies import better
    best = (state.get("best") or {}).get("score_s")
    return [c for c in batch if c.get("status") == "ok" and "profile" in c.get("passed", [])
            and better(c.get("score_s"), best)]


def apply_result(c: dict, stage: str, result: dict) -> None:
    c["stage"] = stage
    c[stage] = {k: v for k, v in result.items() if k not in ("timings",)}
    if result["ok"]:
        c.setdefault("passed", []).append(stage)
        if stage == "profile":
            c["status"], c["score_s"], c["measured"] = "ok", result["metrics"]["seconds"], True
    else:
        mark_failed(c, stage, result.get("error_class") or result.get("status") or "error", result.get("node"),
              result.get("message", ""))


def gpu_result(rt, stage: str, rec: dict, baseline: dict, c: dict) -> dict:
    """The stage's result from a worker record: status, shapes, and at profile the metrics (seconds,
    roofline fraction, cost-model residual, speedups over the baselines timed so far)."""
    from cake_ir.cost import roofline_floor
    ok = rec.get("status") == "ok"
    result = {"ok": ok, "status": rec.get("status"), "error_class": rec.get("error_class"),
              "message": (rec.get("message") or "")[:2000], "node": rec.get("node"), "executor": rec.get("executor"),
              "device": rec.get("device"), "seconds": rec.get("wall_s", 0.0), "max_rel_rmse": rec.get("max_rel_rmse"),
              "seed": rec.get("seed"), "timings": rec.get("timings") or [],
              "shapes": [{k: s.get(k) for k in ("shape", "run", "ok", "rel_rmse", "error_class")}
                         for s in rec.get("shapes") or []][:12]}
    metrics: dict = {"max_rel_rmse": rec.get("max_rel_rmse")}
    if stage == "profile" and ok:
        tm = next((t for t in result["timings"] if t.get("shape") == rt.shape), (result["timings"] or [None])[0])
        if tm is None:
            result.update(ok=False, status="error", error_class="no_timing", message="the profile record has no timing")
        else:
            sec = tm["ms_median"] * 1e-3
            t = rt.entry.task
            floor = roofline_floor(t.flops(rt.shape), t.bytes(rt.shape), rt.spec)
            metrics.update(seconds=sec, ms_median=tm["ms_median"], ms_min=tm.get("ms_min"), ms_max=tm.get("ms_max"),
                           tflops=tm.get("tflops"), tbps=tm.get("tbps"), roofline_frac=floor / sec if sec > 0 else None,
                           residual=(sec / c["predicted_s"]) if c.get("predicted_s") else None,
                           speedup=speedups(baseline, tm["ms_median"]))
    result["metrics"] = metrics
    return result


def speedups(baseline: dict, ms: Optional[float]) -> dict:
    """{baseline name: its median / ms} for the baselines timed correct."""
    if not ms:
        return {}
    return {n: b["ms"] / ms for n, b in (baseline or {}).items() if b.get("status") == "ok" and b.get("ms")}
