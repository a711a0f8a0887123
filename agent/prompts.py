"""LLM prompts under a fixed context budget.

A prompt is a system message (fixed instructions) and one user message built from sections, in
priority order: the task, the base program (the strategy's current best IR, compact JSON, with its
score and the cost model's verdict), the reply format (these three always go in), then the localized
diagnostics of the last failures (code, node path, message, legal values, suggested JSON-Patch fix,
and the printed IR around the node), retrieved tactics, the accepted IR primitives (only when
primitives/ holds one: signature, template, an example, and the `{"op": "primitive", ...}` statement
that uses one, at most PRIMITIVES_CHARS characters), experience notes (conclusions shared by all
strategies), and the IR reference (docs/ir.md). The tactics section is the retrieved knowledge:
tactics ranked by meaning (knowledge.embedding) against the task, failures and bottleneck, with
their statistics from earlier runs, and the most relevant experience notes of earlier runs, under a
fixed character budget (RunConfig.knowledge_chars, default 4000). Sections after the required ones
are added while they fit in `context_tokens`; the first one that does not fit is cut line by line,
the rest dropped.
Tokens are estimated as characters / 4 (no tokenizer download at run time).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

CHARS_PER_TOKEN = 4
PRIMITIVES_CHARS = 3000      # the accepted IR primitives' listing, at most

SYSTEM = (
    "You are a GPU kernel engineer writing CAKE IR: a typed, hardware-explicit JSON schedule language that "
    "the CAKE compiler verifies, lowers to CUDA C++ and compiles with NVRTC. Your goal is a correct kernel "
    "for the task that runs faster than the base program on the target GPU. Every program you send is "
    "verified (diagnostics have stable codes and JSON-pointer node paths), compiled, tested against a "
    "float64 reference on fresh inputs, and timed. Change one or a few things at a time and keep the "
    "kernel's parameter names, dtypes and scalar names exactly as the task requires."
)

REPLY_FORMAT = """## Reply format
Reply with exactly one JSON object and nothing else (a ```json fence is tolerated):
- {"patch": [...]}  an RFC 6902 JSON Patch (add/remove/replace/move/copy/test, JSON-pointer paths) applied to
  the base program above, or
- {"kernel": {...}}  a complete CAKE IR Kernel document, or
- {"program": {...}}  a CAKE IR Program: {"name", "arch", "workspace": [{"name", "dtype", "shape"}], "kernels": [...]},
  kernels launched in order; each kernel using a workspace declares it as a tensor param (the first one writes it).
Optionally add "why": "<one sentence>". The result must validate against the CAKE IR schema."""

REPAIR = ("Your reply could not be used: {error}\n"
          "Reply again with one JSON object in the same format ({{\"patch\": [...]}} against the base program, "
          "or {{\"kernel\": {{...}}}}), fixing exactly this problem.")


def tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + 1


def ir_reference() -> str:
    p = Path(__file__).resolve().parent.parent / "docs" / "ir.md"
    try:
        return p.read_text()
    except OSError:
        return ""


def task_section(entry, spec_name: str, dry_run: bool) -> str:
    t = entry.task
    shape = entry.bench_shape
    ins = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in t.inputs(shape))
    outs = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in t.outputs(shape))
    scal = ", ".join(f"{k}" for k in t.scalars(shape))
    lines = [f"## Task: {entry.name}", entry.long_description, "",
             f"Kernel interface (at the timed shape {shape}): inputs {ins}; outputs {outs}; integer scalars {scal}.",
             f"Correctness shapes (every one must be legal for the kernel's declared scalar facts): {t.shapes}",
             f"Timed shape: {shape}. Tolerance: relative RMSE <= {t.tolerance.rel_rmse}"
             + (f", max-abs <= {t.tolerance.max_abs}" if t.tolerance.max_abs is not None else "") + ".",
             f"Work: {t.flops(shape):.4g} FLOP, {t.bytes(shape):.4g} bytes of compulsory traffic.",
             f"Target GPU: {spec_name}" + (" (dry run: programs are ranked by the cost model, not timed)" if dry_run else "")]
    return "\n".join(lines)


def base_section(member: dict, measured: bool) -> str:
    ir = member["genome"]["ir"]
    score = member.get("score")
    what = "measured median" if measured else "cost-model prediction"
    s = f"{score * 1e3:.4f} ms ({what})" if score is not None else "not scored"
    text = [f"## Base program (hash {member['hash']}, {s})",
            json.dumps(ir, separators=(",", ":"))]
    cost = member.get("cost")
    if cost and cost.get("bound"):
        text.insert(1, f"The cost model says it is {cost['bound']}-bound at {cost.get('binding_path') or '/'} "
                       f"({100 * (cost.get('efficiency') or 0):.0f}% of the roofline floor).")
    return "\n".join(text)


def failure_section(failures: list[dict]) -> str:
    if not failures:
        return ""
    from cake_ir.io import load
    from cake_ir.printer import format_excerpt
    out = ["## Diagnostics of the last failures (most recent first)"]
    for f in failures:
        head = f"- candidate {f.get('hash') or '(no program)'} via {f.get('tactic') or 'reply'}: failed at {f.get('stage')}"
        out.append(head)
        for d in (f.get("diagnostics") or [])[:6]:
            line = f"  {d.get('code')} at {d.get('node')}: {d.get('message')}"
            if d.get("legal") is not None:
                line += f" (legal: {d['legal']})"
            if d.get("fix"):
                line += f" fix: {json.dumps(d['fix'])}"
            out.append(line)
        if not f.get("diagnostics") and f.get("message"):
            out.append(f"  {f.get('code') or ''} {('at ' + f['node'] + ': ') if f.get('node') else ''}{f['message'][:600]}")
        if f.get("ir") and f.get("diagnostics"):
            k, _ = load(f["ir"])
            if k is not None:
                mark: dict = {}
                for d in f["diagnostics"][:6]:
                    mark.setdefault(d.get("node") or "/", []).append(f"{d.get('code')}: {d.get('message', '')[:160]}")
                try:
                    ex = format_excerpt(k, mark, context=1)
                except Exception:  # noqa: BLE001 - an excerpt is a courtesy
                    ex = ""
                if ex:
                    out.append("  IR around the node:\n" + "\n".join("    " + ln for ln in ex.rstrip().splitlines()))
    return "\n".join(out)


def tactics_section(query: str, k: int = 4) -> str:
    from tactics import retrieve
    ts = retrieve(query, k=k)
    if not ts:
        return ""
    return "\n".join(["## Tactics that may apply (transformations the search proposer knows)"]
                     + [f"- {t.name}: {t.description}" for t in ts])


def retrieval_query(entry, member: dict, failures: list) -> str:
    """What the knowledge is retrieved by: the task, the last failures' codes and messages, and the
    cost model's bottleneck of the base program."""
    cost = member.get("cost") or {}
    bound = f"{cost['bound']}-bound" if cost.get("bound") else ""
    return " ".join([entry.name, getattr(entry, "description", "") or ""]
                    + [d.get("code", "") + " " + d.get("message", "") for f in failures for d in (f.get("diagnostics") or [])]
                    + [(f.get("code") or "") + " " + (f.get("message") or "")[:200] for f in failures] + [bound]).strip()


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def tactic_line(t, stat: Optional[dict]) -> str:
    line = f"- {t.name}: {t.description}"
    if t.params_doc:
        line += f" Parameters: {t.params_doc}."
    if stat and stat.get("applied"):
        line += (f" [earlier runs: applied {stat['applied']}, worked {_pct(stat.get('success_rate'))}, beat the parent "
                 f"{_pct(stat.get('improve_rate'))}, median gain "
                 + ("-" if stat.get("median_gain") is None else f"{100 * stat['median_gain']:+.1f}%") + "]")
    return line


def knowledge_section(tactics: list, stats: dict, notes: list, budget_chars: int) -> str:
    """Retrieved tactics (best first, with their statistics) and experience notes of earlier runs
    (most relevant first), at most `budget_chars` characters in all. Items alternate (tactic, note,
    tactic, ...) so both kinds get in; an item that does not fit is skipped, a shorter later one may."""
    heads = {"t": "## Tactics that may apply (transformations the search proposer knows)",
             "n": "## Experience from earlier runs (retrieved by relevance)"}
    lines = {"t": [tactic_line(t, stats.get(t.name)) for t in tactics], "n": [f"- {n}" for n in notes]}
    order = []
    for i in range(max(len(lines["t"]), len(lines["n"]))):
        order += [(k, lines[k][i]) for k in ("t", "n") if i < len(lines[k])]
    picked: dict = {"t": [], "n": []}
    used = 0
    for kind, line in order:
        extra = len(line) + 1 + (0 if picked[kind] else len(heads[kind]) + 2)   # +2: the blank line between parts
        if used + extra <= budget_chars:
            picked[kind].append(line)
            used += extra
    parts = ["\n".join([heads[k]] + picked[k]) for k in ("t", "n") if picked[k]]
    return "\n\n".join(parts)


PRIMITIVES_HEAD = (
    "## IR primitives (accepted statement sequences, promoted from successful programs)\n"
    'A statement {"op": "primitive", "name": NAME, "params": {...}} may stand wherever a statement may (the '
    "prologue, a role body, a loop body, an if branch; in a kernel, a program or a patch's value). Before the "
    "program is loaded it is replaced by the primitive's statements, each <param> set to the value given; "
    "an unknown name or wrong params make the reply unusable.")


def primitives_section(budget_chars: int = PRIMITIVES_CHARS) -> str:
    """The accepted IR primitives (primitives.cards(): signature, statement template, an example of the
    parameters) and how a reply uses one, at most `budget_chars` characters; "" when none is accepted
    (or the primitives cannot be loaded: the listing is a courtesy, the expansion reports its own errors)."""
    try:
        from primitives import cards
        items = cards()
    except Exception:  # noqa: BLE001
        return ""
    from .primitive_use import primitive_line
    lines, used = [PRIMITIVES_HEAD], len(PRIMITIVES_HEAD)
    for card in items:
        line = primitive_line(card)
        if used + len(line) + 1 <= budget_chars:      # a line that does not fit is skipped, a shorter one may
            lines.append(line)
            used += len(line) + 1
    return "\n".join(lines) if len(lines) > 1 else ""


def notes_section(notes: list, k: int = 12) -> str:
    if not notes:
        return ""
    return "\n".join(["## Experience notes (conclusions from this campaign's strategies)"]
                     + [f"- [{n.get('strategy')}] {n['text']}" for n in notes[-k:]])


def _fit(text: str, budget_tokens: int) -> str:
    if tokens(text) <= budget_tokens:
        return text
    out, used = [], 0
    for line in text.splitlines():
        t = tokens(line + "\n")
        if used + t > budget_tokens:
            break
        out.append(line)
        used += t
    return "\n".join(out + ["[... cut to fit the context budget]"]) if out else ""


def build(entry, member: dict, *, measured: bool, spec_name: str, dry_run: bool, failures: list, notes: list,
          context_tokens: int, knowledge: Optional[str] = None,
          primitives: Optional[str] = None) -> tuple[list[dict], dict]:
    """(messages, meta) where meta lists the sections included and the token estimate. `knowledge` is
    the retrieved tactics + experience section (knowledge_section); without it, tactics are retrieved
    here for the failures and bottleneck. `primitives` is the accepted primitives' listing
    (primitives_section, built here when not given; empty when none is accepted)."""
    required = [task_section(entry, spec_name, dry_run), base_section(member, measured), REPLY_FORMAT]
    if knowledge is None:
        knowledge = tactics_section(retrieval_query(entry, member, failures))
    if primitives is None:
        primitives = primitives_section()
    optional = [("diagnostics", failure_section(failures)), ("tactics", knowledge), ("primitives", primitives),
                ("notes", notes_section(notes)), ("ir_reference", "## CAKE IR reference\n" + ir_reference())]
    used = tokens(SYSTEM) + sum(tokens(s) for s in required)
    included, parts = ["task", "base", "format"], [required[0], required[1]]
    cut: Optional[str] = None
    for name, text in optional:
        if not text:
            continue
        left = context_tokens - used
        if cut is not None or left <= 0:
            continue
        piece = _fit(text, left)
        if not piece:
            cut = name
            continue
        if piece != text:
            cut = name
        parts.append(piece)
        included.append(name if piece == text else f"{name} (cut)")
        used += tokens(piece)
    parts.append(REPLY_FORMAT)
    user = "\n\n".join(parts)
    meta = {"sections": included, "tokens_estimate": tokens(SYSTEM) + tokens(user), "budget": context_tokens,
            "over_budget": tokens(SYSTEM) + tokens(user) > context_tokens}
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], meta


def repair_message(error: str) -> dict:
    return {"role": "user", "content": REPAIR.format(error=error)}
