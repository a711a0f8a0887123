"""Fit ArchSpec constants from measurements (pure numpy; no GPU).

Two steps:

1. `direct(measurements)`: each microbenchmark's median time becomes a candidate value of the
   constant(s) it informs (calibration.micro.base.convert: rates = work / time, latencies = time /
   iterations, launch overhead removed first). Order matters: launch_overhead_s first (every
   other conversion subtracts it), then latencies in dependency order (tma_latency_s subtracts
   mbarrier_roundtrip_s), then rates. Several primary candidates for one constant: rates take the
   largest (the achievable ceiling), latencies the median. A constant with no usable measurement
   keeps the arch table's value (and the derivation says so). Device attributes (SM count, L2 size,
   clock) are taken as reported by the driver.

2. `refine(spec, samples)`: multiplicative factors, one per group of constants (GROUPS: memory,
   wgmma, mma_sync, simt, issue, latency, launch), chosen to minimise

       mean_i (ln estimate_i(spec x factors) - ln measured_i)^2  +  ridge * sum_g (ln f_g)^2

   over real kernels with measured times (`Sample`s), with |ln f_g| <= ln(max_factor). The
   estimate is a max of terms (not smooth, with plateaus where another term binds), so the
   minimiser is derivative-free coordinate descent: per group a fine grid over the whole bound (25
   points), then golden-section search between the best grid point's neighbours, a few sweeps. Groups that change no prediction are left at 1. The ridge keeps factors near 1
   when the data do not pin them down (the microbenchmarks are the prior). Spearman's rank
   correlation before/after is reported next to the log error.

Every constant written is checked positive and finite (factors are exp(.) of a bounded number and
direct values fall back to the table otherwise).

CLI: `python -m calibration.fit --from calibration/data/h200.json [--out PATH]` refits from the raw
measurements a calibration file carries (no GPU).
"""
from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from cake_ir import arch as _arch
from cake_ir.arch import ArchSpec

from .micro.base import convert
from .stats import log_errors, spearman

RATE_FIELDS = ("hbm_bw", "l2_bw", "smem_bw_per_sm", "mma_sync_flops", "wgmma_flops", "fp32_flops", "sfu_ops",
               "clock_hz")
TIME_FIELDS = ("launch_overhead_s", "mbarrier_roundtrip_s", "tma_latency_s", "cp_async_latency_s")
DEVICE_FIELDS = ("sms", "l2_bytes", "clock_hz")
FITTED_FIELDS = RATE_FIELDS + TIME_FIELDS

GROUPS: dict[str, tuple[str, ...]] = {
    "memory": ("hbm_bw", "l2_bw"),
    "wgmma": ("wgmma_flops",),
    "mma_sync": ("mma_sync_flops",),
    "simt": ("fp32_flops", "sfu_ops"),
    "issue": ("smem_bw_per_sm", "clock_hz"),
    "latency": ("tma_latency_s", "cp_async_latency_s", "mbarrier_roundtrip_s"),
    "launch": ("launch_overhead_s",),
}


def _ok(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


# ------------------------------------------------------------------------------ 1. direct
@dataclass
class DirectResult:
    values: dict                      # field -> value (only fields with a measured or device value)
    derivations: dict                 # field -> how it was obtained
    conversions: list                 # per measurement: its converted value (None for info / unusable)
    info: dict                        # derived informational numbers (bank-conflict slowdowns, ...)
    notes: list = field(default_factory=list)

    def spec(self, base: ArchSpec) -> ArchSpec:
        return replace(base, **self.values)


def direct(measurements: Sequence[dict], base: Optional[ArchSpec] = None, sms: Optional[int] = None,
           device: Optional[dict] = None) -> DirectResult:
    """Convert raw measurements into constants.

    A measurement is a dict with at least: name, kind, informs, work, primary, subtract, seconds
    (the median time of one launch; None / non-positive / non-finite when it failed). Records with
    `correct` False (a failed check) are ignored."""
    base = base or _arch.spec("sm_90a")
    device = device or {}
    sms = int(sms or device.get("sms") or base.sms)
    values: dict = {}
    deriv: dict = {}
    notes: list = []
    conv: dict = {}
    meas = [m for m in measurements if m.get("kind") and m.get("correct", True)]

    # Device attributes first: they are facts, not fits.
    if _ok(device.get("sms")):
        values["sms"] = int(device["sms"])
        deriv["sms"] = {"value": values["sms"], "source": "device attribute"}
    if _ok(device.get("l2_bytes")):
        values["l2_bytes"] = int(device["l2_bytes"])
        deriv["l2_bytes"] = {"value": values["l2_bytes"], "source": "device attribute"}
    if _ok(device.get("clock_khz")):
        values["clock_hz"] = float(device["clock_khz"]) * 1e3
        deriv["clock_hz"] = {"value": values["clock_hz"], "source": "device attribute (max SM clock)"}

    def candidates(fld: str, t_launch: float):
        """name -> (value, primary) for the measurements informing `fld`; None while a constant one
        of them subtracts is not fitted yet."""
        out = {}
        for m in meas:
            if fld not in (m.get("informs") or ()):
                continue
            sub = 0.0
            for s in m.get("subtract") or ():
                if s not in values:
                    return None
                sub += values[s]
            v = convert(m["kind"], m.get("seconds"), float(m.get("work") or 0.0), t_launch=t_launch, sms=sms,
                        subtract=sub)
            conv[m["name"]] = v
            if _ok(v):
                out[m["name"]] = (float(v), bool(m.get("primary", True)))
        return out

    def settle(fld: str, t_launch: float) -> bool:
        c = candidates(fld, t_launch)
        if c is None:
            return False
        prim = {k: v for k, (v, p) in c.items() if p}
        sec = {k: v for k, (v, p) in c.items() if not p}
        if prim:
            rule = "max" if fld in RATE_FIELDS else "median"
            if rule == "max":
                src = max(prim, key=prim.get)
                v = prim[src]
            else:
                order = sorted(prim, key=prim.get)
                v = float(np.median([prim[k] for k in order]))
                src = order[len(order) // 2]
            values[fld] = float(v)
            deriv[fld] = {"value": float(v), "source": "measured", "rule": rule, "from": src,
                          "candidates": prim, "secondary": sec}
        elif fld not in values:
            deriv[fld] = {"value": getattr(base, fld), "source": "arch table (no usable measurement)",
                          "secondary": sec}
            notes.append(f"{fld}: no usable measurement; the arch table's {getattr(base, fld):.4g} is kept")
        return True

    # 1. launch overhead
    settle("launch_overhead_s", 0.0)
    t_launch = values.get("launch_overhead_s", 0.0)
    # 2. latencies, in dependency order (a measurement waits until what it subtracts is fitted)
    pending = [f for f in TIME_FIELDS if f != "launch_overhead_s"]
    for _ in range(len(pending) + 1):
        pending = [f for f in pending if not settle(f, t_launch)]
        if not pending:
            break
    for f in pending:
        notes.append(f"{f}: its measurements subtract constants that could not be fitted; table value kept")
    # 3. rates (clock_hz keeps its device value unless a microbenchmark informs it)
    for f in RATE_FIELDS:
        if f == "clock_hz" and not any("clock_hz" in (m.get("informs") or ()) for m in meas):
            continue
        settle(f, t_launch)

    # conversions of every measurement (info ones included, as effective rates) and derived info
    info: dict = {}
    by_name = {m["name"]: m for m in meas}
    for m in meas:
        if m["name"] not in conv and m.get("kind") != "launch":
            k = "rate_per_sm" if m.get("unit") == "B/s/SM" else ("rate" if m.get("kind") == "info" else m["kind"])
            if k in ("rate", "rate_per_sm") and _ok(m.get("work")):
                conv[m["name"]] = convert(k, m.get("seconds"), float(m["work"]), t_launch=t_launch, sms=sms)
        ref = (m.get("extra") or {}).get("compare_to")
        if ref and ref in by_name and ref != m["name"]:
            a, b = m, by_name[ref]
            if _ok(a.get("seconds")) and _ok(b.get("seconds")) and _ok(a.get("work")) and _ok(b.get("work")):
                ta = max(a["seconds"] - t_launch, 0.5 * a["seconds"]) / a["work"]
                tb = max(b["seconds"] - t_launch, 0.5 * b["seconds"]) / b["work"]
                info[f"{a['name']}_slowdown_vs_{ref}"] = ta / tb
    conversions = [{"name": m["name"], "kind": m["kind"], "informs": list(m.get("informs") or ()),
                    "primary": m.get("primary", True), "value": conv.get(m["name"])} for m in meas]
    for f, v in list(values.items()):
        if not _ok(v):
            notes.append(f"{f}: fitted value {v!r} is not positive and finite; the table value is kept")
            values.pop(f)
    return DirectResult(values, deriv, conversions, info, notes)


# ------------------------------------------------------------------------------ 2. refine
@dataclass
class Sample:
    """A real kernel with a measured time: what the refinement fits the cost model to."""

    name: str
    kernel: object                    # cake_ir.nodes.Kernel
    shapes: dict
    seconds: float
    family: str = ""


def apply_scales(spec: ArchSpec, scales: dict, groups: Optional[dict] = None) -> ArchSpec:
    groups = groups or GROUPS
    upd = {}
    for g, s in scales.items():
        for f in groups.get(g, ()):
            upd[f] = getattr(spec, f) * float(s)
    return replace(spec, **upd) if upd else spec


def estimate_seconds(spec: ArchSpec, sample: Sample) -> float:
    from cake_ir.cost import estimate

    return float(estimate(sample.kernel, sample.shapes, spec).seconds)


@dataclass
class RefineResult:
    scales: dict                      # group -> factor (1.0 = unchanged)
    spec: ArchSpec                    # the refined spec
    active: list                      # groups that change at least one prediction
    objective_before: float
    objective_after: float
    before: dict                      # log-error summary and spearman with the input spec
    after: dict
    predictions: list                 # per sample: name, measured, before, after
    evaluations: int = 0

    def to_dict(self) -> dict:
        return {"scales": self.scales, "active_groups": self.active, "objective_before": self.objective_before,
                "objective_after": self.objective_after, "before": self.before, "after": self.after,
                "predictions": self.predictions, "evaluations": self.evaluations}


def _summary(pred, meas) -> dict:
    s = log_errors(pred, meas)
    s["spearman"] = spearman(pred, meas) if len(pred) >= 2 else None
    return s


def refine(spec: ArchSpec, samples: Sequence[Sample], groups: Optional[dict] = None, *, max_factor: float = 4.0,
           ridge: float = 0.02, sweeps: int = 4, grid: int = 25, golden_iters: int = 12,
           predict: Optional[Callable[[ArchSpec, Sample], float]] = None) -> RefineResult:
    """Choose one multiplicative factor per group (see the module docstring)."""
    groups = dict(groups or GROUPS)
    predict = predict or estimate_seconds
    samples = [s for s in samples if _ok(s.seconds)]
    names = list(groups)
    L = math.log(max_factor)
    meas = np.array([s.seconds for s in samples], dtype=float)
    cache: dict = {}
    n_eval = [0]

    def preds(x: np.ndarray) -> np.ndarray:
        key = tuple(round(float(v), 9) for v in x)
        if key not in cache:
            sp = apply_scales(spec, {g: math.exp(v) for g, v in zip(names, x) if v != 0.0}, groups)
            n_eval[0] += 1
            cache[key] = np.array([predict(sp, s) for s in samples], dtype=float)
        return cache[key]

    def obj(x: np.ndarray) -> float:
        p = preds(x)
        if not len(samples):
            return float(ridge * np.sum(x * x))
        bad = ~(np.isfinite(p) & (p > 0))
        e = np.log(np.where(bad, 1.0, p) / meas)
        e[bad] = 50.0
        return float(np.mean(e * e) + ridge * np.sum(x * x))

    x = np.zeros(len(names))
    f0 = obj(x)
    base_pred = preds(x)
    # Groups whose constants change no prediction stay at 1.
    active = []
    for i, g in enumerate(names):
        for v in (-L, L):
            xt = x.copy()
            xt[i] = v
            if np.any(np.abs(preds(xt) - base_pred) > 1e-12 * np.maximum(1.0, np.abs(base_pred))):
                active.append(i)
                break
    fx = f0
    gr = (math.sqrt(5) - 1) / 2
    for _ in range(max(1, sweeps)):
        changed = False
        for i in active:
            def f1(v, i=i):
                xt = x.copy()
                xt[i] = v
                return obj(xt)
            pts = np.linspace(-L, L, grid)
            vals = [f1(v) for v in pts]
            j = int(np.argmin(vals))
            lo, hi = pts[max(0, j - 1)], pts[min(grid - 1, j + 1)]
            a, b = hi - gr * (hi - lo), lo + gr * (hi - lo)
            fa, fb = f1(a), f1(b)
            for _ in range(golden_iters):
                if fa < fb:
                    hi, b, fb = b, a, fa
                    a = hi - gr * (hi - lo)
                    fa = f1(a)
                else:
                    lo, a, fa = a, b, fb
                    b = lo + gr * (hi - lo)
                    fb = f1(b)
            cand = [(vals[j], pts[j]), (fa, a), (fb, b), (fx, x[i])]
            best_f, best_v = min(cand, key=lambda t: t[0])
            if best_f < fx - 1e-12 and abs(best_v - x[i]) > 1e-9:
                x[i] = float(np.clip(best_v, -L, L))
                fx = obj(x)
                changed = True
        if not changed:
            break
    scales = {g: float(math.exp(x[i])) for i, g in enumerate(names)}
    out_spec = apply_scales(spec, {g: s for g, s in scales.items() if s != 1.0}, groups)
    after = preds(x)
    rows = [{"name": s.name, "family": s.family, "shapes": s.shapes, "measured": s.seconds,
             "before": float(b), "after": float(a)} for s, b, a in zip(samples, base_pred, after)]
    return RefineResult(scales, out_spec, [names[i] for i in active], f0, fx,
                        _summary(base_pred, meas), _summary(after, meas), rows, n_eval[0])


# --------------------------------------------------------------------------- calibration file
def overrides(spec: ArchSpec, fields_: Sequence[str]) -> dict:
    """ArchSpec field -> value for `fields_`, checked positive and finite (ints stay ints)."""
    known = {f.name for f in fields(ArchSpec)}
    out = {}
    for f in fields_:
        if f not in known or f in ("name", "features"):
            raise ValueError(f"{f} is not an overridable ArchSpec field")
        v = getattr(spec, f)
        if not _ok(v):
            raise ValueError(f"{f} = {v!r} is not positive and finite")
        out[f] = v
    return out


def next_version(path: Path) -> int:
    try:
        old = json.loads(Path(path).read_text())
        return int(old.get("version", 0)) + 1
    except (OSError, ValueError, TypeError, AttributeError):
        return 1


def calibration_document(spec: ArchSpec, fitted: Sequence[str], arch: str, gpu: str, version: int,
                         measured: dict, notes: Sequence[str] = ()) -> dict:
    """The JSON object cake_ir.cost.load_constants reads: ArchSpec overrides plus "arch",
    "version", "gpu", "measured" (raw data, provenance) and "notes"."""
    doc = {"arch": arch, "version": int(version), "gpu": gpu}
    doc.update(overrides(spec, fitted))
    doc["measured"] = measured
    doc["notes"] = list(notes)
    return doc


def write_json(path: Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def fit_all(measurements: Sequence[dict], samples: Sequence[Sample], *, arch: str = "sm_90a",
            device: Optional[dict] = None, refine_groups: Optional[dict] = None, ridge: float = 0.02,
            max_factor: float = 4.0) -> dict:
    """direct + refine; returns a dict with the final spec and everything the file records."""
    base = _arch.spec(arch)
    d = direct(measurements, base, device=device)
    spec_direct = d.spec(base)
    rr = refine(spec_direct, samples, refine_groups, ridge=ridge, max_factor=max_factor) if samples else None
    final = rr.spec if rr is not None else spec_direct
    fitted = sorted(set(d.values) | ({f for g, s in rr.scales.items() if s != 1.0 for f in GROUPS.get(g, ())}
                                     if rr is not None else set()))
    return {"base": base, "direct": d, "spec_direct": spec_direct, "refine": rr, "spec": final, "fitted": fitted}


# ------------------------------------------------------------------------------------- CLI
def _samples_from_records(records: Sequence[dict]) -> list[Sample]:
    from .variants import all_variants, refine_set

    make = {v.name: v for v in refine_set()}
    for v in all_variants():
        make.setdefault(v.name, v)
    out = []
    for r in records:
        v = make.get(r.get("name"))
        if v is None or not _ok(r.get("seconds")) or not r.get("correct", True):
            continue
        out.append(Sample(r["name"], v.kernel(), dict(r["shapes"]), float(r["seconds"]), v.family))
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="refit constants from the raw measurements in a calibration file")
    ap.add_argument("--from", dest="src", required=True, help="a calibration JSON written by calibration.run")
    ap.add_argument("--out", default=None, help="where to write (default: print a summary only)")
    ap.add_argument("--no-refine", action="store_true")
    ap.add_argument("--ridge", type=float, default=0.02)
    args = ap.parse_args(argv)
    doc = json.loads(Path(args.src).read_text())
    m = doc.get("measured", {})
    samples = [] if args.no_refine else _samples_from_records(m.get("refine_samples", []))
    res = fit_all(m.get("micro", []), samples, arch=doc.get("arch", "sm_90a"), device=m.get("device"),
                  ridge=args.ridge)
    from .report import constants_table
    print(constants_table(res["base"], res["spec_direct"], res["spec"], res["fitted"]))
    if args.out:
        measured = dict(m)
        measured["direct"] = {"derivations": res["direct"].derivations, "conversions": res["direct"].conversions,
                              "info": res["direct"].info}
        measured["refine"] = res["refine"].to_dict() if res["refine"] else None
        measured["refit"] = {"from": args.src, "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        out = calibration_document(res["spec"], res["fitted"], doc.get("arch", "sm_90a"), doc.get("gpu", "?"),
                                   next_version(Path(args.out)), measured, res["direct"].notes)
        write_json(Path(args.out), out)
        print(f"wrote {args.out} (version {out['version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
