"""Family tactics: re-instantiate a parametrised seed family (tile sizes, warp-role split) and replay
the candidate's IR tactic steps on the result.

Families come from tasks/<task>/programs.py FAMILIES: {"make", "defaults", "space", "check",
"tactics": {tactic name: [params it may change]}}. These tactics apply only to candidates with a
recipe (built from a family); programs written from scratch (e.g. by an LLM) get IR tactics only.
"""
from __future__ import annotations

import copy
import importlib
import itertools
from typing import Optional

from .base import Tactic, TacticError, get_tactic

DEFAULT_GROUPS = {"retile": ["bm", "bn", "bk"], "warp_split": ["warps_m", "warps_n"], "pipeline_depth": ["stages"],
                  "copy_mechanism": ["copy"]}
MAX_CHANGED = 2


def family(recipe: Optional[dict]) -> Optional[dict]:
    if not recipe or not recipe.get("family") or not recipe.get("task"):
        return None
    try:
        mod = importlib.import_module(f"tasks.{recipe['task']}.programs")
    except ImportError:
        return None
    return getattr(mod, "FAMILIES", {}).get(recipe["family"])


def instantiate(fam: dict, params: dict) -> dict:
    from cake_ir.io import to_dict
    return to_dict(fam["make"](**params))


def replay(ir: dict, steps: list[dict]) -> tuple[dict, list[dict], list[dict]]:
    """Apply IR steps in order; returns (ir, kept steps, dropped steps)."""
    kept, dropped = [], []
    for s in steps:
        try:
            t = get_tactic(s["tactic"])
            g = {"ir": ir, "recipe": None}
            if t.precondition(g):
                raise TacticError("precondition")
            ir = t.transform(copy.deepcopy(ir), dict(s["params"]), g)
            kept.append(s)
        except Exception:  # noqa: BLE001 - a step that no longer applies is dropped
            dropped.append(s)
    return ir, kept, dropped


class FamilyTactic(Tactic):
    def group(self, g: dict) -> list[str]:
        fam = family(g.get("recipe"))
        if fam is None:
            return []
        groups = fam.get("tactics", DEFAULT_GROUPS)
        return [p for p in groups.get(self.name, []) if p in fam["space"]]

    def precondition(self, g: dict) -> Optional[str]:
        if family(g.get("recipe")) is None:
            return "the program has no recipe from a parametrised seed family"
        if not self.group(g):
            return f"the family declares no {self.name} parameters"
        return None

    def choices(self, g: dict) -> list[dict]:
        fam, names = family(g.get("recipe")), self.group(g)
        if fam is None or not names:
            return []
        cur = {**fam["defaults"], **g["recipe"].get("params", {})}
        out = []
        for vals in itertools.product(*[fam["space"][n] for n in names]):
            cand = dict(zip(names, vals))
            changed = sum(cand[n] != cur.get(n) for n in names)
            if not 1 <= changed <= MAX_CHANGED:
                continue
            try:
                if not fam.get("check", lambda p: True)({**cur, **cand}):
                    continue
            except Exception:  # noqa: BLE001
                continue
            out.append(cand)
        return out

    def apply(self, g: dict, params: dict) -> dict:
        why = self.precondition(g)
        if why:
            raise TacticError(f"{self.name}: {why}")
        fam, recipe = family(g["recipe"]), g["recipe"]
        new_params = {**fam["defaults"], **recipe.get("params", {}), **params}
        try:
            ir = instantiate(fam, new_params)
        except Exception as e:  # noqa: BLE001 - the generator rejects the combination
            raise TacticError(f"{self.name}{params}: the family generator failed: {type(e).__name__}: {e}") from None
        ir, kept, dropped = replay(ir, recipe.get("steps", []))
        if ir == g["ir"]:
            raise TacticError(f"{self.name}{params}: no change")
        return {"ir": ir, "recipe": {**copy.deepcopy(recipe), "params": new_params, "steps": kept},
                "dropped": dropped}


TACTICS = [
    FamilyTactic(
        name="retile",
        kind="family",
        description="Change the CTA tile sizes (BM, BN, BK) of a GEMM-like kernel built from a seed family and "
                    "replay its IR steps. Bigger tiles raise arithmetic intensity and cut global traffic but "
                    "need more shared memory and registers and leave fewer CTAs per wave.",
        keywords=("memory", "compute", "tile", "waves", "E-RES-01", "intensity", "bandwidth"),
        params_doc="the family's tile parameters (BM, BN, BK), values from the family's search space; at most "
                   "two change at once",
    ),
    FamilyTactic(
        name="warp_split",
        kind="family",
        description="Change how warps split the CTA tile: warps along M and N for mma.sync kernels, or the "
                    "number of wgmma consumer warpgroups (each owning 64 rows) for warp-specialised kernels.",
        keywords=("warp-role", "warps", "consumer", "registers", "E-RES-03", "occupancy", "compute", "issue"),
        params_doc="the family's warp parameters (warps along M / N, or consumer warpgroups), values from the "
                   "family's search space",
    ),
    FamilyTactic(
        name="pipeline_depth",
        kind="family",
        description="Change how many stages (tiles or chunks in flight between a producer and its consumers) "
                    "a pipelined kernel built from a seed family keeps. Deeper hides more load latency; each "
                    "stage costs shared memory, so fewer CTAs fit an SM.",
        keywords=("latency", "stages", "pipeline", "slots", "smem", "occupancy", "E-RES-01"),
        params_doc="the family's stage parameter (stages, or producers where each producer owns a slot), values "
                   "from the family's search space",
    ),
    FamilyTactic(
        name="sequence_parallel",
        kind="family",
        description="Split a long sequential scan (a recurrence over chunks) into segments run in parallel: each "
                    "segment's affine map of the carried state (transition and zero-start end state) is computed "
                    "at once, a short pass chains the segments' start states, and the segments then run again "
                    "from their true starts. About 3x the scan's work over many more CTAs: it pays where few "
                    "long sequences leave SMs idle or latency-bound.",
        keywords=("latency", "serial", "recurrence", "scan", "occupancy", "waves", "long sequence", "state passing"),
        params_doc="the family's segment parameter (chunks per segment, 0 = off), values from the family's "
                   "search space",
    ),
    FamilyTactic(
        name="copy_mechanism",
        kind="family",
        description="Change how a producer (loader) warp built from a seed family moves a stage's tiles into "
                    "shared memory: cp.async (every lane copies 16-byte chunks, then waits for them before it "
                    "signals the stage full) or, on sm_90a, the bulk-copy engine (one instruction per tile, "
                    "completing on the stage's mbarrier as transaction bytes, so the producer never waits for "
                    "its own copies and issues far fewer instructions). Pays where the producer's issue and "
                    "wait per stage are on the critical path.",
        keywords=("copy", "cp.async", "bulk", "TMA", "mbarrier", "transaction bytes", "producer", "latency",
                  "issue", "loader"),
        params_doc="the family's copy parameter (copy: cp_async or bulk), values from the family's search space "
                   "that build on its arch",
    ),
    FamilyTactic(
        name="chunk_size",
        kind="family",
        description="Change the tokens per chunk of a chunked recurrence built from a seed family (e.g. 16 or 32 "
                    "for the two-pass KDA prefill): a longer chunk halves the sequential steps of the state "
                    "recurrence, each step a larger (more parallel, somewhat slower) tensor-core step, for a "
                    "little more prepare work per token. Pays where the recurrence's per-step latency chain binds "
                    "(long sequences, few heads).",
        keywords=("latency", "serial", "recurrence", "chunk", "scan", "sequential steps", "long sequence"),
        params_doc="the family's chunk parameter (tokens per chunk), values from the family's search space",
    ),
    FamilyTactic(
        name="update_mechanism",
        kind="family",
        description="Change how a kernel built from a seed family aggregates values by key in shared memory (a "
                    "scatter-add: the k-means sums per cluster): f32 atomic adds (compare-and-swap loops, there "
                    "is no native f32 shared atomic add; MIO stalls and contention) or a tensor-core product "
                    "(`onehot` builds the transposed one-hot matrix of a tile's keys as an mma A operand, the "
                    "values go in as an ldmatrix.trans B operand, each warp owns whole blocks of the sums in an "
                    "f32 accumulator: no atomics). The product costs as many flops as a GEMM over the keys "
                    "(2 x keys x rows x columns): it pays where the atomics bind (many rows, more than a few keys). "
                    "With `sums: regs` (wgmma k-means) each warp holds its accumulator blocks in registers across "
                    "all its tiles: no shared-memory load / store of the sums per tile and no smem sums at all "
                    "(flushed with red_add from the registers), which frees shared memory for resident operands; "
                    "it needs enough warps that keys x columns x 4 bytes / threads stays near 128 registers.",
        keywords=("atomic", "CAS", "scatter", "scatter_add", "one-hot", "reduction by key", "segment sum",
                  "MIO", "contention", "update", "k-means", "tensor core", "registers", "shared memory traffic"),
        params_doc="the family's update parameters (update: atomic or mma; urows: keys per accumulator block, "
                   "16 or 32; sums: smem or regs, where the family has it), values from the family's search space",
    ),
    FamilyTactic(
        name="topk_queue",
        kind="family",
        description="Defer a fused top-k's insertions (the `topk` queue, kNN): a lane pushes a score that passes "
                    "the row's threshold onto a small register queue instead of inserting it into its sorted list "
                    "on the spot, and the whole warp inserts every lane's queue together once one is half full. "
                    "On the spot, a warp pays a k-step insertion at every column where any of its 32 lanes "
                    "passes (warp divergence); deferred, the lanes share the steps. Pays at large k (16-32) on "
                    "long streams of scores per row (2.4-2.7x at k = 32 on the H200); costs 4 registers per "
                    "entry and row pair and a push per passing column, so at k = 10 or on short few-query "
                    "streams it can lose.",
        keywords=("top-k", "topk", "selection", "divergence", "warp divergence", "insertion", "k-nearest",
                  "knn", "queue", "WarpSelect", "instructions", "issue"),
        params_doc="the family's queue parameter (queue: pending entries per row and lane, 0 = off), values "
                   "from the family's search space",
    ),
    FamilyTactic(
        name="topk_shared_bound",
        kind="family",
        description="When several CTAs (or warps) split one row's candidates (a database split across CTAs), "
                    "let them share the row's selection threshold (the `topk` shared_bound): each publishes its "
                    "own threshold to a per-row global word by an atomic max of an order-preserving key and "
                    "filters with the tightest any CTA has published, read one tile late so the load hides; the "
                    "last CTA resets the words. Alone, every split inserts its own first candidates before its "
                    "threshold tightens. 1.10x geomean over the H200 split searches (up to 1.36x); costs a few "
                    "registers and one word per row that every split's atomics hit (one few-query stream over "
                    "4M rows ran ~20% slower with it).",
        keywords=("threshold", "bound", "shared bound", "split", "split-k", "database split", "few queries",
                  "atomic", "across CTAs"),
        params_doc="the family's share parameter (true: the splits share the bound, false: each its own), from the "
                   "family's search space",
    ),
    FamilyTactic(
        name="topk_sampled_bound",
        kind="family",
        description="Warm-start the selection threshold of a database split from a sample: a first kernel scores "
                    "every F-th tile of the candidates (1 / F of the stream, split the same way) and stores each "
                    "row's k-th best of that sample in the row's bound word (`topk_bound` store); the main pass "
                    "loads the words before its first tile (`topk_bound` load, a fixed `given_bound`) and filters "
                    "every tile with them. "
                    "Exact: the sampled entries are real candidates, scored by the same code. Without it each "
                    "split starts from empty lists and inserts its first candidates before its threshold tightens. "
                    "Measured on the H200 (with the merge kernel): 0.91x the time of the wgmma database splits at "
                    "M >= 256K rows; it costs more than it saves where each split's chunk is short (a handful of "
                    "queries) and on unsplit kernels, whose own lists tighten over hundreds of tiles (all-pairs "
                    "builds over 16K-64K rows lost 3-18% with it). The sample is a pass of its own whose tiles "
                    "insert almost every score (no bound yet): sample sparsely where the stream is long. At 64 "
                    "queries over 4M rows every 32nd tile beat every 8th by 1.22-1.28x (0.79 ms against 1.01): a "
                    "sparser sample still bounds each row near its (k F / M) quantile.",
        keywords=("threshold", "bound", "sample", "sampling", "warm start", "empty list", "split", "database split",
                  "chunk", "first tiles", "sample density", "sparse sample"),
        params_doc="the family's seed parameter (F: every F-th database tile sampled first, 0 = off), values from "
                   "the family's search space",
    ),
    FamilyTactic(
        name="topk_rolled_insertion",
        kind="family",
        description="Shrink a fused top-k's code (the `topk` rolled, kNN): instead of an insertion unrolled at "
                    "every column of the score tile (a copy of the k-step sorted insertion per column and row: "
                    "~9000 SASS instructions in the k = 32 search loop), set the row's passing columns as bits of "
                    "a mask and insert them in one rolled loop (`__ffs`, a select chain reads the score from "
                    "registers). The hot path (no score passes) gains the mask's few instructions; a kernel whose "
                    "loop overflowed the instruction cache (ncu: 'no instruction' stalls) stops stalling on it. "
                    "A nearest-neighbour search slow at large k (16-32), where each copy of the insertion is "
                    "longest, gains most: on the H200 the kNN grid's time fell to 0.62x at k = 32 and 0.85x at "
                    "k = 16 (1.0x at k = 1, "
                    "which has no insertion); the default of the kNN kernels since, the unrolled form kept for "
                    "comparison. A deferred-insertion queue tuned for the unrolled form may no longer pay.",
        keywords=("instruction cache", "i-cache", "icache", "no instruction", "code size", "unroll", "unrolled",
                  "top-k", "topk", "insertion", "k-nearest", "knn", "nearest neighbour", "large k", "stall",
                  "branch"),
        params_doc="the family's rolled parameter (true: one rolled insertion loop per row, false: unrolled per "
                   "column)",
    ),
]
