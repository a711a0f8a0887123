"""The agent loop as a LangGraph StateGraph:

    propose -> verify -> compile -> test -> profile -> reflect -> (propose | END)
                 |          |         |                   ^
                 +----------+---------+---- failure ------+

A step works on a *batch* of candidates (one per evaluation worker, `--batch`). Each stage runs on
the candidates still alive; a candidate that fails is marked with its stage, code, node and
diagnostics; when no candidate is left alive the graph goes straight to reflect. In a dry run
compile goes to reflect (test and profile need a GPU): candidates are ranked by the cost model and
labelled unmeasured.

State is plain JSON (see `initial_state`) and is checkpointed by the SQLite saver after every node.
Every node writes what it learned to the knowledge DB before returning, keyed so that a node that
re-runs after a crash (kill -9 included) reuses the stored results instead of redoing or duplicating
them; the search proposer is deterministic for a given (run seed, iteration), so a re-run propose
makes the same batch.
"""
from __future__ import annotations

import concurrent.futures as cf
import copy
import os
import random
import signal
import threading
import time
import zlib
from typing import Any, Optional, TypedDict

from . import gpu_stages as G
from .candidates import ProposeContext, db_fields, make_candidate, mark_failed, stored_result
from .strategies import add_note, allocate, better, conclusion, new_strategy_state, observe

STAGES = ("verify", "compile", "test", "profile", "confirm")
MAX_EMPTY_ITERATIONS = 3
FINISH_RESERVE_MAX_S = 20.0


class AgentState(TypedDict, total=False):
    run: dict                 # RunConfig as a dict
    iteration: int            # -1 before the seeds
    batch: list               # candidates of the current step
    proposer_failures: list   # replies that never became programs (this step)
    seen: list                # IR hashes proposed so far
    n_proposed: int
    n_evaluated: int
    strategies: dict          # per strategy: population, bandit arms, plateau, budget use
    notes: list               # shared conclusions
    best: dict                # the best candidate so far (summary)
    seed_best_s: Optional[float]
    baseline: dict            # name -> {"status", "ms", ...}
    library_pick: dict        # the library's entry at the run's shape timed in this run (agent/library_pick.py)
    funnel: dict              # candidates that passed each stage
    failures_by_code: dict
    history: list             # best-so-far over time
    events: list              # plateau shifts, budget stops, ...
    elapsed_s: float
    node_s: dict              # wall seconds spent in each node (where a run's time goes)
    empty_iterations: int
    stop: Optional[str]


def initial_state(cfg) -> dict:
    return {"run": cfg.to_dict(), "iteration": -1, "batch": [], "proposer_failures": [], "seen": [],
            "n_proposed": 0, "n_evaluated": 0,
            "strategies": {n: {**new_strategy_state(n, "llm" if n == "llm" else "search"),
                               "weight": round(1.0 / len(cfg.strategies), 4)} for n in cfg.strategies},
            "notes": [], "best": {}, "seed_best_s": None, "baseline": {}, "library_pick": {}, "funnel": {"proposed": 0},
            "failures_by_code": {}, "history": [], "events": [], "elapsed_s": 0.0, "node_s": {}, "empty_iterations": 0,
            "stop": None}


def finish_reserve(budget_s: float) -> float:
    """Seconds of the budget kept for the end of the run (knowledge update, library export, report)."""
    return min(0.05 * budget_s, FINISH_RESERVE_MAX_S)


def _rng(seed: int, iteration: int, name: str) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}:{iteration}:{name}".encode()))


class Runtime:
    """What the nodes need besides the state (not checkpointed): config, task, DB, backend, display."""

    def __init__(self, cfg, entry, store, backend, progress, spec, elapsed0: float = 0.0, t0: Optional[float] = None):
        self.cfg, self.entry, self.store, self.backend, self.progress, self.spec = cfg, entry, store, backend, progress, spec
        self.t0, self.elapsed0 = (time.monotonic() if t0 is None else t0), elapsed0
        self.strategies = {}
        for n in cfg.strategies:
            if n == "llm":
                from .llm import LLMStrategy
                self.strategies[n] = LLMStrategy(n)
            elif n == "explore":
                from .explore import ExploreStrategy
                self.strategies[n] = ExploreStrategy(n)
            else:
                from .search import SearchStrategy
                self.strategies[n] = SearchStrategy(n, n)
        self.shape = entry.bench_shape
        self._fault = self._parse_fault(os.environ.get("CAKE_FAULT_AFTER"))
        self._records: dict = {}
        self._snap: dict = {}
        self._pool_lock = threading.Lock()
        self.node: Optional[str] = None       # the graph node running now (or "baselines")
        if backend is not None:
            backend.on_tick = self.heartbeat

    # ---- test hook: CAKE_FAULT_AFTER=<stage>:<n> kills this process (SIGKILL) right after the n-th
    # evaluation of that stage is stored, i.e. in the middle of a node, before its checkpoint.
    @staticmethod
    def _parse_fault(v: Optional[str]):
        if not v:
            return None
        stage, _, n = v.partition(":")
        return stage, int(n or 1)

    def stored(self, stage: str) -> None:
        self._records[stage] = self._records.get(stage, 0) + 1
        if self._fault and self._fault[0] == stage and self._records[stage] >= self._fault[1]:
            os.kill(os.getpid(), signal.SIGKILL)

    def elapsed(self) -> float:
        return self.elapsed0 + (time.monotonic() - self.t0)

    def over_budget(self) -> bool:
        """Past --budget-minutes, less the end-of-run reserve: no new job starts (the graph stops at its
        next propose)."""
        return self.cfg.budget_s is not None and self.elapsed() >= self.cfg.budget_s - finish_reserve(self.cfg.budget_s)

    def heartbeat(self, activity: list) -> None:
        """Called by the backend about once a second while jobs run: a progress line every few seconds."""
        if self._snap:
            snap = {**self._snap, "elapsed_s": self.elapsed(), "node": self.node,
                    "workers": self.backend.usage() if self.backend else {}}
            self.progress.tick(snap, activity)

    def ctx(self, state: dict, iteration: int, name: str) -> ProposeContext:
        extra = {"estimator": self.estimate_many} if self.backend is not None else {}
        return ProposeContext(rng=_rng(self.cfg.seed, iteration, name), seen=set(state.get("seen", [])),
                              notes=list(state.get("notes", [])), iteration=iteration, entry=self.entry,
                              spec=self.spec, shape=self.shape, dry_run=self.cfg.dry_run, cfg=self.cfg, extra=extra)

    def estimate_many(self, cands: list) -> list[dict]:
        """Cost summaries of `cands` at the run's shape, computed in parallel by the CPU workers (the
        strategies propose in threads: one batch at a time through the pool)."""
        out: list = [{"seconds": None}] * len(cands)

        def done(idx: int, rec: dict) -> None:
            out[idx] = (rec.get("compile") or {}).get("cost") or {"seconds": None, "error": rec.get("message")}

        jobs = [{"estimate": {"shape": self.shape, "target": self.cfg.target}, "ir": c["ir"], "name": c.get("id", "?"),
                 "label": f"estimate {c.get('name')}", "task": self.cfg.task} for c in cands]
        with self._pool_lock:
            self.backend.compile(jobs, done)
        return out

    def show(self, state: dict, node: Optional[str] = None) -> None:
        snap = {"run": self.cfg.run_id, "task": self.cfg.task, "iteration": state.get("iteration", 0),
                "n_proposed": state.get("n_proposed", 0), "max": self.cfg.max_candidates,
                "funnel": state.get("funnel", {}), "failures_by_code": state.get("failures_by_code", {}),
                "best": state.get("best", {}), "strategies": state.get("strategies", {}),
                "workers": self.backend.usage() if self.backend else {}, "dry_run": self.cfg.dry_run,
                "elapsed_s": self.elapsed(), "node": node}
        self._snap = snap
        self.progress.update(snap)


# ------------------------------------------------------------------------------ helpers
def _alive(batch: list) -> list:
    return [c for c in batch if c.get("status") == "alive"]


# ------------------------------------------------------------------------------ nodes
def make_nodes(rt: Runtime) -> dict:
    cfg = rt.cfg

    def stop_reason(state: dict) -> Optional[str]:
        if state.get("stop"):
            return state["stop"]
        if state.get("n_proposed", 0) >= cfg.max_candidates:
            return f"max candidates reached ({cfg.max_candidates})"
        if rt.over_budget():
            return f"time budget reached ({cfg.budget_s / 60:g} min)"
        if state.get("iteration", -1) >= 0:
            sts = state.get("strategies", {})
            if sts and not any(s.get("active", True) for s in sts.values()):
                return "; ".join(f"{n}: {s.get('inactive_reason')}" for n, s in sts.items())
        if state.get("empty_iterations", 0) >= MAX_EMPTY_ITERATIONS:
            return "no new candidates (search space exhausted for the active strategies)"
        return None

    # -------------------------------------------------------------------- propose
    def propose(state: dict) -> dict:
        why = stop_reason(state)
        if why:
            _end_of_run(rt)
            return {"stop": why, "batch": [], "proposer_failures": [], "elapsed_s": rt.elapsed()}
        it = state["iteration"] + 1
        left = cfg.max_candidates - state["n_proposed"]
        strategies = copy.deepcopy(state["strategies"])
        cands, pfails, events = [], [], []
        if it == 0:
            ctx = rt.ctx(state, it, "seed")
            for g in rt.entry.seed_genomes():
                if len(cands) >= left:
                    break
                c, diags = make_candidate(g, ctx, strategy="seed", proposer="seed", tactic="seed",
                                          params={"seed": g["name"]})
                if c is None:
                    pfails.append({"stage": "propose", "strategy": "seed", "code": "E-SEED-SCHEMA",
                                   "message": f"seed {g['name']} does not load: {diags}"[:1000]})
                elif c["hash"] not in {x["hash"] for x in cands}:
                    cands.append(c)
        else:
            alloc = allocate(strategies, min(cfg.batch, left), cfg.plateau)
            jobs = {n: k for n, k in alloc.items() if k > 0 and strategies[n].get("active", True)}
            results: dict[str, Any] = {}
            if len(jobs) > 1:
                with cf.ThreadPoolExecutor(max_workers=len(jobs)) as ex:
                    futs = {n: ex.submit(rt.strategies[n].propose, strategies[n], k, rt.ctx(state, it, n))
                            for n, k in jobs.items()}
                    results = {n: f.result() for n, f in futs.items()}
            else:
                results = {n: rt.strategies[n].propose(strategies[n], k, rt.ctx(state, it, n)) for n, k in jobs.items()}
            hashes = set()
            for n in sorted(results):
                cs, fs = results[n]
                strategies[n]["proposed"] = strategies[n].get("proposed", 0) + len(cs)
                for c in cs:
                    if c["hash"] not in hashes:
                        hashes.add(c["hash"])
                        cands.append(c)
                pfails.extend(fs)
                if not strategies[n].get("active", True) and state["strategies"][n].get("active", True):
                    events.append(f"{n} stopped: {strategies[n].get('inactive_reason')}")
        for i, c in enumerate(cands):
            c["slot"], c["iteration"], c["id"] = i, it, f"{it}.{i}"
        for i, f in enumerate(pfails):
            f["key"] = f"propose:{it}:{f.get('strategy')}:{i}"
        empty = 0 if (cands or pfails) else state.get("empty_iterations", 0) + 1
        for e in events:
            rt.progress.event(f"[{cfg.run_id}] {e}")
        return {"iteration": it, "batch": cands, "proposer_failures": pfails,
                "seen": state["seen"] + [c["hash"] for c in cands], "n_proposed": state["n_proposed"] + len(cands),
                "strategies": strategies, "empty_iterations": empty, "events": (state.get("events", []) + events)[-50:],
                "funnel": {**state["funnel"], "proposed": state["funnel"].get("proposed", 0) + len(cands)},
                "elapsed_s": rt.elapsed()}

    # -------------------------------------------------------------------- verify
    def verify(state: dict) -> dict:
        batch = copy.deepcopy(state["batch"])
        todo = []
        for c in _alive(batch):
            result = stored_result(rt, c, "verify")
            if result is None:
                todo.append(c)
            else:
                _apply_verify(c, result)

        def done(idx: int, rec: dict) -> None:
            c = todo[idx]
            if rec.get("status") == "skipped":     # the budget ran out before it started
                c["status"], c["stage"] = "skipped", "verify"
                return
            result = (rec.get("compile") or {}).get("verify") or _verifier_crash(rec)
            _apply_verify(c, result)
            errs = [d for d in result["diagnostics"] if d.get("severity", "error") == "error"]
            rt.store.record_stage(cfg.run_id, db_fields(c), "verify", "ok" if result["ok"] else "fail",
                                  error_class=None if result["ok"] else "verify_error",
                                  metrics={"errors": result["n_errors"], "warnings": result["n_warnings"]},
                                  result=result, seconds=result["seconds"], executor=rec.get("executor"),
                                  failures=[{"code": d.get("code"), "node": d.get("node"), "message": d.get("message")}
                                            for d in errs[:10]])
            rt.stored("verify")

        # verification runs in the CPU workers, in parallel (agent.jobs.verify_job)
        rt.backend.compile([{"verify_only": True, "ir": c["ir"], "name": c["id"], "label": f"{c['id']} {c['name']}",
                             "task": cfg.task} for c in todo], done, stop=rt.over_budget)
        rt.show({**state, "batch": batch}, "verify")
        return {"batch": batch, "elapsed_s": rt.elapsed()}

    # -------------------------------------------------------------------- compile
    def compile_(state: dict) -> dict:
        batch = copy.deepcopy(state["batch"])
        todo = []
        for c in _alive(batch):
            result = stored_result(rt, c, "compile")
            if result is None:
                todo.append(c)
            else:
                _apply_compile(c, result, cfg.dry_run)
        # a dry run ranks by the compiled code's instruction counts where nvdisasm is there
        sass_cost = {"shape": dict(rt.shape), "target": cfg.target} if cfg.dry_run else None
        jobs = [{"ir": c["ir"], "name": c["id"], "label": f"{c['id']} {c['name']}", "task": cfg.task, "hash": c["hash"],
                 "sass_cost": sass_cost} for c in todo]

        def done(idx: int, rec: dict) -> None:
            c = todo[idx]
            if rec.get("status") == "skipped":     # the budget ran out before it started
                c["status"], c["stage"] = "skipped", "compile"
                return
            result = {"ok": rec.get("status") == "ok", "status": rec.get("status"), "error_class": rec.get("error_class"),
                      "message": rec.get("message", "")[:2000], "node": rec.get("node"),
                      "diagnostics": (rec.get("diagnostics") or [])[:12], "compile": rec.get("compile") or {},
                      "executor": rec.get("executor"), "seconds": rec.get("wall_s", 0.0)}
            _apply_compile(c, result, cfg.dry_run)
            errs = [d for d in result["diagnostics"] if d.get("severity", "error") == "error"]
            fails = [{"code": d.get("code"), "node": d.get("node"), "message": d.get("message")} for d in errs[:10]]
            if not result["ok"] and not fails:
                fails = [{"code": (result.get("error_class") or "compile_error"), "node": result.get("node"),
                          "message": result.get("message")}]
            rt.store.record_stage(cfg.run_id, db_fields(c), "compile", result["status"] or "error",
                                  error_class=result.get("error_class"), metrics=result["compile"], result=result,
                                  seconds=result["seconds"], executor=result.get("executor"), failures=fails)
            rt.stored("compile")
            rt.show({**state, "batch": batch}, "compile")

        rt.backend.compile(jobs, done, stop=rt.over_budget)
        return {"batch": batch, "elapsed_s": rt.elapsed()}

    # -------------------------------------------------------------------- test / profile / confirm (GPU)
    def test(state: dict) -> dict:
        return G.run_stage(rt, state, "test", G.alive)

    def profile(state: dict) -> dict:
        return G.run_stage(rt, state, "profile", G.alive)

    def confirm(state: dict) -> dict:
        return G.run_stage(rt, state, "confirm", G.would_be_best)

    # -------------------------------------------------------------------- reflect
    def reflect(state: dict) -> dict:
        r = {"strategies": copy.deepcopy(state["strategies"]), "notes": list(state.get("notes", [])),
             "funnel": dict(state.get("funnel", {})), "failures_by_code": dict(state.get("failures_by_code", {})),
             "best": dict(state.get("best") or {}), "history": list(state.get("history", [])),
             "seed_best_s": state.get("seed_best_s"), "events": []}
        measured = not cfg.dry_run
        done = [c for c in state["batch"] if c.get("status") != "skipped"]    # skipped: the budget ran out
        for c in done:
            if c.get("status") == "alive":   # a dry run ends at compile
                c = {**c, "status": "ok"}
            _absorb(rt, r, c, measured)
            if _new_best(c, r["best"], measured):
                r["best"] = _best_summary(c, measured)
                r["history"].append({"n": state.get("n_evaluated", 0) + 1, "t": rt.elapsed(), "best_s": c["score_s"],
                                     "hash": c["hash"]})
        for f in state.get("proposer_failures", []):
            r["failures_by_code"][f["code"]] = r["failures_by_code"].get(f["code"], 0) + 1
            rt.store.add_failure(cfg.run_id, f["key"], "propose", f["code"], f.get("message", ""),
                                 strategy=f.get("strategy"))
        baseline, pick = state.get("baseline") or {}, state.get("library_pick")
        if measured and not baseline and not cfg.baselines:
            baseline = {"_none": {"status": "none", "message": "not timed (--no-baselines)"}}
        elif measured and not baseline:   # after the first step: the seeds are measured before anything waits
            from .baseline_cache import time_baselines
            from .library_pick import time_library_pick
            rt.node = "baselines"
            baseline, pick = time_baselines(rt, retime=cfg.retime_baselines), time_library_pick(rt)
            rt.node = "reflect"
        _speedup(r["best"], baseline, r["seed_best_s"], measured)
        events = r.pop("events")
        out = {**r, "batch": [], "proposer_failures": [], "baseline": baseline, "library_pick": pick or {},
               "n_evaluated": state.get("n_evaluated", 0) + len(done), "events": (state.get("events", []) + events)[-50:],
               "elapsed_s": rt.elapsed()}
        for e in events:
            rt.progress.event(f"[{cfg.run_id}] {e}")
        nxt = {**state, **out}
        why = stop_reason(nxt)
        out["stop"] = why
        rt.store.update_run(cfg.run_id, best_hash=out["best"].get("hash"), summary=_summary(nxt))
        if why:
            _end_of_run(rt)
        rt.show(nxt, "reflect")
        return out

    return {"propose": propose, "verify": verify, "compile": compile_, "test": test, "profile": profile,
            "confirm": confirm, "reflect": reflect, "stop_reason": stop_reason}


def _end_of_run(rt: Runtime) -> None:
    """Experience notes, tactic statistics and Chroma embeddings of the run (knowledge/experience.py).
    Keyed writes: a node re-run after a crash repeats it harmlessly. A failure here is reported, and
    does not fail the run (its results are already in the DB)."""
    try:
        from knowledge.experience import end_of_run
        r = end_of_run(rt.store, rt.cfg.run_id, embed=getattr(rt.cfg, "vectors", True))
        rt.progress.event(f"[{rt.cfg.run_id}] knowledge: {r.get('notes', 0)} notes, {r.get('tactic_stats', 0)} "
                          f"tactic statistics rows" + (f", embedded {r['experiences']} notes and {r['failures']} "
                                                       f"failures" if "failures" in r else ""))
    except Exception as e:  # noqa: BLE001
        rt.progress.event(f"[{rt.cfg.run_id}] knowledge update failed: {type(e).__name__}: {str(e)[:300]}")


def _absorb(rt: Runtime, r: dict, c: dict, measured: bool) -> None:
    """One evaluated candidate into reflect's accumulators: funnel, failure counts, the strategies'
    populations and statistics, the shared notes."""
    from .strategies import add_member, member_of
    for s in STAGES:
        if _passed(c, s):
            r["funnel"][s] = r["funnel"].get(s, 0) + 1
    if c["status"] == "failed":
        code = (c.get("fail") or {}).get("code") or "?"
        r["failures_by_code"][code] = r["failures_by_code"].get(code, 0) + 1
    strategies = r["strategies"]
    if c.get("strategy") == "seed":
        if c["status"] == "ok":
            if better(c.get("score_s"), r["seed_best_s"]):
                r["seed_best_s"] = c["score_s"]
            for st in strategies.values():
                add_member(st, member_of(c))
                if better(c.get("score_s"), st.get("best_s")):
                    st["best_s"], st["best_hash"] = c["score_s"], c["hash"]
    elif c.get("strategy") in strategies:
        st = strategies[c["strategy"]]
        r["events"] += observe(st, c, rt.cfg.plateau)
        if c["status"] == "failed" and c.get("strategy") == "llm":
            from .llm import remember_failure
            remember_failure(st, c)
        r["notes"] = add_note(r["notes"], conclusion(c, measured))


def _new_best(c: dict, best: dict, measured: bool) -> bool:
    """A measured best must also have passed the confirm stage (the full matrix on fresh inputs)."""
    if c["status"] != "ok" or not better(c.get("score_s"), best.get("score_s")):
        return False
    return not measured or _passed(c, "confirm")


def _best_summary(c: dict, measured: bool) -> dict:
    return {"hash": c["hash"], "name": c.get("name"), "score_s": c["score_s"], "measured": measured,
            "strategy": c.get("strategy"), "tactic": c.get("tactic"), "params": c.get("params"),
            "predicted_s": c.get("predicted_s"), "iteration": c.get("iteration"),
            "profile": c.get("profile"), "cost": c.get("cost")}


def _speedup(best: dict, baseline: dict, seed_best: Optional[float], measured: bool) -> None:
    """The best's speedup: vs the fastest baseline timed correct, else vs the best seed (same measure);
    `speedups`: vs every baseline timed correct."""
    if not best:
        return
    base = _baseline_ms(baseline)
    if measured:
        best["speedups"] = G.speedups(baseline, best["score_s"] * 1e3)
    if measured and base:
        best["speedup"], best["speedup_vs"] = base[1] * 1e-3 / best["score_s"], base[0]
    elif seed_best:
        best["speedup"] = seed_best / best["score_s"]
        best["speedup_vs"] = "best seed" + ("" if measured else " (predicted)")


def _verifier_crash(rec: dict) -> dict:
    """A verify result for a job that returned no verdict (its worker died or timed out)."""
    msg = f"the verifier did not finish: {rec.get('status')} {rec.get('error_class') or ''}: {rec.get('message') or ''}"
    return {"ok": False, "seconds": rec.get("wall_s") or 0.0, "n_errors": 1, "n_warnings": 0,
            "diagnostics": [{"code": "E-VERIFY-INTERNAL", "severity": "error", "node": None, "message": msg[:500]}]}


def _passed(c: dict, stage: str) -> bool:
    return stage in c.get("passed", [])


def _apply_verify(c: dict, result: dict) -> None:
    c["stage"] = "verify"
    c["diagnostics"] = result.get("diagnostics", [])
    if result["ok"]:
        c.setdefault("passed", []).append("verify")
    else:
        d = next((d for d in c["diagnostics"] if d.get("severity", "error") == "error"), {})
        mark_failed(c, "verify", d.get("code", "E-VERIFY"), d.get("node"), d.get("message", "verification failed"))


def _apply_compile(c: dict, result: dict, dry_run: bool) -> None:
    c["stage"] = "compile"
    c["compile"] = result.get("compile") or {}
    if result.get("diagnostics"):
        c["diagnostics"] = result["diagnostics"]
    if result["ok"]:
        c.setdefault("passed", []).append("compile")
        if dry_run:
            pred = c["compile"].get("predicted_sass_s") or c.get("predicted_s")
            c["status"], c["score_s"], c["measured"] = "ok", pred, False
    else:
        errs = [d for d in result.get("diagnostics") or [] if d.get("severity", "error") == "error"]
        d = errs[0] if errs else {}
        mark_failed(c, "compile", d.get("code") or result.get("error_class") or "compile_error",
              d.get("node") or result.get("node"), d.get("message") or result.get("message", ""))


def _baseline_ms(baseline: dict) -> Optional[tuple[str, float]]:
    ok = [(n, b["ms"]) for n, b in baseline.items() if b.get("status") == "ok" and b.get("ms")]
    return min(ok, key=lambda x: x[1]) if ok else None


def _summary(state: dict) -> dict:
    return {"iteration": state.get("iteration"), "n_proposed": state.get("n_proposed"),
            "n_evaluated": state.get("n_evaluated"), "funnel": state.get("funnel"),
            "failures_by_code": state.get("failures_by_code"), "best": state.get("best"),
            "baseline": state.get("baseline"), "library_pick": state.get("library_pick"),
            "elapsed_s": state.get("elapsed_s"), "node_s": state.get("node_s"),
            "strategies": {n: {k: s.get(k) for k in ("evaluated", "ok", "improved", "best_s", "plateau", "active",
                                                     "inactive_reason", "weight", "tokens", "cost_usd", "calls",
                                                     "proposer_failures")}
                           for n, s in (state.get("strategies") or {}).items()}}


# ------------------------------------------------------------------------------ the graph
def _timed(rt: Runtime, name: str, node):
    """The node with its wall time added to the state's `node_s` (the summary's "time by node"); the
    runtime knows which node runs (progress lines)."""
    def run(state: dict) -> dict:
        rt.node = name
        t0 = time.perf_counter()
        out = node(state)
        spent = dict(state.get("node_s") or {})
        spent[name] = round(spent.get(name, 0.0) + time.perf_counter() - t0, 3)
        return {**out, "node_s": spent}
    return run


def build_graph(rt: Runtime):
    from langgraph.graph import END, START, StateGraph

    nodes = make_nodes(rt)
    g = StateGraph(AgentState)
    for name in ("propose", "verify", "compile", "test", "profile", "confirm", "reflect"):
        g.add_node(name, _timed(rt, name, nodes[name]))
    g.add_edge(START, "propose")

    def after_propose(state: dict) -> str:
        if state.get("stop"):
            return END
        if _alive(state.get("batch", [])):
            return "verify"
        return "reflect" if state.get("proposer_failures") else "propose"

    def after_verify(state: dict) -> str:
        return "compile" if _alive(state["batch"]) else "reflect"

    def after_compile(state: dict) -> str:
        if rt.cfg.dry_run or not _alive(state["batch"]):
            return "reflect"
        return "test"

    def after_test(state: dict) -> str:
        return "profile" if _alive(state["batch"]) else "reflect"

    def after_reflect(state: dict) -> str:
        return END if state.get("stop") else "propose"

    g.add_conditional_edges("propose", after_propose, ["verify", "reflect", "propose", END])
    g.add_conditional_edges("verify", after_verify, ["compile", "reflect"])
    g.add_conditional_edges("compile", after_compile, ["test", "reflect"])
    def after_profile(state: dict) -> str:
        return "confirm" if G.would_be_best(state["batch"], state) else "reflect"

    g.add_conditional_edges("test", after_test, ["profile", "reflect"])
    g.add_conditional_edges("profile", after_profile, ["confirm", "reflect"])
    g.add_edge("confirm", "reflect")
    g.add_conditional_edges("reflect", after_reflect, ["propose", END])
    return g
