"""Pipeline depth: the number of stages of the staged shared-memory ring (const S)."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError, buffers, in_loop, ops

STAGE_CHOICES = range(2, 9)


class Stages(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        ir = g["ir"]
        S = (ir.get("consts") or {}).get("S")
        if not isinstance(S, int):
            return "no const S: slot expressions must use a const S for the stage count"
        staged = [b for b in buffers(ir) if b.get("space") == "smem" and b.get("stages", 1) > 1]
        if not staged:
            return "no staged shared-memory buffers"
        if any(b.get("stages") != S for b in staged):
            return "staged buffers disagree with const S"
        if any(p.get("stages") != S for p in ir.get("pipelines") or []):
            return "a pipeline's stages disagree with const S"
        return None

    def choices(self, g: dict) -> list[dict]:
        S = (g["ir"].get("consts") or {}).get("S")
        return [{"S": s} for s in STAGE_CHOICES if s != S]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        old, new = ir["consts"]["S"], int(params["S"])
        if not 1 < new <= 16:
            raise TacticError(f"stages {new} out of range (2..16)")
        ir["consts"]["S"] = new
        for b in ir.get("buffers") or []:
            if b.get("space") == "smem" and b.get("stages", 1) == old:
                b["stages"] = new
        for p in ir.get("pipelines") or []:
            p["stages"] = new
        # A cp.async ring waits (inside its main loop) for all but the S-2 newest groups.
        if any(st.get("kind") == "cp_async" for _, st, _ in ops(ir, "copy")):
            for path, st, _ in ops(ir, "cp_async_wait"):
                if in_loop(ir, path) and st.get("n", 0) == old - 2:
                    st["n"] = new - 2
        return ir


TACTICS = [Stages(
    name="stages",
    description="Change the pipeline depth: the number of stages S of the staged shared-memory ring "
                "(buffers, pipeline, cp.async wait depth). More stages overlap the copies of later tiles with "
                "compute on earlier ones: more TMA or cp.async loads in flight hide global-load latency. "
                "They cost shared memory and occupancy; fewer stages free shared memory.",
    keywords=("latency", "E-RES-01", "smem", "shared memory", "pipeline", "stage", "occupancy", "prefetch"),
    params_doc="S: 2..8 stages (const S; every staged buffer and pipeline follows it)",
)]
