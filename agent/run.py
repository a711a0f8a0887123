"""python -m agent.run: run (or resume) an agent campaign on one task.

    python -m agent.run --list-tasks
    python -m agent.run --task gemm --dry-run --max-candidates 30          # offline: no GPU, no LLM
    python -m agent.run --task softmax --gpus 0,1 --budget-minutes 30      # measured on two GPUs
    python -m agent.run --task gemm --proposer search,llm --model openai/gpt-4.1 --token-budget 200000
    python -m agent.run --resume gemm-20261130-101500-1a2b                  # continue a killed run

Exit status: 0 finished, 1 error, 2 bad usage, 130 interrupted. Everything heavy is imported after
the arguments are parsed, so --help is instant. docs/agent.md describes the harness.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from agent.config import RunConfig

STARTED = time.monotonic()      # --budget-minutes counts from here: start-up and worker start included


def _positive(kind):
    """An argparse type: a number of `kind` greater than zero (a clear error otherwise)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return v
    parse.__name__ = kind.__name__
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.run",
                                description="Run the CAKE agent loop (propose -> verify -> compile -> test -> profile "
                                            "-> reflect) on a task; checkpointed and resumable.")
    p.add_argument("--task", help="task name (see --list-tasks)")
    p.add_argument("--proposer", default="search",
                   help="search (default: bandit + evolve strategies), llm, or a comma list of strategies run "
                        "side by side, e.g. search,llm or bandit,llm")
    p.add_argument("--model", help="litellm model for the llm proposer, provider/name (keys from the environment)")
    p.add_argument("--api-base", help="base URL of an OpenAI-compatible server (or CAKE_LLM_API_BASE)")
    p.add_argument("--budget-minutes", type=_positive(float),
                   help="stop after this much run time (the first step and the end-of-run summary included)")
    p.add_argument("--max-candidates", type=_positive(int), default=100,
                   help="stop after this many candidates (default 100)")
    p.add_argument("--gpus", help="GPU ids for evaluation workers, e.g. 0,1 (default: every local GPU)")
    p.add_argument("--resume", metavar="RUN", help="continue the run RUN from its last checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: verify, compile and rank by the cost model (results labelled unmeasured)")
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")
    p.add_argument("--list-runs", action="store_true", help="list the runs in the knowledge DB and exit")
    g = p.add_argument_group("more options")
    g.add_argument("--shape", help="the bench shape to time: an index or KEY=VALUE,... (e.g. SAFE=0 for kda's softplus "
                                   "gate; default the task's first); candidates are tested on that shape's class")
    g.add_argument("--batch", type=_positive(int),
                   help="candidates per step (default: 8 per GPU; in a dry run, the compile workers, at least 2)")
    g.add_argument("--timed-shapes", choices=("run", "class"), default="run",
                   help="time candidates at the run's shape only (default), or at every bench shape of its class "
                        "(a library entry for each; slower)")
    g.add_argument("--retime-baselines", action="store_true",
                   help="time the baselines even when the knowledge store has this GPU's timing of them")
    g.add_argument("--no-baselines", action="store_true",
                   help="time no baseline and not the library's pick (speedups are against the best seed)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    g.add_argument("--target", default="h200",
                   help="GPU whose constants the cost model uses (calibration/data/<target>.json; default h200)")
    g.add_argument("--token-budget", type=_positive(int), help="LLM tokens (prompt + completion) the run may spend")
    g.add_argument("--cost-budget", type=_positive(float),
                   help="LLM cost in USD the run may spend (where litellm knows prices)")
    g.add_argument("--context-tokens", type=_positive(int), default=12000, help="prompt size budget (default 12000)")
    g.add_argument("--llm-timeout", type=_positive(float), metavar="SECONDS",
                   help="seconds an LLM call may take before it counts as failed (default 180)")
    g.add_argument("--plateau", type=_positive(int), default=8,
                   help="candidates without improvement after which a strategy's share drops (default 8)")
    g.add_argument("--ray-address", help="run evaluation workers as Ray actors on this cluster ('auto', host:port, "
                                         "or 'local' to start one); needs the ray extra")
    g.add_argument("--compile-workers", type=_positive(int),
                   help="parallel NVRTC compile workers (default: the CPUs less two, 2 to 16)")
    g.add_argument("--deadline", type=_positive(float), default=None,
                   help=f"seconds per evaluation job before the watchdog kills it (default {RunConfig.deadline_s:g}, "
                        f"or the task's own need where larger: kda 120)")
    g.add_argument("--knowledge-chars", type=int, default=4000,
                   help="LLM prompt characters for retrieved tactics and experience notes (default 4000)")
    g.add_argument("--no-vectors", action="store_true",
                   help="do not embed the run's notes and failures into the Chroma vector store at the end")
    g.add_argument("--run-id", help="name for a new run (default <task>-<date>-<time>-<hex>)")
    g.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    g.add_argument("--quiet", action="store_true", help="no progress output (the summary still prints)")
    return p


def _deadline(args) -> float:
    """--deadline, else the default raised to the task's own need (`job_seconds`)."""
    if args.deadline is not None:
        return float(args.deadline)
    try:
        from tasks.base import get_task
        need = float(getattr(get_task(args.task), "job_seconds", 0.0) or 0.0)
    except Exception:  # noqa: BLE001 - an unknown task is reported by the run itself
        need = 0.0
    return max(RunConfig.deadline_s, need)


def list_tasks(out=sys.stdout) -> int:
    from tasks.registry import discover
    for name, e in discover().items():
        if not e.runnable:
            out.write(f"{name:<10} (not runnable yet: {e.problem})\n")
            continue
        i = e.info()
        out.write(f"{name:<10} {i['description']}\n")
        keys = getattr(e.task, "shape_class_keys", ()) or ()
        more = (f" (--shape picks one of {len(i['bench_shapes'])}" + (f"; classes by {', '.join(keys)}" if keys else "")
                + ")") if len(i["bench_shapes"]) > 1 else ""
        out.write(f"{'':<10} timed shape {e.bench_shape}{more}; test shapes {len(i['shapes'])}; "
                  f"tolerance rel RMSE {i['tolerance']['rel_rmse']}"
                  + (f", max-abs {i['tolerance']['max_abs']}" if i['tolerance']['max_abs'] is not None else "") + "\n")
        out.write(f"{'':<10} seeds {', '.join(i['seeds'])}; baselines {', '.join(i['baselines']) or '-'}\n")
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from . import config as C
    C.setup_environment()
    if args.list_tasks:
        return list_tasks()
    if args.list_runs:
        from .campaign import list_runs
        list_runs()
        return 0
    if not args.task and not args.resume:
        parser().print_usage(sys.stderr)
        sys.stderr.write("error: --task NAME (or --resume RUN, --list-tasks) is required\n")
        return 2

    from .progress import Progress
    progress = Progress(tty=False if args.plain else None, quiet=args.quiet)
    from .campaign import CampaignError, run

    overrides = {}
    if args.resume:
        if args.gpus is not None:
            overrides["gpus"] = [int(x) for x in args.gpus.split(",") if x.strip()]
        if args.ray_address:
            overrides["ray_address"] = args.ray_address
        if args.compile_workers:
            overrides["compile_workers"] = args.compile_workers
        cfg = C.RunConfig(run_id=args.resume, task=args.task or "?")
    else:
        try:
            strategies = C.expand_proposer(args.proposer)
        except ValueError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        if "llm" in strategies and not args.model:
            sys.stderr.write("error: the llm proposer needs --model provider/name\n")
            return 2
        if "llm" in strategies:
            strategies = _llm_credentials(args, strategies)
            if not strategies:
                return 2
        from tasks.registry import discover
        tasks = discover()
        if args.task not in tasks or not tasks[args.task].runnable:
            known = ", ".join(n for n, e in tasks.items() if e.runnable)
            sys.stderr.write(f"error: unknown task {args.task!r}; runnable tasks: {known}\n")
            return 2
        try:
            tasks[args.task].for_shape(args.shape)
        except ValueError as e:
            sys.stderr.write(f"error: --shape: {e}\n")
            return 2
        from .backends import gpu_list
        gpus = [] if args.dry_run else gpu_list(args.gpus)
        if not args.dry_run and not gpus and not args.ray_address:
            sys.stderr.write("error: no GPU found for evaluation workers; pass --gpus, --ray-address, or use --dry-run "
                             "(verify + compile + cost model, unmeasured)\n")
            return 2
        cw = args.compile_workers or default_compile_workers()
        batch = args.batch or (max(2, 8 * len(gpus)) if gpus else max(2, cw))
        cfg = C.RunConfig(run_id=args.run_id or C.new_run_id(args.task), task=args.task, proposer=args.proposer,
                          strategies=strategies, model=args.model, api_base=args.api_base, dry_run=args.dry_run,
                          max_candidates=args.max_candidates,
                          budget_s=args.budget_minutes * 60 if args.budget_minutes is not None else None,
                          gpus=gpus, batch=batch, seed=args.seed, target=args.target,
                          token_budget=args.token_budget, cost_budget=args.cost_budget,
                          context_tokens=args.context_tokens, plateau=args.plateau, ray_address=args.ray_address,
                          compile_workers=cw, deadline_s=_deadline(args), knowledge_chars=args.knowledge_chars,
                          vectors=not args.no_vectors, shape=args.shape, timed_shapes=args.timed_shapes,
                          retime_baselines=args.retime_baselines, baselines=not args.no_baselines,
                          llm_timeout=args.llm_timeout)
    try:
        out = run(cfg, resume=bool(args.resume), progress=progress, overrides=overrides, started=STARTED)
    except CampaignError as e:
        sys.stderr.write(f"error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the traceback was shown by the campaign
        sys.stderr.write(f"error: {type(e).__name__}: {e}\n")
        return 1
    fatal = _fatal_stop(out["state"])
    if fatal:
        sys.stderr.write(f"error: {fatal}\n")
        return 1
    return 0


def default_compile_workers() -> int:
    """NVRTC compile processes: every CPU but two (the graph and the GPU workers), 2 to 16."""
    return max(2, min(16, (os.cpu_count() or 1) - 2))


def _llm_credentials(args, strategies: list) -> list:
    """The strategies to run: without credentials for --model the llm strategy cannot call anything;
    said plainly, and dropped when others remain ([] when it was the only one)."""
    from .llm import credential_problem
    problem = credential_problem(args.model, args.api_base)
    if problem is None:
        return strategies
    rest = [s for s in strategies if s != "llm"]
    if not rest:
        sys.stderr.write(f"error: {problem}\n")
        return []
    sys.stderr.write(f"warning: {problem}; running without the llm proposer ({'+'.join(rest)})\n")
    return rest


def _fatal_stop(state: dict) -> str:
    """Why the run could not do its job (every strategy stopped on a fatal error, e.g. refused LLM
    credentials), or '' when it ran."""
    sts = (state or {}).get("strategies") or {}
    if sts and all(st.get("fatal") for st in sts.values()):
        return "; ".join(f"{n}: {st.get('inactive_reason')}" for n, st in sts.items())
    return ""


if __name__ == "__main__":
    sys.exit(main())
