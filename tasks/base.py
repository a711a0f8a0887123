"""The Task protocol the evaluator uses (gpu_backend.evaluate). The agent harness extends it.

A task names its kernel interface and how to test it honestly:

- `shapes`: correctness shapes (dicts of the kernel's integer scalars, e.g. {"M": 640, "N": 768,
  "K": 320}); `bench_shapes`: shapes timed by the profile stage.
- `inputs(shape)` / `outputs(shape)`: the tensors (name, concrete shape, CAKE dtype). A candidate's
  tensor params must carry these names; scalars come from `scalars(shape)`.
- `make_inputs(shape, seed, rng=None)`: fresh input values for one run (numpy; values already
  representable in the tensor's dtype, e.g. rounded to bf16), drawn from the task's distribution and
  including its edge values; never all zeros. Same seed, same values.
- `reference(inputs, shape)`: float64 outputs computed independently of any candidate (numpy on the
  host; never on the device the candidate runs on).
- `tolerance`: relative RMSE bound and an optional max-abs bound. NaN/Inf never pass.
- `flops(shape)`, `bytes(shape)`: for throughput and roofline fractions.

Optional (gpu_backend.evaluate uses them when present):
- `check(outputs, refs, inputs, shape) -> [gpu_backend.checks.OutputCheck]`: the task's own
  correctness test on host output values (after the generic unwritten/NaN checks), for outputs an
  element-wise tolerance cannot judge (kNN recall@k with ties, k-means inertia).
- `workspace(shape) -> [TensorSpec]`: scratch tensors passed to the kernel, zero-filled once by the
  evaluator; the kernel must leave them zeroed (checked after each test launch: `workspace_dirty`).
- `shape_class_keys`: scalars that split the shapes into classes (the agent tests a run's candidates
  on the class of its timed shape; tasks.registry.TaskEntry.test_shapes).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Tolerance:
    rel_rmse: float
    max_abs: Optional[float] = None


@runtime_checkable
class Task(Protocol):
    name: str
    shapes: list[dict]
    bench_shapes: list[dict]
    tolerance: Tolerance

    def inputs(self, shape: dict) -> list[TensorSpec]: ...

    def outputs(self, shape: dict) -> list[TensorSpec]: ...

    def make_inputs(self, shape: dict, seed: int, rng: Optional[np.random.Generator] = None) -> dict[str, np.ndarray]: ...

    def reference(self, inputs: dict[str, np.ndarray], shape: dict) -> dict[str, np.ndarray]: ...

    def scalars(self, shape: dict) -> dict[str, Any]: ...

    def flops(self, shape: dict) -> float: ...

    def bytes(self, shape: dict) -> float: ...


class BaseTask:
    """Defaults shared by the built-in tasks."""

    name = "?"
    shapes: list[dict] = []
    bench_shapes: list[dict] = []
    tolerance = Tolerance(1e-2)
    # Scalars that split the shapes into classes a kernel may specialise on (kda: the gate form). A run
    # times one bench shape and tests a candidate on the test shapes of that shape's class only, so a
    # kernel whose facts fix such a scalar (SAFE = 1) competes for the shapes it serves.
    shape_class_keys: tuple = ()
    # Seconds an evaluation job of this task typically needs at most (inputs and references of large
    # bench shapes on a worker's first job); `agent.run` uses it when --deadline is not given and it is
    # above the default.
    job_seconds: float = 0.0

    def scalars(self, shape: dict) -> dict[str, Any]:
        return {k: int(v) for k, v in shape.items()}

    @staticmethod
    def rng_for(seed: int, rng: Optional[np.random.Generator]) -> np.random.Generator:
        return rng if rng is not None else np.random.default_rng(seed)

    def seed_programs(self) -> dict:
        """name -> Kernel for this task's seed programs (tasks/<name>/programs.py SEEDS)."""
        mod = importlib.import_module(f"tasks.{self.name}.programs")
        return {n: make() for n, make in mod.SEEDS.items()}


TASK_NAMES = ("gemm", "softmax", "knn", "knn_ip", "kmeans", "kda", "kda_decode")


def get_task(name: str) -> Task:
    """The task object for a name (`tasks/<name>/task.py` defines TASK)."""
    if name not in TASK_NAMES:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASK_NAMES)}")
    return importlib.import_module(f"tasks.{name}.task").TASK


def signature_defaults(fn) -> dict:
    """A seed generator's default parameters, read from its signature (one source of truth)."""
    import inspect
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}
