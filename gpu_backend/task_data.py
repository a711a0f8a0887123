"""Inputs and float64 references of task shapes, per seed: kept in memory (LRU) and, when a cache
folder is set, on disk.

An evaluation worker asks for the same data many times: every candidate of a run is timed on the
run's bench inputs, and the agent's per-candidate test draws its inputs from a small fixed pool per
test shape. Building them is the slow part of an evaluation (a KDA bench shape: about 10 s of numpy
for the inputs and seconds of float64 GPU recurrence for the reference), so:

- in memory: one LRU per worker process, bounded by `max_bytes` (CAKE_BENCH_CACHE_GB, default 8);
- on disk: `CAKE_REF_CACHE_DIR` (agent.run sets CAKE_HOME/refs), one folder per (task, task-code
  version, shape, seed) holding the inputs and the reference as .npy files, written atomically and
  memory-mapped when read. The version is a hash of the task package's source files, so a change to
  the task's generator or reference starts a fresh folder. CAKE_REF_CACHE_GB (default 20) bounds the
  folder; the least recently used entries go first.

The reference is computed only when first asked for (the timing itself does not need it). Device
bits of each input are converted once per item (bf16 rounding of a large tensor costs seconds).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

import numpy as np


@lru_cache(maxsize=64)
def _source_hash(module_file: str) -> str:
    """A hash of every .py file beside `module_file` (the task's package)."""
    h = hashlib.sha256()
    folder = Path(module_file).parent
    for f in sorted(folder.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def task_version(task) -> str:
    """What decides a task's inputs and reference: its package's source (or 'unversioned')."""
    import sys
    mod = sys.modules.get(type(task).__module__)
    path = getattr(mod, "__file__", None)
    return _source_hash(path) if path else "unversioned"


def shape_key(shape: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(shape.items()))


class Item:
    """One (task, shape, seed): inputs (host values), the reference on demand, device bits on demand."""

    def __init__(self, inputs: dict, refs_fn: Callable[[], dict]):
        self.inputs = inputs
        self._refs_fn = refs_fn
        self._refs: Optional[dict] = None
        self._bits: dict = {}

    def refs(self) -> dict:
        if self._refs is None:
            self._refs = self._refs_fn()
        return self._refs

    def bits(self, name: str, dtype: str) -> np.ndarray:
        from .memory import to_bits
        key = (name, dtype)
        if key not in self._bits:
            self._bits[key] = to_bits(self.inputs[name], dtype)
        return self._bits[key]

    def nbytes(self) -> int:
        return sum(_nbytes(d) for d in (self.inputs, self._refs or {}, self._bits))


def _nbytes(arrays: dict) -> int:
    return sum(_resident(a) for a in arrays.values())


def _resident(a) -> int:
    """Bytes an array holds in this process (a memory-mapped file counts as nothing)."""
    if isinstance(a, np.memmap) or isinstance(getattr(a, "base", None), np.memmap):
        return 0
    return int(getattr(a, "nbytes", 0))


class DiskStore:
    """Task data as .npy files under `root`/<task>/<version>/<shape>/s<seed>/{inputs,refs}/."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = Path(root), int(max_bytes)

    def folder(self, task, shape: dict, seed: int) -> Path:
        return self.root / task.name / task_version(task) / shape_key(shape) / f"s{int(seed)}"

    def load(self, folder: Path, part: str) -> Optional[dict]:
        d = folder / part
        if not d.is_dir():
            return None
        try:
            out = {f.stem: np.load(f, mmap_mode="r") for f in d.glob("*.npy")}
            os.utime(folder)                       # least-recently-used order for trimming
            return out
        except (OSError, ValueError):
            return None                            # a damaged entry is rebuilt

    def save(self, folder: Path, part: str, arrays: dict) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / part).is_dir():
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{part}-", dir=folder))
        try:
            for name, a in arrays.items():
                np.save(tmp / f"{name}.npy", np.asarray(a))
            os.replace(tmp, folder / part)         # atomic; a concurrent writer's copy is as good
        except OSError:
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.trim()

    def trim(self) -> None:
        """Remove the least recently used entries while the folder is over its bound."""
        entries = []
        for d in self.root.glob("*/*/*/s*"):
            size = sum(f.stat().st_size for f in d.rglob("*.npy"))
            entries.append((d.stat().st_mtime, size, d))
        total = sum(e[1] for e in entries)
        for _, size, d in sorted(entries):
            if total <= self.max_bytes:
                break
            shutil.rmtree(d, ignore_errors=True)
            total -= size


class TaskData:
    """The per-process store: `get(task, shape, seed) -> (inputs, refs())`, `item(...) -> Item`."""

    def __init__(self, max_bytes: int, disk: Optional[DiskStore] = None):
        self.max_bytes = max_bytes
        self.disk = disk
        self._items: "OrderedDict[tuple, Item]" = OrderedDict()
        self.built = 0             # items made from scratch (neither in memory nor on disk)

    def item(self, task, shape: dict, seed: int) -> Item:
        key = (task.name, tuple(sorted(shape.items())), int(seed))
        it = self._items.get(key)
        if it is None:
            it = self._load_or_make(task, shape, int(seed), key)
            self._items[key] = it
        self._items.move_to_end(key)
        self._trim(keep=key)
        return it

    def get(self, task, shape: dict, seed: int):
        """(inputs, refs()) for (task, shape, seed); the reference is computed on first use."""
        it = self.item(task, shape, seed)
        return it.inputs, it.refs

    def _load_or_make(self, task, shape: dict, seed: int, key: tuple) -> Item:
        folder = self.disk.folder(task, shape, seed) if self.disk else None
        inputs = self.disk.load(folder, "inputs") if folder else None
        if inputs is None:
            self.built += 1
            inputs = task.make_inputs(shape, seed)
            if folder:
                self.disk.save(folder, "inputs", inputs)

        def refs() -> dict:
            got = self.disk.load(folder, "refs") if folder else None
            if got is None:
                got = task.reference(inputs, shape)
                if folder:
                    self.disk.save(folder, "refs", got)
            self._trim(keep=key, plus=_nbytes(got))    # the new reference counts towards the bound
            return got
        return Item(inputs, refs)

    def nbytes(self) -> int:
        return sum(it.nbytes() for it in self._items.values())

    def _trim(self, keep: tuple, plus: int = 0) -> None:
        while len(self._items) > 1 and self.nbytes() + plus > self.max_bytes:
            old = next(k for k in self._items if k != keep)
            del self._items[old]


def from_environment() -> TaskData:
    """The worker's store: CAKE_BENCH_CACHE_GB in memory, CAKE_REF_CACHE_DIR (+ CAKE_REF_CACHE_GB) on disk."""
    mem = int(float(os.environ.get("CAKE_BENCH_CACHE_GB", "8")) * 2**30)
    root = os.environ.get("CAKE_REF_CACHE_DIR")
    disk = DiskStore(Path(root), int(float(os.environ.get("CAKE_REF_CACHE_GB", "20")) * 2**30)) if root else None
    return TaskData(mem, disk)


def pool_seed(task_name: str, shape: dict, slot: int) -> int:
    """The seed of input set `slot` of a test shape's fixed pool (the same on every machine)."""
    import zlib
    return zlib.crc32(f"{task_name}:{shape_key(shape)}:pool{int(slot)}".encode()) & 0x7FFFFFFF
