"""Launch bounds: the minimum number of resident blocks per SM the compiler must allow."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError

CHOICES = (1, 2, 3, 4)


class MinBlocks(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        if any("regs" in r for r in g["ir"].get("roles") or []):
            return "register budgets are set per role (setmaxnreg); launch bounds would fight them"
        return None

    def choices(self, g: dict) -> list[dict]:
        launch = g["ir"].get("launch") or {}
        cur = launch.get("min_blocks_per_sm", 1)
        threads = int(launch.get("threads", 1))
        return [{"min_blocks": b} for b in CHOICES if b != cur and b * threads <= 2048]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        b = int(params["min_blocks"])
        if b not in CHOICES:
            raise TacticError(f"min_blocks {b} not in {CHOICES}")
        if b == 1:
            ir["launch"].pop("min_blocks_per_sm", None)
        else:
            ir["launch"]["min_blocks_per_sm"] = b
        return ir


TACTICS = [MinBlocks(
    name="min_blocks",
    description="Set the launch bound min_blocks_per_sm (1-4): asks the compiler to cap registers so that "
                "more blocks fit on an SM, trading spills for occupancy and latency hiding.",
    keywords=("occupancy", "latency", "registers", "launch", "waves"),
    params_doc="min_blocks: 1..4 blocks per SM (launch bound)",
)]
