"""Task registry: every task package under tasks/ that the agent can run.

A runnable task is a package `tasks/<name>/` with `task.py` (defining TASK, the tasks.base.Task
protocol: shapes, inputs, reference, tolerance, FLOP/byte counts) and `programs.py` (SEEDS, and
optionally FAMILIES for family tactics). The registry adds what the agent needs on top:

- `baselines`: library implementations timed next to candidates on the GPU (e.g. torch.matmul). A
  task object may declare its own `baselines` attribute (list of {"name", "call"}); otherwise the
  defaults below apply. `call` is "module:function" taking a dict of torch tensors (the task's input
  names) and returning a dict of output tensors.
- `seeds()`: name -> Kernel of the seed programs; `families()`: the parametrised seed families.
- `description`: the first paragraph of tasks/<name>/task.py's docstring.
- the run's shape: `bench_shape` is the task's first bench shape, or the one `for_shape("SAFE=0")`
  (or `for_shape("3")`, an index) picks; `test_shapes()` / `timed_shapes()` are the task's shapes in
  that shape's class (`shape_class_keys`), and `seed_genomes()` skips seeds whose scalar facts refuse
  one of them.

Packages without task.py (a task still being written) are listed with `runnable=False`.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent

DEFAULT_BASELINES = {
    "gemm": [{"name": "torch.matmul", "call": "tasks.registry:torch_gemm"}],
    "softmax": [{"name": "torch.softmax", "call": "tasks.registry:torch_softmax"}],
    "knn": [{"name": "torch (chunked matmul + topk)", "call": "agent.baselines:knn_l2_torch"},
            {"name": "flashlib.flash_knn (Triton)", "call": "agent.baselines:knn_l2_flashlib"}],
    "knn_ip": [{"name": "torch (chunked matmul + topk)", "call": "agent.baselines:knn_ip_torch"}],
    "kmeans": [{"name": "torch (bmm + argmin + scatter_add)", "call": "agent.baselines:kmeans_torch"},
               {"name": "flash-kmeans (Triton)", "call": "agent.baselines:kmeans_flash"},
               {"name": "flashlib.flash_kmeans", "call": "agent.baselines:kmeans_flashlib"}],
    "kda": [{"name": "fla chunk_kda (Triton)", "call": "agent.baselines:kda_chunk_fla"},
            {"name": "FlashKDA (CUTLASS, safe gate only)", "call": "agent.baselines:kda_flashkda"}],
    "kda_decode": [{"name": "fla fused_recurrent_kda (Triton, state pool)", "call": "agent.baselines:kda_decode_fla"}],
}


# --------------------------------------------------------------------------- baseline callables
def torch_gemm(inputs: dict) -> dict:
    """C = A @ B^T in bf16 (torch accumulates in fp32, like the candidates)."""
    return {"C": inputs["A"] @ inputs["B"].T}


def torch_softmax(inputs: dict) -> dict:
    import torch
    return {"Y": torch.softmax(inputs["X"], dim=-1)}


# --------------------------------------------------------------------------- entries
@dataclass
class TaskEntry:
    name: str
    path: Path
    runnable: bool
    problem: Optional[str] = None
    _task: Any = field(default=None, repr=False)
    shape_selector: Optional[str] = None          # which bench shape a run times (None: the first)
    timed_scope: str = "class"                    # "run": a run times its own shape only; "class": every
                                                  # bench shape of its class

    @property
    def task(self):
        if self._task is None:
            if not self.runnable:
                raise KeyError(f"task {self.name!r} is not runnable: {self.problem}")
            self._task = importlib.import_module(f"tasks.{self.name}.task").TASK
        return self._task

    @cached_property
    def description(self) -> str:
        try:
            doc = importlib.import_module(f"tasks.{self.name}.task").__doc__ if self.runnable else None
        except Exception:  # noqa: BLE001
            doc = None
        doc = doc or importlib.import_module(f"tasks.{self.name}").__doc__ or ""
        return doc.strip().split("\n\n")[0].replace("\n", " ")

    @property
    def long_description(self) -> str:
        mod = importlib.import_module(f"tasks.{self.name}.task")
        return (mod.__doc__ or "").strip()

    @property
    def baselines(self) -> list[dict]:
        own = getattr(self.task, "baselines", None)
        return list(own) if own else list(DEFAULT_BASELINES.get(self.name, []))

    def programs(self):
        return importlib.import_module(f"tasks.{self.name}.programs")

    def seeds(self) -> dict:
        return {n: make() for n, make in self.programs().SEEDS.items()}

    def families(self) -> dict:
        return dict(getattr(self.programs(), "FAMILIES", {}))

    def seed_genomes(self) -> list[dict]:
        """Seed programs as genomes: IR dict + recipe (family, defaults) where the seed has a family."""
        from cake_ir.io import to_dict
        fams = self.families()
        out = []
        for n, make in self.programs().SEEDS.items():
            k = make()
            if self.refusal(k):
                continue                   # a seed for another shape class (e.g. the other gate form)
            recipe = None
            if n in fams:
                recipe = {"family": n, "task": self.name, "params": dict(fams[n]["defaults"]), "steps": []}
            out.append({"name": n, "ir": to_dict(k), "recipe": recipe})
        return out

    @property
    def bench_shape(self) -> dict:
        t = self.task
        shapes = list(t.bench_shapes or t.shapes)
        if not self.shape_selector:
            return dict(shapes[0])
        return dict(select_shape(shapes, self.shape_selector, self.name))

    def for_shape(self, selector: Optional[str], timed_scope: Optional[str] = None) -> "TaskEntry":
        """This entry with the run's timed shape picked by `selector` (checked now: a bad selector is a
        ValueError naming the legal keys and values) and, if given, its timed scope ("run" | "class")."""
        if timed_scope not in (None, "run", "class"):
            raise ValueError(f"timed shapes {timed_scope!r}: use 'run' (the run's shape) or 'class' (every bench "
                             f"shape of its class)")
        e = replace(self, shape_selector=selector or None, timed_scope=timed_scope or self.timed_scope)
        e._task = self._task
        if selector:
            e.bench_shape  # noqa: B018 - validates the selector
        return e

    def shape_class(self, shape: dict) -> tuple:
        return tuple(shape.get(k) for k in getattr(self.task, "shape_class_keys", ()) or ())

    def test_shapes(self) -> list[dict]:
        """The correctness shapes of the run's shape class (all of them for a task without classes)."""
        cls = self.shape_class(self.bench_shape)
        same = [dict(s) for s in self.task.shapes if self.shape_class(s) == cls]
        return same or [dict(s) for s in self.task.shapes]     # a class without test shapes: test them all

    def timed_shapes(self) -> list[dict]:
        """The shapes a candidate is timed on: the run's own shape, and with timed_scope "class" the other
        bench shapes of its class after it."""
        b = self.bench_shape
        if self.timed_scope == "run":
            return [b]
        cls = self.shape_class(b)
        return [b] + [dict(s) for s in (self.task.bench_shapes or []) if self.shape_class(s) == cls and dict(s) != b]

    def refusal(self, kernel) -> Optional[str]:
        """Why a kernel's scalar facts refuse one of the run's test or timed shapes (None if none does)."""
        from gpu_backend.runner import scalar_decls
        decls = scalar_decls(kernel)
        for shape in self.test_shapes() + self.timed_shapes():
            scal = self.task.scalars(shape)
            for n, d in decls.items():
                why = d.violation(scal.get(n))
                if why:
                    return f"scalar {n} = {why} at {shape}"
        return None

    def shape_key(self, shape: Optional[dict] = None) -> str:
        shape = shape if shape is not None else self.bench_shape
        return "_".join(f"{k}{v}" for k, v in shape.items())

    def library_dir(self, root: Optional[Path] = None) -> Path:
        return (Path(root) / self.name / "library") if root else self.path / "library"

    def info(self) -> dict:
        if not self.runnable:
            return {"name": self.name, "runnable": False, "problem": self.problem}
        t = self.task
        return {"name": self.name, "runnable": True, "description": self.description,
                "shapes": list(t.shapes), "bench_shapes": list(t.bench_shapes),
                "tolerance": {"rel_rmse": t.tolerance.rel_rmse, "max_abs": t.tolerance.max_abs},
                "inputs": [s.name for s in t.inputs(self.bench_shape)],
                "outputs": [s.name for s in t.outputs(self.bench_shape)],
                "baselines": [b["name"] for b in self.baselines],
                "seeds": list(self.programs().SEEDS), "families": list(self.families())}


def discover() -> dict[str, TaskEntry]:
    import tasks
    out = {}
    for info in sorted(pkgutil.iter_modules(tasks.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        path = ROOT / info.name
        if not (path / "task.py").exists():
            out[info.name] = TaskEntry(info.name, path, False, "no task.py (reference, inputs, shapes) yet")
        elif not (path / "programs.py").exists():
            out[info.name] = TaskEntry(info.name, path, False, "no programs.py (seed programs) yet")
        else:
            out[info.name] = TaskEntry(info.name, path, True)
    return out


def select_shape(shapes: list[dict], selector: str, task: str = "?") -> dict:
    """The shape a selector picks: an index ("3") or the first shape matching KEY=VALUE[,KEY=VALUE...]."""
    sel = selector.strip()
    if sel.lstrip("-").isdigit():
        i = int(sel)
        if not -len(shapes) <= i < len(shapes):
            raise ValueError(f"task {task}: shape index {i} out of range (it has {len(shapes)} bench shapes)")
        return shapes[i]
    want = {}
    for part in filter(None, (x.strip() for x in sel.split(","))):
        k, eq, v = part.partition("=")
        if not eq or not v.strip().lstrip("-").isdigit():
            raise ValueError(f"task {task}: shape selector part {part!r} is not KEY=INTEGER")
        want[k.strip()] = int(v)
    keys = sorted({k for s in shapes for k in s})
    bad = sorted(set(want) - set(keys))
    if bad:
        raise ValueError(f"task {task}: unknown shape keys {bad} (legal: {keys})")
    for s in shapes:
        if all(s.get(k) == v for k, v in want.items()):
            return s
    legal = {k: sorted({s.get(k) for s in shapes}) for k in want}
    raise ValueError(f"task {task}: no bench shape has {want} (values there: {legal})")


def get(name: str) -> TaskEntry:
    entries = discover()
    if name not in entries:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(entries) or 'none'}")
    e = entries[name]
    if not e.runnable:
        raise KeyError(f"task {name!r} is not runnable yet: {e.problem}")
    return e


def names(runnable_only: bool = True) -> list[str]:
    return [n for n, e in discover().items() if e.runnable or not runnable_only]
