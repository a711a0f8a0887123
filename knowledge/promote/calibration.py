"""Promote clusters of large cost-model error into a new calibration version (calibration/data/<gpu>.json).

Evidence: candidates with a measured time (profile stage, on `cfg.gpu` where the record names the
device). Each one is re-estimated with the *current* constants (cake_ir.cost.load_constants(gpu)) on
the shape it was timed on, so the error e = ln(measured / predicted) is the present model's, not the
one of the run that stored `predicted_s`.

Clusters: (binding term, compute unit) where the unit is wgmma / mma_sync / simt from the program's
ops. A cluster is flagged when it has >= cfg.min_count members and |median e| > cfg.max_error. Each
flagged cluster names the constants that decide its binding term (GROUP_OF, the groups of
calibration/fit.py: memory = hbm_bw + l2_bw, wgmma / mma_sync tensor rates, simt = fp32 + sfu rates,
issue = smem bandwidth + clock, latency = load latencies + mbarrier round trip + launch overhead).

Refit: calibration.fit.refine over *all* measured samples with only the flagged groups free (one
multiplicative factor per group, ridge towards 1, |ln f| <= ln MAX_FACTOR), so a factor that helps one
cluster but hurts the rest is not chosen. Then every sample is re-estimated with the new constants; the
proposal is made only when the flagged clusters' median |e| drops and the overall median |e| does not
rise.

Files: the calibration file with version + 1, the scaled constants and a `provenance` entry; the
evidence (IRs, shapes, measured times, old and new constants) as calibration/evidence/<gpu>_v<N>.json;
a test that loads the file with load_constants and re-checks the error drop with the cost model.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from .base import Proposal, PromoteConfig, fingerprint

MAX_FACTOR = 8.0        # a refit may scale a constant group by at most this (or its inverse)
MIN_GAIN = 0.05         # flagged clusters' median |e| must drop by at least this (nats)
NON_CONSTANTS = ("arch", "version", "gpu", "measured", "notes", "provenance")

# (binding term, unit) -> constant groups of calibration.fit.GROUPS that decide that term.
GROUP_OF = {
    "memory": ("memory",),
    "issue": ("issue",),
    "latency": ("latency", "launch"),
    ("compute", "wgmma"): ("wgmma",),
    ("compute", "mma_sync"): ("mma_sync",),
    ("compute", "simt"): ("simt",),
}


def groups_for(bound: str, unit: str) -> tuple:
    return GROUP_OF.get((bound, unit)) or GROUP_OF.get(bound) or ()


def unit_of(ir: dict) -> str:
    from tactics.base import walk

    opset = {st.get("op") for _, st, _ in walk(ir)}
    return "wgmma" if "wgmma" in opset else "mma_sync" if "mma_sync" in opset else "simt"


# ------------------------------------------------------------------------------ evidence
def _device_ok(result: Any, gpu: str) -> bool:
    dev = (result or {}).get("device") if isinstance(result, dict) else None
    return not isinstance(dev, str) or gpu.lower() in dev.lower().replace(" ", "").replace("-", "")


def _shape(result: Any, task: str) -> Optional[dict]:
    """The shape the profile stage timed, else the task's bench shape."""
    if isinstance(result, dict):
        for t in result.get("timings") or []:
            if isinstance(t, dict) and isinstance(t.get("shape"), dict):
                return dict(t["shape"])
    try:
        from tasks import registry
        return registry.get(task).bench_shape
    except Exception:  # noqa: BLE001 - a task that is gone: no shape, no sample
        return None


def measured_samples(store, cfg: PromoteConfig) -> list[dict]:
    """One sample per (IR hash, shape): the median measured time over runs."""
    from sqlmodel import select

    from ..models import CandidateRow, EvaluationRow, RunRow, TaskRow

    with store.session() as s:
        q = (select(CandidateRow, TaskRow.name, EvaluationRow)
             .join(RunRow, CandidateRow.run_id == RunRow.id).join(TaskRow, RunRow.task_id == TaskRow.id)
             .join(EvaluationRow, (EvaluationRow.candidate_id == CandidateRow.id) & (EvaluationRow.stage == "profile"),
                   isouter=True)
             .where(CandidateRow.measured_s != None, CandidateRow.predicted_s != None)  # noqa: E711
             .order_by(CandidateRow.id))
        if cfg.task:
            q = q.where(TaskRow.name == cfg.task)
        rows = list(s.exec(q))
    out: dict[str, dict] = {}
    for c, task, ev in rows:
        res = ev.result if ev is not None else None
        if not (isinstance(c.ir, dict) and c.measured_s and c.measured_s > 0 and _device_ok(res, cfg.gpu)):
            continue
        shape = _shape(res, task)
        if shape is None:
            continue
        key = json.dumps([c.hash, shape], sort_keys=True)
        d = out.setdefault(key, {"hash": c.hash, "name": c.name, "task": task, "ir": c.ir, "shapes": shape,
                                 "times": [], "runs": [], "stored_predicted_s": c.predicted_s,
                                 "stored_bound": (c.cost or {}).get("bound") if isinstance(c.cost, dict) else None})
        d["times"].append(float(c.measured_s))
        d["runs"].append(c.run_id)
    for d in out.values():
        d["measured_s"] = float(statistics.median(d.pop("times")))
    return list(out.values())


# ------------------------------------------------------------------------------ fit
def _abs_err(pred: float, meas: float) -> float:
    return abs(math.log(meas / pred)) if pred > 0 and meas > 0 else float("inf")


def _median(xs: list) -> Optional[float]:
    return float(statistics.median(xs)) if xs else None


def constant_overrides(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in NON_CONSTANTS}


def propose(store, cfg: PromoteConfig, data_dir: Optional[Path] = None) -> list[Proposal]:
    from calibration.fit import GROUPS, Sample, refine
    from cake_ir import arch as _arch
    from cake_ir.cost import CALIBRATION_DIR, GPU_ARCH, estimate
    from cake_ir.io import load

    samples = measured_samples(store, cfg)
    if not samples:
        return []
    data_dir = Path(data_dir or CALIBRATION_DIR)
    path = data_dir / f"{cfg.gpu.lower()}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"arch": GPU_ARCH.get(cfg.gpu.lower()), "version": 0,
                                                               "gpu": cfg.gpu.lower()}
    arch = doc.get("arch")
    if arch not in _arch.ARCH_TABLE:
        return []
    old_over = constant_overrides(doc)
    old_spec = _arch.with_overrides(arch, **old_over)

    # Re-estimate with the current constants; cluster by (binding term, unit).
    usable = []
    for smp in samples:
        kernel, _ = load(smp["ir"])
        if kernel is None:
            continue
        rep = estimate(kernel, smp["shapes"], old_spec)
        if not rep.seconds > 0:
            continue
        smp.update(kernel=kernel, before_s=rep.seconds, bound=rep.bound, unit=unit_of(smp["ir"]))
        smp["cluster"] = f"{rep.bound}/{smp['unit']}"
        usable.append(smp)
    clusters: dict[str, list[dict]] = {}
    for smp in usable:
        clusters.setdefault(smp["cluster"], []).append(smp)
    flagged = {}
    for name, members in clusters.items():
        med = statistics.median(math.log(m["measured_s"] / m["before_s"]) for m in members)
        groups = groups_for(members[0]["bound"], members[0]["unit"])
        if len(members) >= cfg.min_count and abs(med) > cfg.max_error and groups:
            flagged[name] = groups
    if not flagged:
        return []
    free = sorted({g for gs in flagged.values() for g in gs})
    fit = refine(old_spec, [Sample(m["name"], m["kernel"], m["shapes"], m["measured_s"], m["task"]) for m in usable],
                 {g: GROUPS[g] for g in free}, max_factor=MAX_FACTOR, sweeps=2, grid=13, golden_iters=8)
    changed = sorted({f for g, sc in fit.scales.items() if sc != 1.0 for f in GROUPS[g]})
    if not changed:
        return []
    new_over = dict(old_over)
    for f in changed:
        v = getattr(fit.spec, f)
        new_over[f] = int(round(v)) if isinstance(getattr(old_spec, f), int) else float(v)
    new_spec = _arch.with_overrides(arch, **new_over)

    # Honest after-error: the cost model re-run with the new constants on every recorded IR/shape.
    for m in usable:
        m["after_s"] = estimate(m["kernel"], m["shapes"], new_spec).seconds
    per_cluster = {}
    for name, members in sorted(clusters.items()):
        per_cluster[name] = {
            "members": len(members), "flagged": name in flagged, "groups": list(groups_for(members[0]["bound"],
                                                                                          members[0]["unit"])),
            "median_log_error_before": float(statistics.median(math.log(m["measured_s"] / m["before_s"]) for m in members)),
            "median_log_error_after": float(statistics.median(math.log(m["measured_s"] / m["after_s"]) for m in members)),
            "median_abs_before": _median([_abs_err(m["before_s"], m["measured_s"]) for m in members]),
            "median_abs_after": _median([_abs_err(m["after_s"], m["measured_s"]) for m in members])}
    fl = [m for m in usable if m["cluster"] in flagged]
    fl_before = _median([_abs_err(m["before_s"], m["measured_s"]) for m in fl])
    fl_after = _median([_abs_err(m["after_s"], m["measured_s"]) for m in fl])
    all_before = _median([_abs_err(m["before_s"], m["measured_s"]) for m in usable])
    all_after = _median([_abs_err(m["after_s"], m["measured_s"]) for m in usable])
    if not (fl_after < fl_before - MIN_GAIN and all_after <= all_before + 1e-9):
        return []    # the refit does not help enough on the evidence: no proposal

    version = int(doc.get("version") or 0) + 1
    gpu = cfg.gpu.lower()
    fp = fingerprint("calibration", gpu, int(doc.get("version") or 0), sorted(flagged),
                     sorted((m["hash"], json.dumps(m["shapes"], sort_keys=True)) for m in fl))
    scales = {g: fit.scales[g] for g in free}
    evidence = {
        "gpu": gpu, "arch": arch, "version": version, "previous_version": int(doc.get("version") or 0),
        "max_error": cfg.max_error, "min_count": cfg.min_count, "flagged": sorted(flagged), "scales": scales,
        "changed": {f: {"before": getattr(old_spec, f), "after": new_over[f]} for f in changed},
        "clusters": per_cluster, "samples": len(usable),
        "median_abs_log_error": {"flagged_before": fl_before, "flagged_after": fl_after,
                                 "all_before": all_before, "all_after": all_after},
        "runs": sorted({r for m in usable for r in m["runs"]}), "tasks": sorted({m["task"] for m in usable})}
    new_doc = dict(doc)
    new_doc.update({k: new_over[k] for k in changed})
    new_doc["version"] = version
    new_doc["gpu"] = doc.get("gpu", gpu)
    prov = list(doc.get("provenance") or [])
    prov.append({"version": version, "source": f"promotion:calibration-{fp[:8]}", "previous_version": evidence["previous_version"],
                 "scales": scales, "changed": evidence["changed"], "flagged": evidence["flagged"],
                 "median_abs_log_error": evidence["median_abs_log_error"], "samples": len(usable),
                 "evidence": f"calibration/evidence/{gpu}_v{version}.json"})
    new_doc["provenance"] = prov
    data = {"gpu": gpu, "arch": arch, "version": version, "flagged": sorted(flagged),
            "old_overrides": old_over, "new_overrides": new_over,
            "samples": [{"name": m["name"], "hash": m["hash"], "task": m["task"], "cluster": m["cluster"],
                         "shapes": m["shapes"], "measured_s": m["measured_s"], "before_s": m["before_s"],
                         "after_s": m["after_s"], "ir": m["ir"]} for m in usable]}
    rel_file = _relative(path)
    files = {rel_file: json.dumps(new_doc, indent=1) + "\n",
             f"calibration/evidence/{gpu}_v{version}.json": json.dumps(data, indent=1, sort_keys=True) + "\n",
             f"tests/test_calibration_{gpu}_v{version}.py": _test_text(gpu, version, rel_file)}
    title = (f"calibration {gpu} v{version}: refit {', '.join(free)} for {', '.join(sorted(flagged))} "
             f"(median |ln error| {fl_before:.2f} -> {fl_after:.2f})")
    return [Proposal(kind="calibration", title=title, fingerprint=fp, files=files, evidence=evidence)]


def _relative(path: Path) -> str:
    """The repo-relative path of the calibration file (calibration/data/<gpu>.json)."""
    from cake_ir.cost import CALIBRATION_DIR
    try:
        return str(path.resolve().relative_to(CALIBRATION_DIR.parent.parent))
    except ValueError:
        return f"calibration/data/{path.name}"


def _test_text(gpu: str, version: int, rel_file: str) -> str:
    return f'''"""Generated by knowledge/promote/calibration.py: calibration {gpu} v{version} lowers the cost model's
error on the recorded evidence (re-estimated here with cake_ir.cost, old constants vs new)."""
import json
import math
import statistics
from pathlib import Path

from cake_ir.arch import with_overrides
from cake_ir.cost import estimate, load_constants
from cake_ir.io import load

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "calibration" / "evidence" / "{gpu}_v{version}.json").read_text())
FILE = ROOT / {rel_file!r}


def _current_is_this_version():
    return json.loads(FILE.read_text()).get("version") == DATA["version"]


def _new_spec():
    # While this version is the active file, test what load_constants reads; once superseded, the
    # constants this version proposed.
    if _current_is_this_version():
        return load_constants(str(FILE))
    return with_overrides(DATA["arch"], **DATA["new_overrides"])


def _median_abs_error(spec, samples):
    errs = []
    for s in samples:
        kernel, diags = load(s["ir"])
        assert kernel is not None, [d.message for d in diags]
        pred = estimate(kernel, s["shapes"], spec).seconds
        errs.append(abs(math.log(s["measured_s"] / pred)))
    return statistics.median(errs)


def test_file_loads_with_this_version():
    doc = json.loads(FILE.read_text())
    assert doc["version"] >= DATA["version"]
    spec = load_constants(str(FILE))
    if doc["version"] == DATA["version"]:
        for field, value in DATA["new_overrides"].items():
            assert math.isclose(getattr(spec, field), value, rel_tol=1e-12), field


def test_error_drops_on_recorded_evidence():
    old = with_overrides(DATA["arch"], **DATA["old_overrides"])
    new = _new_spec()
    flagged = [s for s in DATA["samples"] if s["cluster"] in DATA["flagged"]]
    assert flagged
    assert _median_abs_error(new, flagged) < _median_abs_error(old, flagged)
    assert _median_abs_error(new, DATA["samples"]) <= _median_abs_error(old, DATA["samples"]) + 1e-9
'''


def on_accept(repo: Path, row, store=None) -> Optional[int]:
    """After an accepted calibration proposal is merged: record the merged file's constants as the
    GPU's active CalibrationRow (source promotion:<id>; other versions of that GPU inactive).

    The merged file is what the cost model reads (load_constants), so the row is bookkeeping; without
    a store nothing is written. Returns the row id."""
    if store is None:
        return None
    from sqlmodel import select

    from ..models import CalibrationRow

    ev = row.evidence or {}
    gpu, version = ev.get("gpu"), ev.get("version")
    path = Path(repo) / "calibration" / "data" / f"{gpu}.json"
    if not gpu or version is None or not path.is_file():
        return None
    doc = json.loads(path.read_text())
    with store.session() as s:
        for other in s.exec(select(CalibrationRow).where(CalibrationRow.gpu == gpu)):
            other.active = False
            s.add(other)
        rec = s.exec(select(CalibrationRow).where(CalibrationRow.gpu == gpu,
                                                  CalibrationRow.version == int(doc.get("version", version)))).first()
        if rec is None:
            rec = CalibrationRow(gpu=gpu, version=int(doc.get("version", version)))
        rec.constants, rec.source, rec.active = constant_overrides(doc), f"promotion:{row.id}", True
        rec.evidence = {k: ev.get(k) for k in ("flagged", "scales", "changed", "median_abs_log_error", "samples")}
        s.add(rec)
        s.commit()
        return rec.id
