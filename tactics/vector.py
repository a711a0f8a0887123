"""Vector width of memory accesses: cp.async chunk bytes, blocked register tiles, accumulator stores."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError, buffer, ops

DSIZE = {"i8": 1, "u8": 1, "pred": 1, "f16": 2, "bf16": 2, "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8}
ACC_LAYOUTS = ("mma_acc", "wgmma_acc")


def _targets(ir: dict) -> dict:
    t = {}
    cps = [st for _, st, _ in ops(ir, "copy") if st.get("kind") == "cp_async"]
    if cps:
        t["cp_async"] = cps[0].get("vec_bytes", 16)
    blocked = [b for b in ir.get("buffers") or [] if b.get("space") == "reg" and b.get("layout") == "blocked"]
    if blocked:
        t["blocked"] = blocked[0].get("vec", 1)
    acc_st = [st for _, st, _ in ops(ir, "stg")
              if (buffer(ir, st["src"]["buf"]) or {}).get("layout") in ACC_LAYOUTS]
    if acc_st:
        t["acc_store"] = acc_st[0].get("vec_bytes", 16)
    return t


CHOICES = {"cp_async": (4, 8, 16), "blocked": (1, 2, 4, 8), "acc_store": (4, 8, 16)}


class VectorWidth(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        return None if _targets(g["ir"]) else "no cp.async copy, blocked register tile or accumulator store"

    def choices(self, g: dict) -> list[dict]:
        return [{"target": t, "value": v} for t, cur in _targets(g["ir"]).items() for v in CHOICES[t] if v != cur]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        target, v = params["target"], int(params["value"])
        if v not in CHOICES.get(target, ()):
            raise TacticError(f"{target} width {v} not in {CHOICES.get(target)}")
        if target == "cp_async":
            for _, st, _ in ops(ir, "copy"):
                if st.get("kind") == "cp_async":
                    st["vec_bytes"] = v
        elif target == "blocked":
            names = set()
            for b in ir.get("buffers") or []:
                if b.get("space") == "reg" and b.get("layout") == "blocked":
                    b["vec"] = v
                    names.add(b["name"])
            for _, st, _ in ops(ir, "ldg", "stg", "lds", "sts"):
                reg = st["dst"]["buf"] if st["op"] in ("ldg", "lds") else st["src"]["buf"]
                if reg in names:
                    vb = min(16, v * DSIZE.get(buffer(ir, reg)["dtype"], 4))
                    if vb == 16:
                        st.pop("vec_bytes", None)
                    else:
                        st["vec_bytes"] = vb
        elif target == "acc_store":
            for _, st, _ in ops(ir, "stg"):
                if (buffer(ir, st["src"]["buf"]) or {}).get("layout") in ACC_LAYOUTS:
                    st["vec_bytes"] = v
        else:
            raise TacticError(f"unknown target {target!r}")
        return ir


TACTICS = [VectorWidth(
    name="vector_width",
    description="Change the vector width of memory accesses: cp.async chunk bytes (4/8/16), elements per "
                "thread chunk of blocked register tiles (with matching ldg/stg vector bytes), or the "
                "accumulator store width. Wider accesses need fewer instructions but stronger alignment; "
                "a warp's contiguous vector loads use DRAM bandwidth well (coalesced transactions).",
    keywords=("memory", "issue", "E-CPY-04", "E-CPY-01", "alignment", "vector", "bandwidth", "coalescing"),
    step_key=("target",),
    params_doc="target: cp_async | blocked | acc_store; value: cp.async chunk bytes 4 | 8 | 16, blocked register "
               "tile elements per thread chunk 1 | 2 | 4 | 8, accumulator store bytes 4 | 8 | 16",
)]
