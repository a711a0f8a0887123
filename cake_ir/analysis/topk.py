"""What a `topk` needs to merge sorted lists (`src_sorted`, cake::topk_merge_sorted): one predicate shared by
the verifier rule (E-TOPK-05), the lowering and the tactic that marks such merges (tactics/sorted_merge.py)."""
from __future__ import annotations

from ..nodes import Kernel, TopK
from .tiles import resolve_tile


def sorted_merge_problems(k: Kernel, n: TopK) -> list[tuple[str, str, list]]:
    """(field, why, legal values) for each reason `n`'s operands cannot be merged as sorted lists, whether or not `n`
    claims they are: src must be a per-thread row_major f32 tile [R, k] with src_idx, and the scores the
    entries themselves (scale 1, no biases, no limit). Empty: a bitonic merge per row is well formed."""
    sb = resolve_tile(k, n.src).buffer
    if sb is None or sb.space != "reg" or sb.layout != "row_major" or sb.scope != "thread" or sb.dtype != "f32":
        return [("src/buf", "src_sorted merges per-thread row_major f32 lists", ["row_major f32 (scope thread)"])]
    out = []
    if sb.shape[-1] != n.k:
        out.append(("src/buf", f"src_sorted reads each row of {sb.name!r} as a list of k = {n.k} entries; its "
                               f"rows hold {sb.shape[-1]}", [n.k]))
    if n.src_idx is None:
        out.append(("", "src_sorted lists need their indices (src_idx, i32 of src's shape)", []))
    bad = [f for f in ("scale", "row_bias", "col_bias", "limit")
           if (getattr(n, f) != 1.0 if f == "scale" else getattr(n, f) is not None)]
    if bad:
        out.append((bad[0], f"src_sorted merges the lists' own entries: {', '.join(bad)} would move or drop them",
                    ["scale 1, no biases, no limit"]))
    return out
