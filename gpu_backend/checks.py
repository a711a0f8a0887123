"""Output checks (pure numpy, CPU-testable): unwritten elements, NaN/Inf, tolerance.

Order matters: an element still holding the poison pattern was never written ("unwritten_output");
any other NaN/Inf is a computed non-finite value ("nan"); then relative RMSE and max-abs against the
float64 reference ("wrong_result"). NaN never passes.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel

from .memory import from_bits, poison_mask


class OutputCheck(BaseModel):
    name: str
    ok: bool
    error_class: Optional[str] = None
    rel_rmse: Optional[float] = None
    max_abs: Optional[float] = None
    unwritten: int = 0
    nonfinite: int = 0
    elements: int = 0
    first_bad: Optional[list[int]] = None     # index of the first failing element
    message: str = ""


def _first(mask: np.ndarray) -> Optional[list[int]]:
    idx = np.argwhere(mask)
    return [int(i) for i in idx[0]] if idx.size else None


def _rows_summary(mask: np.ndarray) -> str:
    if mask.ndim < 2:
        return ""
    rows = np.flatnonzero(mask.reshape(mask.shape[0], -1).any(axis=1))
    if rows.size == 0:
        return ""
    return f" in {rows.size} of {mask.shape[0]} rows (first {int(rows[0])}, last {int(rows[-1])})"


CHUNK = 1 << 20      # elements per block of the scan: the block's temporaries stay in cache


def _scan(bits: np.ndarray, dtype: str, ref: np.ndarray) -> tuple[int, int, float, float, float]:
    """(unwritten, non-finite, sum of squared errors, sum of squared reference, max abs error) over
    the output, block by block (several times faster than whole-array temporaries on large outputs)."""
    b, r = bits.reshape(-1), np.asarray(ref, dtype=np.float64).reshape(-1)
    unw = bad = 0
    num = den = mabs = 0.0
    for i in range(0, b.size, CHUNK):
        bb, rr = b[i:i + CHUNK], r[i:i + CHUNK]
        unw += int(np.count_nonzero(poison_mask(bb, dtype)))
        with np.errstate(invalid="ignore"):
            out = from_bits(bb, dtype).astype(np.float64)
        fin = np.isfinite(out)
        bad += int(fin.size - np.count_nonzero(fin))
        if bad or unw:
            continue                     # the verdict is decided; the sums are not needed
        d = out - rr
        num += float(np.dot(d, d))
        den += float(np.dot(rr, rr))
        mabs = max(mabs, float(np.max(np.abs(d)))) if d.size else mabs
    return unw, bad, num, den, mabs


def check_output(name: str, bits: np.ndarray, dtype: str, ref: np.ndarray, rel_rmse_tol: float,
                 max_abs_tol: Optional[float] = None) -> OutputCheck:
    """Check one output given its raw device bits, its CAKE dtype and a float64 reference."""
    n = int(bits.size)
    if tuple(bits.shape) != tuple(ref.shape):
        return OutputCheck(name=name, ok=False, error_class="wrong_result", elements=n,
                           message=f"{name}: output shape {bits.shape} != reference shape {ref.shape}")
    n_unw, n_bad, num, den, mabs = _scan(bits, dtype, ref)
    if n_unw:
        unw = poison_mask(bits, dtype)
        return OutputCheck(name=name, ok=False, error_class="unwritten_output", unwritten=n_unw, elements=n,
                           first_bad=_first(unw),
                           message=f"{name}: {n_unw} of {n} elements never written{_rows_summary(unw)}")
    if n_bad:
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(from_bits(bits, dtype).astype(np.float64))
        return OutputCheck(name=name, ok=False, error_class="nan", nonfinite=n_bad, elements=n,
                           first_bad=_first(bad),
                           message=f"{name}: {n_bad} of {n} elements are NaN/Inf{_rows_summary(bad)}")
    numr, denr = float(np.sqrt(num)), float(np.sqrt(den))
    rel = numr / denr if denr > 0 else (0.0 if numr == 0 else float("inf"))
    ok = rel <= rel_rmse_tol and (max_abs_tol is None or mabs <= max_abs_tol)
    res = OutputCheck(name=name, ok=ok, rel_rmse=rel, max_abs=mabs, elements=n)
    if not ok:
        diff = from_bits(bits, dtype).astype(np.float64) - np.asarray(ref, dtype=np.float64)
        res.error_class = "wrong_result"
        worst = np.abs(diff) > (max_abs_tol if max_abs_tol is not None else np.abs(diff).max() * 0.5)
        res.first_bad = _first(worst) if worst.any() else None
        lim = f"rel RMSE {rel:.3g} (tolerance {rel_rmse_tol:g})"
        if max_abs_tol is not None:
            lim += f", max abs error {mabs:.3g} (tolerance {max_abs_tol:g})"
        res.message = f"{name}: {lim}; first large error at {res.first_bad}"
    return res


def check_outputs(bits: dict[str, np.ndarray], dtypes: dict[str, str], refs: dict[str, np.ndarray],
                  rel_rmse_tol: float, max_abs_tol: Optional[float] = None) -> list[OutputCheck]:
    return [check_output(n, bits[n], dtypes[n], refs[n], rel_rmse_tol, max_abs_tol) for n in refs]


def check_written(name: str, bits: np.ndarray, dtype: str) -> Optional[OutputCheck]:
    """The poison / NaN part of check_output alone: a failing OutputCheck, or None when every element
    was written and is finite."""
    n = int(bits.size)
    unw = poison_mask(bits, dtype)
    if unw.any():
        k = int(unw.sum())
        return OutputCheck(name=name, ok=False, error_class="unwritten_output", unwritten=k, elements=n,
                           first_bad=_first(unw), message=f"{name}: {k} of {n} elements never written{_rows_summary(unw)}")
    with np.errstate(invalid="ignore"):
        out = from_bits(bits, dtype).astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        k = int(bad.sum())
        return OutputCheck(name=name, ok=False, error_class="nan", nonfinite=k, elements=n, first_bad=_first(bad),
                           message=f"{name}: {k} of {n} elements are NaN/Inf{_rows_summary(bad)}")
    return None


def run_checks(task, bits: dict[str, np.ndarray], dtypes: dict[str, str], refs: dict[str, np.ndarray],
               inputs: dict, shape: dict) -> list[OutputCheck]:
    """Check a launch's outputs for `task`. A task with its own `check(outputs, refs, inputs, shape)`
    (e.g. recall@k with ties for knn, inertia for kmeans) gets host values after the generic
    unwritten/NaN checks pass; other tasks get check_outputs (rel RMSE / max-abs)."""
    own = getattr(task, "check", None)
    if own is None:
        return check_outputs(bits, dtypes, refs, task.tolerance.rel_rmse, task.tolerance.max_abs)
    for n in refs:
        if n not in bits or tuple(bits[n].shape) != tuple(np.shape(refs[n])):
            got = None if n not in bits else bits[n].shape
            return [OutputCheck(name=n, ok=False, error_class="wrong_result",
                                message=f"{n}: output shape {got} != reference shape {np.shape(refs[n])}")]
        w = check_written(n, bits[n], dtypes[n])
        if w is not None:
            return [w]
    values = {n: from_bits(bits[n], dtypes[n]) for n in bits}
    return list(own(values, refs, inputs, shape))
