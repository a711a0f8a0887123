"""Loop unrolling: `unroll` of the hot loops (loops that move data or issue MMAs)."""
from __future__ import annotations

import re
from typing import Optional

from .base import Tactic, TacticError, find_loop, walk

HOT_OPS = {"copy", "ldg", "stg", "lds", "sts", "ldmatrix", "mma_sync", "wgmma", "map", "reduce"}
FACTORS = (False, 2, 4, True)
MAX_FULL_UNROLL = 16


def _const_value(expr, consts: dict) -> Optional[int]:
    if isinstance(expr, bool):
        return None
    if isinstance(expr, int):
        return expr
    text = str(expr)
    for name, v in sorted(consts.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"\b{re.escape(name)}\b", str(v), text)
    if not re.fullmatch(r"[0-9+\-*/() %]+", text):
        return None
    try:
        return int(eval(text.replace("/", "//"), {"__builtins__": {}}))  # noqa: S307 - digits and operators only
    except Exception:  # noqa: BLE001
        return None


def hot_loops(ir: dict) -> list[tuple[str, dict]]:
    out = []
    for path, st, _ in walk(ir):
        if st.get("op") != "for":
            continue
        body_ops = {s.get("op") for p, s, _ in walk({"roles": [{"body": st.get("body") or []}]})}
        if body_ops & HOT_OPS:
            out.append((path, st))
    return out


def trip_count(st: dict, consts: dict) -> Optional[int]:
    a, b = _const_value(st.get("start", 0), consts), _const_value(st.get("stop"), consts)
    if a is None or b is None:
        return None
    return max(0, -(-(b - a) // int(st.get("step", 1))))


class Unroll(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        return None if hot_loops(g["ir"]) else "no loop that moves data or issues MMAs"

    def choices(self, g: dict) -> list[dict]:
        ir, out = g["ir"], []
        consts = ir.get("consts") or {}
        for path, st in hot_loops(ir):
            trips = trip_count(st, consts)
            if trips is not None and trips <= 1:
                continue
            key = st.get("id") or path
            cur = st.get("unroll", False)
            for f in FACTORS:
                if f == cur or (f is True and (trips is None or trips > MAX_FULL_UNROLL)):
                    continue
                if isinstance(f, int) and not isinstance(f, bool) and trips is not None and f >= trips:
                    continue
                out.append({"loop": key, "unroll": f})
        return out

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        st = find_loop(ir, params["loop"])
        if st is None:
            raise TacticError(f"no loop {params['loop']!r}")
        f = params["unroll"]
        if f is False:
            st.pop("unroll", None)
        else:
            st["unroll"] = f
        return ir


TACTICS = [Unroll(
    name="unroll",
    description="Unroll a hot loop (the main K loop, a copy loop) by 2, 4 or fully, or stop unrolling it. "
                "Unrolling removes loop overhead and lets loads of the next iteration issue early; it "
                "costs registers and instruction cache.",
    keywords=("issue", "latency", "registers", "loop", "instructions"),
    step_key=("loop",),
    params_doc="loop: a for loop (author id or JSON pointer); unroll: 2 | 4 | true (fully, short loops only) | "
               "false (stop unrolling)",
)]
