"""A self-contained HTML report of a run (inline SVG, no external assets): best speedup over time,
the stage funnel, candidates against the roofline, the best kernel's IR (printer output) and the
diagnostics history, and the library entries the run wrote or kept (best kernel per timed shape).
Written to CAKE_HOME/reports/<run>.html; also the plain-text summary table and library lines.
"""
from __future__ import annotations

import html
import math
from typing import Optional

from .progress import fmt_s

W, H, PAD = 640, 300, 48


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _svg(body: str, w: int = W, h: int = H, title: str = "") -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'role="img" aria-label="{_esc(title)}"><rect width="100%" height="100%" fill="#fff"/>{body}</svg>')


def _axes(xlabel: str, ylabel: str, w: int = W, h: int = H) -> str:
    return (f'<line x1="{PAD}" y1="{h - PAD}" x2="{w - 12}" y2="{h - PAD}" stroke="#333"/>'
            f'<line x1="{PAD}" y1="12" x2="{PAD}" y2="{h - PAD}" stroke="#333"/>'
            f'<text x="{(w + PAD) / 2}" y="{h - 10}" text-anchor="middle" font-size="12">{_esc(xlabel)}</text>'
            f'<text x="14" y="{(h - PAD) / 2}" text-anchor="middle" font-size="12" '
            f'transform="rotate(-90 14 {(h - PAD) / 2})">{_esc(ylabel)}</text>')


def speedup_chart(history: list, ref_s: Optional[float], label: str) -> str:
    if not history or not ref_s:
        return _svg('<text x="20" y="40" font-size="13">no passing candidate yet</text>', h=80)
    t_end = max(h["t"] for h in history) or 1.0
    pts = [(h["t"], ref_s / h["best_s"]) for h in history]
    ymax = max(p[1] for p in pts) * 1.15 or 1.0
    ymin = 0.0

    def X(t):
        return PAD + (W - PAD - 20) * (t / (t_end * 1.05 or 1))

    def Y(v):
        return H - PAD - (H - PAD - 20) * ((v - ymin) / (ymax - ymin or 1))

    path, prev = [], None
    for t, v in pts:
        if prev is not None:
            path.append(f"L{X(t):.1f},{Y(prev):.1f}")
        path.append(("M" if prev is None else "L") + f"{X(t):.1f},{Y(v):.1f}")
        prev = v
    path.append(f"L{X(t_end * 1.05):.1f},{Y(prev):.1f}")
    body = _axes("elapsed seconds", f"speedup vs {label}")
    for k in range(5):
        v = ymin + (ymax - ymin) * k / 4
        body += (f'<line x1="{PAD}" x2="{W - 12}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#eee"/>'
                 f'<text x="{PAD - 4}" y="{Y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.2f}x</text>')
    body += f'<line x1="{PAD}" x2="{W - 12}" y1="{Y(1.0):.1f}" y2="{Y(1.0):.1f}" stroke="#c66" stroke-dasharray="4 3"/>'
    body += f'<path d="{" ".join(path)}" fill="none" stroke="#2a6" stroke-width="2"/>'
    for t, v in pts:
        body += f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="3" fill="#2a6"><title>{v:.3f}x at {t:.1f}s</title></circle>'
    body += f'<text x="{W - 14}" y="{H - PAD - 4}" font-size="10" text-anchor="end">{t_end:.0f} s</text>'
    return _svg(body, title="best speedup over time")


def funnel_chart(funnel: dict, dry_run: bool) -> str:
    stages = ["proposed", "verify", "compile"] + ([] if dry_run else ["test", "profile"])
    vals = [funnel.get(s, 0) for s in stages]
    top = max(vals) or 1
    bh, gap = 30, 10
    h = 20 + len(stages) * (bh + gap)
    body = ""
    for i, (s, v) in enumerate(zip(stages, vals)):
        y = 10 + i * (bh + gap)
        w = (W - 200) * v / top
        name = s if s == "proposed" else f"passed {s}"
        body += (f'<text x="110" y="{y + bh * 0.65:.1f}" font-size="12" text-anchor="end">{_esc(name)}</text>'
                 f'<rect x="120" y="{y}" width="{w:.1f}" height="{bh}" fill="#48c"/>'
                 f'<text x="{126 + w:.1f}" y="{y + bh * 0.65:.1f}" font-size="12">{v}</text>')
    return _svg(body, h=h, title="stage funnel")


def roofline_chart(points: list, peak_flops: float, bw: float, measured: bool) -> str:
    """points: (intensity FLOP/byte, achieved FLOP/s, label, is_best)."""
    pts = [p for p in points if p[0] and p[1] and p[0] > 0 and p[1] > 0]
    if not pts:
        return _svg('<text x="20" y="40" font-size="13">no candidate to place on the roofline</text>', h=80)
    xs = [p[0] for p in pts] + [peak_flops / bw]
    x0, x1 = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    ys = [p[1] for p in pts] + [peak_flops]
    y0, y1 = 10 ** math.floor(math.log10(min(ys) / 2)), 10 ** math.ceil(math.log10(max(ys) * 1.5))

    def X(v):
        return PAD + (W - PAD - 20) * (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))

    def Y(v):
        return H - PAD - (H - PAD - 20) * (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0))

    body = _axes("arithmetic intensity (FLOP / DRAM byte, cost model)",
                 "FLOP/s " + ("(measured)" if measured else "(predicted)"))
    ridge = peak_flops / bw
    roof = [(x0, min(peak_flops, x0 * bw)), (ridge, peak_flops), (x1, peak_flops)]
    roof = [(x, y) for x, y in roof if x0 <= x <= x1]
    body += '<path d="' + " ".join(("M" if i == 0 else "L") + f"{X(x):.1f},{Y(max(y, y0)):.1f}" for i, (x, y) in enumerate(roof)) \
            + '" fill="none" stroke="#c33" stroke-width="2"/>'
    body += (f'<text x="{X(x1) - 4:.1f}" y="{Y(peak_flops) - 6:.1f}" font-size="10" text-anchor="end">'
             f'peak {peak_flops / 1e12:.0f} TFLOP/s, {bw / 1e12:.2f} TB/s</text>')
    for e in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        body += f'<text x="{X(10 ** e):.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle">1e{e}</text>'
    for e in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        body += f'<text x="{PAD - 4}" y="{Y(10 ** e) + 3:.1f}" font-size="10" text-anchor="end">1e{e}</text>'
    for ai, f, label, is_best in pts:
        color = "#e80" if is_best else "#48c"
        body += (f'<circle cx="{X(ai):.1f}" cy="{Y(f):.1f}" r="{5 if is_best else 3}" fill="{color}" fill-opacity="0.8">'
                 f'<title>{_esc(label)}</title></circle>')
    return _svg(body, title="candidates against the roofline")


def score_of(c, comp: dict) -> Optional[float]:
    """The time a candidate was ranked by, as the run ranked it: its measured median, else the
    prediction from its compiled code's instruction counts (a dry run with nvdisasm), else the cost
    model's own prediction."""
    if c.measured_s is not None:
        return c.measured_s
    return comp.get("predicted_sass_s") or c.predicted_s


def summary_rows(cands: list, evals: dict, best_hash: Optional[str], k: int = 12) -> list[dict]:
    ok = [c for c in cands if c.status == "ok"]
    comps = {c.id: (evals.get((c.id, "compile")) or {}) for c in ok}
    scores = {c.id: score_of(c, comps[c.id]) for c in ok}
    ok.sort(key=lambda c: scores[c.id] if scores[c.id] is not None else math.inf)
    rows = []
    for i, c in enumerate(ok[:k]):
        comp = comps[c.id]
        rows.append({"rank": i + 1, "hash": c.hash[:10], "name": c.name, "strategy": c.strategy, "tactic": c.tactic or "",
                     "params": _params(c.params), "time": fmt_s(scores[c.id]),
                     "measured": "yes" if c.measured_s is not None else "no (predicted)",
                     "regs": comp.get("registers"), "smem": comp.get("smem_bytes"), "best": c.hash == best_hash})
    return rows


def _params(p) -> str:
    if not p:
        return ""
    return ", ".join(f"{k}={v}" for k, v in p.items() if k not in ("fix",))[:60]


def text_table(rows: list[dict]) -> str:
    cols = ["rank", "hash", "strategy", "tactic", "params", "time", "measured", "regs", "smem"]
    data = [[str(r.get(c) if r.get(c) is not None else "-") + ("*" if c == "rank" and r.get("best") else "")
             for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) if data else len(c) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(d, widths)) for d in data]
    return "\n".join(out)


def shape_labels(shapes: list[dict]) -> list[str]:
    """Short names for shapes side by side: only the fields that differ between them (all fields for
    a single shape), in the shape key's format (K1_K2...)."""
    if len(shapes) < 2:
        return ["_".join(f"{k}{v}" for k, v in s.items()) for s in shapes]
    keys = [k for k in shapes[0] if len({str(s.get(k)) for s in shapes}) > 1]
    keys += [k for s in shapes for k in s if k not in shapes[0] and k not in keys]
    return ["_".join(f"{k}{s.get(k)}" for k in keys) or "_".join(f"{k}{v}" for k, v in s.items()) for s in shapes]


def _outcome(e: dict) -> str:
    if e.get("status") == "written":
        return f"written ({e.get('reason')})"
    if e.get("status") == "kept":
        reason = str(e.get("reason", ""))
        if e.get("library_ms") is not None and reason.startswith("the library entry is as fast") \
                and "same run" not in reason:
            return f"kept (the library's {e['library_ms']:.3f} ms is as fast or faster)"
        return f"kept ({e.get('reason')})"
    return f"not written ({e.get('reason')})"


def library_lines(lib: dict, dry_run: bool = False) -> list[str]:
    """The end-of-run library lines: a headline (entries written / kept, the folder), then one line
    per written or kept entry (shape, kernel, ms, outcome; * marks the run's own shape), then the
    errors, and the shapes that got no entry in one line."""
    entries = lib.get("entries") or []
    nw, nk = lib.get("n_written", 0), lib.get("n_kept", 0)
    head = (f"library: {nw} entr{'y' if nw == 1 else 'ies'} written, {nk} kept in {lib.get('dir', '-')}"
            + (" (dry run: cost-model prediction, unmeasured)" if dry_run else "")
            + (" (* the run's own shape)" if len(entries) > 1 else ""))
    shown = [e for e in entries if e.get("status") in ("written", "kept", "error")]
    labels = dict(zip((id(e) for e in entries), shape_labels([e["shape"] for e in entries])))
    cells = [(("*" if e.get("timed") and len(entries) > 1 else "") + labels[id(e)],
              f"{e.get('name') or '-'} {(e.get('hash') or '')[:8]}".rstrip(),
              (f"{e['ms']:.3f} ms" + ("" if e.get("measured") else " (predicted)")) if e.get("ms") is not None else "-",
              _outcome(e)) for e in shown]
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(3)]
    out = [head] + ["  " + "  ".join(v.ljust(w) for v, w in zip(c[:3], widths)) + "  " + c[3] for c in cells]
    none = [e for e in entries if e.get("status") == "none"]
    if none:
        why = sorted({str(e.get("reason")) for e in none})
        out.append(f"  no entry for {', '.join(labels[id(e)] for e in none)}: {'; '.join(why)}")
    return out


def library_table(lib: Optional[dict]) -> str:
    """HTML: the best kernel per timed shape and what became of its library entry."""
    entries = (lib or {}).get("entries") or []
    if not entries:
        return "<p>no library export</p>"
    rows = "".join(
        f"<tr class=\"{'best' if e.get('timed') else ''}\"><td><code>{_esc(e['key'])}</code>"
        f"{' (the run&#39;s shape)' if e.get('timed') else ''}</td>"
        f"<td>{_esc(e.get('name') or '-')} <code>{_esc((e.get('hash') or '')[:10])}</code></td>"
        f"<td>{_esc('%.4f' % e['ms'] if e.get('ms') is not None else '-')}"
        f"{'' if e.get('measured') or e.get('ms') is None else ' (predicted)'}</td>"
        f"<td>{_esc(_outcome(e))}</td></tr>" for e in entries)
    return (f"<p>Folder <code>{_esc(lib.get('dir', '-'))}</code>: {lib.get('n_written', 0)} written, "
            f"{lib.get('n_kept', 0)} kept. Other shapes than the run's are judged by the candidates' medians "
            f"at that shape; no baseline was timed there.</p>"
            f"<table><tr><th>shape key</th><th>best kernel</th><th>ms</th><th>library entry</th></tr>{rows}</table>")


def write_report(path, *, cfg, entry, state: dict, store, spec, library: Optional[dict] = None) -> str:
    from cake_ir.io import load
    from cake_ir.printer import format_kernel

    cands = store.candidates(cfg.run_id)
    evs = store.evaluations(cfg.run_id)
    fails = store.failures(cfg.run_id)
    evals = {(e.candidate_id, e.stage): (e.metrics or {}) for e in evs}
    best = state.get("best") or {}
    measured = not cfg.dry_run
    by_hash = {c.hash: c for c in cands}
    # speedup reference: the baseline when measured, else the best seed (predicted)
    bl = [(n, b["ms"]) for n, b in (state.get("baseline") or {}).items() if b.get("status") == "ok" and b.get("ms")]
    if measured and bl:
        ref_label, ref_s = bl[0][0], min(b for _, b in bl) * 1e-3
    else:
        ref_label, ref_s = "best seed" + ("" if measured else " (predicted)"), state.get("seed_best_s")
    t = entry.task
    flops = t.flops(entry.bench_shape)
    points = []
    for c in cands:
        if c.status != "ok":
            continue
        sec = c.measured_s if c.measured_s is not None else c.predicted_s
        dram = _dram(c)
        if sec and dram:
            points.append((flops / dram, flops / sec, f"{c.name} {c.hash[:8]} {fmt_s(sec)} via {c.tactic}",
                           c.hash == best.get("hash")))
    peak = spec.wgmma_flops or spec.mma_sync_flops
    best_ir_text, best_diag = "(no passing candidate)", ""
    if best.get("hash") and best["hash"] in by_hash:
        k, _ = load(by_hash[best["hash"]].ir)
        if k is not None:
            best_ir_text = format_kernel(k)
    rows = summary_rows(cands, {(c.id, s): evals.get((c.id, s)) for c in cands for s in ("compile",)},
                        best.get("hash"))
    unmeasured = ('<p class="warn"><b>Dry run: nothing here was measured.</b> Candidates were verified and compiled; '
                  'times are cost-model predictions on the target constants (' + _esc(spec.name) + ').</p>') if cfg.dry_run else ""
    fail_rows = "".join(
        f"<tr><td>{_esc(f.created_at.strftime('%H:%M:%S') if f.created_at else '')}</td><td>{_esc(_cand_label(f, cands))}</td>"
        f"<td>{_esc(f.strategy or '')}</td><td>{_esc(f.stage)}</td><td><code>{_esc(f.code)}</code></td>"
        f"<td><code>{_esc(f.node or '')}</code></td><td>{_esc(f.message[:400])}</td></tr>" for f in fails[-300:])
    table = "".join(
        f"<tr class=\"{'best' if r['best'] else ''}\"><td>{r['rank']}</td><td><code>{_esc(r['hash'])}</code></td>"
        f"<td>{_esc(r['strategy'])}</td><td>{_esc(r['tactic'])}</td><td>{_esc(r['params'])}</td><td>{_esc(r['time'])}</td>"
        f"<td>{_esc(r['measured'])}</td><td>{_esc(r['regs'] if r['regs'] is not None else '-')}</td>"
        f"<td>{_esc(r['smem'] if r['smem'] is not None else '-')}</td></tr>" for r in rows)
    strat = "".join(
        f"<tr><td>{_esc(n)}</td><td>{s.get('evaluated', 0)}</td><td>{s.get('ok', 0)}</td><td>{s.get('improved', 0)}</td>"
        f"<td>{_esc(fmt_s(s.get('best_s')))}</td><td>{'yes' if s.get('plateau') else 'no'}</td>"
        f"<td>{_esc('active' if s.get('active', True) else s.get('inactive_reason'))}</td>"
        f"<td>{_esc(s.get('tokens', ''))}</td></tr>" for n, s in (state.get("strategies") or {}).items())
    notes = "".join(f"<li>{_esc(n['text'])} <small>[{_esc(n.get('strategy'))}]</small></li>" for n in (state.get("notes") or [])[-30:])
    events = "".join(f"<li>{_esc(e)}</li>" for e in (state.get("events") or []))
    base_txt = ", ".join(f"{_esc(n)}: {b['ms']:.4f} ms" if b.get("ms") else f"{_esc(n)}: {_esc(b.get('status'))} {_esc(b.get('message', ''))}"
                         for n, b in (state.get("baseline") or {}).items()) or ("none (dry run)" if cfg.dry_run else "none")
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>CAKE run {_esc(cfg.run_id)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}}
h1{{font-size:22px}} h2{{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}}
table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}}
tr.best{{background:#fff3d6}} pre{{background:#f7f7f7;padding:10px;overflow:auto;font-size:11px;max-height:600px}}
.warn{{background:#fff0f0;border:1px solid #e99;padding:8px}} .kv td:first-child{{font-weight:600}}
</style></head><body>
<h1>CAKE run {_esc(cfg.run_id)}</h1>
{unmeasured}
<table class="kv">
<tr><td>task</td><td>{_esc(cfg.task)} (timed shape {_esc(entry.bench_shape)})</td></tr>
<tr><td>proposer</td><td>{_esc(cfg.proposer)}: strategies {_esc(', '.join(cfg.strategies))}{(' model ' + _esc(cfg.model)) if cfg.model else ''}</td></tr>
<tr><td>candidates</td><td>{state.get('n_proposed', 0)} proposed, {state.get('n_evaluated', 0)} evaluated (max {cfg.max_candidates})</td></tr>
<tr><td>stop</td><td>{_esc(state.get('stop') or 'running')}</td></tr>
<tr><td>best</td><td>{_esc(fmt_s(best.get('score_s')))} {'measured' if best.get('measured') else '(predicted, unmeasured)'}
 {('%.2fx vs ' % best['speedup'] + _esc(best.get('speedup_vs'))) if best.get('speedup') else ''} &mdash; {_esc(best.get('name', ''))} <code>{_esc(best.get('hash', ''))}</code></td></tr>
<tr><td>baselines</td><td>{base_txt}</td></tr>
<tr><td>elapsed</td><td>{state.get('elapsed_s', 0):.1f} s</td></tr>
</table>
<h2>Best speedup over time</h2>{speedup_chart(state.get('history') or [], ref_s, ref_label)}
<h2>Stage funnel</h2>{funnel_chart(state.get('funnel') or {}, cfg.dry_run)}
<h2>Candidates against the roofline</h2>{roofline_chart(points, peak, spec.hbm_bw, measured)}
<h2>Top candidates</h2><table><tr><th>#</th><th>hash</th><th>strategy</th><th>tactic</th><th>params</th><th>time</th><th>measured</th><th>regs</th><th>smem B</th></tr>{table}</table>
<h2>Library: best kernel per timed shape</h2>{library_table(library)}
<h2>Strategies</h2><table><tr><th>strategy</th><th>evaluated</th><th>ok</th><th>improved</th><th>best</th><th>plateau</th><th>state</th><th>tokens</th></tr>{strat}</table>
<h3>Events</h3><ul>{events or '<li>none</li>'}</ul>
<h3>Shared notes (conclusions)</h3><ul>{notes or '<li>none</li>'}</ul>
<h2>Best kernel IR</h2><pre>{_esc(best_ir_text)}</pre>
<h2>Diagnostics history</h2>
<table><tr><th>time</th><th>candidate</th><th>strategy</th><th>stage</th><th>code</th><th>node</th><th>message</th></tr>{fail_rows or '<tr><td colspan=7>no failures</td></tr>'}</table>
{best_diag}
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)
    return str(path)


def _dram(c) -> Optional[float]:
    return (c.cost or {}).get("dram_bytes") if isinstance(c.cost, dict) else None


def _cand_label(f, cands) -> str:
    if f.candidate_id is None:
        return "(proposer)"
    c = next((c for c in cands if c.id == f.candidate_id), None)
    return f"{c.name} {c.hash[:8]}" if c else str(f.candidate_id)
