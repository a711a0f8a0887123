"""Warp-specialised register split: setmaxnreg budgets of the producer and consumer roles (sm_90a)."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError, ops

PRODUCER_REGS = (24, 32, 40, 56)
CONSUMER_REGS = (168, 200, 216, 232, 240)


def _producer_index(ir: dict) -> Optional[int]:
    """The role that issues TMA loads (the producer of a warp-specialised kernel)."""
    names = {r for _, st, r in ops(ir, "copy") if st.get("kind") == "tma_load"}
    for i, role in enumerate(ir.get("roles") or []):
        if role.get("name") in names:
            return i
    return None


class RegisterSplit(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        ir = g["ir"]
        if ir.get("arch") != "sm_90a":
            return "setmaxnreg needs sm_90a"
        roles = ir.get("roles") or []
        if len(roles) < 2 or not any("regs" in r for r in roles):
            return "needs a warp-specialised kernel (two or more roles with register budgets)"
        if _producer_index(ir) is None:
            return "no producer role (a role issuing TMA loads)"
        return None

    def choices(self, g: dict) -> list[dict]:
        ir = g["ir"]
        pi = _producer_index(ir)
        roles = ir["roles"]
        cur_p = roles[pi].get("regs")
        cur_c = next((r.get("regs") for i, r in enumerate(roles) if i != pi), None)
        return [{"producer": p, "consumer": c} for p in PRODUCER_REGS for c in CONSUMER_REGS
                if (p, c) != (cur_p, cur_c)]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        p, c = int(params["producer"]), int(params["consumer"])
        if p % 8 or c % 8 or not (24 <= p <= 256 and 24 <= c <= 256):
            raise TacticError("register budgets are multiples of 8 in [24, 256]")
        pi = _producer_index(ir)
        for i, role in enumerate(ir["roles"]):
            role["regs"] = p if i == pi else c
        return ir


TACTICS = [RegisterSplit(
    name="register_split",
    description="Rebalance the warp-role register split of a warp-specialised sm_90a kernel: setmaxnreg "
                "budgets of the TMA producer role and the MMA consumer roles. Consumers need registers for "
                "accumulators; the total per block must fit the register file.",
    keywords=("E-RES-03", "registers", "spill", "setmaxnreg", "warp-role", "producer", "consumer", "occupancy"),
    params_doc="producer: 24 | 32 | 40 | 56 registers; consumer: 168 | 200 | 216 | 232 | 240 registers",
    archs=("sm_90a",),
)]
