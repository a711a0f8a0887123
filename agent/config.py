"""Run configuration and the places a run writes to.

CAKE_HOME (default ./.cake) holds the knowledge DB (cake.db, or CAKE_DB_URL), the LangGraph
checkpoints (checkpoints.sqlite), the HTML reports (reports/<run>.html), the NVRTC cubin cache
(cubin/, or CAKE_CACHE_DIR) and the evaluation workers' task inputs and float64 references (refs/, or
CAKE_REF_CACHE_DIR; gpu_backend/task_data.py). The task library (best kernels per shape) lives in
tasks/<task>/library/ unless CAKE_LIBRARY_DIR points elsewhere.
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

SEARCH_STRATEGIES = ("bandit", "evolve")
ALL_STRATEGIES = SEARCH_STRATEGIES + ("llm", "explore")   # explore: opt-in (agent/explore.py)


def home() -> Path:
    p = Path(os.environ.get("CAKE_HOME") or (Path.cwd() / ".cake"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def checkpoint_path() -> Path:
    return home() / "checkpoints.sqlite"


def reports_dir() -> Path:
    p = home() / "reports"
    p.mkdir(parents=True, exist_ok=True)
    return p


def library_root() -> Optional[Path]:
    """None: each task's own package folder (tasks/<task>/library)."""
    v = os.environ.get("CAKE_LIBRARY_DIR")
    return Path(v) if v else None


def setup_environment() -> None:
    """Environment defaults that must be set before heavy imports (NVRTC cache location, the task data
    cache of the evaluation workers, litellm's offline price list)."""
    os.environ.setdefault("CAKE_CACHE_DIR", str(home() / "cubin"))
    os.environ.setdefault("CAKE_REF_CACHE_DIR", str(home() / "refs"))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")


def expand_proposer(spec: str) -> list[str]:
    """'search' -> bandit + evolve; 'llm'; 'search,llm'; or strategy names ('bandit,llm')."""
    out: list[str] = []
    for tok in [t.strip() for t in spec.replace("+", ",").split(",") if t.strip()]:
        if tok == "search":
            out += list(SEARCH_STRATEGIES)
        elif tok in ALL_STRATEGIES:
            out.append(tok)
        else:
            raise ValueError(f"unknown proposer {tok!r}: use search, llm, or strategy names {', '.join(ALL_STRATEGIES)}")
    seen: list[str] = []
    for s in out:
        if s not in seen:
            seen.append(s)
    if not seen:
        raise ValueError("no proposer given")
    return seen


def new_run_id(task: str) -> str:
    return f"{task}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class RunConfig:
    run_id: str
    task: str
    proposer: str = "search"
    strategies: list = field(default_factory=lambda: list(SEARCH_STRATEGIES))
    model: Optional[str] = None
    api_base: Optional[str] = None
    dry_run: bool = False
    max_candidates: int = 100
    budget_s: Optional[float] = None
    gpus: list = field(default_factory=list)
    batch: int = 2
    seed: int = 0
    target: str = "h200"                 # cost-model constants (calibration/data/<target>.json or the arch table)
    token_budget: Optional[int] = None
    cost_budget: Optional[float] = None
    context_tokens: int = 12000
    reply_tokens: int = 4096
    plateau: int = 8
    ray_address: Optional[str] = None
    compile_workers: int = 2
    deadline_s: float = 90.0
    knowledge_chars: int = 4000          # LLM prompt: retrieved tactics + experience notes of earlier runs
    vectors: bool = True                 # at the end of a run, embed its notes and failures into Chroma
    shape: Optional[str] = None          # the timed bench shape: an index or KEY=VALUE,... (None: the first)
    timed_shapes: str = "run"            # "run": candidates are timed at the run's shape; "class": at every
                                         # bench shape of its class (library entries for each)
    retime_baselines: bool = False       # time the baselines even when the knowledge store has them
    baselines: bool = True               # False: no baseline and no library pick timed (--no-baselines)
    llm_timeout: Optional[float] = None  # seconds per LLM call (litellm's timeout); None: litellm's default

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
