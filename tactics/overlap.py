"""wgmma overlap: keep one wgmma group in flight across k-steps (what W-PERF-04 suggests).

In a consumer loop `pipe_wait(it); wgmma_fence; wgmma...; wgmma_commit; wgmma_wait 0; pipe_release(it)`
the warpgroup idles while each k-step's wgmma drains. The rewrite waits with `wgmma_wait 1` (the
previous step's group is then complete) and releases the *previous* stage, then drains after the loop:

    for it: pipe_wait(it); fence; wgmma; commit; wgmma_wait 1; if it > start: pipe_release(it - 1)
    wgmma_wait 0; pipe_release(stop - 1)

Precondition: a loop whose body ends with wgmma_commit, wgmma_wait 0, pipe_release(<loop var>) and
whose start is 0 (the release of the last stage is `stop - 1`).
"""
from __future__ import annotations

import copy
from typing import Optional

from .base import Tactic, TacticError, walk


def _candidate_loops(ir: dict) -> list[tuple[str, dict]]:
    out = []
    for path, st, _ in walk(ir):
        if st.get("op") != "for" or st.get("start", 0) not in (0, "0") or st.get("step", 1) != 1:
            continue
        body = st.get("body") or []
        if len(body) < 3:
            continue
        c, w, r = body[-3], body[-2], body[-1]
        if (c.get("op") == "wgmma_commit" and w.get("op") == "wgmma_wait" and int(w.get("n", 0)) == 0
                and r.get("op") == "pipe_release" and str(r.get("iter")) == st["var"]):
            out.append((path, st))
    return out


def _find(ir: dict, key: str) -> Optional[tuple[list, int, dict]]:
    """(parent list, index, loop) of the loop with id or path `key`."""
    for path, st, _ in walk(ir):
        if st.get("op") == "for" and (st.get("id") == key or path == key):
            parts = path.strip("/").split("/")
            cur = ir
            for p in parts[:-1]:
                cur = cur[int(p)] if isinstance(cur, list) else cur[p]
            return cur, int(parts[-1]), st
    return None


class WgmmaOverlap(Tactic):
    def precondition(self, g: dict) -> Optional[str]:
        return None if _candidate_loops(g["ir"]) else "no wgmma loop that waits 0 and releases its own stage"

    def choices(self, g: dict) -> list[dict]:
        return [{"loop": st.get("id") or path} for path, st in _candidate_loops(g["ir"])]

    def transform(self, ir: dict, params: dict, g: dict) -> dict:
        found = _find(ir, params["loop"])
        if found is None:
            raise TacticError(f"no loop {params['loop']!r}")
        parent, idx, loop = found
        body = loop["body"]
        if not (body[-2].get("op") == "wgmma_wait" and body[-1].get("op") == "pipe_release"):
            raise TacticError("loop does not end with wgmma_wait + pipe_release")
        release = body[-1]
        v = loop["var"]
        body[-2] = {**body[-2], "n": 1}
        body[-1] = {"op": "if", "cond": f"{v} > 0",
                    "then": [{**copy.deepcopy(release), "iter": f"{v} - 1"}]}
        drain = [{"op": "wgmma_wait", "n": 0},
                 {**copy.deepcopy(release), "iter": f"({loop['stop']}) - 1"}]
        drain[1].pop("id", None)
        body[-1]["then"][0].pop("id", None)
        parent[idx + 1:idx + 1] = drain
        return ir


TACTICS = [WgmmaOverlap(
    name="wgmma_overlap",
    description="Keep one wgmma group in flight across k-steps: wait with wgmma_wait 1 and release the "
                "previous pipeline stage instead of draining every step, then drain after the loop. Hides "
                "the tensor-core pipeline latency between consecutive k-steps of a warpgroup.",
    keywords=("W-PERF-04", "wgmma", "latency", "compute", "overlap", "pipeline"),
    step_key=("loop",),
    params_doc="loop: the consumer k-loop (author id or JSON pointer) that ends with wgmma_commit; wgmma_wait 0; "
               "pipe_release",
    archs=("sm_90a",),
)]
