"""Same-run A/B of a kNN build option at the kernels the committed dispatch table picks, each build
checked against float64 (bench/lib_grid.py `knn_check`, poisoned outputs) and timed with CUDA events
(median, L2 flushed), the builds alternating per shape; the first value is the baseline. All builds are
compiled in parallel first. Prints a table last and writes JSON with the GPU and versions.
- `--option queue` (the default): the deferred top-k insertion, T = 0 (insertion on the
  spot) against T = 2, 4, 8 pending entries per row and lane (`topk` queue_vals / queue_idx);
- `--option share --values 0,1`: the split's CTAs sharing each query's bound of its
  k-th best (`topk` shared_bound) off and on;
- `--option skip_pad`: the query rows past Q entering the insertion (0) or not (1,
  `topk` valid_rows);
- `--option seed --values 0,8,32`: no sampling kernel (0) against one that scores every
  F-th database tile first and leaves each query's k-th best of it as the search's starting bound;
- `--option merge --values wide,kernel,kernel_sd8`: the split path's last-CTA merge against a
  merge kernel of its own (a warp per query), the latter also with the sampled bound (`_sd{F}`);
- `--option norms --values global,tile`: the wgmma kernels' database norms from a first kernel
  (a read of the whole database) against norms reduced from each staged tile;
- `--option rolled --values 0,1`: an unrolled insertion per column against one rolled loop per row
  over its passing scores (`topk` rolled: the instruction cache).
`--variant A,B` A/Bs the named variants (bench/lib_grid.py knn_variants, in their per-call form) at every shape
that supports them instead of the table's picks, e.g. a family the table does not pick yet (once the
queue on the wgmma builds, which ran with T = 0 at k = 16 / 32 where the mma.sync build's T = 2 bought 1.2-2.4x).
    python bench/topk_queue_ab.py [--option queue|share|skip_pad] [--values 0,2,4,8] [--out FILE] [--deadline-s S]
                                  [--shapes JSON] [--compile-only]
- `--option merge --values kernel,rows` / `kernel,tail`: the merge kernel against a one-launch merge (the
  last-CTA merge over the real query rows; the tile's last CTAs a warp per row, `arrive_wait`), at the
  few-query stream picks (`--fit-merge-form FORM` takes its Q range from it).
Fitting the queue table (cakelib/tables/topk_queue/knn.json) from such a run, on any machine:
    python bench/topk_queue_ab.py --fit bench/results/topk-queue-ab-h200.json
and the split path's options (cakelib/tables/split_options/knn.json: merge kernel, sampled bound):
    python bench/topk_queue_ab.py --fit-merge bench/results/topk-merge-ab-h200.json
    python bench/topk_queue_ab.py --fit-merge-form rows|tail FILE     (a one-launch merge's Q range, the same file)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

M1 = 1 << 20
# the regimes of the grid where k >= 10 loses or wins narrowly (bench/results/lib-grid-knn-h200.json):
# few queries (split streams), the mid-Q split wgmma, many queries (unsplit), the builds (Q = M)
SHAPES = [{"Q": 1, "M": M1, "k": 16}, {"Q": 1, "M": M1, "k": 32}, {"Q": 16, "M": 262144, "k": 16},
          {"Q": 64, "M": M1, "k": 10}, {"Q": 64, "M": M1, "k": 16}, {"Q": 128, "M": M1, "k": 16},
          {"Q": 256, "M": M1, "k": 16}, {"Q": 512, "M": 262144, "k": 16}, {"Q": 1024, "M": M1, "k": 10},
          {"Q": 1024, "M": M1, "k": 16}, {"Q": 1024, "M": M1, "k": 32}, {"Q": 4096, "M": 262144, "k": 16},
          {"Q": 10000, "M": M1, "k": 16}, {"Q": 16384, "M": 16384, "k": 32}, {"Q": 32768, "M": 32768, "k": 16},
          {"Q": 32768, "M": 32768, "k": 32}]

# the shared bound: the shapes where the table picks a split kernel at k > 1 (the grid's
# k >= 10 losses: few queries, Q = 64 - 128, the mid-Q split wgmma), M from 100K to 4M
SHARE_SHAPES = [{"Q": q, "M": m, "k": k} for q, m, k in (
    (1, 100000, 10), (1, M1, 10), (1, 100000, 16), (1, M1, 16), (1, 4 * M1, 16), (1, M1, 32), (8, 262144, 16),
    (16, 262144, 16), (32, 262144, 16), (32, M1, 10), (64, 100000, 10), (64, M1, 16), (64, M1, 32),
    (128, 100000, 10), (128, M1, 10), (128, 262144, 16), (128, 4 * M1, 16), (256, M1, 16), (512, 262144, 16),
    (1024, 262144, 16), (1024, M1, 10), (2048, 262144, 16), (4096, 262144, 16), (1024, M1, 32))]

# the padded query rows: few queries in a 16-row tile, k > 1
PAD_SHAPES = [{"Q": q, "M": m, "k": k} for q, m, k in (
    (1, 100000, 10), (1, 100000, 16), (1, 262144, 16), (1, M1, 10), (1, M1, 16), (1, 4 * M1, 16), (1, M1, 32),
    (2, 100000, 16), (4, 262144, 16), (8, 100000, 10), (8, 262144, 16), (8, M1, 16), (16, 100000, 16),
    (37, 262144, 16), (100, M1, 16), (1000, 262144, 16))]

# the wgmma kernels' database norms: the shapes whose pick is a wgmma kernel, from the
# database-bound searches (Q = 64 - 128, M >= 1M: the norms kernel reads as many bytes as the search) to the
# compute-bound builds
NORMS_SHAPES = [{"Q": q, "M": m, "k": k} for q, m, k in (
    (64, 4 * M1, 1), (64, M1, 1), (64, 4 * M1, 10), (64, 262144, 16), (128, 100000, 1), (128, 4 * M1, 1),
    (128, M1, 10), (128, 100000, 16), (256, M1, 10), (256, 4 * M1, 16), (512, 262144, 10), (1024, 100000, 16),
    (1024, 4 * M1, 10), (2048, M1, 16), (4096, 262144, 10), (10000, M1, 10), (16384, 16384, 2), (32768, 32768, 8))]

# the sampled starting bound: every regime with k > 1 (few queries, Q = 64 - 128, the mid-Q
# split wgmma, the unsplit builds), the grid's slowest shapes first
SEED_SHAPES = [{"Q": q, "M": m, "k": k} for q, m, k in (
    (128, 100000, 10), (128, 100000, 16), (64, 4 * M1, 16), (64, 4 * M1, 10), (128, 262144, 16), (128, 262144, 10),
    (32, 262144, 16), (1, 100000, 16), (16, 100000, 16), (1, 100000, 10), (64, 100000, 10), (256, 100000, 10),
    (1024, 100000, 16), (4096, 100000, 16), (2048, 262144, 16), (512, 262144, 16), (64, M1, 16), (128, M1, 16),
    (1024, M1, 16), (1, M1, 16), (1, 4 * M1, 16), (1024, M1, 10), (4096, M1, 10), (32768, 32768, 16),
    (16384, 16384, 32), (32768, 32768, 32), (10000, M1, 16), (10000, M1, 32))]

# the merge kernel: the split picks at Q = 1 - 4096 (the last-CTA merge ran ~190 of 248 us at
# Q = 128, M = 100K, k = 10), k = 1 too (its lists are one entry)
MERGE_SHAPES = [{"Q": q, "M": m, "k": k} for q, m, k in (
    (128, 100000, 10), (128, 100000, 16), (128, 262144, 10), (128, 262144, 16), (128, M1, 10), (128, 4 * M1, 16),
    (64, 100000, 10), (64, 100000, 16), (64, M1, 10), (64, 4 * M1, 16), (256, 100000, 10), (256, 262144, 16),
    (256, M1, 16), (512, 100000, 16), (512, 262144, 10), (1024, 100000, 16), (1024, M1, 16), (2048, 262144, 16),
    (4096, 100000, 16), (1, 100000, 10), (1, 100000, 16), (1, M1, 16), (1, 4 * M1, 10), (16, 100000, 16),
    (16, 262144, 10), (32, M1, 16), (128, 100000, 1), (128, M1, 1), (512, 262144, 1), (1, M1, 1))]

# a queue must beat insertion on the spot by this much in the same run to be kept (the A/B's repeat
# medians agree to ~1-2 %)
FIT_MARGIN = 0.97


def fit(ab_paths: list[str], table_path: str) -> dict:
    """variant name (cakelib.variants.knn_queue_key of a row's params: merge and norms forms pooled, a sampled
    bound apart) -> {k: T}: per measured (variant, k) the queue width with the best geometric mean of
    its median over T = 0's across the shapes measured, when that beats FIT_MARGIN, else 0
    (cakelib.variants.knn_queue reads it). A width that failed at some shape is not a candidate. A later
    file's (variant, k) replaces the earlier files' measurements of it (a re-measurement)."""
    import math
    from cakelib.variants import knn_queue_key
    ratios: dict = {}
    key_of = lambda r: knn_queue_key(r["params"]) if "params" in r else r["variant"]  # noqa: E731
    for path in ab_paths:
        rows = json.load(open(path))["rows"]
        for key in {(key_of(r), str(r["shape"]["k"])) for r in rows}:
            ratios.pop(key, None)
        for r in rows:
            b0 = r["builds"].get("0", r["builds"].get(0, {}))
            if not b0.get("ok"):
                continue
            key = (key_of(r), str(r["shape"]["k"]))
            for q, b in r["builds"].items():
                ratios.setdefault(key, {}).setdefault(int(q), []).append(b["ms"] / b0["ms"] if b.get("ok") else None)
    table: dict = {}
    for (name, k), by_q in ratios.items():
        gm = {q: math.exp(sum(map(math.log, v)) / len(v)) for q, v in by_q.items() if q and None not in v}
        best = min(gm, key=gm.get) if gm else 0
        table.setdefault(name, {})[k] = best if best and gm[best] < FIT_MARGIN else 0
    doc = {"about": "deferred top-k insertion: queue width T per kNN variant and k, fitted by bench/topk_queue_ab.py "
                    "--fit from same-run A/B results (T = 0: insertion on the spot); a k not listed takes the entry "
                    "of the largest listed k below it",
           "sources": ab_paths, "margin": FIT_MARGIN, "queues": {n: dict(sorted(v.items(), key=lambda e: int(e[0])))
                                                                 for n, v in sorted(table.items())}}
    with open(table_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return doc


def fit_merge(ab_path: str, table_path: str) -> dict:
    """The split path's options from a `--option merge` A/B (values wide, kernel, kernel_sd{F}): the merge
    kernel for the k classes (k = 1, k > 1) whose geometric-mean time ratio kernel / wide beats
    FIT_MARGIN; the sampled bound for the family (mma) and the smallest M threshold among the measured
    ones that gives the best geometric mean of min-time ratios over the family's rows with k > 1 (rows
    below the threshold keep the merge kernel alone), kept when that beats FIT_MARGIN. Written to
    cakelib/tables/split_options/knn.json (cakelib.variants.knn_split_options reads it)."""
    import math
    doc = json.load(open(ab_path))
    rows = [r for r in doc["rows"] if all(b.get("ok") for b in r["builds"].values())]
    seed_v = next(v for v in doc["queues"] if v.startswith("kernel_sd"))
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 1.0  # noqa: E731
    out = {"about": "options of the kNN split path per call, fitted by bench/topk_queue_ab.py --fit-merge from a "
                    "same-run A/B (" + ab_path + "): merge kernel for the k classes listed, the sampled bound (seed F) "
                    "for the family at M >= min_M and k >= min_k",
           "merge_kernel_k": [], "seed": None, "fit": {}}
    for name, sel in (("k1", lambda k: k == 1), ("k>1", lambda k: k > 1)):
        rs = [r["builds"]["kernel"]["ms"] / r["builds"]["wide"]["ms"] for r in rows if sel(r["shape"]["k"])]
        out["fit"][f"merge kernel / wide, {name}"] = {"geomean": gm(rs), "n": len(rs)}
        if rs and gm(rs) < FIT_MARGIN:
            out["merge_kernel_k"].append(name)
    best = None
    for mma in ("wgmma", "sync"):
        fam = [r for r in rows if r["shape"]["k"] > 1 and r["params"].get("mma", "sync") == mma]
        for m in sorted({r["shape"]["M"] for r in fam}):
            ratio = gm([(r["builds"][seed_v]["ms"] if r["shape"]["M"] >= m else r["builds"]["kernel"]["ms"])
                        / r["builds"]["kernel"]["ms"] for r in fam])
            out["fit"][f"seed {mma} M >= {m}"] = {"geomean vs kernel": ratio, "n": len(fam)}
            if ratio < FIT_MARGIN and (best is None or ratio < best[0]):
                best = (ratio, mma, m)
    if best is not None:
        out["seed"] = {"F": int(seed_v.split("_sd")[1]), "mma": best[1], "min_M": best[2], "min_k": 2}
    if os.path.exists(table_path):   # (fitted from their own A/Bs: fit_merge_form)
        old = json.load(open(table_path))
        out.update({key: old[key] for f in ONE_LAUNCH_MERGES for key in (f"merge_{f}", f"merge_{f}_fit") if key in old})
    with open(table_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return out


ROWS_MAX_RATIO = 1.02   # no few-query shape of a one-launch merge's Q range may take more than this x the merge kernel's time
ONE_LAUNCH_MERGES = ("rows", "tail")


def fit_merge_form(ab_path: str, table_path: str, form: str = "rows") -> dict:
    """A one-launch merge's range (`form`: rows or tail) from a `--option merge --values kernel,FORM` A/B: over
    the few-query stream picks (ws > 1), the (max_Q, max_k) box covering the most measured shapes such that its
    time at every shape in the box (Q <= max_Q, k <= max_k) is within ROWS_MAX_RATIO of the merge kernel's and
    their geometric mean ratio is below 1 (one launch fewer also saves the host a driver call: ~3-4 us); ties
    go to the larger k. Written into split_options/knn.json as `merge_{form}` ({"max_Q", "max_k"}, or null where
    no box qualifies), with the ratios per shape."""
    if form not in ONE_LAUNCH_MERGES:
        raise ValueError(f"one-launch merge forms: {ONE_LAUNCH_MERGES}, not {form!r}")
    doc = json.load(open(ab_path))
    rows = [r for r in doc["rows"] if r["params"].get("ws", 1) > 1
            and all(r["builds"].get(v, {}).get("ok") for v in ("kernel", form))]
    ratio = {json.dumps(r["shape"]): r["builds"][form]["ms"] / r["builds"]["kernel"]["ms"] for r in rows}
    best = None   # (shapes covered, max_k, max_Q)
    for max_k in sorted({r["shape"]["k"] for r in rows}):
        q = _largest_q(rows, ratio, max_k)
        if q is not None:
            covered = sum(1 for r in rows if r["shape"]["k"] <= max_k and r["shape"]["Q"] <= q)
            best = max(best or (0, 0, 0), (covered, max_k, q))
    doc_t = json.load(open(table_path)) if os.path.exists(table_path) else {}
    doc_t[f"merge_{form}"] = {"max_Q": best[2], "max_k": best[1]} if best is not None else None
    doc_t[f"merge_{form}_fit"] = {"from": ab_path, "max_ratio": ROWS_MAX_RATIO, f"{form} / kernel": ratio}
    with open(table_path, "w") as f:
        json.dump(doc_t, f, indent=1)
        f.write("\n")
    return doc_t


def _largest_q(rows: list, ratio: dict, max_k: int):
    """The largest measured Q such that every row with k <= max_k and Q at or below it is within ROWS_MAX_RATIO
    and their geometric mean ratio is below 1, or None."""
    import math
    mine = [r for r in rows if r["shape"]["k"] <= max_k]
    best = None
    for q in sorted({r["shape"]["Q"] for r in mine}):
        rs = [ratio[json.dumps(r["shape"])] for r in mine if r["shape"]["Q"] <= q]
        if max(rs) > ROWS_MAX_RATIO or math.exp(sum(map(math.log, rs)) / len(rs)) >= 1.0:
            break
        best = q
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", nargs="+", help="A/B result files to fit the queue table from (no GPU)")
    ap.add_argument("--fit-merge", help="a --option merge A/B result to fit cakelib/tables/split_options/knn.json from")
    ap.add_argument("--fit-merge-form", nargs=2, metavar=("FORM", "FILE"),
                    help="rows|tail and a --option merge --values kernel,FORM A/B result: that one-launch merge's Q "
                         "range in cakelib/tables/split_options/knn.json")
    ap.add_argument("--table", default="cakelib/tables/topk_queue/knn.json")
    ap.add_argument("--out", default="bench/results/topk-queue-ab-h200.json")
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument("--option", default="queue", choices=("queue", "share", "skip_pad", "seed", "merge", "norms", "rolled"))
    ap.add_argument("--values", "--queues", dest="values", help="the option's values, the baseline first "
                    "(default: queue 0,2,4,8; share / skip_pad 0,1)")
    ap.add_argument("--shapes", help="a JSON list of {Q, M, k} instead of SHAPES")
    ap.add_argument("--variant", help="comma-separated variant names (bench/lib_grid.py knn_variants) to A/B at "
                    "every shape that supports them, in their per-call form, instead of the table's picks")
    ap.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--compile-only", action="store_true", help="fill the cubin cache and stop")
    ap.add_argument("--arch", help="with --compile-only: the target (no GPU needed), e.g. sm_90a")
    a = ap.parse_args()
    if a.fit_merge:
        print(json.dumps(fit_merge(a.fit_merge, "cakelib/tables/split_options/knn.json"), indent=1))
        return
    if a.fit_merge_form:
        form, path = a.fit_merge_form
        print(json.dumps(fit_merge_form(path, "cakelib/tables/split_options/knn.json", form)[f"merge_{form}"]))
        return
    if a.fit:
        doc = fit(a.fit, a.table)
        print(json.dumps(doc["queues"], indent=1))
        return
    opt = a.option
    raw = (a.values or {"queue": "0,2,4,8", "seed": "0,8,32", "merge": "wide,kernel,kernel_sd8",
                        "norms": "global,tile"}.get(opt, "0,1"))
    queues = [q if opt in ("merge", "norms") else int(q) for q in raw.split(",")]

    def build(p: dict, q) -> dict:   # the variant with the option's value q (share / skip_pad: 0 / 1 -> bool)
        if opt == "merge":           # "kernel_sd8": the merge kernel and the sampled bound (F = 8)
            m, _, f = q.partition("_sd")
            return {**p, "merge": m, **({"seed": int(f)} if f else {})}
        return {**p, opt: q if opt in ("queue", "seed", "norms") else bool(q)}
    from bench.lib_grid import D, precompile
    from cakelib.runtime import choose
    if a.arch:    # compile only, e.g. on a machine without a GPU (the cubin cache then travels)
        arch = a.arch
    else:
        from gpu_backend.driver import arch_of, properties
        arch = arch_of(properties(0))
    t0 = time.time()
    shapes = json.loads(a.shapes) if a.shapes else {"queue": SHAPES, "share": SHARE_SHAPES, "skip_pad": PAD_SHAPES,
                                                     "seed": SEED_SHAPES, "merge": MERGE_SHAPES,
                                                     "norms": NORMS_SHAPES, "rolled": SHAPES}[opt]
    if a.variant:   # named variants instead of the table's picks (e.g. a family the table does not pick yet)
        from bench.lib_grid import knn_variants
        from cakelib.runtime import per_call_form
        from cakelib.variants import NAMES, SUPPORTS
        named = {NAMES["knn"](p): p for p in knn_variants()}
        unknown = [n for n in a.variant.split(",") if n not in named]
        if unknown:
            raise SystemExit(f"--variant: not in knn_variants: {unknown}")
        cases = [(s, (n, per_call_form("knn", named[n], {**s, "D": D, "arch": arch}))) for s in shapes
                 for n in a.variant.split(",") if SUPPORTS["knn"](named[n], {**s, "D": D, "arch": arch})]
    else:
        cases = [(s, choose("knn", {**s, "D": D})) for s in shapes]
    if opt == "merge":   # (an unsplit kernel has no merge to compare)
        cases = [(s, (n, p)) for s, (n, p) in cases if p["split"] > 1]
    if opt == "norms":   # (the mma.sync kernels have their own norms options)
        cases = [(s, (n, p)) for s, (n, p) in cases if p.get("mma") == "wgmma"]
    jobs = sorted({("knn", json.dumps(build(p, q), sort_keys=True), s["k"], arch)
                   for s, (_, p) in cases for q in queues})
    fails = precompile([(o, json.loads(p), k, ar) for o, p, k, ar in jobs], a.procs)
    print(f"precompiled {len(jobs)} builds in {time.time() - t0:.0f} s, {len(fails)} failed", flush=True)
    for j, e in list(fails.items())[:5]:
        print("  FAIL", j, e[:200], flush=True)
    if a.compile_only:
        return
    import torch
    from bench.examples import env_info
    from bench.lib_grid import Timer, knn_inputs, knn_reference, run_knn_variant
    timer, rows = Timer(), []
    for shape, (name, p) in cases:
        if time.time() - t0 > a.deadline_s:
            print(f"deadline: {len(rows)} of {len(cases)} shapes", flush=True)
            break
        xq, xb = knn_inputs(shape)
        k = shape["k"]
        ref = knn_reference(xq, xb, k)
        row = {"shape": shape, "variant": name, "params": p, "builds": {}}
        for q in queues:
            v = build(p, q)
            key = str(("knn", json.loads(json.dumps(v, sort_keys=True)), k, arch))
            if key in fails:
                row["builds"][q] = {"ok": False, "why": "compile: " + fails[key][:300]}
                continue
            try:   # checked on poisoned outputs, then timed (lib_grid's sweep step)
                ok, why, t = run_knn_variant(timer, xq, xb, k, v, ref)
            except Exception as e:  # noqa: BLE001 - a build that fails to run is a result, not a crash
                ok, why, t = False, f"{type(e).__name__}: {e}"[:300], None
            row["builds"][q] = {"ok": ok, "why": why, **(t or {})}
        base = row["builds"].get(queues[0], {})
        if base.get("ok"):
            row["speedup"] = {q: base["ms"] / b["ms"] for q, b in row["builds"].items() if b.get("ok") and q != queues[0]}
        rows.append(row)
        print(shape, name, {q: (round(b.get("ms", float("nan")), 3), b["ok"]) for q, b in row["builds"].items()},
              flush=True)
        del xq, xb
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    json.dump({"env": env_info(("torch", "cuda-bindings", "nvidia-cuda-nvrtc"), "bench/topk_queue_ab.py"),
               "command": " ".join(sys.argv), "option": opt, "queues": queues, "rows": rows}, open(a.out, "w"), indent=1)
    tag = {"queue": "T=", "seed": "F=", "merge": "", "norms": ""}.get(opt, "sb=")
    head = "".join(f"{tag + str(q) + ' ms':>12s}" for q in queues)
    print(f"\n{'shape':28s} {'variant':36s}{head}  best")
    for r in rows:
        s = r["shape"]
        ms = {q: b.get("ms") for q, b in r["builds"].items() if b.get("ok")}
        best = min(ms, key=ms.get) if ms else None
        cells = "".join(f"{ms[q]:12.3f}" if q in ms else f"{'FAIL':>12s}" for q in queues)
        gain = f"{tag}{best} {ms[queues[0]] / ms[best]:.2f}x" if best is not None and queues[0] in ms else ""
        print(f"Q={s['Q']:<6d} M={s['M']:<8d} k={s['k']:<3d} {r['variant'][:36]:36s}{cells}  {gain}")


if __name__ == "__main__":
    main()
