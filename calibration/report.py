"""Plain-text tables for calibration runs (what `python -m calibration.run` prints last)."""
from __future__ import annotations

from typing import Optional, Sequence

from .fit import FITTED_FIELDS


def fmt_value(field: str, v) -> str:
    if v is None:
        return "-"
    try:
        v = float(v)
    except (TypeError, ValueError):
        return str(v)
    if field.endswith("_s") or field == "s":
        return f"{v * 1e6:.3f} us"
    if field in ("hbm_bw", "l2_bw", "B/s"):
        return f"{v / 1e12:.3f} TB/s"
    if field in ("smem_bw_per_sm", "B/s/SM"):
        return f"{v / 1e9:.1f} GB/s/SM"
    if field.endswith("flops") or field == "FLOP/s":
        return f"{v / 1e12:.1f} TFLOP/s"
    if field in ("sfu_ops", "op/s"):
        return f"{v / 1e12:.3f} Top/s"
    if field == "clock_hz":
        return f"{v / 1e9:.3f} GHz"
    if field == "l2_bytes":
        return f"{v / 2**20:.0f} MiB"
    return f"{v:.4g}"


def constants_table(base, direct, final, fitted: Sequence[str]) -> str:
    fields = [f for f in FITTED_FIELDS if f in fitted or getattr(base, f) != getattr(final, f)]
    fields += [f for f in ("sms", "l2_bytes") if f in fitted]
    lines = [f"{'constant':22s} {'arch table':>16s} {'direct':>16s} {'final':>16s} {'final/table':>11s}"]
    for f in fields:
        b, d, x = getattr(base, f), getattr(direct, f), getattr(final, f)
        ratio = f"{x / b:.3f}" if b else "-"
        lines.append(f"{f:22s} {fmt_value(f, b):>16s} {fmt_value(f, d):>16s} {fmt_value(f, x):>16s} {ratio:>11s}")
    return "\n".join(lines)


def micro_table(measurements: Sequence[dict], conversions: Sequence[dict]) -> str:
    conv = {c["name"]: c for c in conversions}
    lines = [f"{'microbenchmark':24s} {'median':>11s} {'value':>18s} {'informs':28s} {'ok':>3s}"]
    for m in measurements:
        c = conv.get(m["name"], {})
        t = m.get("seconds")
        ts = f"{t * 1e3:.4f} ms" if t else "failed"
        unit = m.get("unit") or (m["informs"][0] if m.get("informs") else "")
        informs = ",".join(m.get("informs") or ()) + ("" if m.get("primary", True) else " (2nd)")
        ok = "yes" if m.get("correct", True) and t else "NO"
        lines.append(f"{m['name']:24s} {ts:>11s} {fmt_value(unit, c.get('value')):>18s} {informs:28s} {ok:>3s}")
    return "\n".join(lines)


def refine_table(rr: Optional[dict]) -> str:
    if not rr:
        return "refinement: not run"
    lines = ["refinement factors: " + ", ".join(f"{g} x{s:.3f}" for g, s in rr["scales"].items()
                                                if g in rr.get("active_groups", []))]
    b, a = rr["before"], rr["after"]

    def s(v):
        return "-" if v is None else f"{v:.3f}"
    lines.append(f"  rms ln(pred/meas): {s(b['rms_log'])} -> {s(a['rms_log'])}; spearman {s(b['spearman'])} -> "
                 f"{s(a['spearman'])} over {a['n']} kernels")
    for p in rr.get("predictions", []):
        lines.append(f"  {p['name']:34s} meas {p['measured'] * 1e3:8.4f} ms  pred {p['before'] * 1e3:8.4f} -> "
                     f"{p['after'] * 1e3:8.4f} ms")
    return "\n".join(lines)
