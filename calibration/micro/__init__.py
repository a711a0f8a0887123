"""Microbenchmarks written in CAKE IR, one module per family. `all_micros(sms, quick)` lists them in
the order calibration.run measures them."""
from __future__ import annotations

from . import hbm, l2, latency, launch, simt, smem, tensor

FAMILIES = {"launch": launch, "latency": latency, "hbm": hbm, "l2": l2, "smem": smem, "tensor": tensor,
            "simt": simt}


def all_micros(sms: int = 132, quick: bool = False, only=None) -> list:
    out = []
    for name, mod in FAMILIES.items():
        if only and name not in only:
            continue
        out.extend(mod.micros(sms, quick))
    names = [m.name for m in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuntimeError(f"duplicate microbenchmark names: {sorted(dup)}")
    return out
