"""Promote recurring statement subtrees of successful candidates into IR primitives (primitives/<name>.py).

Mining, over candidates with status "ok" (deduplicated by IR hash):

1. every window of consecutive sibling statements (a role body, prologue, loop body or if branch;
   nested statements included) with at least MIN_STATEMENTS statements in all is an occurrence;
2. its *skeleton* keeps the structure (keys, list lengths, `op` and `kind`, which leaves are bools or
   nulls) and blanks every other leaf; occurrences with one skeleton are one pattern;
3. support = distinct candidates (and tasks, runs); patterns with support >= cfg.min_candidates are
   kept when *closed* (no larger pattern contains all their occurrences with the same support);
4. leaves equal in every occurrence stay literal, the others become parameters (leaves that vary
   together, i.e. have the same value in every occurrence, share one parameter; author ids are always
   parameters so the primitive can be used twice in a kernel).

Each proposal is a primitive module, a fixture with the observed occurrences and kernels, and a test:
expanding with each occurrence's parameters reproduces the observed statements exactly, and a
recorded kernel with the occurrence re-expanded still verifies.
"""
from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from primitives import NESTED   # statement fields holding statement lists

from .base import Proposal, PromoteConfig, fingerprint

MIN_STATEMENTS = 2           # a primitive composes at least two statements
MAX_WINDOW = 12              # longest run of sibling statements considered
MAX_PROPOSALS = 5            # per promotion pass, best first
MAX_FIXTURE_OCCURRENCES = 12
MAX_FIXTURE_KERNELS = 3
STRUCTURAL = ("op", "kind")  # leaves that define what a statement is, never parameters
ROOT = Path(__file__).resolve().parents[2]

# Ops that say what a primitive does (its name is built from them first); the rest are synchronisation.
HEAVY = ("wgmma", "mma_sync", "copy", "ldg", "stg", "lds", "sts", "ldmatrix", "reduce", "scan", "map", "fill")


# ------------------------------------------------------------------------------ evidence
def successful_candidates(store, task: Optional[str]) -> list[dict]:
    """Candidates with status ok, one per IR hash: {hash, ir, task, runs}."""
    from sqlmodel import select

    from ..models import CandidateRow, RunRow, TaskRow

    with store.session() as s:
        q = (select(CandidateRow, TaskRow.name).join(RunRow, CandidateRow.run_id == RunRow.id)
             .join(TaskRow, RunRow.task_id == TaskRow.id).where(CandidateRow.status == "ok")
             .order_by(CandidateRow.id))
        if task:
            q = q.where(TaskRow.name == task)
        rows = list(s.exec(q))
    out: dict[str, dict] = {}
    for c, tname in rows:
        if not isinstance(c.ir, dict):
            continue
        d = out.setdefault(c.hash, {"hash": c.hash, "ir": c.ir, "task": tname, "runs": set()})
        d["runs"].add(c.run_id)
    return list(out.values())


def statement_lists(ir: dict):
    """(JSON pointer of the list, list) for every statement list of a kernel (primitives.statement_lists;
    a Program's kernels are not mined)."""
    from primitives import statement_lists as lists
    return [] if isinstance(ir.get("kernels"), list) else lists(ir)


def n_statements(sts: list) -> int:
    n = 0
    for st in sts:
        n += 1
        if isinstance(st, dict):
            n += sum(n_statements(st[k]) for k in NESTED if isinstance(st.get(k), list))
    return n


def skeleton(node: Any, key: Optional[str] = None) -> Any:
    if isinstance(node, dict):
        return {k: skeleton(v, k) for k, v in sorted(node.items())}
    if isinstance(node, list):
        return [skeleton(v) for v in node]
    if key in STRUCTURAL:
        return node
    if isinstance(node, bool):
        return "<bool>"
    if node is None:
        return "<null>"
    return "<leaf>"


def leaves(node: Any, path: tuple = (), key: Optional[str] = None, op: Optional[str] = None):
    """(path, value, op of the innermost statement) of every parameterisable leaf, in sorted-key order."""
    if isinstance(node, dict):
        op = _label(node) if isinstance(node.get("op"), str) else op
        for k in sorted(node):
            yield from leaves(node[k], path + (k,), k, op)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,), None, op)
    elif key not in STRUCTURAL and node is not None:
        yield path, node, op


@dataclass
class Occurrence:
    cand: str
    task: str
    runs: frozenset
    list_path: str
    start: int
    end: int
    statements: list

    def contains(self, other: "Occurrence") -> bool:
        if self.cand != other.cand or (self.list_path, self.start, self.end) == (other.list_path, other.start, other.end):
            return False
        if other.list_path == self.list_path:
            return self.start <= other.start and other.end <= self.end
        for i in range(self.start, self.end):
            if other.list_path.startswith(f"{self.list_path}/{i}/"):
                return True
        return False


@dataclass
class Pattern:
    key: str
    size: int
    occurrences: list = field(default_factory=list)

    @cached_property
    def cands(self) -> frozenset:
        return frozenset(o.cand for o in self.occurrences)

    @property
    def tasks(self) -> set:
        return {o.task for o in self.occurrences}

    @property
    def runs(self) -> set:
        return set().union(*(o.runs for o in self.occurrences))


def mine(cands: list[dict]) -> dict[str, Pattern]:
    pats: dict[str, Pattern] = {}
    for c in cands:
        for lpath, lst in statement_lists(c["ir"]):
            for i in range(len(lst)):
                for j in range(i + 1, min(len(lst), i + MAX_WINDOW) + 1):
                    win = lst[i:j]
                    size = n_statements(win)
                    if size < MIN_STATEMENTS:
                        continue
                    key = json.dumps(skeleton(win), sort_keys=True, separators=(",", ":"))
                    p = pats.setdefault(key, Pattern(key, size))
                    p.occurrences.append(Occurrence(c["hash"], c["task"], frozenset(c["runs"]), lpath, i, j, win))
    return pats


def select_patterns(pats: dict[str, Pattern], min_candidates: int) -> list[Pattern]:
    """Closed patterns with enough support, best first (tasks, candidates, size), none of them lying
    wholly inside an earlier pick."""
    keep = [p for p in pats.values() if len(p.cands) >= max(1, min_candidates)]

    by_cand: dict[str, dict[str, list]] = {}

    def inside(small: Pattern, big: Pattern) -> bool:
        idx = by_cand.get(big.key)
        if idx is None:
            idx = by_cand[big.key] = {}
            for b in big.occurrences:
                idx.setdefault(b.cand, []).append(b)
        return all(any(b.contains(o) for b in idx.get(o.cand, ())) for o in small.occurrences)

    closed = [p for p in keep
              if not any(q.size > p.size and q.cands == p.cands and inside(p, q) for q in keep if q is not p)]
    closed.sort(key=lambda p: (-len(p.tasks), -len(p.cands), -p.size, p.key))
    picked: list[Pattern] = []
    for p in closed:
        if any(inside(p, q) for q in picked):
            continue
        picked.append(p)
        if len(picked) >= MAX_PROPOSALS:
            break
    return picked


# ------------------------------------------------------------------------------ parametrise
def _ptype(values: list) -> Optional[str]:
    kinds = {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float)
             else "str" if isinstance(v, str) else "?" for v in values}
    if kinds == {"bool"}:
        return "bool"
    if kinds <= {"int"}:
        return "int"
    if kinds <= {"int", "float"}:
        return "float"
    if kinds == {"str"}:
        return "str"
    if kinds <= {"int", "str"}:
        return "expr"
    return None


def _pname(path: tuple, op: Optional[str]) -> str:
    """`<op>_<leaf tail>`, e.g. wgmma_acc_buf, stg_dst_offset_0, map_expr (path[0] is the window index)."""
    tail: list[str] = []
    for x in reversed(path[1:]):
        if x in NESTED:
            tail = tail[1:]          # drop the statement index inside the nested body
            break
        tail.insert(0, str(x))
    name = re.sub(r"\W", "_", "_".join([op or "st", *tail[-3:]])).strip("_") or "p"
    return name if not keyword.iskeyword(name) else name + "_"


def parametrise(p: Pattern) -> tuple[Any, dict, list[dict]]:
    """(template, PARAMS types, per-occurrence parameter values) or raises ValueError."""
    occs = p.occurrences
    per_occ = [list(leaves(o.statements)) for o in occs]
    n = len(per_occ[0])
    if any(len(x) != n for x in per_occ):
        raise ValueError("occurrences disagree on their leaves")
    template = json.loads(json.dumps(occs[0].statements))
    types: dict[str, str] = {}
    by_vector: dict[str, str] = {}
    values: list[dict] = [{} for _ in occs]
    used: set[str] = set()
    for k in range(n):
        path, _, op = per_occ[0][k]
        vec = [x[k][1] for x in per_occ]
        is_id = path[-1] == "id"
        if not is_id and all(v == vec[0] and type(v) is type(vec[0]) for v in vec):
            continue
        vkey = json.dumps([[type(v).__name__, v] for v in vec])
        name = by_vector.get(vkey) if not is_id else None
        if name is None:
            t = _ptype(vec)
            if t is None:
                raise ValueError(f"leaf {path} mixes types")
            base = _pname(path, op)
            name, i = base, 2
            while name in used:
                name, i = f"{base}_{i}", i + 1
            used.add(name)
            types[name] = t
            if not is_id:
                by_vector[vkey] = name
            for vals, v in zip(values, vec):
                vals[name] = v
        _set(template, path, {"$param": name})
    return template, types, values


def _set(node: Any, path: tuple, value: Any) -> None:
    for x in path[:-1]:
        node = node[x]
    node[path[-1]] = value


# ------------------------------------------------------------------------------ naming and files
def _label(st: dict) -> str:
    """A statement's op kind as a word: copies by their kind, reductions with theirs, for -> loop."""
    op = str(st.get("op"))
    if op == "copy":
        return str(st.get("kind") or "copy")
    if op in ("reduce", "scan"):
        return f"{op}_{st.get('kind')}"
    return "loop" if op == "for" else op


def _tokens(sts: list) -> list[tuple[str, bool]]:
    out = []
    for st in sts:
        if not isinstance(st, dict):
            continue
        out.append((_label(st), st.get("op") in HEAVY))
        for k in NESTED:
            if isinstance(st.get(k), list):
                out.extend(_tokens(st[k]))
    return out


def primitive_name(sts: list) -> str:
    """Descriptive name from the op kinds: up to three data/compute ops in program order, framed by the
    first and last synchronisation ops when fewer than two such ops exist."""
    toks = _tokens(sts)
    seen: list[str] = []
    for t, _ in toks:
        if t not in seen:
            seen.append(t)
    heavy = [t for t in seen if any(t == x and h for x, h in toks)][:3]
    if len(heavy) >= 2:
        parts = heavy
    else:
        light = [t for t in seen if t not in heavy and t != "loop"]
        parts = ([light[0]] if light else []) + heavy + ([light[-1]] if len(light) > 1 else [])
    if toks and toks[0][0] == "loop" and len(sts) == 1:
        parts = ["loop", *parts]
    name = re.sub(r"\W", "_", "_".join(parts or ["seq"]))
    return name if name[0].isalpha() else f"p_{name}"


def _module_text(name: str, types: dict, template: Any, p: Pattern, title: str, examples: list) -> str:
    tpl = "[\n" + ",\n".join(json.dumps(st, sort_keys=True) for st in template) + "\n]"
    ex = "[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in examples) + "\n]"
    return f'''"""{title}.

Promoted by knowledge/promote/primitive.py from {len(p.cands)} successful candidates ({len(p.occurrences)}
occurrences) on task(s) {", ".join(sorted(p.tasks))}. `expand(**params)` returns the IR statements;
EXAMPLES are the parameters of the observed occurrences.
"""
import json

from primitives import instantiate

NAME = {name!r}
PARAMS = {json.dumps(types, sort_keys=True)}
TEMPLATE = json.loads(r"""
{tpl}
""")
EXAMPLES = json.loads(r"""
{ex}
""")


def expand(**params) -> list:
    return instantiate(TEMPLATE, PARAMS, params)
'''


def _test_text(name: str) -> str:
    return f'''"""Generated by knowledge/promote/primitive.py for the primitive {name!r}: expanding with each observed
occurrence's parameters reproduces the recorded statements, and recorded kernels still verify with the
occurrence re-expanded."""
import copy
import json
from pathlib import Path

from primitives import load_primitives

DATA = json.loads((Path(__file__).parent / "fixtures" / "primitives" / "{name}.json").read_text())


def _list_at(ir, pointer):
    node = ir
    for part in pointer.strip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def test_registered_with_its_parameters():
    mod = load_primitives()[{name!r}]
    assert mod.PARAMS == DATA["params"]
    assert mod.EXAMPLES == [occ["params"] for occ in DATA["occurrences"]]


def test_expansion_reproduces_every_occurrence():
    mod = load_primitives()[{name!r}]
    assert DATA["occurrences"]
    for occ in DATA["occurrences"]:
        assert mod.expand(**occ["params"]) == occ["statements"], occ["candidate"]


def test_kernels_using_the_primitive_verify():
    from cake_ir.io import load
    from cake_ir.verifier import verify

    mod = load_primitives()[{name!r}]
    checked = 0
    for occ in DATA["occurrences"]:
        ir = DATA["kernels"].get(occ["candidate"])
        if ir is None:
            continue
        ir = copy.deepcopy(ir)
        lst = _list_at(ir, occ["list_path"])
        assert lst[occ["start"]:occ["end"]] == occ["statements"]
        lst[occ["start"]:occ["end"]] = mod.expand(**occ["params"])
        kernel, diags = load(ir)
        assert kernel is not None, [d.message for d in diags]
        res = verify(kernel)
        assert res.ok, [(d.code, d.node, d.message) for d in res.diagnostics if d.severity == "error"]
        checked += 1
    assert checked > 0
'''


def _existing_names() -> set:
    d = ROOT / "primitives"
    return {f.stem for f in d.glob("*.py")} if d.is_dir() else set()


def build_proposal(p: Pattern, taken: set, kernels: dict) -> Optional[Proposal]:
    try:
        template, types, values = parametrise(p)
    except ValueError:
        return None
    fp = fingerprint("primitive", p.key)
    name = primitive_name(p.occurrences[0].statements)
    if name in taken:
        name = f"{name}_{fp[:6]}"
    taken.add(name)
    ops = [t for t, _ in _tokens(p.occurrences[0].statements)]
    title = f"IR primitive {name}: {p.size} statements ({' -> '.join(ops)})"
    # Fixture: distinct parameter sets (each must reproduce), kernels of the first few.
    occ_rows, seen = [], set()
    for o, vals in zip(p.occurrences, values):
        k = json.dumps(vals, sort_keys=True)
        if k in seen:
            continue
        seen.add(k)
        occ_rows.append({"candidate": o.cand, "task": o.task, "list_path": o.list_path, "start": o.start,
                         "end": o.end, "params": vals, "statements": o.statements})
        if len(occ_rows) >= MAX_FIXTURE_OCCURRENCES:
            break
    fixture_kernels = {}
    for row in occ_rows:
        if len(fixture_kernels) >= MAX_FIXTURE_KERNELS:
            break
        fixture_kernels.setdefault(row["candidate"], kernels[row["candidate"]])
    fixture = {"name": name, "params": types, "occurrences": occ_rows, "kernels": fixture_kernels}
    evidence = {"name": name, "statements": p.size, "ops": ops, "params": types,
                "support": {"candidates": len(p.cands), "occurrences": len(p.occurrences),
                            "tasks": sorted(p.tasks), "runs": sorted(p.runs)},
                "candidates": sorted(p.cands)[:50],
                "examples": [{"candidate": r["candidate"], "task": r["task"], "node": r["list_path"],
                              "start": r["start"], "end": r["end"], "params": r["params"]} for r in occ_rows[:5]]}
    examples = [r["params"] for r in occ_rows]
    files = {f"primitives/{name}.py": _module_text(name, types, template, p, title, examples),
             f"tests/fixtures/primitives/{name}.json": json.dumps(fixture, indent=1, sort_keys=True) + "\n",
             f"tests/test_primitive_{name}.py": _test_text(name)}
    return Proposal(kind="primitive", title=title, fingerprint=fp, files=files, evidence=evidence)


def propose(store, cfg: PromoteConfig) -> list[Proposal]:
    cands = successful_candidates(store, cfg.task)
    if len(cands) < max(1, cfg.min_candidates):
        return []
    kernels = {c["hash"]: c["ir"] for c in cands}
    taken = _existing_names()
    out = []
    for p in select_patterns(mine(cands), cfg.min_candidates):
        prop = build_proposal(p, taken, kernels)
        if prop is not None:
            out.append(prop)
    return out
