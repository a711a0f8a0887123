"""Tactic plumbing: the `Tactic` base class, genomes, IR-dict helpers and plugin discovery.

A *genome* is what a tactic transforms, as plain JSON:

    {"ir": {...Kernel document...},
     "recipe": {"family": "gemm_wgmma_sm90a", "task": "gemm", "params": {...}, "steps": [...]} | None,
     "diagnostics": [...]}            # optional: the verifier's diagnostics of this IR (verifier_fix)

`ir` is the program. `recipe` exists when the program was built from a parametrised seed family
(tasks/<task>/programs.py FAMILIES): its generator parameters plus the IR tactics applied since, in
order (`steps`). IR tactics work on `ir` alone; family tactics regenerate `ir` from the family with
other parameters and replay `steps` (a step whose precondition no longer holds is dropped).

Tactics never verify: the agent's verify node judges every result.
"""
from __future__ import annotations

import copy
import importlib
import json
import pkgutil
from dataclasses import dataclass
from typing import Any, Iterator, Optional

SUPPORT_MODULES = {"base", "jsonpatch"}


class TacticError(Exception):
    """A tactic could not be applied with these parameters (a precondition failed)."""


@dataclass
class Tactic:
    """A named, parametrised IR-to-IR transformation.

    Subclasses implement `precondition` (None when applicable, else the reason), `choices` (the legal
    parameter sets for this genome, excluding no-ops) and `transform` (the new IR dict)."""

    name: str
    description: str
    version: str = "1"
    kind: str = "ir"                     # "ir" | "family" | "repair"
    keywords: tuple[str, ...] = ()       # for retrieval (failure codes, cost-model bounds, words)
    step_key: tuple[str, ...] = ()       # params that identify a step for collapsing repeats
    params_doc: str = ""                 # what the parameters are and their legal values (library, prompts)
    archs: tuple[str, ...] = ()          # architectures it can apply to; () = any

    # --- to implement
    def precondition(self, g: dict) -> Optional[str]:
        return None

    def choices(self, g: dict) -> list[dict]:
        return []

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        raise NotImplementedError

    # --- shared
    def applicable(self, g: dict) -> Optional[str]:
        if self.kind != "family" and "kernels" in (g.get("ir") or {}):
            # IR tactics rewrite one kernel document; a Program is searched through its family's
            # parameters (tactics/family.py)
            return "a Program (several kernels): only family tactics apply"
        try:
            why = self.precondition(g)
        except Exception as e:  # noqa: BLE001 - a broken precondition is "not applicable"
            return f"precondition raised {type(e).__name__}: {e}"
        if why:
            return why
        return None if self.choices(g) else "no parameter choice changes this program"

    def apply(self, g: dict, params: dict) -> dict:
        """A new genome (the input is not modified); raises TacticError."""
        why = self.applicable(g) if "kernels" in (g.get("ir") or {}) else self.precondition(g)
        if why:
            raise TacticError(f"{self.name}: {why}")
        ir = self.transform(copy.deepcopy(g["ir"]), dict(params), g)
        if ir == g["ir"]:
            raise TacticError(f"{self.name}{params}: no change")
        return {"ir": ir, "recipe": add_step(g.get("recipe"), self, params)}

    def card(self) -> dict:
        """What retrieval and prompts show."""
        return {"name": self.name, "version": self.version, "kind": self.kind, "description": self.description,
                "keywords": list(self.keywords), "params": self.params_doc, "archs": list(self.archs)}

    def supports(self, arch: Optional[str]) -> bool:
        """Whether the tactic can apply to programs for `arch` (None: any)."""
        return not arch or not self.archs or arch in self.archs


def add_step(recipe: Optional[dict], tactic: Tactic, params: dict) -> Optional[dict]:
    """The recipe with this IR step appended; an earlier step of the same tactic on the same target
    (same `step_key` params) is replaced, so replays stay short."""
    if recipe is None:
        return None
    r = copy.deepcopy(recipe)

    def key(name, p):
        return (name, tuple(json.dumps(p.get(k), sort_keys=True) for k in tactic.step_key))

    k = key(tactic.name, params)
    r["steps"] = [s for s in r.get("steps", []) if key(s["tactic"], s["params"]) != k]
    r["steps"].append({"tactic": tactic.name, "params": dict(params)})
    return r


# ------------------------------------------------------------------------------ IR dict helpers
def walk(ir: dict) -> Iterator[tuple[str, dict, Optional[str]]]:
    """(JSON pointer, statement dict, role name) for every statement, depth first, program order."""
    def body(lst, path, role):
        for i, st in enumerate(lst or []):
            p = f"{path}/{i}"
            yield p, st, role
            if not isinstance(st, dict):
                continue
            for key in ("body", "then", "else"):
                if isinstance(st.get(key), list):
                    yield from body(st[key], f"{p}/{key}", role)
    yield from body(ir.get("prologue"), "/prologue", None)
    for ri, role in enumerate(ir.get("roles") or []):
        yield from body(role.get("body"), f"/roles/{ri}/body", role.get("name"))


def buffers(ir: dict) -> list[dict]:
    return list(ir.get("buffers") or [])


def buffer(ir: dict, name: str) -> Optional[dict]:
    return next((b for b in buffers(ir) if b.get("name") == name), None)


def param(ir: dict, name: str) -> Optional[dict]:
    return next((p for p in ir.get("params") or [] if p.get("name") == name), None)


def ops(ir: dict, *names: str) -> list[tuple[str, dict, Optional[str]]]:
    return [(p, st, r) for p, st, r in walk(ir) if st.get("op") in names]


def in_loop(ir: dict, path: str) -> bool:
    """Whether the statement at `path` sits inside a for loop."""
    parts = path.strip("/").split("/")
    cur: Any = ir
    for i, part in enumerate(parts[:-1]):
        cur = cur[int(part)] if isinstance(cur, list) else cur.get(part)
        if isinstance(cur, dict) and cur.get("op") == "for":
            return True
    return False


def find_loop(ir: dict, key: str) -> Optional[dict]:
    """A for loop by author id, else by JSON pointer."""
    for p, st, _ in walk(ir):
        if st.get("op") == "for" and (st.get("id") == key or p == key):
            return st
    return None


def const_int(v) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


# ------------------------------------------------------------------------------ discovery
_CACHE: dict[str, list[Tactic]] = {}


def load_tactics(package: str = "tactics", entry_points: bool = True) -> list[Tactic]:
    """Every tactic: modules of the `tactics` package that define TACTICS (a list), plus installed
    packages' `cake.tactics` entry points (a module with TACTICS, or a Tactic)."""
    if package in _CACHE:
        return _CACHE[package]
    found: list[Tactic] = []
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg or info.name.startswith("_") or info.name in SUPPORT_MODULES:
            continue
        mod = importlib.import_module(f"{package}.{info.name}")
        found.extend(t for t in getattr(mod, "TACTICS", []) if isinstance(t, Tactic))
    if entry_points:
        from importlib.metadata import entry_points as eps
        for ep in eps(group="cake.tactics"):
            try:
                obj = ep.load()
            except Exception:  # noqa: BLE001 - a broken plugin must not break the search
                continue
            items = obj if isinstance(obj, list) else getattr(obj, "TACTICS", [obj])
            found.extend(t for t in items if isinstance(t, Tactic))
    names = [t.name for t in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuntimeError(f"duplicate tactic names: {dup}")
    found.sort(key=lambda t: t.name)
    _CACHE[package] = found
    return found


def get_tactic(name: str) -> Tactic:
    for t in load_tactics():
        if t.name == name:
            return t
    raise KeyError(f"unknown tactic {name!r}")


# ------------------------------------------------------------------------------ retrieval
def index_text(t: Tactic) -> str:
    """Everything retrieval sees of a tactic (one string)."""
    parts = [f"{t.name}: {t.description}"]
    if t.params_doc:
        parts.append(f"Parameters: {t.params_doc}")
    if t.keywords:
        parts.append(f"Keywords: {', '.join(t.keywords)}.")
    return " ".join(parts)


def chunks(t: Tactic) -> list[str]:
    """The passages a tactic is matched by: the whole card plus each sentence/clause of its
    description. A tactic is scored by its best passage: one sentence that says what problem it
    solves matches a question about that problem better than the whole card, whose other sentences
    (mechanics, costs) dilute the embedding."""
    import re
    sents = [x.strip() for x in re.split(r"(?<=[.;:])\s+", t.description) if len(x.strip()) > 12]
    return [index_text(t)] + sents


_CODE = None


def _codes(text: str) -> set[str]:
    """Diagnostic codes (E-CPY-02, W-PERF-04) in a text: the embedding knows nothing about them, so
    an exact code match is scored lexically."""
    global _CODE
    import re
    _CODE = _CODE or re.compile(r"\b[EW]-[A-Z]+-\d+\b")
    return set(_CODE.findall(text.upper()))


CODE_BONUS = 0.25   # a shared diagnostic code outweighs most semantic differences (cosines are ~0.2-0.6)


def rank(query: str, tactics: Optional[list[Tactic]] = None, arch: Optional[str] = None) -> list[tuple[Tactic, float]]:
    """(tactic, score) best first: cosine similarity (all-MiniLM-L6-v2, knowledge.embedding) of the
    query to the tactic's best passage, plus CODE_BONUS per diagnostic code of the query among the
    tactic's keywords. Repair tactics are left out (they apply fixes, the proposers call them).

    The tactic cards are embedded here directly, not through the Chroma "tactics" collection: a dozen
    cards embed in a fraction of a second and the cache below keeps them for the process, while
    importing chromadb alone costs about two seconds (agent/tactics.py's CLI uses the collection)."""
    import numpy as np

    from knowledge.embedding import embed_cached
    pool = [t for t in (tactics if tactics is not None else load_tactics()) if t.kind != "repair" and t.supports(arch)]
    if not pool:
        return []
    texts, owner = [], []
    for i, t in enumerate(pool):
        for c in chunks(t):
            texts.append(c)
            owner.append(i)
    vecs = embed_cached(texts)
    q = embed_cached([query])[0]
    sims = vecs @ q
    owner_a = np.asarray(owner)
    qcodes = _codes(query)
    out = []
    for i, t in enumerate(pool):
        score = float(sims[owner_a == i].max())
        score += CODE_BONUS * len(qcodes & {k.upper() for k in t.keywords})
        out.append((t, score))
    out.sort(key=lambda x: (-x[1], x[0].name))
    return out


def retrieve(query: str, k: int = 5, tactics: Optional[list[Tactic]] = None, arch: Optional[str] = None) -> list[Tactic]:
    """The k tactics most relevant to `query` by meaning (see `rank`)."""
    return [t for t, _ in rank(query, tactics, arch)[:k]]
