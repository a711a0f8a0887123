"""The wide k-means forms side by side on the training shapes where the rule is weakest: per shape, the rule's
pick and at D >= 256 the streamed form (tasks/kmeans/wide_streamed.py: points streamed with the centroids by the
MMA warps) and the warp-specialized TMA form (tasks/kmeans/wide_tma.py). Each form is checked against float64
(kmeans_wide_bench.check_step) before it is timed; flashlib is timed in the same run.

    python bench/kmeans_wide_sweep.py precompile --procs 14
    python bench/kmeans_wide_sweep.py sweep --out DIR/sweep.json --deadline-s 240
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmeans_wide_bench import ITERS, M, check_step, guarded, make_inputs  # noqa: E402

# weakest first (bench/results/kmeans-wide-h200.json): D >= 768, then the other D >= 256 shapes, D = 64 at small K,
# D = 128 at K 1024-4096
SHAPES = [(1, M, 1024, 1024), (1, 262144, 1024, 16384), (1, M, 768, 1024), (1, 131072, 768, 32768),
          (2, 131072, 512, 4096),
          (1, 500000, 256, 4096), (1, M, 64, 256), (1, M, 128, 1024), (1, M, 128, 4096), (1, M, 32, 1024),
          (1, M, 64, 512), (16, 262144, 128, 1024), (1, M, 128, 2048), (1, 262144, 128, 16384),
          (1, 2 * M, 64, 8192), (4, 262144, 96, 2048)]


def forms(shape: tuple) -> dict:
    """name -> variant: the rule's pick; up to D = 512 the ping-pong form (tasks/kmeans/wide_pingpong.py: resident
    points, consumer warpgroups taking turns): two warpgroups at 256 x 128 points by centroids, four of 64 points
    at 256 x 128, three at 192 x 128, two of 64 at 128 x 256, and with the points as wgmma A fragments in
    registers (`a_regs`: the chains read only the centroids from shared memory) three at 192 x 128, two at 128 x
    128 and 128 x 256, four at 256 x 64; each at the most ring stages (up to 8) that fit, where its registers fit.
    From D = 256 the warp-specialized TMA form (tasks/kmeans/wide_tma.py) at 128 x 256: alone, in CTA pairs
    sharing the centroid atoms by multicast (`cluster` 2), and over 4 point tiles a CTA with each tile's scatter
    under the next one's chains (`pt`), the last two with the pick's scatter batches (`sb`, from D = 768) where
    it has them. All with 4-float vector reds. (Lost before, kmeans-wide-pt-sweep-h200.json: pt 2 / 4 / 8 without
    scatter batches;
    bench/results/kmeans-wide-acc2-h100.json, kmeans-wide-small-d-forms-h100.json, kmeans-wide-pp-sweep-h100.json,
    kmeans-wide-cluster-h100.json: two distance accumulators; the streamed form; at D <= 128 128 x 256 tiles,
    256 x 128 at 6 stages, the TMA form; point tiles a ping-pong CTA, the turn passed early, the points in
    registers; CTA pairs of 64 x 256 and 128 x 128.) "sorted": the rule's resident or TMA form (no ping-pong)
    with the centroid sums by a counting sort of the assignments (`sums: "sorted"`, tasks/kmeans/sorted_sums.py)."""
    from cakelib.variants import kmeans_wide_params, kmeans_wide_supports
    B, N, D, K = shape
    pick = kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"})
    out = {"pick": pick}
    res = {"kind": "wide", "mma": "wgmma", "dc": 64, "red": 4, "copies": pick["copies"]}
    tma = {**res, "points": "tma"}
    if D <= 512:
        for wgs, bm, bn, ra in ((2, 256, 128, False), (4, 256, 128, False), (3, 192, 128, False),
                                (3, 192, 128, True), (2, 128, 128, True), (4, 256, 64, True),
                                (2, 128, 256, False), (2, 128, 256, True)):
            stages = pingpong_stages(D, bm, bn, wgs)
            form = {**res, "points": "pingpong", "bm": bm, "bn": bn, "stages": stages, "wgs": wgs, "a_regs": ra}
            if stages and kmeans_wide_supports(form, {"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}) \
                    and {"wgs": 2, "a_regs": False, **pick} != form:      # (the pick is timed once)
                out[f"pp{wgs}_{bm}x{bn}_s{stages}" + ("_ra" if ra else "")] = form
    if D >= 256:
        t256 = {**tma, "bm": 128, "bn": 256, "stages": 4}
        sb = {"sb": pick["sb"]} if pick.get("sb") else {}
        cands = {"tma256_s4": t256, "tma256_s4_cl2" + ("_sb" if sb else ""): {**t256, **sb, "cluster": 2},
                 "tma256_s4_t4" + ("_sb" if sb else ""): {**t256, **sb, "pt": 4}}
        out.update({n: f for n, f in cands.items() if f != pick})
    srt = {k: v for k, v in kmeans_wide_params({"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"},
                                                pingpong=False).items() if k != "sb"}
    srt = {**srt, "copies": 1, "sums": "sorted"}
    if kmeans_wide_supports(srt, {"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}):
        out["sorted"] = srt     # the sums by a counting sort (tasks/kmeans/sorted_sums.py)
    return out


def pingpong_stages(d: int, bm: int, bn: int, wgs: int = 2, most: int = 8) -> int:
    """The most ring stages (up to `most`) of the ping-pong form whose shared memory fits, 0 if fewer than two
    tiles' atoms (2 D / 64: below it the turns do not overlap)."""
    from tasks.kmeans.wide import SMEM_BYTES
    from tasks.kmeans.wide_pingpong import pingpong_smem_bytes
    return next((s for s in range(most, 2 * (-(-d // 64)) - 1, -1)
                 if pingpong_smem_bytes(d, bm // wgs, bn, s, wgs) <= SMEM_BYTES["sm_90a"]), 0)


def chosen(shape: tuple, only: frozenset) -> dict:
    """forms(shape) named in `only` (--forms; empty: all)."""
    return {n: p for n, p in forms(shape).items() if not only or n in only}


def shapes(max_d: int, min_d: int = 0) -> list:
    return [s for s in SHAPES if min_d <= s[2] <= max_d]


def precompile(procs: int, max_d: int, min_d: int = 0, only: frozenset = frozenset()) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from cakelib.variants import kmeans_name
    unique = {(s[2], kmeans_name(p)): (s, name) for s in shapes(max_d, min_d) for name, p in chosen(s, only).items()}
    jobs = list(unique.values())
    t0 = time.time()
    with ProcessPoolExecutor(procs) as ex:
        for (shape, name), err in zip(jobs, ex.map(_compile_one, jobs)):
            print(f"compile {shape} {name}: {err or 'ok'}", flush=True)
    print(f"precompiled {len(jobs)} forms in {time.time() - t0:.1f} s", flush=True)


def _compile_one(job) -> str:
    shape, name = job
    D = shape[2]
    try:
        from cake_ir.compiler import compile_ir
        from cakelib.variants import kmeans_wide_kernels
        kern = kmeans_wide_kernels(forms(shape)[name], D, "sm_90a")
        errs = []
        for build in kern.values():
            r = compile_ir(build(), arch="sm_90a")
            errs += [x.short() for x in r.diagnostics if x.severity == "error"]
        return "; ".join(errs)
    except Exception as e:  # noqa: BLE001
        return repr(e)


def sweep_shape(shape, deadline: float, only: frozenset = frozenset()) -> dict:
    import torch
    from cakelib import kmeans
    from cakelib.variants import kmeans_name
    from examples import l2_flusher, timed
    from lib_grid import kmeans_baselines
    B, N, D, K = shape
    x, c0 = make_inputs(B, N, D, K)
    flush = l2_flusher()
    Cb = torch.empty(B, K, D, device="cuda", dtype=torch.float32)
    Ab = torch.empty(B, N, device="cuda", dtype=torch.int32)
    row = {"shape": list(shape), "iters": ITERS, "ms": {}, "check": {}, "variant": {}}
    fl = kmeans_baselines().get("flashlib")
    if fl is not None:
        row["ms"]["flashlib"] = timed(lambda: fl(x, c0, ITERS), flush, reps=3, warmup=1)["ms_median"]
    for name, p in chosen(shape, only).items():
        if time.time() > deadline:
            row["ms"][name] = "skipped: deadline"
            continue
        row["variant"][name] = kmeans_name(p)
        row["check"][name] = guarded(lambda p=p: check_step(x, c0, *reversed(kmeans(x, K, 1, init=c0, variant=p))) or "ok")
        if row["check"][name] != "ok":
            continue
        row["ms"][name] = timed(lambda p=p: kmeans(x, K, ITERS, init=c0, out=(Cb, Ab), variant=p), flush,
                                reps=3, warmup=1)["ms_median"]
        print(f"  {shape} {name} {row['ms'][name]:.3f} ms", flush=True)
    return row


def sweep(out: Path, deadline_s: float, max_d: int, min_d: int = 0, only: frozenset = frozenset()) -> None:
    import torch
    t_end = time.time() + deadline_s
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "timing": "CUDA events, median of 3 after a warm call, L2 flushed + spin kernel", "rows": []}
    for shape in shapes(max_d, min_d):
        if time.time() > t_end:
            break
        doc["rows"].append(sweep_shape(shape, t_end, only))
        out.write_text(json.dumps(doc, indent=1))
    table(doc)


def table(doc: dict) -> None:
    for r in doc["rows"]:
        ms = r["ms"]
        fl = ms.get("flashlib")
        cells = [f"{n}={v:.2f}" + (f"({fl / v:.2f}x)" if isinstance(fl, float) else "")
                 for n, v in ms.items() if isinstance(v, float) and n != "flashlib"]
        bad = [f"{n}: {c}" for n, c in r["check"].items() if c != "ok"]
        print(f"{tuple(r['shape'])} flashlib={fl if not isinstance(fl, float) else round(fl, 2)} " + " ".join(cells)
              + (f" FAILED {bad}" if bad else ""), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["precompile", "sweep"])
    ap.add_argument("--out", type=Path, default=Path("/tmp/kmeans-wide-sweep.json"))
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=240)
    ap.add_argument("--max-d", type=int, default=1024, help="only the shapes with D up to this")
    ap.add_argument("--min-d", type=int, default=0, help="only the shapes with D from this")
    ap.add_argument("--forms", default="", help="comma-separated form names (e.g. pick,sorted); default all")
    a = ap.parse_args()
    only = frozenset(f for f in a.forms.split(",") if f)
    if a.mode == "precompile":
        precompile(a.procs, a.max_d, a.min_d, only)
    else:
        sweep(a.out, a.deadline_s, a.max_d, a.min_d, only)


if __name__ == "__main__":
    main()
