"""The tactic library: rank tactics by meaning, show one tactic's recipe and statistics.

    python -m agent.tactics query "hide TMA latency" [--arch sm_90a] [--task gemm] [-k 5] [--json]
    python -m agent.tactics show stages [--task gemm] [--arch sm_90a] [--json]

`query` ranks tactics with the Chroma "tactics" collection (CAKE_HOME/chroma or CAKE_CHROMA_URL;
re-indexed when a tactic's card changed) and shows, per tactic, how often earlier runs applied it,
how often the result worked and its median gain (knowledge.tactic_stats, for --task / --arch when
given). --arch keeps only tactics that can apply to that architecture. `show` prints the recipe:
description, parameters, architectures, preconditions (the tactic's precondition checks), the
statistics and the source file. Heavy modules (chromadb, the embedding) load only for `query`.
"""
from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from typing import Optional


def _stats(task: Optional[str], arch: Optional[str]) -> dict:
    from knowledge.store import Store
    from knowledge.tactic_stats import stats
    store = Store()
    try:
        return stats(store, task=task, arch=arch)
    finally:
        store.close()


def _fmt_pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fmt_gain(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def query(text: str, arch: Optional[str], task: Optional[str], k: int) -> list[dict]:
    from knowledge.vectors import default_store
    from tactics.base import CODE_BONUS, _codes, load_tactics
    tactics = [t for t in load_tactics() if t.kind != "repair"]
    by_name = {t.name: t for t in tactics}
    ranked = default_store().rank_tactics(text, tactics)
    st = _stats(task, arch)
    qcodes = _codes(text)
    rows = []
    for name, sim in ranked:
        t = by_name.get(name)
        if t is None or not t.supports(arch):
            continue
        score = sim + CODE_BONUS * len(qcodes & {kw.upper() for kw in t.keywords})   # as tactics.base.rank
        s = st.get(name) or {}
        rows.append({"name": name, "similarity": round(sim, 4), "score": round(score, 4),
                     "applied": s.get("applied", 0), "success_rate": s.get("success_rate"),
                     "improve_rate": s.get("improve_rate"), "median_gain": s.get("median_gain"),
                     "description": t.description})
    rows.sort(key=lambda r: (-r["score"], r["name"]))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows[:k]


def _first_sentence(text: str, width: int = 90) -> str:
    s = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return s if len(s) <= width else s[: width - 3] + "..."


def _preconditions(t) -> list[str]:
    """The reasons a precondition can give (the string literals it returns): what must hold."""
    try:
        src = inspect.getsource(type(t).precondition)
    except (OSError, TypeError):
        return []
    return re.findall(r'return\s+f?"([^"]+)"', src) + re.findall(r'else\s+f?"([^"]+)"', src)


def show(name: str, task: Optional[str], arch: Optional[str]) -> dict:
    from tactics.base import get_tactic
    t = get_tactic(name)
    try:
        src = inspect.getsourcefile(type(t))
    except TypeError:
        src = None
    return {"name": t.name, "version": t.version, "kind": t.kind, "description": t.description,
            "params": t.params_doc, "archs": list(t.archs) or ["any"], "keywords": list(t.keywords),
            "preconditions (not applicable when)": _preconditions(t),
            "statistics": _stats(task, arch).get(t.name), "source": src}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.tactics", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("query", help="rank tactics by meaning")
    q.add_argument("text")
    q.add_argument("--arch")
    q.add_argument("--task")
    q.add_argument("-k", type=int, default=5)
    q.add_argument("--json", action="store_true")
    s = sub.add_parser("show", help="print a tactic's recipe and statistics")
    s.add_argument("name")
    s.add_argument("--arch")
    s.add_argument("--task")
    s.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = sys.stdout
    if a.cmd == "query":
        rows = query(a.text, a.arch, a.task, a.k)
        if a.json:
            out.write(json.dumps(rows, indent=2) + "\n")
            return 0
        scope = ", ".join(x for x in (a.task and f"task {a.task}", a.arch and f"arch {a.arch}") if x) or "all runs"
        out.write(f"{'#':>2}  {'tactic':<15} {'sim':>5}  {'applied':>7} {'ok':>5} {'median gain':>11}  "
                  f"description   (statistics: {scope})\n")
        for r in rows:
            out.write(f"{r['rank']:>2}  {r['name']:<15} {r['similarity']:>5.2f}  {r['applied']:>7} "
                      f"{_fmt_pct(r['success_rate']):>5} {_fmt_gain(r['median_gain']):>11}  "
                      f"{_first_sentence(r['description'])}\n")
        return 0
    try:
        info = show(a.name, a.task, a.arch)
    except KeyError as e:
        from tactics.base import load_tactics
        out.write(f"{e.args[0]}; known: {', '.join(t.name for t in load_tactics())}\n")
        return 2
    if a.json:
        out.write(json.dumps(info, indent=2) + "\n")
        return 0
    st = info["statistics"]
    lines = [f"{info['name']} (v{info['version']}, {info['kind']} tactic)", "", info["description"], "",
             f"parameters:    {info['params'] or '-'}", f"architectures: {', '.join(info['archs'])}",
             f"keywords:      {', '.join(info['keywords'])}", "not applicable when:"]
    lines += [f"  - {p}" for p in info["preconditions (not applicable when)"]] or ["  -"]
    if st:
        lines.append(f"statistics:    applied {st['applied']}, ok {st['ok']} ({_fmt_pct(st['success_rate'])}), "
                     f"beat the parent {st['improved']} ({_fmt_pct(st['improve_rate'])}), median gain "
                     f"{_fmt_gain(st['median_gain'])} over {st['n_gains']}")
    else:
        lines.append("statistics:    none yet (no finished run applied it" +
                     (f" for {a.task or ''} {a.arch or ''}".rstrip() if (a.task or a.arch) else "") + ")")
    lines.append(f"source:        {info['source']}")
    out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
