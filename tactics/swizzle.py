"""Shared-memory layout of MMA operand tiles: XOR swizzle width, or plain rows with padding."""
from __future__ import annotations

from typing import Optional

from .base import Tactic, TacticError, buffer, ops, param
from .vector import DSIZE

LAYOUTS = (("swizzle_32B", 0), ("swizzle_64B", 0), ("swizzle_128B", 0), ("row_major", 0), ("row_major", 8))
SPAN = {"swizzle_32B": 32, "swizzle_64B": 64, "swizzle_128B": 128}
TMA_SWIZZLE = {"swizzle_32B": "32B", "swizzle_64B": "64B", "swizzle_128B": "128B", "row_major": "none"}


def operand_buffers(ir: dict) -> list[dict]:
    names = []
    for _, st, _ in ops(ir, "ldmatrix"):
        names.append(st["src"]["buf"])
    for _, st, _ in ops(ir, "wgmma"):
        names += [st["a"]["buf"], st["b"]["buf"]]
    out = []
    for n in dict.fromkeys(names):
        b = buffer(ir, n)
        if b is not None and b.get("space") == "smem":
            out.append(b)
    return out


def _current(bufs: list[dict]) -> tuple[str, int]:
    b = bufs[0]
    return b.get("layout", "row_major"), b.get("pad", 0)


class Swizzle(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        bufs = operand_buffers(g["ir"])
        if not bufs:
            return "no shared-memory MMA operand tiles (ldmatrix / wgmma sources)"
        if len({(b.get("layout", "row_major"), b.get("pad", 0)) for b in bufs}) > 1:
            return "operand tiles use different layouts"
        return None

    def choices(self, g: dict) -> list[dict]:
        bufs = operand_buffers(g["ir"])
        row_bytes = min(b["shape"][-1] * DSIZE.get(b["dtype"], 2) for b in bufs)
        tma = any(st.get("kind") == "tma_load" for _, st, _ in ops(g["ir"], "copy"))
        cur = _current(bufs)
        out = []
        for layout, pad in LAYOUTS:
            if (layout, pad) == cur or SPAN.get(layout, 0) > row_bytes or (tma and pad):
                continue
            out.append({"layout": layout, "pad": pad})
        return out

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        layout, pad = params["layout"], int(params.get("pad", 0))
        if (layout, pad) not in LAYOUTS:
            raise TacticError(f"layout {layout} pad {pad} is not one of {LAYOUTS}")
        names = {b["name"] for b in operand_buffers(ir)}
        for b in ir.get("buffers") or []:
            if b["name"] in names:
                if layout == "row_major":
                    b.pop("layout", None)
                else:
                    b["layout"] = layout
                if pad:
                    b["pad"] = pad
                else:
                    b.pop("pad", None)
        for _, st, _ in ops(ir, "copy"):
            if st.get("kind") == "tma_load" and st["dst"]["buf"] in names:
                p = param(ir, st["src"]["buf"])
                if p is not None and p.get("tma"):
                    p["tma"]["swizzle"] = TMA_SWIZZLE[layout]
        return ir


TACTICS = [Swizzle(
    name="swizzle",
    # The text avoids the words "shared", "memory", "bank" and "conflicts" on purpose: tests/
    # test_tactic_library.py checks that a query made of exactly those words finds this tactic by
    # meaning alone (the embedding), not by a shared word.
    description="XOR-permute the on-chip layout of the MMA operand tiles (ldmatrix / wgmma sources) with a "
                "32, 64 or 128-byte swizzle, kept in step with the TMA descriptor's swizzle mode, or pad each "
                "row by 8 elements. Prevents access collisions in the per-block on-chip RAM: threads of a warp "
                "reading down a tile column would otherwise hit one 4-byte column and be serialised.",
    keywords=("smem", "swizzle", "xor", "layout", "padding", "ldmatrix", "wgmma", "E-CPY-02", "E-MMA-02"),
    params_doc="layout: swizzle_32B | swizzle_64B | swizzle_128B | row_major (the swizzle span must not exceed "
               "the tile row's bytes); pad: 0 or 8 elements (row_major only, not with TMA loads)",
)]
