"""CTA size of single-role kernels whose tiles are CTA-wide (e.g. one row per CTA): warps per CTA."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError

CHOICES = (1, 2, 4, 8, 16, 32)
WARP_LAYOUTS = {"mma_a", "mma_b", "mma_acc", "wgmma_acc"}


class CtaWarps(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        ir = g["ir"]
        roles = ir.get("roles") or []
        if len(roles) != 1 or "regs" in roles[0]:
            return "needs exactly one role without a register budget"
        threads = int((ir.get("launch") or {}).get("threads", 0))
        if roles[0].get("warps") != [0, threads // 32] or threads % 32:
            return "the role must span the whole CTA"
        for b in ir.get("buffers") or []:
            if b.get("layout") in WARP_LAYOUTS or b.get("scope") in ("warp", "warpgroup"):
                return f"buffer {b.get('name')} is laid out per warp; its tiling depends on the warp count"
        return None

    def choices(self, g: dict) -> list[dict]:
        cur = int(g["ir"]["launch"]["threads"]) // 32
        return [{"warps": w} for w in CHOICES if w != cur]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        w = int(params["warps"])
        if w not in CHOICES:
            raise TacticError(f"warps {w} not in {CHOICES}")
        ir["launch"]["threads"] = 32 * w
        ir["roles"][0]["warps"] = [0, w]
        return ir


TACTICS = [CtaWarps(
    name="cta_warps",
    description="Change the number of warps of a single-role kernel whose register tiles are CTA-wide "
                "(one row per CTA): more warps split the row finer (fewer registers per thread, a larger "
                "cross-warp reduction); fewer warps give each thread more elements.",
    keywords=("occupancy", "registers", "reduction", "threads", "warps", "latency", "softmax", "row"),
    params_doc="warps: 1 | 2 | 4 | 8 | 16 | 32 warps per CTA (threads = 32 x warps)",
)]
