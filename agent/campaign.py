"""Running and resuming a campaign: the checkpointed graph, the DB rows, and what is left at the end
(summary table, library export of the best kernel per timed shape, HTML report).

A run is a LangGraph thread (thread_id = run id) checkpointed by SqliteSaver in
CAKE_HOME/checkpoints.sqlite with durability "sync" (each node's checkpoint is on disk before the
next node starts). `resume(run_id)` reads the run's config back from its last checkpoint and calls
`invoke(None, ...)`, which re-runs the interrupted node from its start; nodes reuse the evaluations
the killed process already stored (agent/graph.py), so nothing is lost or done twice.
"""
from __future__ import annotations

import datetime
import sqlite3
import sys
import traceback
from typing import Optional

from . import config as C


class CampaignError(RuntimeError):
    """A run that cannot start or continue; `exit_code` is agent.run's (2: bad usage, 1: the machine)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def _spec(target: str):
    from cake_ir import arch as A
    from cake_ir.cost import load_constants
    try:
        return load_constants(target)
    except Exception:  # noqa: BLE001 - an unknown target falls back to the Hopper table
        return A.spec("sm_90a")


def _saver():
    from langgraph.checkpoint.sqlite import SqliteSaver

    from knowledge.sqlite_wal import enable_wal
    conn = sqlite3.connect(str(C.checkpoint_path()), check_same_thread=False, timeout=30)
    enable_wal(conn.cursor())          # two runs starting at once may race for the switch
    saver = SqliteSaver(conn)
    saver.setup()
    return saver, conn


def _thread(run_id: str, cfg: Optional[C.RunConfig] = None) -> dict:
    limit = 10 * (cfg.max_candidates + 20) * 8 if cfg else 100000
    return {"configurable": {"thread_id": run_id}, "recursion_limit": max(1000, limit)}


def checkpoint_values(run_id: str) -> Optional[dict]:
    saver, conn = _saver()
    try:
        tup = saver.get_tuple({"configurable": {"thread_id": run_id}})
        return None if tup is None else dict(tup.checkpoint.get("channel_values") or {})
    finally:
        conn.close()


def run(cfg: C.RunConfig, *, resume: bool = False, progress=None, overrides: Optional[dict] = None,
        started: Optional[float] = None) -> dict:
    """Run or resume `cfg`'s campaign; `started` (time.monotonic()) is when the run's clock starts
    (default now): the budget covers everything from there, the workers' start included."""
    from knowledge.store import Store
    from tasks.registry import get

    from .backends import make_backend
    from .graph import Runtime, build_graph, initial_state
    from .progress import Progress

    progress = progress or Progress()
    saver, conn = _saver()
    store = Store()
    backend = None
    run_id = cfg.run_id
    try:
        tup = saver.get_tuple({"configurable": {"thread_id": run_id}})
        fresh_start = False
        if resume and tup is None:
            row = store.get_run(run_id)
            if row is None or not row.config:
                raise CampaignError(f"no run {run_id!r}: no checkpoint in {C.checkpoint_path()} and no row in the DB")
            # killed before the first checkpoint: nothing was evaluated yet; start it from the beginning
            cfg = C.RunConfig.from_dict({**row.config, **(overrides or {})})
            fresh_start, elapsed0 = True, 0.0
        elif resume:
            values = dict(tup.checkpoint.get("channel_values") or {})
            cfg = C.RunConfig.from_dict({**values["run"], **(overrides or {})})
            elapsed0 = float(values.get("elapsed_s") or 0.0)
        else:
            if tup is not None:
                raise CampaignError(f"run {run_id!r} already exists; continue it with --resume {run_id}")
            elapsed0 = 0.0
        try:
            entry = get(cfg.task).for_shape(cfg.shape, cfg.timed_shapes)
        except ValueError as e:
            raise CampaignError(str(e)) from None
        spec = _spec(cfg.target)
        if not resume:
            store.create_run(run_id, cfg.task, task_description=entry.description, proposer=cfg.proposer,
                             model=cfg.model, dry_run=cfg.dry_run, config=cfg.to_dict())
        else:
            store.update_run(run_id, status="running", finished_at=None)
        backend = make_backend(cfg)
        if not cfg.dry_run:
            _start_workers(cfg, backend, store, progress)
        rt = Runtime(cfg, entry, store, backend, progress, spec, elapsed0=elapsed0, t0=started)
        graph = build_graph(rt).compile(checkpointer=saver)
        thread = _thread(run_id, cfg)
        mode = "dry run: verify + compile + cost model, nothing measured" if cfg.dry_run else \
            f"GPUs {cfg.gpus} ({backend.kind})"
        progress.event(f"[{run_id}] {'resuming' if resume else 'starting'}: task {cfg.task}, strategies "
                       f"{'+'.join(cfg.strategies)}, max {cfg.max_candidates} candidates, {mode}")
        if resume and not fresh_start:
            # Finished means the state says why it stopped. (`get_state().next` is empty also when the
            # killed node's writes were saved as pending writes but the next checkpoint was not:
            # invoke(None) applies them and goes on.)
            if graph.get_state(thread).values.get("stop"):
                progress.event(f"[{run_id}] the run had already finished")
            else:
                graph.invoke(None, thread, durability="sync")
        else:
            graph.invoke(initial_state(cfg), thread, durability="sync")
        final = dict(graph.get_state(thread).values)
        return finish(cfg, entry, store, final, spec, progress)
    except KeyboardInterrupt:
        store.update_run(run_id, status="interrupted")
        progress.event(f"[{run_id}] interrupted; continue with: python -m agent.run --resume {run_id}")
        raise
    except CampaignError:
        raise
    except Exception:
        store.update_run(run_id, status="failed")
        progress.event(f"[{run_id}] failed:\n{traceback.format_exc()}\ncontinue with: python -m agent.run --resume {run_id}")
        raise
    finally:
        if backend is not None:
            backend.close()
        progress.close()
        conn.close()


def _start_workers(cfg, backend, store, progress) -> None:
    """Start the GPU workers and have each open its device, so a machine where they cannot (no
    driver, no device, a wrong --gpus) stops here with the cause instead of failing every candidate."""
    from .backends import WorkerStartError
    try:
        devices = backend.check_gpus()
    except WorkerStartError as e:
        store.update_run(cfg.run_id, status="failed", stop_reason=f"evaluation workers cannot start: {e}")
        raise CampaignError(f"the evaluation workers cannot start: {e}\n(check the NVIDIA driver and --gpus; "
                            f"--dry-run verifies, compiles and ranks without a GPU)", exit_code=1) from None
    progress.event(f"[{cfg.run_id}] workers ready: " + ", ".join(f"GPU {g}: {d}" for g, d in devices.items()))


def finish(cfg, entry, store, state: dict, spec, progress) -> dict:
    from . import library, report
    from .graph import _summary

    now = datetime.datetime.now(datetime.timezone.utc)
    store.update_run(cfg.run_id, status="finished", stop_reason=state.get("stop"), finished_at=now,
                     best_hash=(state.get("best") or {}).get("hash"), summary=_summary(state))
    lib = library.export_best(entry, store, state, cfg, C.library_root(), spec=spec)
    rpath = C.reports_dir() / f"{cfg.run_id}.html"
    report.write_report(rpath, cfg=cfg, entry=entry, state=state, store=store, spec=spec, library=lib)
    cands = store.candidates(cfg.run_id)
    evs = store.evaluations(cfg.run_id)
    comp = {(e.candidate_id, "compile"): (e.metrics or {}) for e in evs if e.stage == "compile"}
    rows = report.summary_rows(cands, comp, (state.get("best") or {}).get("hash"))
    lines = ["", f"== run {cfg.run_id}: {state.get('stop') or 'stopped'}",
             f"   {state.get('n_proposed', 0)} candidates; "
             + progress.funnel_text({"funnel": state.get("funnel"), "dry_run": cfg.dry_run}),
             "   " + progress.fail_text({"failures_by_code": state.get("failures_by_code")}, 8),
             "   " + progress.best_text({"best": state.get("best")}),
             "   " + progress.rate_text(state),
             ""]
    from .library_pick import verdict
    pick_line = verdict(state.get("library_pick") or {}, state.get("best") or {})
    if pick_line:
        lines.insert(-1, "   " + pick_line)
    if cfg.dry_run:
        lines.insert(2, "   DRY RUN: times are cost-model predictions (unmeasured)")
    lines.append(report.text_table(rows) if rows else "   (no candidate passed)")
    lines += [""] + ["   " + ln for ln in report.library_lines(lib, cfg.dry_run)]
    lines += [f"   report:  {rpath}", f"   resume:  python -m agent.run --resume {cfg.run_id}", ""]
    progress.final("\n".join(lines))
    return {"run_id": cfg.run_id, "state": state, "library": lib, "report": str(rpath), "rows": rows}


def list_runs(out=sys.stdout) -> None:
    from knowledge.store import Store
    for r in Store().runs():
        out.write(f"{r.id}  {r.status:<11} {r.proposer:<12} best {r.best_hash or '-'}  {r.stop_reason or ''}\n")
